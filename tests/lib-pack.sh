# tests/lib-pack.sh: synthetic models and EXL3 frames for the pack-write
# tests (sourced after tests/lib.sh). Everything is seeded.

# gen_model DIR LAYERS TIED BIAS [DTYPE]: a tiny Llama-family source model
# (hidden 64, intermediate 96, 4 heads, 2 KV heads, vocab 256)
gen_model() {
	local d=$1 L=$2 tied=$3 bias=$4 dt=${5:-F32} l p
	mkdir -p "$d"
	cat >"$d/config.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
 "intermediate_size": 96, "num_hidden_layers": $L, "num_attention_heads": 4,
 "num_key_value_heads": 2, "vocab_size": 256, "tie_word_embeddings": $tied,
 "torch_dtype": "float32"}
EOF
	local a=(model.embed_tokens.weight=256x64)
	for ((l = 0; l < L; l++)); do
		p=model.layers.$l
		a+=("$p.input_layernorm.weight=64" "$p.self_attn.q_proj.weight=64x64"
		    "$p.self_attn.k_proj.weight=32x64" "$p.self_attn.v_proj.weight=32x64"
		    "$p.self_attn.o_proj.weight=64x64" "$p.post_attention_layernorm.weight=64"
		    "$p.mlp.gate_proj.weight=96x64" "$p.mlp.up_proj.weight=96x64"
		    "$p.mlp.down_proj.weight=64x96")
		if [ "$bias" = 1 ]; then
			a+=("$p.self_attn.q_proj.bias=64" "$p.self_attn.k_proj.bias=32" "$p.self_attn.v_proj.bias=32")
		fi
	done
	a+=(model.norm.weight=64)
	[ "$tied" = true ] || a+=(lm_head.weight=256x64)
	tensor-gen -t "$dt" -s 1 "${a[@]}" | tensor-cat -q -o "$d/model.safetensors" -
	echo '{"model": "tiny"}' >"$d/tokenizer.json"
	echo '{"bos_token": "<s>"}' >"$d/tokenizer_config.json"
	echo 'not weights' >"$d/pytorch_model.bin"
}

pad128() { echo $((($1 + 127) / 128 * 128)); }

# gen_linear KEY IN OUT K CB [SEED]: the frames of one EXL3 linear
gen_linear() {
	local key=$1 k n s=${6:-7}
	k=$(pad128 "$2")
	n=$(pad128 "$3")
	tensor-gen -t I16 -d uniform --scale 30000 -s "$s" --meta K="$4" \
		"$key.trellis=$((k / 16))x$((n / 16))x$((16 * $4))"
	tensor-gen -t F16 -s "$s" "$key.suh=$k" "$key.svh=$n"
	case $5 in
	mul1) tensor-gen -t I32 -d constant --value -2082680531 "$key.mul1=scalar" ;;
	mcg) tensor-gen -t I32 -d constant --value -877912083 "$key.mcg=scalar" ;;
	esac
}

# LINEARS: "suffix in out" of the tiny model's decoder linears
LINEARS="self_attn.q_proj 64 64
self_attn.k_proj 64 32
self_attn.v_proj 64 32
self_attn.o_proj 64 64
mlp.gate_proj 64 96
mlp.up_proj 64 96
mlp.down_proj 96 64"

# gen_quant LAYERS K CB [SKIP]: every decoder linear at K (a plan file
# {"tensors": {key: K}} instead of a number gives per-tensor K); SKIP names
# one linear to leave out
gen_quant() {
	local L=$1 K=$2 cb=$3 skip=${4:-} l s i o k
	for ((l = 0; l < L; l++)); do
		while read -r s i o; do
			[ "model.layers.$l.$s" = "$skip" ] && continue
			k=$K
			[ -f "$K" ] && k=$(jq -r --arg t "model.layers.$l.$s" '.tensors[$t]' "$K")
			gen_linear "model.layers.$l.$s" "$i" "$o" "$k" "$cb" $((l * 10 + ${#s}))
		done <<<"$LINEARS"
	done
}

# gen_measure LAYERS: trellis-encode --measure style lines for K 1..8
gen_measure() {
	awk -v L="$1" -v lin="$LINEARS" 'BEGIN {
		srand(11); n = split(lin, a, "\n")
		for (l = 0; l < L; l++) for (j = 1; j <= n; j++) {
			split(a[j], f, " "); s = 0.5 + 2 * rand()
			for (K = 1; K <= 8; K++)
				printf "{\"tensor\": \"model.layers.%d.%s\", \"K\": %d, \"proxy_err\": %.6g, \"numel\": %d}\n",
					l, f[1], K, s * exp(-1.386 * K) * (0.9 + 0.2 * rand()), f[2] * f[3]
		}
	}'
}

# no_leftovers DIR NAME: nothing named NAME.tmp-* or NAME.old-* in DIR
no_leftovers() { ! ls -d "$1/$2".tmp-* "$1/$2".old-* >/dev/null 2>&1; }

# jqt ARGS...: jq -e quietly (true iff the last output is neither false nor null)
jqt() { jq -e "$@" >/dev/null; }
