/* tok_impl.h: what the tokenizer's files share (tokenizer.c loads
 * tokenizer.json; tok_pattern.c (with tok_uclass.c), tok_pretok.c,
 * tok_encode.c, tok_decode.c and tok_rows.c do the rest, see tokenizer.c
 * for the pipeline): small containers, the parsed pipeline's types, struct
 * x3_tok and the entry points between the files. Nothing outside lib/text/
 * includes it but tests/unit/t1402, which checks tok_uclass.c's rewrite. */
#ifndef X3_TOK_IMPL_H
#define X3_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <xxhash.h>
#include "x3.h"
#include "io.h"
#include "tokenizer.h"
#include "unicode.h"

/* ---- small containers ---------------------------------------------------- */
typedef struct { int32_t *v; size_t n, cap; } ivec;
typedef struct { char *p; size_t n, cap; } sbuf;

static inline int grow(void **p, size_t *cap, size_t need, size_t elt)
{
	if (need <= *cap) return X3_OK;
	size_t c = *cap ? *cap : 16;
	while (c < need) {
		if (c > SIZE_MAX / 2 / elt) return x3_err(X3_ENOMEM, "out of memory");
		c *= 2;
	}
	void *q = realloc(*p, c * elt);
	if (!q) return x3_err(X3_ENOMEM, "out of memory");
	*p = q;
	*cap = c;
	return X3_OK;
}
static inline int iv_add(ivec *a, const int32_t *x, size_t n)
{
	if (!n) return X3_OK;
	int rc = grow((void **)&a->v, &a->cap, a->n + n, sizeof *a->v);
	if (rc) return rc;
	memcpy(a->v + a->n, x, n * sizeof *x);
	a->n += n;
	return X3_OK;
}
static inline int iv_push(ivec *a, int32_t x) { return iv_add(a, &x, 1); }
static inline int sb_add(sbuf *b, const char *s, size_t n)
{
	int rc = grow((void **)&b->p, &b->cap, b->n + n + 1, 1);
	if (rc) return rc;
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
	return X3_OK;
}

/* string -> id, open addressing; keys are not owned */
typedef struct { const char *s; uint32_t n; int32_t v; } ment;
typedef struct { ment *e; size_t mask, cnt; } smap;

static inline uint64_t hstr(const char *s, size_t n) { return XXH3_64bits(s, n); }
static inline int smap_init(smap *m, size_t expect)
{
	size_t cap = 64;
	while (cap < 2 * expect + 16) cap *= 2;
	m->e = calloc(cap, sizeof *m->e);
	if (!m->e) return x3_err(X3_ENOMEM, "out of memory");
	m->mask = cap - 1;
	m->cnt = 0;
	return X3_OK;
}
static inline int32_t smap_get(const smap *m, const char *s, size_t n)
{
	if (!m->e) return -1;
	for (size_t i = hstr(s, n) & m->mask;; i = (i + 1) & m->mask) {
		const ment *e = &m->e[i];
		if (!e->s) return -1;
		if (e->n == n && !memcmp(e->s, s, n)) return e->v;
	}
}
static inline void smap_put(smap *m, const char *s, size_t n, int32_t v)
{
	/* callers size the map for all keys up front */
	for (size_t i = hstr(s, n) & m->mask;; i = (i + 1) & m->mask) {
		ment *e = &m->e[i];
		if (!e->s) { e->s = s; e->n = (uint32_t)n; e->v = v; m->cnt++; return; }
		if (e->n == n && !memcmp(e->s, s, n)) { e->v = v; return; }
	}
}

/* merges: (left id, right id) -> (rank, merged id) */
typedef struct { uint64_t k; int32_t rank, id; } mment;
#define MM_EMPTY UINT64_MAX
static inline uint64_t mix64(uint64_t x)
{
	x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;   /* murmur3 finalizer */
	x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
	return x ^ (x >> 33);
}

/* word cache: word -> ids */
typedef struct { uint64_t h; char *key; uint32_t n, nids; int32_t *ids; } cent;
#define CACHE_SLOTS 65536
#define CACHE_MAXWORD 256

/* a search pattern: a literal string or a PCRE2 regex */
typedef struct {
	char *lit; size_t litn;
	pcre2_code *re;
	pcre2_match_data *md;
} pat_t;

enum { N_PREPEND, N_REPLACE, N_NFC, N_NFD, N_STRIP };
typedef struct { int kind; pat_t pat; char *str; size_t strn; int left, right; } norm_t;

