/* gpu: benchmarks of the CUDA path (skips without a device):
 *   - Viterbi encoder throughput on a 4096x14336 layer (229376 tiles of
 *     N(0,1) targets, MUL1) at K=2 and K=4, with MSE, device scratch, and
 *     a bit-identity spot check of the first tiles against the CPU; and
 *     as LDLQ's host path calls it, once per 16-row block of 64, 256 or
 *     896 tiles (ms per call against the large launch's rate);
 *   - batch-1 GEMV from the packed trellis at K=2/3/4 on 8192x8192 and
 *     8192x28672 (k x n), cycling through enough copies of the weights to
 *     exceed 4x the L2, as GB/s of trellis bytes and as % of the measured
 *     device-to-device copy bandwidth (2 x bytes / time), against the cuBLAS
 *     fp16 GEMV (cublasGemmEx, n x 1) on the dense fp16 weight: the fused
 *     kernel (the whole forward in one launch, Hadamards included) and the
 *     unfused GEMV kernel alone; also the latency of the whole forward call,
 *     fused (path 1: one launch + sync) and unfused (path 4: Hadamard +
 *     memset + GEMV + Hadamard + sync), in the same run;
 *   - the large-batch path (reconstruct + cuBLAS GEMM) at m=256.
 * Prints a table, then one JSON line. Options: -t TILES (encoder tiles,
 * default 229376), -r REPS (GEMV calls per measurement, default 200),
 * -q (skip the encoder). Built with CUDA only: it links the backend's
 * functions and kernels (lib/gpu/gpu*.c, kernels/) instead of loading the
 * object, to time the kernels themselves. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "x3.h"
#include "codec.h"
#include "gpu_impl.h"
#include "gpu_kern.h"

#include <cuda_runtime.h>
#include <cublas_v2.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define DIE(...) do { fprintf(stderr, "gpu bench: " __VA_ARGS__); fprintf(stderr, ": %s\n", x3_errmsg()); exit(1); } while (0)

struct row { char what[96]; double value; char unit[24]; char note[96]; };
static struct row rows[64];
static int nrows;
static void add(const char *what, double v, const char *unit, const char *note)
{
	struct row *r = &rows[nrows++];
	snprintf(r->what, sizeof r->what, "%s", what);
	r->value = v;
	snprintf(r->unit, sizeof r->unit, "%s", unit);
	snprintf(r->note, sizeof r->note, "%s", note ? note : "");
	printf("# %-44s %12.2f %-8s %s\n", what, v, unit, r->note);
	fflush(stdout);
}

static double copy_bw(void)
{
	const size_t b = (size_t)1 << 30;
	void *a = NULL, *c = NULL;
	if (x3_gpu_alloc(&a, b) || x3_gpu_alloc(&c, b))
		DIE("copy buffers");
	cudaMemset(a, 1, b);
	cudaMemcpy(c, a, b, cudaMemcpyDeviceToDevice);
	cudaDeviceSynchronize();
	double best = 0;
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now();
		for (int i = 0; i < 5; i++)
			cudaMemcpy(c, a, b, cudaMemcpyDeviceToDevice);
		cudaDeviceSynchronize();
		double gbs = 2.0 * 5 * (double)b / (now() - t0) / 1e9;
		if (gbs > best)
			best = gbs;
	}
	x3_gpu_free(a);
	x3_gpu_free(c);
	return best;
}

static void bench_encoder(int K, int64_t ntiles, double *wps)
{
	const int cb = X3_CB_MUL1;
	float *x = malloc(sizeof(float) * 256 * (size_t)ntiles);
	if (!x)
		DIE("out of memory");
	x3_rng r;
	x3_rng_seed(&r, 2024, (uint64_t)K);
	for (int64_t i = 0; i < 256 * ntiles; i++)
		x[i] = (float)x3_rng_normal(&r);
	float *x_d = NULL, *v_d = NULL;
	uint16_t *s_d = NULL;
	if (x3_gpu_alloc((void **)&x_d, sizeof(float) * 256 * (size_t)ntiles) ||
	    x3_gpu_alloc((void **)&v_d, sizeof(float) * 256 * (size_t)ntiles) ||
	    x3_gpu_alloc((void **)&s_d, sizeof(uint16_t) * 256 * (size_t)ntiles) ||
	    x3_gpu_upload(x_d, x, sizeof(float) * 256 * (size_t)ntiles))
		DIE("encoder buffers");
	size_t scratch = 0;
	/* warm-up on a few tiles (module load, plan) */
	if (x3_gpu_viterbi_encode_d(K, cb, x_d, ntiles < 512 ? ntiles : 512, s_d, v_d, 0, &scratch))
		DIE("encode warm-up");
	double t0 = now();
	if (x3_gpu_viterbi_encode_d(K, cb, x_d, ntiles, s_d, v_d, 0, &scratch))
		DIE("encode K=%d", K);
	double t = now() - t0;
	float *v = malloc(sizeof(float) * 256 * (size_t)ntiles);
	uint16_t *s = malloc(sizeof(uint16_t) * 256 * (size_t)ntiles);
	if (x3_gpu_download(v, v_d, sizeof(float) * 256 * (size_t)ntiles) ||
	    x3_gpu_download(s, s_d, sizeof(uint16_t) * 256 * (size_t)ntiles))
		DIE("download");
	double mse = 0;
	for (int64_t i = 0; i < 256 * ntiles; i++)
		mse += ((double)v[i] - x[i]) * ((double)v[i] - x[i]);
	mse /= 256.0 * (double)ntiles;
	/* spot check: first tiles against the CPU encoder */
	const int64_t nchk = ntiles < 32 ? ntiles : 32;
	uint16_t *sc = malloc(sizeof(uint16_t) * 256 * (size_t)nchk);
	if (x3_viterbi_encode(K, cb, x, nchk, sc, NULL, 0))
		DIE("cpu encode");
	int same = !memcmp(sc, s, sizeof(uint16_t) * 256 * (size_t)nchk);
	*wps = 256.0 * (double)ntiles / t;
	char what[96], note[96];
	snprintf(what, sizeof what, "encoder K=%d 4096x14336-equiv (%lld tiles)", K,
	         (long long)ntiles);
	snprintf(note, sizeof note, "%.2f s, mse %.5f, cpu-identical(%lld tiles)=%s", t, mse,
	         (long long)nchk, same ? "yes" : "NO");
	add(what, *wps / 1e6, "Mw/s", note);
	const size_t io = (size_t)ntiles * 256 * (4 + 4 + 2);
	snprintf(what, sizeof what, "encoder K=%d device memory (scratch + in/out)", K);
	snprintf(note, sizeof note, "scratch %.1f MiB + targets/states/values %.1f MiB",
	         (double)scratch / (1 << 20), (double)io / (1 << 20));
	add(what, (double)(scratch + io) / (1 << 20), "MiB", note);
	free(x), free(v), free(s), free(sc);
	x3_gpu_free(x_d), x3_gpu_free(v_d), x3_gpu_free(s_d);
}

