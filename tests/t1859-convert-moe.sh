#!/usr/bin/env bash
# t1859-convert-moe: tiny seeded mixture-of-experts models of the three
# softmax-routed families (examples/make-tiny-llama, 4 experts, top 2),
# each converted end to end by pipelines/convert at two rates:
#   Qwen3-MoE  (--arch qwen3-moe: a dense layer, a layer of experts 48 wide)
#   Qwen2-MoE  (--arch qwen2-moe: one sparse layer of experts 40 wide, a
#               shared expert 72 wide with its sigmoid shared_expert_gate,
#               norm_topk_prob false, q/k/v biases)
#   Mixtral    (--arch mixtral: one sparse layer, block_sparse_moe experts
#               80 wide)
# No dimension is a multiple of 128. For each: the written directory holds
# exactly the source's keys (every expert, nothing added or lost), every
# expert and shared-expert linear quantized, every router (and Qwen2-MoE's
# shared_expert_gate) stored unquantized with its source shape; validate
# accepts each; the KL to the original falls as the bits rise and stays
# below round-to-nearest at the same bits (tests/lib-convert.sh's RTN, the
# routers passed through exactly as in the EXL3 model).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
mk() { "$ROOT/examples/make-tiny-llama" --experts 4 --top-k 2 "$@" >/dev/null; }
mk --arch qwen3-moe --moe-inter 48 --dense-layers 0 Q3 2 64 96
mk --arch qwen2-moe --moe-inter 40 --shared-inter 72 Q2 1 64 96
mk --arch mixtral MX 1 64 80
for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
ev=(--text eval.txt --rows 8 --cols 128)
build_rtn
# per model: the expert (and shared-expert) linears the conversion must
# quantize, and the regex of its routers (kept as the EXL3 model stores them)
declare -A nexp=([Q3]=12 [Q2]=15 [MX]=12) router=(
	[Q3]='mlp\.gate\.'
	[Q2]='mlp\.(gate|shared_expert_gate)\.'
	[MX]='block_sparse_moe\.gate\.')
strip='s/\.(weight|bias|trellis|suh|svh|su|sv|mcg|mul1)$//'
for m in Q3 Q2 MX; do
	tensor-ls $m | jq -r .name | sed -E 's/\.(weight|bias)$//' | sort -u >$m.keys
	# the routers of the description: [key.weight, shape], as stored unquantized
	tensor-ls --modules $m | jq -c 'select(.role == "router") | [.key + ".weight", .shape]' | sort >$m.routers
	check "$m: routers $(wc -l <$m.routers) (unquantized matrices of the description)" test -s $m.routers
	kl_prev=
	for b in 2 4; do
		q=$m.q$b
		convert $m $q --bits $b --work $m.w$b --rows 40 --cols 128 -j 2 -q
		check "$m: convert --bits $b" test -f $q/config.json
		check "$m $b bpw: exactly the source's keys (every expert, every router)" \
			sh -c "tensor-ls $q | jq -r .name | sed -E '$strip' | sort -u | cmp -s - $m.keys"
		check "$m $b bpw: all ${nexp[$m]} expert and shared-expert linears quantized" \
			test "$(tensor-ls $q | jq -r .name | grep -Ec '\.(experts\.[0-9]+|shared_expert)\.[^.]+\.trellis$')" -eq ${nexp[$m]}
		check "$m $b bpw: every router stored unquantized, its source shape, nothing else under its key" \
			test "$(tensor-ls $q | jq -c --arg re "${router[$m]}" 'select(.name | test($re)) | [.name, .shape]' | sort)" = "$(cat $m.routers)"
		validate $q --model $m "${ev[@]}" -q >$q.v.json
		check "$m $b bpw: validate ok" jqe '.ok' $q.v.json
		kl_vs_rtn "$m $b bpw" $m $q $b $q.v.json "${router[$m]}"
	done
done
check "Qwen2-MoE: the shared_expert_gate is among the kept routers (1x64)" \
	grep -q '^\["model.layers.0.mlp.shared_expert_gate.weight",\[1,64\]\]$' Q2.routers
# the experts' record (WORK/experts/h1.LAYER.jsonl, from the Hessians'
# metadata before they are deleted) against hessian-capture's own --report
# over the same tokens, and convert's summary of the fallback
hessian-capture -q --model Q3 --tokens Q3.w4/cal/tokens.frames --cols 128 --layers 1-1 --report rep.jsonl >/dev/null
check "Q3: the experts' record: one line per expert group (4 x 2), layer 1 only" \
	test "$(ls Q3.w4/experts)" = h1.1.jsonl -a "$(jq -s 'length' Q3.w4/experts/h1.1.jsonl)" = 8
check "Q3: the record's routed tokens and fallback are hessian-capture --report's" \
	test "$(jq -sc 'map({expert, routed_tokens, fallback}) | unique' Q3.w4/experts/h1.1.jsonl)" = \
	     "$(jq -sc 'map({expert, routed_tokens, fallback}) | unique' rep.jsonl)"
n=$(jq -s 'map(.routed_tokens) | max + 1' rep.jsonl)
convert Q3 Q3.qm --bits 2 --work Q3.w4 --rows 40 --cols 128 -j 2 --min-tokens "$n" 2>err.txt
check "--min-tokens above every expert's count: all 4 fell back, in the record" \
	test "$(jq -s 'map(select(.fallback and .fallback_tokens == '"$n"' - .routed_tokens)) | length' Q3.w4/experts/h1.1.jsonl)" = 8
check "... and convert's summary says so, naming them" \
	grep -q "experts: 4 (routed capture), 4 routed fewer than $n tokens (--min-tokens) .*layer 1 expert 3" err.txt
check "... the default (hidden size, 64): none fell back" \
	grep -q '"fallback":false' rep.jsonl
check_fail "--min-tokens: a count, else a usage error" 2 "min-tokens" convert Q3 Q3.qx --bits 2 --min-tokens -3
done_testing
