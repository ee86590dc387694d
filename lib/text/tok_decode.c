/* tok_decode.c: x3_tok_decode: ids to token strings, then the decoder
 * chain (Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel). */
#include <stdlib.h>
#include <string.h>
#include "tok_impl.h"

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
			if ((rc = tok_find_segs((pat_t *)&d->pat, s, in->v[i].n, &t->segs))) goto out;
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