/* The encoder as LDLQ calls it on the host path (trellis-encode --device
 * cuda without --gpu-ldlq): x3_gpu_viterbi_encode once per 16-row block,
 * with the block's n/16 tiles (upload, launch, wait, download): ms per call
 * at the block sizes of an 8B layer (k/v_proj 64 tiles, q/o/down_proj 256,
 * gate/up_proj 896), against the rate of one large launch (full) */
static void bench_steps(int K, double full, double *ms)
{
	static const int64_t sizes[3] = {64, 256, 896};
	const int calls = 20;
	float *x = malloc(sizeof(float) * 256 * 896);
	float *v = malloc(sizeof(float) * 256 * 896);
	uint16_t *st = malloc(sizeof(uint16_t) * 256 * 896);
	if (!x || !v || !st)
		DIE("out of memory");
	x3_rng r;
	x3_rng_seed(&r, 2025, (uint64_t)K);
	for (int64_t i = 0; i < 256 * 896; i++)
		x[i] = (float)x3_rng_normal(&r);
	for (int si = 0; si < 3; si++) {
		const int64_t nt = sizes[si];
		if (x3_gpu_viterbi_encode(K, X3_CB_MUL1, x, nt, st, v))   /* warm: buffers, plan */
			DIE("step warm-up");
		double t0 = now();
		for (int c = 0; c < calls; c++)
			if (x3_gpu_viterbi_encode(K, X3_CB_MUL1, x, nt, st, v))
				DIE("step K=%d, %lld tiles", K, (long long)nt);
		double t = (now() - t0) / calls;
		ms[si] = t * 1e3;
		char what[96], note[96];
		snprintf(what, sizeof what, "LDLQ step K=%d, %lld tiles a call", K, (long long)nt);
		snprintf(note, sizeof note, "%.2f Mw/s, %.0f%% of one large launch", 256.0 * nt / t / 1e6,
		         full > 0 ? 100 * 256.0 * nt / t / full : 0.0);
		add(what, ms[si], "ms/call", note);
	}
	free(x), free(v), free(st);
}

