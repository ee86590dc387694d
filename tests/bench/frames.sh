#!/usr/bin/env bash
# Frame throughput through a pipe: tensor-cat FILE | tensor-cat - > /dev/null
# for one F16 tensor (512 MiB by default; X3_BENCH_FRAME_MB to change),
# against cat FILE | cat > /dev/null of the same bytes in the same run, each
# timed as a whole pipeline, start-up of both processes included. Target:
# >= 50% of cat. Peak RSS of each tensor-cat is reported: frames pass through
# in 1 MiB chunks, so memory stays bounded whatever the tensor size.
set -euo pipefail
MB=${X3_BENCH_FRAME_MB:-512}
T=$(mktemp -d "${TMPDIR:-/tmp}/x3bench.XXXXXX")
trap 'rm -rf "$T"' EXIT
n=$((MB * 1024 * 1024 / 2))
tensor-gen -t F16 -d uniform x=$((n / 4096))x4096 > "$T/x.frames"
TIME=/usr/bin/time
best() {   # best of 3 wall times of a pipeline given as a string
	local b=999999 s e
	for i in 1 2 3; do
		s=$(date +%s.%N); bash -c "$1"; e=$(date +%s.%N)
		b=$(echo "$e - $s" | bc -l | awk -v b=$b '{print ($1 < b) ? $1 : b}')
	done
	echo "$b"
}
bytes=$(stat -c %s "$T/x.frames")
tc=$(best "tensor-cat '$T/x.frames' | tensor-cat - > /dev/null")
cc=$(best "cat '$T/x.frames' | cat > /dev/null")
rss1=$($TIME -f %M tensor-cat "$T/x.frames" 2>&1 >/dev/null | tail -1)
rss2=$( (tensor-cat "$T/x.frames" | $TIME -f %M tensor-cat - >/dev/null) 2>&1 | tail -1)
gb_t=$(echo "$bytes / $tc / 1000000000" | bc -l)
gb_c=$(echo "$bytes / $cc / 1000000000" | bc -l)
pct=$(echo "100 * $gb_t / $gb_c" | bc -l)
printf '%-40s %10s %8s %10s\n' "pipeline ($((bytes / 1048576)) MiB F16 tensor)" "GB/s" "s" "peak RSS"
printf '%-40s %10.2f %8.3f %7d KiB / %d KiB\n' "tensor-cat FILE | tensor-cat -" "$gb_t" "$tc" "$rss1" "$rss2"
printf '%-40s %10.2f %8.3f\n' "cat FILE | cat (baseline)" "$gb_c" "$cc"
printf '%-40s %9.0f%%  (target >= 50%%)\n' "ratio" "$pct"
printf '{"bench":"frames_pipe","bytes":%d,"seconds":%.4f,"cat_seconds":%.4f,"gbps":%.3f,"cat_gbps":%.3f,"pct_of_cat":%.1f,"rss_kib_reader":%d,"rss_kib_writer":%d}\n' \
	"$bytes" "$tc" "$cc" "$gb_t" "$gb_c" "$pct" "$rss2" "$rss1"
awk -v p="$pct" 'BEGIN { exit !(p >= 50) }'
