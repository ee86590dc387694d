#!/usr/bin/env bash
# A short libFuzzer run of every fuzz target, FUZZ_SMOKE_SECONDS each
# (default 3; make fuzz runs longer). Skips where clang's fuzzer runtime is
# missing.
. "$(dirname "$0")/lib.sh"
if [ -n "${X3_CHECK_ASAN:-}" ]; then skip "fuzz smoke: not on the check-asan build (it builds its own)"; done_testing; fi
out=$("$ROOT/tests/fuzz/run" "${FUZZ_SMOKE_SECONDS:-3}" 2>&1); rc=$?
if [ $rc -eq 2 ]; then skip "fuzz smoke: $out"
elif [ $rc -eq 0 ]; then ok "fuzz smoke run of every target"; echo "$out" | sed 's/^/# /'
else notok "fuzz smoke run"; echo "$out" | sed 's/^/# /' | tail -30; fi
done_testing
