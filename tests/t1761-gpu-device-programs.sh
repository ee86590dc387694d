#!/usr/bin/env bash
# t1761-gpu-device-programs: --device of hessian-capture, model-eval,
# had-rotate, pipelines/convert and pipelines/validate.
# Everywhere: a bad value exits 2 naming it; cpu is the default (same
# bytes); auto works. Without a CUDA device: cuda exits 1 saying why, auto
# runs on the CPU (same bytes as cpu) and says so on stderr unless -q. With
# a device (or the emulator): the cuda results equal the CPU's up to F32
# rounding (statistics compared) and the frames keep names, shapes and
# metadata (trellis-encode on cuda, byte-identical, is t1750's).
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
jqe() { jq -e "$@" >/dev/null; }
"$ROOT/examples/make-tiny-llama" tiny >/dev/null
printf 'the quick brown fox jumps over the lazy dog.\nonce upon a time there was a town by the sea.\n' >t.txt
tensor-gen -s 1 --scale 0.02 m.weight=48x200 >w.fr
tensor-gen -s 2 -d spd --meta count=1 m.hessian=200x200 >h.fr

# ---- usage -----------------------------------------------------------------
for p in hessian-capture model-eval had-rotate; do
	check_fail "$p --device xpu exits 2" 2 "--device: 'xpu' is not cpu, cuda or auto" \
		$p --device xpu --model tiny --text t.txt </dev/null
done
check_fail "hessian-capture --merge --device exits 2" 2 "--merge only adds frames" \
	hessian-capture --merge --device cpu h.fr
check_fail "convert --device xpu exits 2" 2 "--device: 'xpu'" \
	"$ROOT/pipelines/convert" tiny out --bits 2 --device xpu
check_fail "convert --gpu-stages bogus exits 2" 2 "--gpu-stages: 'capture,lm'" \
	"$ROOT/pipelines/convert" tiny out --bits 2 --gpu-stages capture,lm
check_fail "validate --device xpu exits 2" 2 "--device: 'xpu'" \
	"$ROOT/pipelines/validate" out --device xpu
for p in hessian-capture model-eval had-rotate; do
	check "$p -h shows --device" sh -c "$p -h | grep -q -- '--device cpu|cuda|auto'"
done

# ---- cpu is the default --------------------------------------------------------
check "hessian-capture --device cpu" sh -c 'hessian-capture -q --model tiny --text t.txt --rows 2 --cols 16 -o h0.fr &&
	hessian-capture -q --model tiny --text t.txt --rows 2 --cols 16 --device cpu -o hc.fr && cmp h0.fr hc.fr'
check "hessian-capture --activations --device cpu" sh -c \
	'tensor-gen -s 3 x=50x24 | hessian-capture --activations --device cpu > ac.fr &&
	 tensor-gen -s 3 x=50x24 | hessian-capture --activations > a0.fr && cmp a0.fr ac.fr'
check "model-eval --device cpu" sh -c 'model-eval -q --model tiny --text t.txt --cols 16 > e0.json &&
	model-eval -q --model tiny --text t.txt --cols 16 --device cpu > ec.json && cmp e0.json ec.json'
check "had-rotate --device cpu" sh -c 'had-rotate --hessian h.fr < w.fr > r0.fr &&
	had-rotate --hessian h.fr --device cpu < w.fr > rc.fr && cmp r0.fr rc.fr'
check "convert --makefile --device auto --gpu-stages encode: only the encode gets auto" sh -c \
	'"$ROOT/pipelines/convert" tiny out --bits 2 -q --makefile --device auto --gpu-stages encode --work wn >/dev/null &&
	 grep -qE "^CAPOPT := --device cpu( |$)" wn/Makefile && grep -qx "ROTOPT := --device cpu" wn/Makefile &&
	 grep -qx "ENCOPT := --device auto" wn/Makefile'
check "convert --makefile: cpu by default for every stage" sh -c \
	'"$ROOT/pipelines/convert" tiny out2 --bits 2 -q --makefile --work wd >/dev/null &&
	 test "$(grep -cE "^(CAP|ROT|ENC)OPT := --device cpu( |$)" wd/Makefile)" = 3 &&
	 grep -q "hessian-capture -q \$(CAPOPT)" wd/convert.mk && grep -q "had-rotate -q \$(ROTOPT)" wd/convert.mk'
check_fail "convert --gpu-ldlq without the encode stage on the GPU exits 2" 2 "needs the encode stage on the GPU" \
	"$ROOT/pipelines/convert" tiny outl --bits 2 --gpu-ldlq --device cuda --gpu-stages capture
check "convert --makefile --gpu-ldlq: trellis-encode --gpu-ldlq, and in params/quant (its codes differ)" sh -c \
	'"$ROOT/pipelines/convert" tiny outl --bits 2 -q --makefile --device auto --gpu-ldlq --work wl >/dev/null &&
	 grep -qx "ENCOPT := --device auto --gpu-ldlq" wl/Makefile && grep -q " gpu_ldlq=1" wl/params/quant &&
	 ! grep -q "gpu_ldlq" wd/params/quant'
