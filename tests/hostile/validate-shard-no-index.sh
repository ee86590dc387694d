# A shard name without model.safetensors.index.json.
EXPECT=1 MESSAGE="shard 'model-00001-of-00001.safetensors' without model.safetensors.index.json"
setup() { pack p && mv p/model.safetensors p/model-00001-of-00001.safetensors; }
run() { validate p; }
