/* t1201-quant-repeats: the quantizer encodes each distinct tile once
 * (lib/quant/quant_tiles.c); its results must be exactly those of encoding
 * every tile. Padded weights repeat themselves after the Hadamard transform
 * (a 64x64 weight padded to 128x128 is four equal 64x64 blocks), so the
 * scale search and LDLQ see repeated tiles; here both are compared with a
 * plain version that encodes every tile with x3_viterbi_encode. */
#include <math.h>
#include "test.h"
#include "synth.h"
#include "codec.h"
#include "quant.h"

static x3_rng rng;

/* mse(s) of ExLlamaV3's scale search (exl3(5) §9.3), every tile encoded */
static double plain_mse(const float *src, int64_t m, int64_t step, double s, int K, int cb)
{
	int64_t cnt = (m + step - 1) / step;
	float *x = calloc((size_t)(cnt * 256), sizeof(float)), *q = malloc((size_t)(cnt * 256) * sizeof(float));
	for (int64_t t = 0; t < cnt; t++)
		for (int i = 0; i < 256; i++)
			x[t * 256 + i] = (float)(src[t * step * 256 + i] * s);
	double e = 0;
	if (x3_viterbi_encode(K, cb, x, cnt, NULL, q, 0) == X3_OK)
		for (int64_t t = 0; t < cnt; t++)
			for (int i = 0; i < 256; i++) {
				double d = q[t * 256 + i] / s - src[t * step * 256 + i];
				e += d * d;
			}
	else
		e = NAN;
	free(x), free(q);
	return e / (double)(cnt * 256);
}

static double plain_scale_search(const float *W, int64_t k, int64_t n, int K, int cb)
{
	float *tiles = malloc((size_t)(x3_scale_sample_max(k, n) * 256) * sizeof(float));
	int64_t m = x3_scale_sample(W, k, n, tiles);
	double y[10], c;
	int best = 0;
	for (int i = 0; i < 10; i++) {
		y[i] = plain_mse(tiles, m, 3, 0.1 + 0.2 * i, K, cb);
		if (y[i] < y[best])
			best = i;
	}
	c = 0.1 + 0.2 * best;
	double fs[5], fy[5];
	for (int i = 0; i < 5; i++) {
		fs[i] = c + 0.075 * (i - 2);
		fy[i] = fs[i] > 1e-6 ? plain_mse(tiles, m, 1, fs[i], K, cb) : INFINITY;
	}
	free(tiles);
	best = 0;
	for (int i = 1; i < 5; i++)
		if (fy[i] < fy[best])
			best = i;
	double off = 0;
	if (best > 0 && best < 4 && isfinite(fy[best - 1]) && isfinite(fy[best + 1])) {
		double den = fy[best - 1] - 2 * fy[best] + fy[best + 1];
		if (den > 0) {
			off = 0.5 * (fy[best - 1] - fy[best + 1]) / den;
			off = off > 0.5 ? 0.5 : off < -0.5 ? -0.5 : off;
		}
	}
	double g = fs[best] + off * 0.075;
	return g < 0.01 ? 0.01 : g;
}

/* tile (tr, tc) of W (k x n) equals tile (ur, uc) */
static int same_tile(const float *W, int64_t n, int64_t tr, int64_t tc, int64_t ur, int64_t uc)
{
	for (int r = 0; r < 16; r++)
		if (memcmp(W + (tr * 16 + r) * n + tc * 16, W + (ur * 16 + r) * n + uc * 16, 16 * sizeof(float)))
			return 0;
	return 1;
}

/* A regularized weight of n0 outputs and k0 inputs (no Hessian). */
static x3_qweight *make_weight(int64_t n0, int64_t k0)
{
	int64_t k = x3_pad128(k0), n = x3_pad128(n0);
	float *W = test_randn(&rng, n0 * k0, 0.02), *su = malloc((size_t)k * sizeof(float)), *sv = malloc((size_t)n * sizeof(float));
	x3_quant_signs(3, "u", k, su);
	x3_quant_signs(3, "v", n, sv);
	x3_qhess *h;
	x3_qweight *w = NULL;
	CHECK_OK(x3_qhess_none(k, su, &h), "a no-hessian %lldx%lld", (long long)k, (long long)k);
	CHECK_OK(x3_regularize(W, n0, k0, h, sv, X3_OUT_SCALES_ALWAYS, &w), "regularize %lldx%lld (out x in)",
	         (long long)n0, (long long)k0);
	x3_qhess_free(h);
	free(W), free(su), free(sv);
	return w;
}

