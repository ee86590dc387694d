#!/usr/bin/env bash
# Write faults on purpose (tests/shim/failio.c): the Nth write, fsync or
# rename fails with ENOSPC or EIO. For every N up to the number of such
# operations tensor-cat -o, tensor-cat --split, bitalloc -o, trellis-encode
# and pack-write make, the program exits 1 with a message naming the file,
# and no file that looks complete is left; a small conversion, failed at a
# deterministic sample of its operations (FAULT_SAMPLES, default 8; 0: all),
# exits 1, leaves no OUT, and its re-run gives the same bytes as an
# unfailed conversion.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-pack.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
cc -shared -fPIC -o failio.so "$ROOT/tests/shim/failio.c" -ldl || { notok "build the shim"; done_testing; }
# faulty N PROG ARGS...: run with operation N failing (counted in PROG only);
# ENOSPC for odd N, EIO for even
faulty() {
	local n=$1 p=$2; shift 2
	rm -f cnt
	LD_PRELOAD=$TMP/failio.so FAILIO_COUNTER=$TMP/cnt FAILIO_PROGS=$p FAILIO_N=$n \
		FAILIO_ERRNO=$([ $((n % 2)) -eq 1 ] && echo ENOSPC || echo EIO) "$@"
}
count() { faulty 0 "$@" >/dev/null 2>&1; od -An -tu8 cnt | tr -d ' '; }
errmsg='(No space left on device|Input/output error)'

# every_n WHAT PROG OUTCHECK NAMEPAT CMD...: for N in 1..count, CMD exits 1
# naming NAMEPAT with the errno's text, and OUTCHECK (a function) succeeds
every_n() {
	local what=$1 prog=$2 outcheck=$3 pat=$4 n total bad=0 rc; shift 4
	total=$(count "$prog" "$@")
	[ "${total:-0}" -gt 0 ] || { notok "$what: no operations counted"; return; }
	for ((n = 1; n <= total; n++)); do
		rc=0; faulty "$n" "$prog" "$@" >out.tmp 2>err.txt || rc=$?
		if [ "$rc" -ne 1 ] || ! grep -Eq "$pat.*$errmsg|$errmsg.*$pat" err.txt || ! "$outcheck"; then
			bad=$((bad + 1))
			[ "$bad" -gt 3 ] || { echo "# $what: operation $n of $total: exit $rc"; sed 's/^/#   /' err.txt | head -3; }
		fi
	done
	check "$what: each of its $total writes/fsyncs/renames failing: exit 1, message names the file, nothing complete left" test "$bad" -eq 0
}

gen_model src 1 false 0
gen_quant 1 2 mul1 >q.frames
tensor-gen -s 3 a=64x64 b=32 c=3x5x7 >in.frames

# the output absent and no temporary left, or (the directory fsync after
# the rename failed) the output complete and the message says so
survives() { grep -q 'may not survive a crash' err.txt; }
no_st() { ! ls o.safetensors.* >/dev/null 2>&1 && { [ ! -e o.safetensors ] || survives; }; }
every_n "tensor-cat -o" tensor-cat no_st "o\.safetensors" sh -c 'rm -f o.safetensors; exec tensor-cat -q -o o.safetensors in.frames'

mkdir ref.split && tensor-cat -q --split ref.split in.frames
split_ok() { local f; for f in split/*; do [ -e "$f" ] || continue
	case $f in *.tmp*) return 1 ;; esac; cmp -s "$f" "ref.split/${f#split/}" || return 1; done; }
# (a split file is complete once renamed: each is checked against the reference)
# --split names its files by the tensor: a message names the split file
every_n "tensor-cat --split" tensor-cat split_ok "split/" sh -c 'rm -rf split; mkdir split; exec tensor-cat -q --split split in.frames'

gen_measure 1 >m.jsonl
no_plan() { ! ls plan.json.* >/dev/null 2>&1 && { [ ! -e plan.json ] || survives; }; }
every_n "bitalloc -o" bitalloc no_plan "plan\.json" sh -c 'rm -f plan.json; exec bitalloc -q --bits 3 -o plan.json m.jsonl'

tensor-gen -s 2 w=128x128 | had-rotate -q >rot.frames
stdout_ok() { :; }   # a redirected stdout: the shell's file, the message says so
every_n "trellis-encode >FILE" trellis-encode stdout_ok "standard output" sh -c 'exec trellis-encode -q -K 2 <rot.frames >enc.frames'

PW=(pack-write -q --model src --passthrough --head-bits 16)
"${PW[@]}" ref.pack <q.frames || notok "pack-write reference"
# OUT absent and no temporary left, or (the final directory fsync failed
# after the rename) OUT complete and the message says so
no_pack() { if [ -e pk ]; then survives && diff -r ref.pack pk >/dev/null
	else no_leftovers . pk; fi; }
every_n "pack-write OUT" pack-write no_pack "pk|$TMP" sh -c 'rm -rf pk; exec "$@" pk <q.frames' sh "${PW[@]}"

# ---- a small conversion ------------------------------------------------------
tiny_model m 1 16 32
# (the head at 2 bits too: its encode at 6 would be half the conversion's
# time, and the head's writes are those of any linear)
opts=(--bits 2 --head-bits 2 --rows 2 --cols 16 -q)
PROGS=tensor-cat,tensor-gen,had-rotate,trellis-encode,hessian-capture,bitalloc,pack-write,tokenize,tensor-ls
# the conversion that counts the operations (none failing) is the reference
total=$(count "$PROGS" convert m cref "${opts[@]}")
test -f cref/config.json || notok "reference conversion"
samples=${FAULT_SAMPLES:-8}
step=1; [ "$samples" -eq 0 ] || step=$(( (total + samples - 1) / samples ))
bad=0 tried=0
for ((n = 1; n <= total; n += step)); do
	# the last sample is the last operation (pack-write's directory fsync)
	[ $((n + step)) -le "$total" ] || n=$total
	rm -rf c c.work
	tried=$((tried + 1)) rc=0
	faulty "$n" "$PROGS" convert m c "${opts[@]}" 2>err.txt || rc=$?
	why=
	[ "$rc" -eq 1 ] || why="exit $rc"
	grep -Eq "$errmsg" err.txt || why="$why, no message with the errno"
	# (make deletes the target OUT/config.json of a failed pack-write; an
	# OUT without it does not look complete: convert and validate test it)
	[ ! -e c/config.json ] || { grep -q 'may not survive a crash' err.txt && diff -r cref c >/dev/null; } ||
		why="$why, a complete-looking OUT was left"
	convert m c "${opts[@]}" 2>rerun.txt && diff -r cref c >/dev/null || why="$why, the re-run differs"
	if [ -n "$why" ]; then
		bad=$((bad + 1)); echo "# conversion, operation $n of $total failing:$why"; sed 's/^/#   /' err.txt | head -4
	fi
	[ "$n" -lt "$total" ] || break
done
check "convert: $tried of its $total operations failing in turn: exit 1, no OUT, re-run byte-identical" test "$bad" -eq 0
done_testing
