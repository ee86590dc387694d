#!/usr/bin/env bash
# A short libFuzzer run of the frame and safetensors parsers (make fuzz runs
# longer). Skips where clang's fuzzer runtime is missing.
. "$(dirname "$0")/lib.sh"
out=$("$ROOT/tests/fuzz/run" "${FUZZ_SMOKE_SECONDS:-20}" 2>&1); rc=$?
if [ $rc -eq 2 ]; then skip "fuzz smoke: $out"
elif [ $rc -eq 0 ]; then ok "fuzz smoke run of frame and safetensors parsers"; echo "$out" | sed 's/^/# /'
else notok "fuzz smoke run"; echo "$out" | sed 's/^/# /' | tail -30; fi
done_testing
