/* t1582: the experts' Hessians of moe_fallback.h against hand computations:
 * weighted rows (Σ w² xᵀx and Σ w²), the fallback H_routed + s (m - n)/T ·
 * H_all with count m (routed, weighted with rows and without), its errors,
 * a group's finish and metadata in each --moe-capture mode and in a part,
 * and the merge of two parts' groups equal, bit for bit, to the group of
 * one process over both chunks. */
#include <math.h>
#include <string.h>
#include "test.h"
#include "synth.h"
#include "moe_fallback.h"

enum { N = 3 };

/* the all-token rows (T = 2): H_all = [[1,0,2],[0,1,1],[2,1,5]] */
static const float X_ALL[] = { 1, 0, 2, 0, 1, 1 };
static const double H_ALL[] = { 1, 0, 2, 0, 1, 1, 2, 1, 5 };
/* one routed row: H_r = [[1,1,0],[1,1,0],[0,0,0]] */
static const float X_R[] = { 1, 1, 0 };

static x3_hess *hess(const char *name, const float *x, int64_t rows, int f64)
{
	x3_hess *h;
	if (x3_hess_new(name, N, f64, NULL, 0, &h))
		return NULL;
	if (rows && x3_hess_add_rows(h, x, rows, N)) {
		x3_hess_free(h);
		return NULL;
	}
	return h;
}

/* h's frame (F64) equal to want (to tol, 0: exactly), count c */
static int is(const x3_hess *h, const double *want, double tol, int64_t c)
{
	x3_tensor *t = x3_hess_frame(h, X3_F64);
	int ok = t && x3_hess_count(h) == c;
	for (int i = 0; ok && i < N * N; i++)
		ok = fabs(((double *)t->data)[i] - want[i]) <= tol;
	if (!ok && t)
		for (int i = 0; i < N * N; i++)
			printf("#   [%d] %.17g want %.17g\n", i, ((double *)t->data)[i], want[i]);
	x3_tensor_free(t);
	return ok;
}

static int meta_is(const x3_hess *h, const char *key, const char *want)
{
	const char *v = x3_hess_get_meta(h, key);
	if (!want)
		return !v;
	return v && !strcmp(v, want);
}

static void names(void)
{
	int ok = 1;
	for (int i = 0; i < X3_MOE_NCAPTURE; i++)
		ok &= x3_moe_capture_parse(x3_moe_capture_name(i)) == i;
	CHECK(ok && !strcmp(x3_moe_capture_name(X3_MOE_WEIGHTED), "weighted") &&
	      x3_moe_capture_parse("mean") == -1 && !x3_moe_capture_name(X3_MOE_NCAPTURE),
	      "capture modes: routed, weighted, all, and no other");
}

/* Σ w² xᵀx against a plain double loop; Σ w² added to what was there */
static void weighted_rows(void)
{
	enum { R = 37, K = 11 };
	x3_rng g;
	x3_rng_seed(&g, 1582, 1);
	float *x = test_randn(&g, R * K, 1.0), *w = test_randn(&g, R, 0.5);
	x3_hess *h;
	double w2 = 0.5, ref2 = 0.5, ref[K * K] = { 0 };
	CHECK_OK(x3_hess_new("e", K, 1, NULL, 0, &h), "weighted: accumulator");
	CHECK_OK(x3_moe_add_weighted(h, x, w, R, K, &w2), "weighted: rows added");
	for (int r = 0; r < R; r++) {
		ref2 += (double)w[r] * w[r];
		for (int i = 0; i < K; i++)
			for (int j = 0; j < K; j++)
				ref[i * K + j] += (double)(w[r] * x[r * K + i]) * (double)(w[r] * x[r * K + j]);
	}
	x3_tensor *t = x3_hess_frame(h, X3_F64);
	double err = 0;
	for (int i = 0; t && i < K * K; i++)
		err = fmax(err, fabs(((double *)t->data)[i] - ref[i]));
	CHECK(t && err < 1e-12 && x3_hess_count(h) == R, "weighted: H = Σ (w x)ᵀ(w x) (max error %.3g), "
	      "count %d", err, R);
	CHECK(w2 == ref2, "weighted: Σ w² added in row order (%.17g)", w2);
	x3_tensor_free(t);
	x3_hess_free(h);
	free(x);
	free(w);
}

