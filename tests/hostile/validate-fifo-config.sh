# A FIFO in place of config.json.
EXPECT=1 MESSAGE="p/config.json: not a regular file \(fifo\)"
setup() { pack p && rm p/config.json && mkfifo p/config.json; }
run() { validate p; }
