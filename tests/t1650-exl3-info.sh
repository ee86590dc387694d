#!/usr/bin/env bash
# exl3-info: packs written by pack-write (one file, sharded, tied), a
# hand-built directory with mixed codebooks, a legacy su/sv pair and MoE key
# names, frames with proxy errors, the plot; corrupted directories, each
# rejected with its own message naming the tensor or file.
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/lib-pack.sh"
cd "$TMP"
# broken on purpose: the corrupted copies c1..c7 and the hand-built hb
# (its sizes unknown and its bits not its widths, which exl3-info warns of)
NO_INFO="c[0-9]* hb"

check "-h prints usage, exit 0" bash -c 'exl3-info -h | grep -q "^usage: exl3-info"'
check_fail "no SOURCE: usage error" 2 "a SOURCE is required" exl3-info
check_fail "unknown option" 2 "." exl3-info --frob x

# ---- a pack from pack-write: 2 layers at K=3 mul1, head 6 ------------------
gen_model src 2 false 0
{ gen_quant 2 3 mul1; gen_linear lm_head 64 256 6 mul1
  tensor-cat -q src model.embed_tokens.weight model.norm.weight '*layernorm*'; } >all.frames
pack-write -q --model src --passthrough p1 <all.frames 2>/dev/null
exl3-info --json p1 >p1.json
check "pack: 15 linears, 6 unquantized tensors" jqt '(.linears | length) == 15 and (.unquantized | length) == 6' p1.json
check "pack: bits 3 (decoder), head 6, histogram {3: 14}" \
	jqt '.summary.bits == 3 and .summary.head_bits == 6 and .summary.histogram == {"3": {"linears": 14, "params": 61440}}' p1.json
check "pack: original sizes from config.json" \
	jqt '.linears[0] | .key == "model.layers.0.self_attn.q_proj" and .in == 64 and .out == 64 and .padded_in == 128 and .sizes_known' p1.json
check "pack: stored bytes of one linear (trellis + scales + marker)" \
	jqt '.linears[0].bytes == 128 * 128 * 3 / 8 + 2 * 128 + 2 * 128 + 4' p1.json
check "pack: roles attention/mlp/head/embedding/norm" \
	jqt '.summary.roles | (keys | sort) == ["attention", "embedding", "head", "mlp", "norm"] and .attention.linears == 8 and .mlp.linears == 6 and .embedding.bpw == 16' p1.json
check "pack: storage bpw = 8 x bytes / params of the decoder linears" \
	jqt '.summary.storage_bpw - (([.linears[] | select(.role != "head") | .bytes] | add) * 8 / ([.linears[] | select(.role != "head") | .in * .out] | add)) | fabs < 1e-6' p1.json
check "pack: stored bits per parameter of the whole pack" \
	jqt '.summary.stored_bits_per_param - .summary.tensor_bytes * 8 / .summary.params | fabs < 1e-6' p1.json
check "pack: file bytes = the files on disk" jqt --argjson b "$(cat p1/* | wc -c)" '.files.bytes == $b' p1.json
check "pack: quantization_config fields" \
	jqt '.quantization_config | .quant_method == "exl3" and .bits == 3 and .head_bits == 6 and .codebook == "mul1" and .out_scales == "always" and .calibration.rows > 0' p1.json
exl3-info p1 >p1.txt
check "table: one line per linear and per unquantized tensor" \
	test "$(grep -cE '^model\.layers\.[01]\.(self_attn|mlp)\.[a-z_]+ +3 +mul1 ' p1.txt)" -eq 14
check "table: the summary's bits" grep -qE '^  bits \(decoder linears, as quantization_config.bits\) +3\.0000$' p1.txt
check "table: embedding with its dtype" grep -qE '^model\.embed_tokens\.weight +F16 +256x64 ' p1.txt

# sharded, and a tied model with an unquantized (16-bit) head
pack-write -q --model src --passthrough --shard-size 0.02 p2 <all.frames 2>/dev/null
check "sharded pack written" test -f p2/model.safetensors.index.json
exl3-info --json p2 >p2.json
check "sharded: same linears and summary as one file" \
	test "$(jq -c '[.linears, (.summary | del(.tensor_bytes))]' p2.json)" = "$(jq -c '[.linears, (.summary | del(.tensor_bytes))]' p1.json)"
gen_model srct 1 true 0
{ gen_quant 1 4 mcg; tensor-cat -q srct model.embed_tokens.weight model.norm.weight '*layernorm*'; } |
	pack-write -q --model srct --passthrough --head-bits 16 p3 2>/dev/null
