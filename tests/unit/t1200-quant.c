/* t1200-quant: the quantizer's steps (lib/quant/quant*.c) on synthetic data:
 * signs, Hessian finalization and its fallbacks, block LDL, regularization,
 * out_scales, scale search, LDLQ, proxy error, packing and decoding. */
#include <math.h>
#include <cblas.h>
#include "test.h"
#include "synth.h"
#include "codec.h"
#include "quant.h"

static x3_rng rng;

static void test_signs(void)
{
	float a[300], b[300], c[300];
	x3_quant_signs(7, "model.layers.0.mlp.input", 300, a);
	x3_quant_signs(7, "model.layers.0.mlp.input", 300, b);
	x3_quant_signs(7, "model.layers.1.mlp.input", 300, c);
	int pos = 0, diff = 0, pm = 1;
	for (int i = 0; i < 300; i++) {
		pos += a[i] > 0;
		diff += a[i] != c[i];
		pm &= a[i] == 1.0f || a[i] == -1.0f;
	}
	CHECK(!memcmp(a, b, sizeof a) && pm, "signs: same (seed, name) -> same +-1 vector");
	CHECK(pos > 110 && pos < 190, "signs: balanced (%d of 300 positive)", pos);
	CHECK(diff > 100, "signs: another name gives other signs (%d differ)", diff);
	x3_quant_signs(8, "model.layers.0.mlp.input", 300, c);
	CHECK(memcmp(a, c, sizeof a) != 0, "signs: another seed gives other signs");
}

/* at k = 128 (one panel of the factor: LAPACK's potrf alone) and 656 (the
 * blocked factor: panels of 256, 256 and 144, threaded trsm and sgemm; its
 * activations less correlated: at 2.0 that Gram matrix is singular in F32,
 * and LAPACK's one call fails at its last pivot too);
 * bad: where the indefinite matrix's first non-positive-definite leading
 * minor is (0-based) */
static void test_block_ldl_k(int64_t k, double corr, int64_t bad)
{
	float *X = test_corr_acts(&rng, 4 * k, k, corr), *H = test_gram(X, 4 * k, k);
	float *A = malloc((size_t)(k * k) * sizeof(float));
	memcpy(A, H, (size_t)(k * k) * sizeof(float));
	CHECK_OK(x3_block_ldl(A, k), "block LDL of an SPD matrix (%lld)", (long long)k);
	int strict = 1;
	for (int64_t r = 0; r < k; r++)
		for (int64_t c = 0; c < k; c++)
			if (r / 16 <= c / 16 && A[r * k + c] != 0)
				strict = 0;
	CHECK(strict, "block LDL %lld: L is strictly block-lower triangular", (long long)k);
	/* U = I + L: U^-1 H U^-T must be block diagonal */
	for (int64_t i = 0; i < k; i++)
		A[i * k + i] = 1.0f;
	float *B = malloc((size_t)(k * k) * sizeof(float));
	memcpy(B, H, (size_t)(k * k) * sizeof(float));
	cblas_strsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, (int)k, (int)k,
	            1.0f, A, (int)k, B, (int)k);
	cblas_strsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasUnit, (int)k, (int)k,
	            1.0f, A, (int)k, B, (int)k);
	double off = 0, on = 0;
	for (int64_t r = 0; r < k; r++)
		for (int64_t c = 0; c < k; c++) {
			double v = fabs(B[r * k + c]);
			if (r / 16 == c / 16)
				on = fmax(on, v);
			else
				off = fmax(off, v);
		}
	CHECK(off < 1e-4 * on, "block LDL %lld: (I+L)^-1 H (I+L)^-T is block diagonal (off %.3g, on %.3g)",
	      (long long)k, off, on);
	/* not positive definite */
	memcpy(A, H, (size_t)(k * k) * sizeof(float));
	A[bad * k + bad] = -1.0f;
	int rc = x3_block_ldl(A, k);
	char at[64];
	snprintf(at, sizeof at, "not positive definite at %lld)", (long long)bad + 1);
	CHECK(rc == X3_ENUM && strstr(x3_errmsg(), "cholesky") && strstr(x3_errmsg(), at),
	      "block LDL %lld of a matrix indefinite at %lld: X3_ENUM (%s)", (long long)k, (long long)bad,
	      x3_errmsg());
	/* a NaN below the first panel (in the blocked factor it reaches the
	 * later panels through the trsm and the trailing update): an error */
	memcpy(A, H, (size_t)(k * k) * sizeof(float));
	A[(k - 10) * k + 3] = NAN;
	rc = x3_block_ldl(A, k);
	CHECK(rc == X3_ENUM && strstr(x3_errmsg(), "non-finite"),
	      "block LDL %lld with a NaN at (%lld, 3): X3_ENUM naming it (%s)", (long long)k,
	      (long long)(k - 10), x3_errmsg());
	free(X), free(H), free(A), free(B);
}

static void test_block_ldl(void)
{
	test_block_ldl_k(128, 2.0, 5);
	test_block_ldl_k(656, 0.5, 400);
}

