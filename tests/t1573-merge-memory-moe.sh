#!/usr/bin/env bash
# hessian-capture --merge's peak memory on the parts of a mixture-of-experts
# layer: the parts list the layer's groups in the same order and are read
# in lockstep, each group summed over the parts, blended, written and freed
# before the next is read, and part 0 carries each all-token Hessian just
# before the groups that use it, so the peak does not grow with the number
# of experts: one group's sums are held (beside the layer's shared gate/up
# all-token Hessian), not every expert's. Two seeded Qwen3-MoE layers
# alike but for the experts, 8 and 32 of 3 x 512x512, captured in 2 parts
# with every expert starved (--min-tokens 1000: the fallback reads part 0's
# all-token Hessians). Before (every group's sums of the layer held until
# the layer was read) 32 experts peaked 108 MiB above 8 (160 vs 52 MiB),
# now no more (18 vs 18 MiB).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
[ -x /usr/bin/time ] || { skip "peak memory: no /usr/bin/time (Debian package time)"; done_testing; }
# under check-asan the peak is ASan's (shadow memory, quarantine), not the program's
[ -z "${X3_CHECK_ASAN:-}" ] || { skip "peak memory: not on the check-asan build"; done_testing; }
H=512 I=512 R=2 C=64
tensor-gen -s 1 -d uniform -t I32 --mean 128 --scale 127 tokens=${R}x$C >tok.frames
for E in 8 32; do
	tiny_model --arch qwen3-moe --experts $E --top-k 2 --moe-inter $I e$E 1 $H $I
	for p in 0 1; do
		hessian-capture -q --model e$E --tokens tok.frames --cols $C --chunk-rows 1 --layers 0-0 \
			--min-tokens 1000 --part $p -o p$p.$E 2>/dev/null || notok "part $p of $E experts"
	done
done
# peak RSS in bytes of merging the parts of e$1 (given in reverse order)
peak() {
	/usr/bin/time -f %M -o rss.$1 hessian-capture -q --merge p1.$1 p0.$1 -o m.$1 2>/dev/null &&
		echo $(($(tail -1 rss.$1) * 1024))
}
p8=$(peak 8) p32=$(peak 32)
check "merge ran (8 experts: $((p8 >> 20)) MiB, 32 experts: $((p32 >> 20)) MiB)" test "$p8" -gt 0 -a "$p32" -gt 0
check "the merge == one process: every expert blended, byte for byte" bash -c \
	"hessian-capture -q --model e32 --tokens tok.frames --cols $C --chunk-rows 1 --layers 0-0 --min-tokens 1000 2>/dev/null | cmp - m.32 &&
	 test \$(tensor-ls m.32 | jq -r 'select(.meta.expert_fallback == \"1\") | .name' | wc -l) -eq 64"
# an expert's merged sums: 2 groups (H and I inputs), packed doubles; 24
# experts more would be 24 times that
ex=$(( (H * (H + 1) / 2 + I * (I + 1) / 2) * 8 ))
check "24 experts more: the merge's peak grows by less than a tenth of their sums ($(( (p32 - p8) >> 10 )) KiB < $(( 24 * ex / 10 >> 10 )) KiB)" \
	test $((p32 - p8)) -lt $((24 * ex / 10))
done_testing
