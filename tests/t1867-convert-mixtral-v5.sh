#!/usr/bin/env bash
# t1867-convert-mixtral-v5: Mixtral in Transformers v5's layout, where
# block_sparse_moe is mlp and the experts are fused: the router
# mlp.gate.weight (experts, hidden), mlp.experts.gate_up_proj (experts,
# 2 * inter, hidden: each expert's w1 rows, then its w3 rows) and
# mlp.experts.down_proj (experts, hidden, inter: w2). examples/make-tiny-llama
# --arch mixtral --fused-experts writes it from the same seeded weights as
# the per-expert checkpoint. model-eval of the two gives KL 0; convert writes
# byte-identical directories from both, under the block_sparse_moe keys
# ExLlamaV3 loads, no mlp.gate and no fused tensor; pack-write takes the
# router by either name. A v5 checkpoint without mlp.gate.weight, with its
# router under the per-expert name or under both, or with a gate_up_proj of
# the wrong shape exits 1 naming the tensor, nothing written.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model --arch mixtral A 2 64 96
tiny_model --arch mixtral --fused-experts F 2 64 96

check "v5 checkpoint: the router mlp.gate and two 3-D tensors per layer, no block_sparse_moe key" \
	test "$(tensor-ls F | jq -c 'select(.name | test("layers.0.mlp|block_sparse")) | [.name, .shape]' | tr -d '\n')" = \
	'["model.layers.0.mlp.gate.weight",[4,64]]["model.layers.0.mlp.experts.gate_up_proj",[4,192,64]]["model.layers.0.mlp.experts.down_proj",[4,64,96]]'
check "the router: key block_sparse_moe.gate, read from mlp.gate.weight" \
	test "$(tensor-ls --modules F | jq -c 'select(.key == "model.layers.1.block_sparse_moe.gate") | [.weight, .kind, .shape]')" = \
	'["model.layers.1.mlp.gate.weight","matrix",[4,64]]'
check "expert 1: w1 rows 192..288, w3 288..384 of gate_up_proj, w2 64..128 of down_proj" \
	test "$(tensor-ls --linears F | jq -c 'select(.key | test("layers.1.block_sparse_moe.experts.1\\.")) | [.key, .weight, .rows]' | tr -d '\n')" = \
	'["model.layers.1.block_sparse_moe.experts.1.w1","model.layers.1.mlp.experts.gate_up_proj",[192,288]]["model.layers.1.block_sparse_moe.experts.1.w3","model.layers.1.mlp.experts.gate_up_proj",[288,384]]["model.layers.1.block_sparse_moe.experts.1.w2","model.layers.1.mlp.experts.down_proj",[64,128]]'
check "the same modules, keys, groups and shapes as the per-expert checkpoint" \
	test "$(tensor-ls --modules F | jq -c '[.key, .kind, .group, .shape]')" = \
	     "$(tensor-ls --modules A | jq -c '[.key, .kind, .group, .shape]')"
stats() { tensor-ls --stats | jq -c '[.shape, .stats]'; }
check "rows 288..384 of the fused gate_up_proj: expert 1's w3, the same weights" \
	test "$(tensor-cat -q --rows 288:384 F model.layers.1.mlp.experts.gate_up_proj | stats)" = \
	     "$(tensor-cat -q A model.layers.1.block_sparse_moe.experts.1.w3.weight | stats)"
check "... and mlp.gate.weight is block_sparse_moe.gate.weight" \
	test "$(tensor-cat -q F model.layers.0.mlp.gate.weight | stats)" = \
	     "$(tensor-cat -q A model.layers.0.block_sparse_moe.gate.weight | stats)"

for i in $(seq 1 20); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog."; done >eval.txt
ev=(--text eval.txt --rows 4 --cols 32)
model-eval -q --model A --quantized F "${ev[@]}" >e.json
check "model-eval: the v5 checkpoint gives the per-expert one's logits: KL 0, top-1 1" \
	jqe '.kl_divergence == 0 and .top1_agreement == 1' e.json

convert A qa --bits 2 --work wa --rows 8 --cols 32 -j 2 -q >/dev/null 2>&1
convert F qf --bits 2 --work wf --rows 8 --cols 32 -j 2 -q >/dev/null 2>&1
check "convert from the v5 checkpoint: the same model.safetensors, byte for byte" cmp qa/model.safetensors qf/model.safetensors
check "... and the same config.json" cmp qa/config.json qf/config.json
names=$(tensor-ls qf | jq -r .name)
check "... the block_sparse_moe keys ExLlamaV3 loads: 2 routers, 24 expert trellises" \
	test "$(grep -c 'block_sparse_moe\.gate\.weight$' <<<"$names"):$(grep -c 'block_sparse_moe\.experts\.[0-9]*\.w[123]\.trellis$' <<<"$names")" = 2:24
