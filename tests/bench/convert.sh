#!/usr/bin/env bash
# tests/bench/convert.sh: end-to-end conversion (pipelines/convert, 4 bpw,
# onepass, 32 calibration rows of 256 tokens) with -j 1 and -j 2: wall time,
# peak RSS of the largest process, quantized weights per second, and the
# speed-up of -j 2. Models: stories260K (../shared, when present) and a
# synthetic Llama made by examples/make-tiny-llama, by default hidden 1024,
# intermediate 2816, 4 layers (override with BENCH_HIDDEN, BENCH_INTER,
# BENCH_LAYERS; BENCH_BITS for the rate). -j 1 runs one program at a time
# with all cores (OpenMP), -j N gives each of N programs nproc/N threads.
# Prints a table and one JSON line.
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
printf '%-24s %10s %4s %9s %12s %10s %8s\n' model weights -j wall_s weights/s peak_MiB speedup
json="{\"bench\":\"convert\",\"bits\":$B,\"results\":["
first=1
for m in "${models[@]}"; do
	name=${m%%=*} dir=${m#*=}
	n=$(numel "$dir")
	t1=
	for j in 1 2; do
		rm -rf "$tmp/out" "$tmp/out.work"
		/usr/bin/time -f '%e %M' -o "$tmp/time" \
			convert "$dir" "$tmp/out" --bits "$B" --rows 32 --cols 256 -j "$j" -q
		read -r wall kb <"$tmp/time"
		wps=$(awk -v n="$n" -v t="$wall" 'BEGIN { printf "%.0f", (t > 0 ? n / t : 0) }')
		sp=1.00
		[ "$j" -eq 1 ] && t1=$wall || sp=$(awk -v a="$t1" -v b="$wall" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
		printf '%-24s %10d %4d %9.1f %12d %10.1f %8s\n' "$name" "$n" "$j" "$wall" "$wps" "$(awk -v k="$kb" 'BEGIN { print k / 1024 }')" "$sp"
		[ $first -eq 1 ] || json+=","
		first=0
		json+="{\"model\":\"$name\",\"weights\":$n,\"jobs\":$j,\"wall_s\":$wall,\"weights_per_s\":$wps,\"peak_rss_kib\":$kb,\"speedup\":$sp}"
	done
done
echo "$json]}"
