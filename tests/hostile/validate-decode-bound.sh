# The same deleted marker without the inventory files: the decode check
# finds the error above the bound of exl3-validate(1).
EXPECT=1 MESSAGE="linear 'model.layers.0.mlp.up_proj': relative decode error [0-9.]+ above the bound 0.5 for K=3"
setup() {
	pack p && drop "$FIX/ref" p/model.safetensors model.layers.0.mlp.up_proj.mul1 &&
		rm p/quantization_config.json p/quantize_config.json
}
run() { validate p --model "$FIX/m" --rows 2 --cols 64; }