/* dense Hb (k x k) in double */
static double hb(int64_t i, int64_t j)
{
	if (i / 128 != j / 128)
		return 0;
	return (__builtin_popcountll((unsigned long long)((i % 128) & (j % 128))) & 1 ? -1.0 : 1.0) /
	       sqrt(128.0);
}

static void test_finalize(void)
{
	int64_t k0 = 100, k = 128;
	float *X = test_corr_acts(&rng, 400, k0, 1.0), *H = test_gram(X, 400, k0), s[128];
	x3_quant_signs(1, "h", k, s);
	x3_qhess *h;
	CHECK_OK(x3_qhess_finalize(H, k0, k, 400, s, &h), "finalize 100x100 into 128");
	CHECK(!h->fallback && h->H && h->L && h->retries == 0, "finalize: no fallback, no retries");
	double dm = 0;
	for (int64_t i = 0; i < k0; i++)
		dm += H[i * k0 + i] / 400.0;
	dm /= (double)k;
	CHECK(fabs(h->diag_mean - dm) < 1e-5 * dm, "finalize: mean diagonal over the padded size");
	CHECK(fabs(h->diag[3] - (H[3 * k0 + 3] / 400.0 + 0.025 * dm)) < 1e-5 &&
	      fabs(h->diag[120] - 0.025 * dm) < 1e-6, "finalize: damped diagonal (padding gets 0.025 mean)");
	/* rotated H = Hb diag(s) Hd diag(s) Hb, checked entrywise in double */
	double maxd = 0, maxv = 0;
	for (int64_t i = 0; i < k; i += 9)
		for (int64_t j = 0; j < k; j += 7) {
			double v = 0;
			for (int64_t a = 0; a < k; a++)
				for (int64_t b = 0; b < k; b++) {
					double hd = (a < k0 && b < k0) ? H[a * k0 + b] / 400.0 : 0;
					if (a == b)
						hd += 0.025 * dm;
					if (hd != 0)
						v += hb(i, a) * s[a] * hd * s[b] * hb(b, j);
				}
			maxd = fmax(maxd, fabs(v - h->H[i * k + j]));
			maxv = fmax(maxv, fabs(v));
		}
	CHECK(maxd < 1e-5 * maxv, "finalize: rotated H matches the dense formula (max diff %.3g)", maxd);
	x3_qhess_free(h);

	/* fallbacks */
	CHECK_OK(x3_qhess_finalize(H, k0, k, 0, s, &h), "finalize with count 0");
	CHECK(h->fallback && !h->H && !h->L && strstr(h->why, "count"), "count 0 -> fallback (%s)", h->why);
	x3_qhess_free(h);
	float *Hn = malloc((size_t)(k0 * k0) * sizeof(float));
	memcpy(Hn, H, (size_t)(k0 * k0) * sizeof(float));
	Hn[17] = NAN;
	CHECK_OK(x3_qhess_finalize(Hn, k0, k, 400, s, &h), "finalize with a NaN");
	CHECK(h->fallback && strstr(h->why, "non-finite"), "NaN -> fallback (%s)", h->why);
	x3_qhess_free(h);
	memset(Hn, 0, (size_t)(k0 * k0) * sizeof(float));
	CHECK_OK(x3_qhess_finalize(Hn, k0, k, 400, s, &h), "finalize an all-zero H");
	CHECK(h->fallback && strstr(h->why, "too small"), "zero H -> fallback (%s)", h->why);
	x3_qhess_free(h);
	/* mildly indefinite: eigenvalue -0.06 * mean diag needs extra damping */
	for (int64_t i = 0; i < k0; i++)
		Hn[i * k0 + i] = 1.0f;
	Hn[0 * k0 + 1] = Hn[1 * k0 + 0] = 1.0f + 0.06f * (float)k0 / (float)k + 0.025f * (float)k0 / k;
	CHECK_OK(x3_qhess_finalize(Hn, k0, k, 1, s, &h), "finalize a mildly indefinite H");
	CHECK(!h->fallback && h->retries >= 1 && h->retries <= 3, "mildly indefinite -> %d damping retries",
	      h->retries);
	x3_qhess_free(h);
	Hn[0 * k0 + 1] = Hn[1 * k0 + 0] = 50.0f;
	CHECK_OK(x3_qhess_finalize(Hn, k0, k, 1, s, &h), "finalize a strongly indefinite H");
	CHECK(h->fallback && h->retries == X3_LDL_RETRIES && strstr(h->why, "positive definite"),
	      "strongly indefinite -> fallback after 10 retries (%s)", h->why);
	x3_qhess_free(h);
	CHECK(x3_qhess_finalize(H, k0, 100, 400, s, &h) == X3_EINVAL, "finalize: padded size not a multiple of 128");
	CHECK(x3_qhess_finalize(H, 200, k, 400, s, &h) == X3_EINVAL, "finalize: H larger than the padded size");
	free(Hn), free(X), free(H);
}