static void blend(void)
{
	int64_t fb = -1;
	x3_hess *all = hess("all", X_ALL, 2, 1), *h = hess("e", X_R, 1, 1);
	/* routed, n = 1 < m = 5: H_r + (5 - 1)/2 H_all */
	static const double want_r[] = { 3, 1, 4, 1, 3, 2, 4, 2, 10 };
	CHECK_OK(x3_moe_blend(h, all, 0, 1, 5, 0, 0, 2, 1, &fb), "routed blend");
	CHECK(fb == 4 && is(h, want_r, 0, 5), "routed: H_r + 4/2 H_all = [[3,1,4],[1,3,2],[4,2,10]], "
	      "count 5, 4 fallback rows");
	x3_hess_free(h);

	/* weighted, one row of w = 0.5: s = Σw²/n = 0.25; H = 0.25 H_r + 0.25 * 4/2 H_all */
	static const double want_w[] = { 0.75, 0.25, 1, 0.25, 0.75, 0.5, 1, 0.5, 2.5 };
	const float w = 0.5f;
	double w2 = 0;
	h = hess("e", NULL, 0, 1);
	CHECK_OK(x3_moe_add_weighted(h, X_R, &w, 1, N, &w2), "weighted row");
	CHECK_OK(x3_moe_blend(h, all, 0, 1, 5, 1, w2, 2, 1, &fb), "weighted blend");
	CHECK(fb == 4 && is(h, want_w, 0, 5), "weighted: at the mean w² 0.25: "
	      "[[.75,.25,1],[.25,.75,.5],[1,.5,2.5]], count 5");
	x3_hess_free(h);

	/* weighted, no rows, top 2: s = 1/k² = 1/4, m = 4: 1/4 * 4/2 H_all */
	double half[N * N];
	for (int i = 0; i < N * N; i++)
		half[i] = 0.5 * H_ALL[i];
	h = hess("e", NULL, 0, 1);
	CHECK_OK(x3_moe_blend(h, all, 0, 0, 4, 1, 0, 2, 1, &fb), "weighted blend without rows");
	CHECK(fb == 4 && is(h, half, 0, 4), "weighted without rows: 1/k² 4/2 H_all = H_all/2, count 4");
	x3_hess_free(h);

	/* F32: the all-token Hessian taken at F32 (rounded), not F64 */
	x3_hess *a3;
	static const float x3r[] = { 0.1f, 0.2f, 0.3f };
	CHECK_OK(x3_hess_new("all", N, 1, NULL, 0, &a3) || x3_hess_add_rows(a3, x3r, 1, N),
	         "F32: an all-token Hessian of one row");
	h = hess("e", NULL, 0, 1);
	CHECK_OK(x3_moe_blend(h, a3, 0, 0, 3, 0, 0, 2, 0, &fb), "F32 blend");
	x3_tensor *t = x3_hess_frame(h, X3_F64);
	double v = (double)(float)((double)x3r[0] * x3r[1]) * 3;
	CHECK(t && ((double *)t->data)[1] == v, "F32: 3 x the F32-rounded H_all (%.17g, want %.17g)",
	      t ? ((double *)t->data)[1] : 0, v);
	x3_tensor_free(t);
	x3_hess_free(h);
	x3_hess_free(a3);

	/* no all-token Hessian: nothing with rows, an error without */
	h = hess("e", X_R, 1, 1);
	static const double h_r[] = { 1, 1, 0, 1, 1, 0, 0, 0, 0 };
	int rc = x3_moe_blend(h, NULL, 0, 1, 5, 0, 0, 2, 1, &fb);
	CHECK(rc == X3_OK && fb == 0 && is(h, h_r, 0, 1),
	      "no all-token Hessian, 1 row: no fallback, H_r as it was");
	x3_hess_free(h);
	h = hess("model.e7", NULL, 0, 1);
	rc = x3_moe_blend(h, NULL, 7, 0, 5, 0, 0, 2, 1, &fb);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "'model.e7': expert 7 got no tokens"),
	      "no rows, no all-token Hessian: an error naming the group and expert (%s)", x3_errmsg());
	x3_hess_free(h);
	x3_hess_free(all);
}

