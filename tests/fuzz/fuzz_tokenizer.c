/* fuzz_tokenizer: libFuzzer target for the tokenizer (lib/text/). First byte even:
 * the rest is text for a fixed tokenizer that uses every component
 * (added tokens with lstrip/rstrip/single_word/normalized, NFC, Replace,
 * Split behaviours, ByteLevel, Metaspace, byte fallback, decoders): encode
 * it, decode the ids, pack rows. Odd: the rest is a tokenizer.json to load
 * (and, if it loads, to encode a fixed text with). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "x3.h"
#include "tokenizer.h"

static const char TOK[] =
	"{\"added_tokens\": ["
	"{\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": false},"
	"{\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
	"{\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false, \"lstrip\": true, \"rstrip\": true},"
	"{\"id\": 20, \"content\": \"ab\", \"special\": false, \"normalized\": true, \"single_word\": true},"
	"{\"id\": 21, \"content\": \"\\u00e9\", \"special\": false, \"normalized\": false, \"lstrip\": true}],"
	"\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
	" {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"b+\"}, \"content\": \"b\"}, {\"type\": \"Strip\"}]},"
	"\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
	" {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}| ?\\\\p{L}+|\\\\s+(?!\\\\S)\"}, \"behavior\": \"Isolated\", \"invert\": false},"
	" {\"type\": \"Split\", \"pattern\": {\"String\": \"a\"}, \"behavior\": \"MergedWithNext\", \"invert\": true},"
	" {\"type\": \"Split\", \"pattern\": {\"String\": \"c\"}, \"behavior\": \"Contiguous\", \"invert\": false},"
	" {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"first\", \"split\": true},"
	" {\"type\": \"Digits\", \"individual_digits\": true}, {\"type\": \"WhitespaceSplit\"}]},"
	"\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}},"
	" {\"SpecialToken\": {\"id\": \"</s>\"}}], \"special_tokens\": {\"<s>\": {\"ids\": [1]}, \"</s>\": {\"ids\": [2]}}},"
	"\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"add_prefix_space\": true},"
	" {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 3, \"stop\": 2},"
	" {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"x+\"}, \"content\": \"y\"}]},"
	"\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true,"
	" \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0x41>\": 3, \"<0xC3>\": 4, \"<0xA9>\": 5, \"<0xE2>\": 6,"
	" \"\\u2581\": 7, \"a\": 8, \"b\": 9, \"c\": 10, \"ab\": 20, \"\\u00e9\": 21, \"\\u2581a\": 11, \"bc\": 12, \"abc\": 13, \"\\u2581abc\": 14},"
	" \"merges\": [\"a b\", \"\\u2581 a\", \"b c\", [\"ab\", \"c\"], \"\\u2581a bc\", \"\\u2581 abc\"]}}";

static const char TOK2[] =
	"{\"added_tokens\": [{\"id\": 5, \"content\": \"<|x|>\", \"special\": true}],"
	"\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true},"
	"\"decoder\": {\"type\": \"ByteLevel\"}, \"post_processor\": {\"type\": \"ByteLevel\"},"
	"\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"a\": 0, \"b\": 1, \"\\u0120\": 2, \"\\u0120a\": 3, \"ab\": 4, \"<|x|>\": 5},"
	" \"merges\": [[\"\\u0120\", \"a\"], [\"a\", \"b\"]]}}";

static void exercise(x3_tok *t, const char *s, size_t n)
{
	int32_t *ids, *m;
	size_t k, rows;
	char *txt;
	if (x3_tok_encode(t, s, n, n & 1, &ids, &k) == X3_OK) {
		for (size_t i = 0; i < k; i++)
			if (ids[i] < 0 || (size_t)ids[i] >= x3_tok_vocab_size(t)) abort();
		if (x3_tok_decode(t, ids, k, 0, &txt, NULL) == X3_OK) free(txt);
		if (x3_tok_decode(t, ids, k, 1, &txt, NULL) == X3_OK) free(txt);
		free(ids);
	}
	/* decode arbitrary ids from the input bytes */
	int32_t raw[64];
	size_t nr = n < 64 ? n : 64;
	for (size_t i = 0; i < nr; i++) raw[i] = (unsigned char)s[i] % 24;
	if (x3_tok_decode(t, raw, nr, 0, &txt, NULL) == X3_OK) free(txt);
	struct x3_tok_pack_opts o;
	x3_tok_pack_defaults(t, &o);
	o.even_odd = n & 2;
	o.mode = n & 4 ? X3_PACK_STREAM : X3_PACK_ARTICLES;
	o.keep_partial = n & 8;
	if (x3_tok_pack_text(t, s, n, (enum x3_tok_split)(n % 3), 3, 5, &o, &m, &rows) == X3_OK) free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static x3_tok *fixed[2];
	if (!size) return 0;
	const char *s = (const char *)data + 1;
	size_t n = size - 1;
	if (!fixed[0] && (x3_tok_load_mem(TOK, sizeof TOK - 1, NULL, 0, "fuzz", &fixed[0]) ||
	                  x3_tok_load_mem(TOK2, sizeof TOK2 - 1, NULL, 0, "fuzz2", &fixed[1])))
		abort();   /* the fixed tokenizers must load */
	if (!(data[0] & 1)) {
		exercise(fixed[(data[0] >> 1) & 1], s, n);
	} else {
		x3_tok *t;
		if (x3_tok_load_mem(s, n, s, n / 2, "fuzz", &t) == X3_OK) {
			exercise(t, "ab <s> c\xC3\xA9 1234\n\nx", 19);
			x3_tok_free(t);
		}
	}
	return 0;
}
