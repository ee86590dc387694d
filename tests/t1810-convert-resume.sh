#!/usr/bin/env bash
# pipelines/convert on a generated one-layer Llama: byte-identical output for
# the same seed (also -j 1 vs -j 2), resume after kill -9, up-to-date
# re-runs, --ldlq-passes, sequential mode, validate --model.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 1
opts=(--bits 3 --rows 8 --cols 128 -q)

check "convert -j 2" convert m ref "${opts[@]}" -j 2
cp ref.work/measure.jsonl ref.measure.jsonl   # before --head-bits 4 below re-measures the head
check "OUT is a complete EXL3 directory" test -f ref/config.json -a -f ref/model.safetensors -a -f ref/quantization_config.json
check "no temporary files left in the work directory" test -z "$(find ref.work -name '*.tmp')"
check "the work directory's Makefile is up to date after the run" make -q -s -C ref.work
before=$(stat -c %Y ref/config.json)
check "re-running a finished conversion succeeds" convert m ref "${opts[@]}" -j 2
check "... and rewrites nothing" test "$(stat -c %Y ref/config.json)" = "$before"

n=$(ls ref.work/enc | wc -l)
check "a changed --head-bits" convert m hb "${opts[@]}" -j 2 --work ref.work --head-bits 4
check "... re-encodes only the head" test "$(ls ref.work/enc | wc -l)" -eq $((n + 1))
check "... and the head has 4 bits" jqe '.quantization_config.head_bits == 4' hb/config.json

check "convert -j 1" convert m j1 "${opts[@]}" -j 1
check "same seed, -j 1 vs -j 2: byte-identical directories" diff -r ref j1
check "convert --seed 1" convert m s1 "${opts[@]}" --seed 1
check "another seed gives other trellis codes" sh -c '! cmp -s ref/model.safetensors s1/model.safetensors'

# --ldlq-passes: the same Hessians, refined encodes; a parameter of the
# encodes, so a changed one re-encodes in the same work directory
check "convert --ldlq-passes 1" convert m lp "${opts[@]}" -j 2 --ldlq-passes 1
check "... every encode's proxy error (head included) at or below the plain one's, some below" jq -ne \
	--slurpfile a ref.measure.jsonl --slurpfile b lp.work/measure.jsonl \
	'($a | INDEX(.tensor + "/" + (.K | tostring))) as $r |
	 [$b[] | [.proxy_err, $r[.tensor + "/" + (.K | tostring)].proxy_err]] as $p |
	 ($p | length) > 0 and ($p | all(.[1] != null and .[0] <= .[1])) and ($p | any(.[0] < .[1]))'
check "... other trellis codes, the same size" sh -c \
	'! cmp -s ref/model.safetensors lp/model.safetensors && test "$(stat -c %s ref/model.safetensors)" = "$(stat -c %s lp/model.safetensors)"'
check "--ldlq-passes 1 into ref's work directory re-encodes: the same bytes as its own" sh -c \
	"cp -r ref.work lp2.work && convert m lp2 ${opts[*]} -j 2 --work lp2.work --ldlq-passes 1 && diff -r lp lp2"

# kill -9 the whole pipeline (convert, make and the programs) midway
setsid convert m res "${opts[@]}" -j 2 & pid=$!
for i in $(seq 1 1200); do
	[ "$(ls res.work/enc 2>/dev/null | grep -c '\.frames$')" -ge 2 ] && break
	sleep 0.05
done
kill -9 -- "-$pid" 2>/dev/null
wait "$pid" 2>/dev/null
check "killed midway: no OUT yet" test ! -e res
check "resume: the re-run completes" convert m res "${opts[@]}" -j 2
check "resume: byte-identical to the uninterrupted conversion" diff -r ref res

check "sequential mode" convert m seq "${opts[@]}" --mode sequential -j 2
check "sequential: the head's capture read the quantized layer 0" \
	test -L seq.work/ov/1/layer.0.safetensors -a -f seq.work/q/layer.0.safetensors
check "sequential: other Hessians, other codes than onepass" \
	sh -c 'test -f seq/model.safetensors && ! cmp -s ref/model.safetensors seq/model.safetensors'
validate seq >seq.json
check "sequential: validate finds a well-formed directory" jqe '.ok' seq.json

validate ref --model m --rows 4 --cols 128 >ref.json
check "validate --model: ok" jqe '.ok' ref.json
check "validate: every linear decoded and checked" \
	jqe '.check.tensors == 8 and .check.max_rel_fro_err < 0.3' ref.json
check "validate: KL divergence and top-1 agreement" \
	jqe '.eval.kl_divergence >= 0 and .eval.top1_agreement > 0.5' ref.json
check "validate: bits 3, head 6" jqe '.bits == 3 and .head_bits == 6 and .config.bits == 3' ref.json

# malformed EXL3 directories made from a good one
NO_INFO="badbits trunc noq"   # broken on purpose
cp -r ref badbits
jq '.quantization_config.bits = 5' ref/config.json >badbits/config.json
check_fail "validate: config bits that the trellis widths contradict" 1 "bits 5 differs from the stored trellis widths" \
	validate badbits
cp -r ref trunc
head -c 5000 ref/model.safetensors >trunc/model.safetensors
check_fail "validate: a truncated shard" 1 "model.safetensors" validate trunc
mkdir noq
cp ref/config.json ref/tokenizer.json noq/
tensor-cat -q ref $(tensor-ls ref | jq -r .name | grep -v '^model.layers.0.mlp.up_proj.suh$') | tensor-cat -q -o noq/model.safetensors -
check_fail "validate: a missing suh, named" 1 "linear 'model.layers.0.mlp.up_proj': tensor 'model.layers.0.mlp.up_proj.suh' is missing" \
	validate noq
done_testing
