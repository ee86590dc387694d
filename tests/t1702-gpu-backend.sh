#!/usr/bin/env bash
# t1702-gpu-backend: the GPU backend is a plug-in (lib/common/device.h). No
# program links a CUDA library (ldd); a program not asked for the device
# never loads the object (LD_DEBUG); the object exports its entry only;
# the loader's failures name what is missing: --device cuda exits 1 with
# the object's path and the dlerror or the driver's error, --device auto
# falls back to the CPU with one note and the CPU's bytes. Fake backends
# built here (cc) check the refusals (no entry, another ABI, no device)
# and that a program finds the object next to its own directory. Runs
# everywhere, on cusim too (ROOT=tests/tmp/cusim: the emulated object).
. "$(dirname "$0")/lib.sh"
SRC=$(cd "$(dirname "$0")/.." && pwd)
cd "$TMP" || exit 1
obj=$ROOT/lib/libexl3kit-cuda.so
unset EXL3KIT_BACKEND

progs=()
for p in "$ROOT"/bin/*; do
	case ${p##*/} in *.*) continue ;; esac
	[ -f "$p" ] && [ -x "$p" ] && progs+=("$p")
done
bad=""
for p in "${progs[@]}"; do
	ldd "$p" | grep -Eq 'libcuda|libcudart|libcublas|libcusolver|libnvidia' && bad="$bad ${p##*/}"
done
if [ "${#progs[@]}" -gt 5 ] && [ -z "$bad" ]; then
	ok "no program links a CUDA library (ldd of ${#progs[@]} programs)"
else
	notok "programs linking CUDA libraries:${bad:- (only ${#progs[@]} programs found)}"
fi

tensor-gen -s 1 --scale 0.02 m.weight=16x128 > w.fr
tensor-gen -s 2 -d spd --meta count=1 m.hessian=128x128 > h.fr
had-rotate --seed 5 --hessian h.fr < w.fr > rc.fr
loads() {   # loads PATTERN cmd...: does cmd dlopen a file matching PATTERN?
	local pat=$1; shift
	LD_DEBUG=files "$@" 2>&1 >/dev/null | grep -q "file=.*$pat.*\[0\]"
}

# fake backends (device.h's ABI; available() says why there is no device)
have_cc=0
if command -v "${CC:-cc}" >/dev/null; then
	cat > fake.c <<'EOF'
#include "device.h"
static const struct x3_gpu_host *host;
static int avail(void) { host->err(X3_EUNSUP, "fake backend: no device here"); return 0; }
static const struct x3_gpu table = { .abi = ABI, .size = sizeof table, .name = "fake",
                                     .available = avail };
const struct x3_gpu *x3_gpu_backend(const struct x3_gpu_host *h) { host = h; return &table; }
EOF
	echo 'int x3_not_a_backend(void) { return 0; }' > noentry.c
	mkdir -p lib bin
	"${CC:-cc}" -shared -fPIC -I"$SRC/lib/common" -DABI=X3_GPU_ABI -o lib/libexl3kit-cuda.so fake.c &&
		"${CC:-cc}" -shared -fPIC -I"$SRC/lib/common" -DABI=99 -o oldabi.so fake.c &&
		"${CC:-cc}" -shared -fPIC -o noentry.so noentry.c && have_cc=1
fi
fake=$TMP/lib/libexl3kit-cuda.so

