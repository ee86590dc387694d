# model-eval on a pack with a NaN in the final norm: an error naming the
# tensor, not KL 0.
EXPECT=1 MESSAGE="tensor 'model.norm.weight': non-finite value nan at \[3\]"
setup() { pack p && poke p/model.safetensors model.norm.weight 3 007e; }
run() { model-eval -q --model "$FIX/m" --quantized p --text "$FIX/t.txt" --cols 64; }
