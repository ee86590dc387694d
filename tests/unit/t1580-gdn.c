/* t1580: the Gated DeltaNet (lib/model/gdn.c). The first two tokens of a
 * row worked out by hand (the conv's taps, the L2 norms, beta and g, one
 * delta-rule step, the gated norm) against the token-by-token reference;
 * the chunked SGEMM form against the reference over rows longer than a
 * chunk and not a multiple of it, value heads sharing key heads; blas.h's
 * rule (the same bits on 1 and 2 threads, a row alone or among others);
 * Qwen3-Next's per-key-head grouping of in_proj_qkvz / in_proj_ba. The
 * tolerances are relative to the output's size and far above F32
 * rounding, so no BLAS kernel decides them. */
#include <math.h>
#include <stdint.h>
#include <omp.h>
#include "test.h"
#include "gdn.h"

static float *randf(x3_rng *g, size_t n, double s, double m)
{
	float *x = malloc(n * sizeof *x);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(m + s * x3_rng_normal(g));
	return x;
}

struct inputs {
	x3_gdn_shape s;
	float *mixed, *z, *b, *a, *conv, *alog, *dtb, *norm;
	x3_gdn_weights w;
};

static void make(struct inputs *in, x3_rng *g, int64_t ntok)
{
	const x3_gdn_shape *s = &in->s;
	const int64_t cd = x3_gdn_conv_dim(s), vd = s->nv * s->dv;
	in->mixed = randf(g, (size_t)(ntok * cd), 1, 0);
	in->z = randf(g, (size_t)(ntok * vd), 1, 0);
	in->b = randf(g, (size_t)(ntok * s->nv), 1.5, 0.5);
	in->a = randf(g, (size_t)(ntok * s->nv), 1, -1);
	in->conv = randf(g, (size_t)(cd * s->kconv), 0.5, 0);
	in->alog = randf(g, (size_t)s->nv, 0.5, 0);
	in->dtb = randf(g, (size_t)s->nv, 0.5, 0);
	in->norm = randf(g, (size_t)s->dv, 0.3, 1);
	in->w = (x3_gdn_weights){ in->conv, in->alog, in->dtb, in->norm };
}

static void drop(struct inputs *in)
{
	free(in->mixed), free(in->z), free(in->b), free(in->a), free(in->conv), free(in->alog);
	free(in->dtb), free(in->norm);
}

static double silu(double x) { return x / (1 + exp(-x)); }

/* Token t (0 or 1) of value head h of a row's first two tokens, by hand. */
static void by_hand(const struct inputs *in, int64_t h, int t, double *out)
{
	const x3_gdn_shape *s = &in->s;
	const int64_t cd = x3_gdn_conv_dim(s), kd = s->nk * s->dk, vd = s->nv * s->dv, K = s->kconv;
	const int64_t kh = h / (s->nv / s->nk), dk = s->dk, dv = s->dv;
	double q[2][64], k[2][64], v[2][64], beta[2], g[2];
	for (int i = 0; i < 2; i++) {
		/* token i sees the conv's last tap (itself) and, for i = 1, the one
		 * before it (token 0) */
		double y[256];
		for (int64_t c = 0; c < cd; c++) {
			double acc = (double)in->conv[c * K + K - 1] * in->mixed[i * cd + c];
			if (i == 1)
				acc += (double)in->conv[c * K + K - 2] * in->mixed[c];
			y[c] = silu(acc);
		}
		double nq = 0, nk = 0;
		for (int64_t e = 0; e < dk; e++) {
			q[i][e] = y[kh * dk + e], k[i][e] = y[kd + kh * dk + e];
			nq += q[i][e] * q[i][e], nk += k[i][e] * k[i][e];
		}
		for (int64_t e = 0; e < dk; e++)
			q[i][e] /= sqrt(nq + 1e-6) * sqrt((double)dk), k[i][e] /= sqrt(nk + 1e-6);
		for (int64_t e = 0; e < dv; e++)
			v[i][e] = y[2 * kd + h * dv + e];
		beta[i] = 1 / (1 + exp(-(double)in->b[i * s->nv + h]));
		double x = (double)in->a[i * s->nv + h] + in->dtb[h];
		g[i] = -exp(in->alog[h]) * log1p(exp(x));
	}
	/* u0 = beta0 v0; u1 = beta1 (v1 - e^g1 (k0.k1) u0);
	 * o0 = (k0.q0) u0; o1 = e^g1 (k0.q1) u0 + (k1.q1) u1 */
	double k0k1 = 0, k0q0 = 0, k0q1 = 0, k1q1 = 0, o[64];
	for (int64_t e = 0; e < dk; e++) {
		k0k1 += k[0][e] * k[1][e], k0q0 += k[0][e] * q[0][e];
		k0q1 += k[0][e] * q[1][e], k1q1 += k[1][e] * q[1][e];
	}
	for (int64_t e = 0; e < dv; e++) {
		double u0 = beta[0] * v[0][e], u1 = beta[1] * (v[1][e] - exp(g[1]) * k0k1 * u0);
		o[e] = t == 0 ? k0q0 * u0 : exp(g[1]) * k0q1 * u0 + k1q1 * u1;
	}
	double ss = 0;
	for (int64_t e = 0; e < dv; e++)
		ss += o[e] * o[e];
	for (int64_t e = 0; e < dv; e++)
		out[e] = o[e] / sqrt(ss / (double)dv + s->eps) * in->norm[e] * silu(in->z[t * vd + h * dv + e]);
}

