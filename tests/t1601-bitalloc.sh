#!/usr/bin/env bash
# t1601-bitalloc: the command line: plan fields, the bits constraint,
# comparison with ExLlamaV3's greedy, --set/--hq/--importance, bad input.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-pack.sh"
cd "$TMP" || exit 1

gen_measure 4 >m.jsonl
# achieved bits of a plan, recomputed from the measurements
bits_of() { jq -s --slurpfile p "$1" 'map(select(.K == 1)) | (map(.numel * $p[0].tensors[.tensor]) | add) / (map(.numel) | add)' m.jsonl; }

check "bitalloc --bits 3.5" bitalloc -q --bits 3.5 -o plan.json m.jsonl
check "a K for all 28 linears" test "$(jq '.tensors | length' plan.json)" -eq 28
check "plan bits <= target (recomputed: $(bits_of plan.json))" jqt -n "$(bits_of plan.json) <= 3.5"
check "plan bits as reported" jqt -n "($(bits_of plan.json) - $(jq .bits plan.json)) | fabs < 1e-9"
check "close to the target (within one K step of the smallest tensor)" \
	jqt -n "$(bits_of plan.json) > 3.5 - 64*32*1/$(jq .numel plan.json)"
check "histogram counts every tensor" test "$(jq '.histogram | add' plan.json)" -eq 28
check "histogram_numel sums to numel" test "$(jq '.histogram_numel | add' plan.json)" -eq "$(jq .numel plan.json)"
check "fields: target, head_bits, strategy, importance" \
	test "$(jq -c '[.target, .head_bits, .strategy, .importance]' plan.json)" = '[3.5,6,"optimal","numel"]'
check "expected error <= exllamav3 strategy's and < uniform K=3" \
	jqt -n "$(jq '.expected_error <= .exllamav3_error and .expected_error < .uniform_error' plan.json)"
bitalloc -q --bits 3.5 --strategy exllamav3 m.jsonl >ex.json
check "exllamav3 strategy: same error as reported for comparison" \
	test "$(jq .expected_error ex.json)" = "$(jq .exllamav3_error plan.json)"
check "exllamav3 strategy within the target" jqt -n "$(bits_of ex.json) <= 3.5"
bitalloc -q --bits 3.5 --method lagrangian m.jsonl >lg.json
check "Lagrangian plan within the target and no better than the DP" \
	jqt -n "$(bits_of lg.json) <= 3.5 and $(jq .expected_error lg.json) >= $(jq .expected_error plan.json) * (1 - 1e-12)"
check "stdin input same as file" cmp -s <(bitalloc -q --bits 3.5 <m.jsonl) plan.json
check "summary on stderr" bash -c 'bitalloc --bits 3.5 m.jsonl 2>&1 >/dev/null | grep -q "bpw (target 3.5)"'

sed 's/"numel"/"x": 1, "numel"/; s/_proj"/_proj.weight"/' m.jsonl >mw.jsonl
check "names with .weight and extra fields give the same plan" cmp -s <(bitalloc -q --bits 3.5 mw.jsonl) plan.json

# constraints
bitalloc -q --bits 4.2 --set 'mlp\.down_proj$=6' --hq m.jsonl >c.json
check "--set fixes down_proj at 6" \
	test "$(jq '[.tensors | to_entries[] | select(.key | endswith("down_proj")) | .value] | unique' -c c.json)" = '[6]'
bitalloc -q --bits 4.2 --set 'mlp\.down_proj$=6' m.jsonl >c0.json
check "--hq on a dense Llama's keys promotes nothing (ExLlamaV3's llama.py has no select_hq_bits)" \
	test "$(jq -c .tensors c.json)" = "$(jq -c .tensors c0.json)"
check "constraints still within the target" jqt -n "$(bits_of c.json) <= 4.2"
bitalloc -q --bits 3.5 --head-bits 16 m.jsonl >h.json
check "--head-bits 16 in the plan" test "$(jq .head_bits h.json)" = 16
{ cat m.jsonl; echo '{"tensor": "lm_head", "K": 6, "proxy_err": 0.001, "numel": 8192}'; } >mh.jsonl
check "head listed with head_bits, excluded from the budget" \
	test "$(bitalloc -q --bits 3.5 mh.jsonl | jq -c '[.tensors.lm_head, .numel]')" = "[6,$(jq .numel plan.json)]"
