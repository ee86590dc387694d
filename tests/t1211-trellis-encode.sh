#!/usr/bin/env bash
# t1211-trellis-encode: EXL3 tensors from had-rotate's frames, --measure,
# codebooks, determinism, bad input.
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
# jqe FILTER FILE: FILTER (over each JSON line) yields something, all true
jqe() { jq -se "[.[] | $1] | length > 0 and all" "$2" >/dev/null; }
# same A B: two frame streams identical but for the timing ("seconds", "timing")
same() { cmp -s <(tensor-cat "$1" --meta seconds=0 --meta timing=0) <(tensor-cat "$2" --meta seconds=0 --meta timing=0); }
# marker FILE NAME: the int32 value of a 0-dim marker frame
marker() { tensor-cat "$1" "$2" -o "$2.st" && tail -c 4 "$2.st" | od -An -td4 | tr -d ' '; }

tensor-gen -s 1 --scale 0.02 m.weight=48x64 > w.fr
tensor-gen -s 2 -d spd --meta count=1 m.hessian=64x64 > h.fr
tensor-gen -s 3 --scale 0.1 m.bias=48 > b.fr
cat w.fr b.fr > wb.fr
had-rotate --seed 5 --hessian h.fr < wb.fr > r.fr

check "trellis-encode -K 3" sh -c 'trellis-encode -K 3 < r.fr > q.fr'
tensor-ls --stats q.fr > q.json
check "frames trellis, suh, svh, mul1, bias" \
	test "$(jq -r .name q.json | tr '\n' ' ')" = "m.trellis m.suh m.svh m.mul1 m.bias "
check "dtypes and shapes: I16 (8,8,48), F16 (128), F16 (128), I32 (), F16 (128)" \
	test "$(jq -c '[.dtype, .shape]' q.json | tr -d '\n')" = \
	'["I16",[8,8,48]]["F16",[128]]["F16",[128]]["I32",[]]["F16",[128]]'
check "mul1 marker value 0x83DCD12D as int32" test "$(marker q.fr m.mul1)" = -2082680531
check "trellis metadata: K, codebook, proxy_err, g_scale, fallback, seconds, shape, seed" \
	jqe 'select(.name=="m.trellis") | .meta | .K == "3" and .codebook == "mul1" and
		(.proxy_err | tonumber) > 0 and (.proxy_err | tonumber) < 0.05 and
		(.g_scale | tonumber) > 0.5 and (.g_scale | tonumber) < 1.2 and .fallback == "0" and
		(.seconds | tonumber) >= 0 and .shape == "48x64" and .seed == "5" and .role == "trellis" and .key == "m"' q.json
check "bias: F16, padded with zeros (48 of 128 values)" \
	jqe 'select(.name=="m.bias") | .stats.count == 128' q.json
check "padded output channels: svh 0 there" sh -c \
	'tensor-cat q.fr m.svh --dtype F32 -o svh.safetensors && python3 -c "
import struct,sys; d=open(\"svh.safetensors\",\"rb\").read(); n=struct.unpack(\"<Q\",d[:8])[0]; v=struct.unpack(\"<128f\",d[8+n:])
sys.exit(0 if all(x==0 for x in v[48:]) and all(x!=0 for x in v[:48]) else 1)"'

# codebooks
trellis-encode -K 2 --codebook mcg < r.fr > qm.fr
check "--codebook mcg: .mcg marker 0xCBAC1FED" test "$(marker qm.fr m.mcg)" = -877912083
check "--codebook mcg: codebook in metadata" jqe 'select(.name=="m.trellis") | .meta.codebook == "mcg"' <(tensor-ls qm.fr)
check "--codebook 3inst: no marker" sh -c \
	'test "$(trellis-encode -K 2 --codebook 3inst < r.fr | tensor-ls | jq -r .name | tr "\n" " ")" = "m.trellis m.suh m.svh m.bias "'

# --measure
check "--measure 2,3,4,5" sh -c 'trellis-encode --measure 2,3,4,5 < r.fr > m.json'
check "one JSON line per K with tensor, K, proxy_err, numel, bytes, seconds" \
	test "$(jq -c '[.tensor, .K, .numel, .bytes, (.proxy_err|type), (.seconds|type)]' m.json | tr -d '\n')" = \
	'["m",2,3072,4868,"number","number"]["m",3,3072,6916,"number","number"]["m",4,3072,8964,"number","number"]["m",5,3072,11012,"number","number"]'
check "timing: the 8 phases, each >= 0, the Viterbi within search + ldlq + refine, the phases within the total" \
	jqe '(.timing | keys == ["input", "ldlq", "prep", "proxy", "refine", "search", "start", "viterbi"]
		and all(.[]; type == "number" and . >= 0)) and
		.timing.viterbi <= .timing.search + .timing.ldlq + .timing.refine + 1e-3 and
		.timing.search + .timing.ldlq + .timing.refine + .timing.proxy <= .seconds + 1e-3' m.json
