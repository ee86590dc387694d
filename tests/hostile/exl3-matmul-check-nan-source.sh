# exl3-matmul --check against a source weight holding a NaN (F32).
EXPECT=1 MESSAGE="'model.layers.0.mlp.up_proj.weight': non-finite value nan at \[0\]\[7\]"
setup() { cp -r "$FIX/m" src && chmod -R u+w src && poke src/model.safetensors model.layers.0.mlp.up_proj.weight 7 0000c07f; }
run() { exl3-matmul -q --model "$FIX/ref" --tensor model.layers.0.mlp.up_proj --check src; }
