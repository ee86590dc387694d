/* tokenizer.c: Hugging Face tokenizer.json BPE tokenizer (see tokenizer.h).
 *
 * The pipeline follows the reference `tokenizers` library step by step:
 *   1. added tokens with normalized=false are split out of the raw text;
 *   2. each remaining piece is normalized (Prepend, Replace, NFC, ...) and
 *      added tokens with normalized=true are split out of it;
 *   3. the pre-tokenizers cut each piece into words (Split with the model's
 *      regex, ByteLevel, Metaspace, ...);
 *   4. each word is encoded by BPE: one symbol per character (or its
 *      <0xNN> byte tokens, or unk), then the adjacent pair of lowest merge
 *      rank (leftmost on ties) is merged until no pair has a rank;
 *   5. the post-processor adds its special tokens (TemplateProcessing).
 * Decoding maps ids to token strings and runs the decoder chain. */
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

static int grow(void **p, size_t *cap, size_t need, size_t elt)
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
static int iv_add(ivec *a, const int32_t *x, size_t n)
{
	if (!n) return X3_OK;
	int rc = grow((void **)&a->v, &a->cap, a->n + n, sizeof *a->v);
	if (rc) return rc;
	memcpy(a->v + a->n, x, n * sizeof *x);
	a->n += n;
	return X3_OK;
}
static int iv_push(ivec *a, int32_t x) { return iv_add(a, &x, 1); }
static int sb_add(sbuf *b, const char *s, size_t n)
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

static uint64_t hstr(const char *s, size_t n) { return XXH3_64bits(s, n); }
static int smap_init(smap *m, size_t expect)
{
	size_t cap = 64;
	while (cap < 2 * expect + 16) cap *= 2;
	m->e = calloc(cap, sizeof *m->e);
	if (!m->e) return x3_err(X3_ENOMEM, "out of memory");
	m->mask = cap - 1;
	m->cnt = 0;
	return X3_OK;
}
static int32_t smap_get(const smap *m, const char *s, size_t n)
{
	if (!m->e) return -1;
	for (size_t i = hstr(s, n) & m->mask;; i = (i + 1) & m->mask) {
		const ment *e = &m->e[i];
		if (!e->s) return -1;
		if (e->n == n && !memcmp(e->s, s, n)) return e->v;
	}
}
static void smap_put(smap *m, const char *s, size_t n, int32_t v)
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
static uint64_t mix64(uint64_t x)
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

/* ---- arena for transformed pieces ----------------------------------------- */
static char *arena_alloc(x3_tok *t, size_t n)
{
	ablk *b = t->arena;
	if (!b || b->cap - b->used < n) {
		size_t cap = n > 65536 ? n : 65536;
		ablk *nb = malloc(sizeof *nb + cap);
		if (!nb) { x3_err(X3_ENOMEM, "out of memory"); return NULL; }
		nb->next = b; nb->used = 0; nb->cap = cap;
		t->arena = b = nb;
	}
	char *p = b->data + b->used;
	b->used += n;
	return p;
}
/* Empty the arena; if it grew past one block, replace the blocks by one
 * block as large as all of them, so that similar texts need no more. */
static void arena_reset(x3_tok *t)
{
	ablk *b = t->arena;
	if (!b) return;
	if (!b->next) { b->used = 0; return; }
	size_t cap = 0;
	while (b) { ablk *n = b->next; cap += b->cap; free(b); b = n; }
	t->arena = NULL;
	if ((b = malloc(sizeof *b + cap))) {
		b->next = NULL; b->used = 0; b->cap = cap;
		t->arena = b;
	}
}

/* ---- patterns --------------------------------------------------------------- */
static int pat_regex(x3_tok *t, pat_t *p, const char *re, size_t n, const char *what)
{
	int e;
	PCRE2_SIZE off;
	p->re = pcre2_compile((PCRE2_SPTR)re, n, PCRE2_UTF | PCRE2_UCP, &e, &off, NULL);
	if (!p->re) {
		PCRE2_UCHAR msg[160];
		pcre2_get_error_message(e, msg, sizeof msg);
		return x3_err(X3_EUNSUP, "%s: %s: regex /%.*s/ at offset %zu: %s", t->label, what,
		              (int)n, re, (size_t)off, (char *)msg);
	}
	pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE);  /* falls back to the interpreter */
	p->md = pcre2_match_data_create_from_pattern(p->re, NULL);
	if (!p->md) return x3_err(X3_ENOMEM, "out of memory");
	return X3_OK;
}
static int pat_literal(x3_tok *t, pat_t *p, const char *s, size_t n, const char *what)
{
	if (!n) return x3_err(X3_EFORMAT, "%s: %s: empty pattern", t->label, what);
	p->lit = malloc(n + 1);
	if (!p->lit) return x3_err(X3_ENOMEM, "out of memory");
	memcpy(p->lit, s, n);
	p->lit[n] = 0;
	p->litn = n;
	return X3_OK;
}
static void pat_free(pat_t *p)
{
	free(p->lit);
	if (p->md) pcre2_match_data_free(p->md);
	if (p->re) pcre2_code_free(p->re);
}
/* First match at or after pos: 1 and [*ms, *me), 0 if none, <0 error. */
static int pat_find(pat_t *p, const char *s, size_t n, size_t pos, size_t *ms, size_t *me)
{
	if (p->lit) {
		const char *q = memmem(s + pos, n - pos, p->lit, p->litn);
		if (!q) return 0;
		*ms = (size_t)(q - s);
		*me = *ms + p->litn;
		return 1;
	}
	int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, p->md, NULL);
	if (rc == PCRE2_ERROR_NOMATCH) return 0;
	if (rc < 0) return x3_err(X3_EFORMAT, "regex match failed (pcre2 error %d)", rc), -1;
	PCRE2_SIZE *ov = pcre2_get_ovector_pointer(p->md);
	*ms = ov[0];
	*me = ov[1];
	return 1;
}
/* Cut s into gaps and matches (the reference's Pattern::find_matches). */
static int find_segs(pat_t *p, const char *s, size_t n, segv *out)
{
	int rc;
	out->n = 0;
	size_t prev = 0, pos = 0, ms, me;
	while (pos <= n) {
		int f = pat_find(p, s, n, pos, &ms, &me);
		if (f < 0) return X3_EFORMAT;
		if (!f) break;
		if ((rc = grow((void **)&out->v, &out->cap, out->n + 2, sizeof *out->v))) return rc;
		if (prev != ms) out->v[out->n++] = (seg_t){ prev, ms, 0 };
		out->v[out->n++] = (seg_t){ ms, me, 1 };
		prev = me;
		if (me == ms) {
			if (me >= n) break;
			pos = me + x3_utf8_len((unsigned char)s[me]);
		} else pos = me;
	}
	if ((rc = grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v))) return rc;
	if (prev != n || out->n == 0) out->v[out->n++] = (seg_t){ prev, n, 0 };
	return X3_OK;
}
/* Apply a SplitDelimiterBehavior in place; segs with m = 1 are removed. */
static void apply_behavior(segv *sg, int behavior, int invert)
{
	size_t i, k = 0;
	int prevm = 0;
	if (invert) for (i = 0; i < sg->n; i++) sg->v[i].m = !sg->v[i].m;
	switch (behavior) {
	case B_REMOVED:
		return;
	case B_ISOLATED:
		for (i = 0; i < sg->n; i++) sg->v[i].m = 0;
		return;
	case B_CONTIG:
		for (i = 0; i < sg->n; i++) {
			seg_t s = sg->v[i];
			if (s.m == prevm && k) sg->v[k - 1].b = s.b;
			else sg->v[k++] = (seg_t){ s.a, s.b, 0 };
			prevm = s.m;
		}
		break;
	case B_PREV:
		for (i = 0; i < sg->n; i++) {
			seg_t s = sg->v[i];
			if (s.m && !prevm && k) sg->v[k - 1].b = s.b;
			else sg->v[k++] = (seg_t){ s.a, s.b, 0 };
			prevm = s.m;
		}
		break;
	case B_NEXT:
		/* walk backwards, merging each match into the piece after it */
		for (i = sg->n; i-- > 0;) {
			seg_t s = sg->v[i];
			if (s.m && !prevm && k) sg->v[sg->n - k].a = s.a;
			else { k++; sg->v[sg->n - k] = (seg_t){ s.a, s.b, 0 }; }
			prevm = s.m;
		}
		memmove(sg->v, sg->v + sg->n - k, k * sizeof *sg->v);
		break;
	}
	sg->n = k;
}