static void test_regularize(void)
{
	int64_t n0 = 150, k0 = 100, k = 128, n = 256;
	float *W = test_randn(&rng, n0 * k0, 0.02), su_s[128], sv_s[256];
	for (int64_t i = 0; i < k0; i++)
		W[5 * k0 + i] = 0;             /* a zero output channel */
	for (int64_t o = 0; o < n0; o++)
		W[o * k0 + 7] *= 10;           /* a loud input channel */
	x3_quant_signs(3, "su", k, su_s);
	x3_quant_signs(3, "sv", n, sv_s);
	x3_qhess *h;
	CHECK_OK(x3_qhess_none(k, su_s, &h), "no-hessian fallback");
	x3_qweight *w;
	CHECK_OK(x3_regularize(W, n0, k0, h, sv_s, X3_OUT_SCALES_ALWAYS, &w), "regularize 150x100");
	CHECK(w->k == 128 && w->n == 256 && w->out_scales == 1 && !w->zeros, "regularize: padded shape, out scales");
	CHECK(w->sv[5] == 0 && w->sv[200] == 0 && w->sv[0] != 0, "regularize: zero and padded columns get sv = 0");
	CHECK(w->su[0] * su_s[0] < 0 && w->su[127] * su_s[127] < 0, "regularize: su has the opposite sign of sigma_u");
	double ss = 0;
	for (int64_t i = 0; i < k * n; i++)
		ss += (double)w->W[i] * w->W[i];
	/* rows carry RMS 1.24371088 (the zero padding rows stay zero) */
	double rms = sqrt(ss / (double)(k0 * n));
	CHECK(fabs(rms - 1.24371088) < 1e-4, "regularize: RMS %.6f = 1.24371088 over the real rows", rms);
	/* diag(su) Hb W_reg Hb diag(sv) = W (fp16-rounded) */
	float *R = malloc((size_t)(k * n) * sizeof(float));
	memcpy(R, w->W, (size_t)(k * n) * sizeof(float));
	x3_had128_rows(R, k, n);
	x3_had128_cols(R, k, n);
	double md = 0;
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++) {
			double v = (double)R[i * n + j] * w->su[i] * w->sv[j];
			double want = (i < k0 && j < n0) ? x3_round_f16(W[j * k0 + i]) : 0;
			md = fmax(md, fabs(v - want));
		}
	CHECK(md < 1e-5, "regularize: exact inverse relation (max diff %.3g)", md);
	x3_qweight_free(w);
	CHECK_OK(x3_regularize(W, n0, k0, h, sv_s, X3_OUT_SCALES_NEVER, &w), "regularize, never");
	CHECK(w->out_scales == 0 && w->sv[0] == sv_s[0] && w->sv[5] == 0, "never: sv = signs, zero columns 0");
	x3_qweight_free(w);
	CHECK_OK(x3_regularize(W, n0, k0, h, sv_s, X3_OUT_SCALES_AUTO, &w), "regularize, auto without hessian");
	CHECK(w->out_scales == 0, "auto in fallback: no out scales");
	x3_qweight_free(w);
	/* all zero */
	float *Z = calloc((size_t)(n0 * k0), sizeof(float));
	CHECK_OK(x3_regularize(Z, n0, k0, h, sv_s, X3_OUT_SCALES_NEVER, &w), "regularize an all-zero weight");
	int allz = 1;
	for (int64_t j = 0; j < n; j++)
		allz &= w->sv[j] == 0;
	CHECK(w->zeros && w->out_scales && allz, "all-zero weight: zeros flag, out scales forced, svh all 0");
	x3_qweight_free(w);
	/* bad values */
	W[3 * k0 + 4] = NAN;
	int rc = x3_regularize(W, n0, k0, h, sv_s, X3_OUT_SCALES_ALWAYS, &w);
	CHECK(rc == X3_ENUM && strstr(x3_errmsg(), "[3][4]"), "NaN weight: X3_ENUM naming [3][4] (%s)", x3_errmsg());
	W[3 * k0 + 4] = 1e6f;
	rc = x3_regularize(W, n0, k0, h, sv_s, X3_OUT_SCALES_ALWAYS, &w);
	CHECK(rc == X3_ENUM && strstr(x3_errmsg(), "fp16"), "1e6 weight: fp16 overflow (%s)", x3_errmsg());
	rc = x3_regularize(W, n0, 300, h, sv_s, X3_OUT_SCALES_ALWAYS, &w);
	CHECK(rc == X3_EINVAL, "hessian size mismatch: X3_EINVAL (%s)", x3_errmsg());
	x3_qhess_free(h);
	free(W), free(Z), free(R);
}

