#!/usr/bin/env bash
# t1705-gpu-kernel-sim: the device code of the CUDA kernels (codebooks,
# per-lane state extraction, the Viterbi kernel's thread schedule) run on
# the CPU thread by thread must reproduce the C references bit for bit.
# Needs g++ and the CUDA headers, no GPU; skips otherwise.
. "$(dirname "$0")/lib.sh"
rc=0
"$ROOT/tests/gpu/sim" 1 >"$TMP/sim.out" 2>&1 || rc=$?
if [ "$rc" -eq 77 ]; then
	skip "no g++ or no CUDA headers"
	done_testing
fi
# the simulator's own TAP lines, renumbered into this test
while IFS= read -r line; do
	case $line in
	"ok "*) ok "${line#ok * - }" ;;
	"not ok "*) notok "${line#not ok * - }" ;;
	"#"*) echo "$line" ;;
	esac
done <"$TMP/sim.out"
if [ "$rc" -ne 0 ] && ! grep -q '^not ok' "$TMP/sim.out"; then
	notok "simulator exited $rc"
	sed 's/^/#   /' "$TMP/sim.out" | tail -20
fi
done_testing
