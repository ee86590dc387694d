/* t1206-quant-sample: a measurement from a sample of output strips
 * (x3_quantize_sample, issue 12 part 1). With every strip chosen it must be
 * x3_quantize bit for bit; with a subset, every chosen strip must quantize
 * exactly as it does within the whole weight (LDLQ at the same scale), the
 * strips must be a seeded, ordered choice of the right count, the estimate
 * near the whole weight's error, and the Viterbi work about the fraction. */
#include <math.h>
#include "test.h"
#include "synth.h"
#include "codec.h"
#include "quant.h"

static x3_rng rng;

/* H = X^T X for correlated activations X = Z (I + c R) (rows x k) */
static float *corr_gram(int64_t rows, int64_t k, double c)
{
	float *X = test_corr_acts(&rng, rows, k, c), *H = test_gram(X, rows, k);
	free(X);
	return H;
}

static int same_result(const x3_qresult *a, const x3_qresult *b)
{
	size_t kn = (size_t)(a->k * a->n);
	return a->k == b->k && a->n == b->n && a->g == b->g && a->proxy_err == b->proxy_err &&
	       !memcmp(a->trellis, b->trellis, kn / 16 * (size_t)a->K * 2) &&
	       !memcmp(a->suh, b->suh, (size_t)a->k * 2) && !memcmp(a->svh, b->svh, (size_t)a->n * 2) &&
	       a->search_tiles == b->search_tiles && a->ldlq_tiles == b->ldlq_tiles;
}

static void test_strips(void)
{
	int64_t s1[64], s2[64], s3[64];
	CHECK(x3_sample_strips(1024, 0.125, 7, "a", s1) == 8 && x3_sample_strips(1024, 0.125, 7, "a", s2) == 8 &&
	      !memcmp(s1, s2, sizeof(int64_t) * 8), "strips: 1/8 of 64 is 8, the same for the same (seed, name)");
	int ok = 1;
	for (int i = 0; i < 8; i++)
		ok &= s1[i] >= 0 && s1[i] < 64 && (i == 0 || s1[i - 1] < s1[i]);
	CHECK(ok, "strips: ascending, distinct, in range");
	x3_sample_strips(1024, 0.125, 7, "b", s2);
	x3_sample_strips(1024, 0.125, 8, "a", s3);
	CHECK(memcmp(s1, s2, sizeof(int64_t) * 8) && memcmp(s1, s3, sizeof(int64_t) * 8),
	      "strips: another name or seed chooses others");
	CHECK(x3_sample_strips(128, 0.125, 0, "a", s1) == X3_SAMPLE_MIN_STRIPS &&
	      x3_sample_strips(128, 0.01, 0, "a", s1) == X3_SAMPLE_MIN_STRIPS && X3_SAMPLE_MIN_STRIPS == 2 &&
	      x3_sample_strips(384, 0.3, 0, "a", s1) == 8 && x3_sample_strips(16, 0.1, 0, "a", s1) == 1 &&
	      x3_sample_strips(2048, 0.1, 0, "a", s1) == 13,
	      "strips: ceil(frac * strips), at least 2 (all of them when fewer)");
	CHECK(x3_sample_strips(128, 0.01, 0, "a", s1) == 2 && s1[0] < 4 && s1[1] >= 4 && s1[1] < 8,
	      "strips: the minimum 2 of 8 drawn one from each half (%lld, %lld)", (long long)s1[0], (long long)s1[1]);
	ok = x3_sample_strips(384, 1.0, 0, "a", s1) == 24;
	for (int i = 0; i < 24; i++)
		ok &= s1[i] == i;
	CHECK(ok, "strips: frac 1 takes every strip in order");
	/* an even spread: each strip is chosen about equally often over names */
	int cnt[24] = { 0 };
	char nm[32];
	for (int t = 0; t < 480; t++) {
		snprintf(nm, sizeof nm, "t%d", t);
		int64_t m = x3_sample_strips(384, 0.125, 0, nm, s1);
		for (int64_t i = 0; i < m; i++)
			cnt[s1[i]]++;
	}
	int lo = 1 << 30, hi = 0;
	for (int i = 0; i < 24; i++)
		lo = cnt[i] < lo ? cnt[i] : lo, hi = cnt[i] > hi ? cnt[i] : hi;
	CHECK(lo > 40 && hi < 120, "strips: every strip chosen 40..120 times of 480 draws of 3 (%d..%d)", lo, hi);
}