static void test_search(int64_t n0, int64_t k0, int K, int cb)
{
	x3_qweight *w = make_weight(n0, k0);
	if (!w)
		return;
	double g = 0, ref = plain_scale_search(w->W, w->k, w->n, K, cb);
	CHECK_OK(x3_scale_search_cap(w->W, w->k, w->n, K, cb, 0, 0, &g), "full-sample scale search %lldx%lld K=%d %s",
	         (long long)n0, (long long)k0, K, x3_codebook_name(cb));
	CHECK(g == ref, "... scale %.9g is the every-tile search's %.9g exactly", g, ref);
	x3_qweight_free(w);
}

/* LDLQ without feedback is the Viterbi encoder of each tile */
static void test_ldlq(int64_t n0, int64_t k0, int K)
{
	x3_qweight *w = make_weight(n0, k0);
	if (!w)
		return;
	int64_t k = w->k, n = w->n, tn = n / 16;
	uint16_t *st = malloc((size_t)(k * n) * 2), *rs = malloc((size_t)(k * n) * 2);
	float *Q = malloc((size_t)(k * n) * sizeof(float)), *rq = malloc((size_t)(k * n) * sizeof(float));
	float *tiles = malloc((size_t)(k * n) * sizeof(float));
	CHECK_OK(x3_ldlq(w->W, k, n, NULL, K, X3_CB_MUL1, 0, st, Q), "ldlq %lldx%lld K=%d", (long long)n0,
	         (long long)k0, K);
	for (int64_t tr = 0; tr < k / 16; tr++)
		for (int64_t tc = 0; tc < tn; tc++)
			for (int i = 0; i < 256; i++) {
				int p = x3_tile_perm[i];
				tiles[(tr * tn + tc) * 256 + i] = w->W[(tr * 16 + p / 16) * n + tc * 16 + p % 16];
			}
	CHECK_OK(x3_viterbi_encode(K, X3_CB_MUL1, tiles, k * n / 256, rs, rq, 0), "every tile encoded");
	CHECK(!memcmp(st, rs, (size_t)(k * n) * 2), "... ldlq states are the every-tile states");
	int qok = 1;
	for (int64_t tr = 0; tr < k / 16 && qok; tr++)
		for (int64_t tc = 0; tc < tn; tc++)
			for (int i = 0; i < 256; i++) {
				int p = x3_tile_perm[i];
				qok &= Q[(tr * 16 + p / 16) * n + tc * 16 + p % 16] == rq[(tr * tn + tc) * 256 + i];
			}
	CHECK(qok, "... and so are its decoded values");
	free(st), free(rs), free(Q), free(rq), free(tiles);
	x3_qweight_free(w);
}

int main(void)
{
	x3_rng_seed(&rng, 1201, 0);
	/* the premise: padding gives repeated tiles */
	x3_qweight *w = make_weight(64, 64);
	if (w) {
		CHECK(same_tile(w->W, 128, 0, 0, 4, 4) && same_tile(w->W, 128, 1, 2, 5, 2) &&
		      !same_tile(w->W, 128, 0, 0, 1, 0), "a 64x64 weight padded to 128x128 repeats its 64x64 tiles");
		x3_qweight_free(w);
	}
	w = make_weight(172, 64);   /* n 172 -> 256: columns 128..191 and 192..255 equal */
	if (w) {
		CHECK(same_tile(w->W, 256, 0, 8, 0, 12) && !same_tile(w->W, 256, 0, 0, 0, 8),
		      "172 outputs padded to 256: tile columns 8..11 repeat as 12..15");
		x3_qweight_free(w);
	}
	test_search(64, 64, 2, X3_CB_MUL1);
	test_search(64, 172, 3, X3_CB_3INST);
	test_search(48, 32, 1, X3_CB_MUL1);    /* 8x8 tiles, mostly copies */
	test_ldlq(64, 64, 2);
	test_ldlq(172, 64, 3);
	test_ldlq(128, 128, 1);
	TEST_DONE();
}
