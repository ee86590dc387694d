/* tokenizer.h: Hugging Face tokenizer.json (BPE) encoder/decoder and the
 * calibration-row packer of exl3(5) §10.1.
 *
 * Supported: the two BPE families the reference `tokenizers` library uses
 * for Llama-type models:
 *   - SentencePiece-style BPE with byte fallback (Llama 2, Mistral):
 *     normalizer Prepend("▁") + Replace(" ", "▁") or a Metaspace
 *     pre-tokenizer, <0xNN> byte-fallback tokens, unk;
 *   - byte-level BPE (GPT-2, Llama 3, Qwen2/3): ByteLevel and Split(regex)
 *     pre-tokenizers (PCRE2, UTF + UCP), the byte-to-unicode table.
 * Added/special tokens are split out first, as the reference does. Anything
 * else (Unigram, WordPiece, unknown normalizers, pre-tokenizers, decoders or
 * options) fails to load with X3_EUNSUP naming the component: never a
 * silent mis-tokenization.
 *
 * Invalid UTF-8 in the input text: each maximal invalid subsequence is
 * replaced by U+FFFD before tokenizing (what Rust's from_utf8_lossy does, so
 * the result equals the reference fed with the lossily decoded string).
 *
 * A handle keeps a word cache: use one handle per thread (or serialize
 * calls on it). */
#ifndef X3_TOKENIZER_H
#define X3_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct x3_tok x3_tok;

/* Load a tokenizer. path is a tokenizer.json file, or a model directory
 * holding tokenizer.json (and optionally tokenizer_config.json, whose
 * add_bos_token, add_eos_token, bos_token and eos_token are honoured, and
 * config.json, whose bos_token_id and eos_token_id are used when
 * tokenizer_config.json names none). For a file, the two configs next to
 * it are read too. Without any, BOS is the template's leading special token
 * and EOS the first of </s>, <|endoftext|>, <|end_of_text|>, <eos>.
 * Returns X3_OK, X3_EIO, X3_EFORMAT (malformed JSON / inconsistent vocab),
 * X3_EUNSUP (unsupported model type or component), X3_ENOMEM. */
int x3_tok_load(const char *path, x3_tok **out);
/* Load from a tokenizer.json already in memory (config_json may be NULL:
 * the contents of a tokenizer_config.json). label names it in messages. */
int x3_tok_load_mem(const char *json, size_t len, const char *config_json,
                    size_t config_len, const char *label, x3_tok **out);
void x3_tok_free(x3_tok *t);

/* Encode len bytes of text. add_special != 0 adds the special tokens the
 * tokenizer adds by default (the post-processor's template, e.g. BOS for
 * Llama; overridden by add_bos_token/add_eos_token of tokenizer_config.json
 * where present), like encode(text, add_special_tokens=True) of the
 * reference. *ids is malloc'd (free() it), *n tokens. */
int x3_tok_encode(x3_tok *t, const char *text, size_t len, int add_special,
                  int32_t **ids, size_t *n);
/* Decode ids to text like decode(ids, skip_special_tokens) of the
 * reference. *text is malloc'd and NUL-terminated, *len bytes (may be
 * NULL). An id outside the vocabulary is X3_EINVAL. */
int x3_tok_decode(x3_tok *t, const int32_t *ids, size_t n,
                  int skip_special, char **text, size_t *len);

/* BOS / EOS ids (-1 if the tokenizer has none). */
int32_t x3_tok_bos(const x3_tok *t);
int32_t x3_tok_eos(const x3_tok *t);
/* Number of ids (largest id + 1, added tokens included). */
size_t x3_tok_vocab_size(const x3_tok *t);
/* The token string of an id (NULL if none). */
const char *x3_tok_piece(const x3_tok *t, int32_t id);
/* Id of a token string, or -1. */
int32_t x3_tok_id(const x3_tok *t, const char *piece);
/* Short description, e.g. "bpe byte-level vocab=128256" (static storage
 * inside the handle). */
const char *x3_tok_describe(const x3_tok *t);

/* ---- documents and calibration rows (exl3(5) §10.1) --------------- */

/* How a text is cut into documents. */
enum x3_tok_split {
	X3_SPLIT_WHOLE = 0,  /* the whole text is one document */
	X3_SPLIT_LINES = 1,  /* one document per line (empty lines skipped) */
	X3_SPLIT_BLANK = 2,  /* documents separated by blank lines */
};
/* Split text into documents: offsets and lengths into text (no copies),
 * malloc'd arrays of *n entries (free both). Documents that are empty or
 * whitespace only are skipped; the line terminators are not part of a
 * document for X3_SPLIT_LINES, inner newlines are kept for X3_SPLIT_BLANK. */
int x3_tok_split_docs(const char *text, size_t len, enum x3_tok_split mode,
                      size_t **off, size_t **lens, size_t *n);

/* How documents become rows. */
enum x3_tok_pack_mode {
	/* exl3(5) §10.1 "packed": documents are tokenized and appended to the row
	 * until it holds cols tokens; the row is truncated there, the overflow
	 * of that document is discarded and the next row starts with the next
	 * document. */
	X3_PACK_ARTICLES = 0,
	/* consecutive windows: all documents' tokens concatenated and cut into
	 * rows of cols tokens (overflow continues in the next row), like the
	 * "code"/"technical" sources of exl3(5) §10.1. */
	X3_PACK_STREAM = 1,
};

struct x3_tok_pack_opts {
	enum x3_tok_pack_mode mode;
	int bos;       /* put BOS before every document (if the tokenizer has one) */
	int eos;       /* put EOS after every document (if it has one) */
	/* exllamav3 rule: documents placed in even rows (0, 2, ...: counted
	 * by rows completed so far) get BOS and EOS, odd rows neither;
	 * overrides bos/eos. */
	int even_odd;
	/* keep a final incomplete row, filled up with pad_id (otherwise it is
	 * dropped) */
	int keep_partial;
	int32_t pad_id;
};
/* Default options: X3_PACK_ARTICLES, bos=1, eos=0, even_odd=0,
 * keep_partial=0, pad_id = EOS or 0. */
void x3_tok_pack_defaults(const x3_tok *t, struct x3_tok_pack_opts *o);

/* Tokenize ndocs documents (docs[i], lens[i] bytes; special tokens in the
 * text are recognised, no template tokens are added: BOS/EOS come from the
 * options) and pack them into at most rows x cols int32 ids, row-major.
 * *out is malloc'd (rows x cols entries); *rows_out is the number of rows
 * filled (< rows when the text runs out: not an error here, the caller
 * decides). X3_EINVAL for rows or cols 0 or an overflowing size. */
int x3_tok_pack_rows(x3_tok *t, const char *const *docs, const size_t *lens,
                     size_t ndocs, size_t rows, size_t cols,
                     const struct x3_tok_pack_opts *o,
                     int32_t **out, size_t *rows_out);

/* Convenience for programs with a --text FILE option: split (mode) and
 * pack a whole text. Same results as x3_tok_split_docs + x3_tok_pack_rows. */
int x3_tok_pack_text(x3_tok *t, const char *text, size_t len,
                     enum x3_tok_split split, size_t rows, size_t cols,
                     const struct x3_tok_pack_opts *o,
                     int32_t **out, size_t *rows_out);

#endif