exl3-info --json p3 >p3.json
check "tied, head 16: lm_head listed as a 16-bit linear" \
	jqt '(.linears[] | select(.key == "lm_head") | .K == 16 and .codebook == null and .role == "head") and .summary.head_bits == 16 and .summary.bits == 4' p3.json

# ---- a hand-built directory: mixed codebooks, legacy su/sv, MoE names -------
mkdir hb
{
	gen_linear model.layers.0.self_attn.q_proj 128 128 2 mul1 1
	gen_linear model.layers.0.self_attn.o_proj 128 128 5 mcg 2
	gen_linear model.layers.0.mlp.experts.0.gate_proj 128 256 3 3inst 3
	gen_linear model.layers.0.mlp.experts.1.gate_proj 128 256 3 mul1 4
	gen_linear model.layers.0.mlp.shared_expert.up_proj 128 256 4 mul1 5
	gen_linear model.layers.1.block_sparse_moe.experts.0.w1 128 256 8 mcg 6
	# legacy: packed sign bits instead of suh/svh
	tensor-gen -t I16 -d uniform --scale 30000 -s 9 model.layers.1.self_attn.k_proj.trellis=8x8x16
	tensor-gen -t I16 -d uniform --scale 30000 -s 9 model.layers.1.self_attn.k_proj.su=8 model.layers.1.self_attn.k_proj.sv=8
	tensor-gen -t F16 -s 3 model.embed_tokens.weight=300x128 model.layers.0.mlp.gate.weight=4x128
} >hb.frames
tensor-cat -q -o hb/model.safetensors hb.frames
echo '{"architectures": ["MixtralForCausalLM"], "num_local_experts": 2, "quantization_config": {"quant_method": "exl3", "bits": 3.5, "head_bits": 6, "codebook": "mul1"}}' >hb/config.json
exl3-info -q --json hb >hb.json
check "hand-built: 7 linears, K 1/2/3/4/5/8 in the histogram" \
	jqt '(.linears | length) == 7 and (.summary.histogram | keys) == ["1", "2", "3", "4", "5", "8"]' hb.json
check "hand-built: three codebooks" jqt '.summary.codebooks == {"3inst": 2, "mcg": 2, "mul1": 3}' hb.json
check "hand-built: the legacy su/sv pair is read" \
	jqt '.linears[] | select(.key == "model.layers.1.self_attn.k_proj") | .legacy_signs and .K == 1 and .bytes == 8*8*16*2 + 16 + 16' hb.json
check "hand-built: routed and shared experts by key name" \
	jqt '.summary.roles | .expert.linears == 3 and .shared_expert.linears == 1 and .attention.linears == 3 and .router.tensors == 1' hb.json
check "hand-built: experts' bits numel-weighted ((3+3+8)/3)" jqt '.summary.roles.expert.bits - 14 / 3 | fabs < 1e-6' hb.json
check "hand-built: padded sizes used where unknown (a warning)" \
	jqt '(.warnings | map(select(test("original sizes unknown"))) | length) == 1' hb.json
check "hand-built: config bits differ from the trellis widths: a warning" \
	jqt '.warnings | map(select(test("quantization_config.bits 3.5, but the trellis widths give"))) | length == 1' hb.json

# ---- frames with proxy errors, and the plot --------------------------------
for K in 2 4; do tensor-gen -s 1 "model.layers.$((K / 2 - 1)).mlp.up_proj.weight=96x64" |
	had-rotate --seed 0 | trellis-encode -q -K $K; done >enc.frames
exl3-info --json enc.frames >enc.json
check "frames: sizes and proxy errors from the metadata" \
	jqt '(.linears | length) == 2 and all(.linears[]; .in == 64 and .out == 96 and .sizes_known and .proxy_err > 0) and .linears[0].proxy_err > .linears[1].proxy_err' enc.json
svg_series() { xmllint --xpath "count(//*[local-name()='g'][contains(@id, '_plot_')])" "$1"; }
if command -v gnuplot >/dev/null && command -v xmllint >/dev/null; then
	exl3-info --plot p1.svg p1 >/dev/null
	check "--plot: an SVG that parses, 3 series (attention, mlp, head)" test "$(svg_series p1.svg)" = 3
	exl3-info --plot enc.svg enc.frames >/dev/null
	check "--plot with proxy errors: a second panel (mlp bits, mlp errors)" test "$(svg_series enc.svg)" = 2
	jq -c '{tensor: .key, rel_fro_err: 0.01}' <(jq -c '.linears[]' p1.json) >err.jsonl
	exl3-info --plot p1e.svg --errors err.jsonl p1 >/dev/null
	check "--plot --errors: bits (3 series) and errors (3 series)" test "$(svg_series p1e.svg)" = 6
	echo '{"tensor": "nope", "rel_fro_err": 1}' >err2.jsonl
	check_fail "--errors naming an unknown linear" 1 "err2.jsonl: line 1: no quantized linear 'nope'" \
		exl3-info --plot x.svg --errors err2.jsonl p1
	check "... and no SVG left behind" test ! -e x.svg
	if command -v rsvg-convert >/dev/null; then
		check "the SVG renders (rsvg-convert)" rsvg-convert -o p1e.png p1e.svg
	else
		skip "rsvg-convert not installed"
	fi
