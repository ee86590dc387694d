/* t1400-tokenizer: the library API of lib/text/tokenizer.h on a small
 * SentencePiece-style tokenizer built here (byte fallback, unk, merges,
 * special tokens, tokenizer_config), document splitting, row packing
 * (exl3(5) §10.1), canonical normalization (lib/text/unicode.h), and errors. */
#include <stdint.h>
#include "test.h"
#include "tokenizer.h"
#include "unicode.h"

/* vocab: <unk> <s> </s>, <0x00>..<0xFF> (3..258), then pieces */
static const char *pieces[] = { "\xE2\x96\x81", "a", "b", "c", "ab", "\xE2\x96\x81" "ab", "abc",
                                "\xE2\x96\x81" "abc", "\xC3\xA9" };
enum { META = 259, A, B, C, AB, MAB, ABC, MABC, EACUTE };

static char *build_json(const char *model_type)
{
	static char buf[65536];
	size_t n = 0;
	n += (size_t)snprintf(buf + n, sizeof buf - n,
		"{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": false},"
		"{\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
		"{\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false}],"
		"\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"},"
		"{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xE2\x96\x81\"}]},"
		"\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}},"
		"{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1]}}},"
		"\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\xE2\x96\x81\"},"
		"\"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
		"\"model\": {\"type\": \"%s\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true,"
		"\"merges\": [\"a b\", \"\xE2\x96\x81 ab\", \"ab c\", [\"\xE2\x96\x81" "ab\", \"c\"]], \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2",
		model_type);
	for (int b = 0; b < 256; b++) n += (size_t)snprintf(buf + n, sizeof buf - n, ", \"<0x%02X>\": %d", b, 3 + b);
	for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++)
		n += (size_t)snprintf(buf + n, sizeof buf - n, ", \"%s\": %zu", pieces[i], META + i);
	snprintf(buf + n, sizeof buf - n, "}}}");
	return buf;
}

static int same(const int32_t *a, size_t n, const int32_t *b, size_t m)
{
	return n == m && !memcmp(a, b, n * sizeof *a);
}

static void enc(x3_tok *t, const char *s, int special, int32_t **ids, size_t *n)
{
	if (x3_tok_encode(t, s, strlen(s), special, ids, n)) { *ids = NULL; *n = 0; }
}

