#!/usr/bin/env bash
# t1885-convert-vision: the vision tower's linears encoded at --vision-bits
# (ExLlamaV3's -vb): a tiny seeded Gemma3ForConditionalGeneration
# (examples/make-tiny-llama --arch gemma3-mm, its SigLIP layer 128 wide
# with an MLP of 256) converted at --vision-bits 4: the six linears of the
# encoder layer listed with role vision, no Hessian group and their
# biases, present only below 16; in the pack at K=4 with their biases,
# outside the bits of the decoder linears (quantization_config bits and
# exl3-info agree), vision_bits in quantization_config, the patch and
# position embeddings, norms and projector passed through, --check
# exllamav3 clean; the default 32x48 tower's MLP (not a multiple of 128,
# which ExLlamaV3 loads unpadded) is a contract violation; Qwen3.5's
# tiny tower (no biases, the real ones have them): the missing bias named; --vision-bits out of range or on a model without
# a vision tower refused.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
"$ROOT/examples/make-tiny-llama" --arch gemma3-mm --vision-dims 128,256 G >/dev/null
"$ROOT/examples/make-tiny-llama" --arch gemma3-mm S >/dev/null
"$ROOT/examples/make-tiny-llama" --heads 2 --kv-heads 1 --arch qwen3_5 Q 2 128 96 >/dev/null
v=vision_tower.vision_model.encoder.layers.0

# the description
check "at 16 (the default) the tower is no module: --vision-bits 16 lists what no option lists" \
	test "$(tensor-ls --modules --vision-bits 16 G)" = "$(tensor-ls --modules G)" -a \
	     "$(tensor-ls --modules G | jq -r 'select(.key | startswith("vision_tower"))' | wc -l)" -eq 0
check "at 4: the six SigLIP linears have role vision, no Hessian group, a bias, layer 4" \
	test "$(tensor-ls --linears --vision-bits 4 G | jq -r 'select(.role == "vision") | "\(.key)|\(.group)|\(.bias)|\(.layer)|\(.shape)"' | tr '\n' ' ')" = \
	     "$v.self_attn.q_proj||true|4|[128,128] $v.self_attn.k_proj||true|4|[128,128] $v.self_attn.v_proj||true|4|[128,128] $v.self_attn.out_proj||true|4|[128,128] $v.mlp.fc1||true|4|[256,128] $v.mlp.fc2||true|4|[128,256] "
check_fail "Qwen3.5: the tiny tower without biases: exit 1 naming the missing bias" 1 \
	"model\.visual\.blocks\.0\.attn\.qkv\.bias" tensor-ls --linears --vision-bits 4 Q
check_fail "--vision-bits on a model without a vision tower refused, naming it" 1 "no vision tower" \
	tensor-ls --linears --vision-bits 4 "$(mkdir -p T && "$ROOT/examples/make-tiny-llama" --arch gemma3 T/m >/dev/null && echo T/m)"

# convert at --vision-bits 4
convert G GO --bits 2.5 --vision-bits 4 --rows 8 --cols 64 --work GW 2>g.err || { cat g.err >&2; notok "convert"; }
check "GO: the six vision linears in the pack, all at K=4" \
	test "$(exl3-info --json GO | jq -r '[.linears[] | select(.role == "vision") | .K] | "\(length) \(unique)"')" = "6 [4]"
check "GO: their biases stored" \
	test "$(tensor-ls GO | jq -r .name | grep -cE "^$v\.(self_attn|mlp)\..*\.bias$")" -eq 6
check "GO: no source weight of an encoded linear left" \
	test "$(tensor-ls GO | jq -r .name | grep -c "^$v\.\(self_attn\|mlp\)\..*\.weight$")" -eq 0
check "GO: patch and position embeddings, norms, projector passed through" \
	test "$(tensor-ls GO | jq -r .name | grep -cE '^(vision_tower\.vision_model\.(embeddings|post_layernorm|encoder\.layers\.0\.layer_norm)|multi_modal_projector)')" -eq 11
