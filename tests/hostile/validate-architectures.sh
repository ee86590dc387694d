# Two architectures: ExLlamaV3's Config.from_directory refuses the pack.
EXPECT=1 MESSAGE="'architectures' does not hold exactly one name"
setup() { pack p && jq '.architectures += ["MistralForCausalLM"]' "$FIX/ref/config.json" >p/config.json; }
run() { validate p; }
