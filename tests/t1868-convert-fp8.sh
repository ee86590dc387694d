#!/usr/bin/env bash
# t1868-convert-fp8: a tiny seeded DeepSeek V3 with FP8 linears as DeepSeek's
# checkpoints hold them (examples/make-tiny-llama --fp8: F8_E4M3 weights,
# NAME_scale_inv F32 per 128x128 block, quantization_config fp8;
# intermediate 200, so the dense MLP's weights have a full and a partial
# block) against the same weights dequantized to F32 (every tensor of the
# FP8 checkpoint but the scales, read back by tensor-cat): the FP8 values
# are exact in BF16 too; the FP8 model is the seeded F32 model rounded
# (small KL to it); converting the FP8 checkpoint gives byte for byte the
# pack of converting the dequantized one, with no *_scale_inv key and an
# exl3 quantization_config; validate accepts it against the FP8 source; a
# checkpoint with one weight_scale_inv removed makes convert exit 1 naming
# the tensor, nothing written.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
ds=(--arch deepseek_v3 --experts 4 --top-k 2 --moe-inter 40)
tiny_model "${ds[@]}" --fp8 F8 2 64 200
tiny_model "${ds[@]}" U 2 64 200
f8=$(tensor-ls F8 | jq -r 'select(.dtype == "F8_E4M3") | .name')
check "FP8 checkpoint: 49 weights F8_E4M3 (3 x 5 attention, 3 dense MLP, 2 x (12 expert + 3 shared), the MTP eh_proj)" \
	test "$(wc -l <<<"$f8")" -eq 49
check "... each with its F32 weight_scale_inv of ceil(rows/128) x ceil(cols/128) blocks (gate_proj 200x64: 2x1)" \
	test "$(tensor-ls F8 | jq -c 'select(.name | endswith("_scale_inv")) | [.dtype, .shape]' | sort | uniq -c | tr -s ' ' | tr -d '\n')" = \
	     ' 46 ["F32",[1,1]] 1 ["F32",[1,2]] 2 ["F32",[2,1]]'
check "... the router, its bias, norms, embedding and head not FP8" \
	test "$(tensor-ls F8 | jq -r 'select(.dtype == "F8_E4M3") | .name' | grep -Ec 'mlp\.gate\.|norm|embed|lm_head')" -eq 0
check "... config.json: DeepSeek's quantization_config" \
	jqe '.quantization_config == {activation_scheme: "dynamic", fmt: "e4m3", quant_method: "fp8", weight_block_size: [128, 128]}' F8/config.json

# the same values dequantized: F32, no scales, no quantization_config
mkdir DQ && cp F8/tokenizer*.json DQ/ && jq 'del(.quantization_config)' F8/config.json >DQ/config.json
tensor-cat -q -o DQ/model.safetensors F8 $(tensor-ls F8 | jq -r .name | grep -v '_scale_inv$')
check "dequantized checkpoint: all F32, the FP8 checkpoint's names less the scales" \
	test "$(tensor-ls DQ | jq -r .dtype | sort -u) $(tensor-ls DQ | wc -l)" = "F32 $(($(tensor-ls F8 | wc -l) - 49))"
tensor-cat -q -o a.safetensors DQ $f8
tensor-cat -q --dtype BF16 DQ $f8 | tensor-cat -q --dtype F32 -o b.safetensors -
check "the dequantized FP8 values are exact in BF16 (F32 -> BF16 -> F32 gives the same bytes)" cmp -s a.safetensors b.safetensors
for i in $(seq 1 20); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog."; done >eval.txt
ev=(--text eval.txt --rows 4 --cols 64)
model-eval -q --model U --quantized F8 "${ev[@]}" >u.json
check "the FP8 model is the seeded F32 model rounded: KL $(jq .kl_divergence u.json), above 0 and below 0.05" \
	jqe '.kl_divergence > 0 and .kl_divergence < 0.05' u.json

convert F8 q8 --bits 2 --work w8 --rows 16 --cols 64 -j 2 -q
convert DQ qd --bits 2 --work wd --rows 16 --cols 64 -j 2 -q
check "convert of the FP8 checkpoint: the dequantized checkpoint's pack, byte for byte" \
	cmp q8/model.safetensors qd/model.safetensors
check "... and the same config.json but for DeepSeek's fp8 quantization_config, nested as original_quantization_config" \
	test "$(jq -S -c '.quantization_config.original_quantization_config' q8/config.json) $(jq -S -c 'del(.quantization_config.original_quantization_config)' q8/config.json)" = \
	     "$(jq -S -c .quantization_config F8/config.json) $(jq -S -c . qd/config.json)"
check "... no *_scale_inv key" test "$(tensor-ls q8 | jq -r .name | grep -c '_scale_inv$')" -eq 0
validate q8 --model F8 "${ev[@]}" -q >v.json
check "validate against the FP8 source: ok" jqe '.ok' v.json

# the FP8 checkpoint again, from frames (tensor-cat reads an F8 weight of a
# checkpoint dequantized): the dequantized weights encoded anew
{ tensor-cat -q F8 $(tensor-ls F8 | jq -r 'select(.dtype != "F8_E4M3") | .name' | grep -v '_scale_inv$')
  tensor-cat -q DQ $f8 | tensor-cat -q --dtype F8_E4M3 -; } >re.frames
mkdir R && cp F8/*.json R/ && tensor-cat -q -o R/model.safetensors re.frames
tensor-cat -q -o r.safetensors R $f8
# (not the same bytes: a block whose largest value rounded down to 224 x 2^k
# is encoded anew at 2^(k-1), the same values)
check "tensor-cat --dtype F8_E4M3 of the dequantized weights: the same values again" cmp -s a.safetensors r.safetensors
# one weight_scale_inv removed
mkdir B && cp F8/*.json B/
tensor-cat -q -o B/model.safetensors re.frames \
	$(tensor-ls re.frames | jq -r .name | grep -vx 'model\.layers\.1\.mlp\.experts\.2\.up_proj\.weight_scale_inv')
check_fail "FP8 without one weight_scale_inv: convert exits 1 naming it" 1 \
	"'model\.layers\.1\.mlp\.experts\.2\.up_proj\.weight': F8_E4M3 without its block scales 'model\.layers\.1\.mlp\.experts\.2\.up_proj\.weight_scale_inv'" \
	convert B b --bits 2 --work bw --rows 16 --cols 64 -q
check "... nothing written" test ! -e b
done_testing
