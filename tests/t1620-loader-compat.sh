#!/usr/bin/env bash
# t1620-loader-compat: what the real loaders require of an EXL3 directory,
# checked on what pipelines/convert and pack-write write. The loaders were
# read, not run (no torch here); each check names the file and function of
# the loader it comes from. Versions: see exl3(5) §8.
#   ExLlamaV3: github.com/turboderp-org/exllamav3
#   GPTQModel: github.com/ModelCloud/GPTQModel
# The safetensors headers are parsed here with od and jq, independently of
# the toolkit's own reader.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-pack.sh"
cd "$TMP" || exit 1

# raw DIR: one JSON line per tensor of every DIR/*.safetensors, straight
# from the bytes: {file, name, dtype, shape, begin, end, hlen, fsize}
raw() {
	local f n
	for f in "$1"/*.safetensors; do
		n=$(od -An -t u8 --endian=little -N8 "$f" | tr -d ' ')
		tail -c +9 "$f" | head -c "$n" | jq -c --arg f "${f##*/}" --argjson n "$n" \
			--argjson s "$(stat -c %s "$f")" \
			'to_entries[] | select(.key != "__metadata__")
			 | {file: $f, name: .key, dtype: .value.dtype, shape: .value.shape,
			    begin: .value.data_offsets[0], end: .value.data_offsets[1], hlen: $n, fsize: $s}'
	done
}

