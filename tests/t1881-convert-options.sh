#!/usr/bin/env bash
# pipelines/convert's presets and output options: --effort fast|default|best
# (the options it resolves to in -n --json, options given beside it keep
# their values), --hq [N] (the promoted linears floored in the plan as
# tensor-ls --modules says, bitalloc --hq N), --size P% (the plan of P% of
# the weight files' bytes), --shard-size (several shards, ExLlamaV3's index,
# counted by the size planner, exl3-info --check accepts them); bad values
# exit 2 naming the option. A generated 2-layer Llama (hidden 128,
# intermediate 256), and for --hq a Mixtral of 2 experts (a Llama promotes
# nothing): attention is a third of the decoder's weights in both.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 2 128 256
opts=(--rows 8 --cols 32 -q)
dry() { convert m o "${opts[@]}" -n --json "$@"; }

# ---- --effort ---------------------------------------------------------------
dry --bits 3 --effort best >best.json
check "--effort best: sensitivity measure, one LDLQ pass, 3 sign draws by KL" jqe \
	'.options | .effort == "best" and .sensitivity == "measure" and .ldlq_passes == 1 and .sign_draws == 3
	 and .sign_metric == "kl" and .sample == "full" and .effort_overridden == []' best.json
check "... and the plan's steps follow them (draws at K=3, sensitivity widths 2..4)" jqe \
	'.draws.n == 3 and .draws.k == 3 and .measure == [2, 3, 4]' best.json
dry --bits 3.5 --effort fast >fast.json
check "--effort fast: sampled widths (0.1), Hessians kept for the finals" jqe \
	'.options | .effort == "fast" and .sample == 0.1 and .keep_hessians == true and .sensitivity == "off"
	 and .sign_draws == 1 and .ldlq_passes == 0' fast.json
check "... sampled measurements in the counts" jqe '.sample == 0.1 and .counts.sampled_measurements == 28' fast.json
dry --bits 3 >def.json
dry --bits 3 --effort default >def2.json
check "--effort default: today's defaults, the same dry run as no --effort" sh -c \
	'jq -e ".options | .sensitivity == \"off\" and .ldlq_passes == 0 and .sign_draws == 1 and .sample == \"full\" and .keep_hessians == false" def.json >/dev/null &&
	 test "$(jq -c "del(.options.effort)" def.json)" = "$(jq -c "del(.options.effort)" def2.json)"'
dry --bits 3 --effort best --ldlq-passes 2 --sign-draws 4 >ov.json
check "options given beside --effort win (--ldlq-passes 2 --sign-draws 4)" jqe \
	'.options | .ldlq_passes == 2 and .sign_draws == 4 and .sign_metric == "kl" and .sensitivity == "measure"
	 and .effort_overridden == ["--ldlq-passes", "--sign-draws"]' ov.json
dry --bits 3 --effort best --sign-draws 1 --sensitivity off >ov2.json
check "... --sign-draws 1 drops the preset's KL metric, --sensitivity off wins" jqe \
	'.options | .sign_draws == 1 and .sign_metric == "proxy" and .sensitivity == "off" and .ldlq_passes == 1' ov2.json
dry --bits 3.5 --effort fast --sample 0.25 --drop-hessians >ov3.json
check "... --sample 0.25 --drop-hessians beside --effort fast" jqe \
	'.options | .sample_asked == 0.25 and .keep_hessians == false' ov3.json
check "convert -n shows the resolved options" sh -c \
	'convert m o --rows 8 --cols 32 --bits 3 -n --effort best --ldlq-passes 2 | grep -q "^options: effort best (--sensitivity measure --sign-draws 3 --sign-metric kl), given beside it: --ldlq-passes;"'
check_fail "--effort quick: exit 2 naming it" 2 "^convert: --effort: 'quick' is not fast, default or best" dry --bits 3 --effort quick
check_fail "--effort best with --size says the preset set --sensitivity" 2 "needs --sensitivity-k K .*set by --effort best" \
	dry --size 290KB --effort best