/* ---- JSON helpers ---------------------------------------------------------- */
static const char *jstr(json_t *o, const char *k, size_t *n)
{
	json_t *v = json_object_get(o, k);
	if (!json_is_string(v)) return NULL;
	if (n) *n = json_string_length(v);
	return json_string_value(v);
}
static int jbool(json_t *o, const char *k, int def)
{
	json_t *v = json_object_get(o, k);
	return json_is_boolean(v) ? json_is_true(v) : def;
}
static int jtype(x3_tok *t, json_t *o, const char *what, const char **type)
{
	*type = json_is_object(o) ? jstr(o, "type", NULL) : NULL;
	if (!*type) return x3_err(X3_EFORMAT, "%s: %s: missing \"type\"", t->label, what);
	return X3_OK;
}
static char *dupn(const char *s, size_t n)
{
	char *p = malloc(n + 1);
	if (!p) return NULL;
	memcpy(p, s, n);
	p[n] = 0;
	return p;
}
/* {"String": s} or {"Regex": r} */
static int parse_pattern(x3_tok *t, json_t *o, pat_t *p, const char *what)
{
	json_t *pj = json_object_get(o, "pattern");
	size_t n;
	const char *s;
	if (json_is_object(pj) && (s = jstr(pj, "String", &n)))
		return pat_literal(t, p, s, n, what);
	if (json_is_object(pj) && (s = jstr(pj, "Regex", &n)))
		return pat_regex(t, p, s, n, what);
	return x3_err(X3_EUNSUP, "%s: %s: pattern is neither {\"String\"} nor {\"Regex\"}", t->label, what);
}
/* one character given as a JSON string, e.g. Metaspace's replacement */
static int parse_char(x3_tok *t, json_t *o, const char *k, const char *def, char *out, size_t *outn,
                      const char *what)
{
	size_t n;
	const char *s = jstr(o, k, &n);
	if (!s) { s = def; n = strlen(def); }
	if (!n || n > 4 || x3_utf8_valid_prefix(s, n) != n || (size_t)x3_utf8_len((unsigned char)s[0]) != n)
		return x3_err(X3_EFORMAT, "%s: %s: \"%s\" must be one character", t->label, what, k);
	memcpy(out, s, n);
	out[n] = 0;
	*outn = n;
	return X3_OK;
}
static int parse_scheme(x3_tok *t, json_t *o, int *scheme, const char *what)
{
	const char *s = jstr(o, "prepend_scheme", NULL);
	if (!s) { *scheme = jbool(o, "add_prefix_space", 1) ? SCHEME_ALWAYS : SCHEME_NEVER; return X3_OK; }
	if (!strcmp(s, "always")) *scheme = SCHEME_ALWAYS;
	else if (!strcmp(s, "first")) *scheme = SCHEME_FIRST;
	else if (!strcmp(s, "never")) *scheme = SCHEME_NEVER;
	else return x3_err(X3_EUNSUP, "%s: %s: prepend_scheme '%s' not supported", t->label, what, s);
	return X3_OK;
}

/* ---- loading: normalizers, pre-tokenizers, decoders, post-processor -------- */
static int add_norm(x3_tok *t, json_t *o)
{
	const char *type;
	int rc;
	if (!o || json_is_null(o)) return X3_OK;
	if ((rc = jtype(t, o, "normalizer", &type))) return rc;
	if (!strcmp(type, "Sequence")) {
		json_t *a = json_object_get(o, "normalizers"), *v;
		size_t i;
		if (!json_is_array(a)) return x3_err(X3_EFORMAT, "%s: normalizer Sequence: no \"normalizers\" array", t->label);
		json_array_foreach(a, i, v) if ((rc = add_norm(t, v))) return rc;
		return X3_OK;
	}
	norm_t *tmp = realloc(t->norm, (t->nnorm + 1) * sizeof *t->norm);
	if (!tmp) return x3_err(X3_ENOMEM, "out of memory");
	t->norm = tmp;
	norm_t *nm = &t->norm[t->nnorm];
	memset(nm, 0, sizeof *nm);
	size_t n;
	const char *s;
	if (!strcmp(type, "Prepend") || !strcmp(type, "Replace")) {
		int prep = type[1] == 'r' && type[2] == 'e' && type[3] == 'p';
		nm->kind = prep ? N_PREPEND : N_REPLACE;
		if (!(s = jstr(o, prep ? "prepend" : "content", &n)))
			return x3_err(X3_EFORMAT, "%s: normalizer %s: missing string", t->label, type);
		if (!(nm->str = dupn(s, n))) return x3_err(X3_ENOMEM, "out of memory");
		nm->strn = n;
		t->nnorm++;
		if (!prep && (rc = parse_pattern(t, o, &nm->pat, "normalizer Replace"))) return rc;
		return X3_OK;
	}
	if (!strcmp(type, "NFC")) nm->kind = N_NFC;
	else if (!strcmp(type, "NFD")) nm->kind = N_NFD;
	else if (!strcmp(type, "Strip")) {
		nm->kind = N_STRIP;
		nm->left = jbool(o, "strip_left", 1);
		nm->right = jbool(o, "strip_right", 1);
	} else
		return x3_err(X3_EUNSUP, "%s: normalizer '%s' not supported", t->label, type);
	t->nnorm++;
	return X3_OK;
}

static pre_t *new_pre(x3_tok *t)
{
	pre_t *tmp = realloc(t->pre, (t->npre + 1) * sizeof *t->pre);
	if (!tmp) { x3_err(X3_ENOMEM, "out of memory"); return NULL; }
	t->pre = tmp;
	memset(&t->pre[t->npre], 0, sizeof *t->pre);
	return &t->pre[t->npre++];
}

/* GPT-2's pre-tokenization regex (ByteLevel with use_regex) */
static const char GPT2_RE[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* a word character (the regex crate's Unicode \w), for single_word added
 * tokens */
static const char ALNUM_RE[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]";

static int add_pre(x3_tok *t, json_t *o)
{
	const char *type, *s;
	int rc;
	pre_t *p;
	if (!o || json_is_null(o)) return X3_OK;
	if ((rc = jtype(t, o, "pre_tokenizer", &type))) return rc;
	if (!strcmp(type, "Sequence")) {
		json_t *a = json_object_get(o, "pretokenizers"), *v;
		size_t i;
		if (!json_is_array(a)) return x3_err(X3_EFORMAT, "%s: pre_tokenizer Sequence: no \"pretokenizers\" array", t->label);
		json_array_foreach(a, i, v) if ((rc = add_pre(t, v))) return rc;
		return X3_OK;
	}
	if (!(p = new_pre(t))) return X3_ENOMEM;
	if (!strcmp(type, "Split")) {
		p->kind = P_SPLIT;
		if ((rc = parse_pattern(t, o, &p->pat, "pre_tokenizer Split"))) return rc;
		p->invert = jbool(o, "invert", 0);
		if (!(s = jstr(o, "behavior", NULL)))
			return x3_err(X3_EFORMAT, "%s: pre_tokenizer Split: missing \"behavior\"", t->label);
		if (!strcmp(s, "Removed")) p->behavior = B_REMOVED;
		else if (!strcmp(s, "Isolated")) p->behavior = B_ISOLATED;
		else if (!strcmp(s, "MergedWithPrevious")) p->behavior = B_PREV;
		else if (!strcmp(s, "MergedWithNext")) p->behavior = B_NEXT;
		else if (!strcmp(s, "Contiguous")) p->behavior = B_CONTIG;
		else return x3_err(X3_EUNSUP, "%s: pre_tokenizer Split: behavior '%s' not supported", t->label, s);
	} else if (!strcmp(type, "ByteLevel")) {
		p->kind = P_BYTELEVEL;
		p->prefix_space = jbool(o, "add_prefix_space", 1);
		p->use_regex = jbool(o, "use_regex", 1);
		t->bytelevel = 1;
		if (p->use_regex && !t->gpt2.re &&
		    (rc = pat_regex(t, &t->gpt2, GPT2_RE, sizeof GPT2_RE - 1, "pre_tokenizer ByteLevel")))
			return rc;
	} else if (!strcmp(type, "Metaspace")) {
		p->kind = P_METASPACE;
		if ((rc = parse_char(t, o, "replacement", "\xE2\x96\x81", p->repl, &p->repln, "pre_tokenizer Metaspace")))
			return rc;
		if ((rc = parse_scheme(t, o, &p->scheme, "pre_tokenizer Metaspace"))) return rc;
		p->split = jbool(o, "split", 1);
	} else if (!strcmp(type, "Digits")) {
		/* digits (char::is_numeric) isolated one by one, or runs of them */
		p->kind = P_SPLIT;
		p->behavior = B_ISOLATED;
		if (jbool(o, "individual_digits", 0)) rc = pat_regex(t, &p->pat, "\\p{N}", 5, "pre_tokenizer Digits");
		else rc = pat_regex(t, &p->pat, "\\p{N}+", 6, "pre_tokenizer Digits");
		if (rc) return rc;
	} else if (!strcmp(type, "WhitespaceSplit")) {
		p->kind = P_WSPLIT;
	} else
		return x3_err(X3_EUNSUP, "%s: pre_tokenizer '%s' not supported", t->label, type);
	return X3_OK;
}

static int add_dec(x3_tok *t, json_t *o)
{
	const char *type, *s;
	size_t n;
	int rc;
	if (!o || json_is_null(o)) return X3_OK;
	if ((rc = jtype(t, o, "decoder", &type))) return rc;
	t->has_decoder = 1;
	if (!strcmp(type, "Sequence")) {
		json_t *a = json_object_get(o, "decoders"), *v;
		size_t i;
		if (!json_is_array(a)) return x3_err(X3_EFORMAT, "%s: decoder Sequence: no \"decoders\" array", t->label);
		json_array_foreach(a, i, v) if ((rc = add_dec(t, v))) return rc;
		return X3_OK;
	}
	dec_t *tmp = realloc(t->dec, (t->ndec + 1) * sizeof *t->dec);
	if (!tmp) return x3_err(X3_ENOMEM, "out of memory");
	t->dec = tmp;
	dec_t *d = &t->dec[t->ndec++];
	memset(d, 0, sizeof *d);
	if (!strcmp(type, "Replace")) {
		d->kind = D_REPLACE;
		if (!(s = jstr(o, "content", &n)))
			return x3_err(X3_EFORMAT, "%s: decoder Replace: missing \"content\"", t->label);
		if (!(d->str = dupn(s, n))) return x3_err(X3_ENOMEM, "out of memory");
		d->strn = n;
		return parse_pattern(t, o, &d->pat, "decoder Replace");
	}
	if (!strcmp(type, "ByteFallback")) d->kind = D_BYTEFALLBACK;
	else if (!strcmp(type, "Fuse")) d->kind = D_FUSE;
	else if (!strcmp(type, "Strip")) {
		d->kind = D_STRIP;
		if ((rc = parse_char(t, o, "content", " ", d->ch, &d->chn, "decoder Strip"))) return rc;
		json_t *a = json_object_get(o, "start"), *b = json_object_get(o, "stop");
		d->start = json_is_integer(a) ? (int)json_integer_value(a) : 0;
		d->stop = json_is_integer(b) ? (int)json_integer_value(b) : 0;
		if (d->start < 0 || d->stop < 0)
			return x3_err(X3_EFORMAT, "%s: decoder Strip: negative start/stop", t->label);
	} else if (!strcmp(type, "Metaspace")) {
		d->kind = D_METASPACE;
		if ((rc = parse_char(t, o, "replacement", "\xE2\x96\x81", d->repl, &d->repln, "decoder Metaspace")))
			return rc;
		if ((rc = parse_scheme(t, o, &d->scheme, "decoder Metaspace"))) return rc;
	} else if (!strcmp(type, "ByteLevel")) d->kind = D_BYTELEVEL;
	else return x3_err(X3_EUNSUP, "%s: decoder '%s' not supported", t->label, type);
	return X3_OK;
}

static int32_t added_id(const x3_tok *t, const char *s, size_t n)
{
	for (size_t i = 0; i < t->nadded; i++)
		if (t->added[i].n == n && !memcmp(t->added[i].s, s, n)) return t->added[i].id;
	return -1;
}
int32_t x3_tok_id(const x3_tok *t, const char *piece)
{
	size_t n = strlen(piece);
	int32_t id = added_id(t, piece, n);
	return id >= 0 ? id : smap_get(&t->vocab, piece, n);
}

/* ids of the special token named in a post-processor ({"id": [ids]} map) */
static int add_post(x3_tok *t, json_t *o)
{
	const char *type;
	int rc;
	if (!o || json_is_null(o)) return X3_OK;
	if ((rc = jtype(t, o, "post_processor", &type))) return rc;
	if (!strcmp(type, "Sequence")) {
		json_t *a = json_object_get(o, "processors"), *v;
		size_t i;
		if (!json_is_array(a)) return x3_err(X3_EFORMAT, "%s: post_processor Sequence: no \"processors\" array", t->label);
		json_array_foreach(a, i, v) if ((rc = add_post(t, v))) return rc;
		return X3_OK;
	}
	if (!strcmp(type, "ByteLevel")) return X3_OK;   /* offsets only */
	ivec pre = { 0 }, post = { 0 };
	if (!strcmp(type, "TemplateProcessing")) {
		json_t *single = json_object_get(o, "single"), *sp = json_object_get(o, "special_tokens"), *it;
		size_t i;
		int seen_a = 0;
		if (!json_is_array(single)) return x3_err(X3_EFORMAT, "%s: TemplateProcessing: no \"single\" template", t->label);
		json_array_foreach(single, i, it) {
			json_t *st = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
			if (sq) {
				const char *sid = jstr(sq, "id", NULL);
				if (!sid || strcmp(sid, "A") || seen_a) {
					rc = x3_err(X3_EUNSUP, "%s: TemplateProcessing: single template with sequence '%s'",
					            t->label, sid ? sid : "?");
					goto out;
				}
				seen_a = 1;
				continue;
			}
			const char *name = st ? jstr(st, "id", NULL) : NULL;
			json_t *ent = name ? json_object_get(sp, name) : NULL, *ids = json_object_get(ent, "ids"), *x;
			size_t j;
			if (!name || !json_is_array(ids)) {
				rc = x3_err(X3_EFORMAT, "%s: TemplateProcessing: special token '%s' has no ids", t->label,
				            name ? name : "?");
				goto out;
			}
			json_array_foreach(ids, j, x) {
				if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= (json_int_t)t->nid) {
					rc = x3_err(X3_EFORMAT, "%s: TemplateProcessing: bad id for '%s'", t->label, name);
					goto out;
				}
				if ((rc = iv_push(seen_a ? &post : &pre, (int32_t)json_integer_value(x)))) goto out;
			}
		}
		if (!seen_a) { rc = x3_err(X3_EFORMAT, "%s: TemplateProcessing: no sequence in template", t->label); goto out; }
	} else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
		json_t *cls = json_object_get(o, "cls"), *sep = json_object_get(o, "sep");
		json_t *c1 = json_array_get(cls, 1), *s1 = json_array_get(sep, 1);
		if (!json_is_integer(c1) || !json_is_integer(s1))
			return x3_err(X3_EFORMAT, "%s: %s: bad cls/sep", t->label, type);
		if ((rc = iv_push(&pre, (int32_t)json_integer_value(c1))) || (rc = iv_push(&post, (int32_t)json_integer_value(s1))))
			goto out;
	} else
		return x3_err(X3_EUNSUP, "%s: post_processor '%s' not supported", t->label, type);
	/* a later processor wraps the output of the earlier ones */
	if ((rc = iv_add(&pre, t->tpl_pre.v, t->tpl_pre.n))) goto out;
	free(t->tpl_pre.v);
	t->tpl_pre = pre;
	pre = (ivec){ 0 };
	rc = iv_add(&t->tpl_post, post.v, post.n);
out:
	free(pre.v);
	free(post.v);
	return rc;
}

