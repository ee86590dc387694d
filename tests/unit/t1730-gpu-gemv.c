/* t1730-gpu-gemv: the GPU EXL3 linear (fused decode GEMV for m <= 16,
 * reconstruct + cuBLAS GEMM above) against a float64 product with the
 * dequantized weight, for K = 1..8 and all codebooks, with and without
 * bias, on every path: 1/3 the fused one-launch GEMV (tensor cores / fp32),
 * 4/5 the same unfused (Hadamard, memset, GEMV, Hadamard launches), 2 the
 * GEMM, 0 auto. Then the fused GEMV on several shapes (one and several
 * k-slices, one and an odd number of 128-column groups) for every m = 1..16:
 * against float64, against the unfused path (same x', only the order of
 * the atomic sums differs), back-to-back calls with y poisoned in between
 * (the kernel must leave its scratch and arrival counters zero: the second
 * call equals the first), in place (path 0 falls back to unfused, paths
 * 1/3 refuse). On cusim the fused shapes also run with the blocks in
 * reverse and random order (X3SIM_BLOCKS), so that a different block
 * finishes each 128-column group. Skips without a device. On cusim, the
 * CPU emulator (device name "... emulated ..."), the weights are smaller
 * (256x128 instead of 1024x512, and so on).
 *
 * Error budgets (||y - y_ref||_F / ||y_ref||_F), the same for every K since
 * W~ is decoded exactly and only the arithmetic differs:
 *   fused GEMV, tensor cores (path 1, the default for m <= 16): x' rounded
 *               to fp16 (relative 2^-11), fp32 accumulation: 2e-3
 *               (expected ~3e-4);
 *   fused GEMV, fp32 FMAs (path 3): fp32 Hadamards and accumulation over
 *               k = 1024: 1e-5 (expected ~1e-6);
 *   unfused GEMV (paths 4, 5): as 1 and 3;
 *   fused vs unfused: fp32 paths (3 vs 5) 1e-5 (different fp32 sum order);
 *               tensor-core paths (1 vs 4) 1e-4: the two compute x' in
 *               fp32 by their own code (the fused kernel's staged Hadamard,
 *               FMA contraction by nvcc), so x' may differ by an ulp, and
 *               an x' element on an fp16 rounding boundary then rounds to
 *               the other fp16 neighbour (2^-11 of it). Measured on an
 *               H200 (2026-12-04): up to 1.1e-5 (K=6 mul1 2048x1280,
 *               m=12), 2.8e-6 (K=4 mcg 4096x384); fp32 paths <= 3.8e-7;
 *   back-to-back fused calls: 1e-5 (bit-identical unless the order of the
 *               atomic sums changes, which on a GPU it may);
 *   GEMM path (2, the default above 16 rows): W and x rounded to fp16,
 *               fp32 accumulation: 2e-3 (expected ~4e-4). */
#include <math.h>
#include "gpu-test.h"
#include "codec.h"
#include "device.h"
#include "exl3.h"
#include "gpu_kern.h"

#define NPATH 6
/* [path][K] */
static const double budget[NPATH][9] = {
	{0},
	{0, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3},
	{0, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3},
	{0, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5},
	{0, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3},
	{0, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5},
};
static const char *path_name[NPATH] = {"auto", "gemv-mma", "gemm", "gemv-fma", "unfused-mma",
                                       "unfused-fma"};
#define SAME_BUDGET 1e-5       /* back-to-back; fused vs unfused, fp32 */
#define SAME_BUDGET_MMA 1e-4   /* fused vs unfused, tensor cores (above) */

