# tests/lib-blas.sh: the OpenBLAS kernels (OPENBLAS_CORETYPE) that the
# determinism tests force (t1205, t1211, t1564, t1815), in one place:
# sourced by tests/lib.sh (so every command-line test has it), and run by
# tests/unit/t1205-determinism as `bash tests/lib-blas.sh`, which prints
# blas_kernels. Defines functions only.

# blas_kernels: the kernels this CPU can run, one a line, widest first
# (OpenBLAS dies of SIGILL in a kernel whose instructions the CPU lacks):
# SkylakeX needs AVX-512 F, BW, VL and DQ, Haswell AVX2 and FMA,
# Sandybridge AVX; Prescott (SSE3) runs on every x86-64. Nothing on
# another architecture (its kernels have other names).
blas_kernels() {
	[ "$(uname -m)" = x86_64 ] || return 0
	local f
	f=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
	blas_has_() { local x; for x; do [[ $f == *" $x "* ]] || return 1; done; }
	if blas_has_ avx512f avx512bw avx512vl avx512dq; then echo SkylakeX; fi
	if blas_has_ avx2 fma; then echo Haswell; fi
	if blas_has_ avx; then echo Sandybridge; fi
	echo Prescott
}

# blas_core [VAR=VALUE...]: the kernel the toolkit's programs run under
# that environment (e.g. OPENBLAS_CORETYPE=Haswell): had-rotate links
# OpenBLAS, which names its kernel on stderr at start-up under
# OPENBLAS_VERBOSE=2 ("Core: Haswell"). Empty when OpenBLAS does not say
# (a build for one CPU, without DYNAMIC_ARCH).
blas_core() {
	env "$@" OPENBLAS_VERBOSE=2 "${ROOT:-.}/bin/had-rotate" -h 2>&1 >/dev/null | sed -n 's/^Core: //p' | head -1
}

# blas_other CORE: a kernel of blas_kernels whose GEMM kernels are not
# CORE's, Haswell first, then SkylakeX, Sandybridge, Prescott; empty when
# there is none. Cooperlake and SapphireRapids run SkylakeX's SGEMM and
# DGEMM kernels, Zen Haswell's (OpenBLAS kernel/x86_64/KERNEL.*), so those
# are not counted as other.
blas_other() {
	local k fam=$1 have
	case $1 in Cooperlake | SapphireRapids) fam=SkylakeX ;; Zen) fam=Haswell ;; esac
	have=$(blas_kernels)
	for k in Haswell SkylakeX Sandybridge Prescott; do
		if [ "$k" != "$fam" ] && grep -qx "$k" <<<"$have"; then echo "$k"; return 0; fi
	done
}

# blas_pair: sets BLAS_KERNELS to the kernels a determinism check runs
# under, "AMBIENT OTHER" (AMBIENT: the one this machine runs, OPENBLAS_CORETYPE
# included; OTHER: blas_other's, checked to be what OpenBLAS runs when
# forced), and BLAS_WHY to "". Without a second one, BLAS_KERNELS is the
# ambient one alone ("default" when OpenBLAS does not name it) and
# BLAS_WHY says why.
blas_pair() {
	local cur alt
	BLAS_WHY=
	cur=$(blas_core)
	if [ -z "$cur" ]; then
		BLAS_KERNELS=default BLAS_WHY="OpenBLAS does not name its kernel (OPENBLAS_VERBOSE=2 had-rotate -h)"
		return 0
	fi
	BLAS_KERNELS=$cur
	alt=$(blas_other "$cur")
	if [ -z "$alt" ]; then
		BLAS_WHY="this CPU runs no other OpenBLAS kernel than $cur"
	elif [ "$(blas_core OPENBLAS_CORETYPE="$alt")" != "$alt" ]; then
		BLAS_WHY="OPENBLAS_CORETYPE=$alt does not make OpenBLAS run $alt"
	else
		BLAS_KERNELS="$cur $alt"
	fi
}

# blas_under KERNEL CMD...: CMD with OPENBLAS_CORETYPE=KERNEL ("default":
# as the machine runs it)
blas_under() {
	local k=$1
	shift
	if [ "$k" = default ]; then "$@"; else OPENBLAS_CORETYPE=$k "$@"; fi
}

# run as a program: the kernels, one a line (tests/unit/t1205-determinism)
if [ "${BASH_SOURCE[0]}" = "$0" ]; then blas_kernels; fi
