#!/usr/bin/env bash
# t1612-pack-write-atomic: OUT appears whole or not at all: existing OUT,
# --force, kill -9 and SIGTERM mid-write, a full disk (LD_PRELOAD shim).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-pack.sh"
cd "$TMP" || exit 1

gen_model src 2 false 0
gen_quant 2 3 mul1 >q.frames
PW=(pack-write -q --model src --passthrough --head-bits 16)

# --- an existing OUT is refused, or replaced whole with --force ----------
mkdir out && echo old >out/marker
check_fail "existing OUT refused" 1 "out: exists \(use --force" "${PW[@]}" out <q.frames
check "refused: old OUT untouched" test -f out/marker -a ! -e out/config.json
check "--force replaces it" "${PW[@]}" --force out <q.frames
check "replaced whole: new files, old ones gone" test -f out/config.json -a ! -e out/marker
check "--force: nothing left beside" no_leftovers . out

# --- kill -9 while writing: no OUT; the next run cleans up ---------------
wait_tmp() {   # wait until NAME.tmp-*/.pack-spool exists (up to 10 s)
	for _ in $(seq 100); do
		ls "$1".tmp-*/.pack-spool >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	return 1
}
mkfifo fifo
"${PW[@]}" kout <fifo &
pid=$!
exec 3>fifo
head -c 50000 q.frames >&3
if wait_tmp kout; then
	kill -9 $pid
	wait $pid 2>/dev/null
	exec 3>&-
	check "kill -9: no OUT" test ! -e kout
	check "kill -9: the temporary directory is the only trace" test -n "$(ls -d kout.tmp-* 2>/dev/null)"
	pack-write --model src --passthrough --head-bits 16 kout <q.frames 2>err.txt
	check "rerun after kill -9 succeeds" test -f kout/config.json
	check "rerun removed the stale temporary directory" no_leftovers . kout
	check "rerun said so" grep -q "left by an interrupted run" err.txt
else
	exec 3>&-
	kill -9 $pid 2>/dev/null
	notok "pack-write did not start spooling"
fi

# --- SIGTERM while writing: the handler removes the temporary directory ---
"${PW[@]}" tout <fifo &
pid=$!
exec 3>fifo
head -c 50000 q.frames >&3
if wait_tmp tout; then
	kill -TERM $pid
	rc=0
	wait $pid 2>/dev/null || rc=$?
	exec 3>&-
	check "SIGTERM: killed by the signal (exit $rc)" test "$rc" -eq 143
	check "SIGTERM: no OUT and no temporary directory" test ! -e tout
	check "SIGTERM: nothing left beside" no_leftovers . tout
else
	exec 3>&-
	kill -9 $pid 2>/dev/null
	notok "pack-write did not start spooling"
fi

# --- full disk at every stage: exit 1, clear message, nothing left --------
if ! command -v cc >/dev/null; then
	skip "ENOSPC shim (no cc)"
	done_testing
fi
cc -shared -fPIC -o enospc.so "$ROOT/tests/shim/enospc.c" -ldl
# bytes a successful run writes: the stream's spool + the directory (the
# shards are written straight from the spool and SRC, each byte once)
spool=$(tensor-ls q.frames | jq -s 'map(.bytes) | add')
dir=$(cat out/* | wc -c)
total=$((spool + dir))
fails=0 msgs=0 left=0
for k in 0 1 2 3 4 5 6 7; do
	b=$((total * k / 8))
	rc=0
	ENOSPC_AFTER=$b LD_PRELOAD=$PWD/enospc.so "${PW[@]}" full <q.frames 2>err.txt || rc=$?
	[ "$rc" -eq 1 ] || { fails=$((fails + 1)); echo "# budget $b: exit $rc"; }
	grep -q "No space left on device" err.txt || { msgs=$((msgs + 1)); echo "# budget $b: $(head -1 err.txt)"; }
	{ [ -e full ] || ! no_leftovers . full; } && left=$((left + 1))
	rm -rf full full.tmp-*
done
check "full disk at 8 points of the run: exit 1 every time" test "$fails" -eq 0
check "full disk: 'No space left on device' every time" test "$msgs" -eq 0
check "full disk: no OUT and no temporary directory left" test "$left" -eq 0
check "with enough space the shim lets it through" \
	env ENOSPC_AFTER=$((total + 100000)) LD_PRELOAD="$PWD/enospc.so" "${PW[@]}" full <q.frames
check "... and writes the same directory" cmp -s out/model.safetensors full/model.safetensors
# --force under a full disk keeps the old OUT
rc=0
ENOSPC_AFTER=$((total / 2)) LD_PRELOAD=$PWD/enospc.so "${PW[@]}" --force out <q.frames 2>/dev/null || rc=$?
check "--force on a full disk fails and keeps the old OUT intact" \
	test "$rc" -eq 1 -a -f out/config.json -a -f out/model.safetensors
check "... with nothing left beside" no_leftovers . out

done_testing
