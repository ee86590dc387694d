# quantize_config.json (GPTQModel's) lists the mcg codebook for a mul1 linear.
EXPECT=1 MESSAGE="quantize_config.json: module 'model.layers.0.self_attn.q_proj': codebook mul1 stored, mcg listed"
setup() {
	pack p && jq '.tensor_storage["model.layers.0.self_attn.q_proj"] |= (del(.mul1_multiplier) | .mcg_multiplier = 3417055213)' \
		"$FIX/ref/quantize_config.json" >p/quantize_config.json
}
run() { validate p; }
