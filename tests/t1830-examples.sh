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
"$ROOT/examples/single-tensor" "$TMP/m" >st.out 2>st.err
check "examples/single-tensor runs on the generated model" test $? -eq 0
check "single-tensor: three bit widths compared" test "$(grep -cE '^[234]  ' st.out)" -eq 3
done_testing
