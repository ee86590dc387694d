#!/usr/bin/env bash
# convert --effort fast|default|best on stories260K (the generated tiny
# Llama without ../shared): the KL of each to the original on held-out
# text (pipelines/validate, mean ± sample sd over the seeds) and the wall
# and CPU seconds of each conversion (bash's time: convert and everything
# it ran), as exl3-convert(1) and exl3-quantize(7) report them.
# BENCH_RATE (default 3.5: a fractional rate, where --effort fast's sampled
# measurement differs from the default's), BENCH_SEEDS (0 1 2),
# BENCH_EFFORTS (default fast best), BENCH_JOBS (-j, default 2).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export PATH="$root/bin:$root/pipelines:$PATH" LC_ALL=C
TMP=$(mktemp -d "${TMPDIR:-/tmp}/x3effort.XXXXXX")
[ -n "${BENCH_KEEP:-}" ] || trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
shared=${X3_SHARED:-$root/../shared}
rate=${BENCH_RATE:-3.5} seeds=${BENCH_SEEDS:-0 1 2} efforts=${BENCH_EFFORTS:-default fast best} jobs=${BENCH_JOBS:-2}
if [ -f "$shared/models/stories260K/model.safetensors" ]; then
	M=$shared/models/stories260K name=stories260K
	cal=(--rows 24 --cols 256)
	zstd -dcq "$shared/data/sotu.txt.zst" |
		awk '/^Mr\. Speaker, Mr\. Vice President, Members of Congress: It.s a great privilege/ { go = 1 } go' >eval.txt
	ev=(--text eval.txt --rows 16 --cols 256)
else
	"$root/examples/make-tiny-llama" m 2 >/dev/null
	M=m name=tiny-llama
	cal=(--rows 16 --cols 128)
	for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog."; done >eval.txt
	ev=(--text eval.txt --rows 8 --cols 128)
fi
TIMEFORMAT='%R %U %S'
for e in $efforts; do
	for s in $seeds; do
		t=$( { time convert "$M" q.$e.s$s --bits "$rate" --effort "$e" --seed "$s" "${cal[@]}" -j "$jobs" -q >/dev/null; } 2>&1 | tail -n 1)
		validate q.$e.s$s --model "$M" "${ev[@]}" -q >v.$e.s$s.json
		read -r wall usr sys <<<"$t"
		jq -c --arg e "$e" --argjson s "$s" --argjson w "$wall" --argjson u "$usr" --argjson y "$sys" --arg n "$name" --argjson r "$rate" \
			'{bench: "effort", model: $n, rate: $r, effort: $e, seed: $s, bits: .bits, kl: .eval.kl_divergence, wall_s: $w, cpu_s: ($u + $y)}' v.$e.s$s.json | tee -a runs.jsonl
		rm -rf q.$e.s$s q.$e.s$s.work
	done
done
jq -s 'group_by(.effort)[] | def ms(f): (map(f)) as $v | ($v | add / length) as $m |
	{mean: $m, sd: (if ($v | length) > 1 then ([$v[] | (. - $m) * (. - $m)] | add / (length - 1) | sqrt) else 0 end)};
	{bench: "effort-summary", model: .[0].model, rate: .[0].rate, effort: .[0].effort, n: length,
	 kl: ms(.kl), wall_s: ms(.wall_s), cpu_s: ms(.cpu_s), bits: ms(.bits)}' -c runs.jsonl
