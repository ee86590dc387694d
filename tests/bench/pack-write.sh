#!/usr/bin/env bash
# bench/pack-write: throughput of pack-write on a synthetic 4-layer model
# (hidden 2048, intermediate 5632, K=4, ~90 MB of EXL3 tensors), frames in
# reverse model order so the spool is exercised, against cat of the same
# bytes in the same run. Bytes written: write(2) bytes of the process and
# its children (wchar of /proc/self/io, which a shell's children add to
# when reaped), and what reached the filesystem (write_bytes; 0 on tmpfs).
# PACK_WRITE=path measures another build. Prints a table and JSON lines.
set -euo pipefail
ROOT=${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
PATH="$ROOT/bin:$PATH"
T=$(mktemp -d "${TMPDIR:-/tmp}/x3bench.XXXXXX")
trap 'rm -rf "$T"' EXIT
cd "$T"
L=4 H=2048 KV=512 I=5632 V=8192 K=4
mkdir src
echo "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": $H, \"intermediate_size\": $I, \"num_hidden_layers\": $L, \"num_attention_heads\": 16, \"num_key_value_heads\": 4, \"vocab_size\": $V, \"tie_word_embeddings\": false}" >src/config.json
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
pw=${PACK_WRITE:-pack-write}
# io FIELD: this shell's (and its reaped children's) counter, no child of its own
io() { local k v; while read -r k v; do [ "$k" = "$1:" ] && { echo "$v"; return; }; done </proc/$$/io; }
# run NAME CMD...: seconds, write(2) bytes and write_bytes of CMD
run() {
	local name=$1 w0 b0 t0 t1; shift
	sync; w0=$(io wchar) b0=$(io write_bytes) t0=$(date +%s.%N)
	"$@"
	sync; t1=$(date +%s.%N)
	r_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b - a}')
	r_w=$(( $(io wchar) - w0 )) r_b=$(( $(io write_bytes) - b0 ))
}
run cat sh -c 'cat q.frames >cat.out'
cat_s=$r_s cat_w=$r_w cat_b=$r_b
rm -f cat.out
run pack-write sh -c "$pw -q --model src --passthrough --head-bits 16 --shard-size 40 out <q.frames"
outb=$(du -sb out | cut -f1)
outmb=$((outb / 1000000))
shards=$(ls out/*.safetensors | wc -l)
sb=$(stat -c %s q.frames)
printf '%-10s %10s %10s %8s %8s %10s %12s %10s %14s\n' bench stream_MB out_MB shards seconds MB/s written_MB x_output disk_written_MB
printf '%-10s %10d %10s %8s %8.2f %10.1f %12.1f %10.2f %14.1f\n' cat "$mb" "$mb" - "$cat_s" \
	"$(awk -v a="$sb" -v b="$cat_s" 'BEGIN{print a/1e6/b}')" "$(awk -v a="$cat_w" 'BEGIN{print a/1e6}')" \
	"$(awk -v a="$cat_w" -v b="$sb" 'BEGIN{print a/b}')" "$(awk -v a="$cat_b" 'BEGIN{print a/1e6}')"
printf '%-10s %10d %10d %8d %8.2f %10.1f %12.1f %10.2f %14.1f\n' pack-write "$mb" "$outmb" "$shards" "$r_s" \
	"$(awk -v a="$outb" -v b="$r_s" 'BEGIN{print a/1e6/b}')" "$(awk -v a="$r_w" 'BEGIN{print a/1e6}')" \
	"$(awk -v a="$r_w" -v b="$outb" 'BEGIN{print a/b}')" "$(awk -v a="$r_b" 'BEGIN{print a/1e6}')"
printf '{"bench": "pack-write", "stream_mb": %d, "out_mb": %d, "shards": %d, "seconds": %.3f, "mb_per_s": %.1f, "written_bytes": %d, "written_per_output_byte": %.3f, "disk_write_bytes": %d, "cat_seconds": %.3f, "cat_mb_per_s": %.1f, "cat_written_bytes": %d, "pct_of_cat": %.1f}\n' \
	"$mb" "$outmb" "$shards" "$r_s" "$(awk -v a="$outb" -v b="$r_s" 'BEGIN{print a/1e6/b}')" "$r_w" \
	"$(awk -v a="$r_w" -v b="$outb" 'BEGIN{print a/b}')" "$r_b" "$cat_s" "$(awk -v a="$sb" -v b="$cat_s" 'BEGIN{print a/1e6/b}')" \
	"$cat_w" "$(awk -v a="$outb" -v b="$r_s" -v c="$sb" -v d="$cat_s" 'BEGIN{print 100 * (a/b) / (c/d)}')"
