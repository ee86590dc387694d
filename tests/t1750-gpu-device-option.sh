#!/usr/bin/env bash
# t1750-gpu-device-option: --device of trellis-encode and exl3-matmul.
# Everywhere: bad values exit 2, auto works, cuda without a device exits 1
# naming the reason. With a CUDA device: trellis-encode output is
# byte-identical on cpu and cuda apart from the "seconds" metadata (the
# GPU Viterbi is bit-identical), and
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
# byte comparison apart from the "seconds" metadata
same() { tensor-cat --meta seconds=0 --meta timing=0 "$1" > "$1.n" && tensor-cat --meta seconds=0 --meta timing=0 "$2" > "$2.n" &&
	cmp "$1.n" "$2.n"; }
check "auto gives the same bytes as cpu" same qc.fr qa.fr
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
