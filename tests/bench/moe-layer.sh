#!/usr/bin/env bash
# tests/bench/moe-layer.sh: what converting a mixture-of-experts model costs
# (issue 16, "Benchmarks"): wall time, CPU time, peak RSS (the largest
# process) and peak size of the work directory (sampled every 0.2 s) of
#   tiny      a tiny DeepSeek V3 (examples/make-tiny-llama --arch deepseek_v3:
#             2 layers of hidden 64, the first dense, 8 experts of 48), and
#   layer     one DeepSeek-V3-shaped MoE layer at real widths: hidden 7168,
#             128 heads of MLA (q_lora_rank 1536, kv_lora_rank 512, qk_nope
#             128, qk_rope 64, v 128), experts of 2048 with their count cut to
#             8 (one group, top 8) and one shared expert,
# each converted at BENCH_BITS (3) with -j 2 from BENCH_ROWS x BENCH_COLS
# calibration tokens (16 x 512: MLA over 128 heads costs the capture
# rows x cols^2 x 128 x 192 multiply-adds; a real conversion uses more).
# From the layer: a projection of the whole DeepSeek V3 671B (61 layers: 3
# dense and 58 MoE ones of 256 routed experts + 1 shared, hidden 7168, a
# 129280-token vocabulary) on 2, 16 and 64 cores from this run's CPU seconds
# per weight of the attention and of the experts (measured as one; a lower
# bound that assumes the encodes spread over the cores), its memory from the
# bound of exl3kit(7), PERFORMANCE (2 x (largest weight F32 + its Hessian F64) + the
# calibration's hidden states + a constant, the largest weight being the
# 129280 x 7168 head) and its peak disk from its formula (SIZES AND THE DRY RUN: the
# output + the Hessian files (F32) of two layers + the hidden states).
#   BENCH_MOE_HIDDEN/INTER/EXPERTS/HEADS  the layer (7168, 2048, 8, 128)
#   BENCH_MOE_TINY_ONLY=1                 only the tiny model
# The real-width layer is ~580 M weights (an 8B Llama layer is 218 M): about
# an hour of 2 free cores (6324 CPU s, 2026-12-03); scale it down (e.g. BENCH_MOE_HIDDEN=1024
# BENCH_MOE_INTER=512 BENCH_MOE_HEADS=16) to try it. The baseline, measured
# in the same run: tests/bench/viterbi's best-path rate at this K per core
# on CPU time, against each conversion's weights per CPU second ("% of
# Viterbi": what the whole conversion keeps of the encoder's speed).
# Prints a table and one JSON line per model. No target: the figures are
# the result.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export PATH="$root/bin:$root/pipelines:$PATH" LC_ALL=C
B=${BENCH_BITS:-3} R=${BENCH_ROWS:-16} C=${BENCH_COLS:-512}
H=${BENCH_MOE_HIDDEN:-7168} MI=${BENCH_MOE_INTER:-2048} E=${BENCH_MOE_EXPERTS:-8} NH=${BENCH_MOE_HEADS:-128}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/x3bench.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
cores=$(nproc)
# the baseline: the Viterbi alone, this K, best path, per core on CPU time
vit_core=$("$root/tests/bench/viterbi" -K "$B" -R -r 3 | grep '^{' | tail -1 | jq -r --arg k "$B" '.K[$k].wps_core')

# run NAME MODEL: convert it, sampling the work directory's size; sets
# wall cpu kb peak_disk out_bytes weights
run() {
	local name=$1 m=$2 out=$tmp/$1.out work
	work=$out.work
	rm -rf "$out" "$work"
	( peak=0; while :; do
		s=$(du -sb "$work" 2>/dev/null | cut -f1) || s=0
		[ "${s:-0}" -gt "$peak" ] && { peak=$s; echo "$peak" >"$tmp/$name.disk"; }
		sleep 0.2
	  done ) &
	local sampler=$!
	/usr/bin/time -f '%e %U %S %M' -o "$tmp/$name.time" \
		convert "$m" "$out" --bits "$B" --rows "$R" --cols "$C" -j 2 -q
	kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || :
	read -r wall us ss kb <"$tmp/$name.time"
	cpu=$(awk -v u="$us" -v s="$ss" 'BEGIN { printf "%.2f", u + s }')
	peak_disk=$(cat "$tmp/$name.disk" 2>/dev/null || echo 0)
	out_bytes=$(du -sb "$out" | cut -f1)
	weights=$(tensor-ls --linears "$m" | jq -s 'map(.shape[0] * .shape[1]) | add')
	pct=$(awk -v w="$weights" -v c="$cpu" -v v="$vit_core" 'BEGIN { printf "%.1f", (c > 0 && v > 0 ? 100 * w / c / v : 0) }')
	printf '%-6s %12s %9s %9s %10s %12s %12s %10s\n' "$name" "$weights" "$wall" "$cpu" "$((kb / 1024))" \
		"$((peak_disk / 1048576))" "$((out_bytes / 1048576))" "$pct"
	echo "{\"bench\":\"moe-layer\",\"model\":\"$name\",\"bits\":$B,\"rows\":$R,\"cols\":$C,\"cores\":$cores,\"weights\":$weights,\"wall_s\":$wall,\"cpu_s\":$cpu,\"peak_rss_kib\":$kb,\"peak_work_bytes\":$peak_disk,\"out_bytes\":$out_bytes,\"viterbi_weights_per_core_s\":$vit_core,\"pct_of_viterbi\":$pct}" >>"$tmp/json"
}

