#!/usr/bin/env bash
# t1501-exl3-matmul: the exl3-matmul program (numerics are in
# tests/unit/t1500-exl3.c; this covers the command line, the stream layout,
# padding, --dequant/--check, model sources and bad input).
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1

# group L: k=256, n=384, K=3, MUL1, with bias; random trellis words are
# valid tiles (every bit pattern decodes)
tensor-gen -d uniform -t I16 --scale 32768 -s 1 L.trellis=16x24x48 >g.fr
tensor-gen -t F16 -s 2 --scale 0.05 L.suh=256 L.svh=384 >>g.fr
tensor-gen -t F16 -s 3 L.bias=384 >>g.fr
tensor-gen -d constant -t I32 --value -2082680531 L.mul1= >>g.fr
tensor-gen -t F32 -s 4 x=5x256 >x.fr

stat_of() { tensor-ls --stats "$1" | jq -r "$2"; }

check "matmul from one stream (group, then X)" sh -c 'cat g.fr x.fr | exl3-matmul >y1.fr'
check "Y is 5x384 F32 named after X" test "$(stat_of y1.fr '"\(.name) \(.dtype) \(.shape)"')" = 'x F32 [5,384]'
check "Y carries exl3_tensor metadata" test "$(stat_of y1.fr '.meta.exl3_tensor')" = L
check "-x FILE gives the same bytes" sh -c 'exl3-matmul -x x.fr <g.fr >y2.fr && cmp y1.fr y2.fr'
check "-x - reads X after the group" sh -c 'cat g.fr x.fr | exl3-matmul -x - | cmp - y1.fr'
check "-t 1 gives the same bytes" sh -c 'exl3-matmul -t 1 -x x.fr <g.fr >y3.fr && cmp y1.fr y3.fr'
check "--reference path runs" sh -c 'exl3-matmul --reference -x x.fr <g.fr >yr.fr'
# fast and reference agree (both fp32, different summation order)
r1=$(stat_of y1.fr .stats.rms); r2=$(stat_of yr.fr .stats.rms)
check "fast and reference agree (rms $r1 vs $r2)" \
	sh -c "jq -ne '($r1 - $r2) | fabs < 1e-6 * $r2' >/dev/null"
check "frames before the group are skipped" sh -c 'tensor-gen junk=3 | cat - g.fr x.fr | exl3-matmul | cmp - y1.fr'

# several X frames, other dtypes and ranks
tensor-gen -t BF16 -s 5 a=256 >xs.fr
tensor-gen -t F16 -s 6 b=2x3x256 >>xs.fr
check "several X frames" sh -c 'exl3-matmul -x xs.fr <g.fr >ys.fr'
check "1-D BF16 and 3-D F16 inputs" test "$(tensor-ls ys.fr | jq -c .shape | tr '\n' ' ')" = '[384] [2,3,384] '
check "--out-dtype F16" test "$(exl3-matmul --out-dtype F16 -x x.fr <g.fr | tensor-ls - | jq -r .dtype)" = F16
check "--zstd output is compressed and readable" sh -c "exl3-matmul --zstd -x x.fr <g.fr >yz.fr && ! cmp -s yz.fr y1.fr && tensor-ls --stats yz.fr | jq -e '.stats.rms == $r1' >/dev/null"

# --dequant and --check
check "--dequant writes L.weight (out x in)" \
	test "$(exl3-matmul --dequant <g.fr | tensor-ls - | jq -c '[.name,.shape,.meta.K,.meta.codebook]')" = '["L.weight",[384,256],"3","mul1"]'
exl3-matmul --dequant <g.fr >w.fr
exl3-matmul --dequant --out-dtype F16 <g.fr >w16.fr
check "--check against itself: zero error" \
	sh -c 'exl3-matmul --check w.fr <g.fr | jq -e ".tensor == \"L\" and .rel_fro_err == 0 and .max_abs_err == 0 and .shape == [384,256]" >/dev/null'
check "--check against an F16-rounded weight: small nonzero error" \
	sh -c 'exl3-matmul --check w16.fr <g.fr | jq -e ".rel_fro_err > 0 and .rel_fro_err < 1e-3" >/dev/null'
# a reference Y: X·Wᵀ from the dense weight must match Y; use --check with
# a weight made from another seed: large error
tensor-gen -t F32 -s 9 --scale 0.003 L.weight=384x256 >wr.fr
check "--check against an unrelated weight: large error" \
	sh -c 'exl3-matmul --check wr.fr <g.fr | jq -e ".rel_fro_err > 0.5" >/dev/null'

# model sources: safetensors file and directory
tensor-cat g.fr -o m.safetensors 2>/dev/null
mkdir -p model && cp m.safetensors model/model.safetensors
check "--model FILE.safetensors" sh -c 'exl3-matmul --model m.safetensors --tensor L -x x.fr | cmp - y1.fr'
check "--model DIR, X on stdin" sh -c 'exl3-matmul --model model --tensor L <x.fr | cmp - y1.fr'
check "--model frame file" sh -c 'exl3-matmul --model g.fr --tensor L <x.fr | cmp - y1.fr'

