/* tests/bench/viterbi.c: throughput of the tail-biting Viterbi encoder.
 *
 * For each K: weights/s of the fast path on one thread (per core) and on
 * all threads (total and per core), the MSE per weight on i.i.d. N(0,1)
 * tiles (scale 1 relative to the codebook RMS), and the scalar reference's
 * throughput measured in the same run as the baseline. Prints a table and
 * one JSON line; exits 1 if any K is below the floor (weights/s/core). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>

#include "codec.h"

static const char usage[] =
	"usage: viterbi [-c CODEBOOK] [-K LIST] [-n TILES] [-r REPS] [-t THREADS] [-f FLOOR] [-R]\n"
	"  -c  codebook (mul1, mcg, 3inst; default mul1)\n"
	"  -K  comma list of K (default 1,2,3,4,5,6,7,8)\n"
	"  -n  tiles per thread per run (default 24)\n"
	"  -r  runs per measurement, median taken (default 3)\n"
	"  -t  threads for the all-threads column (default: OpenMP maximum)\n"
	"  -f  floor in weights/s/core (default 40000)\n"
	"  -R  skip the scalar reference baseline\n";

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

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

/* median seconds of reps runs encoding n tiles with nt threads */
static double time_fast(int K, int cb, const float *x, int n, int nt, int reps, float *v)
{
	double t[16];
	for (int r = 0; r < reps; r++) {
		double t0 = now();
		if (x3_viterbi_encode(K, cb, x, n, NULL, v, nt) != X3_OK) {
			fprintf(stderr, "viterbi: encode: %s\n", x3_errmsg());
			exit(1);
		}
		t[r] = now() - t0;
	}
	qsort(t, reps, sizeof t[0], cmpd);
	return t[reps / 2];
}

int main(int argc, char **argv)
{
	int cb = X3_CB_MUL1, ntile = 24, reps = 3, nt = omp_get_max_threads(), doref = 1;
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
		if (!val || a[0] != '-' || strlen(a) != 2 || !strchr("cKnrtf", a[1])) {
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
	       "median of %d\n", x3_codebook_name(cb), x3_viterbi_isa_name(x3_viterbi_isa()),
	       nt, ntile, reps);
	printf("%2s %12s %12s %12s %10s %12s %8s\n", "K", "1thr w/s", "all w/s",
	       "all w/s/core", "MSE", "ref w/s", "speedup");
	double minc = INFINITY;
	char json[4096];
	int jl = snprintf(json, sizeof json, "{\"bench\":\"viterbi\",\"codebook\":\"%s\","
	                  "\"isa\":\"%s\",\"threads\":%d,\"floor\":%.0f,\"K\":{",
	                  x3_codebook_name(cb), x3_viterbi_isa_name(x3_viterbi_isa()), nt,
	                  floor_wps);
	for (int i = 0; i < nK; i++) {
		int K = Ks[i];
		x3_viterbi_encode(K, cb, xs, 1, NULL, v, 1);   /* warm up */
		double t1 = time_fast(K, cb, xs, ntile, 1, reps, v);
		double tn = time_fast(K, cb, xs, nmax, nt, reps, v);
		double mse = 0;
		for (int j = 0; j < 256 * nmax; j++) {
			double d = v[j] / rms - x[j];
			mse += d * d;
		}
		mse /= 256.0 * nmax;
		double w1 = 256.0 * ntile / t1, wn = 256.0 * nmax / tn, wc = wn / nt;
		double wr = NAN;
		if (doref) {
			double t0 = now();
			x3_viterbi_encode_ref(K, cb, xs, 1, NULL, v);
			wr = 256.0 / (now() - t0);
		}
		if (w1 < minc)
			minc = w1;
		if (wc < minc)
			minc = wc;
		printf("%2d %12.0f %12.0f %12.0f %10.5f %12.0f %7.1fx\n", K, w1, wn, wc, mse, wr,
		       w1 / wr);
		jl += snprintf(json + jl, sizeof json - jl, "%s\"%d\":{\"wps_1thr\":%.0f,"
		               "\"wps_all\":%.0f,\"wps_core\":%.0f,\"mse\":%.6f,\"ref_wps\":%.0f}",
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
