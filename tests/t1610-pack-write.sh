#!/usr/bin/env bash
# t1610-pack-write: layout of the EXL3 directory: tensors, order, dtypes,
# shards and index, config.json and quantization_config.json, copied files.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-pack.sh"
cd "$TMP" || exit 1

gen_model src 2 false 0
gen_quant 2 3 mul1 >q.frames

# --- one shard, unquantized head from SRC -------------------------------
check "pack-write succeeds" pack-write -q --model src --passthrough --head-bits 16 out <q.frames
check "one shard: model.safetensors, no index" test -f out/model.safetensors -a ! -e out/model.safetensors.index.json
check "no temporary directories left" no_leftovers . out
tensor-ls out >ls.json
check "63 tensors (2 x 7 x 4 + embed, 4 norms, final norm, head)" test "$(wc -l <ls.json)" -eq 63
# expected model order, built independently
{
	echo model.embed_tokens.weight
	for l in 0 1; do
		echo model.layers.$l.input_layernorm.weight
		while read -r s i o; do
			[ "$s" = mlp.gate_proj ] && echo model.layers.$l.post_attention_layernorm.weight
			for p in trellis suh svh mul1; do echo model.layers.$l.$s.$p; done
		done <<<"$LINEARS"
	done
	echo model.norm.weight
	echo lm_head.weight
} >want.order
jq -r .name ls.json >got.order
check "tensors in model order" cmp -s want.order got.order
check "F32 embedding stored F16" test "$(jq -r 'select(.name=="model.embed_tokens.weight").dtype' ls.json)" = F16
check "16-bit head stored as F16 .weight (out, in)" \
	test "$(jq -c 'select(.name=="lm_head.weight") | [.dtype, .shape]' ls.json)" = '["F16",[256,64]]'
check "trellis I16 (k/16, n/16, 16K), padded to 128" \
	test "$(jq -c 'select(.name=="model.layers.1.mlp.down_proj.trellis") | [.dtype, .shape]' ls.json)" = '["I16",[8,8,48]]'
check "suh/svh F16 padded" \
	test "$(jq -c 'select(.name=="model.layers.0.mlp.gate_proj.svh") | [.dtype, .shape]' ls.json)" = '["F16",[128]]'
check "mul1 marker I32 scalar" \
	test "$(jq -c 'select(.name=="model.layers.0.mlp.gate_proj.mul1") | [.dtype, .shape]' ls.json)" = '["I32",[]]'
# payloads copied verbatim
tensor-cat -q out model.layers.1.self_attn.k_proj.trellis | tensor-ls --stats - | jq -c .stats >a.json
tensor-cat -q q.frames model.layers.1.self_attn.k_proj.trellis | tensor-ls --stats - | jq -c .stats >b.json
check "trellis payload identical to the stream" cmp -s a.json b.json

qc='.quantization_config'
check "config: quant_method exl3, bits 3, head_bits 16, codebook mul1" \
	test "$(jq -c "$qc | [.quant_method, .bits, .head_bits, .codebook, .out_scales]" out/config.json)" = \
	'["exl3",3,16,"mul1","always"]'
check "config: calibration rows/cols" test "$(jq -c "$qc.calibration" out/config.json)" = '{"rows":250,"cols":2048}'
check "config: source fields kept" test "$(jq -r .num_hidden_layers out/config.json)" = 2
check "quantization_config.json = block + tensor_storage" \
	test "$(jq -c 'del(.tensor_storage)' out/quantization_config.json)" = "$(jq -c "$qc" out/config.json)"
ts='.tensor_storage["model.layers.0.self_attn.q_proj"]'
check "tensor_storage: quant_format, bits_per_weight, mul1_multiplier" \
	test "$(jq -c "$ts | [.quant_format, .bits_per_weight, .mul1_multiplier]" out/quantization_config.json)" = \
	'["exl3",3,2212286765]'
check "tensor_storage: both dtype spellings, shape and n_bytes" \
	test "$(jq -c "$ts.stored_tensors[\"model.layers.0.self_attn.q_proj.suh\"]" out/quantization_config.json)" = \
	'{"shape":[128],"n_bytes":256,"dtype":"torch.float16","torch_dtype":"float16"}'
