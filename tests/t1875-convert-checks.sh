#!/usr/bin/env bash
# convert -n runs the checks the real run runs before its first step, and
# the real run makes them before it creates anything: the config as the
# forward pass reads it (an unknown activation or RoPE scaling, rope_theta
# 0, an rms_norm_eps of 0, negative or NaN, another method's
# quantization_config), an empty calibration text, the device, free disk
# against the predicted peak.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 1

# bad NAME FILTER: a copy of m whose config.json is FILTER applied to m's
bad() {
	mkdir "$1"
	ln -s ../m/model.safetensors ../m/tokenizer.json "$1"/
	jq "$2" m/config.json >"$1/config.json"
}
# refused "what" STATUS PATTERN ARGS...: convert -n and the real run both
# fail with STATUS and PATTERN, and the real run leaves no trace
refused() {
	local what=$1 st=$2 pat=$3; shift 3
	check_fail "$what: convert -n refuses it" "$st" "$pat" convert -n "$@"
	check_fail "$what: the real run refuses it" "$st" "$pat" convert -q "$@"
	check "$what: nothing written" test ! -e out -a ! -e out.work -a ! -e out.lock
}
bad act '.hidden_act = "bogus"'
refused "hidden_act bogus" 1 "act: config.json: hidden_act 'bogus' is not supported" act out --bits 3
bad rope '.rope_scaling = {rope_type: "warp", factor: 2}'
refused "an unknown rope scaling type" 1 "rope: config.json: rope_scaling type 'warp' is not supported" rope out --bits 3
bad eps '.rms_norm_eps = -1'
refused "rms_norm_eps -1" 1 "eps: config.json: 'rms_norm_eps' = -1 is not positive" eps out --bits 3
bad eps0 '.rms_norm_eps = 0'
refused "rms_norm_eps 0" 1 "eps0: config.json: 'rms_norm_eps' = 0 is not positive" eps0 out --bits 3
# NaN as Python's json module writes it: not JSON, refused by the parser
bad epsnan '.rms_norm_eps = 12345'
sed -i 's/12345/NaN/' epsnan/config.json
refused "rms_norm_eps NaN" 1 "epsnan: config.json: line [0-9]+: invalid token near 'NaN'" epsnan out --bits 3
bad theta '.rope_theta = 0'
refused "rope_theta 0" 1 "theta: config.json: 'rope_theta' = 0 is not positive" theta out --bits 3
bad gptq '.quantization_config = {quant_method: "gptq", bits: 4, group_size: 128}'
refused "a checkpoint quantized by another method" 1 "gptq: config.json: quantization_config with quant_method 'gptq' is not supported" \
	gptq out --bits 3
: >empty.txt
refused "an empty calibration text" 1 "calibration text is empty" m out --bits 3 --cal empty.txt
# the device: where this machine has no usable GPU, -n says what the run would
why=$(had-rotate -q --device cuda </dev/null 2>&1 >/dev/null | sed -n 's/^had-rotate: --device cuda: //p')
if [ -n "$why" ]; then
	refused "--device cuda without a usable GPU" 1 "^convert: --device cuda: " m out --bits 3 --device cuda
else
	skip "--device cuda without a usable GPU: this machine has one"
fi
# more calibration tokens (rows x cols x 4 bytes: 2 TB) than the disk here
refused "a peak disk above the free space" 1 "out.work: [0-9]+ bytes free on its filesystem, the conversion needs about [0-9]+ more" \
	m out --bits 3 --rows 1000000000 --cols 512
check "a good model and settings: convert -n approves" convert -n m out --bits 3 --rows 8 --cols 64
check "... writing nothing" test ! -e out -a ! -e out.work
done_testing