# importance: make layer 3 matter 1000x more: it must not get fewer bits
jq -c '{tensor, importance: (if (.tensor | startswith("model.layers.3.")) then 1000 * .numel else .numel end)}' \
	<(jq -c 'select(.K == 1)' m.jsonl) >imp.jsonl
bitalloc -q --bits 3.5 --importance imp.jsonl m.jsonl >i.json
check "--importance recorded" test "$(jq -r .importance i.json)" = measured
check "--importance: the important layer gets more bits" \
	jqt -n "$(jq '[.tensors | to_entries[] | select(.key | startswith("model.layers.3.")) | .value] | add' i.json) > $(jq '[.tensors | to_entries[] | select(.key | startswith("model.layers.3.")) | .value] | add' plan.json)"

# real measurements: trellis-encode --measure 2,3,4,5 of every linear of
# stories260K (uncalibrated), saved in tests/data
R=$ROOT/tests/data/stories260K-measure.jsonl
for b in 2.5 3.25 3.5 4.25; do
	bitalloc -q --bits $b "$R" >r.json
	check "stories260K at $b: within target, optimal <= exllamav3 and <= uniform" jqt --argjson b $b \
		'.bits <= $b and .expected_error <= .exllamav3_error and .expected_error <= .uniform_error' r.json
done
check "stories260K at 4.75: exllamav3 picks unmeasured K 6, its error is null" \
	test "$(bitalloc -q --bits 4.75 "$R" | jq -c '[.exllamav3_error, (.tensors | map(select(. > 5)) | length)]')" = '[null,0]'

# bad input
jq -c 'del(.numel)' m.jsonl | head -3 >nonumel.jsonl
check_fail "missing numel" 1 "nonumel.jsonl:1: tensor 'model.layers.0.self_attn.q_proj': missing field \"numel\"" \
	bitalloc --bits 3 nonumel.jsonl
echo '{"tensor": "a.b", "K": 3, "proxy_err": NaN, "numel": 64}' >nan.jsonl
check_fail "NaN literal" 1 "nan.jsonl:1: invalid JSON" bitalloc --bits 3 nan.jsonl
echo '{"tensor": "a.b", "K": 3, "proxy_err": "nan", "numel": 64}' >nans.jsonl
check_fail "NaN as a string" 1 "tensor 'a.b': \"proxy_err\" is not a number" bitalloc --bits 3 nans.jsonl
echo '{"tensor": "a.b", "K": 3, "proxy_err": -1, "numel": 64}' >oom.jsonl
check_fail "failed measurement (-1)" 1 "proxy_err is -1" bitalloc --bits 3 oom.jsonl
jq -c 'select(.K >= 2 and .K <= 5)' m.jsonl >m25.jsonl
check_fail "target below the minimum measured K" 1 \
	"target 1.5 bits is below the minimum 2.0000: the measured/allowed widths reach 2.0000..5.0000 bits" \
	bitalloc --bits 1.5 m25.jsonl
# above it: an error naming the range, not a 5.0 bpw plan that exits 0
# (and "exllamav3 strategy: nan" in the summary)
check_fail "target above the measured range" 1 \
	"^bitalloc: target 5.5 bits is above the maximum 5.0000: the measured/allowed widths reach 2.0000..5.0000 bits" \
	bitalloc --bits 5.5 m25.jsonl
check "... no plan on stdout" test ! -s "$TMP/cf.out"
check "the top of the range is reachable: all at 5" \
	test "$(bitalloc -q --bits 5 m25.jsonl | jq -c '[.tensors[]] | unique')" = '[5]'
bitalloc --bits 5.5 --strategy exllamav3 m25.jsonl 2>ex.err >/dev/null
check "exllamav3 strategy with unmeasured widths: no nan in the summary" \
	grep -q "expected error unknown (widths not measured)" ex.err
