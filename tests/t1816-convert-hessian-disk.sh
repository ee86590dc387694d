#!/usr/bin/env bash
# pipelines/convert keeps the work directory's Hessians bounded: a layer's
# Hessian files are deleted once its encodes are done, and a layer's capture
# waits until those of the layer two before it are gone, so at most two
# layers' Hessians exist at once (exl3kit(7): the peak disk formula). Checked on
# a generated three-layer Llama by a tensor-cat on PATH that, after every
# capture's --split, records the Hessian bytes, the layers that have
# Hessian files and the whole work directory's bytes: the Hessian peak is at
# most max over l of (H_l + H_l+1) (H_l: layer l's Hessian files, from a
# --keep-hessians run, which keeps them all), the work directory's peak at
# most its final size + that + two hidden-state files; resume after the
# deletion rebuilds nothing (make -q, no capture runs), and the output is
# byte-identical to the --keep-hessians conversion.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 3
opts=(--bits 2 --rows 4 --cols 128 -q -j 2 --drop-hessians)
mkdir shim
cat >shim/tensor-cat <<SH
#!/usr/bin/env bash
"$ROOT/bin/tensor-cat" "\$@" || exit \$?
dir=
for a in "\$@"; do [ "\${prev:-}" != --split ] || dir=\$a; prev=\$a; done
[ -n "\$dir" ] || exit 0
w=\$(cd "\$(dirname "\$dir")" && pwd)   # (make runs in the work directory)
hb=\$(find "\$w/h1" "\$w/hs" -name '*.input.frames' -printf '%s\n' | awk '{ s += \$1 } END { print s + 0 }')
ly=\$(ls "\$w/h1" "\$w/hs" | sed -n 's/^model\.layers\.\([0-9]*\)\..*\.input\.frames$/\1/p; s/^lm_head\.input\.frames$/head/p' | sort -u | paste -sd, -)
wb=\$(find "\$w" -type f -printf '%s\n' | awk '{ s += \$1 } END { print s + 0 }')
echo "\$hb \$wb \${ly:-none}" >>"$TMP/log.\$(basename "\$w")"
SH
chmod +x shim/tensor-cat
export PATH="$TMP/shim:$PATH"

check "convert --keep-hessians" convert m keep "${opts[@]}" --keep-hessians
check "... keeps every layer's Hessians (3 layers x 4 groups + the head)" \
	test "$(ls keep.work/h1 | grep -c '\.input\.frames$')" -eq 13
# H_l: the bytes of layer l's Hessian files (the head: layer 3)
for l in 0 1 2; do
	hl[l]=$(find keep.work/h1 -name "model.layers.$l.*.input.frames" -printf '%s\n' | awk '{ s += $1 } END { print s }')
done
hl[3]=$(stat -c %s keep.work/h1/lm_head.input.frames)
pair=0
for l in 0 1 2; do s=$((hl[l] + hl[l + 1])); [ "$s" -le "$pair" ] || pair=$s; done
all=$(awk '{ print $1 }' log.keep.work | sort -n | tail -1)
check "--keep-hessians: the Hessian peak is all four layers' ($all bytes)" \
	test "$all" -eq $((hl[0] + hl[1] + hl[2] + hl[3]))

check "convert (Hessians deleted per layer)" convert m out "${opts[@]}"
check "... byte-identical to the --keep-hessians conversion" diff -r keep out
check "... no Hessian file left" test -z "$(ls out.work/h1 out.work/hs | grep '\.frames$')"
check "... one capture per layer and the head (4 samples)" test "$(wc -l <log.out.work)" -eq 4
peak=$(awk '{ print $1 }' log.out.work | sort -n | tail -1)
check "the Hessian peak ($peak bytes) <= max_l (H_l + H_l+1) = $pair bytes" test "$peak" -le "$pair"
check "at most two layers have Hessian files at once" \
	sh -c "! awk '{ print \$3 }' log.out.work | grep -q ',.*,'"
check "a later layer's capture ran after an earlier layer's Hessians were deleted" \
	sh -c "awk '{ print \$3 }' log.out.work | grep -qx '1,2\|2,head\|2\|head'"
# the work directory: its final size plus the Hessian pair plus two hidden
# states (rows x cols x hidden F32, with a frame header)
final=$(find out.work -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
hid=$((4 * 128 * 64 * 4 + 4096))
wpeak=$(awk '{ print $2 }' log.out.work | sort -n | tail -1)
check "the work directory's peak ($wpeak bytes) <= final $final + $pair + 2 x $hid" \
	test "$wpeak" -le $((final + pair + 2 * hid))

# resume after the deletion: nothing to do, no capture
check "the Makefile is up to date with the Hessians gone (make -q)" make -q -s -C out.work
before=$(stat -c %Y out/config.json)
: >log.out.work
check "re-running the conversion succeeds" convert m out "${opts[@]}"
check "... captures nothing" test ! -s log.out.work
check "... and rewrites nothing" test "$(stat -c %Y out/config.json)" = "$before"
rm -rf out
opts=(${opts[@]/-q})
check "OUT removed: the re-run packs again" sh -c 'convert "$@" 2>err.txt' convert m out "${opts[@]}"
check "... its summary gives the bits by role of the plan" \
	grep -qx 'convert: bits by role: attention 2 (12 linears), mlp 2 (9 linears), head 6 (1 linears)' err.txt
check "... without capturing" test ! -s log.out.work
check "... the same directory" diff -r keep out

# the work directory reused at another rate (as t1820 does): the 3 bpw run
# needs the dropped Hessians of the decoder layers (K=3 was not measured;
# the head's K=6 encode is there) and captures those three layers again,
# each once, in order, still two layers at a time; make used to spin at
# 100% CPU here, hence the timeout
: >log.out.work
check "convert --bits 3 reusing the 2 bpw work directory (dropped Hessians: the default)" \
	timeout 300 convert m r3 --work out.work --bits 3 --rows 4 --cols 128 -q -j 2
check "... captures the three decoder layers again, once each (3 samples)" test "$(wc -l <log.out.work)" -eq 3
check "... at most two layers have Hessian files at once" \
	sh -c "! awk '{ print \$3 }' log.out.work | grep -q ',.*,'"
check "... the head's Hessian is not captured again" sh -c "! awk '{ print \$3 }' log.out.work | grep -q head"
check "... no Hessian or hidden-state file left" test -z "$(ls out.work/h1 out.work/hs | grep '\.frames$')"
check "... nothing to do after it (make -q)" make -q -s -C out.work
check "a fresh --keep-hessians conversion at 3 bpw" convert m k3 --bits 3 --rows 4 --cols 128 -q -j 2 --keep-hessians
check "... is byte-identical to the reusing one" diff -r k3 r3
done_testing
