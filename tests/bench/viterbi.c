/* tests/bench/viterbi.c: throughput of the tail-biting Viterbi encoder.
 *
 * For each K: weights/s of the fast path on one thread (per core) and on
 * all threads (total and per core), the MSE per weight on i.i.d. N(0,1)
 * tiles (scale 1 relative to the codebook RMS), and the scalar reference's
 * throughput measured in the same run as the baseline. Prints a table and
 * one JSON line; exits 1 if any K is below the floor (weights/s/core).
 *
 * Per-core rates are measured on CPU time (the thread's for one thread,
 * the process's for all threads), so they stay meaningful on a shared,
 * loaded machine; the wall-clock total is printed beside them. Each
 * number is the best of REPS runs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>

#include "codec.h"

static const char usage[] =
	"usage: viterbi [-c CODEBOOK] [-i ISA] [-K LIST] [-n TILES] [-r REPS] [-t THREADS] [-f FLOOR] [-R]\n"
	"  -c  codebook (mul1, mcg, 3inst; default mul1)\n"
	"  -i  fast path: avx512, avx2 or scalar (default: the best this CPU has)\n"
	"  -K  comma list of K (default 1,2,3,4,5,6,7,8)\n"
	"  -n  tiles per thread per run (default 16)\n"
	"  -r  runs per measurement, best taken (default 5)\n"
	"  -t  threads for the all-threads column (default: OpenMP maximum)\n"
	"  -f  floor in weights/s/core (default 40000)\n"
	"  -R  skip the scalar reference baseline\n";

static double clk(clockid_t id)
{
	struct timespec t;
	clock_gettime(id, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}
static double now(void) { return clk(CLOCK_MONOTONIC); }

static uint64_t rs = 0x0123456789ABCDEFull;
static double gauss(void)
{
	uint64_t z1 = (rs += 0x9E3779B97F4A7C15ull), z2 = (rs += 0x9E3779B97F4A7C15ull);
	z1 = (z1 ^ (z1 >> 30)) * 0xBF58476D1CE4E5B9ull; z1 = (z1 ^ (z1 >> 27)) * 0x94D049BB133111EBull;
	z2 = (z2 ^ (z2 >> 30)) * 0xBF58476D1CE4E5B9ull; z2 = (z2 ^ (z2 >> 27)) * 0x94D049BB133111EBull;
	double u1 = (((z1 ^ (z1 >> 31)) >> 11) + 1.0) / 9007199254740993.0;
	double u2 = ((z2 ^ (z2 >> 31)) >> 11) / 9007199254740992.0;
	return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* best of reps runs encoding n tiles with nt threads: wall seconds and
 * CPU seconds (thread CPU time for one thread, process CPU time else) */
static void time_fast(int K, int cb, const float *x, int n, int nt, int reps, float *v,
                      double *wall, double *cpu)
{
	clockid_t id = nt == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_PROCESS_CPUTIME_ID;
	*wall = *cpu = INFINITY;
	for (int r = 0; r < reps; r++) {
		double t0 = now(), c0 = clk(id);
		if (x3_viterbi_encode(K, cb, x, n, NULL, v, nt) != X3_OK) {
			fprintf(stderr, "viterbi: encode: %s\n", x3_errmsg());
			exit(1);
		}
		double c = clk(id) - c0, w = now() - t0;
		if (c < *cpu)
			*cpu = c;
		if (w < *wall)
			*wall = w;
	}
}

