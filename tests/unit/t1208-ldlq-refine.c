/* t1208-ldlq-refine: the refinement passes after LDLQ
 * (x3_quant_set_ldlq_passes, issue 14). Each pass re-encodes every 16-row
 * block with the error of all the other blocks known and keeps the new
 * codes where they lower the proxy error. Checked on a 256 x 128 weight
 * (two LDLQ spans) with correlated, uneven activations, at K = 2..5:
 *  - the proxy error never rises from pass to pass and falls with one;
 *  - the reported proxy error is tr(Eᵀ H E) / tr(Wᵀ H W) recomputed in double;
 *  - the trellis decodes to the kept Q; the scale search is untouched;
 *  - the result does not depend on the thread count;
 *  - a plain double reference of one pass (targets by LAPACK's dposv, the
 *    blocks encoded through x3_ldlq without feedback, the keep decision in
 *    double) ends at the same proxy error and nearly the same codes;
 *  - no Hessian: the passes change nothing; bad pass counts are refused. */
#include <lapacke.h>
#include <math.h>
#include <omp.h>
#include "test.h"
#include "synth.h"
#include "codec.h"
#include "quant.h"

static x3_rng rng;

/* One refinement pass in plain double, from Q (k x n, updated in place):
 * the blocks from the last to the first, each re-encoded (x3_ldlq without
 * a Hessian on a 128-row matrix holding the target in its first 16 rows:
 * its blocks are then encoded alone) and kept where
 * e_Bᵀ H_BB e_B + 2 e_Bᵀ g_B falls. Returns the blocks kept. */
static int ref_pass(const float *W, float *Q, const float *H, int64_t k, int64_t n, int K)
{
	int kept = 0;
	double *E = malloc((size_t)(k * n) * sizeof(double));
	double *g = malloc((size_t)(16 * n) * sizeof(double));
	double *y = malloc((size_t)(16 * n) * sizeof(double));
	float *X = calloc((size_t)(128 * n), sizeof(float)), *Qn = malloc((size_t)(128 * n) * sizeof(float));
	uint16_t *st = malloc((size_t)(128 * n) * sizeof(uint16_t));
	for (int64_t i = 0; i < k * n; i++)
		E[i] = (double)W[i] - Q[i];
	for (int64_t b0 = k - 16; b0 >= 0; b0 -= 16) {
		double Hb[256];
		for (int i = 0; i < 16; i++)
			for (int j = 0; j < 16; j++)
				Hb[i * 16 + j] = H[(b0 + i) * k + b0 + j];
		for (int i = 0; i < 16; i++)
			for (int64_t c = 0; c < n; c++) {
				double t = 0;
				for (int64_t l = 0; l < k; l++)
					if (l < b0 || l >= b0 + 16)
						t += (double)H[(b0 + i) * k + l] * E[l * n + c];
				g[i * n + c] = y[i * n + c] = t;
			}
		double C[256];
		memcpy(C, Hb, sizeof C);
		if (LAPACKE_dposv(LAPACK_ROW_MAJOR, 'L', 16, (lapack_int)n, C, 16, y, (lapack_int)n))
			continue;
		for (int i = 0; i < 16; i++)
			for (int64_t c = 0; c < n; c++)
				X[i * n + c] = (float)(W[(b0 + i) * n + c] + y[i * n + c]);
		if (x3_ldlq(X, 128, n, NULL, K, X3_CB_MUL1, 0, st, Qn))
			continue;
		double fo = 0, fn = 0;
		for (int64_t c = 0; c < n; c++)
			for (int i = 0; i < 16; i++) {
				double eo = E[(b0 + i) * n + c], en = (double)W[(b0 + i) * n + c] - Qn[i * n + c];
				double ho = 0, hn = 0;
				for (int j = 0; j < 16; j++) {
					ho += Hb[i * 16 + j] * E[(b0 + j) * n + c];
					hn += Hb[i * 16 + j] * ((double)W[(b0 + j) * n + c] - Qn[j * n + c]);
				}
				fo += eo * (ho + 2 * g[i * n + c]);
				fn += en * (hn + 2 * g[i * n + c]);
			}
		if (!(fn < fo))
			continue;
		kept++;
		for (int i = 0; i < 16; i++)
			for (int64_t c = 0; c < n; c++) {
				Q[(b0 + i) * n + c] = Qn[i * n + c];
				E[(b0 + i) * n + c] = (double)W[(b0 + i) * n + c] - Qn[i * n + c];
			}
	}
	free(E), free(g), free(y), free(X), free(Qn), free(st);
	return kept;
}