/* max |x - ref| / max |ref| */
static double rel(const float *x, const double *ref, int64_t n)
{
	double err = 0, mx = 0;
	for (int64_t i = 0; i < n; i++) {
		err = fmax(err, fabs(x[i] - ref[i]));
		mx = fmax(mx, fabs(ref[i]));
		if (isnan(x[i]))
			return INFINITY;
	}
	return err / mx;
}

int main(void)
{
	x3_rng g;
	x3_rng_seed(&g, 1580, 0);

	/* by hand: two tokens, 2 key heads, 4 value heads of other widths */
	{
		struct inputs in = { .s = { 2, 4, 12, 10, 4, 1e-6 } };
		make(&in, &g, 2);
		const int64_t vd = in.s.nv * in.s.dv;
		double *ref = malloc(sizeof(double) * 2 * vd), hand[64];
		CHECK_OK(x3_gdn_reference(&in.s, &in.w, in.mixed, in.z, in.b, in.a, 1, 2, ref),
		         "reference over two tokens");
		double err = 0, mx = 0;
		for (int t = 0; t < 2; t++)
			for (int64_t h = 0; h < in.s.nv; h++) {
				by_hand(&in, h, t, hand);
				for (int64_t e = 0; e < in.s.dv; e++) {
					err = fmax(err, fabs(hand[e] - ref[t * vd + h * in.s.dv + e]));
					mx = fmax(mx, fabs(hand[e]));
				}
			}
		CHECK(err <= 1e-12 * mx, "the reference's first two tokens equal the hand computation "
		      "(conv taps, norms, gates, one delta step, gated norm): rel %.2g", err / mx);
		free(ref);
		drop(&in);
	}

	/* the chunked form against the reference */
	static const struct { int64_t nk, nv, dk, dv, K, rows, cols; } cs[] = {
		{ 2, 4, 24, 20, 4, 3, 150 },   /* three chunks, the last partial */
		{ 1, 1, 16, 16, 4, 2, 64 },    /* exactly one chunk */
		{ 2, 6, 32, 24, 3, 1, 301 },   /* three value heads per key head */
		{ 4, 4, 8, 40, 4, 4, 5 },      /* rows shorter than a chunk */
	};
	for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
		struct inputs in = { .s = { cs[c].nk, cs[c].nv, cs[c].dk, cs[c].dv, cs[c].K, 1e-6 } };
		const int64_t ntok = cs[c].rows * cs[c].cols, vd = in.s.nv * in.s.dv;
		make(&in, &g, ntok);
		float *out = malloc(sizeof(float) * (size_t)(ntok * vd));
		double *ref = malloc(sizeof(double) * (size_t)(ntok * vd));
		CHECK_OK(x3_gdn_forward(&in.s, &in.w, in.mixed, in.z, in.b, in.a, cs[c].rows, cs[c].cols, out),
		         "chunked: %lld rows of %lld, %lld/%lld heads", (long long)cs[c].rows,
		         (long long)cs[c].cols, (long long)in.s.nk, (long long)in.s.nv);
		CHECK_OK(x3_gdn_reference(&in.s, &in.w, in.mixed, in.z, in.b, in.a, cs[c].rows, cs[c].cols,
		                          ref), "reference");
		double e = rel(out, ref, ntok * vd);
		CHECK(e < 1e-4, "chunked equals the token-by-token reference: rel %.2g", e);
		if (c == 0) {
			/* blas.h's rule: 1 and 2 threads, a row alone */
			float *o1 = malloc(sizeof(float) * (size_t)(ntok * vd));
			int nt = omp_get_max_threads();
			omp_set_num_threads(1);
			CHECK_OK(x3_gdn_forward(&in.s, &in.w, in.mixed, in.z, in.b, in.a, cs[c].rows, cs[c].cols,
			                        o1), "one thread");
			omp_set_num_threads(nt > 1 ? nt : 2);
			CHECK(!memcmp(o1, out, sizeof(float) * (size_t)(ntok * vd)), "the same bits on 1 and %d threads",
			      nt > 1 ? nt : 2);
			const int64_t cd = x3_gdn_conv_dim(&in.s), r1 = cs[c].cols;
			CHECK_OK(x3_gdn_forward(&in.s, &in.w, in.mixed + r1 * cd, in.z + r1 * vd, in.b + r1 * in.s.nv,
			                        in.a + r1 * in.s.nv, 1, cs[c].cols, o1), "row 1 alone");
			CHECK(!memcmp(o1, out + r1 * vd, sizeof(float) * (size_t)(r1 * vd)),
			      "a row alone gives the bits it gives among others");
			omp_set_num_threads(nt);
			free(o1);
		}
		free(out), free(ref);
		drop(&in);
	}

	/* the rule alone where the decay is strong and beta near 1 (the
	 * within-chunk factors span many orders of magnitude) */
	{
		const int64_t T = 200, dk = 16, dv = 8;
		float *q = randf(&g, T * dk, 1, 0), *k = randf(&g, T * dk, 1, 0), *v = randf(&g, T * dv, 1, 0);
		float *gg = malloc(sizeof(float) * T), *be = malloc(sizeof(float) * T), *o = malloc(sizeof(float) * T * dv);
		double *qd = malloc(sizeof(double) * T * dk), *kd = malloc(sizeof(double) * T * dk);
		double *vd = malloc(sizeof(double) * T * dv), *gd = malloc(sizeof(double) * T);
		double *bd = malloc(sizeof(double) * T), *od = malloc(sizeof(double) * T * dv);
		for (int64_t t = 0; t < T; t++) {
			double nq = 0, nk = 0;
			for (int64_t e = 0; e < dk; e++)
				nq += q[t * dk + e] * q[t * dk + e], nk += k[t * dk + e] * k[t * dk + e];
			for (int64_t e = 0; e < dk; e++) {
				q[t * dk + e] = (float)(q[t * dk + e] / sqrt(nq) / 4), k[t * dk + e] = (float)(k[t * dk + e] / sqrt(nk));
				qd[t * dk + e] = q[t * dk + e], kd[t * dk + e] = k[t * dk + e];
			}
			for (int64_t e = 0; e < dv; e++)
				vd[t * dv + e] = v[t * dv + e];
			gg[t] = (float)(-2.0 * (t % 7) / 7.0 - 0.01), be[t] = (float)(0.98 - 0.3 * (t % 3 == 0));
			gd[t] = gg[t], bd[t] = be[t];
		}
		float *scr = malloc(sizeof(float) * (size_t)x3_gdn_rule_scratch(dk, dv));
		x3_gdn_rule_chunked(q, k, v, gg, be, T, dk, dv, o, scr);
		x3_gdn_rule_ref(qd, kd, vd, gd, bd, T, dk, dv, od);
		double e = rel(o, od, T * dv);
		CHECK(e < 1e-4, "the chunked rule under strong decay equals the recurrence: rel %.2g", e);
		free(q), free(k), free(v), free(gg), free(be), free(o), free(qd), free(kd), free(vd), free(gd);
		free(bd), free(od), free(scr);
	}

	/* Qwen3-Next's grouping: 2 key heads of 1, 4 value heads of 1 (two
	 * per key head): in_proj_qkvz is [q0 k0 v0 v1 z0 z1 | q1 k1 v2 v3 z2 z3],
	 * in_proj_ba [b0 b1 a0 a1 | b2 b3 a2 a3] */
	{
		x3_gdn_shape s = { 2, 4, 1, 1, 4, 1e-6 };
		/* split order: q0 q1 k0 k1 v0 v1 v2 v3 z0 z1 z2 z3 */
		static const int64_t want[12] = { 0, 6, 1, 7, 2, 3, 8, 9, 4, 5, 10, 11 };
		static const int64_t want_ba[8] = { 0, 1, 4, 5, 2, 3, 6, 7 };
		int ok = 1;
		for (int i = 0; i < 12; i++)
			ok &= x3_gdn_qkvz_row(&s, i) == want[i];
		for (int i = 0; i < 8; i++)
			ok &= x3_gdn_ba_row(&s, i) == want_ba[i];
		CHECK(ok, "in_proj_qkvz and in_proj_ba rows grouped per key head");
		/* a bijection at other widths */
		x3_gdn_shape s2 = { 3, 6, 5, 7, 4, 1e-6 };
		const int64_t n = x3_gdn_conv_dim(&s2) + 6 * 7;
		char *seen = calloc((size_t)n, 1);
		ok = 1;
		for (int64_t i = 0; i < n; i++) {
			int64_t j = x3_gdn_qkvz_row(&s2, i);
			ok &= j >= 0 && j < n && !seen[j];
			if (j >= 0 && j < n)
				seen[j] = 1;
		}
		CHECK(ok && n == 2 * 15 + 2 * 42, "every in_proj_qkvz row read once (3/6 heads of 5/7)");
		free(seen);
	}
	TEST_DONE();
}