# padding: k=128 (in 64), n=256 (out 172)
tensor-gen -d uniform -t I16 --scale 32768 -s 11 P.trellis=8x16x32 >p.fr
tensor-gen -t F16 -s 12 --scale 0.05 P.suh=128 P.svh=256 >>p.fr
tensor-gen -t F32 -s 13 xp=4x64 >xp.fr
check "--in 64 --out 172: Y trimmed to 4x172" \
	test "$(exl3-matmul --in 64 --out 172 -x xp.fr <p.fr | tensor-ls - | jq -c .shape)" = '[4,172]'
check "--dequant trimmed to 172x64" \
	test "$(exl3-matmul --in 64 --out 172 --dequant <p.fr | tensor-ls - | jq -c .shape)" = '[172,64]'
tensor-gen -d uniform -t I16 --scale 32768 -s 11 --meta orig_in=64 --meta orig_out=172 P.trellis=8x16x32 >pm.fr
tensor-gen -t F16 -s 12 --scale 0.05 P.suh=128 P.svh=256 >>pm.fr
check "orig_in/orig_out metadata trims like --in/--out" sh -c \
	'exl3-matmul -x xp.fr <pm.fr >a.fr && exl3-matmul --in 64 --out 172 -x xp.fr <p.fr >b.fr && cmp a.fr b.fr'
# --check: the reference's shape sets unknown sizes, but must match stated ones
tensor-gen -s 14 P.weight=172x64 >wp.fr
tensor-gen -s 14 P.weight=100x64 >wq.fr
check "--check sets the sizes of a tensor without metadata" \
	sh -c 'exl3-matmul --check wq.fr <p.fr | jq -e ".shape == [100,64]" >/dev/null'
check "--check against the stated sizes (orig_in/orig_out)" \
	sh -c 'exl3-matmul --check wp.fr <pm.fr | jq -e ".shape == [172,64]" >/dev/null'
check_fail "--check with a reference of another shape that pads alike" 1 \
	"wq.fr: 'P.weight': shape 100x64, but tensor 'P' is 172x64" exl3-matmul --check wq.fr <pm.fr
check "--tensor picks a later group" sh -c 'cat p.fr g.fr x.fr | exl3-matmul --tensor L | cmp - y1.fr'
check_fail "without --tensor the first group (P) is used" 1 "input frame 'L.trellis'" sh -c 'cat p.fr g.fr x.fr | exl3-matmul'
exl3-matmul --in 64 --out 172 --dequant <p.fr >wp.fr
check "--check takes the shape from REF" \
	sh -c 'exl3-matmul --check wp.fr <p.fr | jq -e ".shape == [172,64] and .padded == [256,128] and .rel_fro_err == 0" >/dev/null'

# a model directory: original sizes from config.json by module name
# (stories260K-like: hidden 64, intermediate 172, 8 heads, 4 kv heads)
mkdir -p cfgm
printf '{"model_type":"llama","num_hidden_layers":1,"hidden_size":64,"intermediate_size":172,"num_attention_heads":8,"num_key_value_heads":4,"vocab_size":512}' >cfgm/config.json
D=model.layers.0.mlp.down_proj; Q=model.layers.0.self_attn.k_proj
{ tensor-gen -d uniform -t I16 --scale 32768 -s 21 $D.trellis=16x8x32
  tensor-gen -t F16 --scale 0.05 -s 22 $D.suh=256 $D.svh=128
  tensor-gen -d uniform -t I16 --scale 32768 -s 23 $Q.trellis=8x8x32
  tensor-gen -t F16 --scale 0.05 -s 24 $Q.suh=128 $Q.svh=128; } | tensor-cat - -o cfgm/model.safetensors 2>/dev/null
check "config.json: down_proj is 64x172" \
	test "$(exl3-matmul --model cfgm --tensor $D --dequant | tensor-ls - | jq -c .shape)" = '[64,172]'
check "config.json: k_proj is 32x64" \
	test "$(exl3-matmul --model cfgm --tensor $Q --dequant | tensor-ls - | jq -c .shape)" = '[32,64]'
check "--in/--out override config.json" \
	test "$(exl3-matmul --model cfgm --tensor $Q --in 128 --out 100 --dequant | tensor-ls - | jq -c .shape)" = '[100,128]'

