#!/usr/bin/env bash
# hessian-capture --chunk-rows / --part / --merge (issue 12 part 4, issue 15 part 1):
# the calibration is cut into fixed chunks of rows; one process sums them in
# chunk order, or one process per chunk writes its partial sums (F64) and
# --merge adds them in chunk order, whatever the order of the files: the
# same Hessian frames byte for byte, on any thread count (under each of two
# OpenBLAS kernels), dense or MoE, from the embedding or from saved hidden
# states. A missing, repeated or foreign chunk is an error naming it.
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/synth-model.sh"
cd "$TMP"

synth_model m 32 48 2 4 2 64 1 || notok "synthetic model"
synth_tokens ta 4 16 64 1
synth_tokens tb 3 16 64 2
cat ta tb >tok          # 7 rows of 16: chunks of 3 rows are 3, 3, 1
# forward chunks of 2 rows (32 tokens): a calibration chunk of 3 rows runs
# as two, and a chunk sum is not just one product
hc() { hessian-capture -q --model m --chunk 32 "$@"; }

check "--list-parts: chunks 0 1 2" test "$(hc --tokens tok --chunk-rows 3 --list-parts | tr '\n' ' ')" = "0 1 2 "
hc --tokens tok --chunk-rows 3 >whole
for i in 0 1 2; do hc --tokens tok --chunk-rows 3 --part $i -o p$i; done
check "a part is F64 with its chunk's metadata" \
	test "$(tensor-ls p1 | head -1 | jq -r '[.dtype, .meta.chunk, .meta.chunks, .meta.chunk_rows, .meta.calib_rows, .meta.count] | join(" ")')" = "F64 1 3 3 7 48"
check "3 parts merged == one process, byte for byte" \
	bash -c 'hessian-capture -q --merge p0 p1 p2 | cmp - whole'
check "... the files in shuffled order" bash -c 'hessian-capture -q --merge p2 p0 p1 | cmp - whole'
check "... one of them on stdin" bash -c 'hessian-capture -q --merge p1 - p2 <p0 | cmp - whole'
# on any thread count, under each of two OpenBLAS kernels (tests/lib-blas.sh
# blas_pair; between kernels the sums may differ)
blas_pair
for k in $BLAS_KERNELS; do
	for t in 1 2; do
		OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t blas_under "$k" hc --tokens tok --chunk-rows 3 --part 1 >p1.$k.$t
	done
	check "$k: a part on 1 and on 2 BLAS/OpenMP threads: the same bytes" cmp p1.$k.1 p1.$k.2
done
check "... and on the default thread count, on this machine's kernel: the same bytes" cmp p1 "p1.${BLAS_KERNELS%% *}.1"
[ -z "$BLAS_WHY" ] || skip "the same under a second OpenBLAS kernel: $BLAS_WHY"

# products in double: F64 out, equally exact
hc --tokens tok --chunk-rows 3 --f64 >w64
for i in 0 1 2; do hc --tokens tok --chunk-rows 3 --part $i --f64 >q$i; done
check "--f64: 3 parts merged == one process (F64 frames)" \
	bash -c 'hessian-capture -q --merge q1 q2 q0 | cmp - w64 && test "$(tensor-ls w64 | jq -r .dtype | sort -u)" = F64'
# two separately captured halves are two chunks: a whole-stream merge of
# them is the capture of both with --chunk-rows 4
hc --tokens ta --f64 >ha; hc --tokens tb --f64 >hb
check "halves captured apart, merged (F64) == the whole in chunks of 4 rows" \
	bash -c 'hessian-capture -q --merge ha hb | cmp - <(hessian-capture -q --model m --chunk 32 --tokens tok --chunk-rows 4 --f64)'

# from saved hidden states: a part carries its own rows
for i in 0 1 2; do hc --tokens tok --chunk-rows 3 --part $i --layers 1-1 --hidden-out hid$i >/dev/null; done
check "a part's hidden states hold its rows (3x16x32)" \
	test "$(tensor-ls hid0 | jq -c .shape)" = "[3,16,32]"
check "layer 2 (head) from each part's hidden states, merged == one process" bash -c \
	'for i in 0 1 2; do hessian-capture -q --model m --chunk 32 --tokens tok --chunk-rows 3 --part $i --layers 2 --hidden-in hid$i >r$i || exit 1; done
	 hessian-capture -q --merge r2 r1 r0 | cmp - <(hessian-capture -q --model m --chunk 32 --tokens tok --chunk-rows 3 --layers 2)'
check_fail "another part's hidden states" 1 "other tokens" hc --tokens tok --chunk-rows 3 --part 1 --layers 2 --hidden-in hid0
# --hidden-next: the states leaving the captured layer (convert's chain of
# captures, each running its own layer alone), per part too
for i in 0 1 2; do hc --tokens tok --chunk-rows 3 --part $i --layers 0-0 --hidden-next nx$i >/dev/null; done
check "--hidden-next of layer 0: the states entering layer 1" \
	test "$(tensor-ls nx0 | jq -r '[.meta.layer, (.shape | map(tostring) | join("x"))] | join(" ")')" = "1 3x16x32"