static double rel_err(const float *y, const double *yr, int64_t len)
{
	double num = 0, den = 0;
	for (int64_t i = 0; i < len; i++) {
		num += (y[i] - yr[i]) * (y[i] - yr[i]);
		den += yr[i] * yr[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ||a - b|| / ||b|| in float64; NaN anywhere gives NaN */
static double rel_diff(const float *a, const float *b, int64_t len)
{
	double num = 0, den = 0;
	for (int64_t i = 0; i < len; i++) {
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

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

/* y (m, n) = x (m, k) W (k, n) in float64 */
static void ref_mm(const float *x, const double *W, int m, int64_t k, int64_t n, double *y)
{
	for (int i = 0; i < m; i++)
		for (int64_t j = 0; j < n; j++) {
			double acc = 0;
			for (int64_t c = 0; c < k; c++)
				acc += (double)x[i * k + c] * W[c * n + j];
			y[i * n + j] = acc;
		}
}

static int nan_max(double *worst, double v)
{
	if (!(v <= *worst)) {   /* NaN sticks */
		*worst = v;
		return 1;
	}
	return 0;
}

/* k-slices the fused GEMV uses (kernels/gemv.cu: ksplit rounded to whole
 * 128-column chunks; the shared-memory cap does not bind here) */
static int64_t fused_slices(int64_t k, int64_t n)
{
	const int64_t tk = k / 16, ks = G->gemv_ksplit(k, n);
	int64_t kbps = (tk + ks - 1) / ks;
	kbps = (kbps + 7) / 8 * 8;
	return (tk + kbps - 1) / kbps;
}

/* The fused GEMV (paths 1, 3) on one (k, n) for every m = 1..16, bias on
 * odd m: the worst error against float64, against the unfused path (4, 5)
 * and between two back-to-back calls with y poisoned (NaN) in between
 * (bit-identical if exact). tag: the block order (cusim) for messages. */
static void fused_shape(x3_rng *r, int64_t k, int64_t n, int K, int cb, const char *tag, int exact)
{
	const int M = X3K_GEMV_MAX_M;
	uint16_t *tr = malloc((size_t)(k * n / 256) * 16 * K * 2);
	uint16_t *suh = malloc(2 * k), *svh = malloc(2 * n), *bias = malloc(2 * n);
	float *wt = malloc(sizeof(float) * k * n), *x = malloc(sizeof(float) * M * k);
	float *y = malloc(sizeof(float) * M * n), *y2 = malloc(sizeof(float) * M * n);
	float *yu = malloc(sizeof(float) * M * n);
	double *W = malloc(sizeof(double) * k * n), *P = malloc(sizeof(double) * M * n);
	double *yr = malloc(sizeof(double) * M * n);
	for (int64_t i = 0; i < (k / 16) * (n / 16) * 16 * K; i++)
		tr[i] = (uint16_t)x3_rng_u64(r);
	for (int64_t i = 0; i < k; i++)
		suh[i] = x3_f32_to_f16((float)((x3_rng_uniform(r) + 0.5) * (i % 7 ? 0.03 : -0.03)));
	for (int64_t j = 0; j < n; j++) {
		svh[j] = x3_f32_to_f16((float)((x3_rng_uniform(r) + 0.5) * (j % 3 ? 1 : -1)));
		bias[j] = x3_f32_to_f16((float)x3_rng_normal(r));
	}
	for (int64_t i = 0; i < M * k; i++)
		x[i] = (float)x3_rng_normal(r);
	CHECK_OK(x3_trellis_decode(K, cb, tr, k, n, wt), "cpu decode");
	dense_ref(wt, suh, svh, k, n, W);
	ref_mm(x, W, M, k, n, P);
	x3_gpu_linear *L[2] = {NULL, NULL};   /* without, with bias */
	CHECK_OK(G->linear_create(K, cb, k, n, tr, suh, svh, NULL, &L[0]), "create");
	CHECK_OK(G->linear_create(K, cb, k, n, tr, suh, svh, bias, &L[1]), "create +bias");
	float *x_d = NULL, *y_d = NULL;
	CHECK_OK(G->alloc((void **)&x_d, sizeof(float) * M * k), "alloc x");
	CHECK_OK(G->alloc((void **)&y_d, sizeof(float) * M * n), "alloc y");
	CHECK_OK(G->upload(x_d, x, sizeof(float) * M * k), "upload x");
	const int64_t sl = fused_slices(k, n);
	for (int path = 1; L[0] && L[1] && x_d && y_d && path <= 3; path += 2) {
		const int unf = path == 1 ? 4 : 5;   /* the unfused form */
		double we = 0, wu = 0, wr = 0;
		int me = 0, mu = 0, mr = 0, calls_ok = 1, same = 1;
		for (int m = 1; m <= M; m++) {
			const int b = m & 1;
			for (int64_t i = 0; i < m * n; i++)
				yr[i] = P[i] + (b ? x3_f16_to_f32(bias[i % n]) : 0.0);
			int rc = G->memset(y_d, 0xff, sizeof(float) * m * n);
			rc = rc ? rc : G->linear_forward_d(L[b], x_d, m, y_d, path);
			rc = rc ? rc : G->download(y, y_d, sizeof(float) * m * n);
			rc = rc ? rc : G->memset(y_d, 0xff, sizeof(float) * m * n);
			rc = rc ? rc : G->linear_forward_d(L[b], x_d, m, y_d, path);
			rc = rc ? rc : G->download(y2, y_d, sizeof(float) * m * n);
			rc = rc ? rc : G->memset(y_d, 0xff, sizeof(float) * m * n);
			rc = rc ? rc : G->linear_forward_d(L[b], x_d, m, y_d, unf);
			rc = rc ? rc : G->download(yu, y_d, sizeof(float) * m * n);
			if (rc) {
				CHECK_OK(rc, "%s %lldx%lld m=%d: forward calls", path_name[path], (long long)k,
				         (long long)n, m);
				calls_ok = 0;
				break;
			}
			if (nan_max(&we, rel_err(y, yr, m * n)))
				me = m;
			if (nan_max(&wu, rel_diff(yu, y, m * n)))
				mu = m;
			if (nan_max(&wr, rel_diff(y2, y, m * n)))
				mr = m;
			same &= !memcmp(y, y2, sizeof(float) * m * n);
		}
		if (!calls_ok)
			continue;
		char what[160];
		snprintf(what, sizeof what, "%s K=%d %s %lldx%lld (%lld k-slice%s, %lld groups, %s blocks)",
		         path_name[path], K, x3_codebook_name(cb), (long long)k, (long long)n,
		         (long long)sl, sl > 1 ? "s" : "", (long long)(n / 128), tag);
		CHECK(we <= budget[path][K], "%s m=1..16: worst relative error %.3g at m=%d (budget %g)",
		      what, we, me, budget[path][K]);
		const double sb = path == 1 ? SAME_BUDGET_MMA : SAME_BUDGET;
		CHECK(wu <= sb, "%s: vs %s worst %.3g at m=%d (budget %g)", what, path_name[unf], wu,
		      mu, sb);
		if (exact)
			CHECK(same, "%s: back-to-back calls bit-identical (scratch and counters reset)", what);
		else
			CHECK(wr <= SAME_BUDGET, "%s: back-to-back calls worst %.3g at m=%d (budget %g)",
			      what, wr, mr, SAME_BUDGET);
	}
	G->linear_free(L[0]);
	G->linear_free(L[1]);
	G->free(x_d), G->free(y_d);
	free(tr), free(suh), free(svh), free(bias), free(wt), free(x), free(y), free(y2), free(yu);
	free(W), free(P), free(yr);
}

/* In place (x_d == y_d, k == n): path 0 runs the unfused GEMV and is right,
 * the fused paths refuse. */
static void in_place(x3_rng *r)
{
	const int64_t k = 128, n = 128;
	const int K = 4, cb = X3_CB_MCG, m = 3;
	uint16_t *tr = malloc((size_t)(k * n / 256) * 16 * K * 2), suh[128], svh[128];
	float *wt = malloc(sizeof(float) * k * n), x[3 * 128], y[3 * 128];
	double *W = malloc(sizeof(double) * k * n), yr[3 * 128];
	for (int64_t i = 0; i < (k / 16) * (n / 16) * 16 * K; i++)
		tr[i] = (uint16_t)x3_rng_u64(r);
	for (int i = 0; i < 128; i++) {
		suh[i] = x3_f32_to_f16(i % 2 ? 0.02f : -0.02f);
		svh[i] = x3_f32_to_f16(i % 3 ? 1.0f : -0.5f);
	}
	for (int i = 0; i < m * 128; i++)
		x[i] = (float)x3_rng_normal(r);
	CHECK_OK(x3_trellis_decode(K, cb, tr, k, n, wt), "cpu decode");
	dense_ref(wt, suh, svh, k, n, W);
	ref_mm(x, W, m, k, n, yr);
	x3_gpu_linear *L = NULL;
	float *xy_d = NULL;
	CHECK_OK(G->linear_create(K, cb, k, n, tr, suh, svh, NULL, &L), "create");
	CHECK_OK(G->alloc((void **)&xy_d, sizeof x), "alloc");
	if (L && xy_d) {
		CHECK_OK(G->upload(xy_d, x, sizeof x), "upload");
		CHECK(G->linear_forward_d(L, xy_d, m, xy_d, 1) == X3_EINVAL,
		      "fused path 1 in place refused: %s", x3_errmsg());
		CHECK(G->linear_forward_d(L, xy_d, m, xy_d + 1, 3) == X3_EINVAL,
		      "fused path 3 on overlapping x, y refused: %s", x3_errmsg());
		CHECK_OK(G->linear_forward_d(L, xy_d, m, xy_d, 0), "path 0 in place");
		CHECK_OK(G->download(y, xy_d, sizeof y), "download");
		const double e = rel_err(y, yr, m * n);
		CHECK(e <= budget[4][K], "path 0 in place (unfused): relative error %.3g (budget %g)", e,
		      budget[4][K]);
	}
	G->linear_free(L);
	G->free(xy_d);
	free(tr), free(wt), free(W);
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
	CHECK_OK(G->alloc((void **)&x_d, sizeof(float) * mmax * k), "alloc x");
	CHECK_OK(G->alloc((void **)&y_d, sizeof(float) * mmax * n), "alloc y");

	for (int K = 1; K <= 8; K++) {
		const int64_t nw = (k / 16) * (n / 16) * 16 * K;
		for (int64_t i = 0; i < nw; i++)
			tr[i] = (uint16_t)x3_rng_u64(&r);
		for (int cb = 0; cb < X3_CB_COUNT; cb++) {
			const int with_bias = (K + cb) & 1;
			CHECK_OK(x3_trellis_decode(K, cb, tr, k, n, wt), "cpu decode");
			dense_ref(wt, suh, svh, k, n, W);
			x3_gpu_linear *L = NULL;
			CHECK_OK(G->linear_create(K, cb, k, n, tr, suh, svh, with_bias ? bias : NULL, &L),
			         "create K=%d cb=%d", K, cb);
			if (!L)
				continue;
			CHECK_OK(G->linear_weight(L, 1, wg), "inner weight");
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
				for (int path = 0; path < NPATH; path++) {
					if (m > 16 && path != 0 && path != 2)
						continue;
					if (path == 0)
						CHECK_OK(G->linear_forward(L, x, m, y), "forward m=%d", m);
					else {
						CHECK_OK(G->upload(x_d, x, sizeof(float) * m * k), "upload");
						CHECK_OK(G->linear_forward_d(L, x_d, m, y_d, path), "forward_d");
						CHECK_OK(G->download(y, y_d, sizeof(float) * m * n), "download");
					}
					const double e = rel_err(y, yr, m * n);
					const int pe = path ? path : m <= 16 ? 1 : 2;
					CHECK(e <= budget[pe][K], "K=%d %s m=%d%s %s: relative error %.3g (budget %g)",
					      K, x3_codebook_name(cb), m, with_bias ? " +bias" : "",
					      path ? path_name[path] : pe == 1 ? "auto=gemv-mma" : "auto=gemm", e,
					      budget[pe][K]);
				}
			}
			G->linear_free(L);
		}
	}
	/* the fused GEMV on several shapes, every m = 1..16 */
	{
		const int64_t shp_emu[3][2] = {{128, 128}, {512, 384}, {1024, 128}};
		const int64_t shp_dev[3][2] = {{128, 128}, {4096, 384}, {2048, 1280}};
		const int64_t(*shp)[2] = emulated ? shp_emu : shp_dev;
		const char *bo = getenv("X3SIM_BLOCKS");
		const int rand_blocks = bo && !strncmp(bo, "rand", 4);
		int64_t most = 1;
		for (int i = 0; i < 3; i++) {
			const int64_t sl = fused_slices(shp[i][0], shp[i][1]);
			most = sl > most ? sl : most;
			fused_shape(&r, shp[i][0], shp[i][1], 2 + 2 * i, i, emulated ? "in-order" : "device",
			            emulated && !rand_blocks);
		}
		CHECK(most > 1, "a fused shape has several k-slices (%lld)", (long long)most);
		/* cusim runs blocks one at a time: run them backwards and shuffled
		 * too, so that other blocks finish the groups */
		if (emulated && !bo) {
			const char *orders[2] = {"rev", "rand:1730"};
			for (int o = 0; o < 2; o++) {
				setenv("X3SIM_BLOCKS", orders[o], 1);
				for (int i = 1; i < 3; i++)
					fused_shape(&r, shp[i][0], shp[i][1], 3, 2 - i, orders[o], o == 0);
			}
			unsetenv("X3SIM_BLOCKS");
		}
		in_place(&r);
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
		x3_gpu_linear *GL = NULL;
		if (e)
			CHECK_OK(x3_exl3_upload(e, G, &GL), "gpu layer from exl3");
		if (e && GL) {
			float *yc = malloc(sizeof(float) * rows * n);
			CHECK_OK(x3_exl3_matmul(e, x, rows, k, yc, 0), "cpu matmul");
			CHECK_OK(G->linear_forward(GL, x, rows, y), "gpu forward");
			double num = 0, den = 0;
			for (int64_t i = 0; i < rows * n; i++) {
				num += ((double)y[i] - yc[i]) * ((double)y[i] - yc[i]);
				den += (double)yc[i] * yc[i];
			}
			CHECK(sqrt(num / den) <= 2e-3, "gpu vs x3_exl3_matmul: relative error %.3g (budget 2e-3)",
			      sqrt(num / den));
			float *wh = malloc(sizeof(float) * k * n);
			CHECK_OK(x3_exl3_dequant(e, wh), "cpu dequant (out x in)");
			CHECK_OK(G->linear_weight(GL, 0, wg), "gpu weight (k x n)");
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
		G->linear_free(GL);
		x3_exl3_free(e);
		x3_tensor_free(tt), x3_tensor_free(ts), x3_tensor_free(tv), x3_tensor_free(tm);
	}
	uint16_t h[256] = {0};
	x3_gpu_linear *L = NULL;
	CHECK(G->linear_create(2, 0, 128, 100, tr, h, h, NULL, &L) == X3_EINVAL && !L,
	      "n=100 refused: %s", x3_errmsg());
	free(tr), free(suh), free(svh), free(bias), free(wt), free(wg), free(W), free(x), free(y);
	free(yr);
	G->free(x_d);
	G->free(y_d);
	TEST_DONE();
}