check "convert -h documents --effort, --hq, --shard-size and --size P%" sh -c \
	'convert -h | grep -q -- "--effort E" && convert -h | grep -q -- "--hq \[N\]" && convert -h | grep -q -- "--shard-size SIZE" && convert -h | grep -q "or P%"'

# ---- --hq [N] ---------------------------------------------------------------
# a Llama promotes nothing (ExLlamaV3's llama.py): the note, the same plan
convert m o --rows 8 --cols 32 --bits 3 --hq -n --json 2>hql.err >hql.json
check "--hq on a Llama: a note that its family promotes nothing, the dry run of no --hq" sh -c \
	'grep -q "note: --hq: the architecture of .*/m promotes no decoder linear" hql.err &&
	 test "$(jq -c "del(.options.hq)" hql.json)" = "$(jq -c "del(.options.hq)" def.json)"'
# a Mixtral of 2 experts: attention (promoted +2) is a third of the decoder's
# weights, as it is in the Llama above
tiny_model --arch mixtral --experts 2 --top-k 1 mx 2 128 128
dry() { convert mx o "${opts[@]}" -n --json "$@"; }
dry --bits 3 --hq >hq.json
check "--hq at 3 bpw: the floor (3+2) and the width below floor(B) measured" jqe \
	'.measure == [2, 3, 5] and .options.hq == "family"' hq.json
dry --bits 3 --hq 1 >hq1.json
check "--hq 1: the floor 3+1" jqe '.measure == [2, 3, 4] and .options.hq == 1' hq1.json
check "--hq followed by a non-number is --hq without N" sh -c \
	'convert --hq m o --bits 3 --rows 8 --cols 32 -q -n --json | jq -e ".options.hq == \"family\"" >/dev/null'
