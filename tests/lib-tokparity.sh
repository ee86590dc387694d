# tests/lib-tokparity.sh: the tokenizer parity tests' reference (the Hugging
# Face `tokenizers` Node binding in tests/npm, installed by
# tests/npm/install.sh; the tests skip without it), their inputs (tricky
# strings, blank-line paragraphs, slices of the corpora) and comparisons.
# Sourced after tests/lib.sh.
NPM=$ROOT/tests/npm
LM=$NPM/node_modules/@lenml
if ! command -v node >/dev/null || [ ! -d "$NPM/node_modules/tokenizers" ]; then
	skip "reference tokenizers not installed (run tests/npm/install.sh)"
	done_testing
fi
command -v jq >/dev/null || { skip "jq missing"; done_testing; }

ref() { node "$NPM/ref.js" "$@"; }

# inputs
printf '%b\n' 'Hello world' '  leading spaces and trailing   ' 'tabs\tand\t\tmore\ttabs' \
 'digits 1234567 3.14159 1,000,000 ١٢٣ ½' 'emoji 😀👍🏽 👨‍👩‍👧 🇩🇪' \
 'mixed Ünïcödé Ελληνικά русский עברית العربية हिन्दी' 'CJK 日本語のテキスト 中文字符 한국어 텍스트' \
 'combining: e\xcc\x81 a\xcc\x8a \xe1\x84\x80\xe1\x85\xa1 Å Å ﬁ ℃ Ⅻ' \
 "contractions: I'M you'LL it'S we'Ve ſ'ſ don't" \
 'special <s> tokens </s> and <|endoftext|> <|im_start|>user<|im_end|> <|begin_of_text|> <unk>' \
 'invalid \xff\xfe bytes \xe2\x82 cut \xc3 end \xed\xa0\x80 surrogate \xf4\x90\x80\x80 big \xc0\xaf' \
 'nel:\xc2\x85: nbsp:\xc2\xa0: ideographic:\xe3\x80\x80: zwsp:\xe2\x80\x8b: ogham:\xe1\x9a\x80:' \
 'x' '▁ already ▁▁ metaspace' '<0x41> literal byte token text' '!!!???... ---___ ***' \
 'a                                        b' '\x01\x02\x1f control \x7f' 'U+FFFD \xef\xbf\xbd itself' \
 'a wörd here wördy swörd wörd' 'x wörd, (wörd) _wörd wörd_ wörd1' 'x   lst y lstrip  rst   z' \
 'nörm and not nörm, abnörm nörmal' '<s>x<s>xx <s> y' 'hello 12345 3.5e10 foo,bar. boo oo o' \
 '  strip me  ' >"$TMP/tricky.txt"
printf 'para one\nline two\n\n\npara two\twith tab\n  indented\n\n\n\n  \nlast\r\nwith crlf\n' >"$TMP/blank.txt"
if [ -f "$SHARED/data/moby-dick.txt.zst" ]; then
	{ zstd -dc "$SHARED/data/moby-dick.txt.zst" | head -c 120000; echo
	  zstd -dc "$SHARED/data/sotu.txt.zst" | head -c 200000; echo; } >"$TMP/corpus.txt"
else
	: >"$TMP/corpus.txt"
fi

# compare: NAME TOKENIZER.json FILE SPLIT
cmp_encode() {
	local name=$1 tj=$2 f=$3 sp=$4
	if ! ref encode "$tj" "$f" --split "$sp" >"$TMP/ref.ids" 2>"$TMP/ref.err"; then
		notok "$name: reference failed on $(basename "$f")"; sed 's/^/#   /' "$TMP/ref.err" | head -3; return
	fi
	tokenize -t "$tj" --split "$sp" --ids "$f" >"$TMP/my.ids" 2>"$TMP/my.err"
	if cmp -s "$TMP/ref.ids" "$TMP/my.ids"; then
		ok "$name: $(basename "$f") --split $sp: $(wc -l <"$TMP/ref.ids") documents, $(wc -w <"$TMP/ref.ids") ids identical"
	else
		notok "$name: $(basename "$f") --split $sp differs from the reference"
		diff "$TMP/ref.ids" "$TMP/my.ids" | head -4 | cut -c1-200 | sed 's/^/#   /'
		sed 's/^/#   /' "$TMP/my.err" | head -3
	fi
}
cmp_decode() {
	local name=$1 tj=$2 ids=$3; shift 3
	ref decode "$tj" "$ids" "$@" >"$TMP/ref.txt" 2>/dev/null
	tokenize -t "$tj" --decode --ids "$@" "$ids" >"$TMP/my.txt" 2>"$TMP/my.err"
	if cmp -s "$TMP/ref.txt" "$TMP/my.txt"; then ok "$name: decode $* identical"
	else notok "$name: decode $* differs"; diff "$TMP/ref.txt" "$TMP/my.txt" | head -4 | sed 's/^/#   /'; fi
}
