#!/usr/bin/env bash
# tests/bench/tied-kl.sh OTHER: the KL cost of tied widths (one K per
# expert projection of a layer, what ExLlamaV3's loader requires) against a
# free allocation, on the tiny seeded mixture-of-experts models: every
# model converted at 2.5 and 3.5 bpw with 3 seeds of the random signs by
# this tree's toolkit and by OTHER, the root of a built exl3kit checkout
# whose bitalloc does not tie (e.g. a worktree of the commit before ties:
# git worktree add ../untied c845284~1 && make -C ../untied CUDA=0).
# Prints one line per model and rate: mean and spread (min..max) of each.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
other=$(cd "${1:?usage: tied-kl.sh OTHER-CHECKOUT}" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
mk() { PATH=$here/bin:$PATH "$here/examples/make-tiny-llama" --experts 4 --top-k 2 "$@" >/dev/null; }
mk --arch mixtral MX 2 64 80
mk --arch qwen3-moe --moe-inter 48 --dense-layers 0 Q3 2 64 96
mk --arch glm4_moe --moe-inter 40 --groups 1,1 GL 2 64 96
for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
kl() {   # kl ROOT MODEL BITS SEED
	PATH=$1/bin:$1/pipelines:$PATH convert "$2" q --bits "$3" --seed "$4" --work w --rows 40 --cols 128 -j 2 -q \
		--reader none 2>/dev/null || PATH=$1/bin:$1/pipelines:$PATH convert "$2" q --bits "$3" --seed "$4" \
		--work w --rows 40 --cols 128 -j 2 -q
	PATH=$here/bin:$here/pipelines:$PATH validate q --model "$2" --text eval.txt --rows 8 --cols 128 -q | jq .eval.kl_divergence
	rm -rf q w
}
printf '%-4s %4s  %-32s %-32s\n' model bpw "tied: mean (min..max)" "free: mean (min..max)"
for m in MX Q3 GL; do
	for b in 2.5 3.5; do
		t=$(for s in 0 1 2; do kl "$here" $m $b $s; done)
		f=$(for s in 0 1 2; do kl "$other" $m $b $s; done)
		st() { awk '{ s += $1; if (NR == 1 || $1 < lo) lo = $1; if (NR == 1 || $1 > hi) hi = $1 }
			END { printf "%.5f (%.5f..%.5f)", s / NR, lo, hi }'; }
		printf '%-4s %4s  %-32s %-32s\n' $m $b "$(st <<<"$t")" "$(st <<<"$f")"
	done
done
