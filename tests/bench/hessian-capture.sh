#!/usr/bin/env bash
# hessian-capture throughput: tokens/s and GFLOP/s (forward + SYRK) on
# stories260K (if ../shared is there) and on a synthetic Llama (hidden 1024,
# intermediate 2816, 4 layers, 16/8 heads), next to OpenBLAS sgemm's
# GFLOP/s measured in the same run. Prints a table and one JSON line per model.
# BENCH_ROWS / BENCH_COLS scale the synthetic run (default 4 x 512 tokens).
set -u
ROOT=${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
PATH="$ROOT/bin:$PATH"
SHARED=${X3_SHARED:-$ROOT/../shared}
. "$ROOT/tests/synth-model.sh"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/x3bench.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
rows=${BENCH_ROWS:-4} cols=${BENCH_COLS:-512}

# flops per token of the capture forward (no head GEMM: only its Hessian)
flops_per_token() {  # config.json cols
	jq --argjson c "$2" '
		.hidden_size as $h | .intermediate_size as $i | .num_attention_heads as $nq |
		(.num_key_value_heads // $nq) as $nkv | (.head_dim // ($h / $nq)) as $hd |
		($nq * $hd) as $qd | ($nkv * $hd) as $kvd |
		(2 * ($h * $qd + 2 * $h * $kvd + $qd * $h + 3 * $h * $i)) as $lin |
		(2 * ($c + 1) * $hd * $nq) as $att |
		($h * ($h + 1) + $qd * ($qd + 1) + $h * ($h + 1) + $i * ($i + 1)) as $syrk |
		.num_hidden_layers * ($lin + $att + $syrk) + $h * ($h + 1)' "$1"
}

run() {  # label model-dir rows cols token-file
	local label=$1 dir=$2 r=$3 c=$4 tok=$5 t0 t1
	t0=$(date +%s.%N)
	hessian-capture -q --model "$dir" --tokens "$tok" --rows "$r" --cols "$c" >"$TMP/h" || return 1
	t1=$(date +%s.%N)
	local fpt h
	fpt=$(flops_per_token "$dir/config.json" "$c")
	h=$(jq .hidden_size "$dir/config.json")
	# the reference GEMM: one chunk of tokens times a hidden x hidden weight
	local m=$(( r * c < 4096 ? r * c : 4096 ))
	local sg core
	sg=$("$ROOT/tests/bench/sgemm-gflops" "$m" "$h" "$h" 0.5 | grep '^{')
	core=$(jq -r .openblas_core <<<"$sg")
	sg=$(jq -r .gflops <<<"$sg")
	awk -v l="$label" -v t0="$t0" -v t1="$t1" -v n=$((r * c)) -v f="$fpt" -v sg="$sg" -v r="$r" -v c="$c" -v core="$core" 'BEGIN {
		s = t1 - t0; tps = n / s; gf = f * n / s / 1e9
		printf "%-28s %6d tokens %8.2f s %10.0f tokens/s %8.2f GFLOP/s (sgemm %.1f, %s)\n", l, n, s, tps, gf, sg, core
		printf "{\"bench\": \"hessian-capture\", \"model\": \"%s\", \"rows\": %d, \"cols\": %d, \"seconds\": %.3f, \"tokens_per_s\": %.1f, \"flops_per_token\": %.0f, \"gflops\": %.3f, \"sgemm_gflops\": %.2f, \"openblas_core\": \"%s\"}\n", l, r, c, s, tps, f, gf, sg, core
	}'
}

printf '%-28s %13s %10s %19s %s\n' model tokens time throughput "achieved (OpenBLAS sgemm)"
if [ -f "$SHARED/models/stories260K/model.safetensors" ]; then
	synth_tokens "$TMP/tok0" 16 256 512 1
	run stories260K "$SHARED/models/stories260K" 16 256 "$TMP/tok0" || echo "stories260K run failed"
fi
synth_model "$TMP/m" 1024 2816 4 16 8 1024 1 || exit 1
synth_tokens "$TMP/tok1" "$rows" "$cols" 1024 1
run "synthetic-llama-1024x4" "$TMP/m" "$rows" "$cols" "$TMP/tok1" || exit 1