/* Batch-1 GEMV: the fused kernel (one launch: Hadamards, decode GEMV,
 * svh) and the unfused GEMV kernel alone, each as async launches cycling
 * through copies of the trellis (more than 4x the L2); then the whole
 * x3_gpu_linear_forward_d call, fused (path 1) and unfused (path 4), on
 * one copy. Returns the fused kernel's seconds per call; *unf gets the
 * unfused kernel's. */
static double bench_gemv(int K, int64_t k, int64_t n, int reps, double copy_gbs, int l2,
                         double *unf)
{
	const int cb = X3_CB_MUL1;
	const size_t tbytes = (size_t)(k * n) * (size_t)K / 8;
	int copies = (int)((4.0 * l2) / (double)tbytes) + 1;
	if (copies > 64)
		copies = 64;
	x3_rng r;
	x3_rng_seed(&r, 7, (uint64_t)K);
	uint16_t *tr = malloc(tbytes), *suh = malloc(2 * k), *svh = malloc(2 * n);
	for (size_t i = 0; i < tbytes / 2; i++)
		tr[i] = (uint16_t)x3_rng_u64(&r);
	for (int64_t i = 0; i < k; i++)
		suh[i] = x3_f32_to_f16(0.01f);
	for (int64_t i = 0; i < n; i++)
		svh[i] = x3_f32_to_f16(1.0f);
	uint16_t **t_d = calloc((size_t)copies, sizeof *t_d);
	for (int c = 0; c < copies; c++)
		if (x3_gpu_alloc((void **)&t_d[c], tbytes) || x3_gpu_upload(t_d[c], tr, tbytes))
			DIE("trellis copy %d", c);
	float *x_d = NULL, *y_d = NULL, *y1_d = NULL, *su_d = NULL, *sv_d = NULL;
	int *cnt_d = NULL;
	if (x3_gpu_alloc((void **)&x_d, sizeof(float) * (size_t)k) ||
	    x3_gpu_alloc((void **)&y_d, sizeof(float) * (size_t)n) ||
	    x3_gpu_alloc((void **)&y1_d, sizeof(float) * 16 * (size_t)n) ||
	    x3_gpu_alloc((void **)&su_d, sizeof(float) * (size_t)k) ||
	    x3_gpu_alloc((void **)&sv_d, sizeof(float) * (size_t)n) ||
	    x3_gpu_alloc((void **)&cnt_d, sizeof(int) * (size_t)(n / 128)) ||
	    x3_gpu_memset(x_d, 0, sizeof(float) * (size_t)k) ||
	    x3_gpu_memset(y_d, 0, sizeof(float) * (size_t)n) ||
	    x3_gpu_memset(y1_d, 0, sizeof(float) * 16 * (size_t)n) ||
	    x3_gpu_memset(su_d, 0, sizeof(float) * (size_t)k) ||
	    x3_gpu_memset(sv_d, 0, sizeof(float) * (size_t)n) ||
	    x3_gpu_memset(cnt_d, 0, sizeof(int) * (size_t)(n / 128)))
		DIE("gemv buffers");
	const int ks = x3k_gemv_ksplit(k, n);
	double t[2];   /* [0] fused, [1] unfused kernel */
	for (int fu = 0; fu < 2; fu++) {
		for (int c = 0; c < copies; c++)
			if (fu ? x3k_gemv(K, cb, t_d[c], k, n, x_d, 1, y_d, ks, 1, NULL)
			       : x3k_gemv_fused(K, cb, t_d[c], k, n, x_d, 1, su_d, sv_d, NULL, y_d, y1_d,
			                        cnt_d, ks, 1, NULL))
				DIE("gemv warm-up");
		cudaDeviceSynchronize();
		double t0 = now();
		for (int i = 0; i < reps; i++) {
			if (fu)
				x3k_gemv(K, cb, t_d[i % copies], k, n, x_d, 1, y_d, ks, 1, NULL);
			else
				x3k_gemv_fused(K, cb, t_d[i % copies], k, n, x_d, 1, su_d, sv_d, NULL, y_d,
				               y1_d, cnt_d, ks, 1, NULL);
		}
		if (cudaDeviceSynchronize() != cudaSuccess)
			DIE("gemv kernel");
		t[fu] = (now() - t0) / reps;
	}
	/* the whole call, fused (path 1) and unfused (path 4) */
	x3_gpu_linear *L = NULL;
	if (x3_gpu_linear_create(K, cb, k, n, tr, suh, svh, NULL, &L) ||
	    x3_gpu_linear_forward_d(L, x_d, 1, y_d, 1) || x3_gpu_linear_forward_d(L, x_d, 1, y_d, 4))
		DIE("linear");
	const int rf = reps < 50 ? reps : 50;
	double tf[2];
	for (int fu = 0; fu < 2; fu++) {
		double t1 = now();
		for (int i = 0; i < rf; i++)
			if (x3_gpu_linear_forward_d(L, x_d, 1, y_d, fu ? 4 : 1))
				DIE("forward");
		tf[fu] = (now() - t1) / rf;
	}
	char what[96], note[96];
	for (int fu = 0; fu < 2; fu++) {
		const double gbs = (double)tbytes / t[fu] / 1e9;
		snprintf(what, sizeof what, "gemv m=1 K=%d %lldx%lld (%s)", K, (long long)k, (long long)n,
		         fu ? "unfused gemv kernel" : "fused kernel");
		snprintf(note, sizeof note, "%.1f us, %.1f%% of copy bw, %d copies, ksplit %d",
		         t[fu] * 1e6, 100.0 * gbs / copy_gbs, copies, ks);
		add(what, gbs, "GB/s", note);
	}
	for (int fu = 0; fu < 2; fu++) {
		snprintf(what, sizeof what, "gemv m=1 K=%d %lldx%lld (whole call, %s)", K, (long long)k,
		         (long long)n, fu ? "unfused" : "fused");
		snprintf(note, sizeof note, "%s, one copy (L2-warm)",
		         fu ? "hadamard + memset + gemv + hadamard + sync" : "one launch + sync");
		add(what, tf[fu] * 1e6, "us", note);
	}
	x3_gpu_linear_free(L);
	for (int c = 0; c < copies; c++)
		x3_gpu_free(t_d[c]);
	free(t_d), free(tr), free(suh), free(svh);
	x3_gpu_free(x_d), x3_gpu_free(y_d), x3_gpu_free(y1_d), x3_gpu_free(su_d), x3_gpu_free(sv_d);
	x3_gpu_free(cnt_d);
	*unf = t[1];
	return t[0];
}