check "... nor anywhere" sh -c '! grep -qi nan ex.err'
check_fail "--set matching nothing" 1 "fc1=4': the regex matches no measured tensor" \
	bitalloc --bits 3 --set 'mlp\.fc1=4' m.jsonl
check_fail "--set with an unmeasured K" 1 "asks for K=7, which was not measured" \
	bitalloc --bits 3 --set 'down_proj=7' m25.jsonl
check_fail "--importance missing a tensor" 1 "no importance given" bitalloc --bits 3 --importance <(head -2 imp.jsonl) m.jsonl
check_fail "--bits required" 2 "--bits or --size is required" bitalloc m.jsonl
check_fail "--bits out of range" 2 "--bits: '9'" bitalloc --bits 9 m.jsonl
check_fail "bad --set" 2 "--set: 'foo' is not REGEX=K" bitalloc --bits 3 --set foo m.jsonl
check_fail "--set with an invalid regex: a usage error" 2 \
	"--set: regex '\\(': missing closing parenthesis" bitalloc --bits 3 --set '(=3' m.jsonl
check_fail "missing file" 1 "nosuch.jsonl: No such file" bitalloc --bits 3 nosuch.jsonl
check "-h on stdout, exit 0" bash -c 'bitalloc -h | grep -q "^usage: bitalloc --bits B"'

# mixture of experts (Qwen2-MoE keys): experts count in the average like
# every linear, --set works on expert keys, and the plan and the summary
# give the averages by role
moe_meas() {
	local p=model.layers.0 k
	for k in 2 3 4 5 6; do
		# shellcheck disable=SC2046
		for t in "self_attn.q_proj 4096" "self_attn.o_proj 4096" "mlp.experts.2.down_proj 3072" \
			$(for e in $(seq 0 15); do echo "mlp.experts.$e.gate_proj:3072"; done) \
			"mlp.shared_expert.up_proj 6144"; do
			t=${t/:/ }
			set -- $t
			echo "{\"tensor\": \"$p.$1\", \"K\": $k, \"proxy_err\": $(awk -v k=$k -v n=${#1} 'BEGIN { print (1 + n / 10) * 4 ^ -k }'), \"numel\": $2}"
		done
		echo "{\"tensor\": \"lm_head\", \"K\": $k, \"proxy_err\": 0.1, \"numel\": 16384}"
	done
}
moe_meas >moe.jsonl
# the experts' gate_proj of a layer are one tied group (a reader loads them
# as one module): --set on one of them alone is refused, naming the group
check_fail "MoE: --set on one expert of a tied group refused, naming the group" 1 \
	"'model.layers.0.mlp.experts.1.gate_proj' is fixed at K=2 but 'model.layers.0.mlp.experts.0.gate_proj' is not: they are one tied group 'model.layers.0.mlp.experts.\*.gate_proj'" \
	bitalloc --bits 3.5 --set 'mlp\.experts\.1\.=2' moe.jsonl
bitalloc --bits 3.5 --set 'mlp\.experts\.[0-9]+\.gate_proj=3' -o me.json moe.jsonl 2>me.err
check "MoE: --set on the whole tied group fixes every expert" \
	test "$(jq '[.tensors | to_entries[] | select(.key | test("experts\\.[0-9]+\\.gate")) | .value] | unique' -c me.json)" = '[3]'
bitalloc --bits 3.5 -o mt.json moe.jsonl 2>mt.err
check "MoE: one K for the 16 experts' gate_proj of the layer (a tied group)" \
	test "$(jq '[.tensors | to_entries[] | select(.key | test("experts\\.[0-9]+\\.gate")) | .value] | unique | length' mt.json)" -eq 1
check "MoE: the plan and the summary count the tied groups (gate_proj, down_proj)" \
	sh -c "jq -e '.tied_groups == 2' mt.json >/dev/null && grep -q '^bitalloc: 2 tied groups' mt.err"