static void test_auto(void)
{
	float d[500];
	double skew;
	for (int i = 0; i < 500; i++)
		d[i] = 1.0f;
	int apply = -1;
	CHECK(x3_out_scales_auto(d, 500, &skew, &apply) == X3_OK && apply == 1 && fabs(skew - 0.02) < 1e-9, "auto: flat diagonal -> apply (skew %.3f)", skew);
	for (int i = 0; i < 10; i++)
		d[i * 37] = 400.0f;   /* sqrt 20: top 10 of 500 hold 200/(200+490) */
	CHECK(x3_out_scales_auto(d, 500, &skew, &apply) == X3_OK && apply == 0 && skew > 0.15, "auto: 10 outlier channels -> no out scales (skew %.3f)", skew);
	/* a buffer of 2^61 doubles cannot be allocated: an error, not a decision
	 * (d is not read before the allocation) */
	apply = -1;
	CHECK(x3_out_scales_auto(d, (int64_t)1 << 61, &skew, &apply) == X3_ENOMEM && apply == 0,
	      "auto: out of memory -> X3_ENOMEM (apply %d), not a decision", apply);
	int policy;
	CHECK(x3_out_scales_parse("auto", &policy) == X3_OK && policy == X3_OUT_SCALES_AUTO &&
	      x3_out_scales_parse("sometimes", &policy) == X3_EINVAL, "out_scales parsing");
}

static void test_quantize(void)
{
	int64_t n0 = 128, k0 = 256, k = 256, n = 128;
	float *X = test_corr_acts(&rng, 1024, k0, 3.0), *H = test_gram(X, 1024, k0), s[256], sv[128];
	float *W = test_randn(&rng, n0 * k0, 0.05);
	x3_quant_signs(5, "h", k, s);
	x3_quant_signs(5, "w/sv", n, sv);
	x3_qhess *h, *hn;
	CHECK_OK(x3_qhess_finalize(H, k0, k, 1024, s, &h), "finalize a correlated 256x256 H");
	CHECK_OK(x3_qhess_none(k, s, &hn), "no-hessian variant");
	x3_qweight *w;
	CHECK_OK(x3_regularize(W, n0, k0, h, sv, X3_OUT_SCALES_ALWAYS, &w), "regularize 128x256 (out x in)");
	float *W_kn = malloc((size_t)(k * n) * sizeof(float));   /* W_hf^T (k, n) */
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++)
			W_kn[i * n + j] = W[j * k0 + i];

	CHECK(x3_scale_sample_max(256, 128) == 3 * 16 + 2 * 8 && x3_scale_sample_max(1024, 512) == 3 * 64 + 2 * 12,
	      "scale sample count 3D + 2 num_x");
	/* the cap: 1/72 of the tiles, at least X3_SCALE_MIN_TILES; none binding
	 * from 4096x4096 (864 sampled of a 910 cap) */
	CHECK(x3_scale_sample_cap(256, 128) == X3_SCALE_MIN_TILES &&
	      x3_scale_sample_cap(4096, 4096) == 65536 / 72 &&
	      x3_scale_sample_cap(4096, 4096) >= x3_scale_sample_max(4096, 4096),
	      "scale sample cap: floor for small tensors, full sample from 4096x4096");
	double g3, gc, gfull, gbig;
	CHECK_OK(x3_scale_search(w->W, k, n, 3, X3_CB_3INST, 0, &g3), "scale search K=3 3inst");
	CHECK_OK(x3_scale_search_cap(w->W, k, n, 3, X3_CB_3INST, 0, X3_SCALE_MIN_TILES, &gc) ||
	         x3_scale_search_cap(w->W, k, n, 3, X3_CB_3INST, 0, 0, &gfull) ||
	         x3_scale_search_cap(w->W, k, n, 3, X3_CB_3INST, 0, 1000, &gbig), "capped searches");
	CHECK(gc == g3 && gbig == gfull && fabs(g3 - gfull) < 0.1,
	      "x3_scale_search = cap x3_scale_sample_cap; a cap above the sample = the full search; "
	      "capped %.4f near full %.4f", g3, gfull);
	CHECK(g3 > 0.8 && g3 < 1.2, "3inst scale %.4f near 1", g3);

	/* LDLQ with L = 0 equals the fallback (no feedback) bit for bit */
	float *Z = calloc((size_t)(k * k), sizeof(float));
	float *Q1 = malloc((size_t)(k * n) * sizeof(float)), *Q2 = malloc((size_t)(k * n) * sizeof(float));
	uint16_t *s1 = malloc((size_t)(k * n) * 2), *s2 = malloc((size_t)(k * n) * 2);
	CHECK_OK(x3_ldlq(w->W, k, n, NULL, 2, X3_CB_MUL1, 0, s1, Q1), "ldlq without feedback");
	CHECK_OK(x3_ldlq(w->W, k, n, Z, 2, X3_CB_MUL1, 0, s2, Q2), "ldlq with L = 0");
	CHECK(!memcmp(Q1, Q2, (size_t)(k * n) * 4) && !memcmp(s1, s2, (size_t)(k * n) * 2),
	      "ldlq: L = 0 gives the no-feedback result exactly");
	CHECK(x3_ldlq(w->W, k, n, NULL, 9, X3_CB_MUL1, 0, s1, Q1) == X3_EINVAL, "ldlq: K=9 refused");
	free(Z), free(Q1), free(Q2), free(s1), free(s2);

	double prev = 1e9;
	for (int K = 1; K <= 4; K++) {
		x3_qresult *r, *rn = NULL;
		CHECK_OK(x3_quantize(w, h, K, X3_CB_MUL1, 0, X3_QKEEP_Q | X3_QKEEP_W, &r), "quantize K=%d", K);
		if (K == 1 || K == 3) {
			CHECK_OK(x3_quantize(w, hn, K, X3_CB_MUL1, 0, X3_QKEEP_Q, &rn), "quantize K=%d without hessian", K);
			double pn;
			CHECK_OK(x3_proxy_error(r->Wg, rn->Q, h->H, k, n, &pn), "proxy error of the no-feedback result");
			CHECK(r->proxy_err < pn, "K=%d: LDLQ proxy error %.5f < no-feedback %.5f", K, r->proxy_err, pn);
			CHECK(rn->fallback && rn->g == r->g, "K=%d: fallback flag, same scale search", K);
		}
		if (K == 3)
			CHECK(r->g > 0.6 && r->g < 1.0, "K=3: mul1 global scale %.4f near 0.8", r->g);
		CHECK(r->proxy_err < prev, "K=%d: proxy error falls with K (%.5f < %.5f)", K, r->proxy_err, prev);
		prev = r->proxy_err;
		/* decoding the packed trellis gives the encoder's W~ exactly */
		float *D = malloc((size_t)(k * n) * sizeof(float));
		CHECK_OK(x3_trellis_decode(K, X3_CB_MUL1, r->trellis, k, n, D), "decode K=%d", K);
		CHECK(!memcmp(D, r->Q, (size_t)(k * n) * 4), "K=%d: decoded W~ bit-identical to the encoder's", K);
		/* original basis: W_hf^T ~ reconstruct */
		float *R = malloc((size_t)(k * n) * sizeof(float));
		CHECK_OK(x3_reconstruct(D, r->suh, r->svh, k, n, R), "reconstruct K=%d", K);
		double e = 0, t = 0;
		float *Dl = malloc((size_t)(k * n) * sizeof(float));
		for (int64_t i = 0; i < k; i++)
			for (int64_t j = 0; j < n; j++) {
				double a = W[j * k0 + i], d = R[i * n + j] - a;
				e += d * d, t += a * a;
				Dl[i * n + j] = (float)d;
			}
		double rel = e / t, bound[5] = { 0, 0.5, 0.16, 0.045, 0.012 };
		CHECK(rel < bound[K], "K=%d: relative weight error %.5f < %.3f", K, rel, bound[K]);
		/* output error in the original basis, tr(dW^T H dW) / tr(W^T H W) */
		double eh, hb[5] = { 0, 0.3, 0.08, 0.02, 0.005 };
		float *Wt = malloc((size_t)(k * n) * sizeof(float));
		for (int64_t i = 0; i < k; i++)
			for (int64_t j = 0; j < n; j++)
				Wt[i * n + j] = W[j * k0 + i] - Dl[i * n + j];
		CHECK_OK(x3_proxy_error(W_kn, Wt, H, k, n, &eh), "original-basis output error");
		CHECK(eh < hb[K], "K=%d: output error in the original basis %.5f < %.3f (proxy %.5f)", K, eh,
		      hb[K], r->proxy_err);
		free(Dl), free(Wt);
		free(D), free(R);
		x3_qresult_free(r);
		x3_qresult_free(rn);
	}
	CHECK(x3_quant_bytes(256, 512, 4, X3_CB_MUL1, 1) == 256 * 512 / 2 + 512 + 1024 + 4 + 1024,
	      "storage bytes (trellis, suh, svh, marker, bias)");
	CHECK(x3_quant_bytes(256, 512, 3, X3_CB_3INST, 0) == 256 * 512 * 3 / 8 + 512 + 1024,
	      "storage bytes, 3inst without a marker");
	x3_qresult *r;
	CHECK(x3_quantize(w, h, 0, X3_CB_MUL1, 0, 0, &r) == X3_EINVAL && strstr(x3_errmsg(), "1..8"),
	      "quantize K=0 refused (%s)", x3_errmsg());
	x3_qweight_free(w);
	x3_qhess_free(h), x3_qhess_free(hn);
	free(X), free(H), free(W), free(W_kn);
}

