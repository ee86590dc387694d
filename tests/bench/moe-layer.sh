#!/usr/bin/env bash
# tests/bench/moe-layer.sh: what converting a mixture-of-experts model costs:
# wall time, CPU time, peak RSS (the largest process) and peak size of the
# work directory (sampled every 0.2 s) of
#   tiny      a tiny model of the family (examples/make-tiny-llama --arch
#             FAMILY, 2 layers of hidden 64), and
#   layer     the family's layer(s) at real widths with the routed experts'
#             count cut (the other widths as the real model's),
# each converted at BENCH_BITS (3) with -j 2 from BENCH_ROWS x BENCH_COLS
# calibration tokens (16 x 512; a real conversion uses more). The family:
#   BENCH_MOE_ARCH=deepseek_v3   (default) one DeepSeek-V3 MoE layer: hidden
#       7168, 128 heads of MLA (q_lora 1536, kv_lora 512, qk_nope 128, qk_rope
#       64, v 128), 8 experts of 2048 (one group, top 8) + 1 shared; the
#       671B projected (61 layers: 3 dense of 18432, 58 MoE of 256 + 1
#       experts, vocabulary 129280)
#   BENCH_MOE_ARCH=qwen3_5_moe   two Qwen3.5/3.6-35B-A3B layers
#       (Qwen3_5MoeForConditionalGeneration, no MTP layer): layer 0 Gated
#       DeltaNet (16 key / 32 value heads of 128), layer 1 gated full
#       attention (16 query / 2 key-value heads of 256), hidden 2048, each
#       with 16 experts of 512 (top 8) + a shared expert of 512; the 35B-A3B
#       projected (40 layers: 30 Gated DeltaNet + 10 full attention, 256 + 1
#       experts, vocabulary 248320)
#   BENCH_MOE_ARCH=glm_moe_dsa   one GLM-5 MoE layer (GlmMoeDsaForCausalLM):
#       hidden 6144, 64 heads of MLA (q_lora 2048, kv_lora 512, qk_nope 192,
#       qk_rope 64, v 256), the indexer's 32 heads of 128 (index_topk 2048),
#       8 experts of 2048 (top 8) + 1 shared; the 745B projected (78 layers:
#       3 dense of 12288, 75 MoE of 256 + 1 experts, vocabulary 154880)
#   BENCH_MOE_HIDDEN/INTER/EXPERTS/HEADS  the layer's widths (the family's
#       above); BENCH_MOE_LIN_HEADS (qwen3_5_moe: the Gated DeltaNet's key
#       and value heads, 16,32) and BENCH_MOE_INDEX_HEADS (glm_moe_dsa: the
#       indexer's, 32); other widths than the real ones make the run
#       SCALED, and it says so
#   BENCH_MOE_TINY_ONLY=1        only the tiny model
# Each layer's share: the capture's seconds (hessian-capture's --timing
# files) and the encodes' (trellis-encode's timing metadata) summed per
# layer, both process wall time. The projection, on 2, 16 and 64 cores:
# each kind of layer of the whole model at this run's CPU seconds per
# weight of its measured layer (the run's CPU seconds split by the layers'
# shares; a lower bound that assumes the work spreads over the cores); its
# memory from the bound of exl3kit(7), PERFORMANCE (2 x (the head F32 + its
# Hessian F64) + the calibration's hidden states + a constant) and its peak
# disk from the formula of SIZES AND THE DRY RUN (the output + the Hessian
# files (F32) of two MoE layers + the hidden states).
# Cost: the DeepSeek V3 layer ~570 M weights (6324 CPU s on a 2-core AMD box
# whose Viterbi ran at 134k weights/s), the GLM-5 layer ~500 M, the Qwen pair
# ~170 M; the scaled runs of 2026-12-07 ~60k weights per CPU s on a host whose
# Viterbi ran at 48-66k. Scale it down (e.g. BENCH_MOE_HIDDEN=256 BENCH_MOE_INTER=64
# BENCH_MOE_HEADS=4) to try it; exl3kit(7), PERFORMANCE, has the runs. The
# baseline, measured in the same run before and after each conversion (the
# higher taken): tests/bench/viterbi's best-path rate at this K per core on
# CPU time, against each conversion's weights per CPU second ("% of
# Viterbi": what the whole conversion keeps of the encoder's speed).
# Prints tables and one JSON line per model and projection. No target: the
# figures are the result.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export PATH="$root/bin:$root/pipelines:$PATH" LC_ALL=C
B=${BENCH_BITS:-3} R=${BENCH_ROWS:-16} C=${BENCH_COLS:-512}
A=${BENCH_MOE_ARCH:-deepseek_v3}
case $A in
deepseek_v3) dH=7168 dMI=2048 dE=8 dNH=128 ;;
qwen3_5_moe) dH=2048 dMI=512 dE=16 dNH=16 ;;
glm_moe_dsa) dH=6144 dMI=2048 dE=8 dNH=64 ;;
*) echo "moe-layer.sh: BENCH_MOE_ARCH '$A' is not deepseek_v3, qwen3_5_moe or glm_moe_dsa" >&2; exit 2 ;;
esac
H=${BENCH_MOE_HIDDEN:-$dH} MI=${BENCH_MOE_INTER:-$dMI} E=${BENCH_MOE_EXPERTS:-$dE} NH=${BENCH_MOE_HEADS:-$dNH}
LH=${BENCH_MOE_LIN_HEADS:-16,32} IH=${BENCH_MOE_INDEX_HEADS:-32}
K=$((E < 8 ? E : 8))
real=$([ "$H" = "$dH" ] && [ "$MI" = "$dMI" ] && [ "$NH" = "$dNH" ] && [ "$LH" = 16,32 ] && [ "$IH" = 32 ] && echo 1 || echo 0)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/x3bench.XXXXXX"); trap '[ -n "${BENCH_KEEP:-}" ] || rm -rf "$tmp"' EXIT
cores=$(nproc)
# the baseline: the Viterbi alone, this K, best path, per core on CPU time;
# measured before and after each conversion, the higher taken (on a shared
# host a few seconds of it can fall on a busier moment than the conversion)
viterbi() { "$root/tests/bench/viterbi" -K "$B" -R -r 3 | grep '^{' | tail -1 | jq -r --arg k "$B" '.K[$k].wps_core'; }
vit_before=$(viterbi)

