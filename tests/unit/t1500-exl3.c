/* t1500-exl3: the EXL3 linear layer (lib/codec/exl3.c, lib/codec/exl3mm.c).
 *  - exl3(5) §12.2 tile vector decoded through the full matmul path;
 *  - every fast path (scalar, avx2, avx512 where the CPU has them) against
 *    the plain C reference for K = 1..8 x 3 codebooks, batch 1 and > 1,
 *    with and without bias;
 *  - padded shapes (in 64 -> 128, out 172 -> 256) against the
 *    reconstruction formula evaluated densely in float64 here;
 *  - validation errors naming the tensor.
 * Tolerance: fast and reference both accumulate in fp32 in different
 * orders; we require max |fast - ref| <= 1e-5 · (max |ref| + rms(ref)) (observed ~1e-7). */
#include <math.h>
#include <string.h>
#include "codec.h"
#include "exl3.h"
#include "test.h"

static const char *const isas[] = { "scalar", "avx2", "avx512" };

/* exl3(5) §12.2 tile vector words (K = 4) */
static const uint16_t tile14[64] = {
	0xbb2b, 0x6e1b, 0xcc17, 0x46df, 0x62f7, 0x1f1e, 0xa8c9, 0x7679,
	0x2518, 0xa63b, 0x7e5b, 0xc45f, 0xc3a6, 0xa298, 0xfff6, 0xef99,
	0xdae6, 0xe38d, 0xc9de, 0xa46e, 0x0bf1, 0xf610, 0x9c3d, 0x8505,
	0x232d, 0xab89, 0x2638, 0x6fa5, 0xc281, 0x921e, 0x16f7, 0xc265,
	0xa845, 0x69d6, 0x1bd1, 0x8c7c, 0x71bf, 0xef09, 0xd5dd, 0x3d10,
	0xefe6, 0xb3de, 0x1331, 0x846a, 0xa001, 0x847b, 0x7235, 0x3f90,
	0x5258, 0x0117, 0xb4f0, 0xfee9, 0xb600, 0xd9ea, 0x65a8, 0x6f7c,
	0x7942, 0xcb0b, 0x5675, 0x3280, 0x4b34, 0x77c0, 0x359e, 0x263c,
};

/* A random EXL3 group: tensors[0..*nt) named key.{trellis,suh,svh,...}. */
static int make_group(const char *key, int64_t k, int64_t n, int K, int cb,
                      int bias, uint64_t seed, x3_tensor **ts)
{
	char name[256];
	x3_rng r;
	x3_rng_seed(&r, seed, 0);
	int nt = 0;
	int64_t sh[3] = { k / 16, n / 16, 16 * K };
	snprintf(name, sizeof name, "%s.trellis", key);
	ts[nt] = x3_tensor_new(name, X3_I16, 3, sh, 1);
	uint16_t *w = ts[nt++]->data;
	for (int64_t i = 0; i < sh[0] * sh[1] * sh[2]; i++)
		w[i] = (uint16_t)x3_rng_u64(&r);   /* every bit pattern is a valid tile */
	const char *vn[3] = { "suh", "svh", "bias" };
	int64_t vl[3] = { k, n, n };
	for (int v = 0; v < 2 + !!bias; v++) {
		snprintf(name, sizeof name, "%s.%s", key, vn[v]);
		ts[nt] = x3_tensor_new1(name, X3_F16, vl[v]);
		uint16_t *h = ts[nt++]->data;
		for (int64_t i = 0; i < vl[v]; i++)
			h[i] = x3_f32_to_f16((float)(x3_rng_normal(&r) * (v == 2 ? 1.0 : 0.05)));
	}
	if (cb != X3_CB_3INST) {
		snprintf(name, sizeof name, "%s.%s", key, cb == X3_CB_MCG ? "mcg" : "mul1");
		ts[nt] = x3_tensor_new(name, X3_I32, 0, sh, 1);
		uint32_t m = cb == X3_CB_MCG ? X3_MCG_MULT : X3_MUL1_MULT;
		memcpy(ts[nt++]->data, &m, 4);
	}
	return nt;
}

static void free_group(x3_tensor **ts, int nt)
{
	for (int i = 0; i < nt; i++)
		x3_tensor_free(ts[i]);
}

/* float64 H128/sqrt(128) applied to each 128-chunk of v (len % 128 == 0) */
static void had_d(double *v, int64_t len, int64_t stride)
{
	for (int64_t b = 0; b < len; b += 128) {
		for (int h = 1; h < 128; h *= 2)
			for (int i = 0; i < 128; i += 2 * h)
				for (int j = i; j < i + h; j++) {
					double a = v[(b + j) * stride], c = v[(b + j + h) * stride];
					v[(b + j) * stride] = a + c;
					v[(b + j + h) * stride] = a - c;
				}
		for (int i = 0; i < 128; i++)
			v[(b + i) * stride] /= sqrt(128.0);
	}
}