static int set_piece(x3_tok *t, int32_t id, const char *s, size_t n)
{
	free(t->piece[id]);
	if (!(t->piece[id] = dupn(s, n))) return x3_err(X3_ENOMEM, "out of memory");
	t->plen[id] = (uint32_t)n;
	return X3_OK;
}

static int load_model(x3_tok *t, json_t *m)
{
	const char *type = jstr(m, "type", NULL);
	json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
	int rc;
	if (!json_is_object(m)) return x3_err(X3_EFORMAT, "%s: no \"model\" object", t->label);
	if (type && strcmp(type, "BPE"))
		return x3_err(X3_EUNSUP, "%s: model type '%s' not supported (only BPE)", t->label, type);
	if (!type && !merges) return x3_err(X3_EUNSUP, "%s: model without type or merges: only BPE is supported", t->label);
	if (!json_is_object(vocab) || !json_is_array(merges))
		return x3_err(X3_EFORMAT, "%s: BPE model needs a \"vocab\" object and a \"merges\" array", t->label);
	json_t *dr = json_object_get(m, "dropout");
	if (json_is_number(dr) && json_number_value(dr) != 0.0)
		return x3_err(X3_EUNSUP, "%s: BPE dropout %g not supported (not deterministic)", t->label, json_number_value(dr));
	t->fuse_unk = jbool(m, "fuse_unk", 0);
	t->byte_fallback = jbool(m, "byte_fallback", 0);
	t->ignore_merges = jbool(m, "ignore_merges", 0);
	size_t n = 0;
	const char *s;
	if ((s = jstr(m, "continuing_subword_prefix", &n)) && n && !(t->cprefix = dupn(s, n))) return x3_err(X3_ENOMEM, "oom");
	t->cprefixn = t->cprefix ? n : 0;
	if ((s = jstr(m, "end_of_word_suffix", &n)) && n && !(t->suffix = dupn(s, n))) return x3_err(X3_ENOMEM, "oom");
	t->suffixn = t->suffix ? n : 0;

	/* ids: the model vocab and the added tokens */
	const char *key;
	json_t *v;
	json_int_t maxid = -1;
	json_object_foreach(vocab, key, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 30))
			return x3_err(X3_EFORMAT, "%s: vocab entry '%s': bad id", t->label, key);
		if (json_integer_value(v) > maxid) maxid = json_integer_value(v);
	}
	for (size_t i = 0; i < t->nadded; i++)
		if (t->added[i].id > maxid) maxid = t->added[i].id;
	t->nid = (size_t)(maxid + 1);
	t->piece = calloc(t->nid ? t->nid : 1, sizeof *t->piece);
	t->plen = calloc(t->nid ? t->nid : 1, sizeof *t->plen);
	t->special = calloc(t->nid ? t->nid : 1, 1);
	if (!t->piece || !t->plen || !t->special) return x3_err(X3_ENOMEM, "out of memory");
	if ((rc = smap_init(&t->vocab, json_object_size(vocab)))) return rc;
	void *iter;
	for (iter = json_object_iter(vocab); iter; iter = json_object_iter_next(vocab, iter)) {
		size_t kn = json_object_iter_key_len(iter);
		int32_t id = (int32_t)json_integer_value(json_object_iter_value(iter));
		if ((rc = set_piece(t, id, json_object_iter_key(iter), kn))) return rc;
	}
	/* map keys point at the pieces (an id shared by two tokens keeps the last) */
	for (iter = json_object_iter(vocab); iter; iter = json_object_iter_next(vocab, iter)) {
		size_t kn = json_object_iter_key_len(iter);
		int32_t id = (int32_t)json_integer_value(json_object_iter_value(iter));
		const char *k = json_object_iter_key(iter);
		const char *stored = t->plen[id] == kn && !memcmp(t->piece[id], k, kn) ? t->piece[id] : NULL;
		if (!stored) {   /* two tokens with one id: keep a copy of this key */
			char **x = realloc(t->extra, (t->nextra + 1) * sizeof *x);
			if (!x) return x3_err(X3_ENOMEM, "out of memory");
			t->extra = x;
			if (!(x[t->nextra] = dupn(k, kn))) return x3_err(X3_ENOMEM, "out of memory");
			stored = x[t->nextra++];
		}
		smap_put(&t->vocab, stored, kn, id);
	}
	for (int b = 0; b < 256; b++) {
		char name[8];
		snprintf(name, sizeof name, "<0x%02X>", b);
		t->bytetok[b] = smap_get(&t->vocab, name, 6);
	}
	s = jstr(m, "unk_token", &n);
	t->unk = -1;
	if (s) { t->has_unk_tok = 1; t->unk = smap_get(&t->vocab, s, n); }

	/* merges: "a b" strings or [a, b] pairs; rank = position */
	size_t nm = json_array_size(merges), cap = 64;
	while (cap < 2 * nm + 16) cap *= 2;
	t->mm = malloc(cap * sizeof *t->mm);
	if (!t->mm) return x3_err(X3_ENOMEM, "out of memory");
	for (size_t i = 0; i < cap; i++) t->mm[i].k = MM_EMPTY;
	t->mmask = cap - 1;
	sbuf nb = { 0 };
	size_t i;
	json_array_foreach(merges, i, v) {
		const char *a, *b;
		size_t an, bn;
		if (json_is_string(v)) {
			a = json_string_value(v);
			const char *sp = memchr(a, ' ', json_string_length(v));
			if (!sp) { rc = x3_err(X3_EFORMAT, "%s: merge %zu '%s' is not \"a b\"", t->label, i, a); goto fail; }
			an = (size_t)(sp - a);
			b = sp + 1;
			bn = json_string_length(v) - an - 1;
		} else if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) &&
		           json_is_string(json_array_get(v, 1))) {
			a = json_string_value(json_array_get(v, 0));
			an = json_string_length(json_array_get(v, 0));
			b = json_string_value(json_array_get(v, 1));
			bn = json_string_length(json_array_get(v, 1));
		} else { rc = x3_err(X3_EFORMAT, "%s: merge %zu is neither \"a b\" nor [a, b]", t->label, i); goto fail; }
		int32_t ia = smap_get(&t->vocab, a, an), ib = smap_get(&t->vocab, b, bn);
		size_t skip = t->cprefixn && bn >= t->cprefixn && !memcmp(b, t->cprefix, t->cprefixn) ? t->cprefixn : 0;
		nb.n = 0;
		if ((rc = sb_add(&nb, a, an)) || (rc = sb_add(&nb, b + skip, bn - skip))) goto fail;
		int32_t ic = smap_get(&t->vocab, nb.p, nb.n);
		if (ia < 0 || ib < 0 || ic < 0) {
			rc = x3_err(X3_EFORMAT, "%s: merge %zu '%.*s' + '%.*s': token not in the vocabulary", t->label, i,
			            (int)an, a, (int)bn, b);
			goto fail;
		}
		uint64_t k = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
		for (size_t h = mix64(k) & t->mmask;; h = (h + 1) & t->mmask) {
			if (t->mm[h].k == MM_EMPTY || t->mm[h].k == k) {
				t->mm[h] = (mment){ k, (int32_t)i, ic };   /* a repeated pair keeps the later rank */
				break;
			}
		}
	}
	free(nb.p);
	return X3_OK;
