#!/usr/bin/env bash
# trellis-encode on an N x N weight with a random SPD Hessian at K=4:
# had-rotate (Hessian finalization, block LDL, regularization) and
# trellis-encode (scale search, LDLQ with the Viterbi encoder, packing),
# wall time and peak RSS of each, as a table and a JSON line.
#   X3_BENCH_N        size (default 2048: about 1-2 minutes on 2 cores;
#                     4096 is the reference size, ~4x longer)
#   X3_BENCH_K        bits per weight (default 4)
#   X3_BENCH_THREADS  trellis-encode -t (default: all cores)
# Target: the peak RSS of trellis-encode above that of a 128x128 run (program,
# libraries, per-thread Viterbi buffers) is <= 8 x (weight + Hessian bytes):
# memory is a small multiple of the tensor and its Hessian, not of the tiles.
# CPU seconds are printed beside wall seconds: on a shared machine the wall
# time depends on the load.
set -euo pipefail
N=${X3_BENCH_N:-2048}
K=${X3_BENCH_K:-4}
THR=${X3_BENCH_THREADS:+-t $X3_BENCH_THREADS}
T=$(mktemp -d "${TMPDIR:-/tmp}/x3bench.XXXXXX")
trap 'rm -rf "$T"' EXIT
TIME=/usr/bin/time
tensor-gen -s 1 --scale 0.02 bench.weight=${N}x${N} > "$T/w.fr"
tensor-gen -s 2 -d spd --meta count=1 bench.hessian=${N}x${N} > "$T/h.fr"
tensor-gen -s 1 --scale 0.02 small.weight=128x128 > "$T/ws.fr"
# timed STEP CMD...: wall seconds, peak RSS (KiB), CPU seconds of CMD
timed() {
	$TIME -f '%e %M %U %S' -o "$T/$1.time" "${@:2}"
	read -r "${1}_s" "${1}_kib" u s < "$T/$1.time"
	eval "${1}_cpu=$(echo "$u + $s" | bc -l)"
}
timed base trellis-encode -K "$K" $THR < "$T/ws.fr" > /dev/null
timed rot had-rotate --hessian "$T/h.fr" < "$T/w.fr" > "$T/r.fr"
timed enc trellis-encode -K "$K" $THR --json < "$T/r.fr" > "$T/q.fr" 2> "$T/q.json"
proxy=$(jq -r .proxy_err "$T/q.json")
g=$(jq -r .g_scale "$T/q.json")
inbytes=$((N * N * 4 * 2))
wps=$(echo "$N * $N / $enc_s" | bc -l)
ratio=$(echo "($enc_kib - $base_kib) * 1024 / $inbytes" | bc -l)
printf '%-28s %10s %10s %12s\n' "${N}x${N}, K=$K, mul1" "wall s" "CPU s" "peak RSS"
printf '%-28s %10.2f %10.2f %8d MiB\n' "had-rotate" "$rot_s" "$rot_cpu" $((rot_kib / 1024))
printf '%-28s %10.2f %10.2f %8d MiB\n' "trellis-encode" "$enc_s" "$enc_cpu" $((enc_kib / 1024))
printf '%-28s %10s %10s %8d MiB\n' "trellis-encode 128x128" "" "" $((base_kib / 1024))
printf '%-28s %10.0f weights/s\n' "encode throughput" "$wps"
printf '%-28s %10.5f (g = %.4f)\n' "proxy error" "$proxy" "$g"
printf '%-28s %10.2f x (weight + Hessian = %d MiB; target <= 8)\n' "encode RSS growth / input" "$ratio" $((inbytes / 1048576))
printf '{"bench":"trellis_encode","n":%d,"K":%d,"had_rotate_s":%.3f,"encode_s":%.3f,"encode_cpu_s":%.3f,"rss_kib_rotate":%d,"rss_kib_encode":%d,"rss_kib_base":%d,"weights_per_s":%.0f,"proxy_err":%.6g,"rss_growth_over_input":%.2f}\n' \
	"$N" "$K" "$rot_s" "$enc_s" "$enc_cpu" "$rot_kib" "$enc_kib" "$base_kib" "$wps" "$proxy" "$ratio"
awk -v r="$ratio" 'BEGIN { exit !(r <= 8) }'
