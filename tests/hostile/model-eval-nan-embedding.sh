# A NaN in the embedding row of BOS (id 256, at the start of every row).
EXPECT=1 MESSAGE="tensor 'model.embed_tokens.weight': non-finite value nan at \[256\]\[5\]"
setup() { pack p && poke p/model.safetensors model.embed_tokens.weight $((256 * 64 + 5)) 007e; }
run() { model-eval -q --model "$FIX/m" --quantized p --text "$FIX/t.txt" --cols 64; }
