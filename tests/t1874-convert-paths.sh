#!/usr/bin/env bash
# Any legal path works: MODEL, OUT, --work and --cal named with blanks,
# # $ : ' " \ * and a newline, through make (-j 2) and GNU parallel (the
# --gpus fan-out, on the CPU), give the same pack as plain names; a re-run
# there is up to date.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 1
opts=(--bits 3 --rows 8 --cols 64 -q)
for i in $(seq 40); do echo "The calibration text, line $i: plain words for the tokenizer."; done >cal.txt
check "plain names: converts" convert m plain --cal cal.txt "${opts[@]}" -j 2

n=$'sp ace #$:\'"\\*\nnl'
mkdir -p "$n/m $n"
cp m/* "$n/m $n/"
cp cal.txt "$n/cal $n.txt"
check "MODEL, OUT (its work directory beside it) and --cal with every special character, make -j 2" \
	convert "$n/m $n" "$n/out $n" --cal "$n/cal $n.txt" "${opts[@]}" -j 2
check "... the same pack as with plain names" diff -r plain "$n/out $n"
check "... a re-run is up to date (the pack not rewritten)" sh -c \
	'b=$(stat -c %Y:%i "$1/config.json") && convert "$2" "$3" --cal "$4" --bits 3 --rows 8 --cols 64 -q -j 2 &&
	 test "$(stat -c %Y:%i "$1/config.json")" = "$b"' sh "$n/out $n" "$n/m $n" "$n/out $n" "$n/cal $n.txt"
if command -v parallel >/dev/null; then
	check "--work with every special character too, GNU parallel (--gpus on the CPU)" \
		convert "$n/m $n" "$n/par $n" --work "$n/work $n" --cal "$n/cal $n.txt" "${opts[@]}" --gpus 0,1 --device cpu
	check "... the same pack" diff -r plain "$n/par $n"
else
	skip "GNU parallel with special characters: no GNU parallel"
fi
made=("cal $n.txt" "m $n" "out $n" "out $n.work")
! command -v parallel >/dev/null || made+=("par $n" "work $n")
check "nothing made outside the directories named" test "$(ls -A "$n" | sort | tr '\n' '|')" = \
	"$(printf '%s\n' "${made[@]}" | sort | tr '\n' '|')"
done_testing