fail:
	free(nb.p);
	return rc;
}

static int load_added(x3_tok *t, json_t *a)
{
	json_t *v;
	size_t i;
	if (json_is_null(a) || !a) return X3_OK;
	if (!json_is_array(a)) return x3_err(X3_EFORMAT, "%s: \"added_tokens\" is not an array", t->label);
	t->added = calloc(json_array_size(a) + 1, sizeof *t->added);
	if (!t->added) return x3_err(X3_ENOMEM, "out of memory");
	json_array_foreach(a, i, v) {
		size_t n;
		const char *s = jstr(v, "content", &n);
		json_t *id = json_object_get(v, "id");
		if (!s || !n || !json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 30))
			return x3_err(X3_EFORMAT, "%s: added token %zu: needs \"id\" and non-empty \"content\"", t->label, i);
		added_t *d = &t->added[t->nadded++];
		if (!(d->s = dupn(s, n))) return x3_err(X3_ENOMEM, "out of memory");
		d->n = n;
		d->id = (int32_t)json_integer_value(id);
		d->special = jbool(v, "special", 0);
		d->lstrip = jbool(v, "lstrip", 0);
		d->rstrip = jbool(v, "rstrip", 0);
		d->single_word = jbool(v, "single_word", 0);
		d->normalized = jbool(v, "normalized", !d->special);
	}
	return X3_OK;
}

static int normalize(x3_tok *t, const char *s, size_t n, const char **r, size_t *rn);
static int meta_cut_ok(const x3_tok *t);

/* buckets of added tokens by first byte, longest first (leftmost-longest);
 * tokens with normalized=true are matched in their normalized form */
static int index_added(x3_tok *t)
{
	for (size_t i = 0; i < t->nadded; i++) {
		added_t *d = &t->added[i];
		/* the reference gives an added token the vocabulary's id, or a new
		 * one outside the vocabulary: refuse files that disagree */
		int32_t vid = smap_get(&t->vocab, d->s, d->n);
		int vocab_owns = t->piece[d->id] && smap_get(&t->vocab, t->piece[d->id], t->plen[d->id]) == d->id;
		if ((vid >= 0 && vid != d->id) || (vid < 0 && vocab_owns))
			return x3_err(X3_EFORMAT, "%s: added token '%s' has id %d, but the vocabulary %s %d",
			              t->label, d->s, (int)d->id, vid >= 0 ? "gives it" : "uses that id for another token,",
			              vid >= 0 ? (int)vid : (int)d->id);
		int g = d->normalized, rc;
		/* (the vocabulary's own string stays: its map points at it) */
		if (!vocab_owns && (rc = set_piece(t, d->id, d->s, d->n))) return rc;
		t->special[d->id] = (unsigned char)d->special;
		d->m = d->s;
		d->mn = d->n;
		if (g) {
			const char *ns;
			size_t nn;
			if ((rc = normalize(t, d->s, d->n, &ns, &nn))) return rc;
			if (!nn) continue;
			if (!(d->m = dupn(ns, nn))) return x3_err(X3_ENOMEM, "out of memory");
			d->mn = nn;
		}
		int c = (unsigned char)d->m[0];
		int32_t *b = realloc(t->abucket[g][c], (t->abn[g][c] + 1) * sizeof *b);
		if (!b) return x3_err(X3_ENOMEM, "out of memory");
		size_t j = t->abn[g][c]++;
		while (j > 0 && t->added[b[j - 1]].mn < d->mn) { b[j] = b[j - 1]; j--; }
		b[j] = (int32_t)i;
		t->abucket[g][c] = b;
		t->agroup[g] = 1;
	}
	return X3_OK;
}

static int read_file(const char *path, char **buf, size_t *len)
{
	int fd, rc0 = x3_open_regular(path, &fd);
	if (rc0) return rc0;
	FILE *f = fdopen(fd, "rb");
	if (!f) { close(fd); return x3_err(X3_EIO, "%s: cannot open: %m", path); }
	sbuf b = { 0 };
	char tmp[65536];
	size_t k;
	int rc = X3_OK;
	while ((k = fread(tmp, 1, sizeof tmp, f)) > 0)
		if ((rc = sb_add(&b, tmp, k))) break;
	if (!rc && ferror(f)) rc = x3_err(X3_EIO, "%s: read error: %s", path, strerror(errno));
	fclose(f);
	if (!rc && !b.p && (rc = sb_add(&b, "", 0))) return rc;
	if (rc) { free(b.p); return rc; }
	*buf = b.p;
	*len = b.n;
	return X3_OK;
}

/* a token of tokenizer_config.json: "<s>" or {"content": "<s>", ...} */
static int32_t config_token(const x3_tok *t, json_t *cfg, const char *k, int *present)
{
	json_t *v = json_object_get(cfg, k);
	*present = v != NULL;
	if (json_is_object(v)) v = json_object_get(v, "content");
	if (!json_is_string(v)) return -1;
	return x3_tok_id(t, json_string_value(v));
}

static int32_t config_id(json_t *cfg, const char *k, int *present)
{
	json_t *v = json_object_get(cfg, k);
	*present = v != NULL;
	if (json_is_array(v)) v = json_array_get(v, 0);
	double d = json_number_value(v);   /* parsed with JSON_DECODE_INT_AS_REAL */
	return json_is_number(v) && d >= 0 && d < (1 << 30) ? (int32_t)d : -1;
}

static int finish_special(x3_tok *t, const char *cfg_json, size_t cfg_len, const char *modelcfg_json, size_t mlen)
{
	json_t *cfg = NULL, *mcfg = NULL;
	json_error_t je;
	int have_bos = 0, have_eos = 0, p;
	t->bos = t->eos = -1;
	if (cfg_json) {
		cfg = json_loadb(cfg_json, cfg_len, JSON_DECODE_INT_AS_REAL, &je);
		if (!json_is_object(cfg)) {
			json_decref(cfg);
			return x3_err(X3_EFORMAT, "%s: tokenizer_config.json: line %d: %s", t->label, je.line, je.text);
		}
		int32_t id = config_token(t, cfg, "bos_token", &p);
		if (p) { have_bos = 1; t->bos = id; }
		id = config_token(t, cfg, "eos_token", &p);
		if (p) { have_eos = 1; t->eos = id; }
	}
	if (modelcfg_json && (mcfg = json_loadb(modelcfg_json, mlen, JSON_DECODE_INT_AS_REAL, &je))) {
		int32_t id = config_id(mcfg, "bos_token_id", &p);
		if (!have_bos && p) { have_bos = 1; t->bos = id; }
		id = config_id(mcfg, "eos_token_id", &p);
		if (!have_eos && p) { have_eos = 1; t->eos = id; }
	}
	/* no configuration: the template's leading special token is BOS; EOS by
	 * the usual names */
	if (!have_bos && t->tpl_pre.n == 1) t->bos = t->tpl_pre.v[0];
	if (!have_eos) {
		static const char *names[] = { "</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>" };
		for (size_t i = 0; i < 4 && t->eos < 0; i++) t->eos = x3_tok_id(t, names[i]);
	}
	if (t->bos >= (int32_t)t->nid) t->bos = -1;
	if (t->eos >= (int32_t)t->nid) t->eos = -1;
	/* add_bos_token / add_eos_token (LlamaTokenizer) replace the template */
	json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
	if (json_is_boolean(ab) || json_is_boolean(ae)) {
		t->tpl_pre.n = t->tpl_post.n = 0;
		if (json_is_true(ab) && t->bos >= 0 && iv_push(&t->tpl_pre, t->bos)) goto oom;
		if (json_is_true(ae) && t->eos >= 0 && iv_push(&t->tpl_post, t->eos)) goto oom;
	}
	json_decref(cfg);
	json_decref(mcfg);
	return X3_OK;
oom:
	json_decref(cfg);
	json_decref(mcfg);
	return X3_ENOMEM;
}

