# quantization_config.json lists another K than the trellis stores.
EXPECT=1 MESSAGE="module 'model.layers.0.mlp.up_proj': K 3 stored, bits_per_weight 4 listed"
setup() {
	pack p && jq '.tensor_storage["model.layers.0.mlp.up_proj"].bits_per_weight = 4' \
		"$FIX/ref/quantization_config.json" >p/quantization_config.json
}
run() { validate p; }
