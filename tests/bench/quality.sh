#!/usr/bin/env bash
# tests/bench/quality.sh: quality with noise bars. Converts stories260K
# (../shared; else the generated tiny Llama) at each rate of BENCH_RATES
# (default 2.5 3 3.5 4 5) with each random-sign seed of BENCH_SEEDS (default
# 0 1 2), and evaluates every pack against the original on held-out text:
# KL, top-1 agreement and perplexity as mean ± sample standard deviation over
# the seeds, and the achieved bits. Baselines in the same run: round-to-
# nearest at floor(rate) bits (no seeds: deterministic) and "every tensor at
# floor(rate)" (convert --bits floor(rate), the same seeds). Beside the
# defaults, the same conversion with --sensitivity measure (bitalloc weighs
# each linear by its measured KL per unit of proxy error, over its default
# widths floor-1..ceil+1; BENCH_SENS=0 leaves it out), with the cost of its
# measurement. BENCH_SIGN=1 adds the sign search (convert --sign-draws
# BENCH_SIGN_DRAWS --sign-metric BENCH_SIGN_METRIC, default kl with 3 draws,
# 8 with proxy or output; own work directory per seed, ws$s), alone and with
# --sensitivity measure; BENCH_PASSES=N adds
# the refinement passes after LDLQ (convert --ldlq-passes N; work directory
# wp$s per seed), alone and with --sensitivity measure; BENCH_BEST=1 all
# three together (--sign-draws 3 --sign-metric kl --sensitivity measure
# --ldlq-passes 1; wb$s), the best quality the toolkit has. A change to the
# quantizer or the allocation is better only where its mean beats the
# current defaults' by more than the spread. One work directory per seed, so
# each tensor is encoded once per (seed, K) for all rates. Prints a table
# and one JSON line per (method, rate). No target (exit 0 unless a step
# fails): quality claims are read off the table.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export ROOT=$root PATH="$root/bin:$root/pipelines:$PATH" LC_ALL=C
# the sign search's metric and draws (BENCH_SIGN=1)
smetric=${BENCH_SIGN_METRIC:-kl}
sdraws=${BENCH_SIGN_DRAWS:-$( [ "$smetric" = kl ] && echo 3 || echo 8 )}
# BENCH_KEEP=1: keep the work directory; BENCH_DIR=DIR: work in DIR and keep
# it (a rerun reuses its encodes)
if [ -n "${BENCH_DIR:-}" ]; then TMP=$(cd "$BENCH_DIR" && pwd)
else TMP=$(mktemp -d "${TMPDIR:-/tmp}/x3quality.XXXXXX"); trap '[ -n "${BENCH_KEEP:-}" ] || rm -rf "$TMP"' EXIT; fi
. "$root/tests/lib-convert.sh"
cd "$TMP"
shared=${X3_SHARED:-$root/../shared}
rates=${BENCH_RATES:-2.5 3 3.5 4 5} seeds=${BENCH_SEEDS:-0 1 2}
if [ -f "$shared/models/stories260K/model.safetensors" ]; then
	M=$shared/models/stories260K name=stories260K
	cal=(--rows 24 --cols 256)
	zstd -dcq "$shared/data/sotu.txt.zst" |
		awk '/^Mr\. Speaker, Mr\. Vice President, Members of Congress: It.s a great privilege/ { go = 1 } go' >eval.txt
	ev=(--text eval.txt --rows 16 --cols 256)
else
	tiny_model m 2
	M=m name=tiny-llama
	cal=(--rows 16 --cols 128)
	for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog."; done >eval.txt
	ev=(--text eval.txt --rows 8 --cols 128)
fi
build_rtn

