#!/usr/bin/env bash
# t1877-convert-qwen35: tiny seeded Qwen3.5 hybrids (examples/make-tiny-llama
# --arch qwen3_5 / qwen3_5_moe / qwen3_next) in the hub's layouts:
# Qwen3_5ForConditionalGeneration (the text under model.language_model.,
# full_attention_interval 4: layers 0-2 Gated DeltaNet, 2/4 heads of 24/20,
# layer 3 gated attention; hidden 80, no width a multiple of 128; a BF16
# vision tower; without the multi-token-prediction layer mtp.*, whose mtp.fc
# ExLlamaV3 loads unpadded, so that a hidden size of 80 makes a pack it
# cannot load: t1884 converts that layer), a
# Qwen3_5MoeForConditionalGeneration with fused 3-D experts, a
# Qwen3NextForCausalLM with the fused in_proj_qkvz / in_proj_ba.
# Described (which linears share a Hessian, what is kept), converted end to
# end by pipelines/convert at 2.5 and 4 bpw: the source's keys but mtp.*,
# in_proj_b / in_proj_a, conv1d, A_log, dt_bias unquantized, the vision
# tower byte for byte; exl3-info --check auto clean (ExLlamaV3 v1.4.1 loads
# these families); validate ok; the KL falls with the bits and stays below
# round-to-nearest at equal bits. Bad inputs (a missing linear_* key, a
# conv1d of the wrong shape, num_experts disagreeing with the fused expert
# tensor): exit 1 naming the key or tensor, nothing written. The forward
# itself: tests/unit/t1581 (and the DeltaNet, t1580).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny=("$ROOT/examples/make-tiny-llama" --no-mtp --heads 2 --kv-heads 1 --lin-heads 2,4 --lin-dims 24,20)
"${tiny[@]}" --arch qwen3_5 M 4 80 96 >/dev/null
P=model.language_model.layers

# the description
check "the hybrids are in tensor-ls --architectures" \
	sh -c "tensor-ls --architectures | jq -r .architecture | grep -cE '^(Qwen3NextForCausalLM|Qwen3_5ForCausalLM|Qwen3_5ForConditionalGeneration|Qwen3_5MoeForCausalLM|Qwen3_5MoeForConditionalGeneration)\$' | grep -qx 5"
check "every module of the description is in the checkpoint" sh -c "tensor-ls --modules M >/dev/null"
check "linears: 3 DeltaNet layers x 3 (in_proj_qkv, in_proj_z, out_proj), 4 attention, 4 x 3 MLP, the head" \
	test "$(tensor-ls --config M | jq .linears)" -eq 26
check "layer 3 full attention (q_proj 2 x 2 heads x 24 rows: query and gate), layers 0-2 DeltaNet" \
	test "$(tensor-ls --linears M | jq -r 'select(.key | test("q_proj|in_proj_qkv$")) | "\(.layer):\(.shape[0])"' | tr '\n' ' ')" = \
	     "0:176 1:176 2:176 3:96 "
check "in_proj_qkv and in_proj_z read one Hessian, out_proj its own" \
	test "$(tensor-ls --linears M | jq -r 'select(.layer == 0 and (.key | test("linear_attn"))) | .group' | uniq | tr '\n' ' ')" = \
	     "$P.0.linear_attn.input $P.0.linear_attn.out_proj.input "
check "kept: in_proj_b, in_proj_a (4 x 80), conv1d (176 x 1 x 4), A_log, dt_bias (4), the gated norm (20)" \
	test "$(tensor-ls --modules M | jq -c 'select(.layer == 0 and .quantized == false and (.key | test("linear_attn"))) | [.kind, .shape]' | tr -d '\n')" = \
	     '["matrix",[4,80]]["matrix",[4,80]]["conv",[176,4]]["vector",[4]]["vector",[4]]["vector",[20]]'
check "--hq: nothing in the dense model (ExLlamaV3's qwen3_5: attention and DeltaNet +2 only with experts)" \
	test "$(tensor-ls --linears M | jq -c '[.role, .hq]' | sort -u | tr -d '\n')" = '["attention",0]["head",0]["mlp",0]'
check "neither mtp.* nor the vision tower is a module" \
	test "$(tensor-ls --modules M | jq -r .key | grep -c '^mtp\.\|visual')" -eq 0
"${tiny[@]}" --arch qwen3_next --experts 3 --top-k 2 --moe-inter 24 --shared-inter 32 NX 4 80 96 >/dev/null
check "Qwen3-Next: in_proj_qkvz a linear (2 x 48 + 2 x 80 rows), in_proj_ba a kept matrix (8 rows), one Hessian" \
	test "$(tensor-ls --modules NX | jq -c 'select(.layer == 0 and (.key | test("in_proj"))) | [.kind, .shape[0], .group]' | tr -d '\n')" = \
	     '["linear",256,"model.layers.0.linear_attn.input"]["matrix",8,null]'
