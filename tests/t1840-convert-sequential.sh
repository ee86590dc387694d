#!/usr/bin/env bash
# pipelines/convert --mode sequential on a generated two-layer Llama: the
# capture of layer i+1 starts from the hidden states saved by layer i's
# (hessian-capture --hidden-in/--hidden-out) and must give the directory that
# capturing from the embedding every time (make CARRY=) gives, byte for byte;
# the saved states are deleted once used; resume after kill -9; the h1 group
# files (tensor-cat --split) are the frames of one capture stream.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 2
opts=(--bits 3 --rows 8 --cols 128 -q --mode sequential --keep-hessians)

check "sequential, hidden states carried from layer to layer" convert m seq "${opts[@]}" -j 2
check "... the work directory keeps no hidden states" test -z "$(ls seq.work/hs | grep hidden)"
check "... every group file of every layer" test "$(ls seq.work/hs | wc -l)" -eq 9
check "... the head's capture read the quantized layers 0 and 1" \
	test -L seq.work/ov/2/layer.0.safetensors -a -L seq.work/ov/2/layer.1.safetensors
check "the work directory's Makefile is up to date" make -q -s -f seq.work/Makefile

# the same work directory without the sequential captures, encodes and
# layers: redone with every capture from the embedding (make CARRY=), into
# another OUT
redo() { rm -f seq.work/hs/* seq.work/q/* seq.work/enc/*.hs.*; }
redo
check "sequential, every capture from the embedding (make CARRY=)" \
	make -s -f seq.work/Makefile CARRY= OUT="$TMP/full" all
check "... byte-identical to the carried conversion" diff -r seq full

# kill -9 the whole pipeline midway through the layers, resume
redo
setsid make -s -f seq.work/Makefile -j 2 OUT="$TMP/res" all & pid=$!
for i in $(seq 1 1200); do
	[ -f seq.work/q/layer.0.safetensors ] && break
	sleep 0.05
done
kill -9 -- "-$pid" 2>/dev/null
wait "$pid" 2>/dev/null
check "killed midway: no OUT yet" test ! -e res
check "resume: the re-run completes" make -s -f seq.work/Makefile -j 2 OUT="$TMP/res" all
check "resume: byte-identical to the uninterrupted conversion" diff -r seq res
check "... no hidden states left" test -z "$(ls seq.work/hs | grep hidden)"

# the Hessian group files of the original model (h1, used for the
# measurements) are tensor-cat's selections of one capture stream
hessian-capture -q --model m --tokens seq.work/cal/tokens.frames --cols 128 >all.frames
same=1
for f in seq.work/h1/*.frames; do
	g=$(basename "$f" .frames)
	cmp -s "$f" <(tensor-cat -q all.frames "$g") || { same=0; echo "# $g differs"; }
done
check "h1: each group file is its frame of the capture stream" test "$same" = 1 -a "$(ls seq.work/h1 | wc -l)" -eq 9
done_testing