/* cuBLAS fp16 GEMV (GemmEx, n x 1) on a dense fp16 (k, n) weight */
static double bench_fp16(int64_t k, int64_t n, int reps)
{
	cublasHandle_t h;
	if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
		DIE("cublas");
	void *w = NULL, *x = NULL, *y = NULL;
	if (x3_gpu_alloc(&w, (size_t)(k * n) * 2) || x3_gpu_alloc(&x, (size_t)k * 2) ||
	    x3_gpu_alloc(&y, (size_t)n * 4))
		DIE("fp16 buffers");
	cudaMemset(w, 0, (size_t)(k * n) * 2);
	cudaMemset(x, 0, (size_t)k * 2);
	const float one = 1.0f, zero = 0.0f;
	double t = 0;
	for (int pass = 0; pass < 2; pass++) {
		double t0 = now();
		const int nr = pass ? reps : 3;
		for (int i = 0; i < nr; i++)
			cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, 1, (int)k, &one, w, CUDA_R_16F,
			             (int)n, x, CUDA_R_16F, (int)k, &zero, y, CUDA_R_32F, (int)n,
			             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		cudaDeviceSynchronize();
		t = (now() - t0) / nr;
	}
	char what[96], note[96];
	snprintf(what, sizeof what, "cublas fp16 gemv m=1 %lldx%lld", (long long)k, (long long)n);
	snprintf(note, sizeof note, "%.1f us/call", t * 1e6);
	add(what, (double)(k * n) * 2 / t / 1e9, "GB/s", note);
	x3_gpu_free(w), x3_gpu_free(x), x3_gpu_free(y);
	cublasDestroy(h);
	return t;
}

