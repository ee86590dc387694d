/* t1720-gpu-decode: GPU decode of trellis tensors is bit-identical to
 * x3_trellis_decode for K = 1..8 and all codebooks; the fused reconstruct
 * W = diag(suh) Hb W~ Hb diag(svh) and the blockwise Hadamards match a
 * float64 reference within a stated fp32 budget. Skips without a device. */
#include <math.h>
#include "gpu-test.h"
#include "codec.h"
#include "device.h"

/* fp32 arithmetic vs float64: 2 x 7 butterfly stages plus 3 products,
 * relative to the largest output magnitude */
#define BUDGET_F32 2e-6

static void transpose(const double *a, int64_t r, int64_t c, double *b)
{
	for (int64_t i = 0; i < r; i++)
		for (int64_t j = 0; j < c; j++)
			b[j * r + i] = a[i * c + j];
}

static double max_rel(const float *got, const double *want, int64_t n)
{
	double m = 0, d = 0;
	for (int64_t i = 0; i < n; i++) {
		m = fmax(m, fabs(want[i]));
		d = fmax(d, fabs(got[i] - want[i]));
	}
	return m > 0 ? d / m : d;
}

int main(void)
{
	GPU_TEST_START(emulated);
	(void)emulated;
	x3_rng r;
	x3_rng_seed(&r, 1720, 0);
	const int64_t k = 256, n = 384;
	uint16_t *tr = malloc((size_t)(k * n / 256) * 16 * 8 * 2);
	float *wc = malloc(sizeof(float) * k * n), *wg = malloc(sizeof(float) * k * n);
	double *ref = malloc(sizeof(double) * k * n), *tmp = malloc(sizeof(double) * k * n);

	for (int K = 1; K <= 8; K++) {
		const int64_t nw = (k / 16) * (n / 16) * 16 * K;
		for (int64_t i = 0; i < nw; i++)
			tr[i] = (uint16_t)x3_rng_u64(&r);
		for (int cb = 0; cb < X3_CB_COUNT; cb++) {
			CHECK_OK(x3_trellis_decode(K, cb, tr, k, n, wc), "cpu decode");
			memset(wg, 0xff, sizeof(float) * k * n);
			CHECK_OK(G->trellis_decode(K, cb, tr, k, n, wg), "gpu decode K=%d cb=%d", K, cb);
			int64_t bad = -1;
			for (int64_t i = 0; i < k * n && bad < 0; i++)
				if (memcmp(&wc[i], &wg[i], sizeof(float)))
					bad = i;
			CHECK(bad < 0, "K=%d %s: W~ (%lldx%lld) bit-identical", K, x3_codebook_name(cb),
			      (long long)k, (long long)n);
			if (bad >= 0)
				printf("#   at %lld: cpu %.9g gpu %.9g\n", (long long)bad, (double)wc[bad],
				       (double)wg[bad]);
		}
	}

	/* fused reconstruct against float64 */
	uint16_t *suh = malloc(2 * k), *svh = malloc(2 * n);
	for (int64_t i = 0; i < k; i++)
		suh[i] = x3_f32_to_f16((float)((x3_rng_uniform(&r) + 0.5) * (i % 3 ? 0.02 : -0.02)));
	for (int64_t j = 0; j < n; j++)
		svh[j] = x3_f32_to_f16((float)((x3_rng_uniform(&r) + 0.5) * (j % 5 ? 1 : -1)));
	for (int K = 2; K <= 8; K += 3) {
		const int64_t nw = (k / 16) * (n / 16) * 16 * K;
		for (int64_t i = 0; i < nw; i++)
			tr[i] = (uint16_t)x3_rng_u64(&r);
		for (int cb = 0; cb < X3_CB_COUNT; cb++) {
			CHECK_OK(x3_trellis_decode(K, cb, tr, k, n, wc), "cpu decode");
			for (int64_t i = 0; i < k * n; i++)
				ref[i] = wc[i];
			had_ref_rows(ref, k, n);              /* W~ Hb_n */
			transpose(ref, k, n, tmp);
			had_ref_rows(tmp, n, k);              /* (Hb_k W~ Hb_n)^T */
			transpose(tmp, n, k, ref);
			for (int64_t i = 0; i < k; i++)
				for (int64_t j = 0; j < n; j++)
					ref[i * n + j] *= (double)x3_f16_to_f32(suh[i]) * x3_f16_to_f32(svh[j]);
			CHECK_OK(G->reconstruct(K, cb, tr, suh, svh, k, n, wg), "gpu reconstruct");
			double e = max_rel(wg, ref, k * n);
			CHECK(e <= BUDGET_F32, "K=%d %s: reconstruct max error %.3g of max |W| (budget %g)",
			      K, x3_codebook_name(cb), e, BUDGET_F32);
		}
	}

	/* Hadamard rows and columns */
	for (int64_t i = 0; i < k * n; i++) {
		wc[i] = (float)x3_rng_normal(&r);
		ref[i] = wc[i];
	}
	memcpy(wg, wc, sizeof(float) * k * n);
	CHECK_OK(G->had128_rows(wg, k, n), "gpu had rows");
	had_ref_rows(ref, k, n);
	double e = max_rel(wg, ref, k * n);
	CHECK(e <= BUDGET_F32, "had128 rows: max error %.3g (budget %g)", e, BUDGET_F32);
	x3_had128_rows(wc, k, n);
	e = 0;
	for (int64_t i = 0; i < k * n; i++)
		e = fmax(e, fabs(wc[i] - wg[i]));
	CHECK(e <= 1e-5, "had128 rows: GPU vs CPU max difference %.3g", e);
	transpose(ref, k, n, tmp);
	had_ref_rows(tmp, n, k);
	transpose(tmp, n, k, ref);
	CHECK_OK(G->had128_cols(wg, k, n), "gpu had cols");
	e = max_rel(wg, ref, k * n);
	CHECK(e <= BUDGET_F32, "had128 cols: max error %.3g (budget %g)", e, BUDGET_F32);
	CHECK(G->had128_rows(wg, 3, 100) == X3_EINVAL, "cols 100 refused: %s", x3_errmsg());
	CHECK(G->had128_cols(wg, 100, 3) == X3_EINVAL, "rows 100 refused");

	free(tr), free(wc), free(wg), free(ref), free(tmp), free(suh), free(svh);
	TEST_DONE();
}