int main(int argc, char **argv)
{
	int cb = X3_CB_MUL1, ntile = 16, reps = 5, nt = omp_get_max_threads(), doref = 1;
	double floor_wps = 40000;
	int Ks[8], nK = 0;
	char klist[64] = "1,2,3,4,5,6,7,8";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "-h")) {
			fputs(usage, stdout);
			return 0;
		} else if (!strcmp(a, "-R")) {
			doref = 0;
			continue;
		}
		if (!val || a[0] != '-' || strlen(a) != 2 || !strchr("ciKnrtf", a[1])) {
			fputs(usage, stderr);
			return 2;
		}
		i++;
		switch (a[1]) {
		case 'c':
			if (x3_codebook_parse(val, &cb)) {
				fprintf(stderr, "viterbi: %s\n", x3_errmsg());
				return 2;
			}
			break;
		case 'i': {
			int isa = !strcmp(val, "avx512") ? X3_ISA_AVX512 : !strcmp(val, "avx2") ? X3_ISA_AVX2
			          : !strcmp(val, "scalar") ? X3_ISA_SCALAR : -1;
			if (x3_viterbi_set_isa(isa) != X3_OK) {
				fprintf(stderr, "viterbi: -i %s: %s\n", val, x3_errmsg());
				return 2;
			}
			break;
		}
		case 'K': snprintf(klist, sizeof klist, "%s", val); break;
		case 'n': ntile = atoi(val); break;
		case 'r': reps = atoi(val); break;
		case 't': nt = atoi(val); break;
		case 'f': floor_wps = atof(val); break;
		}
	}
	for (char *p = strtok(klist, ","); p && nK < 8; p = strtok(NULL, ","))
		Ks[nK++] = atoi(p);
	if (ntile < 1 || reps < 1 || reps > 15 || nt < 1 || nK == 0) {
		fputs(usage, stderr);
		return 2;
	}
	for (int i = 0; i < nK; i++)
		if (Ks[i] < 1 || Ks[i] > 8) {
			fprintf(stderr, "viterbi: K=%d out of range 1..8\n", Ks[i]);
			return 2;
		}

	const double rms = cb == X3_CB_MUL1 ? 1.0 : X3_CODEBOOK_SCALE;
	const int nmax = ntile * nt;
	float *x = malloc(sizeof(float) * 256 * nmax), *xs = malloc(sizeof(float) * 256 * nmax);
	float *v = malloc(sizeof(float) * 256 * nmax);
	if (!x || !xs || !v)
		return 1;
	for (int i = 0; i < 256 * nmax; i++) {
		x[i] = (float)gauss();
		xs[i] = (float)(x[i] * rms);
	}

	printf("Viterbi encoder, codebook %s, fast path %s, %d threads, %d tiles/thread, "
	       "best of %d\n", x3_codebook_name(cb), x3_viterbi_isa_name(x3_viterbi_isa()),
	       nt, ntile, reps);
	printf("weights/s: 1thr = one thread per CPU second; all/core = all threads per "
	       "CPU second; all wall = total per wall second\n");
	printf("%2s %12s %12s %12s %10s %12s %8s\n", "K", "1thr w/s", "all w/s/core",
	       "all wall w/s", "MSE", "ref w/s", "speedup");
	double minc = INFINITY;
	char json[4096];
	int jl = snprintf(json, sizeof json, "{\"bench\":\"viterbi\",\"codebook\":\"%s\","
	                  "\"isa\":\"%s\",\"threads\":%d,\"floor\":%.0f,\"K\":{",
	                  x3_codebook_name(cb), x3_viterbi_isa_name(x3_viterbi_isa()), nt,
	                  floor_wps);
	for (int i = 0; i < nK; i++) {
		int K = Ks[i];
		x3_viterbi_encode(K, cb, xs, 1, NULL, v, 1);   /* warm up */
		double t1w, t1, tnw, tn;
		time_fast(K, cb, xs, ntile, 1, reps, v, &t1w, &t1);
		time_fast(K, cb, xs, nmax, nt, reps, v, &tnw, &tn);
		double mse = 0;
		for (int j = 0; j < 256 * nmax; j++) {
			double d = v[j] / rms - x[j];
			mse += d * d;
		}
		mse /= 256.0 * nmax;
		double w1 = 256.0 * ntile / t1, wc = 256.0 * nmax / tn, wn = 256.0 * nmax / tnw;
		double wr = NAN;
		if (doref) {
			double c0 = clk(CLOCK_THREAD_CPUTIME_ID);
			x3_viterbi_encode_ref(K, cb, xs, 1, NULL, v);
			wr = 256.0 / (clk(CLOCK_THREAD_CPUTIME_ID) - c0);
		}
		if (w1 < minc)
			minc = w1;
		if (wc < minc)
			minc = wc;
		if (doref)
			printf("%2d %12.0f %12.0f %12.0f %10.5f %12.0f %7.1fx\n", K, w1, wc, wn, mse, wr,
			       w1 / wr);
		else
			printf("%2d %12.0f %12.0f %12.0f %10.5f %12s %8s\n", K, w1, wc, wn, mse, "-", "-");
		jl += snprintf(json + jl, sizeof json - jl, "%s\"%d\":{\"wps_1thr\":%.0f,"
		               "\"wps_all_wall\":%.0f,\"wps_core\":%.0f,\"mse\":%.6f,\"ref_wps\":%.0f}",
		               i ? "," : "", K, w1, wn, wc, mse, doref ? wr : 0.0);
	}
	snprintf(json + jl, sizeof json - jl, "},\"min_wps_core\":%.0f,\"pass\":%s}", minc,
	         minc >= floor_wps ? "true" : "false");
	puts(json);
	free(x);
	free(xs);
	free(v);
	if (minc < floor_wps) {
		fprintf(stderr, "viterbi: %.0f weights/s/core is below the floor %.0f\n", minc,
		        floor_wps);
		return 1;
	}
	return 0;
}