# stats FILE...: mean and sample sd of KL, top-1, ppl and bits over the
# validate reports (or model-eval objects)
stats() {
	jq -s '(map(.eval // .)) as $e | (map(.bits // null)) as $b |
		def ms(f): ([$e[] | f]) as $v | ($v | add / length) as $m |
			{mean: $m, sd: (if ($v | length) > 1 then ([$v[] | (. - $m) * (. - $m)] | add / (length - 1) | sqrt) else 0 end)};
		{n: length, kl: ms(.kl_divergence), top1: ms(.top1_agreement),
		 ppl: ms(.perplexity_quantized), bits: (if $b[0] == null then null else ($b | add / length) end)}' "$@"
}
printf '%-12s %5s %-22s %6s %-20s %-18s %-16s\n' model rate method bits "KL mean±sd" "top-1 mean±sd" "ppl mean±sd"
row() { # row RATE METHOD STATS_JSON
	jq -r --arg r "$1" --arg m "$2" --arg n "$name" '
		def f(x; d): (x * d | round) / d | tostring;
		"\($n | .[0:12] | . + " " * (12 - length)) \($r | . + " " * (5 - length)) \($m | . + " " * (22 - length)) \(if .bits then f(.bits; 1000) else "-" end | . + " " * (6 - length)) \(f(.kl.mean; 1e5) + "±" + f(.kl.sd; 1e5) | . + " " * (20 - length)) \(f(.top1.mean; 1e4) + "±" + f(.top1.sd; 1e4) | . + " " * (18 - length)) \(f(.ppl.mean; 100) + "±" + f(.ppl.sd; 100))"' "$3"
	jq -c --arg r "$1" --arg m "$2" --arg n "$name" '{bench: "quality", model: $n, rate: ($r | tonumber), method: $m} + .' "$3"
}
# ce PREFIX WORK [OPTION...]: convert at rate $b with seed $s into
# PREFIX$b.s$s (work directory WORK) and validate it into v${PREFIX#q}$b.s$s.json
ce() {
	local p=$1 w=$2
	shift 2
	convert "$M" "$p$b.s$s" --bits "$b" --seed "$s" --work "$w" "${cal[@]}" -j 2 -q "$@"
	validate "$p$b.s$s" --model "$M" "${ev[@]}" -q >"v${p#q}$b.s$s.json"
}
for b in $rates; do
	fl=$(awk -v b="$b" 'BEGIN { print int(b) }')
	reps=() freps=() sreps=() greps=() gsreps=() preps=() psreps=() breps=()
	for s in $seeds; do
		ce q w$s
		reps+=(v$b.s$s.json)
		if [ "${BENCH_SENS:-1}" = 1 ]; then
			ce qs w$s --sensitivity measure
			sreps+=(vs$b.s$s.json)
			head -n 1 w$s/sens/measured.k$fl.jsonl | jq -c --arg r "$b" --arg s "$s" '.sensitivity | {bench: "quality-sensitivity-cost", rate: ($r | tonumber), seed: ($s | tonumber), K, forwards, rows, cols, seconds, kl_all, kl_sum}'
		fi
		if [ "${BENCH_SIGN:-0}" = 1 ]; then
			sg=(--sign-draws "$sdraws" --sign-metric "$smetric")
			ce qg ws$s "${sg[@]}"
			greps+=(vg$b.s$s.json)
			ce qgs ws$s "${sg[@]}" --sensitivity measure
			gsreps+=(vgs$b.s$s.json)
		fi
		if [ "${BENCH_PASSES:-0}" -gt 0 ]; then
			lp=(--ldlq-passes "$BENCH_PASSES")
			ce qp wp$s "${lp[@]}"
			preps+=(vp$b.s$s.json)
			ce qps wp$s "${lp[@]}" --sensitivity measure
			psreps+=(vps$b.s$s.json)
		fi
		if [ "${BENCH_BEST:-0}" = 1 ]; then
			ce qb wb$s --sign-draws 3 --sign-metric kl --sensitivity measure --ldlq-passes 1
			breps+=(vb$b.s$s.json)
		fi
		if [ "$fl" != "$b" ]; then
			[ -f vf$fl.s$s.json ] || {
				convert "$M" f$fl.s$s --bits "$fl" --seed "$s" --work w$s "${cal[@]}" -j 2 -q
				validate f$fl.s$s --model "$M" "${ev[@]}" -q >vf$fl.s$s.json
			}
			freps+=(vf$fl.s$s.json)
		fi
	done
	stats "${reps[@]}" >st.json && row "$b" "exl3kit (defaults)" st.json
	if [ ${#sreps[@]} -gt 0 ]; then stats "${sreps[@]}" >st.json && row "$b" "--sensitivity measure" st.json; fi
	if [ ${#greps[@]} -gt 0 ]; then stats "${greps[@]}" >st.json && row "$b" "sign draws $sdraws $smetric" st.json; fi
	if [ ${#gsreps[@]} -gt 0 ]; then stats "${gsreps[@]}" >st.json && row "$b" "sign search + sens." st.json; fi
	if [ ${#preps[@]} -gt 0 ]; then stats "${preps[@]}" >st.json && row "$b" "--ldlq-passes $BENCH_PASSES" st.json; fi
	if [ ${#psreps[@]} -gt 0 ]; then stats "${psreps[@]}" >st.json && row "$b" "ldlq passes + sens." st.json; fi
	if [ ${#breps[@]} -gt 0 ]; then stats "${breps[@]}" >st.json && row "$b" "draws kl+sens.+1 pass" st.json; fi
	if [ ${#freps[@]} -gt 0 ]; then stats "${freps[@]}" >st.json && row "$b" "all at floor = $fl" st.json; fi
	[ -f r$fl.json ] || { rtn_model "$M" rtn$fl "$fl" && model-eval -q --model "$M" --quantized rtn$fl "${ev[@]}" >r$fl.json; }
	stats r$fl.json >st.json && row "$b" "RTN at $fl" st.json
done
