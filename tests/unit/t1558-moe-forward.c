/* t1558-moe-forward: the mixture-of-experts block (lib/model/moe.c): the
 * batched form (rows gathered per expert, x3_gemm_xwt products) routes
 * every token as the per-token reference does and gives its output; with
 * all experts identical and top k = all experts (renormalized) the block is
 * the dense MLP; the rows the experts see are exactly the routed ones (the
 * per-expert Hessian capture reads them: XᵀX of exactly those rows). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "blas.h"
#include "moe.h"

enum { E = 5, H = 24, I = 40, NT = 37 };
static float *gw[E], *uw[E], *dw[E];
static double xtx[E][H * H];
static int64_t seen[E];

static int apply(void *ctx, int64_t e, int j, const float *x, int64_t n, float *y)
{
	(void)ctx;
	if (j == 0) {
		seen[e] += n;
		for (int64_t r = 0; r < n; r++)
			for (int a = 0; a < H; a++)
				for (int b = 0; b < H; b++)
					xtx[e][a * H + b] += (double)x[r * H + a] * x[r * H + b];
	}
	return j == 2 ? x3_gemm_xwt(x, n, 0, I, dw[e], H, y) : x3_gemm_xwt(x, n, 0, H, j ? uw[e] : gw[e], I, y);
}

static float *rnd(x3_rng *g, int64_t n, double s)
{
	float *v = malloc((size_t)n * sizeof *v);
	for (int64_t i = 0; i < n; i++)
		v[i] = (float)(s * x3_rng_normal(g));
	return v;
}

static double maxdiff(const float *a, const float *b, int64_t n, double *scale)
{
	double d = 0, m = 0;
	for (int64_t i = 0; i < n; i++) {
		d = fmax(d, fabs((double)a[i] - b[i]));
		m = fmax(m, fabs((double)b[i]));
	}
	*scale = m;
	return d;
}

int main(void)
{
	x3_rng g;
	x3_rng_seed(&g, 16, 0);
	float *router = rnd(&g, E * H, 1.0), *x = rnd(&g, NT * H, 1.0);
	for (int e = 0; e < E; e++)
		gw[e] = rnd(&g, I * H, 0.2), uw[e] = rnd(&g, I * H, 0.2), dw[e] = rnd(&g, H * I, 0.15);
	float y[NT * H], yr[NT * H], w[NT * E], wr[NT * E];
	int32_t idx[NT * E], idr[NT * E];
	for (int renorm = 0; renorm < 2; renorm++) {
		struct x3_moe p = { .n_experts = E, .top_k = 2, .hidden = H, .inter = I, .renorm = renorm,
		                    .router = router, .apply = apply };
		memset(xtx, 0, sizeof xtx), memset(seen, 0, sizeof seen);
		CHECK_OK(x3_moe_route(&p, x, NT, 0, idx, w), "route");
		CHECK_OK(x3_moe_forward(&p, x, NT, 0, y), "forward");
		x3_moe_ref(&p, (const float *const *)gw, (const float *const *)uw, (const float *const *)dw, x, NT,
		           yr, idr, wr);
		int same = !memcmp(idx, idr, sizeof(int32_t) * NT * 2), wok = 1;
		for (int i = 0; i < NT * 2; i++)
			wok &= fabs(w[i] - wr[i]) < 1e-5;
		CHECK(same && wok, "renorm %d: every token's top-2 experts and weights as the per-token loop", renorm);
		double sc, d = maxdiff(y, yr, NT * H, &sc);
		CHECK(d < 1e-4 * sc, "renorm %d: output as the per-token loop (max diff %.3g of %.3g)", renorm, d, sc);
		if (renorm) {
			double s = 0;
			for (int j = 0; j < 2; j++)
				s += w[5 * 2 + j];
			CHECK(fabs(s - 1) < 1e-6, "renormalized top-k weights sum to 1");
		} else {
			CHECK(w[0] + w[1] < 1, "softmax top-k weights, not renormalized, sum below 1");
		}
		/* the rows each expert saw: exactly the routed ones */
		int hok = 1, any_idle = 0;
		int64_t tot = 0;
		for (int e = 0; e < E; e++) {
			double ref[H * H] = {0};
			int64_t cnt = 0;
			for (int t = 0; t < NT; t++)
				for (int j = 0; j < 2; j++)
					if (idr[t * 2 + j] == e) {
						cnt++;
						for (int a = 0; a < H; a++)
							for (int b = 0; b < H; b++)
								ref[a * H + b] += (double)x[t * H + a] * x[t * H + b];
					}
			hok &= cnt == seen[e] && !memcmp(ref, xtx[e], sizeof ref);
			any_idle |= cnt < NT;
			tot += seen[e];
		}
		CHECK(hok && any_idle && tot == 2 * NT, "each expert's XᵀX is of exactly its routed rows (%lld rows in all)",
		      (long long)tot);
	}

	/* all experts the same, top k = all, renormalized: the dense MLP */
	for (int e = 1; e < E; e++)
		memcpy(gw[e], gw[0], sizeof(float) * I * H), memcpy(uw[e], uw[0], sizeof(float) * I * H),
		memcpy(dw[e], dw[0], sizeof(float) * H * I);
	struct x3_moe p = { .n_experts = E, .top_k = E, .hidden = H, .inter = I, .renorm = 1,
	                    .router = router, .apply = apply };
	CHECK_OK(x3_moe_forward(&p, x, NT, 0, y), "forward, top k = all");
	float gd[NT * I], ud[NT * I], yd[NT * H];
	x3_gemm_xwt(x, NT, 0, H, gw[0], I, gd);
	x3_gemm_xwt(x, NT, 0, H, uw[0], I, ud);
	for (int i = 0; i < NT * I; i++)
		gd[i] = gd[i] / (1.0f + expf(-gd[i])) * ud[i];
	x3_gemm_xwt(gd, NT, 0, I, dw[0], H, yd);
	double sc, d = maxdiff(y, yd, NT * H, &sc);
	CHECK(d < 1e-5 * sc, "identical experts, top k = all: the dense MLP (max diff %.3g of %.3g)", d, sc);
	/* and a block that is not: top 1 of distinct experts differs */
	x3_rng_seed(&g, 17, 0);
	for (int e = 1; e < E; e++)
		for (int i = 0; i < I * H; i++)
			gw[e][i] = (float)(0.2 * x3_rng_normal(&g));
	struct x3_moe p1 = { .n_experts = E, .top_k = 1, .hidden = H, .inter = I, .renorm = 1,
	                     .router = router, .apply = apply };
	CHECK_OK(x3_moe_forward(&p1, x, NT, 0, y), "forward, distinct experts");
	d = maxdiff(y, yd, NT * H, &sc);
	CHECK(d > 1e-2 * sc, "distinct experts are not the dense MLP (the check can fail)");
	TEST_DONE();
}
