#!/usr/bin/env bash
# tests/bench/glm5-kl.sh: the KL to the original of t1878's tiny GLM-5 (a
# seeded examples/make-tiny-llama --arch glm_moe_dsa: 3 layers, hidden 80,
# 4 experts, the indexer on layers 0-1, layer 2 sharing it) converted at
# each rate of BENCH_RATES (default 2.5 4) with each random-sign seed of
# BENCH_SEEDS (default 0 1 2), one work directory per seed; round-to-
# nearest at the same rates as the baseline (deterministic). Prints one
# line per conversion and, per rate, the mean ± sample sd over the seeds.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export ROOT=$root PATH="$root/bin:$root/pipelines:$PATH" LC_ALL=C
TMP=$(mktemp -d "${TMPDIR:-/tmp}/x3glm5.XXXXXX"); export TMP
trap 'rm -rf "$TMP"' EXIT
. "$root/tests/lib-convert.sh"
cd "$TMP"
rates=${BENCH_RATES:-2.5 4} seeds=${BENCH_SEEDS:-0 1 2}
"$root/examples/make-tiny-llama" --no-mtp --arch glm_moe_dsa --experts 4 --top-k 2 --moe-inter 40 --q-lora 48 \
	--kv-lora 40 --mla-dims 24,8,20 --heads 2 --kv-heads 2 --index-topk 64 --index-dims 3,20 --shared-layers 2 \
	M 3 80 96 >/dev/null
for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
build_rtn
ev=(--text eval.txt --rows 4 --cols 128)
for b in $rates; do
	for s in $seeds; do
		convert M "q$b.$s" --bits "$b" --seed "$s" --work "w$s" --rows 16 --cols 64 -j 2 -q >/dev/null
		model-eval -q --model M --quantized "q$b.$s" "${ev[@]}" | jq .kl_divergence >"kl$b.$s"
		echo "GLM-5 $b bpw seed $s: KL $(cat "kl$b.$s")"
	done
	rtn_model M "rtn$b" "$b"
	echo "GLM-5 $b bpw round-to-nearest: KL $(model-eval -q --model M --quantized "rtn$b" "${ev[@]}" | jq .kl_divergence)"
	cat kl"$b".* | awk -v b="$b" '{ x[NR] = $1; m += $1 } END { m /= NR; for (i = 1; i <= NR; i++) v += (x[i] - m) ^ 2
		printf "GLM-5 %s bpw: KL %.4f ± %.4f over %d seeds\n", b, m, (NR > 1 ? sqrt(v / (NR - 1)) : 0), NR }'
done