check "tensor_storage: one entry per leaf module" \
	test "$(jq '.tensor_storage | length' out/quantization_config.json)" -eq $((1 + 2 * 9 + 2))
check "tensor_storage: non-EXL3 modules have no quant_format" \
	test "$(jq -c '.tensor_storage["model.norm"] | keys' out/quantization_config.json)" = '["stored_tensors"]'
check "tokenizer files copied" cmp -s src/tokenizer.json out/tokenizer.json
check ".bin weights not copied" test ! -e out/pytorch_model.bin
check "no spool or pid file left" test -z "$(ls -A out | grep '^\.')"

# --- several shards -------------------------------------------------------
check "sharded pack" pack-write -q --model src --passthrough --head-bits 16 --shard-size 0.05 sh <q.frames
n=$(ls sh/model-*-of-*.safetensors | wc -l)
check "several shards ($n), 5-digit names" test "$n" -gt 1 -a -f "sh/model-00001-of-0000$n.safetensors"
idx=sh/model.safetensors.index.json
check "index maps every tensor" test "$(jq '.weight_map | length' $idx)" -eq 63
check "index total_size = sum of payloads" \
	test "$(jq .metadata.total_size $idx)" -eq "$(tensor-ls sh | jq -s 'map(.bytes) | add')"
check "every shard within 0.05 MB of payload" \
	test "$(tensor-ls sh | jq -s 'group_by(.source) | map(map(.bytes) | add) | max')" -le 52428
check "a layer never split across shards" \
	test "$(jq -r '.weight_map | to_entries[] | select(.key | startswith("model.layers.")) | (.key | split(".")[2]) + " " + .value' $idx | sort -u | cut -d" " -f1 | uniq -d | wc -l)" -eq 0
tensor-ls sh | jq -r .name >sh.order
check "sharded tensors in model order" cmp -s want.order sh.order
check "same config as unsharded" cmp -s out/config.json sh/config.json

# --- mixed K from a bitalloc plan, tied head, BF16 source ----------------
gen_model tied 2 true 0 BF16
gen_measure 2 | bitalloc -q --bits 3.4 -o plan.json
gen_quant 2 plan.json mcg >p.frames
check "tied model with a plan" pack-write -q --model tied --passthrough --plan plan.json tout <p.frames
check "config bits = round(plan bits, 2)" \
	test "$(jq "$qc.bits" tout/config.json)" = "$(jq '.bits * 100 | round / 100' plan.json)"
# as ExLlamaV3's converter: the head is cloned from the embedding (F16)
check "tied, no head asked for: lm_head.weight = F16 copy of the embedding, head_bits 16" \
	test "$(tensor-ls tout | jq -r 'select(.name | startswith("lm_head")) | .name')" = lm_head.weight -a \
	"$(jq "$qc.head_bits" tout/config.json)" = 16 -a \
	"$(tensor-cat -q tout lm_head.weight | tensor-ls --stats - | jq -c .stats)" = \
	"$(tensor-cat -q tied model.embed_tokens.weight | tensor-cat -q --dtype F16 - | tensor-ls --stats - | jq -c .stats)"
check "BF16 pass-through kept BF16" \
	test "$(tensor-ls tout | jq -r 'select(.name=="model.norm.weight").dtype')" = BF16
check "per-tensor bits_per_weight follows the plan" \
	test "$(jq -c '[.tensor_storage | to_entries[] | select(.value.quant_format) | {(.key): .value.bits_per_weight}] | add' tout/quantization_config.json)" = \
	"$(jq -c '.tensors' plan.json)"
check "mcg: codebook in config" test "$(jq -r "$qc.codebook" tout/config.json)" = mcg
check "mcg multiplier value" \
	test "$(jq '.tensor_storage["model.layers.1.mlp.up_proj"].mcg_multiplier' tout/quantization_config.json)" = 3417055213
{ cat p.frames; gen_linear lm_head 64 256 6 mcg; } >ph.frames
check "tied model with a quantized head" pack-write -q --model tied --passthrough tq <ph.frames
check "quantized head stored, head_bits 6, not in bits" \
	test "$(jq -c "$qc | [.head_bits, .bits]" tq/config.json)" = "[6,$(jq "$qc.bits" tout/config.json)]"