static void test_qframe(void)
{
	char b[256];
	x3_tensor *t = x3_tensor_new2("model.layers.0.mlp.up_proj.weight", X3_F32, 4, 4);
	CHECK(!strcmp(x3_qframe_role(t), "weight") &&
	      !strcmp(x3_qframe_key(t, b, sizeof b), "model.layers.0.mlp.up_proj"), "weight frame: role, key");
	x3_tensor_rename(t, "blk.input.hessian");
	CHECK(!strcmp(x3_qframe_role(t), "hessian"), "'.hessian' name: hessian role");
	x3_tensor_rename(t, "blk.input");
	x3_meta_set(t, "count", "12");
	CHECK(!strcmp(x3_qframe_role(t), "hessian"), "'count' metadata: hessian role");
	x3_meta_del(t, "count");
	x3_meta_set(t, "role", "w_reg");
	x3_tensor_rename(t, "a.b.w_reg");
	CHECK(!strcmp(x3_qframe_role(t), "w_reg") && !strcmp(x3_qframe_key(t, b, sizeof b), "a.b"),
	      "had-rotate frame: role from metadata, key from the name");
	x3_meta_set(t, "key", "other");
	CHECK(!strcmp(x3_qframe_key(t, b, sizeof b), "other"), "key metadata wins");
	x3_tensor_free(t);
	/* hessian frame of the wrong size, with its count */
	x3_tensor *h = x3_tensor_new2("h", X3_F32, 64, 64);
	for (int i = 0; i < 64; i++)
		((float *)h->data)[i * 65] = 2.0f;
	x3_meta_set(h, "count", "2");
	x3_qhess *q;
	CHECK(x3_qhess_from_frame(h, 100, 0, &q) == X3_EINVAL && strstr(x3_errmsg(), "64x64"),
	      "hessian frame for the wrong input size (%s)", x3_errmsg());
	CHECK_OK(x3_qhess_from_frame(h, 64, 0, &q), "hessian frame 64x64 for 64 inputs");
	CHECK(q->k == 128 && !q->fallback && fabs(q->diag_mean - 0.5) < 1e-9, "count divides: mean diagonal %g",
	      q->diag_mean);
	float s[128];
	x3_quant_signs(0, "h", 128, s);
	CHECK(!memcmp(s, q->sign, sizeof s), "input signs from (seed, hessian name)");
	x3_qhess_free(q);
	x3_meta_set(h, "count", "many");
	CHECK(x3_qhess_from_frame(h, 64, 0, &q) == X3_EFORMAT, "unparsable count refused");
	x3_tensor_free(h);
	x3_tensor *bb = x3_tensor_new1("b", X3_F16, 3);
	float *pb;
	CHECK(x3_bias_from_frame(bb, 4, 128, &pb) == X3_EFORMAT, "bias of the wrong length refused");
	CHECK_OK(x3_bias_from_frame(bb, 3, 128, &pb), "F16 bias padded");
	free(pb);
	x3_tensor_free(bb);
}

