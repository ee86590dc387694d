# A --base file whose saved logits are NaN: refused, naming the file.
EXPECT=1 MESSAGE="^model-eval: base.frames: logit nan is not finite \(row 0, position 0"
setup() {
	{ tensor-gen -t I32 -d constant --value 1 --meta vocab=258 tokens=2x8
	  tensor-gen -t F32 -d constant --value nan logits.0=16x258; } >base.frames
}
run() { model-eval --base base.frames --quantized "$FIX/ref"; }