enum { P_SPLIT, P_BYTELEVEL, P_METASPACE, P_WSPLIT };
enum { B_REMOVED, B_ISOLATED, B_PREV, B_NEXT, B_CONTIG };
enum { SCHEME_ALWAYS, SCHEME_FIRST, SCHEME_NEVER };
typedef struct {
	int kind;
	pat_t pat; int behavior, invert;   /* Split */
	int prefix_space, use_regex;       /* ByteLevel */
	char repl[8]; size_t repln; int scheme, split;  /* Metaspace */
} pre_t;

enum { D_REPLACE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_METASPACE, D_BYTELEVEL };
typedef struct {
	int kind;
	pat_t pat; char *str; size_t strn;  /* Replace */
	char ch[8]; size_t chn; int start, stop;  /* Strip */
	char repl[8]; size_t repln; int scheme;   /* Metaspace */
} dec_t;

typedef struct {
	char *s; size_t n; int32_t id;
	char *m; size_t mn;   /* what is matched: s, normalized when normalized */
	int special, lstrip, rstrip, single_word, normalized;
} added_t;

/* pieces of text during pre-tokenization */
typedef struct { const char *s; size_t n; int first; } wpiece;
typedef struct { wpiece *v; size_t n, cap; } wlist;
typedef struct { size_t a, b; int m; } seg_t;
typedef struct { seg_t *v; size_t n, cap; } segv;
typedef struct { size_t a, b; int32_t id; } aseg;
typedef struct { aseg *v; size_t n, cap; } asegv;

typedef struct ablk { struct ablk *next; size_t used, cap; char data[]; } ablk;

typedef struct { int32_t id, prev, next, alive; } sym_t;
typedef struct { int32_t rank, pos, id; } hent;

struct x3_tok {
	char *label;
	/* vocabulary, indexed by id (model vocab and added tokens) */
	char **piece; uint32_t *plen; unsigned char *special; size_t nid;
	smap vocab;                   /* model vocab: token -> id */
	mment *mm; size_t mmask;      /* merges */
	int32_t unk; int has_unk_tok; int fuse_unk, byte_fallback, ignore_merges;
	char *cprefix; size_t cprefixn; char *suffix; size_t suffixn;
	int32_t bytetok[256];         /* ids of <0xNN> or -1 */
	added_t *added; size_t nadded;
	int32_t *abucket[2][256]; size_t abn[2][256]; int agroup[2];
	norm_t *norm; size_t nnorm;
	pre_t *pre; size_t npre; int bytelevel;
	dec_t *dec; size_t ndec; int has_decoder;
	ivec tpl_pre, tpl_post;
	int32_t bos, eos;
	pat_t gpt2, alnum;
	uint32_t b2u[256]; int16_t u2b[324];
	char desc[160];
	/* scratch, reused between calls */
	cent *cache; size_t ncache;
	sym_t *sym; size_t symcap;
	hent *heap; size_t heapcap;
	sbuf kbuf, nb[2];
	wlist wl[2];
	segv segs;
	asegv as1, as2;
	ablk *arena;
	char **extra; size_t nextra;
	int sp_cut;   /* words may be cut before a "▁" that follows another character */
};

/* ---- shared between the tokenizer's files -------------------------------- */
/* patterns (tok_pattern.c): a regex or a literal, the matches of one in a
 * text, and Split's behaviors on them */
int tok_pat_regex(x3_tok *t, pat_t *p, const char *re, size_t n, const char *what);
int tok_pat_literal(x3_tok *t, pat_t *p, const char *s, size_t n, const char *what);
void tok_pat_free(pat_t *p);
int tok_pat_find(pat_t *p, const char *s, size_t n, size_t pos, size_t *ms, size_t *me);
int tok_find_segs(pat_t *p, const char *s, size_t n, segv *out);
void tok_apply_behavior(segv *sg, int behavior, int invert);
/* a regex with its Unicode classes as the reference sees them (tok_uclass.c) */
int tok_uclass_rewrite(const char *re, size_t n, char **out, size_t *outn);
/* pre-tokenization (tok_pretok.c): the arena of transformed pieces, added
 * tokens split out of a text (group g), the normalizers, the
 * pre-tokenizers */
char *tok_arena_alloc(x3_tok *t, size_t n);
void tok_arena_reset(x3_tok *t);
int tok_added_split(x3_tok *t, int g, const char *s, size_t n, asegv *out);
int tok_normalize(x3_tok *t, const char *s, size_t n, const char **r, size_t *rn);
int tok_pretokenize(x3_tok *t, const char *s, size_t n, int first, wlist **res);
/* BPE (tok_encode.c): a word's ids through the word cache; whether words
 * may be cut before a "\xE2\x96\x81" (Metaspace without split) */
int tok_bpe_cached(x3_tok *t, const char *w, size_t n, ivec *out);
int tok_meta_cut_ok(const x3_tok *t);

#endif