int main(void)
{
	x3_tok *t;
	const char *js = build_json("BPE");
	CHECK_OK(x3_tok_load_mem(js, strlen(js), NULL, 0, "tiny", &t), "load a tokenizer.json from memory");
	if (!t) TEST_DONE();
	CHECK(x3_tok_vocab_size(t) == EACUTE + 1, "vocab size %zu", x3_tok_vocab_size(t));
	CHECK(x3_tok_bos(t) == 1 && x3_tok_eos(t) == 2, "BOS 1 (template), EOS 2 (</s>)");
	CHECK(x3_tok_id(t, "abc") == ABC && !strcmp(x3_tok_piece(t, B), "b") && x3_tok_piece(t, 9999) == NULL,
	      "piece <-> id");

	int32_t *ids;
	size_t n;
	enc(t, "abc ab", 1, &ids, &n);
	CHECK(same(ids, n, (int32_t[]){ 1, MABC, MAB }, 3), "'abc ab' -> <s> ▁abc ▁ab (merges, template)");
	free(ids);
	enc(t, "abc ab", 0, &ids, &n);
	CHECK(same(ids, n, (int32_t[]){ MABC, MAB }, 2), "no special tokens");
	free(ids);
	enc(t, "cab", 0, &ids, &n);
	CHECK(same(ids, n, (int32_t[]){ META, C, AB }, 3), "'cab': merges only where ranked");
	free(ids);
	enc(t, "\xC3\xA9z\xF0\x9F\x98\x80", 0, &ids, &n);
	CHECK(same(ids, n, (int32_t[]){ META, EACUTE, 3 + 'z', 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80 }, 7),
	      "byte fallback for characters not in the vocabulary");
	char *txt;
	size_t len;
	CHECK_OK(x3_tok_decode(t, ids, n, 0, &txt, &len), "decode");
	CHECK(txt && !strcmp(txt, "\xC3\xA9z\xF0\x9F\x98\x80") && len == 7, "decode restores the text");
	free(txt);
	free(ids);
	enc(t, "a\xFF" "b\xE2\x82", 0, &ids, &n);
	CHECK(same(ids, n, (int32_t[]){ META, A, 3 + 0xEF, 3 + 0xBF, 3 + 0xBD, B, 3 + 0xEF, 3 + 0xBF, 3 + 0xBD }, 9),
	      "invalid UTF-8: each maximal invalid sequence becomes U+FFFD");
	free(ids);
	int32_t bad[] = { 3 + 0xC3, A };
	CHECK_OK(x3_tok_decode(t, bad, 2, 0, &txt, &len), "decode a stray byte token");
	CHECK(!strcmp(txt, "\xEF\xBF\xBD" "a"), "invalid byte tokens decode to U+FFFD");
	free(txt);
	enc(t, "ab<s>ab</s>", 1, &ids, &n);
	CHECK(same(ids, n, (int32_t[]){ 1, MAB, 1, MAB, 2 }, 5), "special tokens in the text split it first");
	CHECK_OK(x3_tok_decode(t, ids, n, 1, &txt, &len), "decode, skipping special tokens");
	CHECK(!strcmp(txt, "ab ab"), "skip_special: '%s'", txt);
	free(txt);
	free(ids);
	int32_t oob = 5000;
	int rc = x3_tok_decode(t, &oob, 1, 0, &txt, &len);
	CHECK(rc == X3_EINVAL, "an id outside the vocabulary is X3_EINVAL");
	enc(t, "", 1, &ids, &n);
	CHECK(ids && n == 1 && ids[0] == 1, "empty text: just the template");
	free(ids);

	/* documents */
	const char *text = "ab\n\n  \nabc ab\r\nc\n\n\nab ab\nabc";
	size_t *off, *lens, nd;
	CHECK_OK(x3_tok_split_docs(text, strlen(text), X3_SPLIT_LINES, &off, &lens, &nd), "split lines");
	CHECK(nd == 5 && lens[1] == 6 && !memcmp(text + off[1], "abc ab", 6) && !memcmp(text + off[4], "abc", 3),
	      "lines: 5 documents, blank lines skipped, CR dropped");
	free(off); free(lens);
	CHECK_OK(x3_tok_split_docs(text, strlen(text), X3_SPLIT_BLANK, &off, &lens, &nd), "split blank");
	CHECK(nd == 3 && lens[1] == 9 && !memcmp(text + off[1], "abc ab\r\nc", 9), "blank: 3 paragraphs");
	free(off); free(lens);
	CHECK_OK(x3_tok_split_docs(text, strlen(text), X3_SPLIT_WHOLE, &off, &lens, &nd), "split whole");
	CHECK(nd == 1 && lens[0] == strlen(text), "whole: one document");
	free(off); free(lens);

	/* packing: docs "abc ab"(2 ids) "ab"(1) "abc abc abc"(3) "cab"(3) */
	const char *docs[] = { "abc ab", "ab", "abc abc abc", "cab" };
	size_t dl[] = { 6, 2, 11, 3 };
	struct x3_tok_pack_opts o;
	int32_t *m;
	size_t rows;
	x3_tok_pack_defaults(t, &o);
	CHECK(o.mode == X3_PACK_ARTICLES && o.bos && !o.eos && o.pad_id == 2, "pack defaults");
	CHECK_OK(x3_tok_pack_rows(t, docs, dl, 4, 3, 4, &o, &m, &rows), "pack articles 3x4");
	CHECK(rows == 3 && same(m, 12, (int32_t[]){ 1, MABC, MAB, 1, 1, MABC, MABC, MABC, 1, META, C, AB }, 12),
	      "articles: a full row drops the rest of its document, the next document starts the next row");
	free(m);
	CHECK_OK(x3_tok_pack_rows(t, docs, dl, 4, 3, 6, &o, &m, &rows), "pack articles 3x6");
	CHECK(rows == 1 && same(m, 6, (int32_t[]){ 1, MABC, MAB, 1, MAB, 1 }, 6), "a final partial row is dropped");
	free(m);
	o.keep_partial = 1;
	CHECK_OK(x3_tok_pack_rows(t, docs, dl, 4, 3, 6, &o, &m, &rows), "pack with keep_partial");
	CHECK(rows == 2 && same(m + 6, 6, (int32_t[]){ 1, META, C, AB, 2, 2 }, 6), "keep_partial pads with EOS");
	free(m);
	o.keep_partial = 0;
	o.mode = X3_PACK_STREAM;
	o.bos = 0;
	o.eos = 1;
	CHECK_OK(x3_tok_pack_rows(t, docs, dl, 4, 5, 5, &o, &m, &rows), "pack stream 5x5");
	CHECK(rows == 2 && same(m, 10, (int32_t[]){ MABC, MAB, 2, MAB, 2, MABC, MABC, MABC, 2, META }, 10),
	      "stream: consecutive windows with EOS after each document");
	free(m);
	o.mode = X3_PACK_ARTICLES;
	o.even_odd = 1;
	CHECK_OK(x3_tok_pack_rows(t, docs, dl, 4, 3, 3, &o, &m, &rows), "pack even-odd 3x3");
	CHECK(rows == 3 && same(m, 9, (int32_t[]){ 1, MABC, MAB, MAB, MABC, MABC, 1, META, C }, 9),
	      "even-odd: BOS/EOS in even rows only");
	free(m);
	int32_t *m2;
	size_t rows2;
	o.even_odd = 0;
	const char *ptext = "abc ab\nab\nabc abc abc\ncab\n";
	CHECK_OK(x3_tok_pack_text(t, ptext, strlen(ptext), X3_SPLIT_LINES, 3, 4, &o, &m2, &rows2), "pack_text");
	CHECK_OK(x3_tok_pack_rows(t, docs, dl, 4, 3, 4, &o, &m, &rows), "pack_rows");
	CHECK(rows == rows2 && same(m, rows * 4, m2, rows2 * 4), "pack_text = split_docs + pack_rows");
	free(m); free(m2);
	rc = x3_tok_pack_rows(t, docs, dl, 4, 0, 4, &o, &m, &rows);
	CHECK(rc == X3_EINVAL, "0 rows is X3_EINVAL");
	x3_tok_free(t);

	/* tokenizer_config: add_eos_token, eos_token */
	const char *cfg = "{\"add_bos_token\": false, \"add_eos_token\": true, \"eos_token\": {\"content\": \"</s>\"},"
	                  " \"model_max_length\": 1000000000000000019884624838656}";
	CHECK_OK(x3_tok_load_mem(js, strlen(js), cfg, strlen(cfg), "tiny", &t), "load with tokenizer_config");
	if (t) {
		enc(t, "ab", 1, &ids, &n);
		CHECK(same(ids, n, (int32_t[]){ MAB, 2 }, 2), "add_bos_token/add_eos_token replace the template");
		free(ids);
		x3_tok_free(t);
	}

	/* errors */
	const char *uni = build_json("Unigram");
	rc = x3_tok_load_mem(uni, strlen(uni), NULL, 0, "uni", &t);
	CHECK(rc == X3_EUNSUP && strstr(x3_errmsg(), "Unigram"),
	      "Unigram is X3_EUNSUP: %s", x3_errmsg());
	rc = x3_tok_load_mem(js, strlen(js) / 2, NULL, 0, "half", &t);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "half"),
	      "truncated JSON is X3_EFORMAT: %s", x3_errmsg());
	rc = x3_tok_load("/nonexistent/tokenizer.json", &t);
	CHECK(rc == X3_EIO, "missing file is X3_EIO");

	/* canonical normalization */
	struct { const char *in, *nfc, *nfd; } nv[] = {
		{ "e\xCC\x81", "\xC3\xA9", "e\xCC\x81" },                        /* e + acute */
		{ "\xE1\x84\x80\xE1\x85\xA1", "\xEA\xB0\x80", "\xE1\x84\x80\xE1\x85\xA1" },  /* Hangul L+V */
		{ "\xEA\xB0\x81", "\xEA\xB0\x81", "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8" },  /* Hangul LVT */
		{ "\xE2\x84\xAB", "\xC3\x85", "A\xCC\x8A" },                     /* angstrom sign */
		{ "a\xCC\x81\xCC\xA8", "\xC4\x85\xCC\x81", "a\xCC\xA8\xCC\x81" },  /* reordering, then composition */
		{ "\xEF\xAC\x81", "\xEF\xAC\x81", "\xEF\xAC\x81" },              /* fi ligature: compatibility only */
		{ "\xCC\x81" "a", "\xCC\x81" "a", "\xCC\x81" "a" },              /* leading combining mark */
	};
	for (size_t i = 0; i < sizeof nv / sizeof *nv; i++) {
		char *o1 = NULL, *o2 = NULL;
		size_t l1 = 0, l2 = 0;
		int r1 = x3_u_normalize(nv[i].in, strlen(nv[i].in), 1, &o1, &l1);
		int r2 = x3_u_normalize(nv[i].in, strlen(nv[i].in), 0, &o2, &l2);
		CHECK(!r1 && l1 == strlen(nv[i].nfc) && !memcmp(o1, nv[i].nfc, l1), "NFC vector %zu", i);
		CHECK(!r2 && l2 == strlen(nv[i].nfd) && !memcmp(o2, nv[i].nfd, l2), "NFD vector %zu", i);
		free(o1); free(o2);
	}
	char *fx;
	size_t fl;
	int r = x3_utf8_lossy("\xF0\x9F\x98", 3, &fx, &fl);
	CHECK(!r && fl == 3 && !memcmp(fx, "\xEF\xBF\xBD", 3), "truncated 4-byte sequence: one U+FFFD");
	free(fx);
	r = x3_utf8_lossy("\xED\xA0\x80", 3, &fx, &fl);
	CHECK(!r && fl == 9, "surrogate: three U+FFFD");
	free(fx);
	TEST_DONE();
}
