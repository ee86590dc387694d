#!/usr/bin/env bash
# t1860-convert-deepseek: a tiny seeded DeepSeek V3 (examples/make-tiny-llama
# --arch deepseek_v3: latent attention with q_lora_rank 48 and
# kv_lora_rank 40, yarn rope, layer 0 dense, layer 1 of 4 experts 40 wide
# in 2 groups + a shared expert, and the multi-token-prediction layer 2 real
# checkpoints have) described, converted end to end by pipelines/convert at
# two rates: the written directory holds the source's keys (the MTP layer
# left out, with a note), the router and its correction bias unquantized,
# every expert; validate accepts each; the KL to the original falls as the
# bits rise and stays below round-to-nearest at the same bits.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
"$ROOT/examples/make-tiny-llama" --arch deepseek_v3 --experts 4 --top-k 2 --moe-inter 40 M 2 64 96 >/dev/null
# a config that names no multi-token-prediction layer (num_nextn_predict_layers
# 0) beside a checkpoint that holds one: the layer is no module and is left
# out with a note (t1884 converts a layer the config names, at --mtp-bits)
jq '.num_nextn_predict_layers = 0' M/config.json >M/config.json.tmp && mv M/config.json.tmp M/config.json

# the description
check "every module of the description is in the checkpoint" sh -c "tensor-ls --modules M >/dev/null"
check "linears: 2 x 4 attention, 3 dense, 4 x 3 experts + 3 shared, the head" \
	test "$(tensor-ls --config M | jq .linears)" -eq 27
check "q_a_proj and kv_a_proj_with_mqa read the normed hidden state (one Hessian group)" \
	test "$(tensor-ls --linears M | jq -r 'select(.group == "model.layers.1.self_attn.input") | .key' | tr '\n' ' ')" = \
	     "model.layers.1.self_attn.q_a_proj model.layers.1.self_attn.kv_a_proj_with_mqa "
check "q_b_proj reads the 48-wide q_a (padded to 128); kv_b_proj a kept matrix of the 40-wide latent (as ExLlamaV3 reads it)" \
	test "$(tensor-ls --modules M | jq -c 'select(.layer == 0 and (.key | test("_b_proj"))) | [.kind, .shape, .padded, .group]' | tr -d '\n')" = \
	     '["linear",[96,48],[128,128],"model.layers.0.self_attn.q_b_proj.input"]["matrix",[128,40],null,null]'
check "router and correction bias: unquantized, role router" \
	test "$(tensor-ls --modules M | jq -c 'select(.role == "router") | [.key, .kind, .quantized, .shape]' | tr -d '\n')" = \
	     '["model.layers.1.mlp.gate","matrix",false,[4,64]]["model.layers.1.mlp.gate.e_score_correction_bias","vector",false,[4]]'
check "shared experts: --hq 2, the dense MLP --hq 1, attention --hq 2 (ExLlamaV3's deepseek_v3)" \
	test "$(tensor-ls --linears M | jq -c '[.role, .hq]' | sort -u | tr -d '\n')" = \
	     '["attention",2]["expert",0]["head",0]["mlp",1]["shared_expert",2]'
check "the multi-token-prediction layer (model.layers.2) is no module" \
	test "$(tensor-ls --modules M | jq -r .key | grep -c '^model\.layers\.2\.')" -eq 0
"$ROOT/examples/make-tiny-llama" --arch deepseek_v3 --experts 4 --top-k 2 --moe-inter 40 --q-lora 0 NQ 1 64 96 >/dev/null
check "q_lora_rank null: a plain q_proj (96 x 64) in the self_attn.input group" \
	test "$(tensor-ls --linears NQ | jq -c 'select(.group == "model.layers.0.self_attn.input") | [.key, .shape]' | tr -d '\n')" = \
	     '["model.layers.0.self_attn.q_proj",[96,64]]["model.layers.0.self_attn.kv_a_proj_with_mqa",[48,64]]'
check "q_lora_rank null: model-eval runs it" sh -c "model-eval -q --model NQ --text '$ROOT/README.md' --rows 2 --cols 32 | jq -e '.nll > 0' >/dev/null"

for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
ev=(--text eval.txt --rows 8 --cols 128)
build_rtn
# source keys of the model (the MTP layer's excepted), as module keys
tensor-ls M | jq -r .name | grep -v '^model\.layers\.2\.' | sed -E 's/\.(weight|bias)$//' | sort >src.keys
kl_prev=
for b in 2 4; do
	convert M q$b --bits $b --work w$b --rows 40 --cols 128 -j 2 2>convert$b.err >/dev/null
	check "convert --bits $b" test -f q$b/config.json
	# pack-write (convert runs it -q) says what it leaves out: 7 MTP tensors
	[ "$b" != 2 ] || check "pack-write: the multi-token-prediction layer left out with a note" \
		sh -c "tensor-cat -q q$b | pack-write --model M --passthrough repack 2>&1 >/dev/null | grep -q 'note: 30 tensors of M.s layers from 2 on (multi-token prediction) left out'"
	check "$b bpw: the source's keys, every expert, nothing of the MTP layer" \
		sh -c "tensor-ls q$b | jq -r .name | sed -E 's/\.(weight|bias|trellis|suh|svh|su|sv|mcg|mul1)\$//' | sort -u | cmp -s - src.keys"
	check "$b bpw: all 4 x 3 expert + 3 shared-expert linears quantized" \
		test "$(tensor-ls q$b | jq -r .name | grep -c 'mlp\.\(experts\.[0-9]*\|shared_experts\)\..*\.trellis$')" -eq 15
	check "$b bpw: the router and its correction bias stored unquantized" \
		test "$(tensor-ls q$b | jq -c 'select(.name | startswith("model.layers.1.mlp.gate.")) | [.name, .shape]' | tr -d '\n')" = \
		     '["model.layers.1.mlp.gate.weight",[4,64]]["model.layers.1.mlp.gate.e_score_correction_bias",[4]]'
	validate q$b --model M "${ev[@]}" -q >v$b.json
	check "$b bpw: validate ok" jqe '.ok' v$b.json
	# round to nearest: every decoder linear (q_a/q_b/kv_a_proj_with_mqa/
	# o, MLPs, experts) at b bits, the head at 6; the router, its
	# bias and kv_b_proj as the EXL3 model stores them (F16)
	kl_vs_rtn "$b bpw" M q$b $b v$b.json 'mlp\.gate\.'
done
done_testing