bitalloc -q --bits 3.5 --strategy exllamav3 -o mx.json moe.jsonl
check "MoE: ExLlamaV3's greedy gives the tied group one K too" \
	test "$(jq '[.tensors | to_entries[] | select(.key | test("experts\\.[0-9]+\\.gate")) | .value] | unique | length' mx.json)" -eq 1
check "MoE: the experts count in the bits average (numel-weighted over all 20 linears <= 3.5)" \
	jqt -n "$(jq -s --slurpfile p me.json 'map(select(.K == 2 and .tensor != "lm_head")) | (map(.numel * $p[0].tensors[.tensor]) | add) / (map(.numel) | add)' moe.jsonl) as \$b | \$b <= 3.5 and (\$b - $(jq .bits me.json) | fabs) < 1e-9"
check "MoE: the plan's roles: attention, expert, shared_expert, head" \
	test "$(jq -c '.roles | [keys[], .expert.linears, .head.bits]' me.json)" = '["attention","expert","head","shared_expert",17,6]'
check "MoE: the roles' averages make up the plan's bits" \
	jqt -n "$(jq '[.roles | to_entries[] | select(.key != "head") | .value] | (map(.bits * .numel) | add) / (map(.numel) | add)' me.json) - $(jq .bits me.json) | fabs < 1e-9"
check "MoE: the summary gives the bits by role" \
	grep -Eq '^bitalloc: bits by role: attention [0-9.]+ \(2 linears\), expert [0-9.]+ \(17 linears\), shared_expert [0-9.]+ \(1 linears\), head 6.000 \(1 linears\)$' me.err
# --hq by the family's table (--model): a Qwen2-MoE's attention and shared
# expert at 3+2, not its experts (measurements of equal error per weight,
# where the optimal plan promotes nothing by itself)
"$ROOT/examples/make-tiny-llama" --arch qwen2-moe q2m 2 64 128 >/dev/null
tensor-ls --linears q2m | jq -c 'select(.role != "head") | . as $m | range(2; 7) as $k |
	{tensor: $m.key, K: $k, proxy_err: (1 / pow(4; $k)), numel: ($m.shape[0] * $m.shape[1])}' >q2m.jsonl
bitalloc -q --bits 3.5 --model q2m -o mh0.json q2m.jsonl
bitalloc -q --bits 3.5 --hq --model q2m -o mh.json q2m.jsonl
hqsel='[.tensors | to_entries[] | select(.key | test("layers\\.1\\.(self_attn|mlp\\.shared_expert\\.)")) | .value]'
check "MoE --hq: Qwen2-MoE's attention and shared expert at 3+2 or more (without --hq: below)" \
	sh -c "jq -e '$hqsel | length == 7 and min >= 5' mh.json >/dev/null && jq -e '$hqsel | min < 5' mh0.json >/dev/null"
check "... not its routed experts (some below 4), the target kept" \
	jq -e '([.tensors | to_entries[] | select(.key | test("experts\\.")) | .value] | min < 4) and .bits <= 3.5' mh.json

