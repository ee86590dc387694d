/* t1730-gpu-gemv: the GPU EXL3 linear (fused decode GEMV for m <= 16,
 * reconstruct + cuBLAS GEMM above) against a float64 product with the
 * dequantized weight, for K = 1..8 and all codebooks, with and without
 * bias. Skips without a device. On cusim, the CPU emulator (device name
 * "... emulated ..."), the weight is 256x128 instead of 1024x512.
 *
 * Error budgets (||y - y_ref||_F / ||y_ref||_F), the same for every K since
 * W~ is decoded exactly and only the arithmetic differs:
 *   fused GEMV, tensor cores (path 1, the default for m <= 16): x' rounded
 *               to fp16 (relative 2^-11), fp32 accumulation: 2e-3
 *               (expected ~3e-4);
 *   fused GEMV, fp32 FMAs (path 3): fp32 Hadamards and accumulation over
 *               k = 1024: 1e-5 (expected ~1e-6);
 *   GEMM path (2, the default above 16 rows): W and x rounded to fp16,
 *               fp32 accumulation: 2e-3 (expected ~4e-4). */
#include <math.h>
#include "gpu-test.h"
#include "codec.h"
#include "gpu.h"
#include "exl3.h"

/* [path][K] */
static const double budget[4][9] = {
	{0},
	{0, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3},
	{0, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3},
	{0, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5},
};
static const char *path_name[4] = {"auto", "gemv-mma", "gemm", "gemv-fma"};

/* dense W (k, n) in float64 from the decoded W~ */
static void dense_ref(const float *wt, const uint16_t *suh, const uint16_t *svh, int64_t k,
                      int64_t n, double *W)
{
	double *T = malloc(sizeof(double) * k * n);
	for (int64_t i = 0; i < k * n; i++)
		W[i] = wt[i];
	had_ref_rows(W, k, n);
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++)
			T[j * k + i] = W[i * n + j];
	had_ref_rows(T, n, k);
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++)
			W[i * n + j] = T[j * k + i] * x3_f16_to_f32(suh[i]) * x3_f16_to_f32(svh[j]);
	free(T);
}

