#!/usr/bin/env bash
# t1621-reader-contract: packs that their readers load (lib/arch/reader.h).
# Tiny seeded mixture-of-experts models of every MoE family, converted at
# fractional rates (2.5 and 3.5 bpw), where the allocation could give the
# experts of one layer different widths: one K per tied group (each
# projection over all experts of a layer, which ExLlamaV3 loads as one
# MultiLinear), the rate met, and exl3-info --check exllamav3 clean where
# ExLlamaV3 loads the model. DeepSeek-V3's kv_b_proj is stored as the
# source tensor. Packs made wrong by hand (experts of mixed K, a quantized
# kv_b_proj) fail the check naming the tensor and the rule, and pack-write
# --check refuses to write them.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP" || exit 1
# fails1 "what" OUT cmd...: cmd exits 1 (its standard output in OUT)
fails1() {
	local what=$1 out=$2 rc=0; shift 2
	"$@" >"$out" 2>&1 || rc=$?
	if [ "$rc" -eq 1 ]; then ok "$what"; else notok "$what"; echo "#   exit $rc (want 1)"; sed 's/^/#   /' "$out" | head -5; fi
}
mk() { "$ROOT/examples/make-tiny-llama" --experts 4 --top-k 2 "$@" >/dev/null; }
mk --arch mixtral MX 2 32 40
mk --arch qwen3-moe --moe-inter 24 --dense-layers 0 Q3 2 32 48
mk --arch qwen2-moe --moe-inter 20 --shared-inter 36 Q2 1 32 48
mk --arch glm4_moe --moe-inter 20 --groups 1,1 GL 2 32 48
mk --arch deepseek_v3 --moe-inter 20 --groups 1,1 DS 2 32 48

for m in MX Q3 Q2 GL DS; do
	ngroups=$(tensor-ls --linears $m | jq -r '.tied_group // empty' | sort -u | wc -l)
	check "$m: the description ties each expert projection of a sparse layer ($ngroups groups)" test "$ngroups" -ge 3
	for b in 2.5 3.5; do
		q=$m.q$b
		# one work directory for both rates: the second encodes only its new K
		convert $m $q --bits $b --work $m.w --keep-hessians --rows 16 --cols 64 -j 2 -q 2>$q.err
		check "$m $b bpw: convert" test -f $q/config.json
		exl3-info --json $q >$q.info.json
		check "$m $b bpw: one K per tied group ($ngroups groups)" \
			jqe --argjson n "$ngroups" '(.tied_groups | length) == $n and all(.tied_groups[]; .one_k)' $q.info.json
		check "$m $b bpw: $(jq .summary.bits $q.info.json) bits, within 0.05 of the target" \
			num_near "$(jq .summary.bits $q.info.json)" $b 0.05
		if [ $m = Q2 ]; then
			fails1 "$m $b bpw: --check exllamav3 says ExLlamaV3 does not load Qwen2-MoE" $q.check \
				exl3-info --check exllamav3 $q
			check "$m $b bpw: the family rule names config.json" \
				grep -q '^exllamav3: config.json: family: exllamav3 does not load Qwen2MoeForCausalLM' $q.check
			check "$m $b bpw: --check auto checks no reader" \
				sh -c "exl3-info --check auto $q | grep -q 'auto: no reader checked'"
		else
			check "$m $b bpw: exl3-info --check exllamav3 clean" sh -c "exl3-info --check exllamav3 $q >$q.check"
		fi
	done
done

