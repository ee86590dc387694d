#!/usr/bin/env bash
# t1202-had-rotate: had-rotate's frames, options and bad input.
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
# jqe FILTER FILE: FILTER (over each JSON line) yields something, all true
jqe() { jq -se "[.[] | $1] | length > 0 and all" "$2" >/dev/null; }

tensor-gen -s 1 --scale 0.02 m.weight=172x64 > w.fr
tensor-gen -s 2 -d spd --meta count=1 m.hessian=64x64 > h.fr
tensor-gen -s 3 --scale 0.1 m.bias=172 > b.fr

check "had-rotate with --hessian" sh -c 'had-rotate --hessian h.fr < w.fr > r.fr'
tensor-ls r.fr > r.json
check "frames w_reg su_reg sv_reg h_rot h_ldl, in order" \
	test "$(jq -r .name r.json | tr '\n' ' ')" = "m.w_reg m.su_reg m.sv_reg m.h_rot m.h_ldl "
check "padded shapes 128x256, 128, 256, 128x128" \
	test "$(jq -c .shape r.json | tr '\n' ' ')" = "[128,256] [128] [256] [128,128] [128,128] "
check "w_reg metadata: original shape, seed, out_scales, fallback, key, role" \
	test "$(jq -r 'select(.name=="m.w_reg") | .meta | [.shape, .in_features, .out_features, .seed,
		.out_scales, .out_scales_applied, .fallback, .key, .role, .hessian, .count] | join(",")' r.json)" \
	= "172x64,64,172,0,always,1,0,m,w_reg,m.hessian,1"
check "every frame names its role and key" \
	test "$(jq -r '.meta.role + ":" + .meta.key' r.json | tr '\n' ' ')" \
	= "w_reg:m su_reg:m sv_reg:m h_rot:m h_ldl:m "
# w_reg rows have RMS 1.24371088 over the 64 real input rows (128 padded)
tensor-ls --stats r.fr > rs.json
check "regularized weight RMS = 1.2437 * sqrt(64/128)" \
	jqe 'select(.name=="m.w_reg") | .stats.rms - 1.24371088 * (0.5|sqrt) | (. < 1e-4 and . > -1e-4)' rs.json