static void bench_gemm(int K, int64_t k, int64_t n, int m)
{
	uint16_t *tr = calloc((size_t)(k * n) * (size_t)K / 8, 1), *suh = malloc(2 * k),
	         *svh = malloc(2 * n);
	for (int64_t i = 0; i < k; i++)
		suh[i] = x3_f32_to_f16(0.01f);
	for (int64_t i = 0; i < n; i++)
		svh[i] = x3_f32_to_f16(1.0f);
	x3_gpu_linear *L = NULL;
	float *x_d = NULL, *y_d = NULL;
	if (x3_gpu_linear_create(K, X3_CB_MUL1, k, n, tr, suh, svh, NULL, &L) ||
	    x3_gpu_alloc((void **)&x_d, sizeof(float) * (size_t)(m * k)) ||
	    x3_gpu_alloc((void **)&y_d, sizeof(float) * (size_t)(m * n)) ||
	    x3_gpu_memset(x_d, 0, sizeof(float) * (size_t)(m * k)))
		DIE("gemm setup");
	if (x3_gpu_linear_forward_d(L, x_d, m, y_d, 2))
		DIE("gemm warm-up");
	const int reps = 20;
	double t0 = now();
	for (int i = 0; i < reps; i++)
		if (x3_gpu_linear_forward_d(L, x_d, m, y_d, 2))
			DIE("gemm");
	double t = (now() - t0) / reps;
	char what[96], note[96];
	snprintf(what, sizeof what, "reconstruct+gemm m=%d K=%d %lldx%lld", m, K, (long long)k,
	         (long long)n);
	snprintf(note, sizeof note, "%.1f us/call", t * 1e6);
	add(what, 2.0 * m * (double)(k * n) / t / 1e12, "TFLOP/s", note);
	x3_gpu_linear_free(L);
	free(tr), free(suh), free(svh);
	x3_gpu_free(x_d), x3_gpu_free(y_d);
}

