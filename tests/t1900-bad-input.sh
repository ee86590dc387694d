#!/usr/bin/env bash
# Bad input across programs (review3): each message names the program, the
# file or tensor and the problem once, with exit 1 for data errors and 2 for
# usage errors.
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/lib-convert.sh"
cd "$TMP"

tensor-gen -s 1 w=64x48 >w.frames
tensor-gen -s 2 -d spd h=48x48 --meta count=100 >h.frames
head -c 300 h.frames >hcut.frames
mkdir adir

# a file named in the library's message is not named twice ("f: f: why")
once() {   # once WHAT FILE cmd...: stderr names FILE exactly once
	local what=$1 f=$2; shift 2
	"$@" >/dev/null 2>err.txt && { notok "$what (exit 0)"; return; }
	if [ "$(grep -o -F -- "$f" err.txt | wc -l)" -eq 1 ]; then ok "$what"
	else notok "$what"; sed 's/^/#   /' err.txt; fi
}
check_fail "had-rotate --hessian: a truncated Hessian file" 1 \
	"^had-rotate: hcut.frames: frame 0 'h': truncated payload" sh -c 'had-rotate --hessian hcut.frames <w.frames'
once "... names the file once" hcut.frames sh -c 'had-rotate --hessian hcut.frames <w.frames'
once "trellis-encode --hessian: a missing file, named once" nosuch.frames \
	sh -c 'trellis-encode -K 2 --hessian nosuch.frames <w.frames'
once "had-rotate --hessian: a directory, named once" adir sh -c 'had-rotate --hessian adir <w.frames'
once "hessian-capture --merge: a truncated file, named once" hcut.frames hessian-capture --merge hcut.frames
once "hessian-capture --activations: a missing file, named once" nosuch.frames hessian-capture --activations nosuch.frames

# a model directory without an index: shards named NAME-0000i-of-0000n must
# all be there (a partial copy is not a smaller model)
mkdir sh
tensor-gen -s 1 a=300x1000 b=300x1000 c=300x1000 | tensor-cat - -o sh --shard-size 1
rm sh/model.safetensors.index.json
check "shards without an index, all there: read" test "$(tensor-ls sh | wc -l)" -eq 3
rm sh/model-00002-of-00003.safetensors
check_fail "a shard missing and no index: tensor-ls" 1 \
	"^tensor-ls: sh: shard 'model-00002-of-00003.safetensors' is missing" tensor-ls sh
check_fail "... tensor-cat" 1 "^tensor-cat: sh: shard 'model-00002-of-00003.safetensors' is missing" tensor-cat sh
# a shard tensor the index does not list (or lists in another shard)
mkdir shi
tensor-gen -s 1 a=100x1000 b=100x1000 c=300x1000 | tensor-cat - -o shi --shard-size 1   # a, b | c
jq 'del(.weight_map.b)' shi/model.safetensors.index.json >i.json && cp i.json shi/model.safetensors.index.json
check_fail "a shard tensor missing from the index" 1 \
	"^tensor-ls: shi: tensor 'b' of shard 'model-00001-of-00002.safetensors' is not in model.safetensors.index.json" tensor-ls shi
jq '.weight_map.b = "model-00002-of-00002.safetensors"' i.json >shi/model.safetensors.index.json
check_fail "a shard tensor the index places in another shard" 1 \
	"^tensor-ls: shi: tensor 'b' is in shard 'model-00001-of-00002.safetensors', the index says 'model-00002-of-00002.safetensors'" tensor-ls shi
