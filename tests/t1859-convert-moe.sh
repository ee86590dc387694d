#!/usr/bin/env bash
# t1859-convert-moe: a tiny seeded Qwen3-MoE (examples/make-tiny-llama
# --arch qwen3-moe: a dense layer, a layer of 4 experts 48 wide, top 2)
# converted end to end by pipelines/convert at two rates: validate accepts
# each, the KL to the original falls as the bits rise and stays below
# round-to-nearest at the same bits (tests/lib-convert.sh's RTN, the
# routers passed through exactly as in the EXL3 model).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
"$ROOT/examples/make-tiny-llama" --arch qwen3-moe --experts 4 --top-k 2 --moe-inter 48 --dense-layers 0 M 2 64 96 >/dev/null
for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
ev=(--text eval.txt --rows 8 --cols 128)
build_rtn
kl_prev=
for b in 2 4; do
	convert M q$b --bits $b --work w --rows 40 --cols 128 -j 2 -q
	check "convert --bits $b" test -f q$b/config.json
	check "$b bpw: all 4 x 3 expert linears quantized" \
		test "$(tensor-ls q$b | jq -r .name | grep -c 'mlp\.experts\.[0-9]*\..*\.trellis$')" -eq 12
	check "$b bpw: the router stored unquantized (a 4x64 float weight, no trellis)" \
		test "$(tensor-ls q$b | jq -c 'select(.name | startswith("model.layers.1.mlp.gate.")) | [.name, .shape]')" = \
		     '["model.layers.1.mlp.gate.weight",[4,64]]'
	validate q$b --model M "${ev[@]}" -q >v$b.json
	check "$b bpw: validate ok" jqe '.ok' v$b.json
	kl_vs_rtn "$b bpw" M q$b $b v$b.json 'mlp\.gate\.'
done
done_testing
