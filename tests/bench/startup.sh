#!/usr/bin/env bash
# Start-up: the wall time and peak RSS of `tensor-ls -h` and of `tensor-cat`
# on a 1-element tensor, against `cat` of the same bytes in the same run.
# Target: at most 10 ms above cat (programs link no CUDA library; the GPU
# backend is loaded only for --device cuda|auto, lib/common/device.h). For
# information, the same for `had-rotate --device auto` on empty input,
# (it exits 1: no weight frame), which loads the backend object where the
# build has one (the CUDA
# libraries' start-up, paid only by programs asked for the device).
# Each command runs X3_BENCH_STARTUP_N times (default 20) per round, the
# commands interleaved, 5 rounds; the best round's mean is reported.
set -euo pipefail
N=${X3_BENCH_STARTUP_N:-20}
T=$(mktemp -d "${TMPDIR:-/tmp}/x3bench.XXXXXX")
trap 'rm -rf "$T"' EXIT
tensor-gen -t F32 x=1 > "$T/one.frames"
F=$T/one.frames
cmds=("cat '$F'" "tensor-ls -h" "tensor-cat '$F'" "had-rotate -q --device auto < /dev/null")
names=("cat FILE (baseline)" "tensor-ls -h" "tensor-cat FILE (1 element)" "had-rotate --device auto (info)")
declare -a best
for i in "${!cmds[@]}"; do best[$i]=999999; done
for round in 1 2 3 4 5; do
	for i in "${!cmds[@]}"; do
		s=$(date +%s%N)
		for ((r = 0; r < N; r++)); do eval "${cmds[$i]}" > /dev/null 2>&1 || true; done
		e=$(date +%s%N)
		ms=$(echo "($e - $s) / $N / 1000000" | bc -l)
		best[$i]=$(echo "$ms ${best[$i]}" | awk '{print ($1 < $2) ? $1 : $2}')
	done
done
backend=no
[ -f "$(dirname "$(command -v tensor-ls)")/../lib/libexl3kit-cuda.so" ] && backend=yes
printf '%-40s %10s %10s %12s\n' "start-up (CUDA backend built: $backend)" "ms" "over cat" "peak RSS"
missed=0
for i in "${!cmds[@]}"; do
	eval "/usr/bin/time -f %M -o '$T/rss' ${cmds[$i]}" > /dev/null 2>&1 || true
	rss=$(tail -1 "$T/rss")
	over=$(echo "${best[$i]} - ${best[0]}" | bc -l)
	printf '%-40s %10.1f %10.1f %8d KiB\n' "${names[$i]}" "${best[$i]}" "$over" "$rss"
	printf '{"bench":"startup","what":"%s","ms":%.2f,"over_cat_ms":%.2f,"rss_kib":%d,"backend_built":"%s"}\n' \
		"${names[$i]}" "${best[$i]}" "$over" "$rss" "$backend"
	case $i in 1|2) awk -v o="$over" 'BEGIN { exit !(o > 10) }' && missed=1 ;; esac
done
echo "target: tensor-ls -h and tensor-cat at most 10 ms above cat"
exit $missed
