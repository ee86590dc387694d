#!/usr/bin/env bash
# t1212-quant-oom: an allocation that fails inside the quantizer is an
# error, not a quiet change of the result: with the out_scales decision's
# buffer (had-rotate --out-scales auto) or the scale search's sample
# ranking (trellis-encode) failing (tests/shim/failalloc.c fails the
# allocations of one size), the program exits 1 with a message that names
# the weight and says out of memory; with another size it writes what it
# writes without the shim.
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
# the shim replaces malloc, which AddressSanitizer replaces too
[ -z "${X3_CHECK_ASAN:-}" ] || { skip "the allocation shim: not on the check-asan build"; done_testing; }
command -v cc >/dev/null || { skip "the allocation shim (no cc)"; done_testing; }
cc -shared -fPIC -o failalloc.so "$ROOT/tests/shim/failalloc.c" || { notok "build the shim"; done_testing; }
# failing BYTES CMD...: CMD with the allocations of BYTES bytes failing
failing() { local n=$1; shift; FAILALLOC_SIZE=$n FAILALLOC_LOG=$TMP/fail.log LD_PRELOAD=$TMP/failalloc.so "$@"; }

# a 384x640 weight: k = 640 inputs, n = 384 outputs (no padding), sizes
# that nothing else of these runs allocates
tensor-gen -s 1 --scale 0.02 m.weight=384x640 > w.fr
tensor-gen -s 2 -d spd --meta count=1 m.hessian=640x640 > h.fr
had-rotate --seed 5 --hessian h.fr --out-scales auto < w.fr > r.fr

# x3_out_scales_auto: k doubles
rm -f fail.log
check_fail "had-rotate --out-scales auto, the decision's buffer failing: exit 1 naming the weight" 1 \
	"weight 'm\.weight'.*out of memory" failing $((640 * 8)) had-rotate --seed 5 --hessian h.fr --out-scales auto < w.fr
check "  (the shim failed that allocation)" test -s fail.log
check "had-rotate with another size failing: the same bytes" \
	sh -c "FAILALLOC_SIZE=12345 LD_PRELOAD=$TMP/failalloc.so had-rotate --seed 5 --hessian h.fr --out-scales auto < w.fr | cmp -s - r.fr"

# x3_scale_sample's ranking: one 16-byte entry per 16x16 tile
rm -f fail.log
check_fail "trellis-encode, the scale sample's ranking failing: exit 1 naming the weight" 1 \
	"'m'.*out of memory" failing $((40 * 24 * 16)) trellis-encode -K 3 -t 2 < r.fr
check "  (the shim failed that allocation)" test -s fail.log
done_testing
