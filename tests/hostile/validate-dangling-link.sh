# tokenizer.json a symbolic link to nothing.
EXPECT=1 MESSAGE="p/tokenizer.json: a symbolic link to nothing"
setup() { pack p && rm p/tokenizer.json && ln -s /nonexistent/tokenizer.json p/tokenizer.json; }
run() { validate p; }
