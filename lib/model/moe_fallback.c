/* moe_fallback.c: experts' Hessians, their fallback below --min-tokens and
 * their metadata, in one process and over merged parts (moe_fallback.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "moe_fallback.h"

static const char *const capture_names[X3_MOE_NCAPTURE] = { "routed", "weighted", "all" };
const char *const x3_moe_part_keys[X3_MOE_NPART_KEYS] = { "routed_w2", "min_tokens", "top_k",
                                                          "all_tokens" };

const char *x3_moe_capture_name(int mode)
{
	return mode >= 0 && mode < X3_MOE_NCAPTURE ? capture_names[mode] : NULL;
}

int x3_moe_capture_parse(const char *s)
{
	for (int i = 0; i < X3_MOE_NCAPTURE; i++)
		if (!strcmp(s, capture_names[i]))
			return i;
	return -1;
}

int x3_moe_add_weighted(x3_hess *h, const float *x, const float *w, int64_t rows, int64_t n,
                        double *w2)
{
	float *xw = malloc((size_t)(rows * n) * sizeof *xw);
	if (!xw)
		return x3_err(X3_ENOMEM, "'%s': out of memory", x3_hess_name(h));
	for (int64_t r = 0; r < rows; r++)
		*w2 += (double)w[r] * w[r];
	for (int64_t r = 0; r < rows; r++)
		for (int64_t i = 0; i < n; i++)
			xw[r * n + i] = w[r] * x[r * n + i];
	int rc = x3_hess_add_rows(h, xw, rows, n);
	free(xw);
	return rc;
}

int x3_moe_blend(x3_hess *h, const x3_hess *all, int expert, int64_t n, int64_t m, int weighted,
                 double w2, int64_t top_k, int f64, int64_t *fallback)
{
	int64_t T = all ? x3_hess_count(all) : 0;
	const char *name = x3_hess_name(h);
	*fallback = 0;
	if (!T && !n)
		return x3_err(X3_EFORMAT, "'%s': expert %d got no tokens and there is no all-token "
		              "Hessian to fall back on", name, expert);
	if (!T)
		return X3_OK;
	x3_tensor *t = x3_hess_frame(all, f64 ? X3_F64 : X3_F32);
	if (!t)
		return x3_errprefix(X3_ENOMEM, "'%s'", name);
	double s = !weighted ? 1 : n ? w2 / (double)n : 1.0 / ((double)top_k * top_k);
	int rc = x3_hess_add_frame_w(h, t, s * (double)(m - n) / (double)T, m - n);
	x3_tensor_free(t);
	if (rc)
		return x3_errprefix(rc, "'%s'", name);
	*fallback = m - n;
	return X3_OK;
}

static int set_i64(x3_hess *h, const char *key, int64_t v)
{
	char s[32];
	snprintf(s, sizeof s, "%lld", (long long)v);
	return x3_hess_set_meta(h, key, s);
}

int x3_moe_group_finish(x3_hess *h, const x3_hess *all, const struct x3_moe_group *g, int mode,
                        int64_t m, int64_t top_k, int f64, int part, int64_t *fallback)
{
	const char *name = x3_hess_name(h);
	int64_t n = g->routed;
	int defer = part && mode != X3_MOE_ALL;
	int rc;
	*fallback = 0;
	if (mode == X3_MOE_ALL) {
		/* one process rounds the all-token sum once, at its output's
		 * precision; a part passes it on exact (F64), so that the merge
		 * adds the parts in chunk order and rounds once too */
		if (!all)
			return x3_err(X3_EFORMAT, "'%s': no all-token rows (expert %d)", name, g->expert);
		x3_tensor *t = x3_hess_frame(all, f64 || part ? X3_F64 : X3_F32);
		if (!t)
			return x3_errprefix(X3_ENOMEM, "'%s'", name);
		rc = x3_hess_add_frame(h, t);
		x3_tensor_free(t);
		if (rc)
			return x3_errprefix(rc, "'%s'", name);
	} else if (n < m && !defer &&
	           (rc = x3_moe_blend(h, all, g->expert, n, m, mode == X3_MOE_WEIGHTED, g->w2, top_k,
	                              f64, fallback))) {
		return rc;
	}
	int e = x3_hess_set_meta(h, "capture", capture_names[mode]);
	e |= set_i64(h, "expert", g->expert);
	e |= set_i64(h, "routed_tokens", n);
	if (defer) {
		char v[64];
		snprintf(v, sizeof v, "%a", g->w2);
		e |= x3_hess_set_meta(h, x3_moe_part_keys[0], v);
		e |= set_i64(h, x3_moe_part_keys[1], m);
		e |= set_i64(h, x3_moe_part_keys[2], top_k);
		if (all)
			e |= x3_hess_set_meta(h, x3_moe_part_keys[3], x3_hess_name(all));
	} else {
		e |= x3_hess_set_meta(h, "expert_fallback", *fallback ? "1" : "0");
		if (*fallback)
			e |= set_i64(h, "fallback_tokens", *fallback);
	}
	return e ? x3_errprefix(X3_ENOMEM, "'%s'", name) : X3_OK;
}