check_fail "--hq 9: exit 2 naming it" 2 "^convert: --hq: '9' is not a promotion of 1..8 bits" dry --bits 3 --hq 9
check_fail "--hq 0: exit 2" 2 "^convert: --hq: '0'" dry --bits 3 --hq 0
check_fail "--hq with --size: exit 2" 2 "^convert: --hq floors follow a bits target" dry --size 290KB --hq
check_fail "--hq whose floors exceed --bits: exit 2" 2 "^convert: --hq 6: the floors .* more than --bits 1.5" dry --bits 1.5 --hq 6
check "convert --bits 3 --hq" convert mx h --bits 3 --hq "${opts[@]}" -j 2
tensor-ls --modules mx >mods.jsonl
check "... each promoted linear at min(3 + hq, 8) or more, as tensor-ls --modules says; the target kept" sh -c '
	jq -s --slurpfile p h.work/plan.json -e "
		[.[] | select(.quantized and .role != \"head\" and (.hq // 0) > 0)] as \$pr
		| (\$pr | length) == 8 and all(\$pr[]; \$p[0].tensors[.key] >= ([3 + .hq, 8] | min))
		and \$p[0].bits <= 3" mods.jsonl >/dev/null'
check "... and the experts pay for it (below 3 bits)" jqe '.roles.expert.bits < 3' h.work/plan.json
check "... exl3-info --check exllamav3 accepts the pack" sh -c 'exl3-info --check exllamav3 h >/dev/null'
# bitalloc --hq N over those measurements (K 2, 3, 5): at 2.5 bpw N=3 floors at 5
check "bitalloc --hq 3 at 2.5 bpw: the promoted linears at 5" sh -c '
	bitalloc -q --bits 2.5 --hq 3 --model mx h.work/measure.jsonl |
	jq -e "[.tensors | to_entries[] | select(.key | test(\"self_attn\")) | .value] | length == 8 and all(. >= 5)" >/dev/null'
check "... --hq=3 the same plan" sh -c \
	'test "$(bitalloc -q --bits 2.5 --hq 3 --model mx h.work/measure.jsonl)" = "$(bitalloc -q --bits 2.5 --hq=3 --model mx h.work/measure.jsonl)"'
check "bitalloc --hq 1 at 2.5 bpw: the promoted linears at 3 or more, fewer at 5 than with --hq 3" sh -c '
	bitalloc -q --bits 2.5 --hq 1 --model mx h.work/measure.jsonl |
	jq -e "[.tensors | to_entries[] | select(.key | test(\"self_attn\")) | .value] | all(. >= 3) and any(. < 5)" >/dev/null'
check_fail "bitalloc --hq 9: exit 2" 2 "--hq" bitalloc -q --bits 2.5 --hq 9 --model mx h.work/measure.jsonl

# ---- --size P% and --shard-size ------------------------------------------------
dry() { convert m o "${opts[@]}" -n --json "$@"; }
src=$(stat -c %s m/model.safetensors) want=$((src * 20 / 100))
dry --size 20% >p.json
dry --size "$want" >b.json
check "--size 20%: the dry run of --size $want bytes (20% of $src)" sh -c \
	'test "$(jq -c "del(.options.size_percent)" p.json)" = "$(jq -c "del(.options.size_percent)" b.json)" &&
	 jq -e ".target.size == $0 and .options.size_percent == {percent: 20, of_bytes: $1}" p.json >/dev/null' "$want" "$src"
check "--size 280KB: the resolved size in the options" sh -c 'convert m o --rows 8 --cols 32 -q -n --json --size 280KB | jq -e ".options.size == 280000 and .options.size_percent == null" >/dev/null'
check_fail "--size 60% above the largest plan: exit 2 naming the percentage and the bytes" 2 \
	"above the largest plan.*\(--size 60% of the $src bytes of the weight files\)" dry --size 60%
for bad in 0% 101% -5% abc% 20%%; do
	check_fail "--size $bad: exit 2 naming --size" 2 "^convert: --size: '$bad' is not a percentage in \(0, 100\]" dry --size "$bad"
done
dry --size 20% --shard-size 100KB >ps.json
check "--shard-size 100KB: counted by the planner (the shards' headers and index)" jqe \
	--slurpfile b b.json '.options.shard_size == 100000 and .size.smallest > $b[0].size.smallest' ps.json
check_fail "bitalloc --shard-size without --model: exit 2" 2 "--shard-size counts the pack of --model" bitalloc -q --bits 3 --shard-size 1MB
check "bitalloc --predict --shard-size: the shard size read as --size is (500KiB)" sh -c \
	'test "$(bitalloc --predict --model m --bits 3 --shard-size 500KiB | jq .shard_bytes)" = 512000'
check_fail "--shard-size 5XB: exit 2 naming it" 2 "^convert: --shard-size: '5XB': unknown unit" dry --bits 3 --shard-size 5XB
check_fail "--shard-size 0: exit 2 naming it" 2 "^convert: --shard-size: '0' is out of range" dry --bits 3 --shard-size 0
check "convert --size 20% --shard-size 100KB" convert m s --size 20% --shard-size 100KB "${opts[@]}" -j 2
nsh=$(find s -name 'model-*-of-*.safetensors' | wc -l)
check "... several shards ($nsh), none over 100000 bytes" sh -c \
	'test "$0" -ge 2 && ! find s -name "model-*-of-*.safetensors" -size +100000c | grep -q .' "$nsh"
check "... ExLlamaV3's index names every shard and nothing else" sh -c \
	'l=$(jq -r "[.weight_map[]] | unique[]" s/model.safetensors.index.json) && test -n "$l" && test "$l" = "$(cd s && ls model-*-of-*.safetensors)"'
got=$(find s -type f -printf '%s\n' | awk '{ t += $1 } END { print t }')
check "... the planner predicted the sharded output to the byte ($got), within --size" sh -c \
	'test "$(jq .bytes s.work/plan.json)" = "$0" && test "$0" -le "$1"' "$got" "$want"
check "... exl3-info --check exllamav3 accepts it; strict finds only the model's unaligned shapes (no file or index rule)" sh -c \
	'exl3-info --check exllamav3 s >/dev/null && ! { exl3-info --check strict s 2>&1 | grep "^strict: " | grep -v ": aligned: "; }'
check "... the plan is that of --size $want bytes" jqe ".size == $want" s.work/plan.json
done_testing
