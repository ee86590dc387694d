/* bench/proxy-error: cost of the proxy error tr(E H Eᵀ) / tr(W H Wᵀ), our
 * fixed-order loops (x3_proxy_error: the same bits under every BLAS kernel
 * and thread count) against the threaded cblas_sgemm form it replaced (the
 * baseline, whose last digits follow the kernel and the thread count), in
 * the same run; and both next to the LDLQ encode at K=4 of the same tensor,
 * which is what the proxy error adds to. Prints a table and one JSON line
 * per shape. No target: the figure to watch is the share of the encode. */
#include <cblas.h>
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

/* the replaced form: two sgemm passes over column blocks of 1024 */
static double proxy_sgemm(const float *W, const float *Q, const float *H, int64_t k, int64_t n)
{
	const int64_t bw = 1024;
	int64_t w0 = n < bw ? n : bw;
	float *A = malloc((size_t)(k * w0) * sizeof *A), *T = malloc((size_t)(k * w0) * sizeof *T);
	double num = 0, den = 0;
	for (int64_t c0 = 0; c0 < n; c0 += bw) {
		int64_t w = n - c0 < bw ? n - c0 : bw;
		for (int pass = 0; pass < 2; pass++) {
			for (int64_t i = 0; i < k; i++)
				for (int64_t j = 0; j < w; j++) {
					int64_t x = i * n + c0 + j;
					A[i * w + j] = pass ? W[x] : W[x] - Q[x];
				}
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)k, (int)w, (int)k, 1.0f, H,
			            (int)k, A, (int)w, 0.0f, T, (int)w);
			double s = 0;
			for (int64_t i = 0; i < k * w; i++)
				s += (double)A[i] * T[i];
			*(pass ? &den : &num) += s;
		}
	}
	free(A), free(T);
	return num / (den > 1e-8 ? den : 1e-8);
}

int main(void)
{
	static const int64_t shapes[][2] = { { 512, 1024 }, { 1024, 2048 }, { 2048, 2048 } };
	x3_rng r;
	x3_rng_seed(&r, 7, 0);
	printf("%-11s %10s %10s %10s %8s %12s\n", "k x n", "ours s", "sgemm s", "LDLQ K=4 s",
	       "ours/enc", "rel diff");
	for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
		int64_t k = shapes[s][0], n = shapes[s][1];
		float *W = malloc((size_t)(k * n) * sizeof *W), *Q = malloc((size_t)(k * n) * sizeof *Q);
		float *H = malloc((size_t)(k * k) * sizeof *H), *L = malloc((size_t)(k * k) * sizeof *L);
		uint16_t *st = malloc((size_t)(k * n) * sizeof *st);
		for (int64_t i = 0; i < k * n; i++)
			W[i] = (float)x3_rng_normal(&r);
		/* H: a decaying spectrum plus a ridge, SPD */
		for (int64_t i = 0; i < k; i++)
			for (int64_t j = 0; j < k; j++)
				H[i * k + j] = (float)(exp(-fabs((double)(i - j)) / 8.0) + (i == j ? 0.1 : 0));
		memcpy(L, H, (size_t)(k * k) * sizeof *L);
		if (x3_block_ldl(L, k)) {
			fprintf(stderr, "proxy-error: %s\n", x3_errmsg());
			return 1;
		}
		double t0 = now();
		if (x3_ldlq(W, k, n, L, 4, X3_CB_MUL1, 0, st, Q)) {
			fprintf(stderr, "proxy-error: %s\n", x3_errmsg());
			return 1;
		}
		double tenc = now() - t0, e = 0;
		t0 = now();
		x3_proxy_error(W, Q, H, k, n, &e);
		double tours = now() - t0;
		t0 = now();
		double eb = proxy_sgemm(W, Q, H, k, n);
		double tb = now() - t0;
		char sh[32];
		snprintf(sh, sizeof sh, "%lldx%lld", (long long)k, (long long)n);
		printf("%-11s %10.3f %10.3f %10.2f %7.1f%% %12.2g\n", sh, tours, tb, tenc,
		       100 * tours / tenc, fabs(e - eb) / eb);
		printf("{\"bench\":\"proxy-error\",\"shape\":\"%s\",\"threads\":%d,\"ours_s\":%.4f,"
		       "\"sgemm_baseline_s\":%.4f,\"ldlq_k4_s\":%.3f,\"ours_share_of_encode\":%.4f,"
		       "\"rel_diff\":%.3g}\n", sh, omp_get_max_threads(), tours, tb, tenc, tours / tenc,
		       fabs(e - eb) / eb);
		free(W), free(Q), free(H), free(L), free(st);
	}
	return 0;
}
