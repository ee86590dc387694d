#!/usr/bin/env bash
# Golden bad inputs (tests/golden): each rejected with exit 1 and its message,
# through stdin (frame reader) and by name; the good ones accepted.
. "$(dirname "$0")/lib.sh"
G=$ROOT/tests/golden
check "good.frames reads" test "$(tensor-ls < $G/good.frames | wc -l)" -eq 2
check "good.safetensors reads" test "$(tensor-ls $G/good.safetensors | wc -l)" -eq 2
while IFS=$'\t' read -r f pat; do
	case $f in '#'*|'') continue;; esac
	if [[ $f == *.frames ]]; then
		check_fail "$f on stdin" 1 "$pat" sh -c "tensor-ls < $G/$f"
		check_fail "$f through tensor-cat" 1 "$pat" sh -c "tensor-cat - < $G/$f > /dev/null"
	fi
	# by name a frame without a checksum is simply a plain safetensors file
	[ "$f" = no-checksum.frames ] && continue
	check_fail "$f by name" 1 "$pat" tensor-ls "$G/$f"
done < "$G/expected.txt"
# ... and the writers do not make them (utf8-*.frames): jansson dropped a
# name or value that is not UTF-8, writing a header without the tensor
# (unreadable) or without the note (exit 0)
check_fail "tensor-gen: a name that is not UTF-8" 2 "^tensor-gen: tensor name 'w\\\\xff' is not valid UTF-8" \
	tensor-gen $'w\xff'=4
check "... writes nothing" test ! -s "$TMP/cf.out"
check_fail "tensor-cat --meta: a value that is not UTF-8" 2 \
	"^tensor-cat: --meta 'note': value '\\\\xfe' is not valid UTF-8" sh -c "tensor-cat --meta note=\$(printf '\\376') - < $G/good.frames"
check_fail "tensor-gen --meta: a key that is not UTF-8" 2 "^tensor-gen: --meta: key 'n\\\\xfe' is not valid UTF-8" \
	tensor-gen --meta $'n\xfe'=1 w=4
done_testing