# Qwen3.5 as ExLlamaV3's qwen3_5.py: --hq promotes attention and the
# DeltaNet only in the MoE model; the greedy's priority of the DeltaNet is
# 1 + hq (gated_delta_net.py), attention's 2 + hq: at 3.15 bpw the dense
# model's one full-attention layer gets the bit, no DeltaNet does
"$ROOT/examples/make-tiny-llama" --arch qwen3_5 --text-only q35 4 64 128 >/dev/null
"$ROOT/examples/make-tiny-llama" --arch qwen3_5_moe --text-only q35m 4 64 128 >/dev/null
check "Qwen3.5 --hq: dense nothing; MoE attention, DeltaNet and shared expert +2, experts 0" sh -c '
	test "$(tensor-ls --linears q35 | jq -sc "[.[] | select(.role != \"mtp\") | .hq] | unique")" = "[0]" &&
	test "$(tensor-ls --linears q35m | jq -sc "[.[] | select(.role != \"mtp\") | [.role, .hq]] | unique")" = \
	     "[[\"attention\",2],[\"expert\",0],[\"head\",0],[\"shared_expert\",2]]"'
tensor-ls --linears q35 | jq -c 'select(.role != "head" and .role != "mtp") | . as $m | range(2; 7) as $k |
	{tensor: $m.key, K: $k, proxy_err: (1 / pow(4; $k)), numel: ($m.shape[0] * $m.shape[1])}' >q35.jsonl
check "Qwen3.5 ExLlamaV3 greedy at 3.15: the full-attention layer promoted, no DeltaNet linear" \
	test "$(bitalloc -q --bits 3.15 --strategy exllamav3 --model q35 q35.jsonl | jq -c '[.tensors | to_entries[] | select(.value > 3) | .key | sub("model.layers."; "")]')" = \
	     '["3.self_attn.q_proj","3.self_attn.k_proj","3.self_attn.v_proj","3.self_attn.o_proj"]'

# a key's --hq comes from its own architecture's table when --model names
# the model: DeepSeek V3's dense MLP (+1) has Llama's key pattern (+0)
"$ROOT/examples/make-tiny-llama" --arch deepseek_v3 dsk 2 64 128 >/dev/null
tensor-ls --linears dsk | jq -c 'select(.role != "head" and .role != "mtp") | . as $m | range(2; 7) as $k |
	{tensor: $m.key, K: $k, proxy_err: (1 / pow(4; $k)), numel: ($m.shape[0] * $m.shape[1])}' >dsk.jsonl
bitalloc -q --bits 3.5 --hq -o dsk1.json dsk.jsonl
bitalloc -q --bits 3.5 --hq --model dsk -o dsk2.json dsk.jsonl
check "DeepSeek V3 --hq with --model: the dense MLP floored at 3+1 (without: Llama's table, 3)" \
	jqt -n "$(jq -c '[.tensors["model.layers.0.mlp.gate_proj"], .tensors["model.layers.0.mlp.down_proj"]]' dsk1.json dsk2.json | paste -sd' ' | sed 's/ /, /; s/^/[/; s/$/]/') | (.[1] | min >= 4) and (.[0] | min < 4)"

# --predict names the model in its JSON line: a path that is not UTF-8
# cannot be written there, and the line is not printed without it
check "--predict: the model's path in the line" jqt -n "$(bitalloc --predict --model dsk --bits 3.5 | jq '.model == "dsk"')"
ln -s dsk $'d\xff'
check_fail "--predict with a model path that is not UTF-8: an error naming 'model'" 1 \
	"^bitalloc: --predict: cannot write 'model': the value is not UTF-8$" bitalloc --predict --model $'d\xff' --bits 3.5

jqe() { jq -e "$@" >/dev/null; }
# --lines: the measurement line of a trellis-encode frame stream (the
# trellis frame's metadata) and of its --measure --sample lines
tensor-gen -s 3 w=32x256 | had-rotate -q --out-scales always | trellis-encode -q -K 3 >lw.frames
check "--lines: a trellis frame's metadata as {tensor, K, proxy_err, numel}" \
	jqe --argjson p "$(tensor-ls lw.frames | jq -r 'select(.meta.role == "trellis") | .meta.proxy_err')" \
	'.tensor == "w" and .K == 3 and .numel == 8192 and .proxy_err == $p and (keys | length) == 4' \
	<(bitalloc --lines lw.frames)
echo '{"tensor":"w","K":2,"proxy_err":0.25,"numel":8192,"sample":0.5,"strips":8,"strips_total":16,"extra":1}' >lw.json
check "--lines: a sampled line passed on with how it was sampled (null where absent), nothing else" \
	test "$(bitalloc --lines lw.json)" = '{"tensor":"w","K":2,"proxy_err":0.25,"numel":8192,"sample":0.5,"strips":8,"strips_total":16,"search_tiles":null,"ldlq_tiles":null}'
check "a plan with --measurement sums the sampled work (measurement_work)" \
	jqe '.measurement_work == {strips: 8, strips_total: 16, viterbi_tiles: {search: 0, ldlq: 0}}' \
	<(bitalloc -q --bits 2 --measurement '{"method":"sample","sample":0.5}' <(bitalloc --lines lw.json))

done_testing
