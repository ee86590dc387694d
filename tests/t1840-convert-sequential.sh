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
check "the work directory's Makefile is up to date" make -q -s -C seq.work

# the same work directory without the sequential captures, encodes and
# layers: redone with every capture from the embedding (make CARRY=), into
# another OUT
redo() { rm -f seq.work/hs/* seq.work/q/* seq.work/enc/*.hs.*; }
redo
check "sequential, every capture from the embedding (make CARRY=)" \
	make -s -C seq.work CARRY= OUT="$TMP/full" all
check "... byte-identical to the carried conversion" diff -r seq full

# kill -9 the whole pipeline midway through the layers, resume
redo
setsid make -s -C seq.work -j 2 OUT="$TMP/res" all & pid=$!
for i in $(seq 1 1200); do
	[ -f seq.work/q/layer.0.safetensors ] && break
	sleep 0.05
done
kill -9 -- "-$pid" 2>/dev/null
wait "$pid" 2>/dev/null
check "killed midway: no OUT yet" test ! -e res
check "resume: the re-run completes" make -s -C seq.work -j 2 OUT="$TMP/res" all
check "resume: byte-identical to the uninterrupted conversion" diff -r seq res
check "... no hidden states left" test -z "$(ls seq.work/hs | grep hidden)"
# what a kill -9 leaves of files being written (FILE.tmp-XXXXXX, never
# renamed; whether the kill above hit one depends on timing): a make of
# the work directory by hand (convert itself removes them when it starts)
# removes those of each step it runs, hidden states and Hessians alike
redo
for f in seq.work/hs/hidden.0.frames seq.work/hs/hidden.1.frames seq.work/q/layer.1.safetensors \
	"$(ls seq.work/h1/*.frames | head -n 1 | sed 's|/h1/|/hs/|')"; do
	echo partial >"$f.tmp-KILLED"
done
check "killed temporaries left: the re-run completes" make -s -C seq.work -j 2 OUT="$TMP/res2" all
check "... byte-identical to the uninterrupted conversion" diff -r seq res2
check "... none left" test -z "$(find seq.work -name '*.tmp-KILLED')"

# the Hessian group files of the original model (h1, used for the
# measurements) are tensor-cat's selections of one capture stream
hessian-capture -q --model m --tokens seq.work/cal/tokens.frames --cols 128 >all.frames
same=1
for f in seq.work/h1/*.frames; do
	g=$(basename "$f" .frames)
	cmp -s "$f" <(tensor-cat -q all.frames "$g") || { same=0; echo "# $g differs"; }
done
check "h1: each group file is its frame of the capture stream" test "$same" = 1 -a "$(ls seq.work/h1 | wc -l)" -eq 9

# --capture-parts: each sequential capture as one process per calibration
# chunk (3 chunks of 1 row), from the quantized layers before it and the
# hidden states the parts of the layer before saved, merged in chunk order:
# the Hessians and the directory of one process per layer, byte for byte
tiny_model p 2 16 16
po=(--bits 2 --head-bits 16 --rows 3 --cols 16 --chunk-rows 1 -q --mode sequential --keep-hessians)
check "sequential, one capture process per layer (--capture-parts off)" convert p p1 "${po[@]}" -j 2 --capture-parts off
check "sequential, 3 capture parts per layer (--capture-parts on)" convert p p3 "${po[@]}" -j 2 --capture-parts on
check "... byte-identical directories" diff -r p1 p3
check "... the same Hessians" diff -r p1.work/hs p3.work/hs
check "... layer 1's parts read the quantized layer 0 (overlays ov/1.0-2)" \
	test -L p3.work/ov/1.0/layer.0.safetensors -a -L p3.work/ov/1.2/layer.0.safetensors -a ! -e p1.work/ov/1.0
check "... no part or hidden state left" test -z "$(ls p3.work/hs | grep -v '\.input\.frames$')"
done_testing