static int x3_tok_load_mem2(const char *json, size_t len, const char *cfg, size_t cfg_len,
                     const char *mcfg, size_t mcfg_len, const char *label, x3_tok **out)
{
	json_error_t je;
	int rc;
	*out = NULL;
	x3_tok *t = calloc(1, sizeof *t);
	if (!t || !(t->label = strdup(label ? label : "tokenizer.json"))) {
		free(t);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
	if (!root) {
		rc = x3_err(X3_EFORMAT, "%s: invalid JSON at line %d column %d: %s", t->label, je.line, je.column, je.text);
		goto fail;
	}
	if (!json_is_object(root)) { rc = x3_err(X3_EFORMAT, "%s: not a JSON object", t->label); goto fail; }
	if ((rc = load_added(t, json_object_get(root, "added_tokens")))) goto fail;
	if ((rc = load_model(t, json_object_get(root, "model")))) goto fail;
	if ((rc = add_norm(t, json_object_get(root, "normalizer")))) goto fail;
	if ((rc = index_added(t))) goto fail;
	if ((rc = add_pre(t, json_object_get(root, "pre_tokenizer")))) goto fail;
	if ((rc = add_dec(t, json_object_get(root, "decoder")))) goto fail;
	if ((rc = add_post(t, json_object_get(root, "post_processor")))) goto fail;
	if ((rc = finish_special(t, cfg, cfg_len, mcfg, mcfg_len))) goto fail;
	if ((rc = pat_regex(t, &t->alnum, ALNUM_RE, sizeof ALNUM_RE - 1, "single_word"))) goto fail;
	/* GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for
	 * themselves, the others get 256, 257, ... in byte order */
	for (int b = 0, k = 0; b < 256; b++)
		t->b2u[b] = ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) ? (uint32_t)b : (uint32_t)(256 + k++);
	for (int c = 0; c < 324; c++) t->u2b[c] = -1;
	for (int b = 0; b < 256; b++) t->u2b[t->b2u[b]] = (int16_t)b;
	t->sp_cut = !t->bytelevel && meta_cut_ok(t);
	t->cache = calloc(CACHE_SLOTS, sizeof *t->cache);
	if (!t->cache) { rc = x3_err(X3_ENOMEM, "out of memory"); goto fail; }
	{
		size_t nm = 0;
		for (size_t i = 0; i <= t->mmask; i++) nm += t->mm[i].k != MM_EMPTY;
		snprintf(t->desc, sizeof t->desc, "bpe %s vocab=%zu merges=%zu added=%zu", t->bytelevel ? "byte-level" :
		         t->byte_fallback ? "byte-fallback" : "plain", t->nid, nm, t->nadded);
	}
	json_decref(root);
	*out = t;
	return X3_OK;
fail:
	json_decref(root);
	x3_tok_free(t);
	return rc;
}

int x3_tok_load_mem(const char *json, size_t len, const char *cfg, size_t cfg_len,
                    const char *label, x3_tok **out)
{
	return x3_tok_load_mem2(json, len, cfg, cfg_len, NULL, 0, label, out);
}

int x3_tok_load(const char *path, x3_tok **out)
{
	struct stat st;
	char *dir = NULL, *file = NULL, *buf = NULL, *cfg = NULL, *mcfg = NULL;
	size_t len = 0, cfg_len = 0, mlen = 0;
	int rc;
	*out = NULL;
	if (stat(path, &st)) return x3_err(X3_EIO, "%s: %m", path);
	if (S_ISDIR(st.st_mode)) {
		dir = strdup(path);
	} else {
		const char *sl = strrchr(path, '/');
		dir = sl ? strndup(path, (size_t)(sl - path) + (sl == path)) : strdup(".");
		file = strdup(path);
	}
	if (!dir || (!file && asprintf(&file, "%s/tokenizer.json", dir) < 0)) {
		rc = x3_err(X3_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = read_file(file, &buf, &len))) goto out;
	char *p;
	if (asprintf(&p, "%s/tokenizer_config.json", dir) >= 0) {
		if (!stat(p, &st) && (rc = read_file(p, &cfg, &cfg_len))) { free(p); goto out; }
		free(p);
	}
	if (asprintf(&p, "%s/config.json", dir) >= 0) {
		if (!stat(p, &st) && (rc = read_file(p, &mcfg, &mlen))) { free(p); goto out; }
		free(p);
	}
	rc = x3_tok_load_mem2(buf, len, cfg, cfg_len, mcfg, mlen, file, out);
out:
	free(dir); free(file); free(buf); free(cfg); free(mcfg);
	return rc;
}

void x3_tok_free(x3_tok *t)
{
	size_t i;
	if (!t) return;
	for (i = 0; i < t->nid; i++) free(t->piece[i]);
	free(t->piece); free(t->plen); free(t->special);
	free(t->vocab.e); free(t->mm);
	free(t->cprefix); free(t->suffix);
	for (i = 0; i < t->nadded; i++) {
		if (t->added[i].m != t->added[i].s) free(t->added[i].m);
		free(t->added[i].s);
	}
	free(t->added);
	for (int g = 0; g < 2; g++) for (int c = 0; c < 256; c++) free(t->abucket[g][c]);
	for (i = 0; i < t->nnorm; i++) { pat_free(&t->norm[i].pat); free(t->norm[i].str); }
	free(t->norm);
	for (i = 0; i < t->npre; i++) pat_free(&t->pre[i].pat);
	free(t->pre);
	for (i = 0; i < t->ndec; i++) { pat_free(&t->dec[i].pat); free(t->dec[i].str); }
	free(t->dec);
	free(t->tpl_pre.v); free(t->tpl_post.v);
	pat_free(&t->gpt2); pat_free(&t->alnum);
	if (t->cache) for (i = 0; i < CACHE_SLOTS; i++) free(t->cache[i].key);
	free(t->cache);
	free(t->sym); free(t->heap);
	free(t->kbuf.p); free(t->nb[0].p); free(t->nb[1].p);
	free(t->wl[0].v); free(t->wl[1].v);
	free(t->segs.v); free(t->as1.v); free(t->as2.v);
	while (t->arena) { ablk *n = t->arena->next; free(t->arena); t->arena = n; }
	for (i = 0; i < t->nextra; i++) free(t->extra[i]);
	free(t->extra);
	free(t->label);
	free(t);
}

int32_t x3_tok_bos(const x3_tok *t) { return t->bos; }
int32_t x3_tok_eos(const x3_tok *t) { return t->eos; }
size_t x3_tok_vocab_size(const x3_tok *t) { return t->nid; }
const char *x3_tok_piece(const x3_tok *t, int32_t id)
{
	return id >= 0 && (size_t)id < t->nid ? t->piece[id] : NULL;
}
const char *x3_tok_describe(const x3_tok *t) { return t->desc; }

/* ---- BPE ------------------------------------------------------------------------ */
static const mment *merge_get(const x3_tok *t, int32_t a, int32_t b)
{
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (size_t h = mix64(k) & t->mmask;; h = (h + 1) & t->mmask) {
		const mment *e = &t->mm[h];
		if (e->k == k) return e;
		if (e->k == MM_EMPTY) return NULL;
	}
}

static int hless(const hent *x, const hent *y)
{
	return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}
static int heap_push(x3_tok *t, size_t *hn, hent e)
{
	int rc = grow((void **)&t->heap, &t->heapcap, *hn + 1, sizeof *t->heap);
	if (rc) return rc;
	size_t i = (*hn)++;
	while (i > 0 && hless(&e, &t->heap[(i - 1) / 2])) { t->heap[i] = t->heap[(i - 1) / 2]; i = (i - 1) / 2; }
	t->heap[i] = e;
	return X3_OK;
}
static hent heap_pop(x3_tok *t, size_t *hn)
{
	hent top = t->heap[0], last = t->heap[--*hn];
	size_t i = 0, n = *hn;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n) break;
		if (c + 1 < n && hless(&t->heap[c + 1], &t->heap[c])) c++;
		if (!hless(&t->heap[c], &last)) break;
		t->heap[i] = t->heap[c];
		i = c;
	}
	if (n) t->heap[i] = last;
	return top;
}

static int sym_add(x3_tok *t, size_t *ns, int32_t id)
{
	int rc = grow((void **)&t->sym, &t->symcap, *ns + 1, sizeof *t->sym);
	if (rc) return rc;
	int32_t i = (int32_t)(*ns)++;
	t->sym[i] = (sym_t){ id, i - 1, i + 1, 1 };
	return X3_OK;
}