check "... no mlp.gate, no fused tensor" \
	test "$(grep -c '\.mlp\.\|gate_up_proj\|experts\.down_proj' <<<"$names")" = 0
# sequential: layer l's Hessians through the quantized layers before it,
# whose files hold the router under the source's name (the overlay)
convert A sa --mode sequential --bits 2 --work wsa --rows 4 --cols 32 -j 2 -q >/dev/null 2>&1
convert F sf --mode sequential --bits 2 --work wsf --rows 4 --cols 32 -j 2 -q >/dev/null 2>&1
check "--mode sequential: the same model.safetensors from both" cmp sa/model.safetensors sf/model.safetensors
tensor-cat -q qf | pack-write -q --model F r1
check "pack-write --model F of qf's tensors (the router by its output key): qf again" \
	cmp r1/model.safetensors qf/model.safetensors
{ grep -v 'block_sparse_moe\.gate\.weight' <<<"$names" | xargs tensor-cat -q qf; tensor-cat -q F 'model.layers.*.mlp.gate.weight'; } |
	pack-write -q --model F r2
check "... the routers given by their v5 name mlp.gate: written as block_sparse_moe.gate, qf again" \
	cmp r2/model.safetensors qf/model.safetensors
validate qf --model F "${ev[@]}" -q >v.json
check "validate against the v5 source: ok" jqe '.ok' v.json

# bad checkpoints: exit 1 naming the tensor, nothing written
bad() { mkdir "$1" && cp F/config.json F/tokenizer*.json "$1/" && tensor-cat -q -o "$1/model.safetensors" -; }
without() { tensor-ls "$1" | jq -r .name | grep -v "^$2\$" | xargs tensor-cat -q "$1"; }
without F 'model\.layers\.1\.mlp\.gate\.weight' | bad b1
msg="missing tensor 'model.layers.1.mlp.gate.weight' .the checkpoint holds experts in fused 3-D tensors"
check_fail "no mlp.gate.weight: tensor-ls --modules names it" 1 "$msg" tensor-ls --modules b1
check_fail "... model-eval names it" 1 "$msg" model-eval -q --model b1 --text eval.txt --rows 1 --cols 16
check_fail "... convert names it" 1 "$msg" convert b1 b1.out --bits 2 --rows 4 --cols 32 -q
check "... nothing written" test ! -e b1.out
{ without F 'model\.layers\.1\.mlp\.gate\.weight'; tensor-cat -q A model.layers.1.block_sparse_moe.gate.weight; } | bad b2
check_fail "fused experts, the router under the per-expert name: both named" 1 \
	"missing tensor 'model.layers.1.mlp.gate.weight' .*but has 'model.layers.1.block_sparse_moe.gate.weight'" \
	tensor-ls --modules b2
{
	without F 'model\.layers\.0\.mlp\.experts\.gate_up_proj'
	tensor-cat -q --rows 0:576 F model.layers.0.mlp.experts.gate_up_proj |
		tensor-cat -q --fuse model.layers.0.mlp.experts.gate_up_proj:3 -
} | bad b3
msg="tensor 'model.layers.0.mlp.experts.gate_up_proj': shape 3x192x64, config says 4x192x64"
check_fail "gate_up_proj of 3 experts, config 4: convert names it" 1 "$msg" \
	convert b3 b3.out --bits 2 --rows 4 --cols 32 -q
check "... nothing written" test ! -e b3.out
check_fail "... model-eval names it" 1 "$msg" model-eval -q --model b3 --text eval.txt --rows 1 --cols 16
{ tensor-cat -q F; tensor-cat -q A model.layers.1.block_sparse_moe.gate.weight; } | bad b5
check_fail "the router under both names: named" 1 \
	"tensors 'model.layers.1.mlp.gate.weight' and 'model.layers.1.block_sparse_moe.gate.weight': one module under both names" \
	tensor-ls --modules b5
mkdir b4 && cp A/config.json A/tokenizer*.json b4/
{ without A 'model\.layers\.0\.block_sparse_moe\.gate\.weight'; tensor-cat -q F model.layers.0.mlp.gate.weight; } |
	tensor-cat -q -o b4/model.safetensors -
check_fail "per-expert keys, the router as mlp.gate: both named" 1 \
	"missing tensor 'model.layers.0.block_sparse_moe.gate.weight' .*but has 'model.layers.0.mlp.gate.weight'" \
	tensor-ls --modules b4
done_testing
