#!/usr/bin/env bash
# tokenize: stories260K ids against golden ids made by the reference
# `tokenizers` library (tests/golden/tokenize, from tests/npm/ref.js), row
# packing (exl3(5) §10.1) checked against an awk model of the rules, frames and
# metadata, decoding, short texts, bad tokenizer files and usage errors.
. "$(dirname "$0")/lib.sh"
G=$ROOT/tests/golden/tokenize
cd "$TMP" || exit 1

# a tiny SentencePiece-style BPE tokenizer
cat >tiny.json <<'J'
{"version": "1.0", "added_tokens": [
  {"id": 0, "content": "<unk>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
  {"id": 1, "content": "<s>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
  {"id": 2, "content": "</s>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false}],
 "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
   {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
 "pre_tokenizer": null,
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
   {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
 "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
   {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
 "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": false,
   "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, "a": 4, "b": 5, "c": 6, "ab": 7, "▁ab": 8, "abc": 9, "▁abc": 10},
   "merges": ["a b", "▁ ab", "ab c", "▁ab c"]}}
J
printf 'ab abc\nabc x yz cab\n\nba\nab ab ab ab\n' >tiny.txt
check "tiny: ids with the template's BOS" test "$(tokenize -t tiny.json --ids tiny.txt | tr '\n' '|')" = \
	"1 8 10|1 10 3 0 3 0 3 6 7|1 3 5 4|1 8 8 8 8|"
check "tiny: --no-bos --eos" test "$(tokenize -t tiny.json --ids --no-bos --eos tiny.txt | head -1)" = "8 10 2"
check "tiny: decode (special <unk> skipped)" test "$(tokenize -t tiny.json --ids tiny.txt | tokenize -t tiny.json --decode --ids --skip-special | head -2 | tr '\n' '|')" = \
	"ab abc|abc   cab|"

# packing against an awk model: articles (overflow dropped) / stream, BOS/EOS, even-odd
pack_model() { # MODE(articles|stream) EVENODD ROWS COLS < "bos-ids<TAB>plain-ids<TAB>eos-ids" lines
	awk -v mode="$1" -v eo="$2" -v R="$3" -v C="$4" -F'\t' '
	{ n = split($2, ids, " "); doc = ""
	  if (r >= R) next
	  even = (r % 2 == 0); b = eo ? even : ($1 != ""); e = eo ? even : ($3 != "")
	  k = 0; if (b) seq[k++] = 1; for (i = 1; i <= n; i++) seq[k++] = ids[i]; if (e) seq[k++] = 2
	  for (i = 0; i < k && r < R; i++) { row = row (c ? " " : "") seq[i]; if (++c == C) { print row; row = ""; c = 0; r++; if (mode == "articles") break } } }'
}
# the payload of a one-frame stream on stdin as rows of COLS ids
frame_ids() {
	cat >fi.frames
	local n; n=$(od -An -t u8 -N8 fi.frames | tr -d ' ')
	tail -c +$((9 + n)) fi.frames | od -An -t d4 -v -w$((4 * $1)) | sed 's/^ *//; s/  */ /g'
}
docs=$(tokenize -t tiny.json --ids --no-bos tiny.txt)
for mode in articles stream; do
	for eo in 0 1; do
		want=$(printf '%s\n' "$docs" | sed 's/^/b\t/; s/$/\t/' | pack_model $mode $eo 3 3)
		opts="--pack $mode"; [ $eo = 1 ] && opts="$opts --even-odd"
		got=$(tokenize -t tiny.json --rows 3 --cols 3 $opts tiny.txt 2>/dev/null | frame_ids 3)
		check "pack $mode even-odd=$eo matches the model" test "$got" = "$want"
	done
done
tokenize -t tiny.json --rows 2 --cols 4 --eos tiny.txt >f.frames
check "frame: I32 2x4 named tokens" test "$(tensor-ls f.frames | jq -c '[.name, .dtype, .shape]')" = '["tokens","I32",[2,4]]'
check "frame: metadata" test "$(tensor-ls f.frames | jq -r '.meta | [.rows, .cols, .source, .split, .pack, .special, .bos_id, .eos_id] | join(",")')" = \
	"2,4,tiny.txt,lines,articles,bos,eos,1,2"
check "frame: tokenizer in metadata" test "$(tensor-ls f.frames | jq -r .meta.tokenizer)" = tiny.json
check "decode frames: one line per row" test "$(tokenize -t tiny.json --decode f.frames | wc -l)" -eq 2
check_fail "short text: --strict fails" 1 "fills only [0-9]+ of 50 rows" tokenize -t tiny.json --rows 50 --cols 4 --strict tiny.txt
check "short text: -q silences it" sh -c 'test -z "$(tokenize -q -t tiny.json --rows 50 --cols 4 tiny.txt 2>&1 >/dev/null)"'
check_fail "short text: warns" 0 "fills only [0-9]+ of 50 rows" sh -c 'tokenize -t tiny.json --rows 50 --cols 4 tiny.txt > s.frames'
check "short text: writes what there is" test "$(tensor-ls s.frames | jq -c '.shape[0] < 50 and .shape[0] > 0')" = true
check "--keep-partial pads the last row" test "$(tokenize -t tiny.json --cols 100 --pack stream --keep-partial --pad 2 tiny.txt | tensor-ls | jq -c .shape)" = '[1,100]'
check_fail "no complete row" 1 "fills no row of 100 tokens" tokenize -t tiny.json --cols 100 tiny.txt
check "zstd output reads back" test "$(tokenize -t tiny.json --cols 3 -z 3 tiny.txt | tokenize -t tiny.json --decode | wc -l)" -ge 1
printf 'ab\nab\n' | tokenize -t tiny.json --cols 2 --split whole >w.frames
check "stdin, --split whole" test "$(tensor-ls w.frames | jq -r .meta.source)" = stdin

# bad tokenizer files: exit 1 with a message naming the problem
head -c 700 tiny.json >trunc.json
check_fail "truncated tokenizer.json" 1 "trunc.json: invalid JSON" tokenize -t trunc.json --ids tiny.txt
jq '.model.type = "Unigram"' tiny.json >uni.json
check_fail "Unigram model" 1 "model type 'Unigram' not supported" tokenize -t uni.json --ids tiny.txt
jq '.model = {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "a"}' tiny.json >wp.json
check_fail "WordPiece model" 1 "model type 'WordPiece' not supported" tokenize -t wp.json --ids tiny.txt
jq '.normalizer = {"type": "Lowercase"}' tiny.json >lc.json
check_fail "unsupported normalizer" 1 "normalizer 'Lowercase' not supported" tokenize -t lc.json --ids tiny.txt
jq '.pre_tokenizer = {"type": "BertPreTokenizer"}' tiny.json >bp.json
check_fail "unsupported pre-tokenizer" 1 "pre_tokenizer 'BertPreTokenizer' not supported" tokenize -t bp.json --ids tiny.txt
jq '.decoder = {"type": "WordPiece", "prefix": "##"}' tiny.json >wd.json
check_fail "unsupported decoder" 1 "decoder 'WordPiece' not supported" tokenize -t wd.json --ids tiny.txt
jq '.model.merges += ["b q"]' tiny.json >mq.json
check_fail "merge with an unknown token" 1 "merge 4 'b' \\+ 'q': token not in the vocabulary" tokenize -t mq.json --ids tiny.txt
jq '.added_tokens += [{"id": 4, "content": "zz", "special": false}]' tiny.json >ad.json
check_fail "added token on a vocabulary id" 1 "added token 'zz' has id 4, but the vocabulary uses that id" tokenize -t ad.json --ids tiny.txt
jq '.added_tokens += [{"id": 11, "content": "abc", "special": false}]' tiny.json >ad2.json
check_fail "added token with another id than the vocabulary's" 1 "added token 'abc' has id 11, but the vocabulary gives it 9" tokenize -t ad2.json --ids tiny.txt
jq '.model.dropout = 0.1' tiny.json >dr.json
check_fail "BPE dropout" 1 "dropout 0.1 not supported" tokenize -t dr.json --ids tiny.txt
jq '.pre_tokenizer = {"type": "Split", "pattern": {"Regex": "(?<=a+)b"}, "behavior": "Isolated", "invert": false}' tiny.json >re.json
check_fail "regex PCRE2 cannot compile" 1 "pre_tokenizer Split: regex" tokenize -t re.json --ids tiny.txt
check_fail "missing tokenizer" 1 "nonexistent.json" tokenize -t nonexistent.json --ids tiny.txt
check_fail "decode: id out of range" 1 "token id 99 is not in the vocabulary" sh -c 'echo "1 99" | tokenize -t tiny.json --decode --ids'
check_fail "decode: not an id" 1 "line 1: bad token id" sh -c 'echo "1 x" | tokenize -t tiny.json --decode --ids'
check_fail "decode: the bad id quoted alone, not the rest of the line" 1 "line 1: bad token id '2x'\$" \
	sh -c 'echo "1 2x 3" | tokenize -t tiny.json --decode --ids'
check_fail "no -t" 2 "no tokenizer" tokenize --ids tiny.txt
check_fail "bad --split" 2 "--split: want whole, lines or blank" tokenize -t tiny.json --split para --ids tiny.txt
check_fail "--even-odd with --bos" 2 "--even-odd decides" tokenize -t tiny.json --even-odd --bos tiny.txt
check_fail "bad --rows" 2 "rows" tokenize -t tiny.json --rows 0 tiny.txt
check "-h prints usage" sh -c 'tokenize -h | grep -q "^usage: tokenize"'

# stories260K: the reference's ids (golden, made by tests/npm/ref.js)
if have_shared; then
	M=$SHARED/models/stories260K
	check "stories260K: ids = reference (with BOS)" cmp -s "$G/stories260K.ids" <(tokenize -t "$M" --ids "$G/stories260K.txt")
	check "stories260K: ids = reference (no special)" cmp -s "$G/stories260K.plain.ids" <(tokenize -t "$M" --ids --no-bos "$G/stories260K.txt")
	check "stories260K: decode = reference" cmp -s "$G/stories260K.decoded" <(tokenize -t "$M" --decode --ids --skip-special "$G/stories260K.ids")
	check "stories260K: 'Once upon a time'" test "$(echo 'Once upon a time' | tokenize -t "$M" --ids)" = "$(head -1 "$G/stories260K.ids")"
	zstd -dc "$SHARED/data/moby-dick.txt.zst" | head -c 60000 >moby.txt
	tokenize -t "$M" --rows 4 --cols 256 --even-odd moby.txt >m.frames
	check "stories260K: 4x256 rows from Moby Dick" test "$(tensor-ls m.frames | jq -c .shape)" = '[4,256]'
	check "stories260K: even rows start with BOS, odd rows do not" test \
		"$(frame_ids 256 <m.frames | awk '{ printf "%s%s", (NR > 1 ? "," : ""), (NR % 2 ? $1 : (/(^| )1( |$)/ ? "bos" : "none")) }')" = "1,none,1,none"
	check "stories260K: frames decode back to the text's words" sh -c "tokenize -t '$M' --decode m.frames | head -1 | grep -q 'Call me Ishmael\\|CHAPTER\\|Loomings'"
else
	skip "stories260K (no ../shared)"
fi
done_testing