const char *x3_moe_part_differs(const x3_tensor *a, const x3_tensor *b)
{
	static const char *const keys[] = { "capture", "min_tokens", "top_k" };
	for (int i = 0; i < 3; i++) {
		const char *u = x3_meta_get(a, keys[i]), *v = x3_meta_get(b, keys[i]);
		if ((u || v) && (!u || !v || strcmp(u, v)))
			return keys[i];
	}
	return NULL;
}

int x3_moe_merge_meta(x3_hess *h, const x3_tensor *t)
{
	static const char *const sum[] = { "routed_tokens", "fallback_tokens" };
	for (int i = 0; i < 2; i++) {
		const char *a = x3_hess_get_meta(h, sum[i]), *b = x3_meta_get(t, sum[i]);
		if (b && set_i64(h, sum[i], (a ? atoll(a) : 0) + atoll(b)))
			return x3_errprefix(X3_ENOMEM, "'%s'", t->name);
	}
	const char *fb = x3_meta_get(t, "expert_fallback");
	if (fb && !strcmp(fb, "1") && x3_hess_set_meta(h, "expert_fallback", "1"))
		return x3_errprefix(X3_ENOMEM, "'%s'", t->name);
	/* Σ w² of the parts, in chunk order (exact: C99 hex) */
	const char *a = x3_hess_get_meta(h, "routed_w2"), *b = x3_meta_get(t, "routed_w2");
	if (a && b) {
		char v[64];
		snprintf(v, sizeof v, "%a", strtod(a, NULL) + strtod(b, NULL));
		if (x3_hess_set_meta(h, "routed_w2", v))
			return x3_errprefix(X3_ENOMEM, "'%s'", t->name);
	}
	return X3_OK;
}

int x3_moe_merged_blend(x3_hess *h, const char *all_name, const x3_hess *all, int f64,
                        struct x3_moe_group *g, int64_t *m, int64_t *fallback)
{
	const char *mt = x3_hess_get_meta(h, "min_tokens");
	*fallback = -1;
	if (!mt)
		return X3_OK;
	const char *cap = x3_hess_get_meta(h, "capture"), *w2 = x3_hess_get_meta(h, "routed_w2");
	const char *kk = x3_hess_get_meta(h, "top_k"), *ex = x3_hess_get_meta(h, "expert");
	const char *rt = x3_hess_get_meta(h, "routed_tokens");
	g->routed = rt ? atoll(rt) : 0;
	g->expert = ex ? atoi(ex) : -1;
	g->w2 = w2 ? strtod(w2, NULL) : 0;
	*m = atoll(mt);
	*fallback = 0;
	if (g->routed < *m) {
		if (all_name && !all)
			return x3_err(X3_EFORMAT, "'%s': expert %d fell short of %lld tokens, but no part "
			              "carries the all-token Hessian '%s' (part 0's, before the group: "
			              "parts of an older hessian-capture are captured again)",
			              x3_hess_name(h), g->expert, (long long)*m, all_name);
		int rc = x3_moe_blend(h, all, g->expert, g->routed, *m, cap && !strcmp(cap, "weighted"),
		                      g->w2, kk ? atoll(kk) : 1, f64, fallback);
		if (rc)
			return rc;
	}
	int e = x3_hess_set_meta(h, "expert_fallback", *fallback ? "1" : "0");
	if (*fallback)
		e |= set_i64(h, "fallback_tokens", *fallback);
	return e ? x3_errprefix(X3_ENOMEM, "'%s'", x3_hess_name(h)) : X3_OK;
}