check "proxy error falls as K rises" sh -c 'jq -se "[.[].proxy_err] | . == (sort | reverse) and (unique | length) == 4" m.json >/dev/null'
check "--measure prints no frames and accepts a terminal-less stdout" test "$(wc -l < m.json)" = 4
check "the trellis frame's timing metadata: name=seconds for the 8 phases" \
	jqe 'select(.meta.role == "trellis") | .meta.timing | test("^start=[0-9.]+ input=[0-9.]+ prep=[0-9.]+ search=[0-9.]+ ldlq=[0-9.]+ refine=[0-9.]+ proxy=[0-9.]+ viterbi=[0-9.]+$")' <(tensor-ls q.fr)
check "--measure agrees with -K (same proxy error at K=3)" \
	test "$(jq -r 'select(.K==3) | .proxy_err' m.json | xargs printf '%.6g')" = \
	     "$(jq -r 'select(.name=="m.trellis") | .meta.proxy_err' q.json | xargs printf '%.6g')"
check "--json: summary line on stderr" sh -c \
	'trellis-encode -K 2 --json < r.fr 2>s.json >/dev/null && jq -e ".tensor == \"m\" and .K == 2" s.json >/dev/null'
check "--json and --measure count the Viterbi work (search and LDLQ tiles)" sh -c \
	'jq -se "all(.search_tiles > 0 and .ldlq_tiles > 0)" m.json s.json >/dev/null'
# --sample: a measurement on a sample of the 16-column output strips
# (its scale: the fine grid from one predicted from the tiles' RMS, no
# coarse grid; with every strip the result is then -K's at that scale)
trellis-encode --measure 2,4 --sample 1 < r.fr > s1.json
jqf() { jq -e "$@" >/dev/null; }
for K in 2 4; do
	g=$(jq -r "select(.K == $K) | .g_scale" s1.json)
	trellis-encode -K $K --g-scale "$g" --json < r.fr 2>g$K.json >/dev/null
	jq -c "select(.K == $K)" s1.json >s1.$K.json
	check "--measure $K --sample 1 (every strip) = -K $K --g-scale at the scale it found" \
		jqf --slurpfile s s1.json --argjson K $K '($s | map(select(.K == $K))[0]) as $a |
		  [.proxy_err, .g_scale, .ldlq_tiles, .numel] == [$a.proxy_err, $a.g_scale, $a.ldlq_tiles, $a.numel] and
		  $a.strips == $a.strips_total' g$K.json
	check "... its error within 5% of the whole search's, with fewer search tiles" \
		jqf --slurpfile m m.json --argjson K $K '($m | map(select(.K == $K))[0]) as $w |
		  .proxy_err < 1.05 * $w.proxy_err and .search_tiles > 0 and .search_tiles < $w.search_tiles' s1.$K.json
done
check "--sample 0.5: half the strips, less work, an estimate near the whole's" sh -c \
	'trellis-encode --measure 3 --sample 0.5 < r.fr > s5.json &&
	 jq -se --slurpfile m m.json "(\$m | map(select(.K == 3))[0]) as \$w | .[0] as \$s |
	   \$s.sample == 0.5 and \$s.strips * 2 == \$s.strips_total and \$s.ldlq_tiles < \$w.ldlq_tiles and
	   \$s.proxy_err > 0.5 * \$w.proxy_err and \$s.proxy_err < 2 * \$w.proxy_err and \$s.numel == \$w.numel" s5.json >/dev/null'
check "--sample is deterministic" sh -c 'jq -c "del(.seconds, .timing)" s5.json > s5a.json && trellis-encode --measure 3 --sample 0.5 < r.fr | jq -c "del(.seconds, .timing)" | cmp -s - s5a.json'

# direct weight frames (had-rotate's step inside)
trellis-encode -K 3 --seed 5 --hessian h.fr < wb.fr > qd.fr
check "plain weight frames give the same tensors as had-rotate | trellis-encode" same q.fr qd.fr
cat h.fr wb.fr | trellis-encode -K 3 --seed 5 > qs.fr
check "plain weight with its hessian on the stream: the same" same q.fr qs.fr

