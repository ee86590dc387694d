#!/usr/bin/env bash
# t1910-hostile: the corpus of bad inputs in tests/hostile/, one case a
# file. Each case is a bash snippet that sets
#   EXPECT   the exit status the command must give (1 or 2: bad input)
#   MESSAGE  an extended regex its standard error must match (the file,
#            tensor or key named)
# and defines setup (make the bad input in the current directory, from the
# fixtures below) and run (the command under test, run with a time limit:
# a reader that hangs fails too). Fixtures, made once, read-only to cases:
#   $FIX/m      a one-layer generated Llama (examples/make-tiny-llama)
#   $FIX/ref    its 3-bit EXL3 pack (convert), $FIX/ref.work its work directory
#   $FIX/t.txt  an evaluation text
# Helpers: poke FILE TENSOR INDEX HEX (overwrite one element of a
# safetensors file, bytes little endian), drop SRC DST NAME (SRC's tensors
# but NAME into the single file DST). A new bad input is a new file here.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
CORPUS=$(cd "$(dirname "$0")/hostile" && pwd)
cd "$TMP" || exit 1

FIX=$TMP/fix
mkdir "$FIX"
( cd "$FIX" && tiny_model m 1 && convert m ref --bits 3 --rows 8 --cols 128 -q -j 2 ) ||
	{ notok "fixtures: the tiny model and its pack"; done_testing; }
for i in $(seq 1 40); do echo "Paragraph $i of the evaluation text: the model reads it and predicts the next word."; done >"$FIX/t.txt"
chmod -R a-w "$FIX"
check "the fixture pack itself validates ok against its model" \
	sh -c "validate -q '$FIX/ref' --model '$FIX/m' --rows 2 --cols 64 | jq -e .ok >/dev/null"

poke() {
	local f=$1 name=$2 idx=$3 hex=$4 n begin es
	n=$(od -An -t u8 --endian=little -N8 "$f" | tr -d ' ')
	read -r begin es < <(tail -c +9 "$f" | head -c "$n" | jq -r --arg k "$name" \
		'.[$k] | "\(.data_offsets[0]) \({"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I16": 2}[.dtype])"')
	printf "$(sed 's/../\\x&/g' <<<"$hex")" |
		dd of="$f" bs=1 seek=$((8 + n + begin + idx * es)) conv=notrunc status=none
}
drop() { tensor-cat -q "$1" $(tensor-ls "$1" | jq -r .name | grep -vFx "$3") -o "$2"; }
# pack DIR: a writable copy of the fixture pack
pack() { cp -r "$FIX/ref" "$1" && chmod -R u+w "$1"; }

export FIX
export -f poke drop pack
for c in "$CORPUS"/*.sh; do
	name=$(basename "$c" .sh)
	d=$TMP/cases/$name
	mkdir -p "$d"
	# in a subshell: the case's variables and functions stay its own
	(
		cd "$d" || exit 1
		EXPECT= MESSAGE=
		. "$c" || exit 1
		printf '%s\n' "$EXPECT" >want.rc
		printf '%s\n' "$MESSAGE" >want.msg
		setup >setup.log 2>&1 || exit 3
		export -f run
		rc=0
		timeout 60 bash -c run >out.log 2>err.log || rc=$?
		echo "$rc" >got.rc
	)
	case $? in
	0) ;;
	3) notok "$name: setup failed"; sed 's/^/#   /' "$d/setup.log" | head -5; continue ;;
	*) notok "$name: the case did not load"; continue ;;
	esac
	want=$(cat "$d/want.rc") msg=$(cat "$d/want.msg") got=$(cat "$d/got.rc")
	if [ -z "$want" ] || [ -z "$msg" ]; then
		notok "$name: sets EXPECT and MESSAGE"
	elif [ "$got" = "$want" ] && grep -Eq -- "$msg" "$d/err.log"; then
		ok "$name: exit $want, '$msg'"
	else
		notok "$name: exit $want, '$msg'"
		echo "#   exit $got (want $want), stderr:"; sed 's/^/#   /' "$d/err.log" | head -5
	fi
done
# and the good input beside them: a patch as trellis-encode writes it (one
# encode of the fixture's work directory, frames) is taken, and changes the KL
enc=$(ls "$FIX"/ref.work/enc/model.layers.0.mlp.down_proj.*.frames | head -1)
check "model-eval --patch takes trellis-encode's frames: KL above 0" sh -c \
	"model-eval -q --model '$FIX/m' --quantized '$FIX/m' --patch '$enc' --text '$FIX/t.txt' --cols 64 |
	 jq -e '.kl_divergence > 0' >/dev/null"
check "the corpus has cases" test "$(ls "$CORPUS"/*.sh | wc -l)" -gt 0
# the broken directories go (a FIFO would block the sweep of done_testing)
chmod -R u+w "$FIX"
rm -rf "$TMP/cases"
done_testing
