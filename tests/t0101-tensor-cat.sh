#!/usr/bin/env bash
# tensor-cat / tensor-ls / tensor-gen: round trips through real pipes, zstd,
# selection, dtype conversion, the real model.
. "$(dirname "$0")/lib.sh"
cd "$TMP"

tensor-gen -s 3 -t F32 a=64x33 >g1.frames
tensor-gen -s 3 -t F16 b=7x5x3 >g2.frames
tensor-gen -s 3 -t I16 c=16x16x64 -d uniform --scale 30000 >g3.frames
tensor-gen -s 3 -t U8 d=3 -d arange >g4.frames
cat g1.frames g2.frames g3.frames g4.frames >all.frames
check "concatenated frame files form one stream" test "$(tensor-ls all.frames | wc -l)" -eq 4

# frames -> safetensors -> frames -> safetensors: payloads identical
tensor-cat all.frames -o x.safetensors
tensor-cat x.safetensors | tensor-cat - -o y.safetensors
check "safetensors -> frames -> safetensors is byte-identical" cmp -s x.safetensors y.safetensors
tensor-cat x.safetensors | tensor-cat --zstd=5 - | tensor-cat - -o z.safetensors
check "the same through zstd" cmp -s x.safetensors z.safetensors
tensor-cat all.frames | zstd -q -c | tensor-cat - -o w.safetensors
check "zstd from the zstd tool is detected by magic" cmp -s x.safetensors w.safetensors
tensor-cat all.frames | tensor-cat --zstd - | tensor-cat - | tensor-cat - -o zp.safetensors
check "zstd frames pass through tensor-cat" cmp -s x.safetensors zp.safetensors
head -c 20000 all.frames >cut.frames
check_fail "a truncated stream through the pass-through path" 1 "frame 2 'c': truncated payload: got [0-9]+ of 32768 bytes" \
	sh -c "tensor-cat - < cut.frames > /dev/null"
mkdir fail && cp cut.frames fail/
check_fail "a failed -o FILE run" 1 "truncated payload" tensor-cat fail/cut.frames -o fail/out.frames
check_fail "a failed -o x.safetensors run" 1 "truncated payload" tensor-cat fail/cut.frames -o fail/out.safetensors
check "  leaves neither output nor temporary nor spool files" test "$(ls -A fail)" = cut.frames
zstd -q -c all.frames | head -c 3000 >cut.zst
check_fail "a truncated zstd stream" 1 "truncated" sh -c "tensor-cat - < cut.zst > /dev/null"
tensor-cat all.frames | tensor-cat - >pass.frames
check "frames pass through unchanged" cmp -s all.frames pass.frames
check "names, shapes and dtypes kept" \
	test "$(tensor-ls x.safetensors | jq -c '[.name,.dtype,.shape]' | tr -d '\n')" = \
	'["a","F32",[64,33]]["b","F16",[7,5,3]]["c","I16",[16,16,64]]["d","U8",[3]]'

# selection
check "glob selects" test "$(tensor-cat all.frames '[bc]' | tensor-ls | jq -r .name | tr -d '\n')" = bc
check "regex selects" test "$(tensor-cat --regex x.safetensors '^(a|d)$' | tensor-ls | jq -r .name | tr -d '\n')" = ad
check_fail "an unmatched pattern is an error" 1 "no tensor matches 'zz'" tensor-cat x.safetensors zz

# dtype conversion: only floating tensors change; F32->F16->F32 matches the
# stats of a direct conversion
tensor-cat --dtype F16 x.safetensors | tensor-ls >conv.jsonl
check "--dtype F16 converts float tensors only" \
	test "$(jq -r .dtype conv.jsonl | tr -d '\n')" = F16F16I16U8
tensor-cat --dtype BF16 all.frames a | tensor-cat --dtype F32 - | tensor-ls --stats >bf.jsonl
tensor-cat --dtype BF16 x.safetensors a | tensor-ls --stats >bf2.jsonl
check "BF16 conversion of frames and of a mapped file agree" \
	test "$(jq .stats.rms bf.jsonl)" = "$(jq .stats.rms bf2.jsonl)"
tensor-cat --meta role=weight --meta layer=3 all.frames a | tensor-ls >m.jsonl
check "--meta adds metadata" test "$(jq -r '.meta.role + .meta.layer' m.jsonl)" = weight3