# a NaN in a weight is named, with the model, before the forward makes every
# row non-finite (before: "512 of 512 rows dropped" for a Hessian downstream)
tiny_model m 1
mkdir nanm && cp m/config.json m/tokenizer*.json nanm/
up=model.layers.0.mlp.up_proj.weight
{ tensor-cat -q m $(tensor-ls m | jq -r .name | grep -vxF $up)
  tensor-gen -d constant --value nan "$up=$(tensor-ls m | jq -r "select(.name == \"$up\") | .shape | map(tostring) | join(\"x\")")"
} | tensor-cat -q -o nanm/model.safetensors -
echo "Once upon a time there was a cat. The cat sat on the mat." >t.txt
check_fail "hessian-capture: a NaN weight" 1 \
	"^hessian-capture: nanm: forward: layer 0: tensor '$up': non-finite value nan at \\[0\\]\\[0\\]" \
	hessian-capture -q --model nanm --text t.txt --rows 1 --cols 8
check_fail "model-eval --quantized: names the model with the NaN weight" 1 \
	"^model-eval: nanm: forward: layer 0: tensor '$up': non-finite" \
	model-eval -q --model m --quantized nanm --text t.txt --cols 8
check "the model without it runs" sh -c 'model-eval -q --model m --text t.txt --cols 8 >/dev/null'
# --layers past the model and --quantized with an unquantized model were
# accepted (clamped to the head; the original weights run as "quantized")
check_fail "hessian-capture --layers 0-99 on a 1-layer model" 1 \
	"^hessian-capture: --layers: layer 99 does not exist \\(the model has 1 layers, 0-0, and 1 is the head\\)" \
	hessian-capture -q --model m --text t.txt --rows 1 --cols 8 --layers 0-99
check "... 0- still runs to the head" \
	test "$(hessian-capture -q --model m --text t.txt --rows 1 --cols 8 --layers 0- | tensor-ls | jq -r .name | tail -1)" = lm_head.input
check_fail "hessian-capture --quantized: a plain HF directory" 1 \
	"^hessian-capture: m: linear 'model.layers.0.self_attn.q_proj' is not EXL3 \\(no '.trellis'\\)" \
	hessian-capture -q --model m --text t.txt --rows 1 --cols 8 --layers 1-1 --quantized m
# exl3-matmul: a group whose codebook marker is missing decoded as 3INST
tensor-gen -s 1 w=128x128 | trellis-encode -q -K 2 --codebook mcg >g.frames
tensor-cat -q g.frames 'w.trellis' 'w.suh' 'w.svh' >nomk.frames
tensor-gen x=2x128 >x.frames
check_fail "exl3-matmul: an mcg group without its marker" 1 \
	"^exl3-matmul: 'w.trellis': metadata says codebook mcg, the markers none \\(3inst\\)" \
	sh -c 'cat nomk.frames x.frames | exl3-matmul'
check "... with it, it runs" sh -c 'cat g.frames x.frames | exl3-matmul | tensor-ls | grep -q "\"shape\":\[2,128\]"'
# an empty input names the same row length with --text - and --tokens -
# (was "of 2048" for tokens, "of 512" for text on a 512-position model)
mp=$(jq -r '.max_position_embeddings // 2048' m/config.json); [ "$mp" -lt 2048 ] || mp=2048
check_fail "model-eval --tokens -: empty input" 1 "^model-eval: stdin: 0 tokens, fewer than one row of $mp\$" \
	sh -c ': | model-eval -q --model m --tokens -'
check_fail "model-eval --text -: empty input, the same row length" 1 "^model-eval: stdin: 0 tokens, fewer than one row of $mp\$" \
	sh -c ': | model-eval -q --model m --text -'
check_fail "hessian-capture --tokens -: empty input" 1 "0 tokens give 0 rows of $mp, fewer than the 2 requested" \
	sh -c ': | hessian-capture -q --model m --tokens - --rows 2'
# an empty weight is called that, not "hessian size 0 is not a positive multiple of 128"
tensor-gen w=64x0 >w64x0.frames
tensor-gen w=0x48 >w0x48.frames
for c in "had-rotate" "had-rotate --hessian h.frames" "trellis-encode -K 2" "trellis-encode --measure 2"; do
	for f in w64x0 w0x48; do
		check_fail "$c: an empty weight ($f)" 1 "^${c%% *}: weight 'w': shape ${f#w} is not a non-empty matrix" \
			sh -c "$c <$f.frames >/dev/null"
	done
