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
# the experts' record (WORK/experts/h1.LAYER.jsonl, from the Hessians'
# metadata before they are deleted) against hessian-capture's own --report
# over the same tokens, and convert's summary of the fallback
hessian-capture -q --model M --tokens w/cal/tokens.frames --cols 128 --layers 1-1 --report rep.jsonl >/dev/null
check "the experts' record: one line per expert group (4 x 2), layer 1 only" \
	test "$(ls w/experts)" = h1.1.jsonl -a "$(jq -s 'length' w/experts/h1.1.jsonl)" = 8
check "the record's routed tokens and fallback are hessian-capture --report's" \
	test "$(jq -sc 'map({expert, routed_tokens, fallback}) | unique' w/experts/h1.1.jsonl)" = \
	     "$(jq -sc 'map({expert, routed_tokens, fallback}) | unique' rep.jsonl)"
n=$(jq -s 'map(.routed_tokens) | max + 1' rep.jsonl)
convert M qm --bits 2 --work w --rows 40 --cols 128 -j 2 --min-tokens "$n" 2>err.txt
check "--min-tokens above every expert's count: all 4 fell back, in the record" \
	test "$(jq -s 'map(select(.fallback and .fallback_tokens == '"$n"' - .routed_tokens)) | length' w/experts/h1.1.jsonl)" = 8
check "... and convert's summary says so, naming them" \
	grep -q "experts: 4 (routed capture), 4 routed fewer than $n tokens (--min-tokens) .*layer 1 expert 3" err.txt
check "... the default (hidden size, 64): none fell back" \
	grep -q '"fallback":false' rep.jsonl
check_fail "--min-tokens: a count, else a usage error" 2 "min-tokens" convert M qx --bits 2 --min-tokens -3
done_testing
