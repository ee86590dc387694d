#!/usr/bin/env bash
# examples/: the generated model loads everywhere, and the single-tensor
# walk-through runs on it (the whole-model examples are exercised by the
# conversion tests t1810/t1820 through the same programs).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 3
check "make-tiny-llama: a model that tensor-ls reads" test "$(tensor-ls m | wc -l)" -eq $((3 * 9 + 3))
check "make-tiny-llama: the same bytes every time" sh -c "'$ROOT/examples/make-tiny-llama' m2 3 >/dev/null && cmp -s m/model.safetensors m2/model.safetensors"
check "make-tiny-llama: the byte-level tokenizer gives one token per UTF-8 byte" \
	sh -c 'echo "héllo, wörld" | tokenize -t m --ids --no-bos | tr " " "\n" | grep -c . | grep -qx 14'
"$ROOT/examples/single-tensor" m >st.out 2>st.err
check "examples/single-tensor runs on the generated model (a relative MODEL path)" test $? -eq 0
check "single-tensor: three bit widths compared" test "$(grep -cE '^[234]  ' st.out)" -eq 3

# the examples' command lines: -h, a MODEL that is not there, a bad BITS
for e in quickstart single-tensor mixed-precision own-calibration slurm-convert.sbatch; do
	check "examples/$e -h prints its description, exit 0" \
		sh -c "'$ROOT/examples/$e' -h | grep -q '^examples/$e'"
done
for e in single-tensor mixed-precision own-calibration; do
	check_fail "examples/$e: a MODEL that is not there is an error, not a generated model" 1 \
		"^$e: nosuch: no config.json" "$ROOT/examples/$e" nosuch
done
check_fail "examples/own-calibration: an unreadable TEXT" 1 "^own-calibration: nosuch.txt: cannot read" \
	"$ROOT/examples/own-calibration" m nosuch.txt
check_fail "examples/quickstart: BITS that is not a number" 2 "^quickstart: BITS: 'x'" \
	env QUICKSTART_DIR="$TMP/qs" "$ROOT/examples/quickstart" x
check "... before anything is written" test ! -e "$TMP/qs"
check "make-tiny-llama --help, exit 0" sh -c "'$ROOT/examples/make-tiny-llama' --help | grep -q '^usage: make-tiny-llama DIR'"
check_fail "make-tiny-llama: HIDDEN not a multiple of 16" 2 "HIDDEN a multiple of 16" "$ROOT/examples/make-tiny-llama" bad 1 40
check "... nothing written" test ! -e bad
check "make-tiny-llama without bin/ on PATH (as the other examples)" \
	env PATH=/usr/bin:/bin "$ROOT/examples/make-tiny-llama" m3 1 32 32
check "... a complete model" test "$(tensor-ls m3 | wc -l)" -eq 12
done_testing
