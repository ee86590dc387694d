# The index maps a tensor that no shard holds.
EXPECT=1 MESSAGE="tensor 'model.layers.9.mlp.up_proj.trellis' listed in the index is missing"
setup() {
	pack p && tensor-ls p | jq -s '{metadata: {total_size: (map(.bytes) | add)},
		weight_map: (map({(.name): "model.safetensors"}) | add + {"model.layers.9.mlp.up_proj.trellis": "model.safetensors"})}' \
		>p/model.safetensors.index.json
}
run() { validate p; }
