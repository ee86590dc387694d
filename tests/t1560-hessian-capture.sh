#!/usr/bin/env bash
# hessian-capture: command line, synthetic models, bad inputs (config, shapes,
# shards, architectures, tokens), non-finite activations and the 10% limit.
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/synth-model.sh"
cd "$TMP"

synth_model m 32 48 2 4 2 64 1 || notok "synthetic model"
synth_tokens tok 4 16 64 1

check "-h prints usage, exit 0" bash -c 'hessian-capture -h | grep -q "^usage: hessian-capture"'
check_fail "no --model" 2 "model is required" hessian-capture --tokens tok
check_fail "--text and --tokens" 2 "either --text or --tokens" hessian-capture --model m --tokens tok --text x
check_fail "--merge with a model" 2 "takes frames" hessian-capture --merge --model m
check_fail "--quantized without --layers" 2 "needs --layers" hessian-capture --model m --tokens tok --quantized m
check_fail "bad --layers" 2 "layers" hessian-capture --model m --tokens tok --layers 2-1
check_fail "bad --rows" 2 "rows" hessian-capture --model m --tokens tok --rows 0

hessian-capture --model m --tokens tok >h
check "9 frames for 2 layers + head" test "$(tensor-ls h | wc -l)" -eq 9
check "count = 4 x 16 everywhere" test "$(tensor-ls h | jq -r .meta.count | sort -u)" = 64
check "down_proj input is 48 wide" test "$(tensor-ls h | jq -c 'select(.name == "model.layers.1.mlp.down_proj.input") | .shape')" = "[48,48]"
check_fail "layer past the head" 1 "layer 3 does not exist" hessian-capture --model m --tokens tok --layers 3
check "--layers 1- gives layer 1 and the head" \
	test "$(hessian-capture --model m --tokens tok --layers 1- | tensor-ls | jq -r .meta.layer | tr -d '\n')" = 11112

# --timing: one JSON object, the phases >= 0 and adding up to seconds; the
# Hessians the same with it; refused where there is no capture
hessian-capture --model m --tokens tok --timing tm.json >h3
check "--timing: the same Hessians" cmp -s h h3
check "--timing: program, layers, rows, cols, device" \
	jq -e '.program == "hessian-capture" and .layers == [0, 2] and .rows == 4 and .cols == 16 and .device == "cpu"' tm.json
check "--timing: the seven phases, each >= 0, adding up to seconds" \
	jq -e '(.timing | keys) == ["linears", "load", "other", "start", "sums", "tokens", "write"] and
		all(.timing[]; . >= 0) and .seconds > 0 and
		(([.timing[]] | add) - .seconds | fabs) <= 0.001 + 0.01 * .seconds' tm.json
check_fail "--timing with --merge" 2 "timing reports a capture" hessian-capture --merge --timing x h
check_fail "--timing with --list-parts" 2 "list-parts prints the chunks" \
	hessian-capture --model m --tokens tok --chunk-rows 2 --list-parts --timing x
check_fail "--timing into a missing directory" 1 "timing nodir/t.json" \
	hessian-capture --model m --tokens tok --timing nodir/t.json -o h4
check "--timing's failure after a complete output: the output is there" cmp -s h h4

# fewer tokens than asked for: warn and use them, or fail with --strict
hessian-capture --model m --tokens tok --rows 10 >h2 2>err
check "short input: warning" grep -q "only 4 rows of 16" err
check "short input: the rows there are" test "$(tensor-ls h2 | jq -r .meta.count | sort -u)" = 64
check_fail "short input with --strict" 1 "fewer than the 10 requested" hessian-capture --model m --tokens tok --rows 10 --strict
check "--cols re-cuts the tokens" test "$(hessian-capture --model m --tokens tok --cols 32 --layers 0-0 | tensor-ls | jq -r .meta.count | sort -u)" = 64
tensor-gen -d constant --value 64 -t I32 tokens=1x8 >badtok
check_fail "token id outside the vocabulary" 1 "token id 64 .*outside the vocabulary" hessian-capture --model m --tokens badtok
tensor-gen x=2x3 >ftok
check_fail "float token frames" 1 "not an integer type" hessian-capture --model m --tokens ftok

