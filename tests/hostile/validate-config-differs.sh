# config.json's rope_theta is not the source model's.
EXPECT=1 MESSAGE="p/config.json: 'rope_theta' is 500000, 10000 in the source model"
setup() { pack p && jq '.rope_theta = 500000' "$FIX/ref/config.json" >p/config.json; }
run() { validate p --model "$FIX/m" --rows 2 --cols 64; }