else
	skip "gnuplot or xmllint not installed (make deps)"
fi

# ---- corrupted directories: each its own message ---------------------------
# corrupt NAME JQ-FILTER-ON-NAMES: p1 rewritten with the tensors the filter keeps/renames
corrupt() { # corrupt DIR: a copy of p1 with FRAMES as its weights
	rm -rf "$1"; mkdir "$1"; cp p1/*.json "$1/"; tensor-cat -q -o "$1/model.safetensors" -
}
K0=model.layers.0.self_attn.q_proj
tensor-cat -q p1 $(tensor-ls p1 | jq -r .name | grep -v "^$K0.suh$") | corrupt c1
check_fail "missing scales: named" 1 "tensor '$K0': missing '$K0.suh'" exl3-info c1
{ tensor-cat -q p1 $(tensor-ls p1 | jq -r .name | grep -v "^$K0\\.")
  gen_linear "$K0" 256 64 3 mul1; } | corrupt c2
check_fail "a trellis whose shape disagrees with the config: named" 1 \
	"tensor '$K0.trellis': a 256x128 \(in x out\) weight, config.json gives 64x64" exl3-info c2
{ tensor-cat -q p1 $(tensor-ls p1 | jq -r .name | grep -v "^$K0.trellis$")
  tensor-gen -t I16 "$K0.trellis=8x8x40"; } | corrupt c3
check_fail "a trellis whose width is no K: named" 1 "'$K0.trellis': shape 8x8x40, expected \(k/16, n/16, 16K\)" exl3-info c3
{ tensor-cat -q p1 $(tensor-ls p1 | jq -r .name | grep -v "^$K0.mul1$")
  tensor-gen -t I32 -d constant --value 7 "$K0.mul2=scalar"; } | corrupt c4
check_fail "a marker of an unknown codebook: named" 1 "tensor '$K0.mul2': a marker of an unknown codebook 'mul2'" exl3-info c4
{ tensor-cat -q p1 $(tensor-ls p1 | jq -r .name | grep -v "^$K0.mul1$")
  tensor-gen -t I32 -d constant --value 7 "$K0.mul1=scalar"; } | corrupt c5
check_fail "a marker with the wrong multiplier: named" 1 "'$K0.mul1': multiplier 0x00000007 is not the locked" exl3-info c5
rm -rf c6 && cp -r p2 c6 && rm "$(ls c6/model-*.safetensors | tail -1)"
check_fail "an index naming a missing shard" 1 "missing shard 'model-0000[0-9]-of-0000[0-9].safetensors' listed in model.safetensors.index.json" exl3-info c6
rm -rf c7 && cp -r p1 c7 && jq '.quantization_config.codebook = "mul7"' p1/config.json >c7/config.json
check_fail "quantization_config naming an unknown codebook" 1 "quantization_config.codebook mul7 is an unknown codebook" exl3-info c7
tensor-gen -t I16 -d uniform --scale 30000 --meta K=4 t.trellis=8x8x48 >c8.frames
tensor-gen -t F16 t.suh=128 t.svh=128 >>c8.frames
check_fail "frames: metadata K disagrees with the trellis width" 1 "'t.trellis': metadata K=4, but the shape 8x8x48 says K=3" exl3-info c8.frames
tensor-gen -t I16 -d uniform --scale 30000 --meta codebook=mul9 t.trellis=8x8x48 >c9.frames
tensor-gen -t F16 t.suh=128 t.svh=128 >>c9.frames
check_fail "frames: metadata naming an unknown codebook" 1 "'t.trellis': metadata names an unknown codebook 'mul9'" exl3-info c9.frames
check "no output on stdout for a rejected pack" test ! -s "$TMP/cf.out"
tensor-cat -q src -o plain.safetensors
check_fail "not an EXL3 pack" 1 "no EXL3 linears" exl3-info plain.safetensors
done_testing