static float *rand_x(int64_t rows, int64_t cols, uint64_t seed)
{
	x3_rng r;
	x3_rng_seed(&r, seed, 7);
	float *x = malloc((size_t)(rows * cols) * sizeof *x);
	for (int64_t i = 0; i < rows * cols; i++)
		x[i] = (float)x3_rng_normal(&r);
	return x;
}

/* max |a-b| <= tol·(max|b| + rms(b)) */
static int close_to(const float *a, const float *b, int64_t n, double tol, double *err)
{
	double mx = 0, ss = 0, d = 0;
	for (int64_t i = 0; i < n; i++) {
		mx = fmax(mx, fabs(b[i]));
		ss += (double)b[i] * b[i];
		double e = fabs((double)a[i] - b[i]);
		if (e > d || isnan(e))
			d = e;
	}
	double scale = mx + sqrt(ss / (double)n);
	*err = scale > 0 ? d / scale : d;
	return *err <= tol;
}

static void test_tile_vector(void)
{
	/* values from exl3(5) §12.2: tile[0][0..3], tile[1][0], tile[15][15], sum */
	static const double want[3][7] = {
		{ 0.122314453125, -1.6533203125, 2.01171875, -0.185302734375, -0.896484375, -0.374755859375, -5.388794 },
		{ -0.0390625, -2.0859375, -1.3369140625, -1.8935546875, -0.71875, -0.1083984375, 16.875977 },
		{ -1.111328125, -2.03125, -0.177734375, -0.71240234375, 1.5888671875, -0.204833984375, 1.462868 },
	};
	for (int cb = 0; cb < 3; cb++) {
		x3_tensor *ts[6];
		int nt = make_group("vec", 128, 128, 4, cb, 0, 99, ts);
		memcpy(ts[0]->data, tile14, sizeof tile14);   /* tile (0, 0) */
		uint16_t *s = ts[1]->data, *v = ts[2]->data;
		for (int i = 0; i < 128; i++)
			s[i] = v[i] = x3_f32_to_f16(1.0f);
		x3_exl3 *e;
		CHECK_OK(x3_exl3_from_tensors("vec", (const x3_tensor *const *)ts, nt, &e),
		         "load tile-vector tensor (%s)", x3_codebook_name(cb));
		/* X = Hb: x' = I, y' = W~, y = W~·Hb; so W~ = Y·Hb */
		float *x = malloc(128 * 128 * sizeof *x), *y = malloc(128 * 128 * sizeof *y);
		double *d = malloc(128 * 128 * sizeof *d);
		for (int i = 0; i < 128; i++)
			for (int j = 0; j < 128; j++)
				x[i * 128 + j] = (float)((__builtin_popcount(i & j) & 1 ? -1 : 1) / sqrt(128.0));
		for (int p = 0; p < 3; p++) {
			if (x3_exl3_simd_set(isas[p]) != X3_OK) {
				SKIP("%s: tile vector via %s path (not supported here)", x3_codebook_name(cb), isas[p]);
				continue;
			}
			CHECK_OK(x3_exl3_matmul(e, x, 128, 128, y, 0), "matmul %s", isas[p]);
			for (int i = 0; i < 128 * 128; i++)
				d[i] = y[i];
			for (int i = 0; i < 128; i++)
				had_d(d + i * 128, 128, 1);
			double got[7] = { d[0], d[1], d[2], d[3], d[128], d[15 * 128 + 15], 0 };
			int ok = 1;
			for (int r = 0; r < 16; r++)
				for (int c = 0; c < 16; c++) {
					got[6] += d[r * 128 + c];
					/* every decoded value is an fp16 number */
					double q = x3_round_f16((float)d[r * 128 + c]);
					ok &= fabs(q - d[r * 128 + c]) < 2e-5;
				}
			for (int i = 0; i < 6; i++)
				ok &= fabs(got[i] - want[cb][i]) < 2e-5;
			ok &= fabs(got[6] - want[cb][6]) < 2e-3;
			CHECK(ok, "%s: exl3(5) §12.2 tile via %s matmul (tile[0][0] %.6f, sum %.6f)",
			      x3_codebook_name(cb), isas[p], got[0], got[6]);
		}
		x3_exl3_simd_set(NULL);
		free(x);
		free(y);
		free(d);
		x3_exl3_free(e);
		free_group(ts, nt);
	}
}