# the architecture's linears as "key in out" (Llama family), from config.json
linears() {
	jq -r '. as $c | ($c.head_dim // ($c.hidden_size / $c.num_attention_heads | floor)) as $hd
	  | ($c.num_key_value_heads // $c.num_attention_heads) as $kv
	  | (range(0; $c.num_hidden_layers) as $l
	     | ["self_attn.q_proj", $c.hidden_size, $c.num_attention_heads * $hd],
	       ["self_attn.k_proj", $c.hidden_size, $kv * $hd], ["self_attn.v_proj", $c.hidden_size, $kv * $hd],
	       ["self_attn.o_proj", $c.num_attention_heads * $hd, $c.hidden_size],
	       ["mlp.gate_proj", $c.hidden_size, $c.intermediate_size],
	       ["mlp.up_proj", $c.hidden_size, $c.intermediate_size],
	       ["mlp.down_proj", $c.intermediate_size, $c.hidden_size]
	     | "model.layers.\($l).\(.[0]) \(.[1]) \(.[2])"),
	    "lm_head \($c.hidden_size) \($c.vocab_size)"' "$1/config.json"
}

# empty VALUE: a check passes when the list of violations is empty
empty() { [ -z "$1" ] || { echo "#   $1" | head -5; false; }; }

# loader_checks DIR LABEL: every requirement, one named check each
loader_checks() {
	local d=$1 L=$2
	raw "$d" >"$L.raw" || { notok "$L: headers parse"; return; }
	local T; T=$(jq -s 'map({(.name): .}) | add' "$L.raw")
	linears "$d" >"$L.lin"

	# --- ExLlamaV3 ---------------------------------------------------------
	# model/config.py Config.from_directory: exactly one architectures entry
	check "$L: config.json has one architectures entry (ExLlamaV3 Config.from_directory)" \
		test "$(jq '.architectures | length' "$d/config.json")" = 1
	# conversion/compile.py compile_model writes the block; transformers and
	# GPTQModel dispatch on quant_method (integration patch_transformers,
	# GPTQModel quantization/config.py resolve_quant_format)
	check "$L: quantization_config: quant_method exl3, version, bits, head_bits, calibration, out_scales, codebook (compile.py compile_model)" \
		jqt '.quantization_config | .quant_method == "exl3" and (.version | type) == "string"
		  and (.bits | type) == "number" and (.head_bits | IN(1,2,3,4,5,6,7,8,16))
		  and (.calibration.rows | type) == "number" and (.calibration.cols | type) == "number"
		  and (.out_scales | IN("always", "never", "auto")) and (.codebook | IN("mul1", "mcg", "3inst"))' \
		"$d/config.json"
	# loader/safetensors.py SafetensorsCollection.add_tensor_files globs
	# *.safetensors: nothing but the model's shards may end so
	check "$L: only model shards are *.safetensors (SafetensorsCollection.add_tensor_files)" empty "$(
		ls -- "$d" | awk '/\.safetensors$/ && !/^model(-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9])?\.safetensors$/' ||
		echo "(the check command failed)")"
	# loader/safetensors.py convert_dtype: F32, F16, BF16, I32, I16 only
	check "$L: every dtype readable by ExLlamaV3 (safetensors.py convert_dtype)" \
		empty "$(jq -r 'select(.dtype | IN("F32","F16","BF16","I32","I16") | not) | .name' "$L.raw" || echo "(the check command failed)")"
	# loader/safetensors.py get_tensor: assert numel * esize == end - begin
	check "$L: byte sizes = numel x dtype size (safetensors.py get_tensor)" empty "$(jq -r '
		({F32: 4, F16: 2, BF16: 2, I32: 4, I16: 2}[.dtype]) as $s
		| select($s == null or ((.shape | reduce .[] as $x (1; . * $x)) * $s) != (.end - .begin)) | .name' "$L.raw" || echo "(the check command failed)")"
	# the HF safetensors layout (transformers, GPTQModel load through it):
	# data contiguous from offset 0, file = 8 + header + data
	check "$L: data contiguous, file size = 8 + header + data (HF safetensors)" empty "$(jq -rs '
		group_by(.file)[] | sort_by(.begin) as $t
		| if $t[0].begin != 0 or ([range(1; $t | length) | select($t[.].begin != $t[. - 1].end)] | length) > 0
		     or ($t[-1].end + 8 + $t[0].hlen) != $t[0].fsize then $t[0].file else empty end' "$L.raw" || echo "(the check command failed)")"
	# modules/linear.py Linear.is_exl3_storage: {sv|svh, su|suh, trellis};
	# Linear.load falls back to load_fp16 (KEY.weight) for the head only
	check "$L: every linear is EXL3 storage, or the head is KEY.weight (linear.py is_exl3_storage, load_fp16)" \
		empty "$(while read -r k i o; do jq -r --arg k "$k" '
			if .["\($k).trellis"] and .["\($k).suh"] and .["\($k).svh"] then empty
			elif $k == "lm_head" and .["lm_head.weight"] then empty else $k end' <<<"$T"; done <"$L.lin" || echo "(the check command failed)")"
	# modules/quant/exl3.py LinearEXL3.__init__: trellis int16, 3-D, K =
	# shape[-1] / 16; suh, svh half; the kernels take k = 16 shape[0],
	# n = 16 shape[1], the 128-padded sizes (linear.py Linear.__init__ pad_to)
	check "$L: trellis I16 (pad(in)/16, pad(out)/16, 16K), K 1..8 (exl3.py LinearEXL3.__init__)" \
		empty "$(while read -r k i o; do jq -r --arg k "$k" --argjson i "$i" --argjson o "$o" '
			def pad: ((. + 127) / 128 | floor) * 128;
			.["\($k).trellis"] | select(.) | select(.dtype != "I16" or (.shape | length) != 3
			  or .shape[0] != ($i | pad) / 16 or .shape[1] != ($o | pad) / 16
			  or .shape[2] % 16 != 0 or .shape[2] < 16 or .shape[2] > 128) | .name' <<<"$T"; done <"$L.lin" || echo "(the check command failed)")"
	check "$L: suh F16 (pad(in)), svh F16 (pad(out)) (exl3.py LinearEXL3.__init__)" \
		empty "$(while read -r k i o; do jq -r --arg k "$k" --argjson i "$i" --argjson o "$o" '
			def pad: ((. + 127) / 128 | floor) * 128;
			select(.["\($k).trellis"]) | (.["\($k).suh"], .["\($k).svh"])
			| select(.dtype != "F16" or .shape != [if (.name | endswith(".suh")) then ($i | pad) else ($o | pad) end])
			| .name' <<<"$T"; done <"$L.lin" || echo "(the check command failed)")"
	# linear.py Linear.load_exl3 passes the bias as stored (no pad_to)
	check "$L: EXL3 bias F16 (pad(out)) (linear.py load_exl3)" \
		empty "$(while read -r k i o; do jq -r --arg k "$k" --argjson o "$o" '
			def pad: ((. + 127) / 128 | floor) * 128;
			select(.["\($k).trellis"]) | .["\($k).bias"] | select(.) | select(.dtype != "F16" or .shape != [$o | pad])
			| .name' <<<"$T"; done <"$L.lin" || echo "(the check command failed)")"
	# linear.py load_exl3 reads KEY.mcg / KEY.mul1 by presence only; their
	# values are the locked multipliers (quant_config.py lists them)
	check "$L: at most one marker, an I32 scalar (linear.py load_exl3)" \
		empty "$(while read -r k i o; do jq -r --arg k "$k" '
			if .["\($k).mcg"] and .["\($k).mul1"] then $k else (.["\($k).mcg"], .["\($k).mul1"])
			  | select(.) | select(.dtype != "I32" or .shape != []) | .name end' <<<"$T"; done <"$L.lin" || echo "(the check command failed)")"
	# the old LinearEXL3.__init__ asserts scale is None; su/sv are legacy
	check "$L: no .scale, .su, .sv tensors (exl3.py LinearEXL3.__init__)" \
		empty "$(jq -r 'select(.name | test("\\.(scale|su|sv)$")) | .name' "$L.raw" || echo "(the check command failed)")"
	# linear.py load_fp16: KEY.weight (out, in), loaded transposed, padded
	check "$L: a 16-bit head is lm_head.weight float (vocab, hidden) (linear.py load_fp16)" \
		jqt --slurpfile c "$d/config.json" '.["lm_head.weight"] | . == null or
			((.dtype | IN("F16","BF16","F32")) and .shape == [$c[0].vocab_size, $c[0].hidden_size])' <<<"$T"
	# modules/embedding.py Embedding.load, modules/rmsnorm.py RMSNorm.load
	check "$L: embedding (vocab, hidden) and every norm (hidden), float (embedding.py, rmsnorm.py load)" \
		empty "$(jq -r --slurpfile c "$d/config.json" '$c[0] as $c
			| ([["model.embed_tokens.weight", [$c.vocab_size, $c.hidden_size]], ["model.norm.weight", [$c.hidden_size]]]
			   + [range(0; $c.num_hidden_layers) as $l | ("input_layernorm", "post_attention_layernorm")
			      | ["model.layers.\($l).\(.).weight", [$c.hidden_size]]])[] as [$n, $s]
			| .[$n] | if . == null then $n elif (.dtype | IN("F16","BF16","F32") | not) or .shape != $s then $n else empty end' <<<"$T" || echo "(the check command failed)")"
	# conversion/convert_model.py clones a tied head ("Cloned lm_head from
	# model.embed_tokens"); integration Exl3HfQuantizer unties the embeddings,
	# so a head must be stored
	check "$L: a head is stored, tied or not (convert_model.py main; Exl3HfQuantizer)" \
		jqt '.["lm_head.trellis"] or .["lm_head.weight"]' <<<"$T"
	# conversion/quant_config.py create_quantization_config_json
	check "$L: quantization_config.json = the config.json block + tensor_storage (quant_config.py)" \
		test "$(jq -c 'del(.tensor_storage)' "$d/quantization_config.json")" = "$(jq -c .quantization_config "$d/config.json")"
	check "$L: tensor_storage: every stored tensor under its leaf module with shape, n_bytes, dtype torch.* (quant_config.py, safetensors.py list_tensors)" \
		empty "$(jq -r --slurpfile ts "$d/quantization_config.json" '
			({F32: "torch.float32", F16: "torch.float16", BF16: "torch.bfloat16", I32: "torch.int32", I16: "torch.int16"}[.dtype]) as $td
			| (.name | sub("\\.[^.]*$"; "")) as $m
			| $ts[0].tensor_storage[$m].stored_tensors[.name] as $e
			| select($e == null or $e.shape != .shape or $e.n_bytes != (.end - .begin) or $e.dtype != $td) | .name' "$L.raw" || echo "(the check command failed)")"
	check "$L: tensor_storage has every leaf module, nothing else (quant_config.py walks the model)" \
		test "$(jq -r '.tensor_storage | keys[]' "$d/quantization_config.json" | sort)" = "$(
			{ cut -d' ' -f1 "$L.lin"; echo model.embed_tokens; echo model.norm
			  jq -r 'range(0; .num_hidden_layers) as $l | "model.layers.\($l).input_layernorm", "model.layers.\($l).post_attention_layernorm"' "$d/config.json"; } | sort)"
	check "$L: EXL3 modules: quant_format exl3, bits_per_weight = trellis.shape[-1] // 16, multiplier (quant_config.py)" \
		empty "$(jq -r '.tensor_storage | to_entries[] | .key as $k | .value as $v
			| $v.stored_tensors["\($k).trellis"] as $t | select($t)
			| select($v.quant_format != "exl3" or $v.bits_per_weight != ($t.shape[2] / 16 | floor)
			  or ($v.stored_tensors["\($k).mul1"] and $v.mul1_multiplier != 2212286765)
			  or ($v.stored_tensors["\($k).mcg"] and $v.mcg_multiplier != 3417055213)
			  or ($v.stored_tensors["\($k).mul1"] == null and $v.mul1_multiplier != null)
			  or ($v.stored_tensors["\($k).mcg"] == null and $v.mcg_multiplier != null)) | $k' "$d/quantization_config.json" || echo "(the check command failed)")"
	# compile.py compile_model: the index when sharded; GPTQModel
	# models/loader.py from_quantized -> get_checkpoints reads it
	if [ -e "$d/model.safetensors.index.json" ]; then
		check "$L: index: total_size = tensor bytes, weight_map = every tensor's file (compile.py)" \
			jqt --slurpfile r <(jq -s . "$L.raw") '.metadata.total_size == ($r[0] | map(.end - .begin) | add)
			  and .weight_map == ($r[0] | map({(.name): .file}) | add)' "$d/model.safetensors.index.json"
	else
		check "$L: one file model.safetensors when unsharded (compile.py)" test "$(ls "$d"/*.safetensors | wc -l)" = 1 -a -f "$d/model.safetensors"
	fi
	# compile.py copies the non-tensor files (tokenizer, ...) except weights
	check "$L: tokenizer.json and tokenizer_config.json copied, no .bin (compile.py)" \
		test -f "$d/tokenizer.json" -a -f "$d/tokenizer_config.json" -a -z "$(ls "$d" | grep -E '\.(bin|pt|pth|ckpt)$')"

	# --- GPTQModel ---------------------------------------------------------
	# quantization/config.py QuantizeConfig.from_pretrained reads
	# quantize_config.json, quant_config.json, then config.json; the EXL3
	# branch of models/loader.py from_quantized needs a tensor_storage there
	check "$L: quantize_config.json: the block + a non-empty tensor_storage (GPTQModel from_pretrained, from_quantized)" \
		jqt --slurpfile c "$d/config.json" '(del(.tensor_storage) == $c[0].quantization_config)
			and (.tensor_storage | type) == "object" and (.tensor_storage | length) > 0' "$d/quantize_config.json"
	# utils/exllamav3.py replace_exllamav3_placeholders turns every
	# nn.Linear named in tensor_storage into an EXL3 module: EXL3 ones only
	check "$L: quantize_config.json tensor_storage = exactly the EXL3 modules (replace_exllamav3_placeholders)" \
		test "$(jq -r '.tensor_storage | keys[]' "$d/quantize_config.json" | sort)" = "$(
			jq -r 'select(.name | endswith(".trellis")) | .name | sub("\\.trellis$"; "")' "$L.raw" | sort)"
	# nn_modules/exllamav3.py ExllamaV3Linear.__init__: getattr(torch,
	# torch_dtype) and the shape make the meta buffers the weights load into
	check "$L: stored_tensors torch_dtype (no torch. prefix) and shape match the file (ExllamaV3Linear.__init__)" \
		empty "$(jq -r --slurpfile ts "$d/quantize_config.json" '
			({F32: "float32", F16: "float16", BF16: "bfloat16", I32: "int32", I16: "int16"}[.dtype]) as $td
			| (.name | sub("\\.[^.]*$"; "")) as $m | select($ts[0].tensor_storage[$m])
			| $ts[0].tensor_storage[$m].stored_tensors[.name] as $e
			| select($e == null or $e.torch_dtype != $td or $e.shape != .shape) | .name' "$L.raw" || echo "(the check command failed)")"
	# models/loader.py from_quantized: possible_model_basenames ["model"]
	check "$L: weights under the basename model (GPTQModel from_quantized)" \
		test -f "$d/model.safetensors" -o -f "$d/model.safetensors.index.json"
}