done
# a directory where a file is expected: the reason, not a bare "read error"
mkdir -p cfgdir/config.json tokdir/tokenizer.json
tensor-gen -s 1 w=64x48 | trellis-encode --measure 2 >m.jsonl 2>/dev/null
check_fail "bitalloc: a directory as input" 1 "^bitalloc: adir: read error: Is a directory" bitalloc --bits 3 adir
check_fail "bitalloc --importance: a directory" 1 "^bitalloc: adir: read error: Is a directory" \
	bitalloc --bits 3 --importance adir m.jsonl
check_fail "hessian-capture --text: a directory" 1 "adir: read error: Is a directory" \
	hessian-capture -q --model m --text adir --rows 1 --cols 8
check_fail "model-eval: config.json a directory" 1 "cfgdir/config.json: not a regular file \\(a directory\\)" \
	model-eval -q --model cfgdir --text t.txt
check_fail "tokenize: tokenizer.json a directory" 1 "tokdir/tokenizer.json: not a regular file \\(a directory\\)" \
	tokenize -t tokdir --ids t.txt
# tensor-gen shapes: a trailing x or a sign is a typo, not a smaller tensor
for a in "w=256x" "w= 3" "w=+3" "w=3,"; do
	check_fail "tensor-gen '$a' is a usage error" 2 "^tensor-gen: 'w=[^']*': expected NAME=SHAPE" tensor-gen "$a"
done
check "tensor-gen w=3,4 and w= (a scalar) still work" \
	test "$(tensor-gen w=3,4 s= | tensor-ls | jq -c .shape | tr -d '\n')" = '[3,4][]'