/* Encode one word (valid UTF-8) with BPE, appending ids to out. */
static int bpe_word(x3_tok *t, const char *w, size_t n, ivec *out)
{
	int rc;
	size_t ns = 0, i = 0;
	int32_t unk_pending = 0;
	if (t->ignore_merges) {
		int32_t id = smap_get(&t->vocab, w, n);
		if (id >= 0) return iv_push(out, id);
	}
	while (i < n) {
		size_t e = i + x3_utf8_len((unsigned char)w[i]);
		const char *key = w + i;
		size_t kn = e - i;
		if ((t->cprefix && i > 0) || (t->suffix && e == n)) {
			t->kbuf.n = 0;
			if ((t->cprefix && i > 0 && (rc = sb_add(&t->kbuf, t->cprefix, t->cprefixn))) ||
			    (rc = sb_add(&t->kbuf, w + i, e - i)) ||
			    (t->suffix && e == n && (rc = sb_add(&t->kbuf, t->suffix, t->suffixn))))
				return rc;
			key = t->kbuf.p;
			kn = t->kbuf.n;
		}
		int32_t id = smap_get(&t->vocab, key, kn);
		if (id >= 0) {
			if (unk_pending) { if ((rc = sym_add(t, &ns, t->unk))) return rc; unk_pending = 0; }
			if ((rc = sym_add(t, &ns, id))) return rc;
			i = e;
			continue;
		}
		if (t->byte_fallback) {
			size_t k;
			for (k = 0; k < kn && t->bytetok[(unsigned char)key[k]] >= 0; k++) ;
			if (k == kn) {
				/* (a pending unk stays pending, as in the reference) */
				for (k = 0; k < kn; k++) if ((rc = sym_add(t, &ns, t->bytetok[(unsigned char)key[k]]))) return rc;
				i = e;
				continue;
			}
		}
		if (t->has_unk_tok) {
			if (t->unk < 0) return x3_err(X3_EFORMAT, "%s: unk_token is not in the vocabulary", t->label);
			if (unk_pending && !t->fuse_unk && (rc = sym_add(t, &ns, t->unk))) return rc;
			unk_pending = 1;
		}
		i = e;
	}
	if (unk_pending && (rc = sym_add(t, &ns, t->unk))) return rc;
	if (!ns) return X3_OK;
	t->sym[ns - 1].next = -1;

	/* merge: lowest rank first, leftmost on ties; stale entries skipped */
	size_t hn = 0;
	sym_t *s = t->sym;
	for (i = 0; i + 1 < ns; i++) {
		const mment *m = merge_get(t, s[i].id, s[i + 1].id);
		if (m && (rc = heap_push(t, &hn, (hent){ m->rank, (int32_t)i, m->id }))) return rc;
	}
	while (hn) {
		hent top = heap_pop(t, &hn);
		sym_t *a = &t->sym[top.pos];
		if (!a->alive || a->next < 0) continue;
		sym_t *b = &t->sym[a->next];
		const mment *m = merge_get(t, a->id, b->id);
		if (!m || m->id != top.id) continue;
		a->id = top.id;
		b->alive = 0;
		a->next = b->next;
		if (a->next >= 0) t->sym[a->next].prev = top.pos;
		if (a->prev >= 0 && (m = merge_get(t, t->sym[a->prev].id, a->id)) &&
		    (rc = heap_push(t, &hn, (hent){ m->rank, a->prev, m->id })))
			return rc;
		a = &t->sym[top.pos];   /* heap_push does not move sym, but keep it obvious */
		if (a->next >= 0 && (m = merge_get(t, a->id, t->sym[a->next].id)) &&
		    (rc = heap_push(t, &hn, (hent){ m->rank, top.pos, m->id })))
			return rc;
	}
	for (i = 0; i < ns; i++)
		if (t->sym[i].alive && (rc = iv_push(out, t->sym[i].id))) return rc;
	return X3_OK;
}

static void cache_clear(x3_tok *t)
{
	for (size_t i = 0; i < CACHE_SLOTS; i++) { free(t->cache[i].key); t->cache[i].key = NULL; }
	t->ncache = 0;
}

static int bpe_piece(x3_tok *t, const char *w, size_t n, ivec *out);

/* SentencePiece-style tokenizers run BPE on whole texts (no pre-tokenizer).
 * When no vocabulary token has a "▁" right after another character, no
 * merge can cross the place before such a "▁": the word is cut there and
 * the pieces, which repeat, go through the cache. Same result, much faster. */
#define META "\xE2\x96\x81"
static int meta_cut_ok(const x3_tok *t)
{
	if (smap_get(&t->vocab, META, 3) < 0) return 0;
	for (size_t id = 0; id < t->nid; id++) {
		const char *p = t->piece[id], *q;
		size_t n = t->plen[id], off = 1;
		if (!p) continue;
		while (off < n && (q = memmem(p + off, n - off, META, 3))) {
			size_t i = (size_t)(q - p);
			if (i < 3 || memcmp(p + i - 3, META, 3)) return 0;
			off = i + 3;
		}
	}
	return 1;
}

static int bpe_cached(x3_tok *t, const char *w, size_t n, ivec *out)
{
	if (!t->sp_cut) return bpe_piece(t, w, n, out);
	size_t start = 0, i = 1;
	const char *q;
	int rc;
	while (i < n && (q = memmem(w + i, n - i, META, 3))) {
		size_t k = (size_t)(q - w);
		if (k >= 3 && !memcmp(w + k - 3, META, 3)) { i = k + 3; continue; }
		if ((rc = bpe_piece(t, w + start, k - start, out))) return rc;
		start = k;
		i = k + 3;
	}
	return bpe_piece(t, w + start, n - start, out);
}

static int bpe_piece(x3_tok *t, const char *w, size_t n, ivec *out)
{
	if (n > CACHE_MAXWORD) return bpe_word(t, w, n, out);
	uint64_t h = hstr(w, n);
	size_t i;
	for (i = h & (CACHE_SLOTS - 1); t->cache[i].key; i = (i + 1) & (CACHE_SLOTS - 1)) {
		cent *c = &t->cache[i];
		if (c->h == h && c->n == n && !memcmp(c->key, w, n)) return iv_add(out, c->ids, c->nids);
	}
	size_t before = out->n;
	int rc = bpe_word(t, w, n, out);
	if (rc) return rc;
	if (t->ncache >= CACHE_SLOTS / 2) {
		cache_clear(t);
		for (i = h & (CACHE_SLOTS - 1); t->cache[i].key; i = (i + 1) & (CACHE_SLOTS - 1)) ;
	}
	size_t k = out->n - before, off = (n + 3) & ~(size_t)3;
	char *key = malloc(off + k * sizeof(int32_t) + 1);
	if (!key) return X3_OK;   /* caching is optional */
	memcpy(key, w, n);
	int32_t *ids = (int32_t *)(void *)(key + off);   /* ids follow the text, aligned */
	if (k) memcpy(ids, out->v + before, k * sizeof *ids);
	t->cache[i] = (cent){ h, key, (uint32_t)n, (uint32_t)k, ids };
	t->ncache++;
	return X3_OK;
}

/* ---- added tokens, normalizers, pre-tokenizers ---------------------------------- */
static int ends_with_word(x3_tok *t, const char *s, size_t end)
{
	size_t i = end;
	if (!i) return 0;
	do i--; while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
	size_t ms, me;
	return pat_find(&t->alnum, s, end, i, &ms, &me) == 1 && ms == i;
}
static int starts_with_word(x3_tok *t, const char *s, size_t n)
{
	size_t ms, me;
	if (!n) return 0;
	size_t l = x3_utf8_len((unsigned char)s[0]);
	return pat_find(&t->alnum, s, l, 0, &ms, &me) == 1;
}

/* Split s at the added tokens of group g (0: matched on the raw text,
 * 1: on the normalized text): leftmost-longest, non-overlapping, with
 * single_word, lstrip and rstrip as the reference applies them. */
static int added_split(x3_tok *t, int g, const char *s, size_t n, asegv *out)
{
	int rc;
	out->n = 0;
	size_t start_off = 0, i = 0;
	if (t->agroup[g]) {
		while (i < n) {
			int c = (unsigned char)s[i];
			const added_t *best = NULL;
			for (size_t k = 0; k < t->abn[g][c]; k++) {
				const added_t *a = &t->added[t->abucket[g][c][k]];
				if (a->mn <= n - i && !memcmp(s + i, a->m, a->mn)) { best = a; break; }
			}
			if (!best) { i++; continue; }
			size_t ms = i, me = i + best->mn;
			i = me;
			if (best->single_word && ((ms > 0 && ends_with_word(t, s, ms)) ||
			                          (me < n && starts_with_word(t, s + me, n - me))))
				continue;
			if (best->lstrip) {
				size_t j = ms;
				while (j > 0) {
					size_t k = j - 1;
					while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
					size_t q = k;
					if (!x3_u_is_space(x3_utf8_next(s, &q))) break;
					j = k;
				}
				ms = j > start_off ? j : start_off;
			}
			if (best->rstrip) {
				while (me < n) {
					size_t q = me;
					if (!x3_u_is_space(x3_utf8_next(s, &q))) break;
					me = q;
				}
			}
			if ((rc = grow((void **)&out->v, &out->cap, out->n + 2, sizeof *out->v))) return rc;
			if (start_off < ms) out->v[out->n++] = (aseg){ start_off, ms, -1 };
			out->v[out->n++] = (aseg){ ms, me, best->id };
			start_off = me;
		}
	}
	if ((rc = grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v))) return rc;
	if (start_off < n) out->v[out->n++] = (aseg){ start_off, n, -1 };
	return X3_OK;
}

/* Run the normalizers over s; *r is s itself or one of t->nb. */
static int normalize(x3_tok *t, const char *s, size_t n, const char **r, size_t *rn)
{
	const char *cur = s;
	size_t cn = n;
	int which = 0, rc;
	for (size_t k = 0; k < t->nnorm; k++) {
		norm_t *nm = &t->norm[k];
		sbuf *o = &t->nb[which];
		o->n = 0;
		switch (nm->kind) {
		case N_PREPEND:
			if (!cn) continue;
			if ((rc = sb_add(o, nm->str, nm->strn)) || (rc = sb_add(o, cur, cn))) return rc;
			break;
		case N_REPLACE: {
			if ((rc = find_segs(&nm->pat, cur, cn, &t->segs))) return rc;
			if (t->segs.n == 1 && !t->segs.v[0].m) continue;
			for (size_t j = 0; j < t->segs.n; j++) {
				seg_t g = t->segs.v[j];
				rc = g.m ? sb_add(o, nm->str, nm->strn) : sb_add(o, cur + g.a, g.b - g.a);
				if (rc) return rc;
			}
			break;
		}
		case N_NFC: case N_NFD: {
			char *u;
			size_t un;
			if ((rc = x3_u_normalize(cur, cn, nm->kind == N_NFC, &u, &un))) return rc;
			rc = sb_add(o, u, un);
			free(u);
			if (rc) return rc;
			break;
		}
		case N_STRIP: {
			size_t a = 0, b = cn, q;
			while (nm->left && a < b) { q = a; if (!x3_u_is_space(x3_utf8_next(cur, &q))) break; a = q; }
			while (nm->right && b > a) {
				size_t j = b - 1;
				while (j > a && ((unsigned char)cur[j] & 0xC0) == 0x80) j--;
				q = j;
				if (!x3_u_is_space(x3_utf8_next(cur, &q))) break;
				b = j;
			}
			if (a == 0 && b == cn) continue;
			if ((rc = sb_add(o, cur + a, b - a))) return rc;
			break;
		}
		}
		cur = o->p ? o->p : "";
		cn = o->n;
		which ^= 1;
	}
	*r = cur;
	*rn = cn;
	return X3_OK;
}