static void test_fast_vs_ref(void)
{
	/* rows 1: GEMV; 3: multi-row GEMV; 8, 9, 35: GEMM (partial chunks); 300: GEMM in two row blocks;
	 * the last case is big enough (>= 2^20 weights) to run on 2 threads */
	const int64_t rowsv[6] = { 1, 3, 8, 9, 35, 300 };
	for (int ci = 0; ci < 27; ci++) {
			int K = ci < 24 ? 1 + ci / 3 : 3, cb = ci % 3;
			int64_t k = ci < 24 ? 256 : 1024, n = ci < 24 ? 384 : 1152;
			x3_tensor *ts[6];
			int bias = (K + cb) & 1;
			int nt = make_group("m", k, n, K, cb, bias, (uint64_t)(100 * K + cb), ts);
			x3_exl3 *e;
			if (x3_exl3_from_tensors("m", (const x3_tensor *const *)ts, nt, &e)) {
				CHECK(0, "load K=%d %s: %s", K, x3_codebook_name(cb), x3_errmsg());
				continue;
			}
			for (int ri = 0; ri < 6; ri++) {
				int64_t rows = rowsv[ri];
				float *x = rand_x(rows, k, (uint64_t)(K * 10 + cb + ri));
				float *yr = malloc((size_t)(rows * n) * sizeof *yr);
				float *yf = malloc((size_t)(rows * n) * sizeof *yf);
				int rc = x3_exl3_matmul_ref(e, x, rows, k, yr);
				for (int p = 0; p < 3; p++) {
					if (x3_exl3_simd_set(isas[p]) != X3_OK) {
						SKIP("K=%d %s rows=%lld %s (not supported here)", K,
						     x3_codebook_name(cb), (long long)rows, isas[p]);
						continue;
					}
					double err;
					int ok = rc == X3_OK &&
					         x3_exl3_matmul(e, x, rows, k, yf, 2) == X3_OK &&
					         close_to(yf, yr, rows * n, 1e-5, &err);
					CHECK(ok, "%lldx%lld K=%d %s rows=%lld bias=%d: %s == reference (rel err %.2g)",
					      (long long)k, (long long)n, K, x3_codebook_name(cb), (long long)rows,
					      bias, isas[p], ok ? err : -1.0);
				}
				x3_exl3_simd_set(NULL);
				free(x);
				free(yr);
				free(yf);
			}
			x3_exl3_free(e);
			free_group(ts, nt);
		}
}

/* Padded layer: in 64 -> k 128, out 172 -> n 256. Dense W from the formula
 * in float64; check dequant and matmul (narrow and padded X) against it. */
static void test_padded(void)
{
	const int64_t k = 128, n = 256, in = 64, out = 172, rows = 7;
	x3_tensor *ts[6];
	int nt = make_group("pad", k, n, 3, X3_CB_MUL1, 1, 4242, ts);
	x3_exl3 *e;
	CHECK_OK(x3_exl3_from_tensors("pad", (const x3_tensor *const *)ts, nt, &e), "load padded");
	CHECK_OK(x3_exl3_set_orig(e, in, out), "set original sizes 64 x 172");
	float *wt = malloc((size_t)(k * n) * sizeof *wt);
	CHECK_OK(x3_exl3_inner(e, wt), "decode W~");
	/* W = diag(suh) Hb_k W~ Hb_n diag(svh), in float64 */
	double *W = malloc((size_t)(k * n) * sizeof *W);
	for (int64_t i = 0; i < k * n; i++)
		W[i] = wt[i];
	for (int64_t c = 0; c < n; c++)
		had_d(W + c, k, n);
	for (int64_t r = 0; r < k; r++)
		had_d(W + r * n, n, 1);
	const uint16_t *suh = ts[1]->data, *svh = ts[2]->data, *bias = ts[3]->data;
	for (int64_t r = 0; r < k; r++)
		for (int64_t c = 0; c < n; c++)
			W[r * n + c] *= (double)x3_f16_to_f32(suh[r]) * x3_f16_to_f32(svh[c]);
	float *wd = malloc((size_t)(out * in) * sizeof *wd), *wr = malloc((size_t)(out * in) * sizeof *wr);
	for (int64_t o = 0; o < out; o++)
		for (int64_t i = 0; i < in; i++)
			wr[o * in + i] = (float)W[i * n + o];
	double err;
	CHECK_OK(x3_exl3_dequant(e, wd), "dequant padded");
	CHECK(close_to(wd, wr, out * in, 1e-5, &err), "dequant (172 x 64) == float64 formula (rel err %.2g)", err);

	float *x = rand_x(rows, k, 5);
	for (int64_t r = 0; r < rows; r++)   /* padded input columns must not matter */
		for (int64_t i = in; i < k; i++)
			x[r * k + i] = 0;
	float *xn = malloc((size_t)(rows * in) * sizeof *xn);
	for (int64_t r = 0; r < rows; r++)
		memcpy(xn + r * in, x + r * k, (size_t)in * sizeof *xn);
	float *yd = malloc((size_t)(rows * out) * sizeof *yd), *y = malloc((size_t)(rows * out) * sizeof *y);
	for (int64_t r = 0; r < rows; r++)
		for (int64_t o = 0; o < out; o++) {
			double s = x3_f16_to_f32(bias[o]);
			for (int64_t i = 0; i < in; i++)
				s += (double)xn[r * in + i] * W[i * n + o];
			yd[r * out + o] = (float)s;
		}
	for (int64_t rr = 1; rr <= rows; rr += rows - 1) {
		CHECK(x3_exl3_matmul(e, xn, rr, in, y, 0) == X3_OK &&
		      close_to(y, yd, rr * out, 1e-5, &err),
		      "matmul rows=%lld with 64-wide X == float64 formula, trimmed to 172 (rel err %.2g)",
		      (long long)rr, err);
		CHECK(x3_exl3_matmul(e, x, rr, k, y, 0) == X3_OK &&
		      close_to(y, yd, rr * out, 1e-5, &err),
		      "matmul rows=%lld with padded 128-wide X (rel err %.2g)", (long long)rr, err);
		CHECK(x3_exl3_matmul_ref(e, xn, rr, in, y) == X3_OK &&
		      close_to(y, yd, rr * out, 1e-5, &err),
		      "reference rows=%lld == float64 formula (rel err %.2g)", (long long)rr, err);
	}
	int rc = x3_exl3_matmul(e, xn, rows, 100, y, 0);
	CHECK(rc == X3_EINVAL && strstr(x3_errmsg(), "'pad'") && strstr(x3_errmsg(), "100"),
	      "X width 100 rejected: %s", x3_errmsg());
	CHECK(x3_exl3_set_orig(e, 129, 0) == X3_EINVAL, "in_features 129 > 128 rejected");
	free(wt); free(W); free(wd); free(wr); free(x); free(xn); free(yd); free(y);
	x3_exl3_free(e);
	free_group(ts, nt);
}