check "quantized head last" test "$(tensor-ls tq | jq -r .name | tail -1)" = lm_head.mcg

# --- biases: from SRC, F16, zero-padded to n ------------------------------
gen_model bsrc 1 false 1
gen_quant 1 4 3inst >b.frames
check "bias model with --passthrough" pack-write -q --model bsrc --passthrough --head-bits 16 bout <b.frames
check "k_proj bias F16 padded to 128" \
	test "$(tensor-ls bout | jq -c 'select(.name=="model.layers.0.self_attn.k_proj.bias") | [.dtype, .shape]')" = '["F16",[128]]'
# sum of squares over 128 equals the source's over 32 when the padding is zero
so=$(tensor-cat -q bout model.layers.0.self_attn.k_proj.bias | tensor-ls --stats - | jq '.stats.rms * .stats.rms * 128')
ss=$(tensor-cat -q bsrc model.layers.0.self_attn.k_proj.bias | tensor-ls --stats - | jq '.stats.rms * .stats.rms * 32')
check "padding is zero (energy $so vs $ss)" jqt -n "($so - $ss) | fabs < 1e-3 * $ss"
check "3inst: no marker, codebook 3inst" \
	test "$(jq -r "$qc.codebook" bout/config.json)" = 3inst -a "$(tensor-ls bout | jq -r .name | grep -c 'mcg$\|mul1$')" -eq 0

# --- the real stories260K layout: tied, 5 layers, intermediate 172 ------
if have_shared; then
	S=$SHARED/models/stories260K
	for ((l = 0; l < 5; l++)); do
		p=model.layers.$l
		gen_linear $p.self_attn.q_proj 64 64 4 mul1
		gen_linear $p.self_attn.k_proj 64 32 4 mul1
		gen_linear $p.self_attn.v_proj 64 32 4 mul1
		gen_linear $p.self_attn.o_proj 64 64 4 mul1
		gen_linear $p.mlp.gate_proj 64 172 3 mul1
		gen_linear $p.mlp.up_proj 64 172 3 mul1
		gen_linear $p.mlp.down_proj 172 64 5 mul1
	done >s.frames
	check "stories260K: pack-write" pack-write -q --model "$S" --passthrough st <s.frames
	check "stories260K: down_proj trellis padded (256/16, 128/16, 80)" \
		test "$(tensor-ls st | jq -c 'select(.name=="model.layers.4.mlp.down_proj.trellis").shape')" = '[16,8,80]'
	# numel-weighted: (2*4096*4 + 2*2048*4 + 2*11008*3 + 11008*5) / (2*4096 + 2*2048 + 3*11008)
	want=$(jq -n '(2*4096*4 + 2*2048*4 + 2*11008*3 + 11008*5) / (2*4096 + 2*2048 + 3*11008) * 100 | round / 100')
	check "stories260K: bits = $want (numel-weighted integer K)" test "$(jq .quantization_config.bits st/config.json)" = "$want"
	check "stories260K: tied, head = lm_head.weight F16 (512, 64); embedding F16" \
		test "$(tensor-ls st | jq -c 'select(.name | startswith("lm_head")) | [.name, .dtype, .shape]')" = \
		'["lm_head.weight","F16",[512,64]]' -a \
		"$(tensor-ls st | jq -r 'select(.name=="model.embed_tokens.weight").dtype')" = F16
	check "stories260K: tokenizer copied, .bin skipped" \
		test -f st/tokenizer.json -a -f st/tokenizer_config.json -a ! -e st/stories260K.bin -a ! -e st/tok512.bin
	check "stories260K: 5 x 7 EXL3 modules in tensor_storage" \
		test "$(jq '[.tensor_storage[] | select(.quant_format == "exl3")] | length' st/quantization_config.json)" -eq 35
else
	skip "stories260K not available"
fi

done_testing
