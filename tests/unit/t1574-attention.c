/* t1574: the forward's attention on BLAS products (lib/model/attention.c)
 * against the plain double reference synth_attn_ex (synth.c): grouped-query
 * heads, value heads of another width (MLA), sliding windows, soft-capped
 * scores, rows of fewer and more than X3_ATT_QB tokens; and the rule of
 * blas.h: the same bits on 1 and 2 threads, and a row's output the same
 * alone and among other rows. */
#include <math.h>
#include <stdint.h>
#include <omp.h>
#include "test.h"
#include "synth.h"
#include "attention.h"

struct cfg {
	int rows, cols, nq, nkv, hd, hdv, window;
	double scale, softcap;
	const char *what;
};

static float *randf(x3_rng *g, size_t n, double s)
{
	float *x = malloc(n * sizeof *x);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(s * x3_rng_normal(g));
	return x;
}

/* max |x3_attention - reference| over max |reference| */
static double rel_err(const struct cfg *c, const float *q, const float *k, const float *v,
                      const float *o)
{
	const int qd = c->nq * c->hd, kd = c->nkv * c->hd, vd = c->nkv * c->hdv, od = c->nq * c->hdv;
	double *qq = malloc(sizeof(double) * qd), *kk = malloc(sizeof(double) * (size_t)c->cols * kd);
	double *vv = malloc(sizeof(double) * (size_t)c->cols * vd), *a = malloc(sizeof(double) * od);
	double *sc = malloc(sizeof(double) * c->cols);
	double err = 0, mx = 0;
	for (int r = 0; r < c->rows; r++) {
		size_t t0 = (size_t)r * c->cols;
		for (size_t i = 0; i < (size_t)c->cols * kd; i++)
			kk[i] = k[t0 * kd + i];
		for (size_t i = 0; i < (size_t)c->cols * vd; i++)
			vv[i] = v[t0 * vd + i];
		for (int i = 0; i < c->cols; i++) {
			for (int e = 0; e < qd; e++)
				qq[e] = q[(t0 + i) * qd + e];
			int lo = c->window > 0 && i >= c->window ? i - c->window + 1 : 0;
			synth_attn_ex(a, qq, kk, vv, i + 1, lo, c->nq, c->nkv, c->hd, c->hdv, c->scale,
			              c->softcap, sc);
			for (int e = 0; e < od; e++) {
				err = fmax(err, fabs(a[e] - o[(t0 + i) * od + e]));
				mx = fmax(mx, fabs(a[e]));
			}
		}
	}
	free(qq), free(kk), free(vv), free(a), free(sc);
	return err / mx;
}

static int run(const struct cfg *c, const float *q, const float *k, const float *v, float *o,
               int rows)
{
	return x3_attention(q, k, v, o, rows, c->cols, c->nq, c->nkv, c->hd, c->hdv, (float)c->scale,
	                    c->window, (float)c->softcap);
}

int main(void)
{
	static const struct cfg cfgs[] = {
		{ 2, 150, 4, 2, 16, 16, 0, 0.25, 0, "GQA 4/2, 150 tokens" },
		{ 1, 200, 3, 3, 24, 8, 0, 0.2, 0, "value heads of 8, keys of 24 (MLA)" },
		{ 2, 130, 4, 1, 8, 8, 37, 0.35, 0, "sliding window 37" },
		{ 1, 100, 2, 2, 16, 16, 0, 1.0, 1.5, "soft-capped scores (cap 1.5)" },
		{ 3, 64, 2, 1, 32, 32, 0, 0.18, 0, "rows of exactly one query block" },
		{ 1, 1, 2, 2, 8, 8, 0, 0.35, 0, "one token" },
		{ 1, 90, 2, 2, 16, 16, 200, 0.25, 0, "window longer than the row" },
	};
	x3_rng g;
	x3_rng_seed(&g, 1574, 0);
	for (size_t ci = 0; ci < sizeof cfgs / sizeof *cfgs; ci++) {
		const struct cfg *c = &cfgs[ci];
		const size_t nt = (size_t)c->rows * c->cols;
		float *q = randf(&g, nt * c->nq * c->hd, 1.0);
		float *k = randf(&g, nt * c->nkv * c->hd, 1.0);
		float *v = randf(&g, nt * c->nkv * c->hdv, 1.0);
		const size_t on = nt * c->nq * c->hdv;
		float *o = malloc(on * sizeof *o), *o1 = malloc(on * sizeof *o1);
		CHECK_OK(run(c, q, k, v, o, c->rows), "%s: runs", c->what);
		double e = rel_err(c, q, k, v, o);
		CHECK(e < 2e-6, "%s: within 2e-6 of the double reference (%.2e)", c->what, e);
		/* the same bits on one thread */
		int nth = omp_get_max_threads();
		omp_set_num_threads(1);
		CHECK_OK(run(c, q, k, v, o1, c->rows), "%s: one thread", c->what);
		omp_set_num_threads(nth);
		CHECK(!memcmp(o, o1, on * sizeof *o), "%s: the same bits on 1 and %d threads", c->what,
		      nth);
		/* the last row alone: the same bits as among the others */
		const size_t r = (size_t)c->rows - 1, tq = (size_t)c->cols * c->nq;
		CHECK_OK(run(c, q + r * tq * c->hd, k + r * c->cols * c->nkv * c->hd,
		             v + r * c->cols * c->nkv * c->hdv, o1, 1), "%s: the last row alone", c->what);
		CHECK(!memcmp(o + r * tq * c->hdv, o1, tq * c->hdv * sizeof *o),
		      "%s: the last row alone gives the same bits", c->what);
		free(q), free(k), free(v), free(o), free(o1);
	}
	TEST_DONE();
}
