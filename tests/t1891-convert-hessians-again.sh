#!/usr/bin/env bash
# A Hessian file is deleted once its layer's encodes are done; the
# encodes are made from the stamp of the layer's capture, which stays.
# Where an encode needs a deleted Hessian again, its recipe runs the
# layer's capture again (hneed in pipelines/convert.mk), and the result is
# a fresh conversion's, byte for byte:
#   - sequential mode, the work directory reused at another rate: layer
#     0's sequential Hessians (its capture's stamp up to date, its final
#     encodes new) are captured again;
#   - a measurement deleted and the work directory's make run by hand
#     (no convert-plan to foresee the capture): the layer's h1 capture
#     runs again.
# And the recapture set convert-plan decides (RECAP in rules.mk, the
# layers whose stamps convert removes) is the set make's dry run then
# captures: a measurement of one layer deleted, and the work directory
# reused at a rate with a new width; that reuse keeps the encodes it
# has (the recaptured stamps dated as the first) and packs what a fresh
# conversion packs.
# A generated two-layer Llama.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 2
o=(--rows 8 --cols 64 -q -j 2)

convert m s3 --bits 3 --mode sequential --work w "${o[@]}"
check "sequential at 3 bpw: layer 0's sequential Hessians deleted" test -z "$(ls w/hs | grep '^model\.layers\.0\.')"
t0=$(stat -c %y w/timing/hs.0.json)
check "the same work directory at 4 bpw" convert m s4 --bits 4 --mode sequential --work w "${o[@]}"
check "... layer 0's sequential capture ran again" test "$(stat -c %y w/timing/hs.0.json)" != "$t0"
check "... no Hessian left" test -z "$(ls w/hs w/h1 | grep 'frames$')"
check "a fresh conversion at 4 bpw" convert m f4 --bits 4 --mode sequential --work wf "${o[@]}"
check "... the reused work directory's pack is the fresh one's" diff -r f4 s4

convert m p3 --bits 3 --work wp "${o[@]}"
t0=$(stat -c %y wp/timing/h1.1.json)
c0=$(stat -c %y wp/timing/h1.0.json)
rm wp/enc/model.layers.1.mlp.down_proj.h1.k3.frames
check "a measurement of layer 1 deleted, make by hand" make -s -C wp -j 2 OUT="$TMP/p3b" all
check "... layer 1's capture ran again" test "$(stat -c %y wp/timing/h1.1.json)" != "$t0"
check "... layer 0's did not" test "$(stat -c %y wp/timing/h1.0.json)" = "$c0"
check "... the measurement made again" test -f wp/enc/model.layers.1.mlp.down_proj.h1.k3.frames
check "... the same pack" diff -r p3 p3b

# recap_is SET LABEL: rules.mk's RECAP and the layers make's dry run
# captures (hessian-capture --layers L-L) are both SET
recap_is() {
	local r m
	r=$(sed -n 's/^RECAP ?= *//p' wp/rules.mk)
	m=$(make -r -s -n -C wp -f Makefile --no-print-directory NOPLAN=1 RECAP= plan.mk | grep -o 'hessian-capture .*--layers [0-9]*' |
		sed 's/.*--layers //' | sort -n | paste -sd' ')
	check "$2: RECAP is {$1} (got {$r}), make captures {$1} (got {$m})" test "$r" = "$1" -a "$m" = "$1"
}
rm wp/enc/model.layers.0.self_attn.q_proj.h1.k3.frames
convert m p3 --bits 3 --work wp "${o[@]}" --makefile >/dev/null
recap_is 0 "a measurement of layer 0 deleted"
convert m p25 --bits 2.5 --work wp "${o[@]}" --makefile >/dev/null
recap_is "0 1" "reused at 2.5 bpw (K=2 new)"
# the captures run again date their stamps as the first did (the newest
# of their inputs), so the encodes at K=3 are kept, not made again
ls -l --time-style=+%s.%N wp/enc | awk '/k3/ { print $7, $6 }' | sort >k3.before
check "the work directory at 2.5 bpw" convert m p25 --bits 2.5 --work wp "${o[@]}"
ls -l --time-style=+%s.%N wp/enc | awk '/k3/ { print $7, $6 }' | sort >k3.after
check "... the $(wc -l <k3.before) encodes at K=3 it had kept as they were" test -z "$(comm -23 k3.before k3.after)"
check "a fresh conversion at 2.5 bpw" convert m f25 --bits 2.5 --work wf25 "${o[@]}"
check "... the reused work directory's pack is the fresh one's" diff -r f25 p25
done_testing
