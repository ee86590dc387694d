# A truncated tokenizer_config.json (runtimes read it as JSON).
EXPECT=1 MESSAGE="p/tokenizer_config.json: not valid JSON"
setup() { pack p && head -c 20 "$FIX/ref/tokenizer_config.json" >p/tokenizer_config.json; }
run() { validate p; }
