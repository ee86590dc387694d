# tokenizer.json deleted: no runtime can load the pack.
EXPECT=1 MESSAGE="p/tokenizer.json: missing"
setup() { pack p && rm p/tokenizer.json; }
run() { validate p; }
