#!/usr/bin/env bash
# Sequential calibration through the real encoder on stories260K: Hessians of
# layer 0, layer 0 quantized by had-rotate | trellis-encode (3 bits), then the
# Hessians of layer 1 captured on top of the quantized layer 0
# (hessian-capture --quantized). Skips without the quantizer programs.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
if ! have_shared; then skip "stories260K not available"; done_testing; fi
if ! command -v had-rotate >/dev/null || ! command -v trellis-encode >/dev/null; then
	skip "had-rotate / trellis-encode not built"; done_testing
fi
S=$SHARED/models/stories260K
zstd -dc "$SHARED/data/sotu.txt.zst" | head -n 60 >cal.txt
hessian-capture -q --model "$S" --text cal.txt --rows 16 --cols 128 --layers 0 >h0
check "layer 0: 4 Hessians" test "$(tensor-ls h0 | wc -l)" -eq 4
: >q0.frames
tensor-ls h0 | jq -r '"\(.name) \(.meta.members)"' | while read -r name members; do
	tensor-cat h0 "$name" >hh
	for m in ${members//,/ }; do
		tensor-cat "$S" "$m" | had-rotate --seed 0 --hessian hh | trellis-encode -K 3 -q >>q0.frames
	done
done
check "7 quantized linears" test "$(tensor-ls q0.frames | jq -r 'select(.name | endswith(".trellis")) | .name' | wc -l)" -eq 7
mkdir q0 && tensor-cat -q q0.frames -o q0/model.safetensors
hessian-capture -q --model "$S" --text cal.txt --rows 16 --cols 128 --layers 1-1 --quantized q0 >h1q
hessian-capture -q --model "$S" --text cal.txt --rows 16 --cols 128 --layers 1-1 >h1
check "layer 1 on quantized layer 0: 4 Hessians, same counts" \
	test "$(tensor-ls h1q | jq -r .meta.count | sort -u)" = 2048
# the quantized layer 0 moves layer 1's input statistics a little, not much
rel=$(paste <(tensor-ls --stats h1 | jq .stats.rms) <(tensor-ls --stats h1q | jq .stats.rms) |
	awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d } END { print m + 0 }')
check "sequential Hessians differ from the original's ($rel)" awk -v r="$rel" 'BEGIN { exit !(r > 0) }'
check "... by less than 20% in RMS ($rel)" awk -v r="$rel" 'BEGIN { exit !(r < 0.2) }'
done_testing
