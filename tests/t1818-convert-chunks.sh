#!/usr/bin/env bash
# A conversion over job slots (issue 12 part 4, issue 15 part 1): -j 1 with no
# fan-out and the encodes run through GNU parallel on two job slots
# (--gpus 0,1 with --device cpu) give byte-identical directories and
# Hessians, in both modes, with the calibration summed in chunks of
# --chunk-rows (the capture itself is not fanned out yet: hessian-capture
# --part/--merge do that by hand, tests/t1564).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
command -v parallel >/dev/null || { skip "no GNU parallel"; done_testing; }
tiny_model m 1
opts=(--bits 3 --rows 8 --cols 64 --chunk-rows 3 -q)
check "onepass, the calibration in 3 chunks (-j 1)" convert m a "${opts[@]}" -j 1 --keep-hessians
check "onepass, the encodes on 2 job slots" convert m b "${opts[@]}" --gpus 0,1 --device cpu --keep-hessians
check "... byte-identical directories" diff -r a b
check "... the same Hessians" diff -r a.work/h1 b.work/h1
check "--chunk-rows is what the Hessians' bytes depend on" sh -c '! cmp -s "$1" "$2"' _ \
	"$(ls a.work/h1/*.frames | head -1)" "$( convert m c --bits 3 --rows 8 --cols 64 --chunk-rows 8 -q -j 1 --keep-hessians >/dev/null && ls c.work/h1/*.frames | head -1)"
check "make finds the work directory up to date" make -q -r -s -C b.work -f Makefile
check "sequential, one capture per layer (-j 1)" convert m sa "${opts[@]}" -j 1 --mode sequential
check "sequential, the encodes on 2 job slots" \
	convert m sb "${opts[@]}" --mode sequential --gpus 0,1 --device cpu
check "... byte-identical directories" diff -r sa sb
check_fail "--chunk-rows 0" 2 "chunk-rows" convert m c --bits 3 --chunk-rows 0
done_testing