check "layer 1 from them, parts merged == layer 1 from the embedding, byte for byte" bash -c \
	'for i in 0 1 2; do hessian-capture -q --model m --chunk 32 --tokens tok --chunk-rows 3 --part $i --layers 1-1 --hidden-in nx$i >s$i || exit 1; done
	 hessian-capture -q --merge s0 s1 s2 | cmp - <(hessian-capture -q --model m --chunk 32 --tokens tok --chunk-rows 3 --layers 1-1)'
hc --tokens tok --chunk-rows 3 --part 0 --layers 1-1 --hidden-out ho0 >/dev/null
check "... the same states --hidden-out of a capture of layer 1 saves" cmp ho0 nx0
check_fail "states entering layer 1 refused for a capture of layer 0" 1 "after the first captured layer" \
	hc --tokens tok --chunk-rows 3 --part 0 --layers 0-0 --hidden-in nx0

# mixture of experts: an expert's rows are batched per forward chunk, which
# never spans two calibration chunks. The routed sums only (--min-tokens 1),
# then with every expert starved (--min-tokens 1000, 160 tokens): a part
# writes its raw routed sums (and Σ w², exact), part 0 the all-token
# Hessian of the layer's first forward chunk, and the merge blends after
# adding the parts, as one process does at its flush (issue 15)
"$ROOT/examples/make-tiny-llama" --arch qwen3-moe moe 1 >/dev/null
synth_tokens mt 5 32 256 3
hessian-capture -q --model moe --tokens mt --chunk-rows 2 --chunk 32 --min-tokens 1 >mw
for i in 0 1 2; do hessian-capture -q --model moe --tokens mt --chunk-rows 2 --chunk 32 --min-tokens 1 --part $i >mp$i; done
check "MoE: 3 parts merged == one process, experts included" \
	bash -c 'hessian-capture -q --merge mp1 mp2 mp0 | cmp - mw && tensor-ls mw | jq -r .name | grep -q experts'
jqe() { jq -e "$@" >/dev/null; }
for mode in routed weighted; do
	mc() { hessian-capture -q --model moe --tokens mt --chunk-rows 2 --chunk 32 --min-tokens 1000 --moe-capture $mode "$@" 2>/dev/null; }
	mc >sw
	for i in 0 1 2; do mc --part $i >sp$i; done
	check "MoE $mode, every expert starved: one process blends (expert_fallback 1, count 1000)" \
		jqe -s '[.[] | select(.meta.expert)] | length > 0 and all(.meta.expert_fallback == "1" and .meta.count == "1000")' <(tensor-ls sw)
	check "... a part carries raw sums: no fallback yet, its Σ w² and threshold" \
		jqe -s '[.[] | select(.meta.expert)] | all(.meta.expert_fallback == null and .meta.min_tokens == "1000" and (.meta.routed_w2 | type) == "string" and (.meta.count | tonumber) < 1000)' <(tensor-ls sp1)
	check "... part 0 (only) carries the all-token Hessians" \
		test "$(tensor-ls sp0 | jq -r 'select(.meta.part_role == "all_tokens") | .name' | wc -l)" -gt 0 -a \
		     "$(tensor-ls sp2 | jq -r 'select(.meta.part_role) | .name' | wc -l)" -eq 0
	check "... 3 parts merged == one process, byte for byte" \
		bash -c 'hessian-capture -q --merge sp2 sp0 sp1 2>/dev/null | cmp - sw'
done
# --moe-capture all (ExLlamaV3's): every expert's Hessian is the all-token
# one; one process sums it chunk by chunk and rounds once, a part writes
# its chunk's sum exact (F64), the merge adds them in chunk order and
# rounds once. F64 out shows any difference in the order of the sums.
# (Rounded per part, or summed as one chunk, they differed here.)
ac() { hessian-capture -q --model moe --tokens mt --chunk-rows 2 --chunk 32 --moe-capture all "$@" 2>/dev/null; }
ac >aw; ac --f64 >aw64
for i in 0 1 2; do ac --part $i >ap$i; ac --part $i --f64 >aq$i; done
check "MoE all: a part's expert sums are F64, capture all, its chunk's rows" \
	jqe -s '[.[] | select(.meta.expert)] | length > 0 and all(.dtype == "F64" and .meta.capture == "all" and .meta.count == "64")' <(tensor-ls ap1)
check "MoE all: 3 parts merged == one process, byte for byte" \
	bash -c 'hessian-capture -q --merge ap1 ap2 ap0 | cmp - aw && tensor-ls aw | jq -r .name | grep -q experts'
check "MoE all --f64: 3 parts merged == one process, byte for byte" \
	bash -c 'hessian-capture -q --merge aq2 aq0 aq1 | cmp - aw64 && test "$(tensor-ls aw64 | jq -r .dtype | sort -u)" = F64'
check "MoE all: the experts' Hessians are the all-token one (not the routed rows: count 160)" \
	jqe -s '[.[] | select(.meta.expert)] | all(.meta.count == "160")' <(tensor-ls aw)
check_fail "a starved expert's merge without part 0's all-token Hessian" 1 "chunk 0 of 3 is missing" \
	hessian-capture --merge sp1 sp2

