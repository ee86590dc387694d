/* tok_encode.c: the tokenizer's encoding: BPE of a word (merges by rank
 * through a heap, the word cache, byte fallback and unk), and
 * x3_tok_encode, which runs the whole pipeline (tokenizer.c lists it) and
 * the post-processor's template. */
#include <stdlib.h>
#include <string.h>
#include "tok_impl.h"

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

static int bpe_piece(x3_tok *t, const char *w, size_t n, ivec *out);

static void cache_clear(x3_tok *t)
{
	for (size_t i = 0; i < CACHE_SLOTS; i++) { free(t->cache[i].key); t->cache[i].key = NULL; }
	t->ncache = 0;
}

/* SentencePiece-style tokenizers run BPE on whole texts (no pre-tokenizer).
 * When no vocabulary token has a "▁" right after another character, no
 * merge can cross the place before such a "▁": the word is cut there and
 * the pieces, which repeat, go through the cache. Same result, much faster. */
#define META "\xE2\x96\x81"
int tok_meta_cut_ok(const x3_tok *t)
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

int tok_bpe_cached(x3_tok *t, const char *w, size_t n, ivec *out)
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

static int encode_body(x3_tok *t, const char *s, size_t n, ivec *out)
{
	int rc = tok_added_split(t, 0, s, n, &t->as1);
	for (size_t i = 0; !rc && i < t->as1.n; i++) {
		aseg g = t->as1.v[i];
		if (g.id >= 0) { rc = iv_push(out, g.id); continue; }
		const char *ns;
		size_t nn;
		if ((rc = tok_normalize(t, s + g.a, g.b - g.a, &ns, &nn))) break;
		if ((rc = tok_added_split(t, 1, ns, nn, &t->as2))) break;
		for (size_t j = 0; !rc && j < t->as2.n; j++) {
			aseg h = t->as2.v[j];
			if (h.id >= 0) { rc = iv_push(out, h.id); continue; }
			wlist *wl;
			if ((rc = tok_pretokenize(t, ns + h.a, h.b - h.a, g.a == 0 && h.a == 0, &wl))) break;
			for (size_t k = 0; !rc && k < wl->n; k++) rc = tok_bpe_cached(t, wl->v[k].s, wl->v[k].n, out);
		}
		tok_arena_reset(t);
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
