#!/usr/bin/env bash
# t1876-convert-glm-lite: a tiny seeded GLM-4.7-Flash
# (examples/make-tiny-llama --arch glm4_moe_lite: DeepSeek's latent
# attention with q_lora 48, kv_lora 40, head dims 24/8/20, interleaved
# rope; mlp_layer_types with layer 0 dense (intermediate 96) and layer 1 of
# 4 experts 40 wide + a shared expert, sigmoid routing with a correction
# bias, routed_scaling_factor 1.8; hidden 80: no dimension a multiple of
# 128; 2 heads; without the multi-token-prediction layer real checkpoints
# have, make-tiny-llama --no-mtp: t1884 converts that layer)
# described, converted end to end by pipelines/convert at 2.5 and 4 bpw:
# the written directory holds the source's keys,
# kv_b_proj, the router and its correction bias unquantized, every expert
# with one K per projection over the layer's experts; validate accepts
# each; the KL to the original falls as the bits rise and stays below
# round-to-nearest at the same bits; the reader contract holds but for
# what the tiny model cannot meet (gptqmodel: the sizes below 128;
# exllamav3 v1.4.1: the family, which it has no file for).
# Bad inputs (a missing config key, a missing tensor, mlp_layer_types that
# make the dense layer sparse): exit 1 naming the key or tensor, nothing
# written. The forward itself: tests/unit/t1575.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny=("$ROOT/examples/make-tiny-llama" --no-mtp --arch glm4_moe_lite --experts 4 --top-k 2 --moe-inter 40 --q-lora 48
      --kv-lora 40 --mla-dims 24,8,20 --heads 2 --kv-heads 2)
"${tiny[@]}" M 2 80 96 >/dev/null

# the description
check "Glm4MoeLiteForCausalLM is in tensor-ls --architectures" \
	sh -c "tensor-ls --architectures | jq -se 'map(select(.architecture == \"Glm4MoeLiteForCausalLM\") | .model_type) == [\"glm4_moe_lite\"]' >/dev/null"
check "every module of the description is in the checkpoint" sh -c "tensor-ls --modules M >/dev/null"
check "linears: 2 x 4 attention (q_a, q_b, kv_a, o), 3 dense, 4 x 3 experts + 3 shared, the head" \
	test "$(tensor-ls --config M | jq .linears)" -eq 27
check "kv_b_proj a kept matrix of the 40-wide latent (2 heads x (24 + 20) rows), as DeepSeek-V3's" \
	test "$(tensor-ls --modules M | jq -c 'select(.layer == 0 and (.key | test("kv_b_proj"))) | [.kind, .quantized, .shape]')" = \
	     '["matrix",false,[88,40]]'
check "layer 0 dense, layer 1 sparse (mlp_layer_types)" \
	test "$(tensor-ls --modules M | jq -r 'select(.key | test("mlp\\.(gate_proj|gate)$")) | .key' | tr '\n' ' ')" = \
	     "model.layers.0.mlp.gate_proj model.layers.1.mlp.gate "
check "router and correction bias: unquantized, role router" \
	test "$(tensor-ls --modules M | jq -c 'select(.role == "router") | [.key, .kind, .quantized, .shape]' | tr -d '\n')" = \
	     '["model.layers.1.mlp.gate","matrix",false,[4,80]]["model.layers.1.mlp.gate.e_score_correction_bias","vector",false,[4]]'
check "--hq: attention 2, dense MLP 1, shared experts 2 (the DeepSeek-V3 rows)" \
	test "$(tensor-ls --linears M | jq -c '[.role, .hq]' | sort -u | tr -d '\n')" = \
	     '["attention",2]["expert",0]["head",0]["mlp",1]["shared_expert",2]'
check "each expert projection tied over the layer's 4 experts" \
	test "$(tensor-ls --linears M | jq -r 'select(.role == "expert") | .tied_group' | sort | uniq -c | awk '{print $1, $2}' | tr '\n' ' ')" = \
	     "4 model.layers.1.mlp.experts.*.down_proj 4 model.layers.1.mlp.experts.*.gate_proj 4 model.layers.1.mlp.experts.*.up_proj "
check "the multi-token-prediction layer (model.layers.2) is no module" \
	test "$(tensor-ls --modules M | jq -r .key | grep -c '^model\.layers\.2\.')" -eq 0
mkdir NT && cp M/model.safetensors M/tokenizer*.json NT/ && jq 'del(.mlp_layer_types)' M/config.json >NT/config.json
check "without mlp_layer_types: layer 0 dense (Hugging Face's default), the same modules" \
	sh -c "tensor-ls --modules NT >nt.mods && tensor-ls --modules M >m.mods && [ -s nt.mods ] && cmp -s m.mods nt.mods"
