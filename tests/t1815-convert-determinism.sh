#!/usr/bin/env bash
# Reproducibility of a whole conversion (README "Reproducibility"): at a
# fractional target, where the plan decides between two widths per tensor,
# -j 1 on one BLAS/OpenMP thread and -j 2 on two give byte-identical
# directories, plans and measurements. Rows of 200 tokens (not a multiple
# of the 64-row GEMM blocks) exercise the padded blocks. Under a second
# OpenBLAS kernel the Hessians (and so the plan) may differ in the last
# bits; the test reports how far, and checks only what README promises.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
if have_shared; then
	M=$SHARED/models/stories260K
else
	tiny_model m 2
	M=m
fi
opts=(--bits 3.5 --rows 8 --cols 200 -q)

check "convert -j 1 on one BLAS and OpenMP thread" \
	env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 convert "$M" a "${opts[@]}" -j 1
check "convert -j 2 on two BLAS and OpenMP threads" \
	env OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 convert "$M" b "${opts[@]}" -j 2
check "-j 1 / 1 thread vs -j 2 / 2 threads: byte-identical directories" diff -r a b
check "... the same plan" cmp a.work/plan.json b.work/plan.json
jq -c 'del(.seconds)' a.work/measure.jsonl >ma; jq -c 'del(.seconds)' b.work/measure.jsonl >mb
check "... the same measurements (proxy errors)" test -s ma -a "$(wc -l <ma)" -gt 10
check "... ... line for line" cmp ma mb

# another OpenBLAS kernel than the one this machine picks, if it can run one
cur=$(OPENBLAS_VERBOSE=2 tensor-ls -h 2>&1 | sed -n 's/^Core: //p' | head -1)
alt=
grep -qw avx2 /proc/cpuinfo && [ "$cur" != Haswell ] && alt=Haswell
[ -z "$alt" ] && grep -qw avx /proc/cpuinfo && alt=Sandybridge
if [ -n "$alt" ]; then
	env OPENBLAS_CORETYPE=$alt convert "$M" c "${opts[@]}" -j 2
	same=0 all=0
	for f in a.work/enc/*.frames; do
		all=$((all + 1))
		cmp -s "$f" "c.work/enc/${f##*/}" && same=$((same + 1))
	done
	cmp -s a.work/plan.json c.work/plan.json && p=identical || p=different
	echo "# OpenBLAS ${cur:-default} vs $alt: plan $p, $same of $all encoded tensors byte-identical"
fi
done_testing
