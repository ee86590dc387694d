#!/usr/bin/env bash
# bench/pack-write: throughput of pack-write on a synthetic 4-layer model
# (hidden 2048, intermediate 5632, K=4, ~90 MB of EXL3 tensors), frames in
# reverse model order so the spool is exercised. Prints a table and a JSON line.
set -euo pipefail
ROOT=${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
PATH="$ROOT/bin:$PATH"
T=$(mktemp -d "${TMPDIR:-/tmp}/x3bench.XXXXXX")
trap 'rm -rf "$T"' EXIT
cd "$T"
L=4 H=2048 KV=512 I=5632 V=8192 K=4
mkdir src
echo "{\"hidden_size\": $H, \"intermediate_size\": $I, \"num_hidden_layers\": $L, \"num_attention_heads\": 16, \"num_key_value_heads\": 4, \"vocab_size\": $V, \"tie_word_embeddings\": false}" >src/config.json
a=(model.embed_tokens.weight=${V}x$H model.norm.weight=$H lm_head.weight=${V}x$H)
for ((l = 0; l < L; l++)); do a+=(model.layers.$l.input_layernorm.weight=$H model.layers.$l.post_attention_layernorm.weight=$H); done
tensor-gen -t BF16 "${a[@]}" | tensor-cat -q -o src/model.safetensors -
lin() { tensor-gen -t I16 -d uniform --scale 30000 "$1.trellis=$(($2 / 16))x$(($3 / 16))x$((16 * K))"
	tensor-gen -t F16 "$1.suh=$2" "$1.svh=$3"; tensor-gen -t I32 -d constant --value -2082680531 "$1.mul1=scalar"; }
for ((l = L - 1; l >= 0; l--)); do
	p=model.layers.$l
	lin $p.mlp.down_proj $I $H; lin $p.mlp.up_proj $H $I; lin $p.mlp.gate_proj $H $I
	lin $p.self_attn.o_proj $H $H; lin $p.self_attn.v_proj $H $KV; lin $p.self_attn.k_proj $H $KV; lin $p.self_attn.q_proj $H $H
done >q.frames
mb=$(($(stat -c %s q.frames) / 1000000))
t0=$(date +%s.%N)
pack-write -q --model src --passthrough --head-bits 16 --shard-size 40 out <q.frames
t1=$(date +%s.%N)
outmb=$(du -sm out | cut -f1)
shards=$(ls out/*.safetensors | wc -l)
s=$(echo "$t1 - $t0" | awk '{print $1 - $3}')
printf '%-10s %10s %10s %8s %8s %10s\n' bench stream_MB out_MB shards seconds MB/s
printf '%-10s %10d %10d %8d %8.2f %10.1f\n' pack-write "$mb" "$outmb" "$shards" "$s" "$(awk -v a="$outmb" -v b="$s" 'BEGIN{print a/b}')"
printf '{"bench": "pack-write", "stream_mb": %d, "out_mb": %d, "shards": %d, "seconds": %.3f, "mb_per_s": %.1f}\n' \
	"$mb" "$outmb" "$shards" "$s" "$(awk -v a="$outmb" -v b="$s" 'BEGIN{print a/b}')"
