#!/usr/bin/env bash
# t1864-convert-sensitivity: pipelines/convert --sensitivity on the generated
# 1-layer Llama (and a tiny Qwen3-MoE):
#   - measure: the file has a header naming the model (fingerprint) and the
#     measurement, one line per decoder linear, importance = numel * KL /
#     (numel * proxy_err) of its group; bitalloc gets it (plan "measured");
#     a group's KL is what model-eval --patch gives for its encode alone;
#   - the file round-trips: a conversion at another rate reuses it (same
#     importances in its plan's input), and so does a copy of the model;
#   - refused: a file of another model, one missing a tensor, not a file;
#   - direction: one tensor made very sensitive gets the high width, made
#     insensitive the low one (everything else unchanged);
#   - model-eval --patch refuses a trellis that is no linear of the model;
#   - a Qwen3-MoE converts with --sensitivity measure --sensitivity-by layer.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 1
cal=(--rows 12 --cols 64)
convert m q35 --bits 3.5 --work w "${cal[@]}" -j 2 -q --sensitivity measure
check "convert --sensitivity measure writes the pack" test -f q35/config.json
S=w/sensitivity.jsonl
check "the sensitivity file is kept in the work directory" test -s $S
ndec=$(tensor-ls --linears m | jq -s '[.[] | select(.role != "head")] | length')
check "one line per decoder linear ($ndec) after the header" \
	test "$(tail -n +2 $S | jq -s 'length')" -eq "$ndec"
check "the header names the model, its fingerprint and the measurement" \
	jqe -s '.[0].sensitivity | (.model | endswith("/m")) and (.fingerprint | length == 64) and .K == 3
		and .by == "tensor" and .rows >= 1 and .forwards == '"$((ndec + 2))"' and (.seconds >= 0)
		and (.kl_all > 0) and (.kl_sum > 0)' $S
check "importance = numel * KL / (numel * proxy_err), every one > 0" \
	jqe -s '.[1:] | all(.[]; .importance > 0 and ((.importance - .kl / .proxy_err) | fabs) <= 1e-9 * .importance)' $S
check "bitalloc allocated by the measured importance" jqe '.importance == "measured"' w/plan.json
check "the plan keeps the budget (bits <= 3.5)" jqe '.bits <= 3.5 and .bits > 3' w/plan.json
# one group again by hand: the original with that encode patched in
k=model.layers.0.mlp.down_proj
tensor-cat -q -o one.safetensors w/enc/$k.h1.k3.frames
model-eval -q --base w/sens/base.zst --quantized m --patch one.safetensors >one.json
check "a group's KL is model-eval --patch's for its encode" \
	test "$(jq .kl_divergence one.json)" = "$(jq --arg k $k 'select(.tensor == $k) | .kl' $S)"
{ cat w/enc/$k.h1.k3.frames; tensor-gen model.layers.1.mlp.nothing.trellis=16x16; } | tensor-cat -q -o bad.safetensors -
check_fail "model-eval --patch: a trellis that is no linear is refused" 1 "nothing.trellis' is no linear of" \
	model-eval -q --base w/sens/base.zst --quantized m --patch bad.safetensors
check_fail "model-eval --patch without --quantized is a usage error" 2 "--patch needs --quantized" \
	model-eval --model m --tokens w/cal/tokens.frames --patch one.safetensors

# reuse at another rate, and from a copy of the model
cp $S saved.jsonl
convert m q4 --bits 4 --work w "${cal[@]}" -j 2 -q --sensitivity saved.jsonl
check "convert --sensitivity FILE at 4 bpw" test -f q4/config.json
check "the reused file's importances are what bitalloc read" \
	test "$(jq -c 'select(.tensor) | {tensor, importance}' saved.jsonl | sort)" = "$(sort w/importance.jsonl)"
cp -r m mcopy
convert mcopy qc --bits 3.5 --work wc "${cal[@]}" -j 2 -q --makefile --sensitivity saved.jsonl >/dev/null
check "a copy of the model (same fingerprint) accepts the file" test -f wc/sens/given.jsonl

# refused
tiny_model other 2
check_fail "a file measured on another model is refused" 1 "not on .*refused" \
	convert other qo --bits 3.5 --work wo "${cal[@]}" -q --makefile --sensitivity saved.jsonl
head -n -1 saved.jsonl >short.jsonl
check_fail "a file missing a linear is refused" 1 "not the decoder linears" \
	convert m qs --bits 3.5 --work ws "${cal[@]}" -q --makefile --sensitivity short.jsonl
tail -n +2 saved.jsonl >nohead.jsonl
check_fail "a file without the header is refused" 1 "not a sensitivity file" \
	convert m qs --bits 3.5 --work ws "${cal[@]}" -q --makefile --sensitivity nohead.jsonl
check_fail "--sensitivity-by must be tensor, group or layer" 2 "sensitivity-by" \
	convert m qs --bits 3.5 --sensitivity measure --sensitivity-by head

# direction: one tensor very sensitive -> the high width; insensitive -> low
t=model.layers.0.self_attn.q_proj
base=$(jq -r --arg t $t '.tensors[$t]' w/plan.json)
jq -c --arg t $t 'if .tensor == $t then .importance *= 1e6 else . end' saved.jsonl >hot.jsonl
jq -c --arg t $t 'if .tensor == $t then .importance = 0 else . end' saved.jsonl >cold.jsonl
convert m qh --bits 3.5 --work w "${cal[@]}" -j 2 -q --sensitivity hot.jsonl
hot=$(jq -r --arg t $t '.tensors[$t]' w/plan.json)
convert m qk --bits 3.5 --work w "${cal[@]}" -j 2 -q --sensitivity cold.jsonl
cold=$(jq -r --arg t $t '.tensors[$t]' w/plan.json)
# (with --sensitivity the measured widths are floor(B)-1..ceil(B)+1: 2..5)
check "$t very sensitive gets the widest measured K=5 (measured plan: $base, now $hot)" test "$hot" -eq 5
check "$t insensitive gets the narrowest measured K=2 (now $cold)" test "$cold" -eq 2
check "the measured widths are 2..5" jqe '.histogram | keys - ["2", "3", "4", "5"] == []' w/plan.json

# measured again at another K in the same work directory: the new file
convert m q4m --bits 4 --work w "${cal[@]}" -j 2 -q --sensitivity measure
check "a measurement at K=4 after one at K=3 is the one allocated by" \
	jqe -s '.[0].sensitivity.K == 4' w/sensitivity.jsonl

# a mixture of experts, grouped by layer and role
"$ROOT/examples/make-tiny-llama" --arch qwen3-moe --experts 4 --top-k 2 --moe-inter 48 M 1 64 96 >/dev/null
convert M qm --bits 3 --work wm --rows 40 --cols 128 -j 2 -q --sensitivity measure --sensitivity-by layer
check "Qwen3-MoE converts with --sensitivity measure --sensitivity-by layer" test -f qm/config.json
check "its groups: the layer's attention and its routed experts" \
	jqe -s '.[0].sensitivity.groups == 2 and ([.[1:][] | .group] | unique == ["layer.0.attention", "layer.0.expert"])' wm/sensitivity.jsonl
check "every expert linear has an importance" \
	test "$(jq -r 'select(.group == "layer.0.expert") | .tensor' wm/sensitivity.jsonl | grep -c 'experts\.[0-9]*\.')" -eq 12
done_testing
