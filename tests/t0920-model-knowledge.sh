#!/usr/bin/env bash
# t0920-model-knowledge: what a model is made of lives in one place, the
# library's architecture tables (lib/arch/arch_tables.c, printed by tensor-ls
# --linears/--modules/--config). The rule checked here: the programs'
# sources (bin/) and the pipelines (pipelines/) name no module (q_proj,
# lm_head, embed_tokens, self_attn, model.layers, ...), no architecture
# (...ForCausalLM) and no config.json shape field (hidden_size, head_dim,
# tie_word_embeddings, text_config, ...) outside comments and their usage
# and help texts, where naming them as examples is documentation.
. "$(dirname "$0")/lib.sh"

WORDS='(^|[^A-Za-z0-9_])(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|qkv_proj|gate_up_proj|lm_head|embed_tokens'
WORDS+='|layernorm|self_attn|model\.layers|ForCausalLM|ForConditionalGeneration|hidden_size|intermediate_size'
WORDS+='|num_attention_heads|num_key_value_heads|num_hidden_layers|vocab_size|head_dim|tie_word_embeddings'
WORDS+='|text_config|num_experts|num_local_experts|n_routed_experts)'

# code of a C file: comments, the usage[] string and help() removed
c_code() {
	awk '
	BEGIN { st = 0 }   # 0 code, 1 block comment, 2 string, 3 char
	{
		out = ""; n = length($0)
		for (i = 1; i <= n; i++) {
			c = substr($0, i, 1); d = substr($0, i, 2)
			if (st == 1) { if (d == "*/") { st = 0; i++ } continue }
			if (st == 2) { out = out c; if (c == "\\") { out = out substr($0, ++i, 1) } else if (c == "\"") st = 0; continue }
			if (st == 3) { out = out c; if (c == "\\") { out = out substr($0, ++i, 1) } else if (c == "'\''") st = 0; continue }
			if (d == "/*") { st = 1; i++; continue }
			if (d == "//") break
			if (c == "\"") st = 2
			else if (c == "'\''") st = 3
			out = out c
		}
		if (st >= 2) st = 0   # an unterminated literal ends with its line
		print out
	}' "$1" |
	awk '/^static const char usage\[\]/ { skip = 1 } /^static void help\(void\)/ { skip = 2 }
	     skip == 1 { if (/;[[:space:]]*$/) skip = 0; next }
	     skip == 2 { if (/^}/) skip = 0; next }
	     { print }'
}
# code of a shell script: comments and the usage=/help= texts removed
sh_code() {
	awk '/^(usage|help)="/ { if (!/^(usage|help)=".*"$/ || /^(usage|help)="$/) skip = 1; next }
	     skip { if (/"$/) skip = 0; next }
	     { sub(/(^|[[:space:]])#.*$/, ""); print }' "$1"
}

hits=
for f in "$ROOT"/bin/*.c "$ROOT"/bin/*.h; do
	h=$(c_code "$f" | grep -nE -- "$WORDS" | sed "s|^|${f#"$ROOT"/}:|")
	hits+=${h:+$h$'\n'}
done
for f in "$ROOT"/pipelines/*; do
	h=$(sh_code "$f" | grep -nE -- "$WORDS" | sed "s|^|${f#"$ROOT"/}:|")
	hits+=${h:+$h$'\n'}
done
if [ -z "$hits" ]; then ok "bin/ and pipelines/ name no module, architecture or config shape field"
else notok "bin/ and pipelines/ name no module, architecture or config shape field"; printf '%s' "$hits" | head -20 | sed 's/^/#   /'; fi

# the strippers themselves: a name in code is found, in a comment or the
# help text it is not
cat >"$TMP/x.c" <<'C'
/* q_proj in a comment */
static const char usage[] =
	"usage: x [lm_head]\n";
static void help(void)
{
	printf("hidden_size\n");
}
int f(void) { return g("model.embed_tokens.weight"); } // self_attn
C
check "the C check finds a name in code, not in comments or help" \
	test "$(c_code "$TMP/x.c" | grep -cE -- "$WORDS")" = 1
cat >"$TMP/x.sh" <<'SH'
usage="usage: x [--head lm_head]"
help="Convert a LlamaForCausalLM
  --bits B  of q_proj"
# hidden_size in a comment
echo "$n" # vocab_size
jq -r .num_hidden_layers "$cfg"
SH
check "the shell check finds a name in code, not in comments or help" \
	test "$(sh_code "$TMP/x.sh" | grep -cE -- "$WORDS")" = 1

# the description answers what the scripts used to compute
if have_shared; then
	M=$SHARED/models/stories260K
	check "tensor-ls --linears: 7 linears per layer and the head (stories260K: 36)" \
		test "$(tensor-ls --linears "$M" | wc -l)" = 36
	check "tensor-ls --linears: the tied head reads the embedding, group lm_head.input, layer 5" \
		test "$(tensor-ls --linears "$M" | jq -c 'select(.role == "head") | [.key, .weight, .group, .layer, .tied]')" = \
		'["lm_head","model.embed_tokens.weight","lm_head.input",5,true]'
	check "tensor-ls --linears: down_proj 64x172, padded 128x256, its own group" \
		test "$(tensor-ls --linears "$M" | jq -c 'select(.key == "model.layers.4.mlp.down_proj") | [.shape, .padded, .group, .role, .hq]')" = \
		'[[64,172],[128,256],"model.layers.4.mlp.down_proj.input","mlp",0]'
	check "tensor-ls --modules: the norms and the embedding are passed through" \
		test "$(tensor-ls --modules "$M" | jq -r 'select(.quantized | not) | .role' | sort | uniq -c | tr -s ' ' | paste -sd,)" = ' 1 embedding, 11 norm'
	check "tensor-ls --config: layers, vocab, max_position_embeddings, tied" \
		test "$(tensor-ls --config "$M" | jq -c '[.architecture, .layers, .vocab, .max_position_embeddings, .tied, .linears]')" = \
		'["LlamaForCausalLM",5,512,512,true,36]'
else
	for i in 1 2 3 4 5; do skip "tensor-ls --linears on stories260K: not in ../shared"; done
fi
# the checks of a dense model's tensors (tensor-ls reads no weight payload)
. "$(dirname "$0")/lib-convert.sh"
(cd "$TMP" && tiny_model m 1)
check "tensor-ls --linears on a well-formed model" sh -c 'tensor-ls --linears "$1" >/dev/null' sh "$TMP/m"
mkdir "$TMP/norm"
cp "$TMP/m/config.json" "$TMP/norm/"
{ tensor-cat -q "$TMP/m" $(tensor-ls "$TMP/m" | jq -r '.name' | grep -v '^model.layers.0.input_layernorm.weight$')
  tensor-gen model.layers.0.input_layernorm.weight=63; } | tensor-cat -q -o "$TMP/norm/model.safetensors" -
check_fail "a norm of the wrong length is named with both shapes" 1 \
	"tensor 'model.layers.0.input_layernorm.weight': shape 63, config says 64" tensor-ls --linears "$TMP/norm"
check "tensor-ls --architectures: one line per table entry, Llama and a MoE family among them" \
	test "$(tensor-ls --architectures | jq -r 'select(.architecture == "LlamaForCausalLM" and (.moe | not)), select(.moe) | .family' | head -2 | paste -sd,)" = "Llama,Mixtral"
check "convert -h lists what tensor-ls --architectures lists" \
	test "$(convert -h | sed -n '/^Architectures:/,$p' | tail -n +2 | tr -s ' \n' '\n\n' | grep . | sort | paste -sd,)" = \
	"$(tensor-ls --architectures | jq -r .architecture | sort | paste -sd,)"
check_fail "--architectures takes no SOURCE" 2 "takes no SOURCE" tensor-ls --architectures x
check_fail "tensor-ls --linears takes one MODEL" 2 "one MODEL directory" tensor-ls --linears
check_fail "--linears and --stats exclude each other" 2 "--stats" tensor-ls --linears --stats x
done_testing