"$root/examples/make-tiny-llama" --arch deepseek_v3 "$tmp/tiny" 2 64 96 >/dev/null
jq --argjson c "$C" '.max_position_embeddings = ([.max_position_embeddings, $c] | max)' \
	"$tmp/tiny/config.json" >"$tmp/cfg" && mv "$tmp/cfg" "$tmp/tiny/config.json"
echo "DeepSeek V3 conversions at $B bpw, -j 2, calibration $R x $C, $cores cores"
printf 'baseline: the Viterbi alone at K=%d, %.0f weights/s per core (CPU time)\n' "$B" "$vit_core"
printf '%-6s %12s %9s %9s %10s %12s %12s %10s\n' model weights wall_s cpu_s rss_MiB work_peak_MiB out_MiB pct_of_vit
run tiny "$tmp/tiny"
if [ -z "${BENCH_MOE_TINY_ONLY:-}" ]; then
	"$root/examples/make-tiny-llama" --arch deepseek_v3 --experts "$E" --top-k "$E" --groups 1,1 \
		--moe-inter "$MI" --q-lora 1536 --kv-lora 512 --mla-dims 128,64,128 --heads "$NH" --kv-heads "$NH" \
		--dense-first 0 "$tmp/layer" 1 "$H" "$((MI * 9))" >/dev/null
	jq --argjson c "$C" '.max_position_embeddings = ([.max_position_embeddings, $c] | max)' \
		"$tmp/layer/config.json" >"$tmp/cfg" && mv "$tmp/cfg" "$tmp/layer/config.json"
	run layer "$tmp/layer"
	# the whole model, from this layer's CPU seconds per weight
	awk -v cpu="$cpu" -v w="$weights" -v R="$R" -v C="$C" -v B="$B" -v kb="$kb" -v real="$([ "$H" = 7168 ] && [ "$MI" = 2048 ] && [ "$NH" = 128 ] && echo 1 || echo 0)" '
	BEGIN {
		h = 7168; mi = 2048; inter = 18432; V = 129280
		attn = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h
		moe = 257 * 3 * h * mi; dense = 3 * h * inter
		total = 61 * attn + 58 * moe + 3 * dense     # decoder linears
		all = total + 58 * 256 * h + 2 * V * h       # + routers, embedding, head
		spw = cpu / w
		printf "\nDeepSeek V3 671B, projected from this run (%s):\n", real ? "real widths" : "SCALED-DOWN layer: not the real widths"
		printf "  decoder linears %.0f G weights, all parameters %.0f G\n", total / 1e9, all / 1e9
		printf "  %-8s %12s\n", "cores", "hours"
		split("2 16 64", nc, " ")
		for (i = 1; i <= 3; i++) { t = spw * total / nc[i] / 3600; printf "  %-8d %12.1f\n", nc[i], t; js = js sprintf("%s{\"cores\":%d,\"hours\":%.2f}", i > 1 ? "," : "", nc[i], t) }
		# memory: the bound of exl3kit(7), 2 x (the largest
		# weight F32, the head, + its Hessian F64) + hidden states + 64 MiB;
		# the capture of a MoE layer holds the weights and sums of one expert at
		# a time (exl3kit(7), "Memory of a mixture-of-experts layer"), far below it
		mem = 2 * (V * h * 4 + h * h * 8) + R * C * h * 4 + 64 * 1048576
		# disk: the formula of exl3kit(7): the output (B bits a decoder weight,
		# the head at 6, the embedding and norms 16) + two MoE layers of
		# Hessian files (F32, in^2 x 4 a group: per expert its gate/up
		# input h x h and its down input mi x mi; the attention inputs
		# h x h, 1536^2, 512^2 and the o_proj input 16384^2) + hidden states x 2
		outb = total * B / 8 + V * h * (6 + 16) / 8 + 58 * 256 * h * 2
		hl = 257 * (h * h + mi * mi) * 4 + (h * h + 1536 * 1536 + 512 * 512 + 16384 * 16384) * 4
		disk = outb + 2 * hl + 2 * R * C * h * 4
		printf "  memory bound %.1f GiB (measured here: largest process %.1f GiB)\n", mem / 2^30, kb / 2^20
		printf "  peak disk %.0f GiB = output %.0f GiB + two layers of Hessians %.0f GiB + hidden states\n", disk / 2^30, outb / 2^30, 2 * hl / 2^30
		printf "{\"bench\":\"moe-layer-projection\",\"model\":\"DeepSeek-V3-671B\",\"real_widths\":%s,\"cpu_s_per_weight\":%.4g,\"decoder_weights\":%.0f,\"projection\":[%s],\"memory_bytes\":%.0f,\"peak_disk_bytes\":%.0f}\n", real ? "true" : "false", spw, total, js, mem, disk > "/dev/stderr"
	}' 2>>"$tmp/json"
fi
echo
cat "$tmp/json"
