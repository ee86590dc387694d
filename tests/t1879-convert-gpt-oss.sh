#!/usr/bin/env bash
# t1879-convert-gpt-oss: a tiny seeded GPT-OSS (examples/make-tiny-llama
# --arch gpt_oss: hidden 80, 4 heads of 24 over 2 kv heads (96-wide
# queries), q/k/v/o biases, a learned sink a head, layer 0 sliding (window
# 32) and layer 1 full, yarn with truncate false, 4 experts 48 wide top 2
# with gate/up/down biases, the router with its bias, swiglu_limit 7: no
# dimension a multiple of 128), in the per-expert layout ExLlamaV3's
# gpt_oss.py loads, described and converted end to end by pipelines/convert
# at 2.5 and 4 bpw: the written directory holds the source's keys, the
# router, its bias and the sinks unquantized, every expert quantized with
# its bias and one K per projection over the layer's experts; validate
# accepts each; exl3-info --check exllamav3 is clean; the KL to the
# original falls as the bits rise and stays below round-to-nearest at the
# same bits; a pack whose config lacks a key ExLlamaV3 reads without a
# default (layer_types) fails its config rule. Bad inputs (sinks of the wrong length, a missing expert bias,
# a fused gate_up_proj without the hub's biases): exit 1 naming the
# tensor, nothing written. The forward itself: tests/unit/t1579; the
# hub's fused layouts: t1880.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny=("$ROOT/examples/make-tiny-llama" --arch gpt_oss --experts 4 --top-k 2 --heads 4 --kv-heads 2 --head-dim 24
      --window 32)
"${tiny[@]}" M 2 80 48 >/dev/null

# the description
check "GptOssForCausalLM is in tensor-ls --architectures" \
	sh -c "tensor-ls --architectures | jq -se 'map(select(.architecture == \"GptOssForCausalLM\") | .model_type) == [\"gpt_oss\"]' >/dev/null"
check "every module of the description is in the checkpoint" sh -c "tensor-ls --modules M >/dev/null"
check "linears: 2 x (4 attention + 4 x 3 experts), the head" test "$(tensor-ls --config M | jq .linears)" -eq 33
check "kept: router and its bias, the sinks (4 heads)" \
	test "$(tensor-ls --modules M | jq -c 'select(.layer == 0 and (.role == "router" or (.key | test("sinks")))) | [.key, .kind, .quantized, .shape]' | tr -d '\n')" = \
	     '["model.layers.0.self_attn.sinks","vector",false,[4]]["model.layers.0.mlp.router","matrix",false,[4,80]]["model.layers.0.mlp.router.bias","vector",false,[4]]'
check "--hq: attention 2 (ExLlamaV3's gpt_oss), experts 0" \
	test "$(tensor-ls --linears M | jq -c '[.role, .hq]' | sort -u | tr -d '\n')" = '["attention",2]["expert",0]["head",0]'
check "every attention and expert linear has a bias" \
	test "$(tensor-ls --linears M | jq -r 'select(.role != "head") | .bias' | sort -u)" = true
check "each expert projection tied over the layer's 4 experts" \
	test "$(tensor-ls --linears M | jq -r 'select(.role == "expert" and .layer == 1) | .tied_group' | sort | uniq -c | awk '{print $1, $2}' | tr '\n' ' ')" = \
	     "4 model.layers.1.mlp.experts.*.down_proj 4 model.layers.1.mlp.experts.*.gate_proj 4 model.layers.1.mlp.experts.*.up_proj "