# bad model directories
cp -r m trunc && head -c 100 m/config.json >trunc/config.json
check_fail "truncated config.json" 1 "trunc: config.json: line" hessian-capture --model trunc --tokens tok
cp -r m arch && sed -i 's/LlamaForCausalLM/GPTNeoXForCausalLM/' arch/config.json
check_fail "unknown architecture" 1 "architecture 'GPTNeoXForCausalLM' is not supported" hessian-capture --model arch --tokens tok
cp -r m longrope && sed -i 's/"hidden_act"/"rope_scaling": {"rope_type": "longrope", "factor": 4.0}, "hidden_act"/' longrope/config.json
check_fail "rope_scaling longrope without its factor lists" 1 "rope_scaling longrope needs a 'long_factor' array" hessian-capture --model longrope --tokens tok
cp -r m shape && sed -i 's/"intermediate_size": 48/"intermediate_size": 40/' shape/config.json
check_fail "tensor shape disagreeing with config" 1 "model.layers.0.mlp.gate_proj.weight': shape 48x32, config says 40x32" hessian-capture --model shape --tokens tok
synth_model big 256 512 2 4 2 64 1
mkdir noshard && cp big/config.json noshard/ && tensor-cat -q big -o noshard --shard-size 1
check "sharded copy captures the same" cmp -s <(hessian-capture --model big --tokens tok) <(hessian-capture --model noshard --tokens tok)
rm -f noshard/model-00002-of-*.safetensors
check_fail "missing shard" 1 "model-00002-of-" hessian-capture --model noshard --tokens tok
mkdir nomodel
check_fail "no config.json" 1 "nomodel/config.json" hessian-capture --model nomodel --tokens tok

# non-finite activations: dropped and counted; more than 10% aborts
{ tensor-gen -s 1 a=18x4 --meta group=g; tensor-gen -d constant --value nan a=1x4 --meta group=g
  tensor-gen -s 2 a=1x4 --meta group=g; } >act1
hessian-capture --activations act1 >ha 2>err
check "1 NaN row in 20: accepted" test "$(tensor-ls ha | jq -r '.meta.count + "/" + .meta.dropped')" = 19/1
check "1 NaN row in 20: warned" grep -q "1 of 20 rows dropped" err
{ tensor-gen -s 1 a=18x4; tensor-gen -d constant --value inf a=3x4; } >act2
check_fail "3 Inf rows in 21: abort" 1 "'a': 3 of 21 rows dropped for non-finite values \(more than 10%\)" hessian-capture --activations act2
check "--name overrides" test "$(hessian-capture --activations --name x.input act1 | tensor-ls | jq -r .name)" = x.input
check_fail "--activations of a 3-D frame" 1 "rows x k" bash -c 'tensor-gen a=2x2x2 | hessian-capture --activations'
check_fail "--merge of a non-square frame" 1 "not a square matrix" bash -c 'tensor-gen a=2x3 | hessian-capture --merge'
check_fail "--merge without count" 1 "no metadata 'count'" bash -c 'tensor-gen -d spd a=4x4 | hessian-capture --merge'
check_fail "--merge of different sizes" 1 "shape 5x5, expected 4x4" bash -c '{ tensor-gen -d spd --meta count=1 a=4x4; tensor-gen -d spd --meta count=1 a=5x5; } | hessian-capture --merge'

# calibration text through the model's tokenizer
if have_shared; then
	S=$SHARED/models/stories260K
	zstd -dc "$SHARED/data/sotu.txt.zst" | head -n 12 >cal.txt
	hessian-capture --model "$S" --text cal.txt --rows 6 --cols 128 --layers 0-0 >ht 2>err
	check "--text: 6 rows of 128 tokens" test "$(tensor-ls ht | jq -r .meta.count | sort -u)" = 768
	check "--text: no warning when the text suffices" test ! -s err
	hessian-capture --model "$S" --text cal.txt --rows 6 --cols 128 --layers 0-0 --zstd >htz
	check "--zstd output decodes to the same frames" cmp -s <(tensor-cat htz) <(tensor-cat ht)
	head -c 300 cal.txt >short.txt
	hessian-capture --model "$S" --text short.txt --rows 6 --cols 32 --layers 0-0 --stream >hs 2>err
	check "--text short: warns" grep -q "calibration text gives only" err
	n=$(tensor-ls hs | jq -r .meta.count | sort -u)
	check "--text short: uses the rows there are ($n tokens)" test "$n" -gt 0 -a "$n" -lt 192
	check_fail "--text short with --strict" 1 "fewer than the 6 requested" hessian-capture --model "$S" --text short.txt --rows 6 --cols 32 --stream --strict
	check "--text from stdin, zstd" test "$(zstd -c cal.txt | hessian-capture --model "$S" --text - --rows 2 --cols 64 --layers 5 | tensor-ls | jq -r .meta.count)" = 128
else
	skip "stories260K not available"
fi
done_testing