# --- a real conversion: every dimension a multiple of 128, 16-bit head ------
"$ROOT/examples/make-tiny-llama" tl 1 256 256 >/dev/null
printf '{"quant_method": "awq"}\n' >tl/quant_config.json
check "convert a tiny Llama (hidden 256, 16 heads, 8 KV heads, intermediate 256)" \
	convert tl cv --bits 3 --head-bits 16 --rows 4 --cols 64 -j 2 -q
loader_checks cv convert
check "convert: no size of a linear off the 128 grid (GPTQModel sizes EXL3 modules unpadded)" \
	empty "$(awk '$1 != "lm_head" && ($2 % 128 || $3 % 128) { print $1 }' convert.lin || echo "(the check command failed)")"
check "convert: the source's quant_config.json not copied (GPTQModel would read it)" test ! -e cv/quant_config.json
# the decoded weights match the source: the trellis bit order, tile order
# and suh/svh signs are those of ExLlamaV3's decoder (exl3(5) §3-§6,
# LinearEXL3.get_weight_tensor: diag(suh) H W H diag(svh))
validate cv --model tl --no-eval -q >val.json 2>val.err
check "convert: exl3-validate: no errors, decoded weights within 0.5 of the source" \
	jqt '(.errors | length) == 0 and .check.max_rel_fro_err < 0.5' val.json