# --size plans in bytes with the same items: one K per tied group
sz=$(( $(cat MX.q2.5/* | wc -c) + 2000 ))
convert MX MX.qs --size $sz --work MX.w --keep-hessians --rows 16 --cols 64 -j 2 -q
check "MX --size $sz: one K per tied group, the pack within the size" \
	sh -c "exl3-info --json MX.qs | jq -e 'all(.tied_groups[]; .one_k)' >/dev/null && [ \$(cat MX.qs/* | wc -c) -le $sz ]"

# DeepSeek-V3's kv_b_proj: the source tensor, byte for byte
for b in 2.5 3.5; do
	q=DS.q$b
	check "DS $b bpw: kv_b_proj has no EXL3 tensors" \
		test "$(tensor-ls $q | jq -r .name | grep -c 'kv_b_proj\.\(trellis\|suh\|svh\)')" -eq 0
	for l in 0 1; do
		n=model.layers.$l.self_attn.kv_b_proj.weight
		rm -f src.$l.safetensors got.$l.safetensors
		tensor-cat -q --dtype F16 -o src.$l.safetensors DS "$n"
		tensor-cat -q -o got.$l.safetensors $q "$n"
		check "DS $b bpw: layer $l's kv_b_proj.weight stored as the source's (F32 as F16, as every kept tensor)" \
			cmp -s src.$l.safetensors got.$l.safetensors
	done
done
check "DS: kv_b_proj is a kept matrix of the description, not a linear" \
	test "$(tensor-ls --modules DS | jq -c 'select(.key | endswith("kv_b_proj")) | [.kind, .quantized]' | sort -u)" = '["matrix",false]'

# grouped routing: ExLlamaV3 v1.4.1 refuses DeepSeek-V3 with n_group > 1
mk --arch deepseek_v3 --moe-inter 20 DG 2 32 48
convert DG DG.q --bits 3 --work DG.w --keep-hessians --rows 16 --cols 64 -j 2 -q
check "DeepSeek-V3 with 2 groups converts (the default reader check is none: ExLlamaV3 does not load it)" test -f DG.q/config.json
fails1 "DeepSeek-V3 with 2 groups: --check exllamav3 names the routing" DG.check exl3-info --check exllamav3 DG.q
check "... the routing rule on config.json" grep -q '^exllamav3: config.json: routing: n_group 2, topk_group' DG.check
convert DG DG.qx --bits 3 --work DG.w --keep-hessians --rows 16 --cols 64 -j 2 -q --reader exllamav3 2>DG.qx.err && rc=0 || rc=$?
check "convert --reader exllamav3 of it fails (exit $rc), OUT not written" \
	sh -c "[ $rc -eq 1 ] && [ ! -e DG.qx ] && grep -q 'exllamav3 would not load .*routing' DG.qx.err"

# a pack of mixed-K experts, made by hand from the encodes of the work
# directory: expert 0's gate (w1) at another K than the others'
w=MX.w
k=$(jq -r '.tensors["model.layers.0.block_sparse_moe.experts.1.w1"]' $w/plan.json)
ko=$(( k == 2 ? 3 : 2 ))
for t in $(jq -r '.tensors | to_entries[] | "\(.key)=\(.value)"' $w/plan.json); do
	key=${t%=*} K=${t#*=}
	[ "$key" = model.layers.0.block_sparse_moe.experts.0.w1 ] && K=$ko
	cat $w/enc/$key.h1.k$K.frames
done >mixed.frames
pack-write -q --model MX --passthrough mixed <mixed.frames
fails1 "mixed-K experts: --check exllamav3 fails" mixed.check exl3-info --check exllamav3 mixed
check "... naming expert 0's w1 alone and the tied rule" \
	sh -c "grep -q '^exllamav3: model.layers.0.block_sparse_moe.experts.0.w1: tied: K=$ko mul1, but 3 of its tied group model.layers.0.block_sparse_moe.experts.\*.w1 are K=$k mul1' mixed.check && [ \$(grep -c ': tied: ' mixed.check) -eq 1 ]"
check "... exl3-info's table says the group is mixed" \
	sh -c "exl3-info -q mixed | grep -q 'model.layers.0.block_sparse_moe.experts.\*.w1: 4 linears of mixed K or codebook'"
check_fail "mixed-K experts: pack-write --check exllamav3 refuses to write them" 1 \
	"experts.0.w1: tied: " pack-write -q --model MX --passthrough --check exllamav3 mixed2 <mixed.frames
check "... and leaves no mixed2" test ! -e mixed2

# a quantized kv_b_proj, made by hand: the good pack's tensors but layer
# 0's kv_b_proj.weight, and an encode of that weight
q=DS.q3.5
n=model.layers.0.self_attn.kv_b_proj
kvl=$(tensor-ls DS | jq -r --arg n "$n.weight" 'select(.name == $n) | .shape[1]')
tensor-gen -d spd --meta count=64 "$n.input=${kvl}x$kvl" >kvb.h.frames
tensor-cat -q DS "$n.weight" | had-rotate -q --hessian kvb.h.frames | trellis-encode -q -K 4 >kvb.frames
mkdir bad
tensor-cat -q $q $(tensor-ls $q | jq -r .name | grep -vx "$n.weight") >bad.frames
cat bad.frames kvb.frames | tensor-cat -q -o bad -
cp $q/*.json bad/
fails1 "a quantized kv_b_proj: --check exllamav3 fails" bad.check exl3-info --check exllamav3 bad
check "... naming it and the kept rule" \
	grep -q "^exllamav3: $n: kept: quantized, but ExLlamaV3 reads $n.weight as a plain tensor" bad.check
fails1 "the strict reader refuses it too, and sizes not multiples of 128" bad.strict exl3-info --check strict bad
check "... aligned and kept rules" sh -c "grep -q ': aligned: ' bad.strict && grep -q ': kept: ' bad.strict"
check "--check gptqmodel on the tiny packs: every size below 128 named" \
	sh -c "exl3-info --check gptqmodel --json MX.q2.5 | jq -e '.ok == false and (.violations | map(.rule) | unique) == [\"aligned\"]' >/dev/null"
check_fail "--check with an unknown reader: a usage error" 2 "unknown reader" exl3-info --check nosuch MX.q2.5
NO_INFO="mixed bad"
done_testing
