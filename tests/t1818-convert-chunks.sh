#!/usr/bin/env bash
# A conversion over job slots (issue 12 part 4, issue 15 part 1): -j 1 with no
# fan-out and the encodes run through GNU parallel on two job slots
# (--gpus 0,1 with --device cpu) give byte-identical directories and
# Hessians, in both modes, with the calibration summed in chunks of
# --chunk-rows. The captures too run as one process per chunk
# (--capture-parts, on with -j 2 and --gpus: hessian-capture --part, merged
# in chunk order), checked by a hessian-capture on PATH that notes its
# calls: the Hessians are the bytes of -j 1's one process per layer.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
command -v parallel >/dev/null || { skip "no GNU parallel"; done_testing; }
tiny_model m 1
mkdir shim
printf '#!/bin/sh\necho "$*" >>%s/hc.log\nexec %s/bin/hessian-capture "$@"\n' "$TMP" "$ROOT" >shim/hessian-capture
chmod +x shim/hessian-capture
export PATH="$TMP/shim:$PATH"
parts() { grep -c -- '--part [0-2] ' hc.log; }
opts=(--bits 3 --rows 8 --cols 64 --chunk-rows 3 -q)
check "onepass, the calibration in 3 chunks (-j 1)" convert m a "${opts[@]}" -j 1 --keep-hessians
check "... one capture process per layer and the head, no parts" test "$(parts)" -eq 0
: >hc.log
check "onepass, the encodes and the capture parts on 2 job slots" convert m b "${opts[@]}" --gpus 0,1 --device cpu --keep-hessians
check "... byte-identical directories" diff -r a b
check "... the same Hessians" diff -r a.work/h1 b.work/h1
check "... 3 capture parts for the layer and 3 for the head" test "$(parts)" -eq 6
check "... merged once per layer" test "$(grep -c -- '--merge' hc.log)" -eq 2
check "... no part or hidden-state file left" test -z "$(ls b.work/h1 | grep -v '\.input\.frames$')"
: >hc.log
check "onepass -j 2 (the capture parts as make rules), the Hessians dropped" convert m j "${opts[@]}" -j 2
check "... byte-identical to -j 1" diff -r a j
check "... from 6 capture parts" test "$(parts)" -eq 6
check "--capture-parts off at -j 2: one process per layer, the same directory" \
	sh -c ': >hc.log && convert m k "$@" -j 2 --capture-parts off && diff -r a k && ! grep -q -- --part hc.log' _ "${opts[@]}"
check "--chunk-rows is what the Hessians' bytes depend on" sh -c '! cmp -s "$1" "$2"' _ \
	"$(ls a.work/h1/*.frames | head -1)" "$( convert m c --bits 3 --rows 8 --cols 64 --chunk-rows 8 -q -j 1 --keep-hessians >/dev/null && ls c.work/h1/*.frames | head -1)"
check "make finds the work directory up to date" make -q -r -s -C b.work -f Makefile
# the capture timing files (WORK/timing, the time report's) are those of
# the captures that made the Hessians: none left of parts run before
tfiles() { ls "$1.work/timing" | paste -sd' '; }
check "timing files: one per part of each capture (3 chunks)" test "$(tfiles j)" = "h1.0.p0.json h1.0.p1.json h1.0.p2.json h1.1.p0.json h1.1.p1.json h1.1.p2.json"
convert m j --bits 3 --rows 8 --cols 64 --chunk-rows 4 -q -j 2 || notok "onepass -j 2, --chunk-rows 4 on the same work directory"
check "... recaptured in 2 parts: the third part's timing files deleted" test "$(tfiles j)" = "h1.0.p0.json h1.0.p1.json h1.1.p0.json h1.1.p1.json"
convert m j --bits 3 --rows 8 --cols 64 --chunk-rows 5 -q -j 1 || notok "-j 1, --chunk-rows 5 on the same work directory"
check "... recaptured whole (one process a layer): no part's timing file left" test "$(tfiles j)" = "h1.0.json h1.1.json"
check "sequential, one capture per layer (-j 1)" convert m sa "${opts[@]}" -j 1 --mode sequential
check "sequential, the encodes on 2 job slots" \
	convert m sb "${opts[@]}" --mode sequential --gpus 0,1 --device cpu
check "... byte-identical directories" diff -r sa sb
# --moe-capture all (ExLlamaV3's all-token expert Hessians) with parts: the
# captures alone (make h1-groups), forward chunks of 2 rows (a shim adds
# hessian-capture --chunk 64, as the default 4096 tokens are at --cols
# 2048), so a calibration chunk of 3 rows sums two products: parts rounded
# to F32 gave other bytes than one process here
"$ROOT/examples/make-tiny-llama" --arch qwen3-moe --experts 4 --top-k 2 --moe-inter 48 --dense-layers 0 M 2 64 96 >/dev/null
mkdir shim2
printf '#!/bin/sh\necho "$*" >>%s/hc2.log\ncase " $* " in *" --merge "*|*" --list-parts "*) ;; *) set -- "$@" --chunk 64 ;; esac\nexec %s/bin/hessian-capture "$@"\n' "$TMP" "$ROOT" >shim2/hessian-capture
chmod +x shim2/hessian-capture
for p in off on; do
	PATH="$TMP/shim2:$PATH" convert M e$p --bits 2 --moe-capture all --capture-parts $p --rows 8 --cols 32 --chunk-rows 3 -q --makefile >/dev/null &&
	PATH="$TMP/shim2:$PATH" make -s -C e$p.work NOPLAN=1 h1-groups || notok "MoE --moe-capture all --capture-parts $p: the captures"
done
check "MoE --moe-capture all: 3 parts per layer merged == one process, every Hessian byte for byte" \
	sh -c 'diff -r eon.work/h1 eoff.work/h1 && test "$(ls eon.work/h1 | grep -c "experts\.[0-9]*\..*input\.frames$")" -eq 8'
check "... from 9 capture parts (2 layers and the head)" test "$(grep -c -- '--part [0-2] ' hc2.log)" -eq 9
check_fail "--chunk-rows 0" 2 "chunk-rows" convert m c --bits 3 --chunk-rows 0
check_fail "--capture-parts bad" 2 "capture-parts" convert m c --bits 3 --capture-parts 2
done_testing
