/* t1207-refit-scales: x3_refit_out_scales (issue 14 (b)) against a plain
 * double reference in the original basis: after the trellis is chosen,
 * each output channel's stored scale svh_j times alpha_j with
 * alpha_j = (w_j^T H r_j) / (r_j^T H r_j), w_j the original column, r_j the
 * reconstruction's column, H the damped Hessian (output metric; the
 * identity without a Hessian). The refit must lower the reconstruction's
 * output error, leave the trellis and suh alone, report its proxy error,
 * and be a minimum (1% either way is worse in every column). */
#include <math.h>
#include "test.h"
#include "synth.h"
#include "codec.h"
#include "quant.h"

static x3_rng rng;

/* (w - a r)^T H (w - a r) for columns of (k, n) arrays, in double; H NULL: identity */
static double col_err(const float *Wt, const float *R, const double *H, int64_t k, int64_t n,
                      int64_t j, double a)
{
	double s = 0;
	for (int64_t i = 0; i < k; i++) {
		double ei = Wt[i * n + j] - a * R[i * n + j];
		if (!H) {
			s += ei * ei;
			continue;
		}
		double t = 0;
		for (int64_t l = 0; l < k; l++)
			t += H[i * k + l] * (Wt[l * n + j] - a * R[l * n + j]);
		s += ei * t;
	}
	return s;
}

static void run(int with_h, int metric)
{
	int64_t k = 128, n = 256, rows = 400;
	/* correlated activations X = Z (I + 0.5 S) with uneven input scales */
	float *Z = test_randn(&rng, rows * k, 1.0), *X = malloc((size_t)(rows * k) * sizeof(float));
	for (int64_t t = 0; t < rows; t++)
		for (int64_t i = 0; i < k; i++)
			X[t * k + i] = Z[t * k + i] * (1.0f + (float)(i % 5)) + 0.5f * Z[t * k + (i * 7 + 3) % k];
	float *G = calloc((size_t)(k * k), sizeof(float));
	for (int64_t t = 0; t < rows; t++)
		for (int64_t i = 0; i < k; i++)
			for (int64_t l = 0; l < k; l++)
				G[i * k + l] += X[t * k + i] * X[t * k + l];
	float *W = test_randn(&rng, n * k, 0.05), s[128], sv[256];   /* HF (n, k) */
	for (int64_t j = 0; j < n; j++)
		for (int64_t i = 0; i < k; i++)
			W[j * k + i] = x3_f16_to_f32(x3_f32_to_f16(W[j * k + i] * (0.3f + (float)(j % 7))));
	x3_quant_signs(5, "h", k, s);
	x3_quant_signs(5, "w/sv", n, sv);
	x3_qhess *h;
	x3_qweight *w;
	CHECK_OK((with_h ? x3_qhess_finalize(G, k, k, rows, s, &h) : x3_qhess_none(k, s, &h)) ||
	         x3_regularize(W, n, k, h, sv, X3_OUT_SCALES_ALWAYS, &w), "finalize, regularize %lldx%lld",
	         (long long)n, (long long)k);
	x3_qresult *r;
	CHECK_OK(x3_quantize(w, h, 2, X3_CB_MUL1, 0, X3_QKEEP_Q | X3_QKEEP_W, &r), "quantize at K=2");
	float *keepq = r->Q;
	r->Q = NULL;
	CHECK(x3_refit_out_scales(w, h, metric, r, NULL) == X3_EINVAL && strstr(x3_errmsg(), "kept"),
	      "refit without the kept Q refused (%s)", x3_errmsg());
	r->Q = keepq;
	/* the reference: original basis, double, H0 = G / rows + damping */
	double *H0 = NULL;
	if (with_h) {
		H0 = malloc((size_t)(k * k) * sizeof(double));
		double dm = 0;
		for (int64_t i = 0; i < k; i++)
			dm += G[i * k + i] / rows / k;
		for (int64_t i = 0; i < k * k; i++)
			H0[i] = G[i] / rows + (i % (k + 1) == 0 ? X3_SIGMA_REG * dm : 0.0);
	}
	float *R = malloc((size_t)(k * n) * sizeof(float)), *Wt = malloc((size_t)(k * n) * sizeof(float));
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++)
			Wt[i * n + j] = W[j * k + i];
	CHECK_OK(x3_reconstruct(r->Q, r->suh, r->svh, k, n, R), "reconstruct before the refit");
	uint16_t *old_svh = malloc((size_t)n * 2), *old_suh = malloc((size_t)k * 2);
	uint16_t *old_tr = malloc((size_t)(k * n / 16 * 2) * 2);
	memcpy(old_svh, r->svh, (size_t)n * 2), memcpy(old_suh, r->suh, (size_t)k * 2);
	memcpy(old_tr, r->trellis, (size_t)(k * n / 16 * 2) * 2);
	double before = r->proxy_err, *alpha = malloc((size_t)n * sizeof(double));
	CHECK_OK(x3_refit_out_scales(w, h, metric, r, alpha), "refit (%s)", metric ? "output" : "proxy");
	CHECK(r->proxy_err_before == before && !memcmp(old_suh, r->suh, (size_t)k * 2) &&
	      !memcmp(old_tr, r->trellis, (size_t)(k * n / 16 * 2) * 2), "trellis and suh unchanged, old proxy kept");
	int changed = 0;
	for (int64_t j = 0; j < n; j++)
		changed += old_svh[j] != r->svh[j];
	CHECK(changed > n / 2, "most output scales move (%d of %lld)", changed, (long long)n);
	/* every column against the reference, and a minimum */
	double worst = 0;
	int minimum = 1;
	for (int64_t j = 0; j < n; j++) {
		double num = 0, den = 0;
		for (int64_t i = 0; i < k; i++) {
			double t = 0;
			for (int64_t l = 0; l < k; l++)
				t += (H0 ? H0[i * k + l] : (i == l)) * R[l * n + j];
			num += Wt[i * n + j] * t, den += R[i * n + j] * t;
		}
		double aref = num / den;
		double want = aref * x3_f16_to_f32(old_svh[j]), got = x3_f16_to_f32(r->svh[j]);
		double d = fabs(got / want - 1);
		worst = d > worst ? d : worst;
		double em = col_err(Wt, R, H0, k, n, j, aref);
		minimum &= col_err(Wt, R, H0, k, n, j, aref * 1.01) > em && col_err(Wt, R, H0, k, n, j, aref * 0.99) > em;
	}
	if (metric == X3_EST_OUTPUT)
		CHECK(worst < 2e-3, "stored scales = reference alpha x old svh within %.2g (fp16)", worst);
	else
		CHECK(worst < 0.05, "%s: near the output metric's alpha (worst %.3g)", with_h ? "proxy metric" : "no Hessian", worst);
	CHECK(minimum, "the reference alpha is a minimum of every column's error");
	/* the output error of what is stored now */
	float *R1 = malloc((size_t)(k * n) * sizeof(float));
	CHECK_OK(x3_reconstruct(r->Q, r->suh, r->svh, k, n, R1), "reconstruct after the refit");
	double a0 = 0, a1 = 0;
	for (int64_t j = 0; j < n; j++)
		a0 += col_err(Wt, R, H0, k, n, j, 1.0), a1 += col_err(Wt, R1, H0, k, n, j, 1.0);
	CHECK(a1 < 0.995 * a0, "output error %.6g -> %.6g after the refit (-%.1f%%)", a0, a1, 100 * (1 - a1 / a0));
	CHECK(r->proxy_err < before, "proxy error %.6g -> %.6g", before, r->proxy_err);
	x3_qresult_free(r), x3_qhess_free(h), x3_qweight_free(w);
	free(Z), free(X), free(G), free(W), free(H0), free(R), free(R1), free(Wt);
	free(old_svh), free(old_suh), free(old_tr), free(alpha);
}