# family FAMILY DIR LAYERS HIDDEN INTER: make the model (tiny without more
# options, the real-width layer(s) with the widths above), its context long
# enough for the calibration
family() {
	local a=$1 d=$2 l=$3 h=$4 i=$5 big=$6 o=()
	case $a in
	deepseek_v3) [ "$big" = 0 ] || o=(--no-mtp --experts "$E" --top-k "$K" --groups 1,1 --moe-inter "$MI" --q-lora 1536 --kv-lora 512
		--mla-dims 128,64,128 --heads "$NH" --kv-heads "$NH" --dense-first 0) ;;
	qwen3_5_moe) o=(--no-mtp --interval 2)
		[ "$big" = 0 ] || o+=(--experts "$E" --top-k "$K" --moe-inter "$MI" --shared-inter "$MI" --lin-heads "$LH"
			--lin-dims 128,128 --head-dim 256 --heads "$NH" --kv-heads 2) ;;
	glm_moe_dsa) [ "$big" = 0 ] || o=(--no-mtp --experts "$E" --top-k "$K" --moe-inter "$MI" --q-lora 2048 --kv-lora 512
		--mla-dims 192,64,256 --heads "$NH" --kv-heads "$NH" --index-dims "$IH",128 --index-topk 2048 --dense-first 0) ;;
	esac
	"$root/examples/make-tiny-llama" --arch "$a" "${o[@]}" "$d" "$l" "$h" "$i" >/dev/null
	jq --argjson c "$C" 'def ctx: .max_position_embeddings = ([.max_position_embeddings, $c] | max);
		if .text_config then .text_config |= ctx else ctx end' "$d/config.json" >"$tmp/cfg" && mv "$tmp/cfg" "$d/config.json"
}