cat h.fr w.fr b.fr > hwb.fr
check "hessian and bias on the stream" sh -c 'had-rotate < hwb.fr > r2.fr'
check "same output as with --hessian, plus a padded F32 bias" sh -c \
	'tensor-cat r2.fr "m.[!b]*" -o a.safetensors && tensor-cat r.fr -o b.safetensors && cmp -s a.safetensors b.safetensors &&
	 test "$(tensor-ls r2.fr | jq -c "select(.name==\"m.bias\") | [.dtype, .shape]")" = "[\"F32\",[256]]"'
cat w.fr h.fr > wh.fr
check "a hessian right after its weight applies to it" sh -c \
	'had-rotate < wh.fr | tensor-cat - -o c.safetensors && cmp -s c.safetensors b.safetensors'

# several weights sharing one hessian: same input signs (su), other sv
tensor-gen -s 4 --scale 0.02 k.weight=32x64 > k.fr
cat h.fr w.fr k.fr | had-rotate > two.fr
tensor-ls --stats two.fr > two.json
check "two weights after one hessian: both rotated" \
	test "$(jq -r .name two.json | grep -c w_reg)" = 2
check "shared hessian: identical h_rot frames" bash -c \
	'tensor-cat two.fr "m.h_rot" | tensor-cat - -o hm.safetensors &&
	 tensor-cat two.fr "k.h_rot" | tensor-cat - -o hk.safetensors && cmp -s <(tail -c 65536 hm.safetensors) <(tail -c 65536 hk.safetensors)'

# determinism
check "same seed twice: byte-identical output" sh -c \
	'had-rotate --seed 7 --hessian h.fr < w.fr > d1.fr && had-rotate --seed 7 --hessian h.fr < w.fr > d2.fr && cmp -s d1.fr d2.fr'
check "thread count does not change the output" sh -c \
	'had-rotate -t 1 --seed 7 --hessian h.fr < w.fr > d3.fr && OPENBLAS_NUM_THREADS=1 had-rotate -t 2 --seed 7 --hessian h.fr < w.fr > d4.fr && cmp -s d1.fr d3.fr && cmp -s d1.fr d4.fr'
check "another seed: other output" sh -c \
	'had-rotate --seed 8 --hessian h.fr < w.fr > d5.fr && ! cmp -s d1.fr d5.fr'

check "--zstd: compressed output, same frames" sh -c \
	'had-rotate --zstd=5 --seed 7 --hessian h.fr < w.fr > dz.fr && ! cmp -s dz.fr d1.fr && tensor-cat dz.fr | cmp -s - d1.fr'
check "compressed input is read" sh -c 'tensor-cat --zstd w.fr | had-rotate --seed 7 --hessian h.fr | cmp -s - d1.fr'

# dtypes and sizes
tensor-gen -t F64 -s 2 -d spd --meta count=1 m.hessian=64x64 > h64.fr
check "F64 hessian" jqe 'select(.name=="m.w_reg") | .meta.fallback == "0"' <(had-rotate --hessian h64.fr < w.fr | tensor-ls)
tensor-gen -s 2 -d spd --meta count=1 m.hessian=128x128 > hpad.fr
check "hessian of the padded input size (128 for 64 inputs)" \
	jqe 'select(.name=="m.h_rot") | .shape == [128,128]' <(had-rotate --hessian hpad.fr < w.fr | tensor-ls)
tensor-cat --dtype F16 w.fr > w16.fr
tensor-cat --dtype BF16 w.fr > wbf.fr
check "F16 weight: same as F32 (weights are rounded to fp16 first)" sh -c \
	'had-rotate --hessian h.fr < w16.fr | tensor-cat - --meta dtype=x > a16.fr && had-rotate --hessian h.fr < w.fr | tensor-cat - --meta dtype=x > a32.fr && cmp -s a16.fr a32.fr'
check "BF16 weight" jqe 'select(.name=="m.w_reg") | .meta.dtype == "BF16"' <(had-rotate --hessian h.fr < wbf.fr | tensor-ls)

# out_scales policies
had-rotate --out-scales never --hessian h.fr < w.fr > never.fr
check "--out-scales never: sv are the signs (0 on padding)" \
	jqe 'select(.name=="m.sv_reg") | .stats.max == 1 and .stats.min == -1 and (.stats.rms * .stats.rms * 256 | round) == 172' \
	<(tensor-ls --stats never.fr)
had-rotate --out-scales auto --hessian h.fr < w.fr > auto.fr
check "--out-scales auto decides from the damped diagonal" \
	jqe 'select(.name=="m.w_reg") | .meta.out_scales == "auto" and (.meta.out_scales_applied | test("^[01]$"))' \
	<(tensor-ls auto.fr)

# no hessian: fallback, no h_rot/h_ldl
check "no hessian: fallback frames only" sh -c \
	'had-rotate < w.fr | tensor-ls | jq -r ".name + \" \" + (.meta.fallback // \"\")" | tr "\n" " " | grep -qx "m.w_reg 1 m.su_reg  m.sv_reg  "'

# all-zero weight
tensor-gen -d constant --value 0 z.weight=64x64 > z.fr
had-rotate --out-scales never --hessian h.fr < z.fr > zr.fr
tensor-ls --stats zr.fr > z.json
check "all-zero weight: accepted, zeros=1, out scales forced" \
	jqe 'select(.name=="z.w_reg") | .meta.zeros == "1" and .meta.out_scales_applied == "1"' z.json
check "all-zero weight: sv all 0" jqe 'select(.name=="z.sv_reg") | .stats.rms == 0' z.json

# a singular (rank-1) PSD hessian: the damping makes it definite, no fallback
tensor-gen -d constant --value 1 --meta count=1 m.hessian=64x64 > h1.fr
check "rank-1 hessian: no warning" sh -c 'had-rotate --hessian h1.fr < w.fr > f1.fr 2>err1.txt && ! test -s err1.txt'
check "rank-1 hessian: not a fallback, no retries" \
	jqe 'select(.name=="m.w_reg") | .meta.fallback == "0" and .meta.damp_retries == "0"' <(tensor-ls f1.fr)

# singular / indefinite hessians: fallback with a warning
tensor-gen -d constant --value 0 --meta count=10 m.hessian=64x64 > h0.fr
check_fail "all-zero hessian: warning, fallback" 0 "warning: hessian 'm.hessian': mean diagonal 0 is too small.*fallback" \
	sh -c 'had-rotate --hessian h0.fr < w.fr > f0.fr'
check "all-zero hessian: fallback=1 and a reason in metadata" \
	jqe 'select(.name=="m.w_reg") | .meta.fallback == "1" and (.meta.fallback_reason | test("too small"))' <(tensor-ls f0.fr)
tensor-gen -d arange --meta count=1 m.hessian=64x64 > hi.fr
check_fail "strongly indefinite hessian: 10 damping retries, then fallback" 0 \
	"warning: hessian 'm.hessian': not positive definite after 10 damping retries" \
	sh -c 'had-rotate --hessian hi.fr < w.fr > fi.fr'
check "quiet (-q): no warning" sh -c 'had-rotate -q --hessian hi.fr < w.fr 2>err.txt >/dev/null && ! test -s err.txt'
tensor-gen -d constant --value 1 --meta count=0 m.hessian=64x64 > hc.fr
check_fail "count 0: fallback warning" 0 "sample count is 0" sh -c 'had-rotate --hessian hc.fr < w.fr >/dev/null'
tensor-gen -d constant --value inf --meta count=4 m.hessian=64x64 > hn.fr
check_fail "non-finite hessian: fallback warning" 0 "non-finite" sh -c 'had-rotate --hessian hn.fr < w.fr >/dev/null'

# bad input
tensor-gen -s 5 --meta count=1 -d spd m.hessian=100x100 > h100.fr
check_fail "mismatched hessian size" 1 "had-rotate: weight 'm.weight': hessian 'm.hessian': hessian is 100x100 but the weight has 64 inputs" \
	sh -c 'had-rotate --hessian h100.fr < w.fr > /dev/null'
tensor-gen --meta count=1 m.hessian=64x32 > hr.fr
check_fail "non-square hessian" 1 "hessian 'm.hessian': hessian must be a square matrix, got shape 64x32" \
	sh -c 'had-rotate --hessian hr.fr < w.fr > /dev/null'
tensor-gen --meta count=lots -d spd m.hessian=64x64 > hb.fr
check_fail "unparsable count" 1 "count='lots' is not a number" sh -c 'had-rotate --hessian hb.fr < w.fr > /dev/null'
tensor-gen x.weight=64 > w1.fr
check_fail "1-D weight" 1 "weight 'x.weight': must be rank 2 \(out x in\), got shape 64" sh -c 'had-rotate < w1.fr > /dev/null'
tensor-gen x.weight=4x4x4 > w3.fr
check_fail "3-D weight" 1 "weight 'x.weight': must be rank 2" sh -c 'had-rotate < w3.fr > /dev/null'
tensor-gen -t I32 -d arange x.weight=4x4 > wi.fr 2>/dev/null && \
	check_fail "integer weight" 1 "weight 'x.weight': weight dtype I32 is not a float type" sh -c 'had-rotate < wi.fr > /dev/null'
tensor-gen -d constant --value inf x.weight=16x16 > winf.fr
check_fail "Inf in a weight names the tensor and the element" 1 "had-rotate: weight 'x.weight': non-finite value inf at \[0\]\[0\]" \
	sh -c 'had-rotate < winf.fr > /dev/null'
python3 - <<'EOF'
import json, struct
d = struct.pack('<16f', *([0.5] * 6 + [float('nan')] + [0.5] * 9))
h = json.dumps({'y.weight': {'dtype': 'F32', 'shape': [4, 4], 'data_offsets': [0, len(d)]}}).encode()
open('nan.safetensors', 'wb').write(struct.pack('<Q', len(h)) + h + d)
EOF
check_fail "NaN in a weight names the tensor and the element" 1 "had-rotate: weight 'y.weight': non-finite value nan at \[1\]\[2\]" \
	sh -c 'tensor-cat nan.safetensors | had-rotate > /dev/null'
tensor-gen -d constant --value 1e6 x.weight=16x16 > wbig.fr
check_fail "weight beyond fp16" 1 "weight 'x.weight': value 1e\+06 at \[0\]\[0\] overflows fp16" sh -c 'had-rotate < wbig.fr > /dev/null'
tensor-gen x.bias=172 > bx.fr
check_fail "bias of another weight" 1 "frame 'x.bias': a bias without its weight" sh -c 'cat w.fr bx.fr | had-rotate > /dev/null'
tensor-gen m.bias=100 > bm.fr
check_fail "bias of the wrong length" 1 "bias 'm.bias': bias shape 100 does not match 172 output features" \
	sh -c 'cat w.fr bm.fr | had-rotate > /dev/null'
check_fail "hessian twice (stream and --hessian)" 1 "a hessian on standard input and --hessian" \
	sh -c 'had-rotate --hessian h.fr < hwb.fr > /dev/null'
check_fail "no weight" 1 "no weight frame" sh -c 'had-rotate < h.fr > /dev/null'
check_fail "empty input" 1 "no weight frame" sh -c 'had-rotate < /dev/null > /dev/null'
check_fail "garbage input" 1 "had-rotate: stdin: frame 0: bad magic" sh -c 'echo garbage | had-rotate > /dev/null'
check_fail "missing hessian file" 1 "had-rotate: nope.fr" sh -c 'had-rotate --hessian nope.fr < w.fr > /dev/null'
check_fail "frames of trellis-encode's input are refused" 1 "role 'w_reg' is not an input of had-rotate" \
	sh -c 'had-rotate < r.fr > /dev/null'
# sign search (--sign-draws)
check "--sign-draws 1 -> no search, the plain output" sh -c \
	'had-rotate --hessian h.fr --sign-draws 1 < w.fr | tensor-cat - -o sd1.safetensors && cmp -s sd1.safetensors b.safetensors'
check "--sign-draws 4 -K 2" sh -c 'had-rotate --hessian h.fr --sign-draws 4 -K 2 < w.fr > sd4.fr'
tensor-ls sd4.fr > sd4.json
check "sign search metadata: the draw, the count, K, four estimates, the metric" \
	jqe 'select(.name=="m.w_reg") | .meta | (.sign_draw | tonumber) < 4 and .sign_draws == "4" and .sign_k == "2"
		and (.sign_est | split(",") | length) == 4 and .sign_metric == "proxy" and .seed == "0"' sd4.json
check "the chosen draw has the lowest estimate" \
	jqe 'select(.name=="m.w_reg") | .meta | (.sign_est | split(",") | map(tonumber)) as $e | $e[.sign_draw | tonumber] == ($e | min)' sd4.json
check "sign search twice: byte-identical" sh -c \
	'had-rotate --hessian h.fr --sign-draws 4 -K 2 < w.fr | cmp -s - sd4.fr'
trellis-encode -K 2 < sd4.fr | tensor-ls - > sd4t.json
check "sign search: trellis-encode keeps the draw in the trellis frame" \
	test "$(jq -r 'select(.meta.role == "trellis") | .meta | [.sign_draw, .sign_draws, .sign_k, .sign_metric] | join(",")' sd4t.json)" \
	= "$(jq -r 'select(.name == "m.w_reg") | .meta | [.sign_draw, .sign_draws, .sign_k, .sign_metric] | join(",")' sd4.json)"
had-rotate --hessian h.fr --sign-draws 3 -K 3 --sign-metric output --sign-strips 0 < w.fr | tensor-ls - > sdo.json
check "--sign-metric output is recorded" jqe 'select(.name=="m.w_reg") | .meta.sign_metric == "output"' sdo.json
check "sign search without a Hessian" sh -c 'had-rotate -q --sign-draws 2 -K 2 < w.fr > /dev/null'
check_fail "--sign-draws without -K" 2 "sign-draws 4 needs -K K" had-rotate --sign-draws 4
check_fail "-K without --sign-draws" 2 "go with --sign-draws N" had-rotate -K 3
check_fail "bad --sign-draws" 2 "sign-draws: '0'" had-rotate --sign-draws 0 -K 2
check_fail "bad --sign-metric" 2 "sign-metric: 'best'" had-rotate --sign-draws 2 -K 2 --sign-metric best
check_fail "bad --out-scales" 2 "out-scales: 'sometimes'" had-rotate --out-scales sometimes
check_fail "bad --seed" 2 "seed: 'x'" had-rotate --seed x
check_fail "unknown option" 2 "usage: had-rotate" had-rotate --bogus
check_fail "extra argument" 2 "unexpected argument" had-rotate file
check "-h prints usage on stdout" sh -c 'had-rotate -h | grep -q "^usage: had-rotate"'
if command -v script >/dev/null; then
	check "refuses a terminal" sh -c 'script -qec "had-rotate < w.fr" /dev/null | grep -q "refusing to write binary frames to a terminal"'
else skip "refuses a terminal (no script(1))"; fi
done_testing
