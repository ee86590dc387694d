# An empty frame stream as the patch.
EXPECT=1 MESSAGE="--patch empty.frames: no frames: the patch would replace nothing"
setup() { : >empty.frames; }
run() { model-eval -q --model "$FIX/m" --quantized "$FIX/m" --patch empty.frames --text "$FIX/t.txt" --cols 64; }