/* the sign search (issue 14 part 1): draws, the strip estimate, the winner */
static void test_sign_search(void)
{
	float a[200], b[200], c[200];
	x3_quant_signs(3, "blk.input", 200, a);
	x3_quant_signs_draw(3, 0, "blk.input", 200, b);
	CHECK(!memcmp(a, b, sizeof a), "sign draw 0 is the plain (seed, name) signs");
	x3_quant_signs_draw(3, 2, "blk.input", 200, b);
	x3_quant_signs(3, "blk.input#2", 200, c);
	CHECK(memcmp(a, b, sizeof a) && !memcmp(b, c, sizeof b), "sign draw 2: the stream of \"name#2\"");

	int64_t k0 = 100, n0 = 200, rows = 600;
	float *X = test_corr_acts(&rng, rows, k0, 3.0), *G = test_gram(X, rows, k0);
	x3_tensor *Ht = x3_tensor_new2("blk.input", X3_F32, k0, k0);
	x3_tensor *Wt = x3_tensor_new2("blk.w.weight", X3_F32, n0, k0);
	memcpy(Ht->data, G, (size_t)(k0 * k0) * sizeof(float));
	x3_meta_setf(Ht, "count", "%lld", (long long)rows);
	float *W = test_randn(&rng, n0 * k0, 0.05);
	memcpy(Wt->data, W, (size_t)(n0 * k0) * sizeof(float));

	/* draws = 1: exactly the plain frame glue, no estimate */
	x3_qhess *h0, *h1;
	x3_qweight *w0, *w1;
	int best = -1;
	double errs[4] = { -1, -1, -1, -1 };
	CHECK_OK(x3_qhess_from_frame(Ht, k0, 3, &h0) || x3_qweight_from_frame(Wt, "blk.w", h0, 3,
	         X3_OUT_SCALES_ALWAYS, &w0), "plain finalize and regularize");
	CHECK_OK(x3_sign_search(Ht, Wt, "blk.w", 3, 1, X3_OUT_SCALES_ALWAYS, 3, X3_CB_MUL1, 0, 0, X3_EST_PROXY,
	         &h1, &w1, &best, errs), "sign search with one draw");
	CHECK(best == 0 && errs[0] == 0 && !memcmp(h0->L, h1->L, 128 * 128 * 4) &&
	      !memcmp(w0->W, w1->W, 128 * 256 * 4) && !memcmp(w0->su, w1->su, 128 * 4),
	      "one draw: the plain Hessian and weight, bit for bit");
	x3_qhess_free(h1), x3_qweight_free(w1);

	/* the estimate over every strip is x3_quantize's proxy error */
	x3_qresult *r;
	double e_all, e_part, g_all = 0, g_part = 0;
	CHECK_OK(x3_quantize(w0, h0, 3, X3_CB_MUL1, 0, 0, &r), "quantize draw 0 at K=3");
	CHECK_OK(x3_quantize_estimate(w0, h0, 3, X3_CB_MUL1, 0, 0, X3_EST_PROXY, &g_all, &e_all) ||
	         x3_quantize_estimate(w0, h0, 3, X3_CB_MUL1, 0, 4, X3_EST_PROXY, &g_part, &e_part), "estimates over 16 and 4 strips");
	CHECK(e_all == r->proxy_err && g_all == r->g && g_part == r->g,
	      "estimate over all strips = the proxy error (%.9g, %.9g), at its scale", e_all, r->proxy_err);
	double g_fix = 0.7, e_fix;
	CHECK_OK(x3_quantize_estimate(w0, h0, 3, X3_CB_MUL1, 0, 0, X3_EST_PROXY, &g_fix, &e_fix), "estimate at g = 0.7");
	CHECK(g_fix == 0.7 && e_fix != e_all, "a given scale is used, not searched (%.6g vs %.6g)", e_fix, e_all);
	CHECK(e_part > 0.5 * e_all && e_part < 2 * e_all, "estimate over 4 of 16 strips %.5g near %.5g",
	      e_part, e_all);
	CHECK(x3_estimate_strips(256) == 8 && x3_estimate_strips(4096) == 32 && x3_estimate_strips(128) == 8,
	      "default strips: an eighth, at least 8, at most all");
	x3_qresult_free(r);

	/* four draws: the winner has the lowest estimate, and it is its proxy error */
	CHECK_OK(x3_sign_search(Ht, Wt, "blk.w", 3, 4, X3_OUT_SCALES_ALWAYS, 3, X3_CB_MUL1, 0, 0, X3_EST_PROXY,
	         &h1, &w1, &best, errs), "sign search with four draws");
	int low = 1, distinct = 0;
	for (int d = 0; d < 4; d++) {
		low &= errs[best] <= errs[d];
		distinct += errs[d] != errs[0];
	}
	CHECK(low && errs[0] == e_all && distinct >= 2, "four draws: draw %d has the lowest (%.5g %.5g %.5g %.5g)",
	      best, errs[0], errs[1], errs[2], errs[3]);
	CHECK_OK(x3_quantize(w1, h1, 3, X3_CB_MUL1, 0, 0, &r), "quantize the winner");
	x3_quant_signs_draw(3, best, "blk.input", 128, a);
	double e_best, g_b = g_all;
	CHECK_OK(x3_quantize_estimate(w1, h1, 3, X3_CB_MUL1, 0, 0, X3_EST_PROXY, &g_b, &e_best), "estimate the winner");
	CHECK(e_best == errs[best] && !memcmp(a, h1->sign, 128 * 4) && fabs(r->proxy_err / e_best - 1) < 0.05,
	      "the winner: its own signs, its estimate at draw 0's scale %.5g near its proxy error %.5g", e_best,
	      r->proxy_err);
	x3_qresult_free(r);
	x3_qhess_free(h1), x3_qweight_free(w1);

	/* no Hessian: identity with signs from key/su of the draw */
	CHECK_OK(x3_sign_search(NULL, Wt, "blk.w", 3, 3, X3_OUT_SCALES_ALWAYS, 2, X3_CB_MUL1, 0, 0, X3_EST_PROXY,
	         &h1, &w1, &best, errs), "sign search without a Hessian");
	x3_quant_signs_draw(3, best, "blk.w/su", 128, a);
	CHECK(h1->fallback && !memcmp(a, h1->sign, 128 * 4), "no Hessian: fallback, signs of draw %d", best);
	x3_qhess_free(h1), x3_qweight_free(w1);
	CHECK(x3_sign_search(Ht, Wt, "blk.w", 3, 0, X3_OUT_SCALES_ALWAYS, 3, X3_CB_MUL1, 0, 0, X3_EST_PROXY,
	      &h1, &w1, &best, errs) == X3_EINVAL, "zero draws refused");
	x3_tensor *Wb = x3_tensor_new2("blk.v.weight", X3_F32, 8, 50);
	CHECK(x3_sign_search(Ht, Wb, "blk.v", 3, 2, X3_OUT_SCALES_ALWAYS, 3, X3_CB_MUL1, 0, 0, X3_EST_PROXY,
	      &h1, &w1, &best, errs) == X3_EINVAL && strstr(x3_errmsg(), "sign draw 0") &&
	      strstr(x3_errmsg(), "blk.input"), "a Hessian of the wrong size names the draw and the Hessian (%s)",
	      x3_errmsg());
	x3_tensor_free(Wb);
	x3_qhess_free(h0), x3_qweight_free(w0);
	x3_tensor_free(Ht), x3_tensor_free(Wt);
	free(X), free(G), free(W);
}

