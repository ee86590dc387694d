/* t1740-gpu-quant: the quantizer's dense algebra on the GPU against CPU
 * references: Hessian X^T X (fp32 SSYRK vs float64, within fp32 rounding),
 * block LDL (cuSOLVER vs LAPACK, as lib/quant/quant_hess.c's x3_block_ldl computes it),
 * the damping retries, and LDLQ: without feedback bit-identical to the CPU
 * Viterbi of each block row; with feedback the same proxy error as the CPU
 * x3_ldlq within 2%. Skips without a device. On cusim, the CPU emulator
 * (device name "... emulated ..."), LDLQ and x3_quantize take a 256x32
 * weight instead of 256x256. */
#include <math.h>
#include "gpu-test.h"
#include "codec.h"
#include "device.h"
#include "quant.h"

int main(void)
{
	GPU_TEST_START(emulated);
	x3_rng r;
	x3_rng_seed(&r, 1740, 0);
	const int64_t k = 256, rows = 700, n = emulated ? 32 : 256;
	float *x = malloc(sizeof(float) * rows * k), *H = malloc(sizeof(float) * k * k);
	double *Hr = calloc((size_t)(k * k), sizeof(double));
	for (int64_t i = 0; i < rows * k; i++)   /* correlated columns */
		x[i] = (float)(x3_rng_normal(&r) + (i % k ? 0.5 * x[i - 1] : 0.0));
	for (int64_t t = 0; t < rows; t++)
		for (int64_t a = 0; a < k; a++)
			for (int64_t b = 0; b < k; b++)
				Hr[a * k + b] += (double)x[t * k + a] * x[t * k + b];

	/* Hessian: fp32 sums of 700 products, budget 1e-5 of max |H| */
	x3_gpu_hessian *hs = NULL;
	CHECK_OK(G->hessian_create(k, &hs), "hessian create");
	CHECK_OK(G->hessian_add(hs, x, 300), "add 300 rows");
	CHECK_OK(G->hessian_add(hs, x + 300 * k, rows - 300), "add 400 rows");
	double count = 0;
	CHECK_OK(G->hessian_get(hs, H, &count), "hessian get");
	CHECK(count == (double)rows, "count %g", count);
	double m = 0, d = 0, asym = 0;
	for (int64_t i = 0; i < k * k; i++) {
		m = fmax(m, fabs(Hr[i]));
		d = fmax(d, fabs(H[i] - Hr[i]));
	}
	for (int64_t a = 0; a < k; a++)
		for (int64_t b = 0; b < k; b++)
			asym = fmax(asym, fabs(H[a * k + b] - H[b * k + a]));
	CHECK(d <= 1e-5 * m, "H vs float64: max error %.3g of max |H| %.3g (budget 1e-5)", d / m, m);
	CHECK(asym == 0, "H exactly symmetric");
	x[5] = NAN;
	CHECK(G->hessian_add(hs, x, 1) == X3_ENUM, "NaN row refused: %s", x3_errmsg());
	G->hessian_free(hs);

	/* block LDL of the damped H */
	double dm = 0;
	for (int64_t i = 0; i < k; i++)
		dm += Hr[i * k + i];
	dm /= (double)k;
	for (int64_t i = 0; i < k * k; i++)
		H[i] = (float)(Hr[i] / rows);
	for (int64_t i = 0; i < k; i++)
		H[i * k + i] += (float)(0.025 * dm / rows);
	float *Lc = malloc(sizeof(float) * k * k), *Lg = malloc(sizeof(float) * k * k);
	memcpy(Lc, H, sizeof(float) * k * k);
	memcpy(Lg, H, sizeof(float) * k * k);
	CHECK_OK(x3_block_ldl(Lc, k), "cpu block LDL");
	CHECK_OK(G->block_ldl(Lg, k), "gpu block LDL");
	m = d = 0;
	int upper = 1;
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < k; j++) {
			m = fmax(m, fabs(Lc[i * k + j]));
			d = fmax(d, fabs(Lc[i * k + j] - Lg[i * k + j]));
			if (j >= i / 16 * 16 && Lg[i * k + j] != 0)
				upper = 0;
		}
	CHECK(d <= 1e-3 * m, "L' vs LAPACK: max error %.3g of max |L'| (budget 1e-3)", d / m);
	CHECK(upper, "diagonal blocks and upper part are zero");

	/* retries: identity with one negative pivot needs 3 rounds of +0.05 */
	float *A = calloc((size_t)(k * k), sizeof(float)), *LA = malloc(sizeof(float) * k * k);
	for (int64_t i = 0; i < k; i++)
		A[i * k + i] = 1.0f;
	A[5 * k + 5] = -0.12f;
	int retries = -1;
	CHECK_OK(G->block_ldl_retry(A, k, 10, LA, &retries), "retry loop");
	CHECK(retries == 3, "3 damping retries (got %d)", retries);
	for (int64_t i = 0; i < k; i++)
		A[i * k + i] = -1.0f;
	CHECK(G->block_ldl_retry(A, k, 2, LA, &retries) == X3_ENUM && retries == 2,
	      "gives up after 2 retries: %s", x3_errmsg());

	/* LDLQ */
	const int K = 3, cb = X3_CB_MCG;
	float *W = malloc(sizeof(float) * k * n), *Qc = malloc(sizeof(float) * k * n),
	      *Qg = malloc(sizeof(float) * k * n);
	uint16_t *sc = malloc(2 * k * n), *sg = malloc(2 * k * n);
	for (int64_t i = 0; i < k * n; i++)
		W[i] = (float)(x3_rng_normal(&r) * X3_CODEBOOK_SCALE);
	CHECK_OK(x3_ldlq(W, k, n, NULL, K, cb, 0, sc, Qc), "cpu ldlq without feedback");
	CHECK_OK(G->ldlq(W, k, n, NULL, K, cb, sg, Qg), "gpu ldlq without feedback");
	CHECK(!memcmp(sc, sg, 2 * k * n) && !memcmp(Qc, Qg, sizeof(float) * k * n),
	      "without feedback: states and Q bit-identical to the CPU");
	CHECK_OK(x3_ldlq(W, k, n, Lc, K, cb, 0, sc, Qc), "cpu ldlq with feedback");
	CHECK_OK(G->ldlq(W, k, n, Lc, K, cb, sg, Qg), "gpu ldlq with feedback");
	int okq = 1;
	for (int64_t i = 0; i < k * n && okq; i++) {
		int64_t tile = i / 256, kb = tile / (n / 16), nb = tile % (n / 16);
		int p = x3_tile_perm[i % 256];
		if (Qg[(kb * 16 + p / 16) * n + nb * 16 + p % 16] != x3_codebook(cb, sg[i]))
			okq = 0;
	}
	CHECK(okq, "Q is the decode of the GPU states");
	double pc = 0, pg = 0;
	CHECK_OK(x3_proxy_error(W, Qc, H, k, n, &pc), "cpu proxy error");
	CHECK_OK(x3_proxy_error(W, Qg, H, k, n, &pg), "gpu proxy error");
	CHECK(fabs(pg - pc) <= 0.02 * pc, "proxy error gpu %.5f vs cpu %.5f (within 2%%)", pg, pc);
	int same = 0;
	for (int64_t i = 0; i < k * n; i++)
		same += sc[i] == sg[i];
	printf("# %.1f%% of states equal to the CPU's\n", 100.0 * same / (double)(k * n));

	/* On the emulator, x3_quantize's scale search (~600 Viterbi tiles) takes
	 * minutes: the backend is checked through x3_ldlq (the CPU LDLQ, whose
	 * Viterbi calls go to the GPU) instead. */
	if (emulated) {
		x3_viterbi_set_backend(G->viterbi_encode);   /* the GPU encoder for every x3_viterbi_encode */
		CHECK_OK(x3_ldlq(W, k, n, Lc, K, cb, 0, sg, Qg), "x3_ldlq, GPU Viterbi");
		x3_viterbi_set_backend(NULL);
		CHECK(!memcmp(sc, sg, 2 * k * n) && !memcmp(Qc, Qg, sizeof(float) * k * n),
		      "x3_ldlq with the GPU backend: states and Q byte-identical to the CPU");
		SKIP("x3_quantize with the GPU Viterbi backend: emulated device (run on a GPU)");
	}
	/* the whole x3_quantize with the GPU as Viterbi backend: byte-identical
	 * to the CPU (the rest runs on the CPU either way) */
	if (!emulated) {
		float sign[256];
		for (int64_t i = 0; i < k; i++)
			sign[i] = (i * 7 % 3) ? 1.0f : -1.0f;
		float *Hs = malloc(sizeof(float) * k * k);
		for (int64_t i = 0; i < k * k; i++)
			Hs[i] = (float)Hr[i];
		x3_qhess *qh = NULL;
		CHECK_OK(x3_qhess_finalize(Hs, k, k, (double)rows, sign, &qh), "qhess");
		float *Wq = malloc(sizeof(float) * k * n), *su = malloc(sizeof(float) * k),
		      *sv = malloc(sizeof(float) * n);
		memcpy(Wq, W, sizeof(float) * k * n);
		for (int64_t i = 0; i < k; i++)
			su[i] = 1.0f;
		for (int64_t j = 0; j < n; j++)
			sv[j] = 1.0f;
		x3_qweight *qw = x3_qweight_wrap(k, n, k, n, Wq, su, sv);
		x3_qresult *rc_cpu = NULL, *rc_gpu = NULL;
		CHECK_OK(x3_quantize(qw, qh, 2, X3_CB_MUL1, 0, 0, &rc_cpu), "x3_quantize on the CPU");
		x3_viterbi_set_backend(G->viterbi_encode);   /* the GPU encoder for every x3_viterbi_encode */
		CHECK_OK(x3_quantize(qw, qh, 2, X3_CB_MUL1, 0, 0, &rc_gpu), "x3_quantize, GPU Viterbi");
		x3_viterbi_set_backend(NULL);
		if (rc_cpu && rc_gpu)
			CHECK(rc_cpu->g == rc_gpu->g && rc_cpu->proxy_err == rc_gpu->proxy_err &&
			      !memcmp(rc_cpu->trellis, rc_gpu->trellis, (size_t)(k * n / 16 * 2) * 2),
			      "identical trellis, scale %.4f and proxy error %.5f", rc_gpu->g,
			      rc_gpu->proxy_err);
		x3_qresult_free(rc_cpu);
		x3_qresult_free(rc_gpu);
		x3_qweight_free(qw);
		x3_qhess_free(qh);
		free(Hs);
	}

	free(x), free(H), free(Hr), free(Lc), free(Lg), free(A), free(LA);
	free(W), free(Qc), free(Qg), free(sc), free(sg);
	TEST_DONE();
}
