#!/usr/bin/env bash
# The calibration capture in chunks (issue 12 §4, issue 15 §1): a conversion
# whose Hessians one hessian-capture summed over the chunks (-j 1, no
# fan-out) and one whose chunks ran as separate processes through GNU
# parallel (two job slots: --gpus 0,1 with --device cpu), merged in chunk
# order, give byte-identical directories, in both modes (sequential: one
# process per chunk and layer, each carrying its own rows' hidden states).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
command -v parallel >/dev/null || { skip "no GNU parallel"; done_testing; }
tiny_model m 1
opts=(--bits 3 --rows 8 --cols 64 --chunk-rows 3 -q)
check "onepass, one capture over the 3 chunks (-j 1)" convert m a "${opts[@]}" -j 1
check "onepass, one capture per chunk on 2 job slots" convert m b "${opts[@]}" --gpus 0,1 --device cpu
check "... byte-identical directories" diff -r a b
check "... the same Hessians" diff -r a.work/h1 b.work/h1
check "... the chunks' partial sums were removed after the merge" test -z "$(ls b.work/parts)"
check "make finds the chunked work directory up to date" make -q -r -s -C b.work -f Makefile
check "sequential, one capture per layer (-j 1)" convert m sa "${opts[@]}" -j 1 --mode sequential
check "sequential, one capture per chunk and layer on 2 job slots" \
	convert m sb "${opts[@]}" --mode sequential --gpus 0,1 --device cpu
check "... byte-identical directories" diff -r sa sb
check "... the chunks' hidden states were removed" test -z "$(ls sb.work/hs | grep hidden)"
check_fail "--chunk-rows 0" 2 "chunk-rows" convert m c --bits 3 --chunk-rows 0
done_testing
