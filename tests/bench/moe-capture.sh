#!/usr/bin/env bash
# tests/bench/moe-capture.sh: the experts' Hessians captured from the tokens
# routed to each expert (hessian-capture --moe-capture routed, the default),
# the same weighted by the routing weight (weighted), or from every token as
# ExLlamaV3 does (all), compared by the KL of the converted model to the
# original at equal bits. The model is a seeded tiny Qwen3-MoE
# (examples/make-tiny-llama --arch qwen3-moe: BENCH_LAYERS layers,
# default 1, hidden 64, 8 experts 48 wide, top 2) whose routers are redrawn BENCH_ROUTER_SCALE
# (default 4) times sharper than make-tiny-llama's N(0, 1/hidden), so that
# each expert sees a distinct part of the input space (with the default
# router the top 2 of 8 is close to a coin toss and routing matters little).
# Integer rates (BENCH_RATES, default 2 3) put every linear at exactly that
# K (the head at 6), so all methods have the same bits. KL mean ± sample
# standard deviation over the random-sign seeds BENCH_SEEDS (default 0 1 2),
# plus the number of experts that used the fallback. Prints a table and one
# JSON line per (capture, rate). No target: read the table.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export ROOT=$root PATH="$root/bin:$root/pipelines:$PATH" LC_ALL=C
TMP=$(mktemp -d "${TMPDIR:-/tmp}/x3moecap.XXXXXX"); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
rates=${BENCH_RATES:-2 3} seeds=${BENCH_SEEDS:-0 1 2} rs=${BENCH_ROUTER_SCALE:-4}
modes=${BENCH_MODES:-routed weighted all} nl=${BENCH_LAYERS:-1}
"$root/examples/make-tiny-llama" --arch qwen3-moe --experts 8 --top-k 2 --moe-inter 48 base "$nl" 64 96 >/dev/null
# the routers redrawn sharper (seeded; every other tensor as generated)
mkdir M
cp base/config.json base/tokenizer*.json M/
sc=$(awk -v s="$rs" 'BEGIN { printf "%.6g", s / sqrt(64) }')
{
	tensor-cat -q base $(tensor-ls base | jq -r '.name | select(test("mlp\\.gate\\.weight$") | not)')
	for ((l = 0; l < nl; l++)); do tensor-gen -s $((900 + l)) --scale "$sc" "model.layers.$l.mlp.gate.weight=8x64"; done
} | tensor-cat -q -o M/model.safetensors -
cal=(--rows 24 --cols 128)
for i in $(seq 1 40); do echo "Held-out line $i: a committee of $((i * 7)) members debated the budget, then the fox jumped over $i lazy dogs."; done >eval.txt
ev=(--text eval.txt --rows 12 --cols 128)
stats() {
	jq -s '(map(.eval)) as $e | ([$e[].kl_divergence]) as $v | ($v | add / length) as $m |
		{n: length, kl: $m, sd: (if ($v | length) > 1 then ([$v[] | (. - $m) * (. - $m)] | add / (length - 1) | sqrt) else 0 end),
		 bits: (map(.bits) | add / length)}' "$@"
}
printf '%-10s %5s %6s %-22s %s\n' capture rate bits "KL mean±sd" "experts with fallback"
for b in $rates; do
	for m in $modes; do
		reps=()
		for s in $seeds; do
			convert M q.$m.$b.s$s --bits "$b" --seed "$s" --moe-capture "$m" --work w.$m.s$s --keep-hessians "${cal[@]}" -j 2 -q
			validate q.$m.$b.s$s --model M "${ev[@]}" -q >v.$m.$b.s$s.json
			reps+=(v.$m.$b.s$s.json)
		done
		[ "$m$b" != "routed${rates%% *}" ] || echo "tokens per expert (convert's calibration, ${cal[*]}, top 2): $(
			for f in w.routed.s0/h1/*experts.*.input.frames; do tensor-ls "$f"; done |
			jq -s -r 'map(select(.name | test("experts\\.[0-9]+\\.input$")) | .meta) | group_by(.layer)[] |
				"layer \(.[0].layer): " + (sort_by(.expert | tonumber) | map(.routed_tokens) | join(" "))' | paste -sd';')"
		fb=$(for f in w.$m.s0/h1/*experts.*.input.frames; do tensor-ls "$f"; done |
			jq -s '[.[] | select(.name | test("experts\\.[0-9]+\\.input$")) | select(.meta.expert_fallback == "1")] | length')
		stats "${reps[@]}" >st.json
		jq -r --arg m "$m" --arg b "$b" --arg fb "$fb" '
			def f(x; d): (x * d | round) / d | tostring;
			"\($m | . + " " * (10 - length)) \($b | . + " " * (5 - length)) \(f(.bits; 1000) | . + " " * (6 - length)) \(f(.kl; 1e5) + "±" + f(.sd; 1e5) | . + " " * (22 - length)) \($fb)"' st.json
		jq -c --arg m "$m" --arg b "$b" --argjson fb "$fb" --argjson rs "$rs" --arg nl "$nl" \
			'{bench: "moe-capture", model: "tiny-qwen3-moe-\($nl)L-8x48-top2", router_scale: $rs, capture: $m, rate: ($b | tonumber), fallback_experts: $fb} + .' st.json
	done
done
