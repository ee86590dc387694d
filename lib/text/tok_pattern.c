/* tok_pattern.c: the tokenizer's search patterns (a literal string or a
 * PCRE2 regex, as tokenizer.json gives them): compiling, finding matches
 * and cutting a text by them with Split's behaviors (removed, isolated,
 * merged with the previous or the next piece, contiguous). */
#include <stdlib.h>
#include <string.h>
#include "tok_impl.h"

/* ---- patterns --------------------------------------------------------------- */
int tok_pat_regex(x3_tok *t, pat_t *p, const char *re, size_t n, const char *what)
{
	int e, rc;
	PCRE2_SIZE off;
	char *rw;
	size_t rwn;
	if ((rc = tok_uclass_rewrite(re, n, &rw, &rwn))) return rc;
	p->re = pcre2_compile((PCRE2_SPTR)rw, rwn, PCRE2_UTF | PCRE2_UCP, &e, &off, NULL);
	free(rw);
	if (!p->re) {
		PCRE2_UCHAR msg[160];
		pcre2_get_error_message(e, msg, sizeof msg);
		return x3_err(X3_EUNSUP, "%s: %s: regex /%.*s/: %s", t->label, what, (int)n, re, (char *)msg);
	}
	pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE);  /* falls back to the interpreter */
	p->md = pcre2_match_data_create_from_pattern(p->re, NULL);
	if (!p->md) return x3_err(X3_ENOMEM, "out of memory");
	return X3_OK;
}
int tok_pat_literal(x3_tok *t, pat_t *p, const char *s, size_t n, const char *what)
{
	if (!n) return x3_err(X3_EFORMAT, "%s: %s: empty pattern", t->label, what);
	p->lit = malloc(n + 1);
	if (!p->lit) return x3_err(X3_ENOMEM, "out of memory");
	memcpy(p->lit, s, n);
	p->lit[n] = 0;
	p->litn = n;
	return X3_OK;
}
void tok_pat_free(pat_t *p)
{
	free(p->lit);
	if (p->md) pcre2_match_data_free(p->md);
	if (p->re) pcre2_code_free(p->re);
}
/* First match at or after pos: 1 and [*ms, *me), 0 if none, <0 error. */
int tok_pat_find(pat_t *p, const char *s, size_t n, size_t pos, size_t *ms, size_t *me)
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
int tok_find_segs(pat_t *p, const char *s, size_t n, segv *out)
{
	int rc;
	out->n = 0;
	size_t prev = 0, pos = 0, ms, me;
	while (pos <= n) {
		int f = tok_pat_find(p, s, n, pos, &ms, &me);
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
void tok_apply_behavior(segv *sg, int behavior, int invert)
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
