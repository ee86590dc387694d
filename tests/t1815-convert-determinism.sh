#!/usr/bin/env bash
# Reproducibility of a whole conversion (exl3kit(7), REPRODUCIBILITY): at a
# fractional target, where the plan decides between two widths per tensor,
# -j 1 on one BLAS/OpenMP thread and -j 2 on two give byte-identical
# directories, plans, measurements and encodes (the work directory's enc/,
# proxy errors included), under each of two OpenBLAS kernels
# forced with OPENBLAS_CORETYPE (tests/lib-blas.sh blas_pair): the one this
# machine runs, on stories260K (or the generated Llama without it), rows of
# 200 tokens (not a multiple of the 64-row GEMM blocks: padded blocks);
# and another one this CPU runs whose GEMM kernels differ (Haswell, else
# SkylakeX or Sandybridge), on a one-layer generated Llama at the same
# target (two rows of 200 tokens, no head encode: the smallest conversion
# whose plan still mixes widths). Between kernels the bytes may differ
# (exl3kit(7)); the test checks only what that page promises.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
if have_shared; then
	M=$SHARED/models/stories260K
else
	tiny_model m 2
	M=m
fi
tiny_model s 1

# same_encodes A B: the work directories of A and B hold the same encodes
# (enc/: every linear at every measured width), frame for frame, identical
# but for the timing ("seconds")
same_encodes() {
	local f
	[ "$(ls "$1.work/enc")" = "$(ls "$2.work/enc")" ] || { echo "# not the same files in enc/"; return 1; }
	for f in "$1.work/enc"/*.frames; do
		cmp -s <(tensor-cat "$f" --meta seconds=0 --meta timing=0) <(tensor-cat "$2.work/enc/${f##*/}" --meta seconds=0 --meta timing=0) ||
			{ echo "# enc/${f##*/} differs"; return 1; }
	done
}

# pair KERNEL MODEL DIR OPTS...: convert MODEL under OpenBLAS KERNEL, -j 1 on
# one BLAS and OpenMP thread into DIR1 and -j 2 on two into DIR2; check
# they are the same bytes, plan and measurements (but for the timing)
pair() {
	local k=$1 m=$2 d=$3
	shift 3
	check "$k: convert -j 1 on one BLAS and OpenMP thread" \
		blas_under "$k" env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 convert "$m" "${d}1" "$@" -j 1
	check "$k: convert -j 2 on two BLAS and OpenMP threads" \
		blas_under "$k" env OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 convert "$m" "${d}2" "$@" -j 2
	check "$k: -j 1 / 1 thread vs -j 2 / 2 threads: byte-identical directories" diff -r "${d}1" "${d}2"
	check "$k: ... the same plan, mixing widths ($(jq -c .histogram "${d}1.work/plan.json"))" \
		jqe '.histogram | length > 1' "${d}1.work/plan.json"
	check "$k: ... ... in both" cmp "${d}1.work/plan.json" "${d}2.work/plan.json"
	jq -c 'del(.seconds, .timing)' "${d}1.work/measure.jsonl" >"${d}1.m"
	jq -c 'del(.seconds, .timing)' "${d}2.work/measure.jsonl" >"${d}2.m"
	check "$k: ... the same measurements (proxy errors), line for line" \
		sh -c "test \$(wc -l <'${d}1.m') -ge 10 && cmp '${d}1.m' '${d}2.m'"
	check "$k: ... the same encodes, every linear at every width ($(ls "${d}1.work/enc" | wc -l) files)" \
		same_encodes "${d}1" "${d}2"
}

blas_pair
echo "# OpenBLAS kernels: $BLAS_KERNELS"
set -- $BLAS_KERNELS
pair "$1" "$M" a --bits 3.5 --rows 8 --cols 200 -q
if [ -n "$BLAS_WHY" ]; then
	skip "-j 1 vs -j 2 under a second OpenBLAS kernel: $BLAS_WHY"
else
	pair "$2" s b --bits 3.5 --rows 2 --cols 200 --head-bits 16 -q
fi
done_testing
