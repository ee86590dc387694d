#!/usr/bin/env bash
# t1863-convert-glm: a tiny seeded GLM-4 MoE (examples/make-tiny-llama
# --arch glm4_moe: q/k/v biases, q/k norms, partial_rotary_factor 0.5,
# layer 0 dense (intermediate 96), layer 1 of 4 experts 40 wide + a shared
# expert with sigmoid routing and a correction bias, hidden 64: no
# dimension a multiple of 128; and the multi-token-prediction layer 2 real
# checkpoints have) described, converted end to end by pipelines/convert
# at two rates: the written directory holds the source's keys (the MTP
# layer left out, with a note), the router and its correction bias
# unquantized, every expert; validate accepts each; the KL to the original
# falls as the bits rise and stays below round-to-nearest at the same
# bits. Bad inputs (an expert count the top k exceeds, a missing expert):
# exit 1 naming the key or tensor, nothing written. The forward itself:
# tests/unit/t1567.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
"$ROOT/examples/make-tiny-llama" --arch glm4_moe --experts 4 --top-k 2 --moe-inter 40 M 2 64 96 >/dev/null
# a config that names no multi-token-prediction layer (num_nextn_predict_layers
# 0) beside a checkpoint that holds one: the layer is no module and is left
# out with a note (t1884 converts a layer the config names, at --mtp-bits)
jq '.num_nextn_predict_layers = 0' M/config.json >M/config.json.tmp && mv M/config.json.tmp M/config.json

# the description
check "Glm4MoeForCausalLM is in tensor-ls --architectures" \
	sh -c "tensor-ls --architectures | jq -se 'map(select(.architecture == \"Glm4MoeForCausalLM\") | .model_type) == [\"glm4_moe\"]' >/dev/null"
check "every module of the description is in the checkpoint" sh -c "tensor-ls --modules M >/dev/null"
check "linears: 2 x 4 attention, 3 dense, 4 x 3 experts + 3 shared, the head" \
	test "$(tensor-ls --config M | jq .linears)" -eq 27
check "q/k/v_proj have a bias (attention_bias), o_proj none" \
	test "$(tensor-ls --linears M | jq -c 'select(.layer == 1 and .role == "attention") | .bias' | tr -d '\n')" = truetruetruefalse
check "q/k norms of head_dim 16 (use_qk_norm)" \
	test "$(tensor-ls --modules M | jq -c 'select(.key | test("layers.0.self_attn.[qk]_norm")) | .shape' | tr -d '\n')" = '[16][16]'
check "router and correction bias: unquantized, role router" \
	test "$(tensor-ls --modules M | jq -c 'select(.role == "router") | [.key, .kind, .quantized, .shape]' | tr -d '\n')" = \
	     '["model.layers.1.mlp.gate","matrix",false,[4,64]]["model.layers.1.mlp.gate.e_score_correction_bias","vector",false,[4]]'
check "--hq: attention 2, dense MLP 1, shared experts 2 (ExLlamaV3's glm4_moe)" \
	test "$(tensor-ls --linears M | jq -c '[.role, .hq]' | sort -u | tr -d '\n')" = \
	     '["attention",2]["expert",0]["head",0]["mlp",1]["shared_expert",2]'
check "the multi-token-prediction layer (model.layers.2) is no module" \
	test "$(tensor-ls --modules M | jq -r .key | grep -c '^model\.layers\.2\.')" -eq 0
"$ROOT/examples/make-tiny-llama" --arch glm4_moe --experts 4 --top-k 2 --moe-inter 40 --no-qk-norm NQ 2 64 96 >/dev/null
check "use_qk_norm false (GLM-4.5-Air): no q/k norms in the description" \
	test "$(tensor-ls --modules NQ | jq -r .key | grep -c '_norm$')" -eq 0
check "use_qk_norm false: model-eval runs it" sh -c "model-eval -q --model NQ --text '$ROOT/README.md' --rows 2 --cols 32 | jq -e '.nll > 0' >/dev/null"

for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
ev=(--text eval.txt --rows 8 --cols 128)
build_rtn
# source keys of the model (the MTP layer's excepted), as module keys
tensor-ls M | jq -r .name | grep -v '^model\.layers\.2\.' | sed -E 's/\.(weight|bias)$//' | sort -u >src.keys
kl_prev=
for b in 2 4; do
	convert M q$b --bits $b --work w$b --rows 40 --cols 128 -j 2 2>convert$b.err >/dev/null
	check "convert --bits $b" test -f q$b/config.json
	[ "$b" != 2 ] || check "pack-write: the multi-token-prediction layer (32 tensors) left out with a note" \
		sh -c "tensor-cat -q q$b | pack-write --model M --passthrough repack 2>&1 >/dev/null | grep -q 'note: 32 tensors of M.s layers from 2 on (multi-token prediction) left out'"
	check "$b bpw: the source's keys, every expert, nothing of the MTP layer" \
		sh -c "tensor-ls q$b | jq -r .name | sed -E 's/\.(weight|bias|trellis|suh|svh|su|sv|mcg|mul1)\$//' | sort -u | cmp -s - src.keys"
	check "$b bpw: all 4 x 3 expert + 3 shared-expert linears quantized" \
		test "$(tensor-ls q$b | jq -r .name | grep -c 'mlp\.\(experts\.[0-9]*\|shared_experts\)\..*\.trellis$')" -eq 15
	check "$b bpw: q/k/v biases stored beside their quantized linears" \
		test "$(tensor-ls q$b | jq -r .name | grep -c 'self_attn\.[qkv]_proj\.bias$')" -eq 6
	check "$b bpw: the router and its correction bias stored unquantized" \
		test "$(tensor-ls q$b | jq -c 'select(.name | startswith("model.layers.1.mlp.gate.")) | [.name, .shape]' | tr -d '\n')" = \
		     '["model.layers.1.mlp.gate.weight",[4,64]]["model.layers.1.mlp.gate.e_score_correction_bias",[4]]'
	validate q$b --model M "${ev[@]}" -q >v$b.json
	check "$b bpw: validate ok" jqe '.ok' v$b.json
	# round to nearest: every decoder linear at b bits, the head at 6; the
	# router and its bias as the EXL3 model stores them
	kl_vs_rtn "$b bpw" M q$b $b v$b.json 'mlp\.gate\.'
done

# bad inputs: exit 1 naming the key or tensor, nothing written
mkdir bad1 && cp M/model.safetensors M/tokenizer*.json bad1/
jq '.num_experts_per_tok = 5' M/config.json >bad1/config.json
check_fail "tensor-ls --modules: top k above the expert count named" 1 \
	"'num_experts_per_tok' = 5 is more than 'n_routed_experts' = 4" tensor-ls --modules bad1
check_fail "convert: the same, named" 1 "'num_experts_per_tok' = 5" \
	convert bad1 bad1.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad1.out
mkdir bad2 && cp M/config.json M/tokenizer*.json bad2/
tensor-ls M | jq -r .name | grep -v '^model\.layers\.1\.mlp\.experts\.3\.down_proj\.weight$' | xargs tensor-cat -q M |
	tensor-cat -q -o bad2/model.safetensors -
check_fail "tensor-ls --modules: a missing expert named" 1 "model\.layers\.1\.mlp\.experts\.3\.down_proj" \
	tensor-ls --modules bad2
check_fail "convert: the missing expert named" 1 "model\.layers\.1\.mlp\.experts\.3\.down_proj" \
	convert bad2 bad2.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad2.out
NO_INFO="bad1 bad2"
done_testing
