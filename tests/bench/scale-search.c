/* bench/scale-search: the cost of trellis-encode's scale search per tensor
 * size, capped (x3_scale_search: at most 1/8 of the encode's Viterbi work)
 * against the full sample (ExLlamaV3's search, cap 0: the baseline) in the
 * same run, next to the LDLQ encode at the chosen scale; with the scale each
 * chooses and the proxy error of the encode at each scale (H: a decaying
 * spectrum plus a ridge, as bench/proxy-error). Weights are N(0,1) or
 * Student t (df 4, outliers). X3_BENCH_K: bits (default 4). Target: the
 * capped search costs <= 1/4 of the encode where the cap binds (k n / 256 >=
 * 72 X3_SCALE_MIN_TILES tiles, about 544x544 and up) and no more than the
 * full search below (there the search is a bounded X3_SCALE_MIN_TILES-tile
 * cost, ~0.1-0.3 s at K=4 on one core). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "codec.h"
#include "quant.h"
#include "x3.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(void)
{
	fprintf(stderr, "scale-search: %s\n", x3_errmsg());
	exit(1);
}

/* proxy error of the LDLQ encode of W * g */
static double encode_at(const float *W, const float *H, const float *L, int64_t k, int64_t n,
                        int K, double g, double *secs)
{
	float *Wg = malloc((size_t)(k * n) * sizeof *Wg), *Q = malloc((size_t)(k * n) * sizeof *Q);
	uint16_t *st = malloc((size_t)(k * n) * sizeof *st);
	if (!Wg || !Q || !st)
		exit(1);
	for (int64_t i = 0; i < k * n; i++)
		Wg[i] = W[i] * (float)g;
	double t0 = now(), e = 0;
	if (x3_ldlq(Wg, k, n, L, K, X3_CB_MUL1, 0, st, Q) || x3_proxy_error(Wg, Q, H, k, n, &e))
		die();
	*secs = now() - t0;
	free(Wg), free(Q), free(st);
	return e;
}

int main(void)
{
	static const struct { int64_t k, n; int t; } shapes[] = {
		{ 128, 128, 0 }, { 128, 256, 0 }, { 256, 256, 0 }, { 256, 256, 1 }, { 512, 512, 0 },
		{ 1024, 1024, 0 }, { 1024, 1024, 1 }, { 2048, 1024, 0 },
	};
	const char *ke = getenv("X3_BENCH_K");
	int K = ke ? atoi(ke) : 4, missed = 0;
	printf("K=%d; search s: full sample (baseline) / capped; proxy error of the encode at each g\n", K);
	printf("%-13s %9s %9s %9s %7s %8s %8s %10s %10s\n", "k x n", "full s", "capped s", "encode s",
	       "cap/enc", "g full", "g cap", "err full", "err cap");
	for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
		int64_t k = shapes[s].k, n = shapes[s].n;
		x3_rng r;
		x3_rng_seed(&r, 7, s);
		float *W = malloc((size_t)(k * n) * sizeof *W);
		float *H = malloc((size_t)(k * k) * sizeof *H), *L = malloc((size_t)(k * k) * sizeof *L);
		if (!W || !H || !L)
			return 1;
		for (int64_t i = 0; i < k * n; i++)
			W[i] = (float)(shapes[s].t ? x3_rng_student_t(&r, 4) / sqrt(2.0) : x3_rng_normal(&r));
		for (int64_t i = 0; i < k; i++)
			for (int64_t j = 0; j < k; j++)
				H[i * k + j] = (float)(exp(-fabs((double)(i - j)) / 8.0) + (i == j ? 0.1 : 0));
		memcpy(L, H, (size_t)(k * k) * sizeof *L);
		if (x3_block_ldl(L, k))
			die();
		double gf, gc, t0 = now();
		if (x3_scale_search_cap(W, k, n, K, X3_CB_MUL1, 0, 0, &gf))
			die();
		double tf = now() - t0;
		t0 = now();
		if (x3_scale_search(W, k, n, K, X3_CB_MUL1, 0, &gc))
			die();
		double tc = now() - t0, tenc, tenc2;
		double ef = encode_at(W, H, L, k, n, K, gf, &tenc);
		double ec = gc == gf ? ef : encode_at(W, H, L, k, n, K, gc, &tenc2);
		char sh[40];
		snprintf(sh, sizeof sh, "%lldx%lld%s", (long long)k, (long long)n, shapes[s].t ? " t4" : "");
		printf("%-13s %9.3f %9.3f %9.3f %6.0f%% %8.4f %8.4f %10.6f %10.6f\n", sh, tf, tc, tenc,
		       100 * tc / tenc, gf, gc, ef, ec);
		printf("{\"bench\":\"scale-search\",\"shape\":\"%s\",\"K\":%d,\"threads\":%d,"
		       "\"full_s\":%.4f,\"capped_s\":%.4f,\"encode_s\":%.4f,\"g_full\":%.6f,"
		       "\"g_capped\":%.6f,\"err_full\":%.6g,\"err_capped\":%.6g}\n", sh, K,
		       omp_get_max_threads(), tf, tc, tenc, gf, gc, ef, ec);
		if (k / 16 * (n / 16) >= 72 * X3_SCALE_MIN_TILES ? tc > tenc / 4 : tc > tf)
			missed = 1;
		free(W), free(H), free(L);
	}
	return missed;
}