# the merge streams: the parts are read in lockstep, one group at a time
# (tests/t1573: its memory), so they list a layer's groups in the same
# order, but for an expert the router sent none of a later chunk's rows
# (no frame in that part), and part 0 carries each all-token Hessian
# before the groups that use it. DeepSeek V3 (dense layer 0, then 16
# experts, top 1, and a shared expert) in chunks of one row: some experts
# get no rows in some chunks; under and over the threshold, F32 and F64.
"$ROOT/examples/make-tiny-llama" --arch deepseek_v3 --experts 16 --top-k 1 ds 2 >/dev/null
for mode in routed weighted; do
	for m in 1 40; do
		for prec in "" --f64; do
			dc() { hessian-capture -q --model ds --tokens mt --chunk-rows 1 --chunk 32 --min-tokens $m --moe-capture $mode $prec "$@" 2>/dev/null; }
			dc >dw
			for i in 0 1 2 3 4; do dc --part $i >dp$i; done
			check "DeepSeek V3 $mode --min-tokens $m ${prec:-F32}: 5 parts merged (shuffled) == one process, byte for byte" \
				bash -c 'hessian-capture -q --merge dp3 dp0 dp4 dp2 dp1 2>/dev/null | cmp - dw'
		done
	done
done
check "... some expert has no frame in some later part (none of its rows), and some expert was blended" \
	bash -c 'n0=$(tensor-ls dp0 | jq -r "select(.meta.part_role == null) | .name" | wc -l)
	         for i in 1 2 3 4; do [ $(tensor-ls dp$i | wc -l) -lt $n0 ] && exit 0; done; exit 1' &&
	jqe -s 'any(.[]; .meta.expert_fallback == "1")' <(tensor-ls dw)
check "... part 0: every all-token frame comes before the groups reading it (scope layer: the shared gate/up one, group: an expert's own)" \
	jqe -s '. as $f | [range(length)] | map(select($f[.].meta.all_tokens)) |
	        all(. as $i | [range($i)] | any($f[.].meta.part_role == "all_tokens" and $f[.].name == $f[$i].meta.all_tokens))
	        and ([$f[] | select(.meta.part_role) | .meta.all_tokens_scope] | unique == ["group", "layer"])' <(tensor-ls dp0)
{ tensor-cat dp1 '*.layers.0.*'; tensor-cat dp1 '*.layers.1.mlp.shared_experts.*'; tensor-cat dp1 '*.layers.1.self*' '*.layers.1.mlp.experts.*' 'lm_head*'; } >dx1
check_fail "a part's groups out of part 0's order" 1 "dx1: frame 'model.layers.1.mlp.shared_experts.input' of layer 1 where dp0 \(chunk 0\) has 'model.layers.1.self_attn.input'" \
	hessian-capture --merge dp0 dx1 dp2 dp3 dp4
tensor-cat dp2 '*.layers.[01].*' >dx2
check_fail "a part that ends early" 1 "dx2: ends where dp0 \(chunk 0\) has frame 'lm_head.input'" \
	hessian-capture --merge dp0 dp1 dx2 dp3 dp4
{ tensor-cat dp3 '*.layers.0.*' '*.layers.1.self*' '*.layers.1.mlp.experts.*'; tensor-cat dp3 '*.layers.1.self_attn.input'; tensor-cat dp3 '*shared*' 'lm_head*'; } >dx3
check_fail "a group twice in a part" 1 "dx3: frame 'model.layers.1.self_attn.input' of layer 1 where dp0 \(chunk 0\) has 'model.layers.1.mlp.shared_experts.input'" \
	hessian-capture --merge dp0 dp1 dp2 dx3 dp4

# provenance
check_fail "a chunk missing" 1 "chunk 1 of 3 is missing" hessian-capture --merge p0 p2
check_fail "the last chunk missing" 1 "chunk 2 of 3 is missing" hessian-capture --merge p1 p0
check_fail "a chunk twice" 1 "chunk 0 of 3 is given twice: p0 and p0" hessian-capture --merge p0 p1 p0 p2
hc --tokens ta --chunk-rows 3 --part 1 >other
check_fail "a chunk of another calibration" 1 "other: not a chunk of the same capture as p0" \
	hessian-capture --merge p0 other p2
check_fail "parts captured with and without --f64" 1 "products" hessian-capture --merge p0 q1 p2
check_fail "a part among whole streams" 1 "p0: the partial sums of a chunk" hessian-capture --merge whole p0
check_fail "a whole stream among parts" 1 "whole: a whole stream" hessian-capture --merge p0 whole
check_fail "--part past the chunks" 1 "7 rows make 3 chunks of 3 rows \(0-2\)" hc --tokens tok --chunk-rows 3 --part 3
check_fail "--part with --merge" 2 "takes frames" hessian-capture --merge --part 0 p0
check_fail "--chunk-rows 0" 2 "chunk-rows" hc --tokens tok --chunk-rows 0
check_fail "--list-parts with --part" 2 "list-parts" hc --tokens tok --list-parts --part 0
done_testing