int main(int argc, char **argv)
{
	int64_t ntiles = 4096LL * 14336 / 256;
	int reps = 200, skip_enc = 0, opt;
	while ((opt = getopt(argc, argv, "t:r:qh")) != -1) {
		switch (opt) {
		case 't': ntiles = atoll(optarg); break;
		case 'r': reps = atoi(optarg); break;
		case 'q': skip_enc = 1; break;
		case 'h':
			printf("usage: gpu [-t TILES] [-r REPS] [-q]\n");
			return 0;
		default:
			fprintf(stderr, "usage: gpu [-t TILES] [-r REPS] [-q]\n");
			return 2;
		}
	}
	if (ntiles < 1 || reps < 1) {
		fprintf(stderr, "gpu bench: -t and -r must be positive\n");
		return 2;
	}
	if (!x3_gpu_dev_available()) {
		printf("gpu: SKIP (%s)\n", x3_errmsg());
		printf("{\"bench\":\"gpu\",\"skipped\":true}\n");
		return 0;
	}
	char desc[256];
	x3_gpu_describe(desc, sizeof desc);
	printf("# device: %s\n", desc);
	int dev = 0, l2 = 0;
	cudaGetDevice(&dev);
	cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
	const double cbw = copy_bw();
	add("device-to-device copy (2 x bytes / time)", cbw, "GB/s", "cudaMemcpy 1 GiB");
	double enc2 = 0, enc4 = 0, step4[3] = {0, 0, 0};
	if (!skip_enc) {
		bench_encoder(2, ntiles, &enc2);
		bench_encoder(4, ntiles, &enc4);
		bench_steps(4, enc4, step4);
	}
	double g[2][3], gu[2][3], f[2];
	const int64_t shapes[2][2] = {{8192, 8192}, {8192, 28672}};
	for (int si = 0; si < 2; si++) {
		for (int K = 2; K <= 4; K++)
			g[si][K - 2] = bench_gemv(K, shapes[si][0], shapes[si][1], reps, cbw, l2,
			                          &gu[si][K - 2]);
		f[si] = bench_fp16(shapes[si][0], shapes[si][1], reps);
		for (int K = 2; K <= 4; K++) {
			char what[96];
			snprintf(what, sizeof what, "speed-up vs fp16 K=%d %lldx%lld", K,
			         (long long)shapes[si][0], (long long)shapes[si][1]);
			add(what, f[si] / g[si][K - 2], "x", "cublas fp16 time / fused exl3 kernel time");
		}
	}
	bench_gemm(4, 8192, 8192, 256);

	printf("\n%-46s %12s %-8s %s\n", "benchmark", "value", "unit", "notes");
	for (int i = 0; i < nrows; i++)
		printf("%-46s %12.2f %-8s %s\n", rows[i].what, rows[i].value, rows[i].unit, rows[i].note);
	const double t4 = (double)(8192LL * 8192) * 4 / 8 / g[0][2] / 1e9;
	printf("\ntargets: encoder >= 20 Mw/s (K=2: %.1f, K=4: %.1f); gemv K=4 8192x8192 >= 60%% of "
	       "copy bw (fused kernel, Hadamards included: %.1f%%)\n", enc2 / 1e6, enc4 / 1e6,
	       100 * t4 / cbw);
	printf("{\"bench\":\"gpu\",\"device\":\"%s\",\"copy_gbs\":%.1f,\"enc_k2_mwps\":%.2f,"
	       "\"enc_k4_mwps\":%.2f,\"ldlq_step_k4_ms\":{\"64\":%.3f,\"256\":%.3f,\"896\":%.3f}",
	       desc, cbw, enc2 / 1e6, enc4 / 1e6, step4[0], step4[1], step4[2]);
	for (int si = 0; si < 2; si++)
		for (int K = 2; K <= 4; K++)
			printf(",\"gemv_k%d_%lldx%lld_us\":%.2f,\"gemv_unfused_k%d_%lldx%lld_us\":%.2f", K,
			       (long long)shapes[si][0], (long long)shapes[si][1], g[si][K - 2] * 1e6, K,
			       (long long)shapes[si][0], (long long)shapes[si][1], gu[si][K - 2] * 1e6);
	printf(",\"fp16_8192x8192_us\":%.2f,\"fp16_8192x28672_us\":%.2f}\n", f[0] * 1e6, f[1] * 1e6);
	/* exit 1 when a target is missed (tests/bench/run reports it) */
	const int missed = (!skip_enc && (enc2 < 20e6 || enc4 < 20e6)) || 100 * t4 / cbw < 60;
	return missed;
}
