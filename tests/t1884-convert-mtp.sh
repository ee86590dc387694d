#!/usr/bin/env bash
# t1884-convert-mtp: the multi-token prediction (MTP) layer quantized at
# --mtp-bits, as ExLlamaV3 does, instead of left out: a tiny seeded
# Qwen3.5 (mtp.fc, mtp.pre_fc_norm_embedding / _hidden, mtp.layers.0,
# mtp.norm at the checkpoint's root) and a DeepSeek V3 (layer
# num_hidden_layers: enorm, hnorm, eh_proj, one MoE decoder layer,
# shared_head.norm) from examples/make-tiny-llama (and, described only, a
# GLM-4-MoE and a GLM-5), converted at a
# fractional bpw: the MTP linears listed with role mtp and no Hessian
# group, every one of them in the pack at --mtp-bits (4 by default, as
# ExLlamaV3), outside the bits of the decoder linears (quantization_config
# bits and exl3-info agree), mtp_bits in quantization_config, the MTP
# layer's norms kept, --check auto clean; a checkpoint without the MTP
# tensors converts as before (no MTP module, no mtp_bits); --mtp-bits out
# of 1..8 refused.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
"$ROOT/examples/make-tiny-llama" --heads 2 --kv-heads 1 --lin-heads 2,4 --lin-dims 24,20 \
	--arch qwen3_5 Q 2 128 96 >/dev/null
"$ROOT/examples/make-tiny-llama" --arch deepseek_v3 --experts 4 --groups 1,1 D 2 64 96 >/dev/null

# the description
check "Qwen3.5: the MTP linears (fc, q/k/v/o, gate/up/down) have role mtp and no Hessian group" \
	test "$(tensor-ls --linears Q | jq -r 'select(.role == "mtp") | "\(.key)|\(.group)|\(.layer)"' | tr '\n' ' ')" = \
	     "mtp.fc||3 mtp.layers.0.self_attn.q_proj||3 mtp.layers.0.self_attn.k_proj||3 mtp.layers.0.self_attn.v_proj||3 mtp.layers.0.self_attn.o_proj||3 mtp.layers.0.mlp.gate_proj||3 mtp.layers.0.mlp.up_proj||3 mtp.layers.0.mlp.down_proj||3 "
check "Qwen3.5: mtp.fc is 2 hidden -> hidden" \
	test "$(tensor-ls --linears Q | jq -c 'select(.key == "mtp.fc") | .shape')" = "[128,256]"
check "Qwen3.5: the MTP layer's norms are kept modules" \
	test "$(tensor-ls --modules Q | jq -r 'select(.key | startswith("mtp.")) | select(.quantized | not) | .key' | tr '\n' ' ')" = \
	     "mtp.pre_fc_norm_embedding mtp.pre_fc_norm_hidden mtp.layers.0.input_layernorm mtp.layers.0.self_attn.q_norm mtp.layers.0.self_attn.k_norm mtp.layers.0.post_attention_layernorm mtp.norm "
check "DeepSeek V3: the 20 mtp linears are layer 2's (eh_proj, q_a/q_b/kv_a/o, 4 x 3 experts, 3 shared)" \
	test "$(tensor-ls --linears D | jq -r 'select(.role == "mtp") | .key' | grep -c '^model\.layers\.2\.')" -eq 20 -a \
	     "$(tensor-ls --linears D | jq -r 'select(.role == "mtp") | .key' | wc -l)" -eq 20
check "DeepSeek V3: eh_proj and the shared experts are among them" \
	sh -c "tensor-ls --linears D | jq -r 'select(.role == \"mtp\") | .key' | grep -qx model.layers.2.eh_proj &&
	       tensor-ls --linears D | jq -r 'select(.role == \"mtp\") | .key' | grep -qx model.layers.2.mlp.shared_experts.down_proj"
check "DeepSeek V3: enorm, hnorm, shared_head.norm, the router and its bias kept" \
	test "$(tensor-ls --modules D | jq -r 'select(.layer == 3 and (.quantized | not)) | .key' | grep -cE 'enorm|hnorm|shared_head\.norm|mlp\.gate$|e_score_correction_bias')" -eq 5

# the GLM families: their layer rows as the MTP layer has them
"$ROOT/examples/make-tiny-llama" --arch glm4_moe --experts 4 --top-k 2 --moe-inter 40 G 2 64 96 >/dev/null
check "GLM-4-MoE: eh_proj and q/k/v (with their biases, attention_bias) of layer 2 have role mtp" \
	test "$(tensor-ls --linears G | jq -c 'select(.role == "mtp") | [.key, .bias]' | head -4 | tr -d '\n')" = \
	     '["model.layers.2.eh_proj",false]["model.layers.2.self_attn.q_proj",true]["model.layers.2.self_attn.k_proj",true]["model.layers.2.self_attn.v_proj",true]'
"$ROOT/examples/make-tiny-llama" --arch glm_moe_dsa --experts 4 --top-k 2 --moe-inter 40 --q-lora 48 S 2 64 96 >/dev/null
check "GLM-5: the MTP layer's indexer.wq_b an mtp linear, wk, k_norm and weights_proj kept" \
	sh -c "tensor-ls --linears S | jq -r 'select(.role == \"mtp\") | .key' | grep -qx model.layers.2.self_attn.indexer.wq_b &&
	       test \"\$(tensor-ls --modules S | jq -r 'select(.layer == 3 and (.quantized | not)) | .key' | grep -c indexer)\" -eq 4"