static int wl_push(wlist *l, const char *s, size_t n, int first)
{
	if (!n) return X3_OK;
	int rc = grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v);
	if (rc) return rc;
	l->v[l->n++] = (wpiece){ s, n, first };
	return X3_OK;
}

static int pre_one(x3_tok *t, const pre_t *p, wpiece q, wlist *out)
{
	int rc;
	size_t i, j;
	switch (p->kind) {
	case P_SPLIT:
		if ((rc = find_segs((pat_t *)&p->pat, q.s, q.n, &t->segs))) return rc;
		apply_behavior(&t->segs, p->behavior, p->invert);
		for (i = 0; i < t->segs.n; i++) {
			seg_t g = t->segs.v[i];
			if (!g.m && (rc = wl_push(out, q.s + g.a, g.b - g.a, q.first && g.a == 0))) return rc;
		}
		return X3_OK;
	case P_WSPLIT:
		for (i = 0; i < q.n;) {
			size_t a = i, k = i;
			while (k < q.n) { size_t z = k; if (x3_u_is_space(x3_utf8_next(q.s, &z))) break; k = z; }
			if ((rc = wl_push(out, q.s + a, k - a, q.first && a == 0))) return rc;
			i = k;
			while (i < q.n) { size_t z = i; if (!x3_u_is_space(x3_utf8_next(q.s, &z))) break; i = z; }
		}
		return X3_OK;
	case P_METASPACE: {
		size_t sp = 0;
		for (i = 0; i < q.n; i++) sp += q.s[i] == ' ';
		char *b = arena_alloc(t, q.n + (sp + 1) * p->repln);
		if (!b) return X3_ENOMEM;
		size_t m = 0;
		int starts = q.n && (q.s[0] == ' ' || (q.n >= p->repln && !memcmp(q.s, p->repl, p->repln)));
		if (!starts && (p->scheme == SCHEME_ALWAYS || (p->scheme == SCHEME_FIRST && q.first))) {
			memcpy(b, p->repl, p->repln);
			m = p->repln;
		}
		for (i = 0; i < q.n; i++) {
			if (q.s[i] == ' ') { memcpy(b + m, p->repl, p->repln); m += p->repln; }
			else b[m++] = q.s[i];
		}
		if (!p->split) return wl_push(out, b, m, q.first);
		/* each replacement character starts a new piece (MergedWithNext) */
		size_t start = 0;
		for (i = 1; i + p->repln <= m; i++) {
			if (!memcmp(b + i, p->repl, p->repln)) {
				if ((rc = wl_push(out, b + start, i - start, q.first && start == 0))) return rc;
				start = i;
				i += p->repln - 1;
			}
		}
		return wl_push(out, b + start, m - start, q.first && start == 0);
	}
	case P_BYTELEVEL: {
		wpiece r = q;
		if (p->prefix_space && q.s[0] != ' ') {
			char *b = arena_alloc(t, q.n + 1);
			if (!b) return X3_ENOMEM;
			b[0] = ' ';
			memcpy(b + 1, q.s, q.n);
			r.s = b;
			r.n = q.n + 1;
		}
		size_t nseg = 1;
		if (p->use_regex) {
			if ((rc = find_segs(&t->gpt2, r.s, r.n, &t->segs))) return rc;
			nseg = t->segs.n;
		}
		for (j = 0; j < nseg; j++) {
			size_t a = p->use_regex ? t->segs.v[j].a : 0, e = p->use_regex ? t->segs.v[j].b : r.n;
			if (a == e) continue;
			char *b = arena_alloc(t, 2 * (e - a));
			if (!b) return X3_ENOMEM;
			size_t m = 0;
			for (i = a; i < e; i++) m += x3_utf8_put(t->b2u[(unsigned char)r.s[i]], b + m);
			if ((rc = wl_push(out, b, m, r.first && a == 0))) return rc;
		}
		return X3_OK;
	}
	}
	return X3_OK;
}

static int pretokenize(x3_tok *t, const char *s, size_t n, int first, wlist **res)
{
	wlist *a = &t->wl[0], *b = &t->wl[1], *tmp;
	int rc;
	a->n = 0;
	if ((rc = wl_push(a, s, n, first))) return rc;
	for (size_t k = 0; k < t->npre; k++) {
		b->n = 0;
		for (size_t i = 0; i < a->n; i++)
			if ((rc = pre_one(t, &t->pre[k], a->v[i], b))) return rc;
		tmp = a; a = b; b = tmp;
	}
	*res = a;
	return X3_OK;
}

static int encode_body(x3_tok *t, const char *s, size_t n, ivec *out)
{
	int rc = added_split(t, 0, s, n, &t->as1);
	for (size_t i = 0; !rc && i < t->as1.n; i++) {
		aseg g = t->as1.v[i];
		if (g.id >= 0) { rc = iv_push(out, g.id); continue; }
		const char *ns;
		size_t nn;
		if ((rc = normalize(t, s + g.a, g.b - g.a, &ns, &nn))) break;
		if ((rc = added_split(t, 1, ns, nn, &t->as2))) break;
		for (size_t j = 0; !rc && j < t->as2.n; j++) {
			aseg h = t->as2.v[j];
			if (h.id >= 0) { rc = iv_push(out, h.id); continue; }
			wlist *wl;
			if ((rc = pretokenize(t, ns + h.a, h.b - h.a, g.a == 0 && h.a == 0, &wl))) break;
			for (size_t k = 0; !rc && k < wl->n; k++) rc = bpe_cached(t, wl->v[k].s, wl->v[k].n, out);
		}
		arena_reset(t);
	}
	return rc;
}

int x3_tok_encode(x3_tok *t, const char *text, size_t len, int add_special, int32_t **ids, size_t *n)
{
	char *fixed = NULL;
	size_t fl;
	ivec out = { 0 };
	int rc;
	*ids = NULL;
	*n = 0;
	if (x3_utf8_valid_prefix(text, len) != len) {
		if ((rc = x3_utf8_lossy(text, len, &fixed, &fl))) return rc;
		text = fixed;
		len = fl;
	}
	if (add_special && (rc = iv_add(&out, t->tpl_pre.v, t->tpl_pre.n))) goto fail;
	if ((rc = encode_body(t, text, len, &out))) goto fail;
	if (add_special && (rc = iv_add(&out, t->tpl_post.v, t->tpl_post.n))) goto fail;
	if (!out.v && (rc = grow((void **)&out.v, &out.cap, 1, sizeof *out.v))) goto fail;
	free(fixed);
	*ids = out.v;
	*n = out.n;
	return X3_OK;
fail:
	free(fixed);
	free(out.v);
	return rc;
}

/* ---- decoding --------------------------------------------------------------------- */
typedef struct { sbuf *v; size_t n, cap; } tlist;

static int tl_push(tlist *l, const char *s, size_t n)
{
	int rc = grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v);
	if (rc) return rc;
	l->v[l->n] = (sbuf){ 0 };
	if ((rc = sb_add(&l->v[l->n], s, n))) return rc;
	l->n++;
	return X3_OK;
}
static void tl_free(tlist *l)
{
	for (size_t i = 0; i < l->n; i++) free(l->v[i].p);
	free(l->v);
	*l = (tlist){ 0 };
}
static int hexval(int c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	       c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}
/* "<0xNN>" -> NN, else -1 (u8::from_str_radix also takes "+N") */
static int byte_token(const sbuf *s)
{
	if (s->n != 6 || memcmp(s->p, "<0x", 3) || s->p[5] != '>') return -1;
	int a = hexval((unsigned char)s->p[3]), b = hexval((unsigned char)s->p[4]);
	if (s->p[3] == '+' && b >= 0) return b;
	return a >= 0 && b >= 0 ? a * 16 + b : -1;
}

