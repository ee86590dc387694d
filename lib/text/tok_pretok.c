/* tok_pretok.c: the tokenizer's steps before BPE (tokenizer.c lists the
 * pipeline): added tokens split out of a text, the normalizers, the
 * pre-tokenizers cutting pieces into words, and the arena their
 * transformed pieces live in. */
#include <stdlib.h>
#include <string.h>
#include "tok_impl.h"

/* ---- arena for transformed pieces ----------------------------------------- */
char *tok_arena_alloc(x3_tok *t, size_t n)
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
void tok_arena_reset(x3_tok *t)
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

/* ---- added tokens, normalizers, pre-tokenizers ---------------------------------- */
static int ends_with_word(x3_tok *t, const char *s, size_t end)
{
	size_t i = end;
	if (!i) return 0;
	do i--; while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
	size_t ms, me;
	return tok_pat_find(&t->alnum, s, end, i, &ms, &me) == 1 && ms == i;
}
static int starts_with_word(x3_tok *t, const char *s, size_t n)
{
	size_t ms, me;
	if (!n) return 0;
	size_t l = x3_utf8_len((unsigned char)s[0]);
	return tok_pat_find(&t->alnum, s, l, 0, &ms, &me) == 1;
}

/* Split s at the added tokens of group g (0: matched on the raw text,
 * 1: on the normalized text): leftmost-longest, non-overlapping, with
 * single_word, lstrip and rstrip as the reference applies them. */
int tok_added_split(x3_tok *t, int g, const char *s, size_t n, asegv *out)
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
int tok_normalize(x3_tok *t, const char *s, size_t n, const char **r, size_t *rn)
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
			if ((rc = tok_find_segs(&nm->pat, cur, cn, &t->segs))) return rc;
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
		if ((rc = tok_find_segs((pat_t *)&p->pat, q.s, q.n, &t->segs))) return rc;
		tok_apply_behavior(&t->segs, p->behavior, p->invert);
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
		char *b = tok_arena_alloc(t, q.n + (sp + 1) * p->repln);
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
			char *b = tok_arena_alloc(t, q.n + 1);
			if (!b) return X3_ENOMEM;
			b[0] = ' ';
			memcpy(b + 1, q.s, q.n);
			r.s = b;
			r.n = q.n + 1;
		}
		size_t nseg = 1;
		if (p->use_regex) {
			if ((rc = tok_find_segs(&t->gpt2, r.s, r.n, &t->segs))) return rc;
			nseg = t->segs.n;
		}
		for (j = 0; j < nseg; j++) {
			size_t a = p->use_regex ? t->segs.v[j].a : 0, e = p->use_regex ? t->segs.v[j].b : r.n;
			if (a == e) continue;
			char *b = tok_arena_alloc(t, 2 * (e - a));
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

int tok_pretokenize(x3_tok *t, const char *s, size_t n, int first, wlist **res)
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