static int same_trellis(const x3_qresult *a, const x3_qresult *b)
{
	return !memcmp(a->trellis, b->trellis, (size_t)(a->k * a->n / 16 * a->K) * sizeof(uint16_t)) &&
	       !memcmp(a->suh, b->suh, (size_t)a->k * sizeof(uint16_t)) &&
	       !memcmp(a->svh, b->svh, (size_t)a->n * sizeof(uint16_t));
}

int main(void)
{
	x3_rng_seed(&rng, 1208, 0);
	int64_t k = 256, n = 128, rows = 600;
	/* correlated activations with uneven input scales: the error feedback matters */
	float *X = test_corr_acts(&rng, rows, k, 0.7);
	for (int64_t t = 0; t < rows; t++)
		for (int64_t i = 0; i < k; i++)
			X[t * k + i] *= 1.0f + (float)(i % 7);
	float *G = test_gram(X, rows, k);
	float *W = test_randn(&rng, n * k, 0.05), s[256], sv[128];   /* HF (n, k) */
	x3_quant_signs(8, "h", k, s);
	x3_quant_signs(8, "w/sv", n, sv);
	x3_qhess *h, *h0;
	x3_qweight *w, *w0;
	CHECK_OK(x3_qhess_finalize(G, k, k, rows, s, &h) || x3_regularize(W, n, k, h, sv, X3_OUT_SCALES_ALWAYS, &w),
	         "finalize and regularize a %lldx%lld weight", (long long)n, (long long)k);
	CHECK(x3_quant_ldlq_passes() == 0, "no refinement passes by default");
	CHECK(x3_quant_set_ldlq_passes(-1) == X3_EINVAL && x3_quant_set_ldlq_passes(X3_LDLQ_PASSES_MAX + 1) == X3_EINVAL &&
	      x3_quant_ldlq_passes() == 0, "passes outside 0..%d refused (%s), the setting unchanged",
	      X3_LDLQ_PASSES_MAX, x3_errmsg());
	float *Qd = malloc((size_t)(k * n) * sizeof(float));
	for (int K = 2; K <= 5; K++) {
		x3_qresult *r[3], *r1t;
		for (int p = 0; p < 3; p++) {
			x3_quant_set_ldlq_passes(p);
			CHECK_OK(x3_quantize(w, h, K, X3_CB_MUL1, 2, X3_QKEEP_Q | X3_QKEEP_W, &r[p]),
			         "K=%d, %d passes: quantize", K, p);
		}
		x3_quant_set_ldlq_passes(1);
		omp_set_num_threads(1);
		CHECK_OK(x3_quantize(w, h, K, X3_CB_MUL1, 1, 0, &r1t), "K=%d, 1 pass, 1 thread", K);
		omp_set_num_threads(2);
		CHECK(r[0]->refine_kept == 0 && r[1]->refine_kept > 0 && r[2]->refine_kept >= r[1]->refine_kept,
		      "K=%d: blocks kept by the passes: 0, %lld, %lld (of %lld per pass)", K,
		      (long long)r[1]->refine_kept, (long long)r[2]->refine_kept, (long long)(k / 16));
		CHECK(r[1]->ldlq_tiles > r[0]->ldlq_tiles && r[1]->search_tiles == r[0]->search_tiles &&
		      r[1]->g == r[0]->g, "K=%d: a pass adds Viterbi tiles (%lld -> %lld), the scale search is the same (g %.4f)",
		      K, (long long)r[0]->ldlq_tiles, (long long)r[1]->ldlq_tiles, r[1]->g);
		CHECK(r[1]->proxy_err < r[0]->proxy_err && r[2]->proxy_err <= r[1]->proxy_err,
		      "K=%d: proxy error falls: %.6g -> %.6g (%.1f%%) -> %.6g", K, r[0]->proxy_err, r[1]->proxy_err,
		      100 * (r[1]->proxy_err / r[0]->proxy_err - 1), r[2]->proxy_err);
		for (int p = 1; p < 3; p++) {
			double pr = test_proxy_ref(r[p]->Wg, r[p]->Q, h->H, k, n);
			CHECK(fabs(pr / r[p]->proxy_err - 1) < 1e-5,
			      "K=%d, %d passes: the reported proxy error recomputed in double (%.9g vs %.9g)",
			      K, p, r[p]->proxy_err, pr);
			CHECK_OK(x3_trellis_decode(K, X3_CB_MUL1, r[p]->trellis, k, n, Qd), "K=%d: decode", K);
			CHECK(!memcmp(Qd, r[p]->Q, (size_t)(k * n) * sizeof(float)),
			      "K=%d, %d passes: the trellis decodes to the kept Q", K, p);
		}
		CHECK(same_trellis(r[1], r1t), "K=%d, 1 pass: 1 thread == 2 threads, byte for byte", K);
		/* the plain reference pass from the LDLQ result */
		float *Qr = malloc((size_t)(k * n) * sizeof(float));
		memcpy(Qr, r[0]->Q, (size_t)(k * n) * sizeof(float));
		int kept = ref_pass(r[0]->Wg, Qr, h->H, k, n, K);
		double pref = test_proxy_ref(r[0]->Wg, Qr, h->H, k, n);
		int64_t same = 0;
		for (int64_t i = 0; i < k * n; i++)
			same += Qr[i] == r[1]->Q[i];
		CHECK(fabs(pref / r[1]->proxy_err - 1) < 2e-3 && same >= k * n * 98 / 100,
		      "K=%d: the double reference pass: proxy %.6g vs %.6g, %lld of %lld blocks kept vs %lld, %.2f%% of the values equal",
		      K, pref, r[1]->proxy_err, (long long)kept, (long long)(k / 16), (long long)r[1]->refine_kept,
		      100.0 * same / (k * n));
		free(Qr);
		for (int p = 0; p < 3; p++)
			x3_qresult_free(r[p]);
		x3_qresult_free(r1t);
	}
	/* without a Hessian there is no feedback: the passes do nothing */
	CHECK_OK(x3_qhess_none(k, s, &h0) || x3_regularize(W, n, k, h0, sv, X3_OUT_SCALES_ALWAYS, &w0),
	         "no Hessian: regularize");
	x3_qresult *a, *b;
	x3_quant_set_ldlq_passes(0);
	CHECK_OK(x3_quantize(w0, h0, 3, X3_CB_MUL1, 0, 0, &a), "no Hessian, 0 passes");
	x3_quant_set_ldlq_passes(2);
	CHECK_OK(x3_quantize(w0, h0, 3, X3_CB_MUL1, 0, 0, &b), "no Hessian, 2 passes");
	CHECK(same_trellis(a, b) && a->proxy_err == b->proxy_err && b->refine_kept == 0,
	      "no Hessian: 2 passes == none, byte for byte");
	x3_quant_set_ldlq_passes(0);
	x3_qresult_free(a), x3_qresult_free(b);
	x3_qweight_free(w), x3_qweight_free(w0);
	x3_qhess_free(h), x3_qhess_free(h0);
	free(X), free(G), free(W), free(Qd);
	TEST_DONE();
}
