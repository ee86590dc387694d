# The pack's tokenizer_config.json is not the source model's.
EXPECT=1 MESSAGE="p/tokenizer_config.json: differs from the source model's"
setup() { pack p && jq '.bos_token = "<x>"' "$FIX/ref/tokenizer_config.json" >p/tokenizer_config.json; }
run() { validate p --model "$FIX/m" --rows 2 --cols 64; }