check "GO: quantization_config.vision_bits 4" test "$(jq .quantization_config.vision_bits GO/config.json)" = 4
check "GO: bits 2.5 over the decoder linears, the tower outside them (exl3-info agrees)" \
	test "$(exl3-info --json GO | jq -c '[.summary.bits, .summary.vision_bits]')" = "[2.5,4]"
check "GO: bitalloc's plan has no vision linear (outside the budget)" \
	test "$(jq -r '.tensors | keys[]' GW/plan.json | grep -c vision_tower)" -eq 0
check "GO: the plan's bytes (the tower at its K) are the pack's" \
	test "$(jq .bytes GW/plan.json)" = "$(cat GO/* | wc -c)"
check "GO: exl3-info --check exllamav3 clean" exl3-info -q --check exllamav3 GO
check "convert says the tower was encoded without calibration, no warning per linear" \
	sh -c "grep -c 'vision tower were encoded at --vision-bits 4' g.err | grep -qx 1 &&
	       ! grep -q 'vision_tower.*without error feedback' g.err"

# the tower's output error (vision-eval: the SigLIP encoder in double on
# seeded inputs, source linears against the pack's decoded ones), at 4 and
# at 6 bits (the work directory's encodes reused: only the tower's redone)
convert G GO6 --bits 2.5 --vision-bits 6 -q --rows 8 --cols 64 --work GW 2>/dev/null || notok "convert at 6"
e4=$(vision-eval --model G GO) && e6=$(vision-eval --model G GO6) || notok "vision-eval"
echo "# --vision-bits 4: $(jq -c '[.rel_rms_mean, .rel_rms_spread]' <<<"$e4"), 6: $(jq -c '[.rel_rms_mean, .rel_rms_spread]' <<<"$e6")"
check "vision-eval: the six linears decoded, 3 seeds, the output post_layernorm's" \
	test "$(jq -c '[.decoded, (.seeds | length), .output, .vision_bits]' <<<"$e4")" = '[6,3,"post_layernorm",4]'
check "the error at 6 bits is below the error at 4, which is below 0.05" \
	jq -en --argjson a "$e4" --argjson b "$e6" '$b.rel_rms_mean < $a.rel_rms_mean and $a.rel_rms_mean < 0.05 and $b.rel_rms_mean > 0'
# back to 16 in the same work directory: the tower passed through again
convert G GO16 --bits 2.5 -q --rows 8 --cols 64 --work GW 2>/dev/null || notok "convert at 16"
check "the same work directory at --vision-bits 16: the tower passed through, no vision_bits" \
	sh -c "test \"\$(jq .quantization_config.vision_bits GO16/config.json)\" = null &&
	       tensor-ls GO16 | jq -r .name | grep -q '^$v\.mlp\.fc1\.weight\$' && exl3-info -q --check exllamav3 GO16"
check_fail "vision-eval on a pack without an EXL3 tower refused" 1 "no quantization_config.vision_bits" \
	vision-eval --model G "$(mkdir -p P16 && cp G/config.json P16/ && tensor-cat -q -o P16/model.safetensors G && echo P16)"

# the reader contract: ExLlamaV3 loads the tower's MLP unpadded
convert S SO --bits 3 --vision-bits 6 --reader none -q --rows 8 --cols 64 2>/dev/null || notok "convert S"
check "SO: the 32x48 MLP is a vision-unpadded violation of ExLlamaV3's contract (exit 1)" \
	sh -c "exl3-info -q --check exllamav3 SO >so.out 2>&1; test \$? -eq 1 && grep -q 'mlp\.fc1: vision-unpadded' so.out"
NO_INFO="SO"

check_fail "--vision-bits 9 refused" 2 "not 1\.\.8 or 16" convert G x --bits 3 --vision-bits 9
check_fail "--vision-bits 0 refused" 2 "not 1\.\.8 or 16" convert G x --bits 3 --vision-bits 0
done_testing