# determinism: the same output on any thread count (-t, BLAS, OpenMP),
# under each of two OpenBLAS kernels (tests/lib-blas.sh blas_pair; between
# kernels the output may differ)
trellis-encode -K 3 < r.fr > q2.fr
check "same input twice: identical output (but for the timing)" same q.fr q2.fr
tensor-gen -s 9 --scale 0.02 big.weight=128x256 > wbig.fr
tensor-gen -s 8 -d spd --meta count=1 big.hessian=256x256 > hbig.fr
had-rotate --hessian hbig.fr < wbig.fr > rbig.fr
blas_pair
for k in $BLAS_KERNELS; do
	te() { blas_under "$k" trellis-encode "$@"; }
	te -K 3 < r.fr > q1.$k.fr
	te -t 1 -K 3 < r.fr > q3.$k.fr
	OPENBLAS_NUM_THREADS=1 te -t 2 -K 3 < r.fr > q4.$k.fr
	OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 te -t 1 -K 3 < r.fr > q5.$k.fr
	check "$k: -t 1: identical output" same q1.$k.fr q3.$k.fr
	check "$k: -t 2 with one BLAS thread: identical output" same q1.$k.fr q4.$k.fr
	check "$k: -t 1 with two BLAS and OpenMP threads: identical output" same q1.$k.fr q5.$k.fr
	te -K 2 -t 1 < rbig.fr > b1.$k.fr
	OPENBLAS_NUM_THREADS=1 te -K 2 -t 2 < rbig.fr > b2.$k.fr
	check "$k: 128x256 (two LDLQ spans) at -t 1 and at -t 2 with one BLAS thread: identical" same b1.$k.fr b2.$k.fr
done
[ -z "$BLAS_WHY" ] || skip "the same under a second OpenBLAS kernel: $BLAS_WHY"

# --ldlq-passes (refinement passes after LDLQ; the algorithm is checked
# against a plain reference in tests/unit/t1208-ldlq-refine)
trellis-encode -K 2 --json < rbig.fr 2>p0.json >p0.fr
trellis-encode -K 2 --json --ldlq-passes 1 < rbig.fr 2>p1.json >p1.fr
trellis-encode -K 2 --json --ldlq-passes 2 < rbig.fr 2>p2.json >p2.fr
check "--ldlq-passes 1: a lower proxy error, the same scale, twice the LDLQ tiles" jq -ne \
	--slurpfile a p0.json --slurpfile b p1.json --slurpfile c p2.json \
	'$b[0].proxy_err < $a[0].proxy_err and $c[0].proxy_err <= $b[0].proxy_err and
	 $b[0].g_scale == $a[0].g_scale and $b[0].ldlq_tiles == 2 * $a[0].ldlq_tiles and
	 $b[0].ldlq_passes == 1 and $b[0].refine_kept > 0 and ($a[0] | has("ldlq_passes") | not)'
check "--ldlq-passes 1: ldlq_passes and its proxy_err in the trellis metadata" \
	jqe 'select(.name=="big.trellis") | .meta.ldlq_passes == "1" and (.meta.proxy_err | tonumber) > 0' <(tensor-ls p1.fr)
trellis-encode -K 2 --ldlq-passes 0 < rbig.fr > p00.fr
check "--ldlq-passes 0 is the default, byte for byte" same p0.fr p00.fr
OPENBLAS_NUM_THREADS=1 trellis-encode -K 2 -t 1 --ldlq-passes 1 < rbig.fr > p1t.fr
check "--ldlq-passes 1: -t 1 with one BLAS thread == -t 2" same p1.fr p1t.fr
check "--ldlq-passes with --measure --sample: lower estimates too" sh -c \
	'trellis-encode --measure 2,3 --sample 0.5 < rbig.fr > ms0.json &&
	 trellis-encode --measure 2,3 --sample 0.5 --ldlq-passes 1 < rbig.fr > ms1.json &&
	 jq -ne --slurpfile a ms0.json --slurpfile b ms1.json "\$b[0].proxy_err < \$a[0].proxy_err and \$b[1].proxy_err < \$a[1].proxy_err" >/dev/null'

# fallback and all-zero weights
had-rotate < w.fr | trellis-encode -K 2 > qf.fr
check "no hessian: fallback=1" jqe 'select(.name=="m.trellis") | .meta.fallback == "1"' <(tensor-ls qf.fr)
had-rotate < w.fr | trellis-encode -K 2 --ldlq-passes 1 > qfp.fr
check "no hessian: --ldlq-passes changes nothing and is not recorded" same qf.fr qfp.fr
tensor-gen -d constant --value 0 z.weight=64x64 > z.fr
check "all-zero weight: svh all 0 (exact zero output), proxy_err 0" sh -c \
	'trellis-encode -K 2 < z.fr | tensor-ls --stats > z.json &&
	 jq -se "map(select(.name==\"z.svh\"))[0].stats.rms == 0 and (map(select(.name==\"z.trellis\"))[0].meta.proxy_err == \"0\")" z.json >/dev/null'

# usage errors
for k in 0 9 -1 x; do
	check_fail "-K $k refused" 2 "trellis-encode: -K: '$k' is not an integer in 1..8" trellis-encode -K "$k"
