#!/usr/bin/env bash
# pipelines/convert and pipelines/validate: usage, bad input (unknown
# architecture, missing tensor, malformed EXL3 directory): exit status, a
# message naming the problem, nothing left behind.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 1

check "convert -h prints the usage" sh -c 'convert -h | grep -q "^usage: convert MODEL OUT (--bits B | --size BYTES"'
check "validate -h prints the usage" sh -c 'validate -h | grep -q "^usage: validate OUT"'
check_fail "no --bits: usage error" 2 "--bits B or --size BYTES is required" convert m out
check_fail "--bits out of range" 2 "--bits: '9' is not a number from 1 to 8" convert m out --bits 9
check_fail "bad --mode" 2 "--mode: 'twopass'" convert m out --bits 4 --mode twopass
check_fail "bad --head-bits" 2 "--head-bits: '12'" convert m out --bits 4 --head-bits 12
check_fail "unknown option" 2 "unknown option '--frobnicate'" convert m out --bits 4 --frobnicate
check_fail "bad --sign-draws" 2 "--sign-draws: '0' is not an integer from 1 to 64" convert m out --bits 4 --sign-draws 0
check_fail "--sign-strips without --sign-draws" 2 "--sign-strips goes with --sign-draws N" convert m out --bits 4 --sign-strips 4
check_fail "bad --ldlq-passes" 2 "--ldlq-passes: '9' is not an integer from 0 to 8" convert m out --bits 4 --ldlq-passes 9
check_fail "bad --sign-metric" 2 "--sign-metric: 'best' is not proxy, output or kl" convert m out --bits 4 --sign-draws 2 --sign-metric best
check_fail "bad --set regex: a usage error before any work" 2 "^convert: --set: regex '\\(': missing closing parenthesis" \
	convert m out --bits 4 --set '(=3'
mkdir hostdir
if command -v parallel >/dev/null; then
	check_fail "--hosts DIR" 1 "hostdir: cannot read the host list" convert m out --bits 4 --hosts hostdir
else
	skip "--hosts DIR: no GNU parallel"
fi
check "nothing written after usage errors" test ! -e out -a ! -e out.work

mkdir gpt
jq '.architectures = ["GPT2LMHeadModel"]' m/config.json >gpt/config.json
ln -s ../m/model.safetensors ../m/tokenizer.json gpt/
check_fail "unknown architecture: exit 1, named" 1 "architecture 'GPT2LMHeadModel' is not supported" \
	convert gpt out --bits 4 -q
check "unknown architecture: no OUT, no work directory" test ! -e out -a ! -e out.work

mkdir miss
cp m/config.json m/tokenizer.json miss/
tensor-cat -q m $(tensor-ls m | jq -r '.name' | grep -v '^model.layers.0.mlp.up_proj.weight$') |
	tensor-cat -q -o miss/model.safetensors -
check_fail "missing tensor: exit 1, the tensor named" 1 "tensor 'model.layers.0.mlp.up_proj.weight' is missing" \
	convert miss out --bits 4 -q
check "missing tensor: no OUT, no work directory" test ! -e out -a ! -e out.work

mkdir shape
cp m/config.json m/tokenizer.json shape/
{ tensor-cat -q m $(tensor-ls m | jq -r '.name' | grep -v '^model.layers.0.mlp.down_proj.weight$')
  tensor-gen model.layers.0.mlp.down_proj.weight=64x100; } | tensor-cat -q -o shape/model.safetensors -
check_fail "wrong shape: exit 1, named" 1 "model.layers.0.mlp.down_proj.weight.*shape 64x100, config says 64x128" \
	convert shape out --bits 4 -q
check_fail "not a directory" 1 "nosuch: not a directory" convert nosuch out --bits 4
mkdir taken
check_fail "OUT exists and is not ours" 1 "taken exists" convert m taken --bits 4 -q

# validate on malformed directories
check_fail "validate: not a directory" 1 "nosuch: not a directory" validate nosuch
NO_INFO=bad   # no EXL3 linears, on purpose
mkdir bad
cp m/config.json bad/
check_fail "validate: no quantization_config" 1 "bad/config.json: no quantization_config" validate bad
validate bad >bad.json 2>/dev/null || true
check "validate: the report names the problem" \
	jqe '.ok == false and (.errors | any(test("no quantization_config")))' bad.json
jq '. + {quantization_config: {quant_method: "exl3", bits: 4, head_bits: 6, codebook: "mul1"}}' m/config.json >bad/config.json
tensor-cat -q m -o bad/model.safetensors
validate bad >bad.json 2>/dev/null || true
check "validate: unquantized linears are reported by name" \
	jqe '.ok == false and (.errors | any(test("linear .model.layers.0.self_attn.q_proj.: no EXL3 tensors")))' bad.json
done_testing
