# A patch that holds no EXL3 linear would run the model unpatched.
EXPECT=1 MESSAGE="nolin.safetensors: tensor 'model.norm.weight' is part of no EXL3 linear of the patch"
setup() { tensor-cat -q "$FIX/m" model.norm.weight -o nolin.safetensors; }
run() { model-eval -q --model "$FIX/m" --quantized "$FIX/m" --patch nolin.safetensors --text "$FIX/t.txt" --cols 64; }
