#!/usr/bin/env bash
# t1880-convert-gpt-oss-hub: GPT-OSS's experts as the hub's checkpoints
# hold them, fused per layer: MXFP4 (make-tiny-llama --mxfp4:
# gate_up_proj_blocks/_scales with gate and up rows interleaved,
# down_proj_blocks/_scales, the fused biases, quantization_config mxfp4)
# and the BF16 re-uploads (--fused-bf16: gate_up_proj (E, H, 2I),
# down_proj (E, I, H)), of the same seeded weights rounded to MXFP4 values,
# against the per-expert layout of those values (--mxfp4-exact, written
# without the reader under test): tensor-ls --linears describes the same
# linears, tensor-cat gives each expert's weights and biases bit for bit,
# model-eval between the sources gives KL 0, and the three conversions
# write the same model.safetensors byte for byte. Bad input (MXFP4 scales
# of the wrong shape, blocks without their scales, a missing fused bias):
# exit 1 naming the tensor, nothing written.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny=("$ROOT/examples/make-tiny-llama" --arch gpt_oss --experts 4 --top-k 2 --heads 2 --kv-heads 1 --head-dim 16)
"${tiny[@]}" --mxfp4-exact A 2 64 96 >/dev/null
"${tiny[@]}" --mxfp4 X 2 64 96 >/dev/null
"${tiny[@]}" --fused-bf16 B 2 64 96 >/dev/null

# the raw header (not through the reader under test): name dtype shape
hdr() { python3 -c '
import json, struct, sys
f = open(sys.argv[1], "rb"); h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0])); h.pop("__metadata__", None)
for k in sorted(h): print(k, h[k]["dtype"], "x".join(map(str, h[k]["shape"])))' "$1"; }
check "X holds the hub's MXFP4 tensors, no per-expert key" \
	test "$(hdr X/model.safetensors | grep 'layers\.1\.mlp\.experts' | tr '\n' ' ')" = \
	     "model.layers.1.mlp.experts.down_proj_bias F32 4x64 model.layers.1.mlp.experts.down_proj_blocks U8 4x64x3x16 model.layers.1.mlp.experts.down_proj_scales U8 4x64x3 model.layers.1.mlp.experts.gate_up_proj_bias F32 4x192 model.layers.1.mlp.experts.gate_up_proj_blocks U8 4x192x2x16 model.layers.1.mlp.experts.gate_up_proj_scales U8 4x192x2 "
check "B holds the BF16 re-upload's tensors" \
	test "$(hdr B/model.safetensors | grep 'layers\.1\.mlp\.experts' | tr '\n' ' ')" = \
	     "model.layers.1.mlp.experts.down_proj BF16 4x96x64 model.layers.1.mlp.experts.down_proj_bias F32 4x64 model.layers.1.mlp.experts.gate_up_proj BF16 4x64x192 model.layers.1.mlp.experts.gate_up_proj_bias F32 4x192 "
check "tensor-ls: the hub checkpoints' tensors are the per-expert ones" \
	sh -c "tensor-ls A | jq -r .name | sort >a.names && tensor-ls X | jq -r .name | sort | cmp -s - a.names && tensor-ls B | jq -r .name | sort | cmp -s - a.names"
check "tensor-ls --linears: the same linears (expert 1 of layer 1's gate, up, down with biases)" \
	sh -c "tensor-ls --linears A >a.lin && tensor-ls --linears X | cmp -s - a.lin && tensor-ls --linears B | cmp -s - a.lin"
# one tensor a frame (tensor-cat writes a selection in its file's order)
each() { for n in $(tensor-ls A | jq -r 'select(.name | test("experts\\.")) | .name'); do tensor-cat -q --dtype F32 "$1" "$n"; done; }
each A >a.frames
for m in X B; do
	check "tensor-cat --dtype F32: $m's every expert weight and bias equals the per-expert one, bit for bit" \
		sh -c "[ -s a.frames ] && $(declare -f each | tr '\n' ' '); each $m | cmp -s - a.frames"
done
for i in $(seq 1 20); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog."; done >eval.txt
ev=(--text eval.txt --rows 4 --cols 32)
for m in X B; do
	model-eval -q --model A --quantized $m "${ev[@]}" >e$m.json
	check "model-eval: $m gives the per-expert checkpoint's logits: KL 0, top-1 1" \
		jqe '.kl_divergence == 0 and .top1_agreement == 1' e$m.json
done
for m in A X B; do convert $m q$m --bits 3 --work w$m --rows 4 --cols 32 -j 2 -q >/dev/null 2>&1; done
for m in X B; do
	check "convert from $m: the same model.safetensors as from the per-expert layout, byte for byte" \
		cmp qA/model.safetensors q$m/model.safetensors
	check "... and the same config.json but for the source's quantization_config" \
		bash -c "jq -S 'del(.quantization_config.original_quantization_config)' q$m/config.json | cmp -s - <(jq -S . qA/config.json)"
done
validate qX --model X "${ev[@]}" -q >v.json
check "validate against the MXFP4 source: ok" jqe '.ok' v.json

# bad input: exit 1 naming the tensor, nothing written. edit DIR DROP
# [NAME]: X's file without the tensors matching DROP, and with NAME's first
# dimension one short (its data cut to fit)
edit() {
	mkdir "$1" && cp X/config.json X/tokenizer*.json "$1"/
	python3 - X/model.safetensors "$1/model.safetensors" "$2" "${3:-}" <<'PY'
import json, re, struct, sys
raw = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', raw[:8])[0]
h = json.loads(raw[8:8 + n]); h.pop('__metadata__', None)
out, off, blobs = {}, 0, []
for k in sorted(h):
    if sys.argv[3] and re.search(sys.argv[3], k):
        continue
    a, b = h[k]['data_offsets']; d = raw[8 + n + a:8 + n + b]; sh = list(h[k]['shape'])
    if k == sys.argv[4]:
        d = d[:len(d) // sh[0] * (sh[0] - 1)]; sh[0] -= 1
    out[k] = {'dtype': h[k]['dtype'], 'shape': sh, 'data_offsets': [off, off + len(d)]}; off += len(d); blobs.append(d)
j = json.dumps(out).encode(); j += b' ' * (-len(j) % 8)
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(j)) + j + b''.join(blobs))
PY
}
edit bad1 '^$' model.layers.1.mlp.experts.gate_up_proj_scales
check_fail "convert: MXFP4 scales 3x192x2 for blocks 4x192x2x16, named" 1 \
	"model\.layers\.1\.mlp\.experts\.gate_up_proj_scales.*3x192x2" convert bad1 bad1.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad1.out
edit bad2 'layers\.0\.mlp\.experts\.down_proj_scales'
check_fail "convert: down_proj_blocks without its scales, named" 1 \
	"model\.layers\.0\.mlp\.experts\.down_proj_blocks.*without.*down_proj_scales" convert bad2 bad2.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad2.out
check_fail "tensor-ls --modules on it: named" 1 "model\.layers\.0\.mlp\.experts\.down_proj_blocks" tensor-ls --modules bad2
edit bad3 'layers\.1\.mlp\.experts\.gate_up_proj_bias'
check_fail "convert: a missing fused gate_up_proj_bias, named" 1 \
	"missing tensor 'model\.layers\.1\.mlp\.experts\.gate_up_proj_bias'" convert bad3 bad3.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad3.out
NO_INFO="bad1 bad2 bad3"
done_testing
