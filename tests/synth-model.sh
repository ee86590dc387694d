# tests/synth-model.sh: a seeded synthetic Llama-family model for tests and
# benchmarks, made with tensor-gen and tensor-cat (sourced; needs bin/ on PATH).
# synth_model DIR HIDDEN INTER LAYERS HEADS KV VOCAB [SEED [ARCH [EXTRA_JSON]]]
synth_model() {
	local dir=$1 h=$2 i=$3 n=$4 nh=$5 nkv=$6 v=$7 seed=${8:-1} arch=${9:-LlamaForCausalLM}
	local extra=${10:-} hd=$(( $2 / $5 )) l w=() one=()
	for ((l = 0; l < n; l++)); do
		local p=model.layers.$l
		w+=("$p.self_attn.q_proj.weight=$((nh * hd))x$h" "$p.self_attn.k_proj.weight=$((nkv * hd))x$h"
		    "$p.self_attn.v_proj.weight=$((nkv * hd))x$h" "$p.self_attn.o_proj.weight=${h}x$((nh * hd))"
		    "$p.mlp.gate_proj.weight=${i}x$h" "$p.mlp.up_proj.weight=${i}x$h" "$p.mlp.down_proj.weight=${h}x$i")
		one+=("$p.input_layernorm.weight=$h" "$p.post_attention_layernorm.weight=$h")
	done
	mkdir -p "$dir" || return 1
	{ tensor-gen -s "$seed" --scale 0.5 "model.embed_tokens.weight=${v}x$h" &&
	  tensor-gen -s "$seed" --scale "$(awk -v h="$h" 'BEGIN { print 1 / sqrt(h) }')" "${w[@]}" &&
	  tensor-gen -d constant --value 1 "${one[@]}" "model.norm.weight=$h"; } |
		tensor-cat -q - -o "$dir/model.safetensors" || return 1
	cat > "$dir/config.json" <<JSON
{"architectures": ["$arch"], "hidden_size": $h, "intermediate_size": $i,
 "num_hidden_layers": $n, "num_attention_heads": $nh, "num_key_value_heads": $nkv,
 "vocab_size": $v, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
 "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu",
 "bos_token_id": 1, "eos_token_id": 2$extra}
JSON
}
# synth_tokens FILE ROWS COLS VOCAB [SEED]: uniform random token ids (I32)
synth_tokens() {
	tensor-gen -s "${5:-1}" -d uniform -t I32 --mean $(( $4 / 2 )) --scale $(( $4 / 2 - 1 )) \
		"tokens=$2x$3" > "$1"
}
# synth_exl3 SRC DST K: an EXL3 directory with SRC's embedding and norms and
# every linear replaced by a random EXL3 linear at K bits (random trellis,
# random F16 suh/svh; sizes padded to 128), config marked quantized.
synth_exl3() {
	local src=$1 dst=$2 K=$3 key in out k n args=() svs=()
	mkdir -p "$dst" || return 1
	while read -r key out in; do
		k=$(( (in + 127) / 128 * 128 )) n=$(( (out + 127) / 128 * 128 ))
		args+=("$key.trellis=$((k / 16))x$((n / 16))x$((16 * K))")
		svs+=("$key.suh=$k" "$key.svh=$n")
	done < <(tensor-ls "$src" | jq -r 'select(.name | test("_proj.weight$")) |
		"\(.name | sub(".weight$"; "")) \(.shape[0]) \(.shape[1])"')
	{ tensor-cat "$src" '*norm*' 'model.embed_tokens.weight' &&
	  tensor-gen -s 5 -d uniform -t I16 --scale 32767 "${args[@]}" &&
	  tensor-gen -s 6 -t F16 --scale 0.05 "${svs[@]}"; } |
		tensor-cat -q - -o "$dst/model.safetensors" || return 1
	jq '. + {quantization_config: {quant_method: "exl3", bits: '"$K"'}}' "$src/config.json" \
		> "$dst/config.json"
}
# synth_dequant EXL3DIR DST: the same model with dense F32 weights from
# exl3-matmul --dequant (the reference for the EXL3 forward)
synth_dequant() {
	local q=$1 dst=$2 key in out
	mkdir -p "$dst" || return 1
	{ tensor-cat "$q" '*norm*' 'model.embed_tokens.weight' &&
	  tensor-ls "$q" | jq -r 'select(.name | test(".trellis$")) | .name | sub(".trellis$"; "")' |
	  while read -r key; do
		case $key in
		*q_proj|*k_proj|*v_proj|*gate_proj|*up_proj) in=$(jq .hidden_size "$q/config.json") ;;
		*o_proj) in=$(jq '.num_attention_heads * (.hidden_size / .num_attention_heads)' "$q/config.json") ;;
		*down_proj) in=$(jq .intermediate_size "$q/config.json") ;;
		esac
		case $key in
		*q_proj) out=$(jq '.num_attention_heads * (.hidden_size / .num_attention_heads)' "$q/config.json") ;;
		*k_proj|*v_proj) out=$(jq '.num_key_value_heads * (.hidden_size / .num_attention_heads)' "$q/config.json") ;;
		*o_proj|*down_proj) out=$(jq .hidden_size "$q/config.json") ;;
		*gate_proj|*up_proj) out=$(jq .intermediate_size "$q/config.json") ;;
		esac
		exl3-matmul -q --model "$q" --tensor "$key" --in "$in" --out "$out" --dequant || return 1
	  done; } | tensor-cat -q - -o "$dst/model.safetensors" || return 1
	jq 'del(.quantization_config)' "$q/config.json" > "$dst/config.json"
}
