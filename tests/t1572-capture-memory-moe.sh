#!/usr/bin/env bash
# hessian-capture's peak memory on a mixture-of-experts layer (issue 16):
# the forward runs the layer expert by expert (model.h
# x3_forward_opts.expert_done) and the capture writes and frees each
# expert's Hessians when it is done, so the peak does not grow with the
# number of experts: one expert's F32 weights and sums are held, not all.
# Two seeded Qwen3-MoE layers alike but for the experts, 8 and 32 of
# 3 x 512x512; before (every expert's weights and sums held for the
# layer) 32 experts peaked 253 MB above 8 (358 vs 104 MB), now < 1 MB.
# Also: the peak stays under the bound of issue 12 (2 x (largest weight +
# its Hessian) + the hidden states + 64 MiB) and convert -n's estimate of
# the capture covers it.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
[ -x /usr/bin/time ] || { skip "peak memory: no /usr/bin/time (Debian package time)"; done_testing; }
# under check-asan the peak is ASan's (shadow memory, quarantine), not the program's
[ -z "${X3_CHECK_ASAN:-}" ] || { skip "peak memory: not on the check-asan build"; done_testing; }
H=512 I=512 R=2 C=64
for E in 8 32; do
	tiny_model --arch qwen3-moe --experts $E --top-k 2 --moe-inter $I e$E 1 $H $I
done
tensor-gen -s 1 -d uniform -t I32 --mean 128 --scale 127 tokens=${R}x$C >tok.frames
# peak RSS in bytes of capturing the layer of e$1 (2 calibration chunks)
peak() {
	/usr/bin/time -f %M -o rss.$1 hessian-capture -q --model e$1 --tokens tok.frames --cols $C \
		--chunk-rows 1 --layers 0-0 -o h.$1 2>/dev/null && echo $(($(tail -1 rss.$1) * 1024))
}
p8=$(peak 8) p32=$(peak 32)
check "capture ran (8 experts: $((p8 >> 20)) MiB, 32 experts: $((p32 >> 20)) MiB)" test "$p8" -gt 0 -a "$p32" -gt 0
check "every expert's Hessians written: 2 groups x 32 experts + 2" \
	test "$(tensor-ls h.32 | grep -c 'experts\.[0-9]*\.')" -eq 64 -a "$(tensor-ls h.32 | wc -l)" -eq 66
# an expert held: gate, up, down in F32 and its sums, packed doubles (H and
# I inputs; two with 2 chunks): 24 more experts would be 24 times that
ex=$(( 3 * H * I * 4 + 2 * (H * (H + 1) / 2 + I * (I + 1) / 2) * 8 ))
check "24 experts more: the peak grows by less than a tenth of their weights and sums ($(( (p32 - p8) >> 10 )) KiB < $(( 24 * ex / 10 >> 10 )) KiB)" \
	test $((p32 - p8)) -lt $((24 * ex / 10))
bound=$(( 2 * (H * I * 4 + I * I * 8) + R * C * H * 4 + (64 << 20) ))
check "peak $((p32 >> 20)) MiB <= 2 x (an expert's down_proj F32 + its F64 Hessian) + hidden states + 64 MiB = $((bound >> 20)) MiB" \
	test "$p32" -le "$bound"
est=$(convert e32 out --bits 4 --rows $R --cols $C --chunk-rows 1 -n --json | jq .memory.capture)
check "convert -n: capture memory estimate $((est >> 20)) MiB >= the measured $((p32 >> 20)) MiB" \
	test "$est" -ge "$p32"
done_testing