check "Qwen3-Next: experts per key, a shared expert (hq 2) and its kept shared_expert_gate" \
	test "$(tensor-ls --modules NX | jq -c 'select(.layer == 3 and (.key | test("shared_expert"))) | [.kind, .hq]' | tr -d '\n')" = \
	     '["linear",2]["linear",2]["linear",2]["matrix",null]'

for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
ev=(--text eval.txt --rows 8 --cols 128)
build_rtn
tensor-ls M | jq -r .name | grep -v '^mtp\.' | sed -E 's/\.(weight|bias)$//' | sort -u >src.keys
# same_tensors A B REGEX: the tensors of A matching REGEX are B's, frame for frame
same_tensors() {
	local n k=0
	for n in $(tensor-ls "$1" | jq -r .name | grep -E "$3"); do
		cmp -s <(tensor-cat -q "$1" "$n") <(tensor-cat -q "$2" "$n") || return 1
		k=$((k + 1))
	done
	[ "$k" -gt 0 ] && [ "$(tensor-ls "$2" | jq -r .name | grep -cE "$3")" -eq "$k" ]
}
kl_prev=
for b in 2.5 4; do
	convert M q$b --bits $b --work w$b --rows 24 --cols 128 -j 2 2>convert$b.err >/dev/null
	check "convert --bits $b" test -f q$b/config.json
	check "$b bpw: the source's keys, nothing of mtp.*" \
		sh -c "tensor-ls q$b | jq -r .name | sed -E 's/\.(weight|bias|trellis|suh|svh|su|sv|mcg|mul1)\$//' | sort -u | cmp -s - src.keys"
	check "$b bpw: in_proj_b, in_proj_a, conv1d, A_log, dt_bias, norm of layer 0 stored unquantized" \
		test "$(tensor-ls q$b | jq -r '.name | select(startswith("'$P'.0.linear_attn.") and (endswith(".trellis") | not) and (endswith(".suh") | not) and (endswith(".svh") | not) and (endswith(".mul1") | not) and (endswith(".mcg") | not))' | sed 's/.*linear_attn\.//' | sort | tr '\n' ' ')" = \
		     "A_log conv1d.weight dt_bias in_proj_a.weight in_proj_b.weight norm.weight "
	check "$b bpw: the vision tower copied byte for byte" same_tensors M q$b '^model\.visual\.'
	check "$b bpw: exl3-info --check auto: ExLlamaV3 loads it" exl3-info --check auto q$b
	validate q$b --model M "${ev[@]}" -q >v$b.json
	check "$b bpw: validate ok" jqe '.ok' v$b.json
	kl_vs_rtn "$b bpw" M q$b $b v$b.json
done

# Qwen3.5-MoE: experts fused 3-D in the checkpoint, per expert in the pack
"${tiny[@]}" --arch qwen3_5_moe --interval 2 --experts 2 --top-k 1 --moe-inter 24 --shared-inter 32 ME 2 80 96 >/dev/null
convert ME qe --bits 3 --work we --rows 16 --cols 128 -j 2 2>converte.err >/dev/null
check "Qwen3.5-MoE at 3 bpw: each layer's 2 experts x 3 projections and the shared expert quantized" \
	test "$(tensor-ls qe | jq -r .name | grep -c 'mlp\.\(experts\.[0-9]*\|shared_expert\)\.[a-z_]*\.trellis$')" -eq 18
check "... the router and shared_expert_gate kept" \
	test "$(tensor-ls qe | jq -r .name | grep -c 'mlp\.\(gate\|shared_expert_gate\)\.weight$')" -eq 4
check "... exl3-info --check exllamav3 clean" exl3-info --check exllamav3 qe

# bad inputs: exit 1 naming the key or tensor, nothing written
mkdir bad1 && cp M/model.safetensors M/tokenizer*.json M/preprocessor_config.json bad1/
jq 'del(.text_config.linear_num_key_heads)' M/config.json >bad1/config.json
check_fail "convert: linear_num_key_heads missing, named" 1 'linear_num_key_heads' \
	convert bad1 bad1.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad1.out
mkdir bad2 && cp M/config.json M/tokenizer*.json M/preprocessor_config.json bad2/
{ tensor-ls M | jq -r .name | grep -v "^$P\.1\.linear_attn\.conv1d\.weight\$" | xargs tensor-cat -q M
  tensor-gen -s 7 "$P.1.linear_attn.conv1d.weight=176x4"; } | tensor-cat -q -o bad2/model.safetensors -
check_fail "convert: a conv1d of shape 176x4 (not 176x1x4) named" 1 "$P\.1\.linear_attn\.conv1d\.weight" \
	convert bad2 bad2.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad2.out
mkdir bad3 && cp ME/model.safetensors ME/tokenizer*.json ME/preprocessor_config.json bad3/
jq '.text_config.num_experts = 3' ME/config.json >bad3/config.json
check_fail "convert: num_experts 3 against fused experts of 2: the tensor named" 1 "mlp\.experts\.gate_up_proj" \
	convert bad3 bad3.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad3.out
NO_INFO="bad1 bad2 bad3"
done_testing
