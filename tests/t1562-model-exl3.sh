#!/usr/bin/env bash
# The forward with EXL3 linears: a random EXL3 model against its dense
# reconstruction (exl3-matmul --dequant), in both the dense-reconstruction
# (large batches) and decode-in-the-loop (small batches) paths; sequential
# calibration (hessian-capture --quantized) against a mixed model.
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/synth-model.sh"
cd "$TMP"
jqc() { jq -e "$@" >/dev/null; }

synth_model m 32 48 2 4 2 64 1 || notok "synthetic model"
synth_exl3 m q 3 || notok "synthetic EXL3 model"
synth_dequant q d || notok "dense reconstruction"
synth_tokens tok 4 16 64 3
tensor-gen -s 4 -d uniform -t I32 --mean 32 --scale 31 tokens=1x12 > tok1

model-eval --model d --quantized q --tokens tok >big.json
check "EXL3 model == its dense reconstruction (64-token batch)" jqc '.kl_divergence == 0 and .top1_agreement == 1' big.json
model-eval --model d --quantized q --tokens tok1 >small.json
check "EXL3 model ~ its dense reconstruction (12 tokens, packed matmul)" jqc '.kl_divergence < 1e-6 and .top1_agreement == 1' small.json
check "greedy ids: EXL3 == dense" test "$(model-eval --model q --generate 12 --ids)" = "$(model-eval --model d --generate 12 --ids)"
check "EXL3 differs from the original" jqc '.kl_divergence > 0.001' <(model-eval --model m --quantized q --tokens tok)

# two EXL3 packs of the same model, compared with each other (and through a
# --save-base file of the first)
synth_exl3 m q5 5 || notok "synthetic 5-bit EXL3 model"
model-eval --model q5 --quantized q --tokens tok >packs.json
check "two EXL3 packs compared with each other: KL > 0, statistics" \
	jqc '.model == "q5" and .quantized == "q" and .kl_divergence > 0 and .kl.max >= .kl.median' packs.json
model-eval --model q5 --tokens tok --save-base q5.zst >/dev/null
check "... and through --save-base / --base, the same" \
	test "$(model-eval --base q5.zst --quantized q | jq -c 'del(.base)')" = "$(jq -c . packs.json)"

# sequential mode: layer 0 from the EXL3 directory
{ tensor-cat d 'model.layers.0.*' && tensor-cat m 'model.layers.1.*' model.norm.weight model.embed_tokens.weight; } |
	tensor-cat -q - -o mix.safetensors
mkdir mix && mv mix.safetensors mix/model.safetensors && cp m/config.json mix/
hessian-capture --model mix --tokens tok --layers 1- >hmix
hessian-capture --model m --quantized q --tokens tok --layers 1- >hseq
check "--quantized: layers < A from the EXL3 dir (== mixed model, bit for bit)" cmp -s hmix hseq
hessian-capture --model m --tokens tok --layers 1- >horig
check "... and differs from the original model's" bash -c '! cmp -s horig hseq'
check "layer 0 of the sequential capture is not written" test "$(tensor-ls hseq | jq -r .meta.layer | sort -u | tr -d '\n')" = 12
mkdir qlin && tensor-cat -q q 'model.layers.0.*_proj.*' -o qlin/model.safetensors
check "--quantized DIR of the quantized linears alone (norms from the model)" cmp -s hseq <(hessian-capture --model m --quantized qlin --tokens tok --layers 1-)
check_fail "--quantized DIR lacking a layer's linear" 1 "linear 'model.layers.1.self_attn.q_proj' is not EXL3" hessian-capture --model m --quantized qlin --tokens tok --layers 2
# sequential chain: layer 0's capture saves the hidden states entering it,
# layer 1's starts from them (runs quantized layer 0, then layer 1): the same
# Hessians, and the same states for layer 1, as a forward from the embedding
hessian-capture --model m --tokens tok --layers 0-0 --hidden-out hid0 >h0
hessian-capture --model m --quantized q --tokens tok --layers 1-1 --hidden-in hid0 --hidden-out hid1 >hchain
hessian-capture --model m --quantized q --tokens tok --layers 1-1 --hidden-out hid1full >hfull
check "--hidden-in: layer 1 from layer 0's saved states == from the embedding, bit for bit" cmp -s hchain hfull
check "... and so are the states it saves for layer 2" cmp -s hid1 hid1full
check "--hidden-out: a frame 'hidden' (rows, cols, hidden) entering layer 1" \
	jqc '.name == "hidden" and .shape == [4, 16, 32] and .meta.layer == "1" and .meta.role == "hidden"' <(tensor-ls hid1)
hessian-capture --model m --quantized q --tokens tok --layers 2 --hidden-in hid1 >hhead
check "--hidden-in: the head from layer 1's states == from the embedding" \
	cmp -s hhead <(hessian-capture --model m --quantized q --tokens tok --layers 2)
synth_tokens tok2 4 16 64 9
check_fail "--hidden-in of other tokens" 1 "hid0: the hidden states are of other tokens" \
	hessian-capture --model m --tokens tok2 --layers 1 --hidden-in hid0
check_fail "--hidden-in of a later layer" 1 "enter layer 1, after the first captured layer 0" \
	hessian-capture --model m --tokens tok --layers 0 --hidden-in hid1
check_fail "--hidden-in of another row shape" 1 "hid0: hidden states are not 2x32x32" \
	hessian-capture --model m --tokens tok --cols 32 --layers 1 --hidden-in hid0
check_fail "--hidden-in of a frame that is not hidden states" 1 "h0: not a --hidden-out frame" \
	hessian-capture --model m --tokens tok --layers 1 --hidden-in h0
check_fail "--hidden-out with --merge" 2 "takes frames" hessian-capture --merge --hidden-out x h0
NO_INFO=qbad   # too small for its config on purpose
cp -r q qbad && jq '.intermediate_size = 200 | .quantization_config = {quant_method: "exl3"}' m/config.json > qbad/config.json
check_fail "EXL3 linear too small for the config" 1 "mlp.gate_proj.trellis': padded size 128x128 does not hold 32x200" model-eval --model qbad --generate 1 --ids
done_testing