# run NAME MODEL: convert it, sampling the work directory's size; sets
# wall cpu kb peak_disk out_bytes weights, and writes NAME.layers: per
# layer its weights, capture and encode seconds
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
	vit_after=$(viterbi)
	vit_core=$(awk -v a="$vit_before" -v b="$vit_after" 'BEGIN { print (a > b ? a : b) }')
	cpu=$(awk -v u="$us" -v s="$ss" 'BEGIN { printf "%.2f", u + s }')
	peak_disk=$(cat "$tmp/$name.disk" 2>/dev/null || echo 0)
	out_bytes=$(du -sb "$out" | cut -f1)
	tensor-ls --linears "$m" | jq -r '"w \(.key) \(.layer) \(.shape[0] * .shape[1])"' >"$tmp/$name.keys"
	weights=$(awk '{ s += $4 } END { print s }' "$tmp/$name.keys")
	# the work directory keeps every encode (its timing metadata) and
	# every capture's --timing file
	tensor-ls "$work"/enc/*.frames | jq -r 'select(.meta.role == "trellis" and .meta.seconds != null) | "e \(.meta.key) \(.meta.seconds)"' >"$tmp/$name.enc"
	jq -r '"c \(.layers[0]) \(.seconds)"' "$work"/timing/*.json >"$tmp/$name.cap"
	awk '$1 == "w" { layer[$2] = $3; w[$3] += $4; L[$3] = 1 }
		$1 == "e" { if ($2 in layer) enc[layer[$2]] += $3 }
		$1 == "c" { cap[$2] += $3 }
		END { for (l in L) printf "%d %d %.1f %.1f\n", l, w[l], cap[l], enc[l] }' \
		"$tmp/$name.keys" "$tmp/$name.enc" "$tmp/$name.cap" | sort -n >"$tmp/$name.layers"
	pct=$(awk -v w="$weights" -v c="$cpu" -v v="$vit_core" 'BEGIN { printf "%.1f", (c > 0 && v > 0 ? 100 * w / c / v : 0) }')
	printf '%-6s %12s %9s %9s %10s %12s %12s %10s %8.0fk %8.0fk\n' "$name" "$weights" "$wall" "$cpu" "$((kb / 1024))" \
		"$((peak_disk / 1048576))" "$((out_bytes / 1048576))" "$pct" "$(awk -v v="$vit_before" 'BEGIN { print v / 1000 }')" \
		"$(awk -v v="$vit_after" 'BEGIN { print v / 1000 }')"
	echo "{\"bench\":\"moe-layer\",\"arch\":\"$A\",\"model\":\"$name\",\"real_widths\":$([ "$name" = tiny ] || [ "$real" = 0 ] && echo false || echo true),\"bits\":$B,\"rows\":$R,\"cols\":$C,\"cores\":$cores,\"weights\":$weights,\"wall_s\":$wall,\"cpu_s\":$cpu,\"peak_rss_kib\":$kb,\"peak_work_bytes\":$peak_disk,\"out_bytes\":$out_bytes,\"viterbi_weights_per_core_s\":$vit_core,\"viterbi_before\":$vit_before,\"viterbi_after\":$vit_after,\"pct_of_viterbi\":$pct,\"layers\":$(jq -Rsc 'split("\n") | map(select(length > 0) | split(" ") | {layer: (.[0] | tonumber), weights: (.[1] | tonumber), capture_s: (.[2] | tonumber), encode_s: (.[3] | tonumber)})' "$tmp/$name.layers")}" >>"$tmp/json"
	vit_before=$vit_after   # the next conversion's baseline before it
}

# by_layer NAME: each layer's weights, capture and encode seconds, share
by_layer() {
	awk -v cpu="$cpu" '{ l[NR] = $0; t += $3 + $4 } END {
		printf "  %-6s %12s %10s %10s %8s %12s\n", "layer", "weights", "capture_s", "encode_s", "share", "cpu_s_est"
		for (i = 1; i <= NR; i++) { split(l[i], f, " "); s = t > 0 ? (f[3] + f[4]) / t : 0
			printf "  %-6s %12d %10.1f %10.1f %7.1f%% %12.1f\n", f[1], f[2], f[3], f[4], 100 * s, s * cpu } }' "$tmp/$1.layers"
}

name=$(case $A in deepseek_v3) echo "DeepSeek V3" ;; qwen3_5_moe) echo "Qwen3.5-MoE" ;; glm_moe_dsa) echo "GLM-5" ;; esac)
family "$A" "$tmp/tiny" 2 64 96 0
echo "$name conversions at $B bpw, -j 2, calibration $R x $C, $cores cores"
echo "baseline: the Viterbi alone at K=$B, weights/s per core (CPU time), before and after each conversion; % of the higher"
printf '%-6s %12s %9s %9s %10s %12s %12s %10s %9s %9s\n' model weights wall_s cpu_s rss_MiB work_peak_MiB out_MiB pct_of_vit vit_before vit_after
run tiny "$tmp/tiny"
if [ -z "${BENCH_MOE_TINY_ONLY:-}" ]; then
	nl=$([ "$A" = qwen3_5_moe ] && echo 2 || echo 1)
	family "$A" "$tmp/layer" "$nl" "$H" "$((MI * 9))" 1
	run layer "$tmp/layer"
	echo
	echo "per layer (process wall seconds summed; the run's CPU seconds split by share; the rest is the head):"
	by_layer layer
	# the whole model: each kind of layer at its measured layer's CPU
	# seconds per weight (its share of the run's CPU seconds), the real
	# model's weights per kind
	awk -v cpu="$cpu" -v R="$R" -v C="$C" -v B="$B" -v kb="$kb" -v real="$real" -v A="$A" '
	NR == FNR { lw[$1] = $2; t += $3 + $4; ls[$1] = $3 + $4; next }
	END {
		for (l in lw) spw[l] = t > 0 && lw[l] > 0 ? cpu * ls[l] / t / lw[l] : 0
		if (A == "deepseek_v3") {
			model = "DeepSeek-V3-671B"; h = 7168; mi = 2048; V = 129280; nexp = 256
			attn = h * 1536 + 1536 * 128 * 192 + h * 576 + 128 * 128 * h
			moe = attn + 257 * 3 * h * mi; dense = attn + 3 * h * 18432
			n = split("58 3", cnt, " "); split("0 0", of, " "); w[1] = moe; w[2] = dense; kind[1] = "MoE"; kind[2] = "dense"
			nmoe = 58
			hl = 257 * (h * h + mi * mi) + h * h + 1536 * 1536 + 16384 * 16384
		} else if (A == "glm_moe_dsa") {
			model = "GLM-5-745B"; h = 6144; mi = 2048; V = 154880; nexp = 256
			attn = h * 2048 + 64 * 256 * 2048 + h * 576 + 64 * 256 * h + 32 * 128 * 2048
			moe = attn + 257 * 3 * h * mi; dense = attn + 3 * h * 12288
			n = split("75 3", cnt, " "); split("0 0", of, " "); w[1] = moe; w[2] = dense; kind[1] = "MoE"; kind[2] = "dense"
			nmoe = 75
			hl = 257 * (h * h + mi * mi) + h * h + 2048 * 2048 + 16384 * 16384
		} else {
			model = "Qwen3.5/3.6-35B-A3B"; h = 2048; mi = 512; V = 248320; nexp = 256
			ex = 257 * 3 * h * mi
			gdn = 2 * 16 * 128 * h + 32 * 128 * h + 32 * 128 * h + h * 32 * 128 + ex
			full = 16 * 256 * 2 * h + 2 * 2 * 256 * h + h * 16 * 256 + ex
			n = split("30 10", cnt, " "); split("0 1", of, " "); w[1] = gdn; w[2] = full; kind[1] = "GDN"; kind[2] = "full"
			nmoe = 40
			hl = 257 * (h * h + mi * mi) + h * h + 4096 * 4096
		}
		total = 0; tcpu = 0
		for (i = 1; i <= n; i++) { total += cnt[i] * w[i]; tcpu += cnt[i] * w[i] * spw[of[i]] }
		all = total + nmoe * nexp * h + 2 * V * h
		printf "\n%s, projected from this run (%s):\n", model, real ? "real widths" : "SCALED-DOWN layers: not the real widths"
		for (i = 1; i <= n; i++)
			printf "  %3d %-5s layers of %.2f G weights at %.3g CPU s per weight (layer %d of this run): %.0f CPU h\n", cnt[i], kind[i], w[i] / 1e9, spw[of[i]], of[i], cnt[i] * w[i] * spw[of[i]] / 3600
		printf "  decoder linears %.1f G weights, all parameters %.1f G\n", total / 1e9, all / 1e9
		printf "  %-8s %12s\n", "cores", "hours"
		split("2 16 64", nc, " ")
		for (i = 1; i <= 3; i++) { hr = tcpu / nc[i] / 3600; printf "  %-8d %12.2f\n", nc[i], hr; js = js sprintf("%s{\"cores\":%d,\"hours\":%.2f}", i > 1 ? "," : "", nc[i], hr) }
		# memory: the bound of exl3kit(7), 2 x (the largest weight F32,
		# the head, + its Hessian F64) + hidden states + 64 MiB; the
		# capture of a MoE layer holds one expert at a time, far below it
		mem = 2 * (V * h * 4 + h * h * 8) + R * C * h * 4 + 64 * 1048576
		# disk: the output (B bits a decoder weight, the head at 6, the
		# embedding 16, the routers 16) + two MoE layers of Hessian files
		# (F32, in^2 x 4 a group: per expert its gate/up input h x h and its
		# down input mi x mi, and the attention inputs) + hidden states x 2
		outb = total * B / 8 + V * h * (6 + 16) / 8 + nmoe * nexp * h * 2
		disk = outb + 2 * hl * 4 + 2 * R * C * h * 4
		printf "  memory bound %.1f GiB (measured here: largest process %.2f GiB)\n", mem / 2^30, kb / 2^20
		printf "  peak disk %.0f GiB = output %.0f GiB + two MoE layers of Hessians %.0f GiB + hidden states\n", disk / 2^30, outb / 2^30, 2 * hl * 4 / 2^30
		printf "{\"bench\":\"moe-layer-projection\",\"arch\":\"%s\",\"model\":\"%s\",\"real_widths\":%s,\"cpu_s\":%.0f,\"decoder_weights\":%.0f,\"projection\":[%s],\"memory_bytes\":%.0f,\"peak_disk_bytes\":%.0f}\n", A, model, real ? "true" : "false", tcpu, total, js, mem, disk > "/dev/stderr"
	}' "$tmp/layer.layers" 2>>"$tmp/json"
fi
echo
cat "$tmp/json"
