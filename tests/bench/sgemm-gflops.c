/* sgemm-gflops [M N K [SECONDS]]: OpenBLAS cblas_sgemm throughput,
 * C (M x N) = A (M x K) · B (N x K)ᵀ as the model forward multiplies
 * activations with weights. Prints a table line and a JSON line; used by
 * tests/bench/hessian-capture.sh as the machine's GEMM reference. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <cblas.h>
#include "x3.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	long m = argc > 3 ? atol(argv[1]) : 2048, n = argc > 3 ? atol(argv[2]) : 2816;
	long k = argc > 3 ? atol(argv[3]) : 1024;
	double secs = argc > 4 ? atof(argv[4]) : 1.0;
	if (m < 1 || n < 1 || k < 1 || m * k > (1L << 30) || n * k > (1L << 30) || m * n > (1L << 30)) {
		fprintf(stderr, "usage: sgemm-gflops [M N K [SECONDS]]\n");
		return 2;
	}
	float *a = malloc(sizeof(float) * (size_t)(m * k)), *b = malloc(sizeof(float) * (size_t)(n * k));
	float *c = malloc(sizeof(float) * (size_t)(m * n));
	if (!a || !b || !c) {
		fprintf(stderr, "sgemm-gflops: out of memory\n");
		return 1;
	}
	x3_rng g;
	x3_rng_seed(&g, 1, 0);
	for (long i = 0; i < m * k; i++) a[i] = (float)x3_rng_normal(&g);
	for (long i = 0; i < n * k; i++) b[i] = (float)x3_rng_normal(&g);
	/* warm-up, then as many calls as fit in the time */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)k,
	            b, (int)k, 0.0f, c, (int)n);
	int reps = 0;
	double t0 = now(), t;
	do {
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, a,
		            (int)k, b, (int)k, 0.0f, c, (int)n);
		reps++;
	} while ((t = now() - t0) < secs);
	double gf = 2.0 * (double)m * n * k * reps / t / 1e9;
	/* the kernel OpenBLAS picked: a CPU it does not recognize gets a slow
	 * generic one (OPENBLAS_CORETYPE=SkylakeX or Haswell overrides) */
	const char *core = openblas_get_corename();
	printf("sgemm %ldx%ldx%ld: %d calls in %.2f s, %.1f GFLOP/s (OpenBLAS core %s)\n", m, n, k,
	       reps, t, gf, core);
	printf("{\"bench\": \"sgemm\", \"m\": %ld, \"n\": %ld, \"k\": %ld, \"gflops\": %.2f, "
	       "\"openblas_core\": \"%s\"}\n", m, n, k, gf, core);
	free(a), free(b), free(c);
	return 0;
}