static void finish(void)
{
	x3_hess *all = hess("all", X_ALL, 2, 1), *h;
	int64_t fb;
	struct x3_moe_group g = { 3, 1, 0 };
	h = hess("e", NULL, 0, 1);
	CHECK_OK(x3_moe_group_finish(h, all, &g, X3_MOE_ALL, 5, 2, 1, 0, &fb), "all: finish");
	CHECK(fb == 0 && is(h, H_ALL, 0, 2) && meta_is(h, "capture", "all") &&
	      meta_is(h, "expert", "3") && meta_is(h, "routed_tokens", "1") &&
	      meta_is(h, "expert_fallback", "0") && meta_is(h, "fallback_tokens", NULL),
	      "all: H_all, count T, capture=all expert=3 routed_tokens=1 expert_fallback=0");
	x3_hess_free(h);
	h = hess("e", NULL, 0, 1);
	int rc = x3_moe_group_finish(h, NULL, &g, X3_MOE_ALL, 5, 2, 1, 0, &fb);
	CHECK(rc == X3_EFORMAT, "all: no all-token Hessian is an error");
	x3_hess_free(h);

	static const double want_r[] = { 3, 1, 4, 1, 3, 2, 4, 2, 10 };
	h = hess("e", X_R, 1, 1);
	CHECK_OK(x3_moe_group_finish(h, all, &g, X3_MOE_ROUTED, 5, 2, 1, 0, &fb), "routed: finish");
	CHECK(fb == 4 && is(h, want_r, 0, 5) && meta_is(h, "capture", "routed") &&
	      meta_is(h, "expert_fallback", "1") && meta_is(h, "fallback_tokens", "4") &&
	      meta_is(h, "min_tokens", NULL), "routed below m: blended, expert_fallback=1 "
	      "fallback_tokens=4, no part metadata");
	x3_hess_free(h);
	static const double h_r[] = { 1, 1, 0, 1, 1, 0, 0, 0, 0 };
	h = hess("e", X_R, 1, 1);
	CHECK_OK(x3_moe_group_finish(h, all, &g, X3_MOE_ROUTED, 1, 2, 1, 0, &fb), "routed at m");
	CHECK(fb == 0 && is(h, h_r, 0, 1) && meta_is(h, "expert_fallback", "0"),
	      "routed at m: H_r, expert_fallback=0");
	x3_hess_free(h);

	/* a part: raw sums, the merge's metadata */
	struct x3_moe_group gw = { 3, 1, 0.25 };
	h = hess("e", X_R, 1, 1);
	CHECK_OK(x3_moe_group_finish(h, all, &gw, X3_MOE_WEIGHTED, 5, 2, 1, 1, &fb), "part: finish");
	CHECK(fb == 0 && is(h, h_r, 0, 1) && meta_is(h, "capture", "weighted") &&
	      meta_is(h, "routed_w2", "0x1p-2") && meta_is(h, "min_tokens", "5") &&
	      meta_is(h, "top_k", "2") && meta_is(h, "all_tokens", "all") &&
	      meta_is(h, "expert_fallback", NULL),
	      "part: no blend; routed_w2=0x1p-2 min_tokens=5 top_k=2 all_tokens=all");
	x3_hess_free(h);
	x3_hess_free(all);
}

/* A group (routed or weighted) over two chunks of rows: in one process
 * (chunks ended in order, then the finish) and as two parts merged (part
 * frames added in chunk order, metadata merged, then the merged blend):
 * the same frame, bit for bit, F32 and F64. */
