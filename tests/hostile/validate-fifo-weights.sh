# A FIFO in place of model.safetensors: refused, not read (it would block).
EXPECT=1 MESSAGE="p/model.safetensors: not a regular file \(fifo\)"
setup() { pack p && rm p/model.safetensors && mkfifo p/model.safetensors; }
run() { validate p; }
