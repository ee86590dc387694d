#!/usr/bin/env bash
# tests/bench/convert.sh: end-to-end conversion (pipelines/convert, 4 bpw,
# 32 calibration rows of 256 tokens), onepass with -j 1 and -j 2 and
# sequential with -j 2 (BENCH_MODES="onepass sequential"): wall time, CPU
# time (user + sys of every process), peak RSS of the largest process,
# quantized weights per second, and the speed-up of -j 2 over -j 1. Models: stories260K (../shared, when present) and a
# synthetic Llama made by examples/make-tiny-llama, by default hidden 1024,
# intermediate 2816, 4 layers (override with BENCH_HIDDEN, BENCH_INTER,
# BENCH_LAYERS; BENCH_BITS for the rate). -j 1 runs one program at a time
# with all cores (OpenMP), -j N gives each of N programs nproc/N threads.
# Peak memory target: the largest process's peak RSS at most
# 2 x (the largest weight in F32 + its Hessian in F64) + the calibration's
# hidden states (rows x cols x hidden, F32) + 64 MiB (program, libraries,
# buffers), so that memory follows the largest tensor, not the model.
# Prints a table and one JSON line; exits 1 when a run misses the memory
# target.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export PATH="$root/bin:$root/pipelines:$PATH" LC_ALL=C
H=${BENCH_HIDDEN:-1024} I=${BENCH_INTER:-2816} L=${BENCH_LAYERS:-4} B=${BENCH_BITS:-4}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/x3bench.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
shared=${X3_SHARED:-$root/../shared}
models=()
[ -f "$shared/models/stories260K/model.safetensors" ] && models+=("stories260K=$shared/models/stories260K")
"$root/examples/make-tiny-llama" "$tmp/synth" "$L" "$H" "$I" >/dev/null
models+=("synth-h${H}-i${I}-l${L}=$tmp/synth")

# quantized weights: every decoder linear and the head
numel() {
	tensor-ls "$1" | jq -s --argjson tied "$(jq '.tie_word_embeddings == true' "$1/config.json")" '
		(map(select(.name | test("_proj\\.weight$|^lm_head\\.weight$")) | .shape[0] * .shape[1]) | add)
		+ (if $tied then (map(select(.name == "model.embed_tokens.weight")) | .[0].shape[0] * .[0].shape[1]) else 0 end)'
}
# the memory bound above, in KiB: R rows x C cols of calibration
bound_kib() {   # model-dir rows cols
	tensor-ls --linears "$1" | jq -s --argjson r "$2" --argjson c "$3" --argjson hid \
		"$(tensor-ls --config "$1" | jq .hidden)" '
		(map(.shape[0] * .shape[1] * 4 + .shape[1] * .shape[1] * 8) | max) as $big |
		(2 * $big + $r * $c * $hid * 4) / 1024 + 65536 | floor'
}
missed=0
runs=()
for m in ${BENCH_MODES:-onepass sequential}; do
	case $m in onepass) runs+=(onepass:1 onepass:2) ;; sequential) runs+=(sequential:2) ;;
	*) echo "convert.sh: BENCH_MODES: '$m' is not onepass or sequential" >&2; exit 2 ;; esac
done
printf '%-24s %10s %-10s %4s %9s %8s %12s %10s %9s %8s\n' model weights mode -j wall_s cpu_s weights/s peak_MiB bound_MiB speedup
json="{\"bench\":\"convert\",\"bits\":$B,\"results\":["
first=1
for m in "${models[@]}"; do
	name=${m%%=*} dir=${m#*=}
	n=$(numel "$dir")
	bound=$(bound_kib "$dir" 32 256)
	t1=
	for r in "${runs[@]}"; do
		mode=${r%:*} j=${r#*:}
		rm -rf "$tmp/out" "$tmp/out.work"
		/usr/bin/time -f '%e %M %U %S' -o "$tmp/time" \
			convert "$dir" "$tmp/out" --bits "$B" --rows 32 --cols 256 --mode "$mode" -j "$j" -q
		read -r wall kb us ss <"$tmp/time"
		cpu=$(awk -v u="$us" -v s="$ss" 'BEGIN { printf "%.1f", u + s }')
		wps=$(awk -v n="$n" -v t="$wall" 'BEGIN { printf "%.0f", (t > 0 ? n / t : 0) }')
		sp=null   # the -j 2 speed-up is onepass's
		if [ "$mode" = onepass ]; then
			sp=1.00
			[ "$j" -eq 1 ] && t1=$wall || sp=$(awk -v a="$t1" -v b="$wall" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
		fi
		printf '%-24s %10d %-10s %4d %9.1f %8.1f %12d %10.1f %9.1f %8s\n' "$name" "$n" "$mode" "$j" "$wall" "$cpu" "$wps" "$(awk -v k="$kb" 'BEGIN { print k / 1024 }')" "$(awk -v k="$bound" 'BEGIN { print k / 1024 }')" "${sp/null/-}"
		[ "$kb" -le "$bound" ] || missed=1
		[ $first -eq 1 ] || json+=","
		first=0
		json+="{\"model\":\"$name\",\"weights\":$n,\"mode\":\"$mode\",\"jobs\":$j,\"wall_s\":$wall,\"cpu_s\":$cpu,\"weights_per_s\":$wps,\"peak_rss_kib\":$kb,\"bound_kib\":$bound,\"speedup\":$sp}"
	done
done
echo "target: peak RSS of the largest process <= 2 x (largest weight F32 + its Hessian F64) + calibration hidden states + 64 MiB"
echo "$json]}"
exit $missed