/* x3_quant_set_sigma_reg: the damping added to the diagonal before the
 * rotation is s times the mean diagonal */
static void test_sigma(void)
{
	int64_t k = 128;
	float *G = calloc((size_t)(k * k), sizeof(float)), s[128];
	for (int64_t i = 0; i < k; i++)
		G[i * k + i] = (float)(1 + i % 3);   /* mean diagonal 2 after /count = 1 */
	x3_quant_signs(1, "h", k, s);
	CHECK(x3_quant_set_sigma_reg(0) == X3_EINVAL && x3_quant_set_sigma_reg(1.5) == X3_EINVAL &&
	      x3_quant_sigma_reg() == X3_SIGMA_REG, "sigma_reg 0 and 1.5 refused, the default kept");
	x3_qhess *h1, *h2;
	CHECK_OK(x3_qhess_finalize(G, k, k, 1, s, &h1) || x3_quant_set_sigma_reg(0.1) ||
	         x3_qhess_finalize(G, k, k, 1, s, &h2), "finalize at 0.025 and 0.1");
	double d = 0;
	for (int64_t i = 0; i < k; i++)
		d += h2->diag[i] - h1->diag[i];
	CHECK(fabs(d / k / (0.075 * h1->diag_mean) - 1) < 1e-4,
	      "the diagonal grows by 0.075 x the mean diagonal %.4g (%.5g)", h1->diag_mean, d / k);
	x3_quant_set_sigma_reg(X3_SIGMA_REG);
	x3_qhess_free(h1), x3_qhess_free(h2);
	free(G);
}

int main(void)
{
	x3_rng_seed(&rng, 1207, 0);
	test_sigma();
	run(1, X3_EST_OUTPUT);
	run(1, X3_EST_PROXY);
	run(0, X3_EST_PROXY);
	TEST_DONE();
}