# --- pack-write alone: tied, sharded, biases, F64 source, every codebook -----
gen_model tied 2 true 1 F64
echo '{"bits": 4, "quant_method": "gptq"}' >tied/quantize_config.json
{
	gen_quant 1 3 mul1
	while read -r s i o; do
		cb=mcg; [ "$s" = mlp.down_proj ] && cb=3inst
		gen_linear "model.layers.1.$s" "$i" "$o" 4 $cb 9
	done <<<"$LINEARS"
} >tq.frames
check "pack-write: tied, F64 source with biases, 3 codebooks, shards" \
	pack-write -q --model tied --passthrough --shard-size 0.03 tp <tq.frames
loader_checks tp pack-write
check "pack-write: sharded (index written)" test -f tp/model.safetensors.index.json
check "pack-write: tied head = lm_head.weight, the F16 embedding" \
	test "$(tensor-cat -q tp lm_head.weight | tensor-ls --stats - | jq -c .stats)" = \
	"$(tensor-cat -q tp model.embed_tokens.weight | tensor-ls --stats - | jq -c .stats)"
check "pack-write: the source's quantize_config.json replaced, not copied" \
	jqt '.quant_method == "exl3"' tp/quantize_config.json
check "pack-write: all three codebooks present" \
	test "$(jq -r '.tensor_storage[] | select(.quant_format) | if .mul1_multiplier then "mul1" elif .mcg_multiplier then "mcg" else "3inst" end' tp/quantization_config.json | sort -u | tr '\n' ' ')" = "3inst mcg mul1 "

# a tied head > 1 MiB on stdin: the spool must keep it until the copy
gen_model big 1 true 0
jq '.vocab_size = 8192' big/config.json >big/c && mv big/c big/config.json
{ tensor-cat -q big 'model.layers.*' '*norm*'; tensor-gen -s 5 model.embed_tokens.weight=8192x64; } >bsrc.frames
tensor-cat -q -o big/model.safetensors bsrc.frames
{ tensor-cat -q big '*norm*' model.embed_tokens.weight; gen_quant 1 3 mul1; } >b.frames
check "pack-write: 2 MiB tied embedding on stdin" pack-write -q --model big bg <b.frames
check "pack-write: its lm_head copy equals it (not a punched-out spool)" \
	test "$(tensor-cat -q bg lm_head.weight | tensor-ls --stats - | jq -c .stats)" = \
	"$(tensor-cat -q bg model.embed_tokens.weight | tensor-ls --stats - | jq -c .stats)"

done_testing