if [ "$have_cc" -eq 1 ]; then
	check "LD_DEBUG shows a backend object that is loaded (--device auto)" \
		loads libexl3kit-cuda env EXL3KIT_BACKEND="$fake" had-rotate -q --device auto --hessian h.fr < w.fr
	if ! loads libexl3kit-cuda env EXL3KIT_BACKEND="$fake" tensor-ls -h &&
		! loads libexl3kit-cuda env EXL3KIT_BACKEND="$fake" had-rotate --device cpu --hessian h.fr < w.fr &&
		! loads libexl3kit-cuda env EXL3KIT_BACKEND="$fake" tensor-cat w.fr; then
		ok "not loaded without --device cuda|auto (tensor-ls, tensor-cat, had-rotate --device cpu)"
	else
		notok "the backend object is loaded by a program that did not ask for it"
	fi
	check_fail "--device cuda, no device: exit 1 naming the backend and why" 1 \
		"--device cuda: fake backend: no device here \(backend $fake\)" \
		env EXL3KIT_BACKEND="$fake" had-rotate --device cuda --hessian h.fr < w.fr
	for p in had-rotate trellis-encode exl3-matmul; do
		case $p in
		had-rotate) args=(--seed 5 --hessian h.fr) in=w.fr ;;
		trellis-encode) args=(-K 2) in=rc.fr ;;
		exl3-matmul) args=(--dequant) in=g.fr ;;
		esac
		[ -f g.fr ] || {
			tensor-gen -d uniform -t I16 --scale 32768 -s 1 L.trellis=8x8x32 > g.fr
			tensor-gen -t F16 -s 2 --scale 0.05 L.suh=128 L.svh=128 >> g.fr
			tensor-gen -d constant -t I32 --value -2082680531 L.mul1= >> g.fr
		}
		"$p" "${args[@]}" --device cpu < "$in" > "$p.cpu" 2>/dev/null
		rc=0
		EXL3KIT_BACKEND=$fake "$p" "${args[@]}" --device auto < "$in" > "$p.auto" 2> "$p.err" || rc=$?
		if [ "$rc" -eq 0 ] && [ "$(wc -l < "$p.err")" -eq 1 ] &&
			grep -q "^$p: --device auto: fake backend: no device here.*; running on the CPU" "$p.err" &&
			tensor-cat --meta seconds=0 --meta timing=0 "$p.cpu" > a && tensor-cat --meta seconds=0 --meta timing=0 "$p.auto" > b &&
			cmp -s a b; then
			ok "$p --device auto without a device: the CPU's bytes and one note"
		else
			notok "$p --device auto without a device (exit $rc)"
			sed 's/^/#   /' "$p.err" | head -5
		fi
	done
	check_fail "a backend of another ABI is refused, naming both" 1 "oldabi.so: ABI 99 .*wants ABI" \
		env EXL3KIT_BACKEND="$TMP/oldabi.so" had-rotate --device cuda --hessian h.fr < w.fr
	check_fail "a shared object without the entry is refused" 1 "noentry.so: no function x3_gpu_backend" \
		env EXL3KIT_BACKEND="$TMP/noentry.so" had-rotate --device cuda --hessian h.fr < w.fr
	# a program finds the object as ../lib/libexl3kit-cuda.so from its own directory
	cp "$ROOT/bin/had-rotate" bin/
	check_fail "found next to the program's directory (/proc/self/exe)" 1 \
		"fake backend: no device here \(backend $fake\)" \
		bin/had-rotate --device cuda --hessian h.fr < w.fr
	rm lib/libexl3kit-cuda.so
	check_fail "no object there: the message names the path looked at" 1 \
		"--device cuda: no CUDA backend: .*$TMP/bin/\.\./lib/libexl3kit-cuda\.so" \
		bin/had-rotate --device cuda --hessian h.fr < w.fr
else
	skip "fake backends: no C compiler"
fi
check_fail "EXL3KIT_BACKEND naming a missing file: exit 1 with the dlerror" 1 \
	"--device cuda: no CUDA backend: $TMP/none.so: cannot open shared object file" \
	env EXL3KIT_BACKEND="$TMP/none.so" had-rotate --device cuda --hessian h.fr < w.fr
check_fail "EXL3KIT_BACKEND naming a file that is no shared object" 1 \
	"no CUDA backend: $TMP/w.fr: .*(invalid ELF header|file too short)" \
	env EXL3KIT_BACKEND="$TMP/w.fr" had-rotate --device cuda --hessian h.fr < w.fr

# the real object, where this build has one
if [ -f "$obj" ]; then
	syms=$(nm -D --defined-only "$obj" | awk '{print $3}' | tr '\n' ' ')
	if [ "$syms" = "x3_gpu_backend " ]; then ok "$obj exports x3_gpu_backend only"
	else notok "$obj exports: $syms"; fi
	if ldd "$obj" | grep -q 'not found'; then
		notok "the backend's libraries are found (ldd)"
		ldd "$obj" | grep 'not found' | sed 's/^/#   /'
	else
		ok "the backend's libraries are found (ldd)"
	fi
	rc=0
	had-rotate --seed 5 --device cuda --hessian h.fr < w.fr > rg.fr 2> g.err || rc=$?
	if [ "$rc" -eq 0 ]; then
		check "--device cuda with a device: same frames as the cpu" sh -c \
			'test "$(tensor-ls rg.fr | jq -c "[.name, .shape]")" = "$(tensor-ls rc.fr | jq -c "[.name, .shape]")"'
	else
		check_fail "--device cuda without a device: exit 1 naming the object and the driver's error" 1 \
			"--device cuda: no usable CUDA device: .* \(backend $obj\)" \
			had-rotate --device cuda --hessian h.fr < w.fr
	fi
	# the same path of the emulated backend, with its device hidden
	if grep -qa X3SIM_NODEVICE "$obj"; then
		check_fail "cusim with X3SIM_NODEVICE=1: --device cuda exits 1" 1 \
			"--device cuda: no usable CUDA device: .* \(backend $obj\)" \
			env X3SIM_NODEVICE=1 had-rotate --device cuda --hessian h.fr < w.fr
	fi
else
	skip "the backend object: not built here (CUDA=0)"
fi
done_testing