/* the output metric: with sv = +-1 (out_scales never, no padded outputs)
 * it is the relative output error of the reconstruction exactly */
static void test_output_metric(void)
{
	int64_t k = 128, n = 128, rows = 500;
	float *X = test_corr_acts(&rng, rows, k, 3.0), *G = test_gram(X, rows, k), s[128], sv[128];
	float *W = test_randn(&rng, n * k, 0.05);
	for (int64_t i = 0; i < k * n; i += 7)
		W[i] *= 4.0f;   /* uneven rows: |su| matters */
	x3_quant_signs(9, "h", k, s);
	x3_quant_signs(9, "w/sv", n, sv);
	x3_qhess *h;
	x3_qweight *w;
	CHECK_OK(x3_qhess_finalize(G, k, k, rows, s, &h) ||
	         x3_regularize(W, n, k, h, sv, X3_OUT_SCALES_NEVER, &w), "finalize, regularize 128x128");
	x3_qresult *r;
	double eo, ep, g1 = 0, g2 = 0;
	CHECK_OK(x3_quantize(w, h, 2, X3_CB_MUL1, 0, X3_QKEEP_Q, &r) ||
	         x3_quantize_estimate(w, h, 2, X3_CB_MUL1, 0, 0, X3_EST_OUTPUT, &g1, &eo) ||
	         x3_quantize_estimate(w, h, 2, X3_CB_MUL1, 0, 0, X3_EST_PROXY, &g2, &ep), "quantize, both estimates");
	/* direct: dW = W_hf^T - reconstruct, tr(dW^T H0 dW) / tr(W^T H0 W), H0 damped */
	float *R = malloc((size_t)(k * n) * sizeof(float)), *Wt = malloc((size_t)(k * n) * sizeof(float));
	float *H0 = malloc((size_t)(k * k) * sizeof(float));
	double dm = 0;
	for (int64_t i = 0; i < k; i++)
		dm += G[i * k + i] / rows / k;
	for (int64_t i = 0; i < k * k; i++)
		H0[i] = G[i] / rows + (i % (k + 1) == 0 ? (float)(X3_SIGMA_REG * dm) : 0.0f);
	CHECK_OK(x3_reconstruct(r->Q, r->suh, r->svh, k, n, R), "reconstruct");
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++)
			Wt[i * n + j] = W[j * k + i];
	double direct;
	CHECK_OK(x3_proxy_error(Wt, R, H0, k, n, &direct), "direct output error");
	CHECK(fabs(eo / direct - 1) < 0.01, "output metric %.6g = the reconstruction's output error %.6g", eo, direct);
	CHECK(eo == ep || fabs(ep / direct - 1) > fabs(eo / direct - 1),
	      "the proxy error %.6g is further from it", ep);
	x3_qresult_free(r), x3_qhess_free(h), x3_qweight_free(w);
	free(X), free(G), free(W), free(R), free(Wt), free(H0);
}