"${tiny[@]}" --fused-experts FX 2 80 96 >/dev/null
check "--fused-experts (Transformers v5's gate_up_proj / down_proj): described, the same linears" \
	sh -c "tensor-ls --modules FX >/dev/null && tensor-ls --linears FX >fx.lin && tensor-ls --linears M >m.lin &&
	       [ -s fx.lin ] && jq -r .key fx.lin >fx.keys && jq -r .key m.lin | cmp -s - fx.keys"

for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
ev=(--text eval.txt --rows 8 --cols 128)
build_rtn
tensor-ls M | jq -r .name | grep -v '^model\.layers\.2\.' | sed -E 's/\.(weight|bias)$//' | sort -u >src.keys
kl_prev=
for b in 2.5 4; do
	convert M q$b --bits $b --work w$b --rows 40 --cols 128 -j 2 2>convert$b.err >/dev/null
	check "convert --bits $b" test -f q$b/config.json
	check "$b bpw: the source's keys, every expert, nothing of the MTP layer" \
		sh -c "tensor-ls q$b | jq -r .name | sed -E 's/\.(weight|bias|trellis|suh|svh|su|sv|mcg|mul1)\$//' | sort -u | cmp -s - src.keys"
	check "$b bpw: all 4 x 3 expert + 3 shared-expert linears quantized" \
		test "$(tensor-ls q$b | jq -r .name | grep -c 'mlp\.\(experts\.[0-9]*\|shared_experts\)\..*\.trellis$')" -eq 15
	check "$b bpw: kv_b_proj stored as a plain weight, no trellis" \
		test "$(tensor-ls q$b | jq -r .name | grep 'kv_b_proj' | tr '\n' ' ')" = \
		     "model.layers.0.self_attn.kv_b_proj.weight model.layers.1.self_attn.kv_b_proj.weight "
	check "$b bpw: the router and its correction bias stored unquantized" \
		test "$(tensor-ls q$b | jq -c 'select(.name | startswith("model.layers.1.mlp.gate.")) | [.name, .shape]' | tr -d '\n')" = \
		     '["model.layers.1.mlp.gate.weight",[4,80]]["model.layers.1.mlp.gate.e_score_correction_bias",[4]]'
	check "$b bpw: --check gptqmodel: only sizes below 128 named (aligned), no other rule" \
		sh -c "exl3-info --check gptqmodel --json q$b | jq -e '.ok == false and (.violations | map(.rule) | unique) == [\"aligned\"]' >/dev/null"
	exl3-info --json --check exllamav3 q$b >q$b.exl 2>&1 && rc=0 || rc=$?
	# every other rule (one K per expert projection over the layer's
	# experts, kept tensors, padding, files) holds
	check "$b bpw: --check exllamav3: exit 1, the family its one violation (v1.4.1 has no GLM-4.7-Flash)" \
		sh -c "[ $rc -eq 1 ] && jq -e '[.violations[].rule] == [\"family\"]' q$b.exl >/dev/null"
	validate q$b --model M "${ev[@]}" -q >v$b.json
	check "$b bpw: validate ok" jqe '.ok' v$b.json
	# round to nearest: every decoder linear at b bits, the head at 6; the
	# router, its bias and kv_b_proj as the EXL3 model stores them
	kl_vs_rtn "$b bpw" M q$b $b v$b.json 'mlp\.gate\.|kv_b_proj'
done

# bad inputs: exit 1 naming the key or tensor, nothing written
mkdir bad1 && cp M/model.safetensors M/tokenizer*.json bad1/
jq 'del(.kv_lora_rank)' M/config.json >bad1/config.json
check_fail "tensor-ls --modules: kv_lora_rank missing, named" 1 'missing "kv_lora_rank"' tensor-ls --modules bad1
check_fail "convert: the same, named" 1 'kv_lora_rank' convert bad1 bad1.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad1.out
mkdir bad2 && cp M/config.json M/tokenizer*.json bad2/
tensor-ls M | jq -r .name | grep -v '^model\.layers\.1\.self_attn\.kv_b_proj\.weight$' | xargs tensor-cat -q M |
	tensor-cat -q -o bad2/model.safetensors -
check_fail "tensor-ls --modules: a missing kv_b_proj named" 1 "model\.layers\.1\.self_attn\.kv_b_proj" \
	tensor-ls --modules bad2
check_fail "convert: the missing kv_b_proj named" 1 "model\.layers\.1\.self_attn\.kv_b_proj" \
	convert bad2 bad2.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad2.out
mkdir bad3 && cp M/model.safetensors M/tokenizer*.json bad3/
jq '.mlp_layer_types = ["sparse", "sparse"]' M/config.json >bad3/config.json
check_fail "convert: mlp_layer_types making layer 0 sparse: its missing router named" 1 \
	"model\.layers\.0\.mlp\.gate" convert bad3 bad3.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad3.out
NO_INFO="bad1 bad2 bad3"
done_testing
