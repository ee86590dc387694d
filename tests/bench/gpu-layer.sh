#!/usr/bin/env bash
# tests/bench/gpu-layer.sh: one real-width decoder layer converted with
# --device cuda (every stage on the GPU), where the wall time goes, and
# the layer's rate against the encoder alone on the same device, in the
# same run. tests/gpu/run runs it last; layer.sh is the CPU's (it needs
# strace, which the GPU machines lack; this one reads the work directory
# instead: the capture's stamps, hessian-capture's --timing and
# trellis-encode's timing metadata, summed by convert into WORK/timing.json).
#
# The baseline, measured in the same run: the encoder alone, at K=B, on the
# whole device (cuda: tests/bench/gpu's encoder on 20000 tiles, K 2 and 4
# only; cpu: tests/bench/viterbi per core times the cores); the layer's
# rate without its capture is given as a share of it.
# The layer: an 8B Llama's (hidden 4096, intermediate 14336, 32/8 heads),
# one layer made by examples/make-tiny-llama; 4 bpw; calibration 64 rows x
# 2048 tokens of $X3_SHARED/data/sotu.txt.zst (or BENCH_CAL; without one,
# convert's built-in text and random tokens).
#   BENCH_LAYER_HIDDEN/INTER/HEADS/KV  the layer (defaults above)
#   BENCH_LAYER_ROWS/COLS             calibration (64, 2048)
#   BENCH_BITS                        rate (4)
#   BENCH_LAYER_J                     the runs ("1 1+gpu-ldlq 4"): convert -j N,
#                                     +gpu-ldlq adds --gpu-ldlq; one work
#                                     directory (--keep-hessians), so the
#                                     capture runs once, in the first run,
#                                     and each later run redoes the encodes
#                                     (params/quant or the jobs differ)
#   BENCH_DEVICE                      cuda (default), or cpu to try it here
#                                     (auto: measured as cuda)
#   BENCH_LAYER_TIMEOUT               seconds per conversion (600)
# Prints a table per run and one JSON line per run; exits 1 if a run failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/bench/lib-layer.sh"
dev=${BENCH_DEVICE:-cuda}
cal=${BENCH_CAL:-${X3_SHARED:-$root/../shared}/data/sotu.txt.zst}
calopt=(); [ -r "$cal" ] && calopt=(--cal "$cal")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/x3gl.XXXXXX"); trap '[ -n "${BENCH_KEEP:-}" ] || rm -rf "$tmp"' EXIT
layer_model "$tmp/m"
if [ "$dev" = cpu ]; then
	base=$(awk -v w="$(viterbi_core)" -v c="$(nproc)" 'BEGIN { printf "%.3f", w * c / 1e6 }')
else
	base=$("$root/tests/bench/gpu" -t 20000 -r 20 | grep '^{' | tail -1 | jq -r --arg k "enc_k${B}_mwps" '.[$k] // "null"')
fi
echo "the encoder alone, K=$B, --device $dev: $base M weights/s (the baseline, this run)"
mt() { stat -c %.3Y "$1" 2>/dev/null || echo 0; }
fail=0
w=$tmp/w prev=none
for run in ${BENCH_LAYER_J:-1 1+gpu-ldlq 4}; do
	j=${run%%+*} extra=()
	[[ $run != *+gpu-ldlq ]] || extra=(--gpu-ldlq)
	# a later run with the same options would find its encodes made
	[ "$prev" != "${extra[*]-}" ] || rm -rf "$w/enc" "$w/done"/h1.[0-9]* "$tmp/o"
	t0=$(date +%s.%N)
	if ! timeout "${BENCH_LAYER_TIMEOUT:-600}" convert "$tmp/m" "$tmp/o" --work "$w" --bits "$B" \
		--rows "$R" --cols "$C" -j "$j" --device "$dev" --keep-hessians "${calopt[@]}" ${extra[@]+"${extra[@]}"} \
		>"$tmp/log" 2>&1; then
		echo "gpu-layer: convert -j $j ${extra[*]-} --device $dev failed:"; tail -5 "$tmp/log"; fail=1; break
	fi
	wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
	prev=${extra[*]-}
	rows=$(grep -o '[0-9]* rows of [0-9]* tokens in all' "$tmp/log" | awk '{ print $1 }' || true)
	# the capture of layer 0 (the first run only): from the tokens to its stamp
	cap=$(awk -v a="$(mt "$w/cal/tokens.frames")" -v b="$(mt "$w/done/h1cap.0")" -v f="$t0" \
		'BEGIN { printf "%.1f", (b >= f ? b - a : 0) }')
	echo "layer ${H}/${I} --device $dev -j $j ${extra[*]-}: ${wall} s wall, $weights weights, calibration ${rows:-$R} rows x $C ($( [ ${#calopt[@]} -gt 0 ] && basename "$cal" || echo "built-in text"))"
	printf '  capture (layer 0, to its stamp)   %8.1f s%s\n' "$cap" "$( [ "$cap" != 0.0 ] || echo ' (done by an earlier run)')"
	# hessian-capture --timing, kept in the work directory by convert
	jq -r '.capture | select(.captures > 0) | .timing as $t |
		"  capture by phase (hessian-capture --timing, wall s): start-up \($t.start), tokens \($t.tokens), load \($t.load), linears \($t.linears), sums \($t.sums), other (attention, norms, ...) \($t.other), write \($t.write)"' \
		"$w/timing.json"
	jq -r '.by_tensor[] | "  \(.key | sub("^model\\.layers\\.0\\."; "")) K=\(.K)" as $n |
		"\($n)\(" " * ([1, 34 - ($n | length)] | max))\(.seconds * 10 | round / 10) s quantize (viterbi \(.timing.viterbi * 10 | round / 10), ldlq \(.timing.ldlq * 10 | round / 10), search \(.timing.search * 10 | round / 10), proxy \(.timing.proxy * 10 | round / 10)), input \(.timing.input * 10 | round / 10), start \(.timing.start * 10 | round / 10)"' \
		"$w/timing.json"
	jq -r '.timing as $t | "  sum over \(.encodes) encodes: quantize \(.seconds) s, of it the Viterbi \($t.viterbi) s; waiting for input \($t.input) s; start-up \($t.start) s"' "$w/timing.json"
	rate=$(awk -v n="$weights" -v t="$wall" -v c="$cap" 'BEGIN { printf "%.3f", n / (t - c) / 1e6 }')
	pct=$(awk -v a="$rate" -v b="$base" 'BEGIN { print (b + 0 > 0 ? sprintf("%.1f", 100 * a / b) : "null") }')
	echo "  the layer without its capture: $rate M weights/s (wall), $pct% of the encoder alone (target 70%)"
	jq -c -n --argjson j "$j" --arg dev "$dev" --arg extra "${extra[*]-}" --argjson wall "$wall" --argjson cap "$cap" \
		--argjson n "$weights" --argjson rate "$rate" --argjson base "$base" --argjson pct "$pct" \
		--slurpfile t "$w/timing.json" \
		'{bench: "gpu-layer", device: $dev, jobs: $j, options: $extra, weights: $n, wall_s: $wall, capture_s: $cap,
		  mwps_without_capture: $rate, encoder_alone_mwps: $base, pct_of_encoder: $pct, target_pct: 70,
		  encodes: $t[0].encodes, quantize_s: $t[0].seconds, timing: $t[0].timing,
		  capture_timing: ($t[0].capture.timing // null)}'
done
exit $fail