for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog while the committee debates the budget."; done >eval.txt
ev=(--text eval.txt --rows 8 --cols 128)
build_rtn
tensor-ls M | jq -r .name | sed -E 's/\.(weight|bias)$//' | sort -u >src.keys
kl_prev=
for b in 2.5 4; do
	convert M q$b --bits $b --work w$b --rows 40 --cols 128 -j 2 2>convert$b.err >/dev/null
	check "convert --bits $b" test -f q$b/config.json
	check "$b bpw: the source's keys" \
		sh -c "tensor-ls q$b | jq -r .name | sed -E 's/\.(weight|bias|trellis|suh|svh|su|sv|mcg|mul1)\$//' | sort -u | cmp -s - src.keys"
	check "$b bpw: all 2 x 4 x 3 expert linears quantized, each with its bias" \
		test "$(tensor-ls q$b | jq -r .name | grep -c 'mlp\.experts\.[0-9]*\..*_proj\.\(trellis\|bias\)$')" -eq 48
	check "$b bpw: router, its bias and the sinks stored unquantized" \
		test "$(tensor-ls q$b | jq -c 'select(.name | test("^model.layers.1.(mlp.router|self_attn.sinks)")) | [.name, .shape]' | tr -d '\n')" = \
		     '["model.layers.1.mlp.router.weight",[4,80]]["model.layers.1.mlp.router.bias",[4]]["model.layers.1.self_attn.sinks",[4]]'
	check "$b bpw: exl3-info --check exllamav3 clean" \
		sh -c "exl3-info --check exllamav3 --json q$b | jq -e '.ok == true and (.violations | length) == 0' >/dev/null"
	validate q$b --model M "${ev[@]}" -q >v$b.json
	check "$b bpw: validate ok" jqe '.ok' v$b.json
	# round to nearest: every decoder linear at b bits, the head at 6; the
	# router, its bias and the sinks as the EXL3 model stores them
	kl_vs_rtn "$b bpw" M q$b $b v$b.json 'mlp\.router|self_attn\.sinks'
done

# a config without layer_types converts (GptOssConfig's default alternation)
# but ExLlamaV3's gpt_oss.py reads it without a default: the config rule
mkdir NL && cp q4/* NL/ && jq 'del(.layer_types)' q4/config.json >NL/config.json
exl3-info --check exllamav3 --json NL >NL.check 2>&1 && rc=0 || rc=$?
check "--check exllamav3 on a pack without layer_types: exit 1, the config rule naming it" \
	sh -c "[ $rc -eq 1 ] && jq -e '[.violations[] | [.rule, .tensor]] == [[\"config\", \"config.json\"]] and (.violations[0].message | test(\"layer_types\"))' NL.check >/dev/null"

# bad inputs: exit 1 naming the tensor, nothing written
mkdir bad1 && cp M/config.json M/tokenizer*.json bad1/
{ tensor-ls M | jq -r .name | grep -vxF model.layers.1.self_attn.sinks | xargs tensor-cat -q M
  tensor-gen "model.layers.1.self_attn.sinks=5"; } | tensor-cat -q -o bad1/model.safetensors -
check_fail "convert: sinks of 5 for 4 heads, named" 1 "model\.layers\.1\.self_attn\.sinks" \
	convert bad1 bad1.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad1.out
mkdir bad2 && cp M/config.json M/tokenizer*.json bad2/
tensor-ls M | jq -r .name | grep -vxF model.layers.0.mlp.experts.2.down_proj.bias | xargs tensor-cat -q M |
	tensor-cat -q -o bad2/model.safetensors -
check_fail "convert: a missing expert bias named" 1 "model\.layers\.0\.mlp\.experts\.2\.down_proj\.bias" \
	convert bad2 bad2.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad2.out
mkdir bad3 && cp M/config.json M/tokenizer*.json bad3/
{ tensor-cat -q M; tensor-gen "model.layers.1.mlp.experts.gate_up_proj=4x80x96"; } |
	tensor-cat -q -o bad3/model.safetensors -
check_fail "convert: a fused gate_up_proj without the hub's biases refused, named" 1 \
	"model\.layers\.1\.mlp\.experts\.gate_up_proj.*not a layout of GPT-OSS's experts" convert bad3 bad3.out --bits 3 --rows 4 --cols 32 -q
check "... nothing written" test ! -e bad3.out
NO_INFO="bad1 bad2 bad3 NL"
done_testing