# convert: Qwen3.5 at --mtp-bits 3, DeepSeek V3 at the default 4
r=(-q --rows 8 --cols 64)
convert Q QO --bits 2.5 --mtp-bits 3 --rows 8 --cols 64 --work QOW 2>q.err || { cat q.err >&2; notok "convert Qwen3.5"; }
convert D DO --bits 2.5 "${r[@]}" --work DOW 2>d.err || { cat d.err >&2; notok "convert DeepSeek V3"; }
for c in "QO 3 8" "DO 4 $(tensor-ls --linears D | jq -r 'select(.role == "mtp") | .key' | wc -l)"; do
	set -- $c
	check "$1: the $3 MTP linears in the pack, all at K=$2" \
		test "$(exl3-info --json "$1" | jq -r '[.linears[] | select(.role == "mtp") | .K] | "\(length) \(unique)"')" = "$3 [$2]"
	check "$1: quantization_config.mtp_bits $2" test "$(jq .quantization_config.mtp_bits "$1/config.json")" = "$2"
	check "$1: bits 2.5 over the decoder linears, the MTP layer outside them (exl3-info agrees)" \
		test "$(exl3-info --json "$1" | jq -c '[.summary.bits, .summary.mtp_bits]')" = "[2.5,$2]"
	check "$1: bitalloc's plan has every decoder linear and no MTP linear (outside the budget)" \
		test "$(jq -r '.tensors | keys[]' "${1}W/plan.json" | sort | tr '\n' ' ')" = \
		     "$(tensor-ls --linears "${1%O}" | jq -r 'select(.role != "mtp") | .key' | sort | tr '\n' ' ')"
	check "$1: exl3-info --check auto clean" exl3-info -q --check auto "$1"
	check "$1: the plan's bytes (the MTP layer counted at its K, its fallback entries) are the pack's" \
		test "$(jq .bytes "${1}W/plan.json")" = "$(cat "$1"/* | wc -c)"
done
check "QO: the MTP layer's norms kept (F16 of the source's shape)" \
	test "$(tensor-ls QO | jq -r 'select(.name | test("^mtp\\..*norm")) | "\(.dtype)\(.shape)"' | sort -u | tr '\n' ' ')" = 'F16[128] F16[24] '
check "DO: enorm, hnorm and shared_head.norm kept" \
	test "$(tensor-ls DO | jq -r .name | grep -cE '^model\.layers\.2\.(enorm|hnorm|shared_head\.norm)\.weight$')" -eq 3
check "convert says the MTP linears were encoded without calibration, not a warning per linear" \
	sh -c "grep -c 'multi-token prediction layer were encoded at --mtp-bits 3' q.err | grep -qx 1 &&
	       ! grep -q 'mtp.*without error feedback' q.err"

# a checkpoint without the MTP tensors: no MTP module, converted as before
mkdir N && cp Q/*.json N/ && tensor-cat -q -o N/model.safetensors Q $(tensor-ls Q | jq -r .name | grep -v '^mtp\.')
check "without the MTP tensors: no MTP module" test "$(tensor-ls --linears N | jq -r 'select(.role == "mtp")' | wc -l)" -eq 0
convert N NO --bits 2.5 "${r[@]}" 2>/dev/null || notok "convert without MTP"
check "without the MTP tensors: no mtp_bits, no mtp.* in the pack" \
	sh -c "test \"\$(jq .quantization_config.mtp_bits NO/config.json)\" = null && ! tensor-ls NO | jq -r .name | grep -q '^mtp\.'"
check "the decoder linears convert to the same bytes with and without the MTP layer" \
	bash -c "tensor-ls NO | jq -r .name >names && test -s names &&
	       cmp <(tensor-cat -q NO \$(cat names) | sha256sum) <(tensor-cat -q QO \$(cat names) | sha256sum)"

# ExLlamaV3 loads Qwen3.5's mtp.fc unpadded (pad_to 1): a hidden size that
# is not a multiple of 128 makes a pack it cannot load
"$ROOT/examples/make-tiny-llama" --heads 2 --kv-heads 1 --lin-heads 2,4 --lin-dims 24,20 \
	--arch qwen3_5 Q80 2 80 96 >/dev/null
convert Q80 Q80O --bits 3 --reader none -q --rows 4 --cols 32 2>/dev/null || notok "convert hidden 80 (--reader none)"
check "hidden 80: exl3-info --check exllamav3 names mtp.fc (rule mtp-fc) and exits 1" \
	sh -c "exl3-info --check exllamav3 Q80O >chk.out 2>&1; test \$? -eq 1 && grep -q 'mtp.fc: mtp-fc' chk.out"
check_fail "... and convert --reader exllamav3 refuses it, writing nothing" 1 "mtp.fc" \
	convert Q80 Q80X --bits 3 --reader exllamav3 -q --rows 4 --cols 32
check "... nothing written" test ! -e Q80X
NO_INFO="Q80O"
check_fail "--mtp-bits 9 refused" 2 "not 1..8" convert Q x --bits 3 --mtp-bits 9
check_fail "--mtp-bits 16 refused (not supported)" 2 "not supported" convert Q x --bits 3 --mtp-bits 16
done_testing
