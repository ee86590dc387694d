#!/usr/bin/env bash
# tests/bench/convert-procs.sh: the processes a conversion starts, and what
# starting them costs (issue: "no fixed cost per process"). Converts a
# synthetic Llama (examples/make-tiny-llama; BENCH_HIDDEN, BENCH_INTER,
# BENCH_LAYERS as in convert.sh, default 1024/2816/4) at BENCH_BITS (4) with
# -j 2, once under `strace -f -e trace=execve` (seccomp-filtered, so only
# the execs stop) to count every program started, by name, and once
# untraced for its wall and CPU time (user + sys of every process). The
# start-up of each program is measured in the same run: its `-h` (ours) or
# `--version` (the others), fork + exec + dynamic loading + exit, as CPU
# time (user + sys; on a loaded host wall time measures the other loads),
# best of 3 rounds of BENCH_PROCS_N (20) runs: the whole cost of a process
# that does no work. Start-up share = sum(count x start-up CPU) / the
# conversion's CPU time. Target: under 2%.
# Pipe copies are not counted here (tests/bench/frames.sh measures them).
# Prints a table and one JSON line; exits 1 when the share misses the target.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export PATH="$root/bin:$root/pipelines:$PATH" LC_ALL=C
H=${BENCH_HIDDEN:-1024} I=${BENCH_INTER:-2816} L=${BENCH_LAYERS:-4} B=${BENCH_BITS:-4}
N=${BENCH_PROCS_N:-20}
command -v strace >/dev/null || { echo "convert-procs.sh: needs strace (Debian package strace)" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/x3bench.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
"$root/examples/make-tiny-llama" "$tmp/m" "$L" "$H" "$I" >/dev/null
args=(--bits "$B" --rows 32 --cols 256 -j 2 -q)

strace -f -qq --seccomp-bpf -e trace=execve -e signal=none -o "$tmp/trace" \
	convert "$tmp/m" "$tmp/o1" "${args[@]}"
/usr/bin/time -f '%e %U %S' -o "$tmp/time" convert "$tmp/m" "$tmp/o2" "${args[@]}"
read -r wall us ss < <(tail -1 "$tmp/time")
cpu=$(awk -v u="$us" -v s="$ss" 'BEGIN { printf "%.2f", u + s }')
# successful execs only: 'PID execve("/path/prog", [...], ...) = 0', or
# split by another process's event into "execve(...) <unfinished ...>" and
# "PID <... execve resumed>) = 0"
awk '$2 ~ /^execve\(/ { p = $2; sub(/^execve\("/, "", p); sub(/".*/, "", p); n = split(p, a, "/"); pend[$1] = a[n] }
     ($2 ~ /^execve\(/ || /<\.\.\. execve resumed>/) && / = 0$/ { print pend[$1] }' "$tmp/trace" |
	sort | uniq -c | sort -rn >"$tmp/counts"

startup_ms() {   # the best round's mean CPU ms (user + sys) of "$@"
	local best=999999 ms
	for round in 1 2 3; do
		# `times` in the subshell: its children's user and sys, e.g. 0m0.012s
		ms=$( (for ((r = 0; r < N; r++)); do "$@" >/dev/null 2>&1 </dev/null || true; done; times) |
			tail -1 | awk -v n="$N" '{ t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m");
				sub("s", "", a[2]); t += a[1] * 60 + a[2] } printf "%.3f", t * 1000 / n }')
		best=$(awk -v a="$ms" -v b="$best" 'BEGIN { print (a < b) ? a : b }')
	done
	echo "$best"
}
printf '%-22s %8s %14s %10s\n' program count "start-up CPU ms" "total s"
total=0 procs=0 json_p=
while read -r count prog; do
	p=$(command -v "$prog" || true)
	if [ -z "$p" ]; then ms=0
	elif [ "$(dirname "$p")" = "$root/bin" ] || [ "$(dirname "$p")" = "$root/pipelines" ]; then
		ms=$(startup_ms "$p" -h)
	else
		ms=$(startup_ms "$p" --version)
	fi
	t=$(awk -v c="$count" -v m="$ms" 'BEGIN { printf "%.3f", c * m / 1000 }')
	total=$(awk -v a="$total" -v b="$t" 'BEGIN { printf "%.3f", a + b }')
	procs=$((procs + count))
	printf '%-22s %8d %14.2f %10.2f\n' "$prog" "$count" "$ms" "$t"
	json_p+="${json_p:+,}{\"program\":\"$prog\",\"count\":$count,\"startup_ms\":$ms}"
done <"$tmp/counts"
share=$(awk -v t="$total" -v c="$cpu" 'BEGIN { printf "%.2f", (c > 0 ? 100 * t / c : 0) }')
printf '%-22s %8d %14s %10.2f   of %.1f s CPU (%.1f s wall, -j 2): %s%%\n' all "$procs" "" "$total" "$cpu" "$wall" "$share"
echo "target: process start-up under 2% of the conversion's CPU time"
echo "{\"bench\":\"convert-procs\",\"model\":\"synth-h$H-i$I-l$L\",\"bits\":$B,\"wall_s\":$wall,\"cpu_s\":$cpu,\"processes\":$procs,\"startup_cpu_s\":$total,\"startup_pct\":$share,\"target_pct\":2,\"programs\":[$json_p]}"
awk -v s="$share" 'BEGIN { exit !(s < 2) }'