done
check_fail "--measure with K=9" 2 "measure: '9' is not an integer in 1..8" trellis-encode --measure 2,9
check_fail "--measure empty" 2 "measure: empty list" trellis-encode --measure ,
check_fail "no -K" 2 "-K N \(1..8\) or --measure LIST is required" trellis-encode
check_fail "-K and --measure" 2 "exclude each other" trellis-encode -K 2 --measure 2,3
check_fail "--sample without --measure" 2 "--sample needs --measure" trellis-encode -K 2 --sample 0.5
for f in 0 1.5 x -0.1; do
	check_fail "--sample $f refused" 2 "--sample: '$f' is not a fraction in \(0, 1\]" trellis-encode --measure 2 --sample "$f"
done
for p in 9 -1 x; do
	check_fail "--ldlq-passes $p refused" 2 "trellis-encode: --ldlq-passes: '$p' is not an integer in 0..8" \
		trellis-encode -K 2 --ldlq-passes "$p"
done
check_fail "bad codebook" 2 "codebook: 'e8p' is not mul1, mcg or 3inst" trellis-encode -K 2 --codebook e8p
check_fail "bad option" 2 "usage: trellis-encode" trellis-encode -K 2 --frobnicate
check "-h prints usage on stdout" sh -c 'trellis-encode -h | grep -q "^usage: trellis-encode -K N"'

# bad input
check_fail "missing su_reg frame" 1 "trellis-encode: 'm': missing frame 'm.su_reg' \(from had-rotate\)" \
	sh -c 'tensor-cat r.fr "m.w_reg" "m.sv_reg" "m.h_*" | trellis-encode -K 2 > /dev/null'
check_fail "missing h_ldl frame (not a fallback)" 1 "missing frame 'm.h_ldl'" \
	sh -c 'tensor-cat r.fr "m.w_reg" "m.s*" "m.h_rot" | trellis-encode -K 2 > /dev/null'
tensor-gen --meta role=sv_reg --meta key=m m.sv_reg=100 > badsv.fr
check_fail "sv_reg of the wrong length" 1 "frame 'm.sv_reg': shape 100, expected 128" \
	sh -c '{ tensor-cat r.fr "m.w_reg" "m.su_reg"; cat badsv.fr; tensor-cat r.fr "m.h_*"; } | trellis-encode -K 2 > /dev/null'
tensor-gen --meta role=w_reg --meta key=m m.w_reg=100x128 > badw.fr
check_fail "w_reg not a multiple of 128" 1 "frame 'm.w_reg': shape 100x128 is not \(k, n\) with multiples of 128" \
	sh -c 'trellis-encode -K 2 < badw.fr > /dev/null'
tensor-gen -d constant --value inf --meta role=w_reg --meta key=m --meta fallback=1 m.w_reg=128x128 > infw.fr
check_fail "Inf in w_reg" 1 "frame 'm.w_reg': non-finite value inf" \
	sh -c '{ cat infw.fr; tensor-cat r.fr "m.s*"; } | trellis-encode -K 2 > /dev/null'
check_fail "duplicate frame" 1 "a second 'su_reg' frame for 'm'" \
	sh -c '{ tensor-cat r.fr "m.w_reg" "m.su_reg"; tensor-cat r.fr "m.su_reg"; } | trellis-encode -K 2 > /dev/null'
tensor-gen -d constant --value inf x.weight=16x16 > winf.fr
check_fail "Inf in a plain weight names it" 1 "trellis-encode: weight 'x.weight': non-finite value inf at \[0\]\[0\]" \
	sh -c 'trellis-encode -K 2 < winf.fr > /dev/null'
tensor-gen -d spd --meta count=1 m.hessian=32x32 > h32.fr
check_fail "mismatched hessian size" 1 "weight 'm.weight': hessian 'm.hessian': hessian is 32x32 but the weight has 64 inputs" \
	sh -c 'trellis-encode -K 2 --hessian h32.fr < w.fr > /dev/null'
tensor-gen x.weight=64 > w1.fr
check_fail "1-D weight" 1 "weight 'x.weight': must be rank 2" sh -c 'trellis-encode -K 2 < w1.fr > /dev/null'
tensor-gen --meta role=trellis x.trellis=4x4 > tr.fr
check_fail "frames of another stage" 1 "role 'trellis' is not an input of trellis-encode" \
	sh -c 'trellis-encode -K 2 < tr.fr > /dev/null'
check_fail "empty input" 1 "no weight frames" sh -c 'trellis-encode -K 2 < /dev/null > /dev/null'
check_fail "truncated input" 1 "trellis-encode: stdin: frame 0 'm.w_reg': truncated payload" sh -c 'head -c 1000 r.fr | trellis-encode -K 2 > /dev/null'
done_testing
