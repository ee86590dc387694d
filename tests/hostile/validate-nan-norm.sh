# One NaN in the final norm of a pack: validate fails, naming the tensor
# (the KL statistics used to clamp the NaN to 0 and call the pack perfect).
EXPECT=1 MESSAGE="tensor 'model.norm.weight': 1 NaN"
setup() { pack p && poke p/model.safetensors model.norm.weight 3 007e; }
run() { validate p --model "$FIX/m" --rows 2 --cols 64; }
