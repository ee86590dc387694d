#!/usr/bin/env bash
# t1862-convert-gemma: tiny seeded Gemma models (examples/make-tiny-llama
# --arch gemma2|gemma3|gemma3-mm: hidden 64, intermediate 80 (not a
# multiple of 128), 4 heads of 24 (head_dim independent of hidden/heads),
# window 32 under rows of 128 tokens, tied heads) described, and Gemma2,
# Gemma3ForCausalLM and Gemma3ForConditionalGeneration converted end to end
# by pipelines/convert
# at two rates: the written directory holds the source's keys (the tied
# head as ExLlamaV3's lm_head key), every norm unquantized, the vision
# tower and the multimodal projector byte for byte; validate accepts each;
# the KL to the original falls as the bits rise and stays below
# round-to-nearest at the same bits.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
mk() { "$ROOT/examples/make-tiny-llama" --arch "$@" >/dev/null; }
mk gemma2 G2 2 64 80
mk gemma3 G3 3 64 80
mk gemma3-mm MM 3 64 80

# the descriptions
for m in G2 G3 MM; do
	check "$m: every module of the description is in the checkpoint" sh -c "tensor-ls --modules $m >/dev/null"
done
check "Gemma2: 2 x 7 linears and the head; 2 x 4 layer norms and the final norm, unquantized" \
	test "$(tensor-ls --config G2 | jq .linears) $(tensor-ls --modules G2 | jq -c 'select(.kind == "vector" and .quantized == false)' | wc -l)" = "15 9"
check "Gemma3: q/k norms of head_dim 24 in every layer" \
	test "$(tensor-ls --modules G3 | jq -c 'select(.key | test("_norm$") and test("self_attn")) | .shape' | sort -u | tr -d '\n')" = "[24]"
check "Gemma2 has no q/k norms" test "$(tensor-ls --modules G2 | jq -r .key | grep -c 'self_attn\.[qk]_norm')" -eq 0
check "the MLP reads pre_feedforward_layernorm's output: gate and up in one group" \
	test "$(tensor-ls --linears G2 | jq -r 'select(.group == "model.layers.1.mlp.input") | .key' | tr '\n' ' ')" = \
	     "model.layers.1.mlp.gate_proj model.layers.1.mlp.up_proj "
check "q_proj: 4 heads of 24 from hidden 64 (96 x 64, padded to 128)" \
	test "$(tensor-ls --linears G2 | jq -c 'select(.key == "model.layers.0.self_attn.q_proj") | [.shape, .padded]')" = '[[96,64],[128,128]]'
check "Gemma3ForConditionalGeneration: the language model under language_model.model., the tied head language_model.lm_head" \
	test "$(tensor-ls --linears MM | jq -r .key | sed -E 's/layers\.[0-9]+\..*/layers/' | sort -u | tr '\n' ' ')" = \
	     "language_model.lm_head language_model.model.layers "
check "... the vision tower and projector are no modules" \
	test "$(tensor-ls --modules MM | jq -r .key | grep -c '^vision_tower\|^multi_modal_projector')" -eq 0
check "... its config read from text_config (3 layers, head 24, tied)" \
	test "$(tensor-ls --config MM | jq -c '[.layers, .head_size, .tied]')" = "[3,24,true]"
check "Gemma3ForCausalLM: model-eval runs it over rows longer than the window" \
	sh -c "model-eval -q --model G3 --text '$ROOT/README.md' --rows 2 --cols 96 | jq -e '.nll > 0' >/dev/null"