# a frame whose header declares 4 TiB but holds 100 bytes: "truncated
# payload" as tensor-cat says, not "out of memory" (the size is a claim)
big_frame() {   # big_frame NAME DTYPE [ROLE]: header of (2^30, 1024) elements, 100 payload bytes
	local h="{\"$1\":{\"dtype\":\"$2\",\"shape\":[1073741824,1024],\"data_offsets\":[0,4398046511104]},\"__metadata__\":{\"x3f\":\"1\",\"xxh3\":\"0000000000000000\"${3:+,\"role\":\"$3\"}}}"
	while [ $(( ${#h} % 8 )) -ne 0 ]; do h="$h "; done
	local n=${#h} i
	for i in 0 1 2 3 4 5 6 7; do printf "\\$(printf %03o $(( (n >> (8 * i)) & 255 )))"; done
	printf '%s' "$h"
	head -c 100 /dev/zero
}
big_frame w F32 >big.frames
big_frame tokens I32 tokens >bigtok.frames
trunc="frame 0 'w': truncated payload: got 100 of 4398046511104 bytes \\(4398046511004 missing\\)"
check_fail "had-rotate: a frame declaring 4 TiB" 1 "^had-rotate: stdin: $trunc" sh -c 'had-rotate <big.frames'
check_fail "trellis-encode: a frame declaring 4 TiB" 1 "^trellis-encode: stdin: $trunc" sh -c 'trellis-encode -K 2 <big.frames'
check_fail "hessian-capture --merge: a frame declaring 4 TiB" 1 "^hessian-capture: big.frames: $trunc" \
	hessian-capture --merge big.frames
check_fail "hessian-capture --activations: a frame declaring 4 TiB" 1 "^hessian-capture: big.frames: $trunc" \
	hessian-capture --activations big.frames
check_fail "tokenize --decode: a frame declaring 4 TiB" 1 "^tokenize: bigtok.frames: frame 0 'tokens': truncated payload" \
	tokenize -t m --decode bigtok.frames
# ---- convert ------------------------------------------------------------
# a linear without a usable Hessian (layer 0's input norm zeroed: q/k/v see
# zero activations, o_proj their zero output) is quantized without error
# feedback: convert and validate say so for each, even with -q (had-rotate
# -q inside the conversion hid it and validate said "ok": true)
ln0=model.layers.0.input_layernorm.weight
mkdir fz && cp m/config.json m/tokenizer*.json fz/
{ tensor-cat -q m $(tensor-ls m | jq -r .name | grep -vxF $ln0)
  tensor-gen -d constant --value 0 "$ln0=$(tensor-ls m | jq -r "select(.name == \"$ln0\") | .shape[0]")"
} | tensor-cat -q -o fz/model.safetensors -
convert fz fz.out --bits 3 --rows 4 --cols 32 -j 2 -q 2>conv.err
fbre="was quantized without error feedback \\(fallback\\): mean diagonal 0 is too small"
for p in q_proj k_proj v_proj o_proj; do
	check "convert -q names the fallback linear self_attn.$p" \
		grep -Eq "^convert: warning: linear 'model.layers.0.self_attn.$p' $fbre" conv.err
done
check "... and only those" test "$(grep -c fallback conv.err)" -eq 4
check "quantization_config.json records them" \
	jqe '.fallback | keys == ["model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"]' \
	fz.out/quantization_config.json
validate fz.out -q >val.json 2>val.err
check "validate: the report lists the fallback linears" \
	jqe '.fallback | length == 4 and all(startswith("model.layers.0.self_attn."))' val.json
check "... with a warning for each, in the report and on stderr" \
	sh -c '[ "$(jq "[.warnings[] | select(test(\"without error feedback\"))] | length" val.json)" -eq 4 ] &&
		[ "$(grep -c "^validate: warning: linear .* quantized without error feedback (fallback)" val.err)" -eq 4 ]'
convert m m.out --bits 3 --rows 4 --cols 32 -j 2 -q 2>conv2.err
check "a normal conversion: no fallback warning" sh -c '! grep -q fallback conv2.err'
check "... and validate reports none" sh -c 'validate m.out -q | jq -e ".fallback == []" >/dev/null'

# a failing tokenizer: named before anything is written (convert's check
# of what the forward reads), without make's "plan.mk: No such file or
# directory"
mkdir badtok && cp m/config.json m/model.safetensors badtok/ && echo '{}' >badtok/tokenizer.json
check_fail "convert: a failing tokenizer is named" 1 "^convert: .*badtok/tokenizer.json: no \"model\" object" \
	convert badtok badtok.out --bits 3 --rows 4 --cols 32 -q
check "... without make's plan.mk noise" sh -c "! grep -q 'plan.mk' '$TMP/cf.err'"
check "... nothing written" test ! -e badtok.out -a ! -e badtok.out.work

# a short calibration text: said in terms of convert's --rows, not
# tokenize's count of text rows ("fills only 1 of 55 rows" for --rows 64)
convert m short.out --bits 3 --rows 64 --cols 32 --cal t.txt --makefile -q >/dev/null
make -s -C short.out.work cal/tokens.frames 2>short.err >/dev/null
check "convert: a short calibration text is named in terms of --rows" \
	grep -q "^convert: warning: the calibration text fills 1 of the 55 text rows of --rows 64 (the other 9 are random tokens): 10 rows of 32 tokens in all" short.err
check "... and tokenize's own count is not printed" sh -c '! grep -q "^tokenize:" short.err'
# a full disk while the calibration text is written: exit 1 naming the
# file, no partial cal.txt (was: exit 2, "awk: write failure")
for how in "--cal t.txt" ""; do
	# (the work directory of an earlier run: its marker)
	rm -rf full.out.work && mkdir -p full.out.work/tmp && : >full.out.work/.exl3-convert-work &&
		ln -s /dev/full full.out.work/tmp/cal.txt
	check_fail "convert ${how:-(default text)}: a full disk while writing the calibration text" 1 \
		"^convert: .*/full.out.work/tmp/cal.txt: cannot write the calibration text: write error: No space left on device" \
		convert m full.out --bits 3 --rows 4 --cols 32 -q $how
	check "... leaves no cal.txt" test ! -e full.out.work/tmp/cal.txt -a ! -e full.out.work/cal/cal.txt
done
done_testing
