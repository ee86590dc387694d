#!/usr/bin/env bash
# pipelines/convert against itself and kill -9: a second conversion into
# the same OUT or work directory refuses, naming the holder; kill -9 of
# convert alone ends its make; 20 kills at seeded random moments of a small
# conversion (convert alone, or its whole process group), each followed by
# a re-run, give directories byte-identical to an uninterrupted run; most
# of those kills hit a running conversion, and none leaves a process of
# the killed conversion running once its re-run is done.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
# the smallest conversion that still has every step: one layer, hidden 16
# (every linear pads to 128x128), no head encode (--head-bits 16), two
# calibration rows of 16 tokens, two make jobs: seconds per conversion
tiny_model m 1 16 16
opts=(--bits 2 --head-bits 16 --rows 2 --cols 16 -j 2 -q)
# wait_for SECONDS CMD...: poll until CMD succeeds
wait_for() { local n=$(($1 * 20)); shift; while ! "$@"; do n=$((n - 1)); [ $n -gt 0 ] || return 1; sleep 0.05; done; }
# no process is left that runs a recipe of work directory $1
gone() { ! pgrep -f -- "$1/Makefile" >/dev/null && ! pgrep -f -- "$1/enc/" >/dev/null; }
# stat_of PID: /proc/PID/stat from its third field, the state, on (the
# command name before it may hold spaces); empty when PID is gone
stat_of() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null; }
# procs PID: "PID START" of PID and of every process below it (START, the
# start time, field 22: a PID used again later is not taken for one of them)
procs() {
	ps -eo pid=,ppid= | awk -v root="$1" '{ up[$1] = $2 }
		END { for (p in up) for (q = p; q > 1; q = up[q]) if (q == root) { print p; break } }' |
	while read -r p; do echo "$p $(stat_of "$p" | cut -d' ' -f20)"; done
}
# running: the PIDs of the "PID START" lines on stdin that still run (the
# same start time, not a zombie)
running() {
	local p s t
	while read -r p s; do
		t=$(stat_of "$p")
		[ -n "$s" ] && [ "$(cut -d' ' -f20 <<<"$t")" = "$s" ] && [ "${t:0:1}" != Z ] && echo "$p"
	done
	return 0
}

t0=$(date +%s%N)
check "uninterrupted conversion" convert m ref "${opts[@]}"
tref=$(( ($(date +%s%N) - t0) / 1000000 ))   # ms: the range of the kill moments
check "no lock file left beside OUT" test ! -e ref.lock

# ---- two at once -----------------------------------------------------------
convert m a "${opts[@]}" & pid=$!
wait_for 60 grep -q "^pid $pid " a.work/lock 2>/dev/null
# the holder and what it runs stopped while the others try (a tiny
# conversion could otherwise end before they reach the lock); a stopped
# holder still holds it
held=$(procs "$pid" | cut -d' ' -f1)
kill -STOP $held 2>/dev/null
check_fail "a second convert into the same OUT refuses, naming the holder" 1 \
	"work directory .*/a\.work is in use by another conversion: pid $pid on .*lock file .*/a\.work/lock" \
	convert m a "${opts[@]}"
check_fail "... also with another --work" 1 "/a is in use by another conversion: pid $pid .*a\.lock" \
	convert m a "${opts[@]}" --work other.work
check_fail "... and another OUT into the same --work" 1 "a\.work is in use by another conversion: pid $pid" \
	convert m b "${opts[@]}" --work a.work
kill -CONT $held 2>/dev/null
wait "$pid"; rc=$?
check "the first conversion completes unharmed" test "$rc" -eq 0
check "... byte-identical to the uninterrupted one" diff -r ref a
check "the refused ones wrote nothing" test ! -e b -a ! -e other.work/Makefile

# ---- kill -9 of convert alone ----------------------------------------------
convert m k "${opts[@]}" & pid=$!
wait_for 60 sh -c '[ "$(ls k.work/enc 2>/dev/null | grep -c "\.frames$")" -ge 2 ]'
kill -9 "$pid"; wait "$pid" 2>/dev/null
check "kill -9 of convert alone ends its make and the programs" wait_for 30 gone "$TMP/k.work"
check "an immediate re-run takes over the stale lock and completes" convert m k "${opts[@]}"
check "... byte-identical" diff -r ref k

# ---- 20 kills at seeded random moments ---------------------------------------
# A kill hit a running conversion when convert died of it (status 137, not
# 0: it had not finished). Each kill is followed by a re-run; after it, no
# process of the killed conversion (those running at the kill: convert,
# its watchdog, make and the programs) may be left.
RANDOM=1817
bad=0 hit=0 stray=0 sts=
for i in $(seq 1 20); do
	rm -rf r r.work r.lock
	ms=$((RANDOM * 32768 + RANDOM))
	ms=$((ms % tref))
	if [ $((i % 2)) -eq 1 ]; then
		convert m r "${opts[@]}" & pid=$!; tgt=$pid how="convert alone"
	else
		setsid convert m r "${opts[@]}" & pid=$!; tgt=-$pid how="its process group"
	fi
	sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
	tree=$(procs "$pid")
	kill -9 -- "$tgt" 2>/dev/null
	wait "$pid" 2>/dev/null; st=$?
	[ "$st" -eq 137 ] && hit=$((hit + 1))
	sts+=" $st"
	if ! convert m r "${opts[@]}" 2>r.err || ! diff -r ref r >r.diff; then
		bad=$((bad + 1))
		echo "# kill $i ($how at ${ms} ms of ${tref}): re-run or diff failed:"
		sed 's/^/#   /' r.err r.diff 2>/dev/null | head -8
	fi
	# (the killed conversion's watchdog holds its locks, so the re-run got
	# them only after every process of the killed run that holds them had
	# ended; a process that has closed its files at exit may still take a
	# moment to become a zombie: 2 s for that, on a loaded machine)
	for w in $(seq 1 20); do
		left=$(running <<<"$tree")
		[ -n "$left" ] || ! gone "$TMP/r.work" || break
		sleep 0.1
	done
	if [ -n "$left" ] || ! gone "$TMP/r.work"; then
		stray=$((stray + 1))
		echo "# kill $i ($how at ${ms} ms): still running after the re-run:"
		ps -o pid=,args= -p "$(echo $left | tr ' ' ,)" 2>/dev/null | sed 's/^/#   /'
		pgrep -af -- "$TMP/r.work/" | sed 's/^/#   /'
	fi
done
echo "# exit statuses of the killed conversions:$sts"
check "20 kill -9 at random moments, each re-run: byte-identical to the uninterrupted run" test "$bad" -eq 0
check "most kills hit a running conversion ($hit of 20 died of the kill)" test "$hit" -gt 10
check "after each re-run no process of the killed conversion is left running ($stray times some were)" \
	test "$stray" -eq 0
done_testing
