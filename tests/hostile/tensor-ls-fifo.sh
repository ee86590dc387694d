# The library's safetensors reader refuses a FIFO instead of blocking.
EXPECT=1 MESSAGE="p/model.safetensors: not a regular file \(a FIFO\)"
setup() { pack p && rm p/model.safetensors && mkfifo p/model.safetensors; }
run() { tensor-ls p; }
