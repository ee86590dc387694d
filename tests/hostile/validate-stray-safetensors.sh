# Another *.safetensors file beside the model: ExLlamaV3 reads it too.
EXPECT=1 MESSAGE="p/extra.safetensors: not model.safetensors nor a shard"
setup() { pack p && tensor-cat -q "$FIX/ref" model.norm.weight -o p/extra.safetensors; }
run() { validate p; }
