#!/usr/bin/env bash
# t1706-gpu-emulated: the CUDA path run on cusim, the CPU emulator of
# tests/gpu/cusim (no GPU needed): `make cusim` builds the real kernels and
# host wrappers against the emulated runtime, cuBLAS and cuSOLVER into the
# backend object tests/tmp/cusim/lib/libexl3kit-cuda.so, which the normal
# build's programs and unit tests (hard-linked there) dlopen; then the emulator's own checks (selftest), and the GPU
# unit tests (tests/unit/t17*-gpu-*) and the GPU shell tests t1702, t1750, t1761
# (the programs' --device cuda, with ROOT=tests/tmp/cusim) under two
# thread orders (X3SIM_ORDER=rev and rand): each run must pass, and the two
# orders must print the same results (an order-dependent race would show
# as a difference). The emulated device's name contains "emulated"; the
# unit tests then use smaller data (every K and codebook still covered).
# Needs g++ and the CUDA headers; skips otherwise.
. "$(dirname "$0")/lib.sh"
inc=${CUSIM_CUDA_INC:-${CUDA_HOME:-/usr/local/cuda}/include}
if ! command -v "${CXX:-g++}" >/dev/null || [ ! -f "$inc/cuda_runtime.h" ] ||
	[ ! -f "$inc/cublas_v2.h" ] || [ ! -f "$inc/cusolverDn.h" ]; then
	skip "cusim needs g++ and the CUDA headers ($inc)"
	done_testing
fi
cd "$ROOT" || exit 1
S=$ROOT/tests/tmp/cusim
t0=$(date +%s)
if env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -j2 cusim CUSIM_CUDA_INC="$inc" >"$TMP/build.log" 2>&1; then
	ok "make cusim ($(( $(date +%s) - t0 )) s)"
else
	notok "make cusim"
	tail -30 "$TMP/build.log" | sed 's/^/#   /'
	done_testing
fi
if grep -q 'warning:' "$TMP/build.log"; then
	notok "make cusim is warning-free"
	grep -A3 'warning:' "$TMP/build.log" | head -20 | sed 's/^/#   /'
else
	ok "make cusim is warning-free"
fi

# relay NAME LOG RC: the run's TAP lines as checks of this test
relay() {
	local name=$1 log=$2 rc=$3 p=0 f=0 k=0
	while IFS= read -r line; do
		case $line in
		"ok "*"# SKIP"*) skip "$name: ${line#ok * - }"; k=$((k + 1)) ;;
		"ok "*) ok "$name: ${line#ok * - }"; p=$((p + 1)) ;;
		"not ok "*) notok "$name: ${line#not ok * - }"; f=$((f + 1)) ;;
		"#"*) echo "$line" ;;
		esac
	done <"$log"
	if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
		notok "$name exited $rc"
		tail -20 "$log" | sed 's/^/#   /'
	fi
	echo "# $name: $p ok, $f not ok, $k skipped, exit $rc"
}

t0=$(date +%s)
rc=0
"$S/selftest" >"$TMP/selftest.log" 2>"$TMP/selftest.err" || rc=$?
relay "selftest" "$TMP/selftest.log" "$rc"

# one order: the unit tests, then t1750 with the emulated programs
run_order() {
	local order=$1 dir=$TMP/$1 t
	mkdir -p "$dir"
	for t in "$S"/tests/unit/t17*-gpu-*; do
		local s
		s=$(date +%s)
		X3SIM_ORDER=$order timeout 600 "$t" >"$dir/${t##*/}.log" 2>"$dir/${t##*/}.err"
		echo "$? $(( $(date +%s) - s ))" >"$dir/${t##*/}.rc"
	done
	for t in tests/t17*-gpu-*.sh; do
		case $t in *t1705-*|*t1706-*) continue ;; esac
		s=$(date +%s)
		t=${t%.sh}
		X3SIM_ORDER=$order ROOT=$S timeout 600 bash "$t.sh" >"$dir/${t##*/}.log" 2>"$dir/${t##*/}.err"
		echo "$? $(( $(date +%s) - s ))" >"$dir/${t##*/}.rc"
	done
}
orders="rev rand:1706"
for o in $orders; do run_order "$o" & done
wait
for o in $orders; do
	for rcf in "$TMP/$o"/*.rc; do
		name=$(basename "$rcf" .rc)
		read -r rc secs <"$rcf"
		relay "$name [$o, ${secs}s]" "$TMP/$o/$name.log" "$rc"
	done
done
# the same results under both orders (the unit tests print their errors)
set -- $orders
for rcf in "$TMP/$1"/*.rc; do
	name=$(basename "$rcf" .rc)
	if cmp -s "$TMP/$1/$name.log" "$TMP/$2/$name.log"; then
		ok "$name: identical output under X3SIM_ORDER=$1 and $2"
	else
		notok "$name: output differs between X3SIM_ORDER=$1 and $2"
		diff "$TMP/$1/$name.log" "$TMP/$2/$name.log" | head -10 | sed 's/^/#   /'
	fi
done
echo "# emulated runs: $(( $(date +%s) - t0 )) s"
done_testing