# stats
tensor-gen -d constant --value 2.5 k=10x10 | tensor-ls --stats >k.jsonl
check "stats of a constant" test "$(jq -c '[.stats.min,.stats.max,.stats.mean,.stats.rms,.stats.count]' k.jsonl)" = '[2.5,2.5,2.5,2.5,100]'
tensor-gen -d constant --value nan n=4 | tensor-ls --stats >n.jsonl
check "NaN counted" test "$(jq -c '[.stats.nan,.stats.min]' n.jsonl)" = '[4,null]'

# output to a frame file is atomic and complete
tensor-cat x.safetensors -o out.frames
tensor-cat x.safetensors >out2.frames
check "-o FILE writes frames" cmp -s out.frames out2.frames
check "no temporary files left" test -z "$(ls | grep tmp-)"
if command -v script >/dev/null; then
	script -qec "tensor-cat x.safetensors; echo rc=\$?" /dev/null >tty.out 2>&1 </dev/null
	check "frames refuse a terminal" grep -q "refusing to write binary frames to a terminal" tty.out
	check "  with exit 2" grep -q "rc=2" tty.out
else
	skip "no script(1) for a terminal test"
fi
check_fail "missing source" 1 "nosuch: No such file" tensor-cat nosuch
check_fail "bad option" 2 "usage:" tensor-cat --bogus x.safetensors

# sharded directory output
mkdir shards
tensor-cat --shard-size 1 x.safetensors -o shards 2>/dev/null || true
tensor-gen -s 1 big1=600x1000 big2=600x1000 | tensor-cat - -o shards --shard-size 3
check "sharded output has an index" test -f shards/model.safetensors.index.json
check "sharded output reads back" test "$(tensor-ls shards | wc -l)" -eq 2

# --split: one frame file per tensor, each what a pattern would select
tensor-gen -s 4 h.a=16x16 h.b=8 h.c=4x4 >three.frames
mkdir parts
check "--split DIR" tensor-cat -q --split parts three.frames
check "... writes one file per tensor" test "$(ls parts | tr '\n' ' ')" = "h.a.frames h.b.frames h.c.frames "
for n in h.a h.b h.c; do
	check "... $n.frames is tensor-cat's selection of '$n', byte for byte" cmp parts/$n.frames <(tensor-cat three.frames $n)
done
mkdir zparts
check "--split with patterns, from stdin, compressed" sh -c 'tensor-cat --split zparts --zstd - "h.[bc]" <three.frames'
check "... only the selected, readable" test "$(ls zparts | tr '\n' ' ')" = "h.b.frames h.c.frames " -a \
	"$(tensor-cat zparts/h.b.frames | md5sum)" = "$(tensor-cat three.frames h.b | md5sum)"
mkdir sparts
check "--split from safetensors" tensor-cat --split sparts x.safetensors
check "... one file per tensor" test "$(ls sparts | wc -l)" -eq "$(tensor-ls x.safetensors | wc -l)"
check_fail "--split and -o" 2 "exclude each other" tensor-cat --split parts -o y.frames three.frames
check_fail "--split to a missing directory" 1 "nodir: not a directory" tensor-cat --split nodir three.frames
mkdir dup
cat three.frames three.frames >twice.frames
check_fail "--split: a name twice" 1 "tensor 'h.a' appears twice" tensor-cat --split dup twice.frames
check "... no temporary left behind" test -z "$(ls dup | grep tmp)"
tensor-gen 'a/b=4' >slash.frames
check_fail "--split: a name with a slash" 1 "tensor 'a/b': not usable as a file name" tensor-cat --split dup slash.frames

# the real model
if have_shared; then
	M=$SHARED/models/stories260K
	check "stories260K lists 47 tensors" test "$(tensor-ls $M/model.safetensors | wc -l)" -eq 47
	check "stories260K directory reads the same" test "$(tensor-ls $M | wc -l)" -eq 47
	tensor-cat $M 'model.layers.0.*' | tensor-cat - -o l0.safetensors
	check "layer-0 tensors extracted" test "$(tensor-ls l0.safetensors | wc -l)" -eq 9
	tensor-cat $M model.norm.weight | tensor-cat - -o n1.safetensors
	python3 - "$M/model.safetensors" n1.safetensors <<'PY' && ok "payload equals the source bytes" || notok "payload equals the source bytes"
import json, struct, sys
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n])
    return {k: b[8+n+v['data_offsets'][0]:8+n+v['data_offsets'][1]] for k, v in h.items() if k != '__metadata__'}
a, b = load(sys.argv[1]), load(sys.argv[2])
sys.exit(0 if a['model.norm.weight'] == b['model.norm.weight'] else 1)
PY
else
	skip "stories260K: ../shared not present"
fi
done_testing
