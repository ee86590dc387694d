#!/usr/bin/env bash
# t1878-convert-dsa: a tiny seeded GLM-5 (examples/make-tiny-llama --arch
# glm_moe_dsa: DeepSeek's latent attention with q_lora 48, kv_lora 40,
# head dims 24/8/20; the sparse attention's indexer of 3 heads of 20 and
# index_topk 64 in layers 0 and 1, layer 2 "shared" (indexer_types); layer
# 0 dense, layers 1 and 2 of 4 experts 40 wide + a shared expert; hidden
# 80: no dimension a multiple of 128; without the multi-token-prediction
# layer real checkpoints have, make-tiny-llama --no-mtp: t1884 converts
# that layer) described, converted end to end by
# pipelines/convert at 2.5 and 4 bpw with calibration rows of 64 tokens
# (index_topk: every query sees every key, the captured inputs those of
# dense attention) and evaluated on rows of 128 (where the indexer's
# choice matters): the written directory holds the source's keys,
# indexer.wq_b quantized, indexer.wk, k_norm and
# weights_proj, kv_b_proj, the routers and their correction biases
# unquantized; validate accepts each; the KL to the original falls as the
# bits rise and stays below round-to-nearest at the same bits; --check
# gptqmodel names only the sizes below 128. A DeepSeek V3.2 in FP8 with
# the ue8m0 scale format's config converts to the pack of its dequantized
# weights. Bad inputs (a full layer's indexer.wk missing; calibration rows
# longer than index_topk with a shared layer): exit 1 naming the tensor or
# the reason, nothing written. The forward itself: tests/unit/t1577.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny=("$ROOT/examples/make-tiny-llama" --no-mtp --arch glm_moe_dsa --experts 4 --top-k 2 --moe-inter 40 --q-lora 48
      --kv-lora 40 --mla-dims 24,8,20 --heads 2 --kv-heads 2 --index-topk 64 --index-dims 3,20 --shared-layers 2)
"${tiny[@]}" M 3 80 96 >/dev/null

# the description
check "GlmMoeDsaForCausalLM and DeepseekV32ForCausalLM are in tensor-ls --architectures" \
	sh -c "tensor-ls --architectures | jq -se 'map(select(.architecture | test(\"GlmMoeDsa|DeepseekV32\")) | .model_type) == [\"glm_moe_dsa\", \"deepseek_v32\"]' >/dev/null"
check "every module of the description is in the checkpoint" sh -c "tensor-ls --modules M >/dev/null"
check "the indexer in layers 0 and 1 (full), none in layer 2 (shared): wq_b a linear, wk and weights_proj kept matrices, k_norm's weight and bias vectors" \
	test "$(tensor-ls --modules M | jq -c 'select(.key | test("indexer")) | [.key, .kind, .quantized, .shape]' | sed 's/model.layers.\([0-9]\).self_attn.indexer./\1/' | tr -d '\n')" = \
	     '["0wq_b","linear",true,[60,48]]["0wk","matrix",false,[20,80]]["0k_norm","vector",false,[20]]["0k_norm.bias","vector",false,[20]]["0weights_proj","matrix",false,[3,80]]["1wq_b","linear",true,[60,48]]["1wk","matrix",false,[20,80]]["1k_norm","vector",false,[20]]["1k_norm.bias","vector",false,[20]]["1weights_proj","matrix",false,[3,80]]'
check "indexer.wq_b reads q_b_proj's Hessian group (the query latent), --hq 2 as the attention" \
	test "$(tensor-ls --linears M | jq -r 'select(.key | test("indexer")) | [.group, .hq] | @tsv' | tr '\t\n' '  ')" = \
	     "model.layers.0.self_attn.q_b_proj.input 2 model.layers.1.self_attn.q_b_proj.input 2 "
check "the multi-token-prediction layer (model.layers.3) is no module" \
	test "$(tensor-ls --modules M | jq -r .key | grep -c '^model\.layers\.3\.')" -eq 0