static void merged(int mode, int f64)
{
	enum { K = 9, R0 = 5, R1 = 3, T = 6 };
	x3_rng g;
	x3_rng_seed(&g, 1582, (uint64_t)(2 * mode + f64));
	float *x = test_randn(&g, (R0 + R1) * K, 1.0), *w = test_randn(&g, R0 + R1, 0.7);
	float *xa = test_randn(&g, T * K, 1.0);
	x3_hess *all, *one, *p[2], *m;
	int rc = x3_hess_new("all", K, f64, NULL, 0, &all) || x3_hess_add_rows(all, xa, T, K);
	rc |= x3_hess_new("e", K, f64, NULL, 0, &one);
	struct x3_moe_group g1 = { 1, R0 + R1, 0 }, gp[2] = { { 1, R0, 0 }, { 1, R1, 0 } };
	int64_t fb, fb1, m_t = 20;
	for (int c = 0; c < 2; c++) {
		const float *xc = x + (c ? R0 * K : 0), *wc = w + (c ? R0 : 0);
		int64_t r = c ? R1 : R0;
		double w2c = 0;
		rc |= x3_hess_new("e", K, f64, NULL, 0, &p[c]);
		if (mode == X3_MOE_WEIGHTED) {
			rc |= x3_moe_add_weighted(one, xc, wc, r, K, &w2c);
			g1.w2 += w2c;
			w2c = 0;
			rc |= x3_moe_add_weighted(p[c], xc, wc, r, K, &w2c);
			gp[c].w2 = w2c;
		} else {
			rc |= x3_hess_add_rows(one, xc, r, K) || x3_hess_add_rows(p[c], xc, r, K);
		}
		rc |= x3_hess_end_chunk(one);
		/* the all-token Hessian is part 0's */
		rc |= x3_moe_group_finish(p[c], c ? NULL : all, &gp[c], mode, m_t, 2, f64, 1, &fb);
	}
	rc |= x3_moe_group_finish(one, all, &g1, mode, m_t, 2, f64, 0, &fb1);
	CHECK(!rc && fb1 == m_t - R0 - R1, "%s %s: one process blended, %lld fallback rows",
	      x3_moe_capture_name(mode), f64 ? "F64" : "F32", (long long)fb1);
	/* the merge: part 0's metadata, its sums, then part 1's */
	x3_tensor *t0 = x3_hess_frame(p[0], X3_F64), *t1 = x3_hess_frame(p[1], X3_F64);
	rc = x3_hess_new("e", K, 1, NULL, 0, &m);
	for (int j = 0; !rc && j < t0->nmeta; j++)
		if (!x3_hess_meta_is_computed(t0->meta[j].key))
			rc = x3_hess_set_meta(m, t0->meta[j].key, t0->meta[j].val);
	rc |= x3_hess_add_frame(m, t0) || x3_moe_merge_meta(m, t1) || x3_hess_add_frame(m, t1);
	CHECK(!rc && meta_is(m, "routed_tokens", "8"), "%s %s: merged routed_tokens 5 + 3",
	      x3_moe_capture_name(mode), f64 ? "F64" : "F32");
	struct x3_moe_group gm;
	int64_t mm;
	CHECK_OK(x3_moe_merged_blend(m, "all", all, f64, &gm, &mm, &fb), "merged blend");
	CHECK(fb == fb1 && mm == m_t && gm.expert == 1 && gm.routed == R0 + R1 &&
	      gm.w2 == g1.w2 && meta_is(m, "expert_fallback", "1") &&
	      meta_is(m, "fallback_tokens", "12"), "%s %s: merged: expert 1, 8 routed, Σ w² of "
	      "both, 12 fallback rows", x3_moe_capture_name(mode), f64 ? "F64" : "F32");
	x3_dtype dt = f64 ? X3_F64 : X3_F32;
	x3_tensor *a = x3_hess_frame(one, dt), *b = x3_hess_frame(m, dt);
	CHECK(a && b && a->nbytes == b->nbytes && !memcmp(a->data, b->data, a->nbytes) &&
	      x3_hess_count(one) == x3_hess_count(m), "%s %s: merged parts == one process, bit for bit",
	      x3_moe_capture_name(mode), f64 ? "F64" : "F32");
	x3_tensor_free(a);
	x3_tensor_free(b);
	x3_tensor_free(t0);
	x3_tensor_free(t1);
	for (int c = 0; c < 2; c++)
		x3_hess_free(p[c]);
	x3_hess_free(m);
	x3_hess_free(one);
	x3_hess_free(all);
	free(x);
	free(w);
	free(xa);

	/* a group without min_tokens (a dense one, a whole capture's) is left */
	x3_hess *d;
	if (mode == X3_MOE_ROUTED && !f64 && !x3_hess_new("d", 2, 1, NULL, 0, &d)) {
		rc = x3_moe_merged_blend(d, NULL, NULL, 0, &gm, &mm, &fb);
		CHECK(rc == X3_OK && fb == -1 && meta_is(d, "expert_fallback", NULL),
		      "no min_tokens: not a part's expert group, left");
		x3_hess_free(d);
	}
}

int main(void)
{
	names();
	weighted_rows();
	blend();
	finish();
	for (int f64 = 0; f64 < 2; f64++) {
		merged(X3_MOE_ROUTED, f64);
		merged(X3_MOE_WEIGHTED, f64);
	}
	/* the merged blend without the all-token frame its group names */
	x3_hess *h;
	struct x3_moe_group gm;
	int64_t mm, fb;
	if (!x3_hess_new("e", N, 1, NULL, 0, &h) && !x3_hess_set_meta(h, "min_tokens", "5") &&
	    !x3_hess_set_meta(h, "expert", "2") && !x3_hess_set_meta(h, "routed_tokens", "1")) {
		int rc = x3_moe_merged_blend(h, "all", NULL, 1, &gm, &mm, &fb);
		CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "no part carries the all-token Hessian 'all'"),
		      "merged blend: the all-token frame named but not carried is an error (%s)",
		      x3_errmsg());
		x3_hess_free(h);
	}
	TEST_DONE();
}