static int dec_one(x3_tok *t, const dec_t *d, tlist *in, tlist *out)
{
	int rc = X3_OK;
	size_t i, j;
	sbuf acc = { 0 };
	switch (d->kind) {
	case D_REPLACE:
		for (i = 0; i < in->n; i++) {
			const char *s = in->v[i].p ? in->v[i].p : "";
			if ((rc = find_segs((pat_t *)&d->pat, s, in->v[i].n, &t->segs))) goto out;
			acc.n = 0;
			if ((rc = sb_add(&acc, "", 0))) goto out;
			for (j = 0; j < t->segs.n; j++) {
				seg_t g = t->segs.v[j];
				if ((rc = g.m ? sb_add(&acc, d->str, d->strn) : sb_add(&acc, s + g.a, g.b - g.a))) goto out;
			}
			if ((rc = tl_push(out, acc.p, acc.n))) goto out;
		}
		break;
	case D_BYTEFALLBACK:
		for (i = 0; i <= in->n; i++) {
			int b = i < in->n ? byte_token(&in->v[i]) : -1;
			if (b >= 0) {
				char c = (char)b;
				if ((rc = sb_add(&acc, &c, 1))) goto out;
				continue;
			}
			if (acc.n) {
				if (x3_utf8_valid_prefix(acc.p, acc.n) == acc.n) {
					if ((rc = tl_push(out, acc.p, acc.n))) goto out;
				} else {
					/* invalid UTF-8: one U+FFFD per byte */
					for (j = 0; j < acc.n; j++) if ((rc = tl_push(out, "\xEF\xBF\xBD", 3))) goto out;
				}
				acc.n = 0;
			}
			if (i < in->n && (rc = tl_push(out, in->v[i].p, in->v[i].n))) goto out;
		}
		break;
	case D_FUSE:
		if ((rc = sb_add(&acc, "", 0))) goto out;
		for (i = 0; i < in->n; i++) if ((rc = sb_add(&acc, in->v[i].p, in->v[i].n))) goto out;
		rc = tl_push(out, acc.p, acc.n);
		break;
	case D_STRIP:
		for (i = 0; i < in->n; i++) {
			const char *s = in->v[i].p;
			size_t a = 0, b = in->v[i].n;
			for (int k = 0; k < d->start && b - a >= d->chn && !memcmp(s + a, d->ch, d->chn); k++) a += d->chn;
			for (int k = 0; k < d->stop && b - a >= d->chn && !memcmp(s + b - d->chn, d->ch, d->chn); k++) b -= d->chn;
			if ((rc = tl_push(out, s + a, b - a))) goto out;
		}
		break;
	case D_METASPACE:
		for (i = 0; i < in->n; i++) {
			const char *s = in->v[i].p;
			size_t n = in->v[i].n;
			acc.n = 0;
			if ((rc = sb_add(&acc, "", 0))) goto out;
			for (j = 0; j < n;) {
				if (n - j >= d->repln && !memcmp(s + j, d->repl, d->repln)) {
					if (!(i == 0 && d->scheme != SCHEME_NEVER) && (rc = sb_add(&acc, " ", 1))) goto out;
					j += d->repln;
				} else {
					size_t l = x3_utf8_len((unsigned char)s[j]);
					if ((rc = sb_add(&acc, s + j, l))) goto out;
					j += l;
				}
			}
			if ((rc = tl_push(out, acc.p, acc.n))) goto out;
		}
		break;
	case D_BYTELEVEL: {
		if ((rc = sb_add(&acc, "", 0))) goto out;
		for (i = 0; i < in->n; i++) {
			const char *s = in->v[i].p;
			size_t n = in->v[i].n, start = acc.n, q = 0;
			int ok = 1;
			while (q < n) {
				uint32_t c = x3_utf8_next(s, &q);
				if (c >= 324 || t->u2b[c] < 0) { ok = 0; break; }
				char by = (char)t->u2b[c];
				if ((rc = sb_add(&acc, &by, 1))) goto out;
			}
			if (!ok) { acc.n = start; if ((rc = sb_add(&acc, s, n))) goto out; }
		}
		char *fx;
		size_t fn;
		if ((rc = x3_utf8_lossy(acc.p, acc.n, &fx, &fn))) goto out;
		rc = tl_push(out, fx, fn);
		free(fx);
		break;
	}
	}
out:
	free(acc.p);
	return rc;
}

int x3_tok_decode(x3_tok *t, const int32_t *ids, size_t n, int skip_special, char **text, size_t *len)
{
	tlist a = { 0 }, b = { 0 };
	sbuf res = { 0 };
	int rc = X3_OK;
	*text = NULL;
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if (id < 0 || (size_t)id >= t->nid || !t->piece[id]) {
			rc = x3_err(X3_EINVAL, "token id %d is not in the vocabulary (size %zu)", (int)id, t->nid);
			goto out;
		}
		if (skip_special && t->special[id]) continue;
		if ((rc = tl_push(&a, t->piece[id], t->plen[id]))) goto out;
	}
	if (t->has_decoder) {
		for (size_t k = 0; k < t->ndec; k++) {
			if ((rc = dec_one(t, &t->dec[k], &a, &b))) goto out;
			tl_free(&a);
			a = b;
			b = (tlist){ 0 };
		}
	}
	if ((rc = sb_add(&res, "", 0))) goto out;
	for (size_t i = 0; i < a.n; i++) {
		if (!t->has_decoder && i && (rc = sb_add(&res, " ", 1))) goto out;
		if ((rc = sb_add(&res, a.v[i].p, a.v[i].n))) goto out;
	}
	*text = res.p;
	if (len) *len = res.n;
	res.p = NULL;
out:
	free(res.p);
	tl_free(&a);
	tl_free(&b);
	return rc;
}

/* ---- documents and rows -------------------------------------------------------------- */
static int blank(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n' && s[i] != '\f' && s[i] != '\v') return 0;
	return 1;
}

int x3_tok_split_docs(const char *text, size_t len, enum x3_tok_split mode, size_t **off, size_t **lens, size_t *n)
{
	size_t cap = 0, k = 0, *o = NULL, *l = NULL, capl = 0;
	int rc = X3_OK;
	*off = *lens = NULL;
	*n = 0;
#define PUSHDOC(a, b) do { \
		if (!blank(text + (a), (b) - (a))) { \
			if ((rc = grow((void **)&o, &cap, k + 1, sizeof *o)) || \
			    (rc = grow((void **)&l, &capl, k + 1, sizeof *l))) goto fail; \
			o[k] = (a); l[k] = (b) - (a); k++; \
		} } while (0)
	if (mode == X3_SPLIT_WHOLE) {
		PUSHDOC(0, len);
	} else if (mode == X3_SPLIT_LINES || mode == X3_SPLIT_BLANK) {
		size_t i = 0, start = 0, last = 0;   /* BLANK: paragraph [start, last) */
		int inpar = 0;
		while (i < len) {
			const char *nl = memchr(text + i, '\n', len - i);
			size_t e = nl ? (size_t)(nl - text) : len, ce = e;
			if (ce > i && text[ce - 1] == '\r') ce--;
			if (mode == X3_SPLIT_LINES) PUSHDOC(i, ce);
			else if (blank(text + i, ce - i)) {
				if (inpar) PUSHDOC(start, last);
				inpar = 0;
			} else {
				if (!inpar) start = i;
				inpar = 1;
				last = ce;
			}
			i = nl ? e + 1 : len;
		}
		if (mode == X3_SPLIT_BLANK && inpar) PUSHDOC(start, last);
	} else
		return x3_err(X3_EINVAL, "unknown document split mode %d", (int)mode);
#undef PUSHDOC
	if (!o && ((rc = grow((void **)&o, &cap, 1, sizeof *o)) || (rc = grow((void **)&l, &capl, 1, sizeof *l)))) goto fail;
	*off = o;
	*lens = l;
	*n = k;
	return X3_OK;
fail:
	free(o);
	free(l);
	return rc;
}

void x3_tok_pack_defaults(const x3_tok *t, struct x3_tok_pack_opts *o)
{
	memset(o, 0, sizeof *o);
	o->mode = X3_PACK_ARTICLES;
	o->bos = 1;
	o->pad_id = t->eos >= 0 ? t->eos : 0;
}

int x3_tok_pack_rows(x3_tok *t, const char *const *docs, const size_t *lens, size_t ndocs, size_t rows, size_t cols,
                     const struct x3_tok_pack_opts *o, int32_t **out, size_t *rows_out)
{
	*out = NULL;
	*rows_out = 0;
	if (!rows || !cols) return x3_err(X3_EINVAL, "rows and cols must be positive");
	if (rows > SIZE_MAX / sizeof(int32_t) / cols) return x3_err(X3_ENOMEM, "%zu x %zu tokens: too large", rows, cols);
	if (o->mode != X3_PACK_ARTICLES && o->mode != X3_PACK_STREAM)
		return x3_err(X3_EINVAL, "unknown packing mode %d", (int)o->mode);
	int32_t *m = malloc(rows * cols * sizeof *m);
	if (!m) return x3_err(X3_ENOMEM, "out of memory for %zu x %zu tokens", rows, cols);
	size_t r = 0, c = 0;
	int rc = X3_OK;
	for (size_t d = 0; d < ndocs && r < rows; d++) {
		int even = r % 2 == 0;
		int bos = (o->even_odd ? even : o->bos) && t->bos >= 0;
		int eos = (o->even_odd ? even : o->eos) && t->eos >= 0;
		int32_t *ids;
		size_t n;
		if ((rc = x3_tok_encode(t, docs[d], lens[d], 0, &ids, &n))) { free(m); return x3_errprefix(rc, "document %zu", d); }
		size_t total = n + (size_t)bos + (size_t)eos;
		for (size_t i = 0; i < total && r < rows; i++) {
			int32_t id = i == 0 && bos ? t->bos : (eos && i == total - 1) ? t->eos : ids[i - (size_t)bos];
			m[r * cols + c] = id;
			if (++c == cols) {
				c = 0;
				r++;
				if (o->mode == X3_PACK_ARTICLES) break;   /* the rest of this document is dropped */
			}
		}
		free(ids);
	}
	if (c > 0 && r < rows) {
		if (o->keep_partial) {
			for (; c < cols; c++) m[r * cols + c] = o->pad_id;
			r++;
		}
	}
	*out = m;
	*rows_out = r;
	return X3_OK;
}

int x3_tok_pack_text(x3_tok *t, const char *text, size_t len, enum x3_tok_split split, size_t rows, size_t cols,
                     const struct x3_tok_pack_opts *o, int32_t **out, size_t *rows_out)
{
	size_t *off, *lens, n;
	int rc = x3_tok_split_docs(text, len, split, &off, &lens, &n);
	if (rc) return rc;
	const char **docs = malloc((n ? n : 1) * sizeof *docs);
	if (!docs) { free(off); free(lens); return x3_err(X3_ENOMEM, "out of memory"); }
	for (size_t i = 0; i < n; i++) docs[i] = text + off[i];
	rc = x3_tok_pack_rows(t, docs, lens, n, rows, cols, o, out, rows_out);
	free(docs);
	free(off);
	free(lens);
	return rc;
}
