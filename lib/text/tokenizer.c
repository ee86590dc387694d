/* tokenizer.c: Hugging Face tokenizer.json BPE tokenizer (see tokenizer.h):
 * loading tokenizer.json and the configs beside it into struct x3_tok.
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
 * Decoding maps ids to token strings and runs the decoder chain.
 * The steps are in tok_pretok.c (1-3), tok_encode.c (4, 5) and
 * tok_decode.c; tok_rows.c splits documents and packs rows. */
#include <stdlib.h>
#include <string.h>
#include "tok_impl.h"

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
		return tok_pat_literal(t, p, s, n, what);
	if (json_is_object(pj) && (s = jstr(pj, "Regex", &n)))
		return tok_pat_regex(t, p, s, n, what);
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
		    (rc = tok_pat_regex(t, &t->gpt2, GPT2_RE, sizeof GPT2_RE - 1, "pre_tokenizer ByteLevel")))
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
		if (jbool(o, "individual_digits", 0)) rc = tok_pat_regex(t, &p->pat, "\\p{N}", 5, "pre_tokenizer Digits");
		else rc = tok_pat_regex(t, &p->pat, "\\p{N}+", 6, "pre_tokenizer Digits");
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
			if ((rc = tok_normalize(t, d->s, d->n, &ns, &nn))) return rc;
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
	if ((rc = tok_pat_regex(t, &t->alnum, ALNUM_RE, sizeof ALNUM_RE - 1, "single_word"))) goto fail;
	/* GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for
	 * themselves, the others get 256, 257, ... in byte order */
	for (int b = 0, k = 0; b < 256; b++)
		t->b2u[b] = ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) ? (uint32_t)b : (uint32_t)(256 + k++);
	for (int c = 0; c < 324; c++) t->u2b[c] = -1;
	for (int b = 0; b < 256; b++) t->u2b[t->b2u[b]] = (int16_t)b;
	t->sp_cut = !t->bytelevel && tok_meta_cut_ok(t);
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
	for (i = 0; i < t->nnorm; i++) { tok_pat_free(&t->norm[i].pat); free(t->norm[i].str); }
	free(t->norm);
	for (i = 0; i < t->npre; i++) tok_pat_free(&t->pre[i].pat);
	free(t->pre);
	for (i = 0; i < t->ndec; i++) { tok_pat_free(&t->dec[i].pat); free(t->dec[i].str); }
	free(t->dec);
	free(t->tpl_pre.v); free(t->tpl_post.v);
	tok_pat_free(&t->gpt2); tok_pat_free(&t->alnum);
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