int main(void)
{
	GPU_TEST_START(emulated);
	x3_rng r;
	x3_rng_seed(&r, 1730, 0);
	const int64_t k = emulated ? 256 : 1024, n = emulated ? 128 : 512;
	const int ms[] = {1, 2, 5, 16, 17, 40};
	const int64_t mmax = 40;
	uint16_t *tr = malloc((size_t)(k * n / 256) * 16 * 8 * 2);
	uint16_t *suh = malloc(2 * k), *svh = malloc(2 * n), *bias = malloc(2 * n);
	float *wt = malloc(sizeof(float) * k * n), *wg = malloc(sizeof(float) * k * n);
	double *W = malloc(sizeof(double) * k * n);
	float *x = malloc(sizeof(float) * mmax * k), *y = malloc(sizeof(float) * mmax * n);
	double *yr = malloc(sizeof(double) * mmax * n);
	for (int64_t i = 0; i < k; i++)
		suh[i] = x3_f32_to_f16((float)((x3_rng_uniform(&r) + 0.5) * (i % 3 ? 0.02 : -0.02)));
	for (int64_t j = 0; j < n; j++) {
		svh[j] = x3_f32_to_f16((float)((x3_rng_uniform(&r) + 0.5) * (j % 5 ? 1 : -1)));
		bias[j] = x3_f32_to_f16((float)x3_rng_normal(&r));
	}
	for (int64_t i = 0; i < mmax * k; i++)
		x[i] = (float)x3_rng_normal(&r);
	float *x_d = NULL, *y_d = NULL;
	CHECK_OK(x3_gpu_alloc((void **)&x_d, sizeof(float) * mmax * k), "alloc x");
	CHECK_OK(x3_gpu_alloc((void **)&y_d, sizeof(float) * mmax * n), "alloc y");

	for (int K = 1; K <= 8; K++) {
		const int64_t nw = (k / 16) * (n / 16) * 16 * K;
		for (int64_t i = 0; i < nw; i++)
			tr[i] = (uint16_t)x3_rng_u64(&r);
		for (int cb = 0; cb < X3_CB_COUNT; cb++) {
			const int with_bias = (K + cb) & 1;
			CHECK_OK(x3_trellis_decode(K, cb, tr, k, n, wt), "cpu decode");
			dense_ref(wt, suh, svh, k, n, W);
			x3_gpu_linear *L = NULL;
			CHECK_OK(x3_gpu_linear_create(K, cb, k, n, tr, suh, svh, with_bias ? bias : NULL, &L),
			         "create K=%d cb=%d", K, cb);
			if (!L)
				continue;
			CHECK_OK(x3_gpu_linear_weight(L, 1, wg), "inner weight");
			CHECK(!memcmp(wg, wt, sizeof(float) * k * n), "K=%d %s: linear W~ bit-identical", K,
			      x3_codebook_name(cb));
			for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
				const int m = ms[mi];
				for (int i = 0; i < m; i++)
					for (int64_t j = 0; j < n; j++) {
						double s = with_bias ? x3_f16_to_f32(bias[j]) : 0.0;
						for (int64_t c = 0; c < k; c++)
							s += (double)x[i * k + c] * W[c * n + j];
						yr[i * n + j] = s;
					}
				for (int path = 0; path <= 3; path++) {
					if (m > 16 && (path == 1 || path == 3))
						continue;
					if (path == 0)
						CHECK_OK(x3_gpu_linear_forward(L, x, m, y), "forward m=%d", m);
					else {
						CHECK_OK(x3_gpu_upload(x_d, x, sizeof(float) * m * k), "upload");
						CHECK_OK(x3_gpu_linear_forward_d(L, x_d, m, y_d, path), "forward_d");
						CHECK_OK(x3_gpu_download(y, y_d, sizeof(float) * m * n), "download");
					}
					double num = 0, den = 0;
					for (int64_t i = 0; i < m * n; i++) {
						num += (y[i] - yr[i]) * (y[i] - yr[i]);
						den += yr[i] * yr[i];
					}
					const double e = sqrt(num / den);
					const int pe = path ? path : m <= 16 ? 1 : 2;
					CHECK(e <= budget[pe][K], "K=%d %s m=%d%s %s: relative error %.3g (budget %g)",
					      K, x3_codebook_name(cb), m, with_bias ? " +bias" : "",
					      path ? path_name[path] : pe == 1 ? "auto=gemv-mma" : "auto=gemm", e,
					      budget[pe][K]);
				}
			}
			x3_gpu_linear_free(L);
		}
	}
	/* the same layer through exl3.h: GPU forward vs x3_exl3_matmul */
	{
		const int K = 3, rows = 3;
		const int64_t shp[3] = {k / 16, n / 16, 16 * K};
		x3_tensor *tt = x3_tensor_new("l.trellis", X3_I16, 3, shp, 1);
		x3_tensor *ts = x3_tensor_new1("l.suh", X3_F16, k), *tv = x3_tensor_new1("l.svh", X3_F16, n);
		x3_tensor *tm = x3_tensor_new("l.mul1", X3_I32, 0, shp, 1);
		for (int64_t i = 0; i < (k / 16) * (n / 16) * 16 * K; i++)
			((uint16_t *)tt->data)[i] = (uint16_t)x3_rng_u64(&r);
		memcpy(ts->data, suh, 2 * k);
		memcpy(tv->data, svh, 2 * n);
		*(int32_t *)tm->data = (int32_t)X3_MUL1_MULT;
		const x3_tensor *parts[4] = {tt, ts, tv, tm};
		x3_exl3 *e = NULL;
		CHECK_OK(x3_exl3_from_tensors("l", parts, 4, &e), "exl3 layer");
		x3_gpu_linear *G = NULL;
		if (e)
			CHECK_OK(x3_gpu_linear_from_exl3(e, &G), "gpu layer from exl3");
		if (e && G) {
			float *yc = malloc(sizeof(float) * rows * n);
			CHECK_OK(x3_exl3_matmul(e, x, rows, k, yc, 0), "cpu matmul");
			CHECK_OK(x3_gpu_linear_forward(G, x, rows, y), "gpu forward");
			double num = 0, den = 0;
			for (int64_t i = 0; i < rows * n; i++) {
				num += ((double)y[i] - yc[i]) * ((double)y[i] - yc[i]);
				den += (double)yc[i] * yc[i];
			}
			CHECK(sqrt(num / den) <= 2e-3, "gpu vs x3_exl3_matmul: relative error %.3g (budget 2e-3)",
			      sqrt(num / den));
			float *wh = malloc(sizeof(float) * k * n);
			CHECK_OK(x3_exl3_dequant(e, wh), "cpu dequant (out x in)");
			CHECK_OK(x3_gpu_linear_weight(G, 0, wg), "gpu weight (k x n)");
			double md = 0, mw = 0;
			for (int64_t i = 0; i < k; i++)
				for (int64_t j = 0; j < n; j++) {
					md = fmax(md, fabs((double)wg[i * n + j] - wh[j * k + i]));
					mw = fmax(mw, fabs((double)wh[j * k + i]));
				}
			CHECK(md <= 1e-5 * mw, "gpu weight vs x3_exl3_dequant: max error %.3g of max |W|",
			      md / mw);
			free(yc), free(wh);
		}
		x3_gpu_linear_free(G);
		x3_exl3_free(e);
		x3_tensor_free(tt), x3_tensor_free(ts), x3_tensor_free(tv), x3_tensor_free(tm);
	}
	uint16_t h[256] = {0};
	x3_gpu_linear *L = NULL;
	CHECK(x3_gpu_linear_create(2, 0, 128, 100, tr, h, h, NULL, &L) == X3_EINVAL && !L,
	      "n=100 refused: %s", x3_errmsg());
	free(tr), free(suh), free(svh), free(bias), free(wt), free(wg), free(W), free(x), free(y);
	free(yr);
	x3_gpu_free(x_d);
	x3_gpu_free(y_d);
	TEST_DONE();
}
