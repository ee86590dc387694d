#!/usr/bin/env bash
# tests/bench/mtp-kl.sh: the multi-token prediction (MTP) layer's own error
# at --mtp-bits K. Its linears are encoded as convert encodes them (tensor-cat
# | had-rotate --out-scales always | trellis-encode -K K, no Hessian, the
# random-sign seed of convert --seed), and put alone into the original model
# (model-eval --patch), so that the main model and the hidden states the
# MTP layer reads are the original's; model-eval --mtp compares the MTP
# layer's logits (of the token two ahead) with the unquantized layer's: KL
# and top-1 agreement, mean ± sample standard deviation over the seeds
# BENCH_SEEDS (default 0 1 2), for each K of BENCH_K (default 2 4 6), on a
# tiny seeded Qwen3.5 (mtp.*) and DeepSeek V3 (layer num_hidden_layers) from
# examples/make-tiny-llama. Prints a table. No target (exit 0 unless a step
# fails).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export PATH="$root/bin:$root/pipelines:$PATH" LC_ALL=C
seeds=${BENCH_SEEDS:-0 1 2}
ks=${BENCH_K:-2 4 6}
d=$(mktemp -d "${TMPDIR:-/tmp}/mtp-kl.XXXXXX")
trap 'rm -rf "$d"' EXIT
cd "$d"
"$root/examples/make-tiny-llama" --heads 2 --kv-heads 1 --lin-heads 2,4 --lin-dims 24,20 \
	--arch qwen3_5 qwen3_5 2 80 96 >/dev/null
"$root/examples/make-tiny-llama" --arch deepseek_v3 --experts 4 --groups 1,1 deepseek_v3 2 64 96 >/dev/null
for i in $(seq 1 40); do
	echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."
done >eval.txt
printf '%-12s %3s %-24s %-20s\n' model K "MTP KL (mean ± sd)" "MTP top-1 (mean ± sd)"
for m in qwen3_5 deepseek_v3; do
	mapfile -t lins < <(tensor-ls --linears "$m" | jq -r 'select(.role == "mtp") | "\(.key) \(.weight)"')
	for K in $ks; do
		for s in $seeds; do
			for l in "${lins[@]}"; do
				read -r key w <<<"$l"
				tensor-cat -q --meta "key=$key" "$m" "$w" |
					had-rotate -q --seed "$s" --out-scales always 2>/dev/null |
					trellis-encode -q -K "$K" --codebook mul1
			done >patch.frames
			model-eval -q --model "$m" --quantized "$m" --patch patch.frames --mtp --text eval.txt \
				--rows 8 --cols 128 | jq -r '"\(.kl_divergence) \(.top1_agreement)"'
		done | awk -v m="$m" -v K="$K" '
			{ kl[NR] = $1; t[NR] = $2; skl += $1; st += $2 }
			END { n = NR; mk = skl / n; mt = st / n
			      for (i = 1; i <= n; i++) { vk += (kl[i] - mk) ^ 2; vt += (t[i] - mt) ^ 2 }
			      sk = n > 1 ? sqrt(vk / (n - 1)) : 0; sd = n > 1 ? sqrt(vt / (n - 1)) : 0
			      printf "%-12s %3d %.5f ± %.5f      %.4f ± %.4f\n", m, K, mk, sk, mt, sd }'
	done
done