check "convert -n --json: the same devices, nothing written" sh -c \
	'"$ROOT/pipelines/convert" tiny out3 --bits 2 -n --json --device auto --gpu-stages encode --work wj |
	 jq -e ".devices == {capture: \"cpu\", rotate: \"cpu\", encode: \"auto\"}" >/dev/null && ! test -e wj && ! test -e out3'

if tests_gpu=$("$ROOT/tests/unit/t1700-gpu-device" 2>/dev/null | grep -c '^ok .* auto -> cuda'); [ "$tests_gpu" -eq 1 ]; then
	# stats of every frame (rms, min, max) within 1e-4 of the CPU's, rel. to rms
	near() {
		tensor-ls --stats "$1" | jq -c '[.name, .shape, (.meta | del(.xxh3)), .stats.rms, .stats.min, .stats.max]' >"$1.s"
		tensor-ls --stats "$2" | jq -c '[.name, .shape, (.meta | del(.xxh3)), .stats.rms, .stats.min, .stats.max]' >"$2.s"
		jq -n --slurpfile a "$1.s" --slurpfile b "$2.s" -e '($a | length) == ($b | length) and
			([range($a | length)] | all(. as $i | $a[$i][0:3] == $b[$i][0:3] and
			 ([3, 4, 5] | all(. as $j | (($a[$i][$j] - $b[$i][$j]) | fabs) <= 1e-4 * ($b[$i][3] + 1e-30)))))' >/dev/null
	}
	check "hessian-capture --device cuda" sh -c 'hessian-capture -q --model tiny --text t.txt --rows 2 --cols 16 --device cuda -o hg.fr'
	check "Hessians on cuda = cpu up to rounding" near hg.fr hc.fr
	check "hessian-capture --device cuda --f64 (sums on the cpu)" sh -c \
		'hessian-capture -q --model tiny --text t.txt --rows 2 --cols 16 --device cuda --f64 -o hg64.fr &&
		 hessian-capture -q --model tiny --text t.txt --rows 2 --cols 16 --f64 -o hc64.fr'
	check "F64 Hessians on cuda = cpu up to rounding" near hg64.fr hc64.fr
	check "activations on cuda = cpu up to rounding" sh -c \
		'tensor-gen -s 3 x=50x24 | hessian-capture --activations --device cuda > ag.fr' && check "same" near ag.fr ac.fr
	check "model-eval --device cuda" sh -c 'model-eval -q --model tiny --text t.txt --cols 16 --device cuda > eg.json'
	check "perplexity on cuda = cpu up to rounding" jqe -n --slurpfile a eg.json --slurpfile b ec.json \
		'(($a[0].nll - $b[0].nll) | fabs) < 1e-4 and $a[0].positions == $b[0].positions'
	check "model-eval --generate on cuda" sh -c 'model-eval --model tiny --generate 4 --ids --device cuda > gg.txt &&
		model-eval --model tiny --generate 4 --ids > gc.txt'
	check "had-rotate --device cuda" sh -c 'had-rotate --hessian h.fr --device cuda < w.fr > rg.fr'
	check "rotation on cuda = cpu up to rounding" near rg.fr rc.fr
else
	for p in hessian-capture model-eval; do
		check_fail "$p --device cuda without a device exits 1" 1 "^$p: --device cuda: .*CUDA" \
			$p --device cuda --model tiny --text t.txt --cols 16
	done
	check_fail "had-rotate --device cuda without a device exits 1" 1 "^had-rotate: --device cuda: .*CUDA" \
		had-rotate --device cuda --hessian h.fr <w.fr
	check_fail "hessian-capture --activations --device cuda exits 1" 1 "--device cuda: .*CUDA" \
		hessian-capture --activations --device cuda x.fr
	check "hessian-capture --device auto: the cpu's bytes" sh -c \
		'hessian-capture --model tiny --text t.txt --rows 2 --cols 16 --device auto -o ha.fr 2>ha.err && cmp h0.fr ha.fr'
	check "auto says it runs on the cpu" grep -q "^hessian-capture: --device auto: .*; running on the CPU" ha.err
	check "-q silences it" sh -c 'hessian-capture -q --model tiny --text t.txt --rows 2 --cols 16 --device auto -o hq.fr 2>hq.err &&
		! test -s hq.err'
	check "model-eval --device auto: the cpu's numbers" sh -c \
		'model-eval -q --model tiny --text t.txt --cols 16 --device auto > ea.json && cmp e0.json ea.json'
	check "had-rotate --device auto: the cpu's bytes" sh -c \
		'had-rotate -q --hessian h.fr --device auto < w.fr > ra.fr && cmp r0.fr ra.fr'
	check_fail "convert --device cuda fails before any work" 1 "^convert: --device cuda: .*CUDA" \
		"$ROOT/pipelines/convert" tiny outc --bits 2 -q --device cuda --work wc
	check "... and wrote no output" test ! -e outc
	check_fail "validate --device cuda fails before the checks" 1 "^validate: --device cuda: .*CUDA" \
		"$ROOT/pipelines/validate" tiny --model tiny --no-check --device cuda
	skip "cuda results against the cpu: no CUDA device"
fi
done_testing