# a directory written by pack-write for stories260K (random valid layers):
# sizes from its config.json, same Y as the frames with --in/--out
if have_shared && command -v pack-write >/dev/null; then
	q() { tensor-gen -d uniform -t I16 --scale 32768 -s $4 $1.trellis=$(($2/16))x$(($3/16))x32
	      tensor-gen -t F16 --scale 0.05 -s $4 $1.suh=$2 $1.svh=$3
	      tensor-gen -t I32 -d constant --value -2082680531 $1.mul1=; }
	s=0
	for l in 0 1 2 3 4; do
		p=model.layers.$l
		for m in q k v o; do q $p.self_attn.${m}_proj 128 128 $((s += 1)); done
		q $p.mlp.gate_proj 128 256 $((s += 1)); q $p.mlp.up_proj 128 256 $((s += 1))
		q $p.mlp.down_proj 256 128 $((s += 1))
	done >sq.fr
	check "pack-write a stories260K-shaped EXL3 model" pack-write -q --model "$SHARED/models/stories260K" --passthrough pw <sq.fr
	D=model.layers.3.mlp.down_proj
	check "pack-write dir: down_proj dequantizes to 64x172" \
		test "$(exl3-matmul --model pw --tensor $D --dequant | tensor-ls - | jq -c .shape)" = '[64,172]'
	tensor-gen -s 8 xs=3x172 >x172.fr
	check "pack-write dir: Y equals the frames' Y" sh -c \
		"exl3-matmul --model pw --tensor $D -x x172.fr >ya.fr && exl3-matmul --tensor $D --in 172 --out 64 -x x172.fr <sq.fr | cmp - ya.fr"
else
	skip "pack-write (not built or no shared model)"; skip "pack-write dir shape"; skip "pack-write dir Y"
fi

# end to end with the encoder (when it is built): a real weight, quantized at
# K = 3, must come back with the error the codebook allows (sqrt of the
# i.i.d. MSE 0.0176 is 0.133; the model's Hessian-free fallback is close)
if have_shared && command -v trellis-encode >/dev/null && command -v had-rotate >/dev/null; then
	W=model.layers.0.mlp.down_proj.weight
	tensor-cat "$SHARED/models/stories260K" $W >sw.fr
	had-rotate <sw.fr | trellis-encode -q -K 3 >sq.fr
	check "stories260K down_proj at K=3: --check error 0.10..0.16" \
		sh -c 'exl3-matmul --check sw.fr <sq.fr | jq -e ".shape == [64,172] and .rel_fro_err > 0.10 and .rel_fro_err < 0.16" >/dev/null'
	check "stories260K down_proj: --dequant has the original shape" \
		test "$(exl3-matmul --dequant <sq.fr | tensor-ls - | jq -c .shape)" = '[64,172]'
else
	skip "end to end with trellis-encode (not built or no shared model)"
	skip "end to end --dequant shape"
fi

# bad input: exit 1 with a message naming the tensor
tensor-gen -d uniform -t I16 --scale 32768 -s 1 L.trellis=16x24x48 >nosuh.fr
tensor-gen -t F16 -s 2 L.svh=384 >>nosuh.fr
check_fail "missing suh" 1 "tensor 'L': missing 'L.suh'" exl3-matmul --dequant <nosuh.fr
tensor-gen -d uniform -t I16 --scale 32768 K9.trellis=8x8x144 >k9.fr
tensor-gen -t F16 K9.suh=128 K9.svh=128 >>k9.fr
check_fail "K = 9" 1 "'K9.trellis'.*K = 9" exl3-matmul --dequant <k9.fr
tensor-gen -d uniform -t I16 --scale 32768 S.trellis=1x8x32 >s.fr
tensor-gen -t F16 S.suh=16 S.svh=128 >>s.fr
check_fail "k = 16 is not a multiple of 128" 1 "'S.trellis'.*multiple of 128" exl3-matmul --dequant <s.fr
{ cat g.fr; tensor-gen -d constant -t I32 --value -877912083 L.mcg=; } >both.fr
check_fail "both codebook markers" 1 "tensor 'L': both 'L.mcg' and 'L.mul1'" exl3-matmul --dequant <both.fr
tensor-gen x=2x100 >x100.fr
check_fail "X width mismatch" 1 "frame 'x': width 100 .*tensor 'L'" exl3-matmul -x x100.fr <g.fr
check_fail "no EXL3 group" 1 "no EXL3 tensor group" exl3-matmul --dequant <x.fr
check_fail "--tensor not present" 1 "no EXL3 tensor 'Q'" exl3-matmul --tensor Q --dequant <g.fr
check_fail "--model without --tensor" 2 "needs --tensor" exl3-matmul --model m.safetensors
check_fail "--dequant with --check" 2 "exclude" exl3-matmul --dequant --check w.fr
check_fail "--in larger than the padded size" 1 "in_features 300 not in 1..256" exl3-matmul --in 300 --dequant <g.fr
check_fail "unknown option" 2 "usage" exl3-matmul --bogus
check "-h prints usage, exit 0" sh -c 'exl3-matmul -h | grep -q "^usage: exl3-matmul"'
done_testing