for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
ev=(--text eval.txt --rows 4 --cols 128)
build_rtn
tensor-ls M | jq -r .name | grep -v '^model\.layers\.3\.' | sed -E 's/\.(weight|bias)$//' | sort -u >src.keys
kept='mlp\.gate\.|kv_b_proj|indexer\.(wk|weights_proj)'
kl_prev=
for b in 2.5 4; do
	# (one work directory: the second rate encodes only the widths the first did not)
	convert M q$b --bits $b --work w --keep-hessians --rows 16 --cols 64 -j 2 2>convert$b.err >/dev/null
	check "convert --bits $b (calibration rows of 64 = index_topk)" test -f q$b/config.json
	check "$b bpw: the source's keys, nothing of the MTP layer" \
		sh -c "tensor-ls q$b | jq -r .name | sed -E 's/\.(weight|bias|trellis|suh|svh|su|sv|mcg|mul1)\$//' | sort -u | cmp -s - src.keys"
	check "$b bpw: indexer.wq_b quantized in layers 0 and 1" \
		test "$(tensor-ls q$b | jq -r .name | grep -c 'indexer\.wq_b\.trellis$')" -eq 2
	check "$b bpw: indexer.wk, weights_proj and k_norm stored as plain tensors" \
		test "$(tensor-ls q$b | jq -r 'select(.name | test("indexer\\.(wk|weights_proj|k_norm)")) | .name' | sed 's/model.layers.[01].self_attn.indexer.//' | sort | uniq -c | awk '{print $1 $2}' | tr '\n' ' ')" = \
		     "2k_norm.bias 2k_norm.weight 2weights_proj.weight 2wk.weight "
	check "$b bpw: --check gptqmodel: only sizes below 128 named (aligned), no other rule" \
		sh -c "exl3-info --check gptqmodel --json q$b | jq -e '.ok == false and (.violations | map(.rule) | unique) == [\"aligned\"]' >/dev/null"
	exl3-info --json --check exllamav3 q$b >q$b.exl 2>&1 && rc=0 || rc=$?
	check "$b bpw: --check exllamav3: exit 1, the family its one violation (v1.4.1 has no GLM-5)" \
		sh -c "[ $rc -eq 1 ] && jq -e '[.violations[].rule] == [\"family\"]' q$b.exl >/dev/null"
	check "$b bpw: --check auto: exit 0, no reader checked (ExLlamaV3 does not load GLM-5)" \
		sh -c "exl3-info --check auto q$b | grep -q 'auto: no reader checked'"
	validate q$b --model M "${ev[@]}" -q >v$b.json
	check "$b bpw: validate ok (rows of 128: the indexer picks 64 keys of up to 128)" jqe '.ok' v$b.json
	kl_vs_rtn "$b bpw" M q$b $b v$b.json "$kept"
done

# DeepSeek V3.2 in FP8 (ue8m0 scale format) against its dequantized weights
ds=(--arch deepseek_v32 --experts 4 --top-k 2 --moe-inter 40 --groups 1,1 --index-topk 32 --index-dims 2,12)
"$ROOT/examples/make-tiny-llama" "${ds[@]}" --fp8 F8 2 64 200 >/dev/null
check "DeepSeek V3.2 FP8: indexer wq_b and wk F8_E4M3 with their scales, weights_proj not" \
	test "$(tensor-ls F8 | jq -r 'select(.name | test("layers.0.self_attn.indexer")) | [.name, .dtype] | @tsv' | sed 's/.*indexer.//' | sort | tr '\t\n' '  ')" = \
	     "k_norm.bias F32 k_norm.weight F32 weights_proj.weight F32 wk.weight F8_E4M3 wk.weight_scale_inv F32 wq_b.weight F8_E4M3 wq_b.weight_scale_inv F32 "
mkdir DQ && cp F8/tokenizer*.json DQ/ && jq 'del(.quantization_config)' F8/config.json >DQ/config.json
tensor-cat -q -o DQ/model.safetensors F8 $(tensor-ls F8 | jq -r .name | grep -v '_scale_inv$')
convert F8 q8 --bits 2.5 --work w8 --rows 8 --cols 32 -j 2 -q
convert DQ qd --bits 2.5 --work wd --rows 8 --cols 32 -j 2 -q
check "convert of the FP8 checkpoint: the dequantized checkpoint's pack, byte for byte" \
	cmp q8/model.safetensors qd/model.safetensors

# bad inputs: exit 1 naming the tensor or the reason, nothing written
mkdir bad1 && cp M/config.json M/tokenizer*.json bad1/
tensor-ls M | jq -r .name | grep -v '^model\.layers\.1\.self_attn\.indexer\.wk\.weight$' | xargs tensor-cat -q M |
	tensor-cat -q -o bad1/model.safetensors -
check_fail "tensor-ls --modules: a full layer's missing indexer.wk named" 1 "model\.layers\.1\.self_attn\.indexer\.wk" \
	tensor-ls --modules bad1
check_fail "convert: the missing indexer.wk named" 1 "model\.layers\.1\.self_attn\.indexer\.wk" \
	convert bad1 bad1.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad1.out
check_fail "convert with calibration rows of 128 (above index_topk 64) and a shared layer: refused, the reason named" 1 \
	"layer 2 reuses the keys" convert M bad2.out --bits 3 --work wb2 --rows 4 --cols 128 -q
check "... nothing written" test ! -e bad2.out
NO_INFO="bad1"
done_testing
