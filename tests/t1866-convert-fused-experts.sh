#!/usr/bin/env bash
# t1866-convert-fused-experts: the experts of a layer fused in two 3-D
# tensors, as Transformers v5 writes them (mlp.experts.gate_up_proj
# (experts, 2 * moe_inter, hidden), mlp.experts.down_proj (experts, hidden,
# moe_inter): examples/make-tiny-llama --fused-experts, the same seeded
# weights as the per-expert checkpoint). The description reads every
# expert's linear as rows of them; model-eval of the two sources gives the
# same logits (KL 0, top-1 1); pipelines/convert writes byte-identical
# directories from both, with the per-expert keys and no fused tensor;
# validate accepts it against the fused source. Bad shapes exit 1 naming the
# tensor, nothing written.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model --arch qwen3-moe A 2 64 96
tiny_model --arch qwen3-moe --fused-experts F 2 64 96
tiny_model --arch deepseek_v3 --experts 4 DA 2 64 96
tiny_model --arch deepseek_v3 --experts 4 --fused-experts DF 2 64 96

check "fused checkpoint: no per-expert key, two 3-D tensors per sparse layer" \
	test "$(tensor-ls F | jq -c 'select(.name | test("experts")) | [.name, .shape]' | tr -d '\n')" = \
	'["model.layers.0.mlp.experts.gate_up_proj",[4,96,64]]["model.layers.0.mlp.experts.down_proj",[4,64,48]]["model.layers.1.mlp.experts.gate_up_proj",[4,96,64]]["model.layers.1.mlp.experts.down_proj",[4,64,48]]'
check "every module of the description is in it" sh -c "tensor-ls --modules F >/dev/null && tensor-ls --modules DF >/dev/null"
check "expert 1: gate rows 96..144, up 144..192 of gate_up_proj, down 64..128 of down_proj" \
	test "$(tensor-ls --linears F | jq -c 'select(.key | test("layers.1.mlp.experts.1\\.")) | [.key, .weight, .rows]' | tr -d '\n')" = \
	'["model.layers.1.mlp.experts.1.gate_proj","model.layers.1.mlp.experts.gate_up_proj",[96,144]]["model.layers.1.mlp.experts.1.up_proj","model.layers.1.mlp.experts.gate_up_proj",[144,192]]["model.layers.1.mlp.experts.1.down_proj","model.layers.1.mlp.experts.down_proj",[64,128]]'
check "the same linears, keys, groups and shapes as the per-expert checkpoint" \
	test "$(tensor-ls --linears F | jq -c '[.key, .group, .shape]')" = "$(tensor-ls --linears A | jq -c '[.key, .group, .shape]')"
tensor-cat -q --rows 144:192 F model.layers.1.mlp.experts.gate_up_proj | tensor-ls --stats >f.json
tensor-cat -q A model.layers.1.mlp.experts.1.up_proj.weight | tensor-ls --stats >a.json
check "tensor-cat --rows 144:192 of the fused tensor: expert 1's up_proj (48x64)" \
	test "$(jq -c '[.shape, .stats]' f.json)" = "$(jq -c '[.shape, .stats]' a.json)"
check_fail "tensor-cat --rows past the (4*96)x64 view" 1 "past the 384 rows of its 384x64 view" \
	tensor-cat -q --rows 380:385 F model.layers.1.mlp.experts.gate_up_proj

for i in $(seq 1 20); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog."; done >eval.txt
ev=(--text eval.txt --rows 4 --cols 32)
for m in "A F" "DA DF"; do
	set -- $m
	model-eval -q --model "$1" --quantized "$2" "${ev[@]}" >e$2.json
	check "model-eval: $2 (fused) gives $1's logits: KL 0, top-1 1" \
		jqe '.kl_divergence == 0 and .top1_agreement == 1' e$2.json
done

convert A qa --bits 2 --work wa --rows 8 --cols 32 -j 2 -q >/dev/null 2>&1
convert F qf --bits 2 --work wf --rows 8 --cols 32 -j 2 -q >/dev/null 2>&1
check "convert from the fused checkpoint: the same model.safetensors, byte for byte" cmp qa/model.safetensors qf/model.safetensors
check "... and the same config.json" cmp qa/config.json qf/config.json
check "... the per-expert keys ExLlamaV3 loads (24 expert trellises), no fused tensor" \
	test "$(tensor-ls qf | jq -r .name | grep -c 'experts\.[0-9]*\.\(gate\|up\|down\)_proj\.trellis$'):$(tensor-ls qf | jq -r .name | grep -c 'gate_up_proj\|experts\.down_proj')" = 24:0
validate qf --model F "${ev[@]}" -q >v.json
check "validate against the fused source: ok, every linear decoded" jqe '.ok and .check.tensors == 33' v.json

# bad shapes: exit 1 naming the tensor, nothing written
mkdir bad && cp F/config.json F/tokenizer*.json bad/
{
	tensor-ls F | jq -r .name | grep -v '^model\.layers\.1\.mlp\.experts\.down_proj' | xargs tensor-cat -q F
	for e in 0 1 2; do tensor-cat -q A model.layers.1.mlp.experts.$e.down_proj.weight; done |
		tensor-cat -q --fuse model.layers.1.mlp.experts.down_proj:3 -
} | tensor-cat -q -o bad/model.safetensors -
msg="tensor 'model.layers.1.mlp.experts.down_proj': shape 3x64x48, config says 4x64x48"
check_fail "tensor-ls --modules: 3 experts fused, config 4: named" 1 "$msg" tensor-ls --modules bad
check_fail "convert: named" 1 "$msg" convert bad bad.out --bits 2 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad.out
check_fail "model-eval: named" 1 "$msg" model-eval -q --model bad --text eval.txt --rows 1 --cols 16
mkdir bad2 && cp F/config.json F/tokenizer*.json bad2/
tensor-ls F | jq -r .name | grep -v '^model\.layers\.0\.mlp\.experts\.gate_up_proj' | xargs tensor-cat -q F -o bad2/model.safetensors
check_fail "one layer fused, the other's gate_up_proj missing: named" 1 \
	"missing tensor 'model.layers.0.mlp.experts.gate_up_proj'" tensor-ls --modules bad2
check_fail "tensor-cat --fuse: rows not in E equal parts" 1 "97 rows are not 2 equal parts" \
	sh -c "tensor-gen -s 1 x=97x4 | tensor-cat -q --fuse y:2 -"
done_testing