static void test_sample(int fallback)
{
	int64_t n0 = 384, k0 = 256, k = 256, n = 384;
	float *H = corr_gram(1024, k0, 3.0), s[256], sv[384];
	float *W = test_randn(&rng, n0 * k0, 0.05);
	x3_quant_signs(6, "h", k, s);
	x3_quant_signs(6, "w/sv", n, sv);
	x3_qhess *h;
	if (fallback)
		CHECK_OK(x3_qhess_none(k, s, &h), "no Hessian");
	else
		CHECK_OK(x3_qhess_finalize(H, k0, k, 1024, s, &h), "finalize a correlated 256x256 H");
	x3_qweight *w;
	CHECK_OK(x3_regularize(W, n0, k0, h, sv, X3_OUT_SCALES_ALWAYS, &w), "regularize 384x256 (out x in)");
	const char *what = fallback ? "fallback" : "LDLQ";
	for (int K = 2; K <= 4; K += 2) {
		x3_qresult *full, *all, *part;
		CHECK_OK(x3_quantize(w, h, K, X3_CB_MUL1, 0, 0, &full), "%s K=%d: quantize", what, K);
		CHECK_OK(x3_quantize_sample(w, h, K, X3_CB_MUL1, 0, 1.0, 0, 3, "w", &all), "%s K=%d: sample 1", what, K);
		CHECK(same_result(full, all) && all->nstrips == 24 && all->strips_total == 24,
		      "%s K=%d: every strip chosen = x3_quantize bit for bit (g, proxy error, trellis, scales, work)",
		      what, K);
		CHECK(full->search_tiles > 0 && full->ldlq_tiles == (k / 16) * (n / 16),
		      "%s K=%d: work counted: %lld search tiles, %lld LDLQ tiles", what, K,
		      (long long)full->search_tiles, (long long)full->ldlq_tiles);
		CHECK_OK(x3_quantize_sample(w, h, K, X3_CB_MUL1, 0, 0.25, 0, 3, "w", &part), "%s K=%d: sample 1/4", what, K);
		CHECK(part->nstrips == 6 && part->n == 96 && part->strips_total == 24,
		      "%s K=%d: 1/4 of 24 strips is 6 (96 columns)", what, K);
		/* each chosen strip as LDLQ quantizes it within the whole weight at
		 * the sample's scale */
		float *Wg = malloc((size_t)(k * n) * sizeof(float)), *Q = malloc((size_t)(k * n) * sizeof(float));
		uint16_t *st = malloc((size_t)(k * n) * 2), words[16 * 8];
		for (int64_t i = 0; i < k * n; i++)
			Wg[i] = w->W[i] * (float)part->g;
		CHECK_OK(x3_ldlq(Wg, k, n, h->fallback ? NULL : h->L, K, X3_CB_MUL1, 0, st, Q), "ldlq of the whole");
		int same = 1;
		for (int64_t tr = 0; tr < k / 16; tr++)
			for (int64_t j = 0; j < part->nstrips; j++) {
				x3_trellis_pack(K, st + (tr * (n / 16) + part->strip[j]) * 256, words);
				same &= !memcmp(words, part->trellis + (tr * part->nstrips + j) * 16 * K, (size_t)(32 * K));
			}
		for (int64_t j = 0; j < part->n; j++)
			same &= part->svh[j] == x3_f32_to_f16(w->sv[16 * part->strip[j / 16] + j % 16]);
		CHECK(same, "%s K=%d: the sample's strips = those strips of the whole weight's LDLQ", what, K);
		double rel = part->proxy_err / full->proxy_err;
		CHECK(rel > 0.7 && rel < 1.4, "%s K=%d: sampled error %.4g near the whole's %.4g", what, K,
		      part->proxy_err, full->proxy_err);
		double work = (double)(part->search_tiles + part->ldlq_tiles) / (double)(full->search_tiles + full->ldlq_tiles);
		CHECK(work < 0.4, "%s K=%d: the 1/4 sample's Viterbi work %.3f of the whole's", what, K, work);
		/* the final encode at the sample's scale (issue 12: no second
		 * search): no search tiles, the whole's LDLQ at that scale */
		x3_qresult *fg, *fs;
		CHECK_OK(x3_quantize_g(w, h, K, X3_CB_MUL1, 0, 0, part->g, 0, &fg), "%s K=%d: quantize at g", what, K);
		int ok = fg->g == part->g && fg->search_tiles == 0 && fg->ldlq_tiles == full->ldlq_tiles;
		for (int64_t t = 0; t < (k / 16) * (n / 16); t++) {
			x3_trellis_pack(K, st + t * 256, words);
			ok &= !memcmp(words, fg->trellis + t * 16 * K, (size_t)(32 * K));
		}
		for (int64_t i = 0; i < k; i++)
			ok &= fg->suh[i] == x3_f32_to_f16(w->su[i] / (float)part->g);
		CHECK(ok, "%s K=%d: x3_quantize_g at the sample's g %.5g (search: %.5g): 0 search tiles, the whole's LDLQ at g",
		      what, K, part->g, full->g);
		CHECK(fabs(fg->proxy_err / full->proxy_err - 1) < 0.25, "%s K=%d: its error %.4g within 25%% of the searched %.4g (a sample of 4 search tiles)",
		      what, K, fg->proxy_err, full->proxy_err);
		CHECK_OK(x3_quantize_g(w, h, K, X3_CB_MUL1, 0, 0, full->g, 0, &fs), "%s K=%d: quantize at the searched g", what, K);
		fs->search_tiles = full->search_tiles;
		CHECK(same_result(full, fs), "%s K=%d: x3_quantize_g at the searched g = x3_quantize (but the search)", what, K);
		/* refine (the finals of a sampled conversion, --g-refine): the fine
		 * grid only, around a given scale, sliding while its best is an
		 * end; the result is the LDLQ at the scale it found */
		x3_qresult *rf, *rw, *ra;
		CHECK_OK(x3_quantize_g(w, h, K, X3_CB_MUL1, 0, 0, full->g, 1, &rf), "%s K=%d: refine at the searched g", what, K);
		CHECK(rf->search_tiles > 0 && rf->search_tiles < full->search_tiles && fabs(rf->g - full->g) < 0.075 &&
		      rf->proxy_err < 1.03 * full->proxy_err,
		      "%s K=%d: refined around the searched g %.4f: g %.4f, error %.4g (searched %.4g), %lld search tiles (full search %lld)",
		      what, K, full->g, rf->g, rf->proxy_err, full->proxy_err, (long long)rf->search_tiles,
		      (long long)full->search_tiles);
		CHECK_OK(x3_quantize_g(w, h, K, X3_CB_MUL1, 0, 0, full->g + 0.45, 1, &rw), "%s K=%d: refine from g + 0.45", what, K);
		CHECK(fabs(rw->g - full->g) < 0.1 && rw->proxy_err < 1.05 * full->proxy_err &&
		      rw->search_tiles > rf->search_tiles,
		      "%s K=%d: from g + 0.45 the grid slides back: g %.4f (searched %.4f), error %.4g, %lld search tiles",
		      what, K, rw->g, full->g, rw->proxy_err, (long long)rw->search_tiles);
		CHECK_OK(x3_quantize_g(w, h, K, X3_CB_MUL1, 0, 0, rw->g, 0, &ra), "%s K=%d: quantize at the refined g", what, K);
		ra->search_tiles = rw->search_tiles;
		CHECK(same_result(rw, ra), "%s K=%d: the refined result = the LDLQ at the g it found", what, K);
		x3_qresult_free(rf), x3_qresult_free(rw), x3_qresult_free(ra);
		/* the sample with the predicted scale (trellis-encode --sample) */
		x3_qresult *pp, *pg;
		CHECK_OK(x3_quantize_sample(w, h, K, X3_CB_MUL1, 0, 1.0, 1, 3, "w", &pp), "%s K=%d: sample 1, predicted scale", what, K);
		CHECK_OK(x3_quantize_g(w, h, K, X3_CB_MUL1, 0, 0, pp->g, 0, &pg), "%s K=%d: quantize at its g", what, K);
		pg->search_tiles = pp->search_tiles;
		CHECK(pp->search_tiles > 0 && same_result(pp, pg) && pp->proxy_err < 1.05 * full->proxy_err,
		      "%s K=%d: predicted-scale sample: g %.4f (searched %.4f), error %.4g (%.4g), %lld search tiles (%lld), the LDLQ at its g",
		      what, K, pp->g, full->g, pp->proxy_err, full->proxy_err, (long long)pp->search_tiles,
		      (long long)full->search_tiles);
		x3_qresult_free(pp), x3_qresult_free(pg);
		x3_qresult *bad = NULL;
		CHECK(x3_quantize_g(w, h, K, X3_CB_MUL1, 0, 0, -1, 0, &bad) == X3_EINVAL && !bad &&
		      x3_quantize_g(w, h, K, X3_CB_MUL1, 0, 0, NAN, 0, &bad) == X3_EINVAL, "%s K=%d: g < 0 or NaN refused", what, K);
		x3_qresult_free(fg), x3_qresult_free(fs);
		free(Wg), free(Q), free(st);
		x3_qresult_free(full), x3_qresult_free(all), x3_qresult_free(part);
	}
	x3_qresult *r = NULL;
	CHECK(x3_quantize_sample(w, h, 3, X3_CB_MUL1, 0, 0, 0, 3, "w", &r) == X3_EINVAL && !r &&
	      x3_quantize_sample(w, h, 3, X3_CB_MUL1, 0, 1.5, 0, 3, "w", &r) == X3_EINVAL,
	      "%s: fractions outside (0, 1] refused", what);
	x3_qweight_free(w);
	x3_qhess_free(h);
	free(H), free(W);
}

int main(void)
{
	x3_rng_seed(&rng, 1206, 0);
	test_strips();
	test_sample(0);
	test_sample(1);
	TEST_DONE();
}
