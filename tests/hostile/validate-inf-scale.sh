# An Inf among a linear's input scales (suh).
EXPECT=1 MESSAGE="tensor 'model.layers.0.self_attn.q_proj.suh': 0 NaN and 1 Inf values"
setup() { pack p && poke p/model.safetensors model.layers.0.self_attn.q_proj.suh 5 007c; }
run() { validate p; }
