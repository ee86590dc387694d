# A linear's .mul1 marker deleted: it decodes with another codebook, though
# quantization_config.json lists it with mul1.
EXPECT=1 MESSAGE="quantization_config.json: tensor 'model.layers.0.mlp.up_proj.mul1' of module 'model.layers.0.mlp.up_proj' is missing"
setup() { pack p && drop "$FIX/ref" p/model.safetensors model.layers.0.mlp.up_proj.mul1; }
run() { validate p; }
