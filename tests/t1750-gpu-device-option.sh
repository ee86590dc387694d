#!/usr/bin/env bash
# t1750-gpu-device-option: --device of trellis-encode and exl3-matmul.
# Everywhere: bad values exit 2, auto works, cuda without a device exits 1
# naming the reason. With a CUDA device: trellis-encode output is
# byte-identical on cpu and cuda apart from the "seconds" metadata (the
# GPU Viterbi is bit-identical), --gpu-ldlq (the whole LDLQ on the device)
# gives the CPU's frames and scale and a proxy error within 5%, and
# exl3-matmul on cuda writes the same frames (names, shapes) as on cpu.
# On cusim, the CPU emulator (t1706), trellis-encode runs with the device
# hidden (minutes of emulated Viterbi otherwise).
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
tensor-gen -s 1 --scale 0.02 m.weight=48x200 > w.fr
tensor-gen -s 2 -d spd --meta count=1 m.hessian=200x200 > h.fr
had-rotate --seed 5 --hessian h.fr < w.fr > r.fr
check_fail "trellis-encode --device xpu exits 2" 2 "--device: 'xpu'" \
	trellis-encode -K 2 --device xpu < r.fr
check_fail "exl3-matmul --device xpu exits 2" 2 "--device: 'xpu'" exl3-matmul --device xpu
check_fail "exl3-matmul --reference --device cuda exits 2" 2 "excludes --device" \
	exl3-matmul --reference --device cuda
check "trellis-encode --device cpu" sh -c 'trellis-encode -K 2 --device cpu < r.fr > qc.fr'
"$ROOT/tests/unit/t1700-gpu-device" >t1700.out 2>/dev/null
gpu=$(grep -c '^ok .* auto -> cuda' t1700.out)
emulated=$(grep -c '^ok .* describe: .*emulated' t1700.out)
# on cusim, the CPU emulator, the Viterbi takes minutes: there
# trellis-encode runs with the device hidden (X3SIM_NODEVICE=1), which
# checks the no-device path of a CUDA build instead
nodev=""
[ "$emulated" -eq 1 ] && nodev="X3SIM_NODEVICE=1"
check "trellis-encode --device auto" sh -c "$nodev trellis-encode -K 2 --device auto < r.fr > qa.fr"
check_fail "--gpu-ldlq without --device cuda or auto exits 2" 2 "needs --device cuda or auto" \
	trellis-encode -K 2 --gpu-ldlq < r.fr
check "--gpu-ldlq --device auto" sh -c "$nodev trellis-encode -K 2 --gpu-ldlq --device auto < r.fr > ql.fr"
# byte comparison apart from the "seconds" metadata
same() { tensor-cat --meta seconds=0 --meta timing=0 "$1" > "$1.n" && tensor-cat --meta seconds=0 --meta timing=0 "$2" > "$2.n" &&
	cmp "$1.n" "$2.n"; }
check "auto gives the same bytes as cpu" same qc.fr qa.fr
[ "$gpu" -eq 1 ] && [ -z "$nodev" ] || check "--gpu-ldlq falling back to the cpu: the same bytes" same qc.fr ql.fr
# --gpu-ldlq on a device: a 16x128 weight (padded to 128x128: 64 tiles, 56
# of them zero; about 30 s on cusim) at a fixed scale: the frames of the
# CPU's, the same scale, the proxy error within 5% (the feedback rounds
# otherwise, so codes may differ), every tile through the device's LDLQ
# (the CPU's counts each distinct tile once)
tensor-gen -s 3 --scale 0.02 s.weight=16x128 > ws.fr
tensor-gen -s 4 -d spd --meta count=1 s.hessian=128x128 > hs.fr
had-rotate --seed 6 --hessian hs.fr < ws.fr > rs.fr
tensor-gen -d uniform -t I16 --scale 32768 -s 1 L.trellis=16x24x48 > g.fr
tensor-gen -t F16 -s 2 --scale 0.05 L.suh=256 L.svh=384 >> g.fr
tensor-gen -d constant -t I32 --value -2082680531 L.mul1= >> g.fr
tensor-gen -t F32 -s 4 x=5x256 > x.fr
check "exl3-matmul --device cpu" sh -c 'exl3-matmul --device cpu -x x.fr < g.fr > yc.fr'
check "exl3-matmul --device auto" sh -c 'exl3-matmul --device auto -x x.fr < g.fr > ya.fr'
if [ "$gpu" -eq 1 ]; then
	if [ "$emulated" -eq 0 ]; then
		check "trellis-encode --device cuda" sh -c 'trellis-encode -K 2 --device cuda < r.fr > qg.fr'
		check "cuda gives the same bytes as cpu" same qc.fr qg.fr
		check "trellis-encode --measure on cuda equals cpu" sh -c \
			'trellis-encode --measure 1,3 --device cuda < r.fr | jq -c "del(.seconds, .timing)" > mg.json &&
			 trellis-encode --measure 1,3 < r.fr | jq -c "del(.seconds, .timing)" > mc.json && cmp mc.json mg.json'
	else
		check_fail "CUDA build without a device: trellis-encode --device cuda exits 1" 1 "CUDA" \
			env X3SIM_NODEVICE=1 trellis-encode -K 2 --device cuda < r.fr
		skip "trellis-encode --device cuda byte-identical: emulated device (minutes on cusim)"
	fi
	check "trellis-encode --gpu-ldlq --device cuda" sh -c \
		'trellis-encode -K 3 --g-scale 0.8 --json < rs.fr 2> sc.json > sc.fr &&
		 trellis-encode -K 3 --g-scale 0.8 --json --gpu-ldlq --device cuda < rs.fr 2> sg.json > sg.fr'
	check "--gpu-ldlq: the CPU's frames and scale, proxy error within 5%" sh -c \
		'test "$(tensor-ls sg.fr | jq -c "[.name, .shape, .dtype]")" = "$(tensor-ls sc.fr | jq -c "[.name, .shape, .dtype]")" &&
		 jq -e -n --slurpfile c sc.json --slurpfile g sg.json \
		   "\$c[0].g_scale == \$g[0].g_scale and \$c[0].proxy_err > 0 and
		    ((\$g[0].proxy_err - \$c[0].proxy_err) | fabs) <= 0.05 * \$c[0].proxy_err and \$g[0].ldlq_tiles == 64" >/dev/null'
	check "exl3-matmul --device cuda" sh -c 'exl3-matmul --device cuda -x x.fr < g.fr > yg.fr'
	check "same frames as on the cpu" sh -c \
		'test "$(tensor-ls yg.fr | jq -c "[.name, .shape]")" = "$(tensor-ls yc.fr | jq -c "[.name, .shape]")"'
else
	check_fail "trellis-encode --device cuda without a device exits 1" 1 "CUDA" \
		trellis-encode -K 2 --device cuda < r.fr
	check_fail "exl3-matmul --device cuda without a device exits 1" 1 "CUDA" \
		exl3-matmul --device cuda -x x.fr < g.fr
	skip "byte-identical trellis-encode on cuda: no CUDA device"
fi
done_testing