for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
ev=(--text eval.txt --rows 8 --cols 128)
build_rtn
vis='^(vision_tower|multi_modal_projector)\.'
for m in G2 G3 MM; do
	P=$([ $m = MM ] && echo language_model. || echo)
	# the source's keys as module keys, and the head the conversion adds
	{ tensor-ls $m | jq -r .name | sed -E 's/\.(weight|bias)$//'; echo "${P}lm_head"; } | sort -u >$m.keys
	kl_prev=
	for b in 2 4; do
		q=$m.q$b
		convert $m $q --bits $b --work $m.w$b --rows 40 --cols 128 -j 2 2>$q.err >/dev/null
		check "$m: convert --bits $b" test -f $q/config.json
		check "$m $b bpw: the source's keys and the head" \
			sh -c "tensor-ls $q | jq -r .name | sed -E 's/\.(weight|bias|trellis|suh|svh|su|sv|mcg|mul1)\$//' | sort -u | cmp -s - $m.keys"
		check "$m $b bpw: 7 linears per layer and the head quantized" \
			test "$(tensor-ls $q | jq -r .name | grep -c '\.trellis$')" -eq $(($(jq '.num_hidden_layers // .text_config.num_hidden_layers' $m/config.json) * 7 + 1))
		check "$m $b bpw: every norm stored unquantized (no trellis)" \
			test "$(tensor-ls $q | jq -r .name | grep -v "$vis" | grep -c 'norm\.\(trellis\|weight\)$') $(tensor-ls $q | jq -r .name | grep -c 'norm\.trellis$')" = \
			     "$(tensor-ls $m | jq -r .name | grep -v "$vis" | grep -c 'norm\.weight$') 0"
		if [ $m = MM ]; then
			for n in $(tensor-ls MM | jq -r .name | grep -E "$vis"); do
				tensor-cat -q MM "$n" | cksum
				tensor-cat -q $q "$n" | cksum
			done | paste - - >$q.vis
			check "$b bpw: the 23 vision tower and projector tensors byte for byte (BF16 kept)" \
				awk '$1 != $3 || $2 != $4 { bad++ } END { exit bad > 0 || NR != 23 }' $q.vis
			check "$b bpw: preprocessor_config.json copied (ExLlamaV3's Gemma3Config reads it)" \
				cmp -s MM/preprocessor_config.json $q/preprocessor_config.json
			check "$b bpw: config.json keeps text_config and vision_config, adds quantization_config" \
				jqe '.text_config.num_hidden_layers == 3 and .vision_config.hidden_size == 32 and .quantization_config.quant_method == "exl3"' $q/config.json
		fi
		validate $q --model $m "${ev[@]}" -q >$q.v.json
		check "$m $b bpw: validate ok" jqe '.ok' $q.v.json
		# round to nearest: every decoder linear at b bits, the tied head
		# (the embedding) at 6 as a separate lm_head
		kl_vs_rtn "$m $b bpw" $m $q $b $q.v.json
	done
done

# bad input: exit 1 naming the tensor or the key, nothing written
cp -r G2 B1 && jq '.model_type = "gemma4" | del(.architectures)' G2/config.json >B1/config.json
check_fail "unknown model_type gemma4: named" 1 "'gemma4' is not supported" convert B1 b1 --bits 2 --work b1.w
check "... nothing written" test ! -e b1
mkdir B2 && cp G2/*.json B2/
tensor-ls G2 | jq -r .name | grep -v '^model\.layers\.1\.post_feedforward_layernorm\.weight$' >keep.txt
tensor-cat -q G2 $(cat keep.txt) | tensor-cat -q -o B2/model.safetensors -
check_fail "a missing post_feedforward_layernorm: named" 1 "model\.layers\.1\.post_feedforward_layernorm\.weight" \
	convert B2 b2 --bits 2 --work b2.w
check "... nothing written" test ! -e b2
mkdir B3 && cp G3/*.json B3/
{ tensor-cat -q G3 $(tensor-ls G3 | jq -r .name | grep -v '^model\.layers\.2\.self_attn\.k_norm\.weight$')
  tensor-gen -s 9 model.layers.2.self_attn.k_norm.weight=20; } | tensor-cat -q -o B3/model.safetensors -
check_fail "a k_norm of the wrong length: named" 1 "model\.layers\.2\.self_attn\.k_norm\.weight" \
	convert B3 b3 --bits 2 --work b3.w
check "... nothing written" test ! -e b3
done_testing
