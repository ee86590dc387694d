# tests/bench/lib-layer.sh: the real-width decoder layer of layer.sh (CPU)
# and gpu-layer.sh (GPU), sourced by both after root is set.
# The layer: an 8B Llama's unless the environment says otherwise
#   BENCH_LAYER_HIDDEN/INTER/HEADS/KV  (4096, 14336, 32, 8)
#   BENCH_LAYER_ROWS/COLS             calibration (64, 2048)
#   BENCH_BITS                        rate (4)
# layer_model DIR: the one-layer model (examples/make-tiny-llama, a 258-token
# vocabulary, so the embedding and head are negligible), its context long
# enough for the calibration; sets weights (the layer's linears' count).
export PATH="$root/bin:$root/pipelines:$PATH" LC_ALL=C
H=${BENCH_LAYER_HIDDEN:-4096} I=${BENCH_LAYER_INTER:-14336}
NH=${BENCH_LAYER_HEADS:-32} NKV=${BENCH_LAYER_KV:-8}
R=${BENCH_LAYER_ROWS:-64} C=${BENCH_LAYER_COLS:-2048} B=${BENCH_BITS:-4}
layer_model() {
	"$root/examples/make-tiny-llama" --heads "$NH" --kv-heads "$NKV" "$1" 1 "$H" "$I" >/dev/null
	# the calibration length is a property of the run, not of the weights
	jq --argjson c "$C" '.max_position_embeddings = ([.max_position_embeddings, $c] | max)' \
		"$1/config.json" >"$1/config.json.tmp" && mv "$1/config.json.tmp" "$1/config.json"
	weights=$(tensor-ls --linears "$1" | jq -s 'map(select(.layer == 0) | .shape[0] * .shape[1]) | add')
}
# viterbi_core: the Viterbi alone at K=B, best path, weights per CPU-second
# per core (tests/bench/viterbi), the baseline of the layer's rate
viterbi_core() {
	"$root/tests/bench/viterbi" -K "$B" -R -r 3 | grep '^{' | tail -1 | jq -r --arg k "$B" '.K[$k].wps_core'
}