static void expect_bad(x3_tensor **ts, int nt, const char *what, const char *pat)
{
	x3_exl3 *e = NULL;
	int rc = x3_exl3_from_tensors("bad", (const x3_tensor *const *)ts, nt, &e);
	CHECK(rc != X3_OK && e == NULL && strstr(x3_errmsg(), "bad") && strstr(x3_errmsg(), pat),
	      "%s rejected: %s", what, x3_errmsg());
	x3_exl3_free(e);
}

static void test_bad(void)
{
	x3_tensor *ts[7];
	int nt = make_group("bad", 128, 128, 2, X3_CB_MCG, 0, 1, ts);
	/* missing suh: leave it out of the list */
	x3_tensor *v[7];
	int m = 0;
	for (int i = 0; i < nt; i++)
		if (i != 1)
			v[m++] = ts[i];
	expect_bad(v, m, "missing suh", "missing 'bad.suh'");
	/* both markers */
	ts[nt] = x3_tensor_new("bad.mul1", X3_I32, 0, NULL, 1);
	uint32_t mm = X3_MUL1_MULT;
	memcpy(ts[nt]->data, &mm, 4);
	expect_bad(ts, nt + 1, "both markers", "both");
	x3_tensor_free(ts[nt]);
	/* wrong marker value */
	uint32_t old;
	memcpy(&old, ts[3]->data, 4);
	mm = 12345;
	memcpy(ts[3]->data, &mm, 4);
	expect_bad(ts, nt, "MCG marker with another multiplier", "multiplier");
	memcpy(ts[3]->data, &old, 4);
	/* suh of the wrong length */
	ts[1]->shape[0] = 64;
	ts[1]->nbytes = 128;
	expect_bad(ts, nt, "suh of length 64", "bad.suh");
	ts[1]->shape[0] = 128;
	ts[1]->nbytes = 256;
	free_group(ts, nt);

	/* K = 9 */
	nt = make_group("bad", 128, 128, 8, 0, 0, 1, ts);
	x3_tensor_free(ts[0]);
	int64_t s9[3] = { 8, 8, 144 };
	ts[0] = x3_tensor_new("bad.trellis", X3_I16, 3, s9, 1);
	expect_bad(ts, nt, "K = 9", "K = 9");
	x3_tensor_free(ts[0]);
	/* 16 x 128 shape: not a multiple of 128 */
	int64_t s16[3] = { 1, 8, 32 };
	ts[0] = x3_tensor_new("bad.trellis", X3_I16, 3, s16, 1);
	expect_bad(ts, nt, "k = 16", "multiple of 128");
	free_group(ts, nt);
}

int main(void)
{
	printf("# simd auto: %s\n", x3_exl3_simd());
	test_tile_vector();
	test_fast_vs_ref();
	test_padded();
	test_bad();
	TEST_DONE();
}