/* x3_proxy_error's forms (x3_proxy_path): the AVX-512 and AVX2 kernels give
 * the plain C reference's bits (one fmaf per step, in the same order), on
 * shapes with tails everywhere (rows not a multiple of 4, columns not of
 * 16 or 32, two and three panels of 256 rows, two column blocks of 256),
 * and the value is the float64 quadratic form's up to F32 rounding */
static void test_proxy_paths(void)
{
	static const int64_t shapes[][2] = { { 38, 45 }, { 300, 530 }, { 64, 32 }, { 600, 40 } };
	const char *best = x3_proxy_path();
	for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
		int64_t k = shapes[s][0], n = shapes[s][1];
		float *W = test_randn(&rng, k * n, 1.0), *Q = test_randn(&rng, k * n, 1.0);
		float *X = test_corr_acts(&rng, 2 * k, k, 2.0), *H = test_gram(X, 2 * k, k);
		for (int64_t i = 0; i < k * n; i++)
			Q[i] = W[i] + 0.1f * Q[i];
		double e[3] = { 0 };
		int have[3] = { 0 };
		static const char *paths[] = { "ref", "avx2", "avx512" };
		for (int p = 0; p < 3; p++) {
			int rc = x3_proxy_set_path(paths[p]);
			if (rc == X3_EUNSUP)
				continue;
			CHECK_OK(rc, "proxy form %s", paths[p]);
			CHECK_OK(x3_proxy_error(W, Q, H, k, n, &e[p]), "%lldx%lld: proxy error, %s",
			         (long long)k, (long long)n, paths[p]);
			have[p] = 1;
		}
		for (int p = 1; p < 3; p++)
			if (have[p])
				CHECK(!memcmp(&e[p], &e[0], sizeof e[0]), "%lldx%lld: %s gives the reference's bits (%.17g, %.17g)",
				      (long long)k, (long long)n, paths[p], e[p], e[0]);
			else
				SKIP("%lldx%lld: this processor has no %s", (long long)k, (long long)n, paths[p]);
		const double ref = test_proxy_ref(W, Q, H, k, n);
		CHECK(fabs(e[0] / ref - 1) < 1e-4, "%lldx%lld: the float64 value up to rounding (%.9g, %.9g)",
		      (long long)k, (long long)n, e[0], ref);
		free(W), free(Q), free(X), free(H);
	}
	CHECK_OK(x3_proxy_set_path(best), "back to %s", best);
	CHECK(x3_proxy_set_path("sse9") == X3_EINVAL, "an unknown form is refused");
}

int main(void)
{
	x3_rng_seed(&rng, 1200, 0);
	test_signs();
	test_block_ldl();
	test_finalize();
	test_regularize();
	test_auto();
	test_qframe();
	test_quantize();
	test_sign_search();
	test_output_metric();
	test_proxy_paths();
	TEST_DONE();
}
