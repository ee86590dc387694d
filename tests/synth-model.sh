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
 "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu"$extra}
JSON
}
# synth_tokens FILE ROWS COLS VOCAB [SEED]: uniform random token ids (I32)
synth_tokens() {
	tensor-gen -s "${5:-1}" -d uniform -t I32 --mean $(( $4 / 2 )) --scale $(( $4 / 2 - 1 )) \
		"tokens=$2x$3" > "$1"
}
