#!/usr/bin/env bash
# t1865-convert-phi3: a tiny seeded Phi3 (examples/make-tiny-llama --arch
# phi3: the fused self_attn.qkv_proj and mlp.gate_up_proj of the real
# checkpoints, partial_rotary_factor 0.75, hidden 64 and intermediate 96,
# neither a multiple of 128) described as row slices, converted end to end
# by pipelines/convert at two rates: the written directory holds the split
# q_proj/k_proj/v_proj and gate_proj/up_proj linears ExLlamaV3's Phi3
# loader reads and no fused tensor; validate accepts each (its decode check
# against the fused rows); the KL to the original falls as the bits rise and
# stays below round-to-nearest at the same bits. Bad inputs: a fused tensor
# whose rows do not match the config, longrope factor lists that do not fit
# (longrope itself: tests/unit/t1565).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
"$ROOT/examples/make-tiny-llama" --arch phi3 M 2 64 96 >/dev/null

# the description
check "every module of the description is in the checkpoint" sh -c "tensor-ls --modules M >/dev/null"
check "q/k/v_proj: rows 0..64, 64..96, 96..128 of qkv_proj; one Hessian group" \
	test "$(tensor-ls --linears M | jq -c 'select(.group == "model.layers.1.self_attn.input") | [.key, .weight, .rows, .shape]' | tr -d '\n')" = \
	     '["model.layers.1.self_attn.q_proj","model.layers.1.self_attn.qkv_proj.weight",[0,64],[64,64]]["model.layers.1.self_attn.k_proj","model.layers.1.self_attn.qkv_proj.weight",[64,96],[32,64]]["model.layers.1.self_attn.v_proj","model.layers.1.self_attn.qkv_proj.weight",[96,128],[32,64]]'
check "gate/up_proj: rows 0..96, 96..192 of gate_up_proj; one Hessian group" \
	test "$(tensor-ls --linears M | jq -c 'select(.group == "model.layers.0.mlp.input") | [.key, .rows]' | tr -d '\n')" = \
	     '["model.layers.0.mlp.gate_proj",[0,96]]["model.layers.0.mlp.up_proj",[96,192]]'
check "o_proj and down_proj: their own weights, no rows" \
	test "$(tensor-ls --linears M | jq -c 'select(.key | test("o_proj|down_proj")) | .rows' | sort -u)" = null
check "15 linears: 7 per layer and the head; no --hq promotion (ExLlamaV3's phi3.py has none)" \
	test "$(tensor-ls --linears M | jq -c '[.role, .hq]' | sort | uniq -c | tr -s ' ' | tr -d '\n')" = \
	     ' 8 ["attention",0] 1 ["head",0] 6 ["mlp",0]'
check "Phi3 is in tensor-ls --architectures" sh -c "tensor-ls --architectures | jq -s -e 'any(.[]; .architecture == \"Phi3ForCausalLM\" and .model_type == \"phi3\")' >/dev/null"
tensor-cat -q --rows 64:96 M model.layers.1.self_attn.qkv_proj.weight | tensor-ls >k.json
check "tensor-cat --rows 64:96: the 32 rows of k, metadata rows=64:96" \
	test "$(jq -c '[.shape, .meta.rows]' k.json)" = '[[32,64],"64:96"]'
tensor-cat -q M model.layers.1.self_attn.qkv_proj.weight | tensor-cat -q --rows 64:96 - | tensor-ls --stats >k2.json
tensor-cat -q --rows 64:96 M model.layers.1.self_attn.qkv_proj.weight | tensor-ls --stats >k3.json
check "... the same rows from a frame stream" test "$(jq -c .stats k3.json)" = "$(jq -c .stats k2.json)"
check_fail "tensor-cat --rows past the tensor's rows" 1 "qkv_proj.weight': --rows 100:129 past its 128 rows" \
	tensor-cat -q --rows 100:129 M model.layers.1.self_attn.qkv_proj.weight
check_fail "tensor-cat --rows B <= A is a usage error" 2 "--rows: '5:5' is not A:B" tensor-cat -q --rows 5:5 M

for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
ev=(--text eval.txt --rows 8 --cols 128)
build_rtn
kl_prev=
for b in 2 4; do
	convert M q$b --bits $b --work w$b --rows 40 --cols 128 -j 2 2>convert$b.err >/dev/null
	check "convert --bits $b" test -f q$b/config.json
	check "$b bpw: q/k/v_proj and gate/up_proj quantized under their split keys (ExLlamaV3's Phi3)" \
		test "$(tensor-ls q$b | jq -r .name | grep -c '\.\(q_proj\|k_proj\|v_proj\|gate_proj\|up_proj\)\.trellis$')" -eq 10
	check "$b bpw: no fused tensor in the output" \
		test "$(tensor-ls q$b | jq -r .name | grep -c 'qkv_proj\|gate_up_proj')" -eq 0
	check "$b bpw: the norms and the embedding passed through" \
		test "$(tensor-ls q$b | jq -r .name | grep -c 'layernorm\|embed_tokens\|model\.norm')" -eq 6
	validate q$b --model M "${ev[@]}" -q >v$b.json
	check "$b bpw: validate ok, every linear decoded against its fused rows" jqe '.ok and .check.tensors == 15' v$b.json
	# round to nearest per output row: the fused tensors' rows are the
	# linears' rows, so rounding them fused is rounding each slice
	kl_vs_rtn "$b bpw" M q$b $b v$b.json
done

# bad inputs: exit 1 naming the tensor or key, nothing written
mkdir bad && cp M/config.json M/tokenizer*.json bad/
{
	tensor-ls M | jq -r .name | grep -v '^model\.layers\.1\.self_attn\.qkv_proj' | xargs tensor-cat -q M
	tensor-cat -q --rows 0:127 M model.layers.1.self_attn.qkv_proj.weight
} | tensor-cat -q -o bad/model.safetensors -
check_fail "tensor-ls --modules: a fused tensor of 127 rows (config: 128) named" 1 \
	"tensor 'model.layers.1.self_attn.qkv_proj.weight': shape 127x64, config says 128x64 \(a fused tensor: linear 'model.layers.1.self_attn.q_proj' is its rows 0..64\)" \
	tensor-ls --modules bad
check_fail "convert: the fused tensor of the wrong rows named" 1 "qkv_proj.weight': shape 127x64, config says 128x64" \
	convert bad bad.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad.out
check_fail "model-eval: the same, named" 1 "qkv_proj.weight': shape 127x64, config says 128x64" \
	model-eval -q --model bad --text eval.txt --rows 1 --cols 16
mkdir lr lr5 && cp M/model.safetensors M/tokenizer*.json lr/ && cp M/model.safetensors M/tokenizer*.json lr5/
jq '.rope_scaling = {"type": "longrope", "long_factor": [1, 1.5, 2, 3, 4, 6], "short_factor": [1, 1, 1.2, 1.5, 2, 2]}
    | .original_max_position_embeddings = 8' M/config.json >lr/config.json
check "model-eval runs a longrope model (rows past its original context)" \
	sh -c "model-eval -q --model lr --text eval.txt --rows 1 --cols 16 | jq -e '.perplexity > 0' >/dev/null"
jq '.rope_scaling = {"type": "longrope", "long_factor": [1, 1, 1, 1, 1], "short_factor": [1, 1, 1, 1, 1]}' \
	M/config.json >lr5/config.json
check_fail "convert: longrope lists that do not fit the rotated dimensions named" 1 \
	"rope_scaling longrope has 5 factors per list, and 12 rotated dimensions of a head want 6" \
	convert lr5 lr5.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e lr5.out
done_testing
