/* tests/bench/viterbi.c: throughput of the tail-biting Viterbi encoder.
 *
 * For each K and each fast path this CPU has (avx512, avx2, and the
 * portable C path on one tile): weights/s on one thread (per core) and,
 * for the best path, on all threads (per core and total), next to the
 * scalar reference x3_viterbi_encode_ref measured in the same run; the MSE
 * per weight on i.i.d. N(0,1) tiles (scale 1 relative to the codebook
 * RMS). Prints a table and one JSON line; exits 1 if any K is below the
 * floor (weights/s/core).
 *
 * Target: ../shared/notes/viterbi-cpu.md measured a tuned fp32 encoder
 * on this host at 3.75 GHz (its clock under 512-bit load): bit-exact
 * kernels 153-186k w/s/core, its fastest (not bit-exact, "tag") kernels
 * 165-224k, per K below. The clock varies with the host's load, so the
 * run measures it (a chain of dependent 64-bit multiplies, 3 cycles each)
 * and also prints the best path's rate scaled to 3.75 GHz and its cycles
 * per 16 add-compare-selects (one 16-lane vector of candidates; a tile is
 * 2 passes x 256 steps x 4096 vectors).
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
	"  -i  time only this fast path: avx512, avx2 or scalar (default: each this CPU has)\n"
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

/* core clock in GHz: n pairs of dependent 64-bit multiplies (3 cycles
 * each on the Intel cores the notes are about) */
static double clock_ghz(long n)
{
	uint64_t x = 3;
	double c0 = clk(CLOCK_THREAD_CPUTIME_ID);
	for (long i = 0; i < n; i++) {
		x *= x;
		x *= x;
		__asm__ volatile("" : "+r"(x));
	}
	return 6.0 * n / (clk(CLOCK_THREAD_CPUTIME_ID) - c0) / 1e9;
}

/* one thread, n tiles, reps runs, each followed by a short clock probe:
 * the best weights/s and the fewest cycles per 16-candidate vector (the
 * clock of a shared host moves between runs, so the two are paired per
 * run) and the clock of that run */
static void time_cycles(int K, int cb, const float *x, int n, int reps, float *v, double *wps,
                        double *cyc, double *ghz)
{
	*wps = 0;
	*cyc = INFINITY;
	for (int r = 0; r < reps; r++) {
		double c0 = clk(CLOCK_THREAD_CPUTIME_ID);
		if (x3_viterbi_encode(K, cb, x, n, NULL, v, 1) != X3_OK) {
			fprintf(stderr, "viterbi: encode: %s\n", x3_errmsg());
			exit(1);
		}
		double t = clk(CLOCK_THREAD_CPUTIME_ID) - c0, g = clock_ghz(2000000);
		double c = t * g * 1e9 / (n * 2.0 * 256 * 4096);   /* a tile: 2 x 256 x 4096 */
		if (256.0 * n / t > *wps)
			*wps = 256.0 * n / t;
		if (c < *cyc) {
			*cyc = c;
			*ghz = g;
		}
	}
}

/* ../shared/notes/viterbi-cpu.md, k weights/s/core at 3.75 GHz, one
 * thread: bit-exact kernels and fastest (tag) kernels; 0 = not measured */
static const double notes_exact[9] = { 0, 174, 158, 153, 186, 0, 176, 0, 178 };
static const double notes_fast[9] = { 0, 174, 165, 183, 198, 0, 211, 0, 224 };
#define NOTES_GHZ 3.75

int main(int argc, char **argv)
{
	int cb = X3_CB_MUL1, ntile = 16, reps = 5, nt = omp_get_max_threads(), doref = 1;
	int only = 0;
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
		case 'i':
			only = !strcmp(val, "avx512") ? X3_ISA_AVX512 : !strcmp(val, "avx2") ? X3_ISA_AVX2
			       : !strcmp(val, "scalar") ? X3_ISA_SCALAR : -1;
			if (x3_viterbi_set_isa(only) != X3_OK) {
				fprintf(stderr, "viterbi: -i %s: %s\n", val, x3_errmsg());
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
	/* the paths to time, best first; the first is timed on all threads too */
	int paths[3], np = 0;
	static const int order[3] = { X3_ISA_AVX512, X3_ISA_AVX2, X3_ISA_SCALAR };
	for (int j = 0; j < 3; j++)
		if ((!only || only == order[j]) && x3_viterbi_set_isa(order[j]) == X3_OK)
			paths[np++] = order[j];
	x3_viterbi_set_isa(X3_ISA_AUTO);

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
	printf("Viterbi encoder, codebook %s, %d threads, %d tiles/thread, best of %d\n",
	       x3_codebook_name(cb), nt, ntile, reps);
	printf("weights/s per core (CPU time): one thread per path (%s on one tile), the first "
	       "path on %d threads;\n", "scalar = the portable C path", nt);
	printf("ref = x3_viterbi_encode_ref; first path: cyc/v = cycles per 16 candidates at the "
	       "clock GHz measured\nwith each run (best run), @3.75 = the rate that gives at the "
	       "notes' 3.75 GHz;\n");
	printf("notes = ../shared/notes/viterbi-cpu.md at 3.75 GHz, bit-exact / fastest "
	       "(tag, not bit-exact) kernels\n");
	printf("%2s", "K");
	for (int j = 0; j < np; j++)
		printf(" %10s", x3_viterbi_isa_name(paths[j]));
	printf(" %10s %11s %8s %8s %5s %6s %9s %8s %13s\n", "all/core", "all wall", "ref",
	       "speedup", "GHz", "cyc/v", "@3.75", "MSE", "notes");
	double minc = INFINITY;
	char json[8192];
	int jl = snprintf(json, sizeof json, "{\"bench\":\"viterbi\",\"codebook\":\"%s\","
	                  "\"threads\":%d,\"notes_ghz\":%.2f,\"floor\":%.0f,"
	                  "\"K\":{", x3_codebook_name(cb), nt, NOTES_GHZ, floor_wps);
	for (int i = 0; i < nK; i++) {
		int K = Ks[i];
		double w1[3] = { 0 }, wc = 0, wn = 0, cyc = 0, ghz = 0;
		for (int j = 0; j < np; j++) {
			x3_viterbi_set_isa(paths[j]);
			x3_viterbi_encode(K, cb, xs, 1, NULL, v, 1);   /* warm up */
			double tw, tc;
			int n1 = paths[j] == X3_ISA_SCALAR ? 1 : ntile;
			time_cycles(K, cb, xs, n1, paths[j] == X3_ISA_SCALAR ? 1 : reps, v, &w1[j],
			            j == 0 ? &cyc : &tc, j == 0 ? &ghz : &tw);
			if (j == 0) {
				time_fast(K, cb, xs, nmax, nt, reps, v, &tw, &tc);
				wc = 256.0 * nmax / tc;
				wn = 256.0 * nmax / tw;
			}
		}
		x3_viterbi_set_isa(X3_ISA_AUTO);
		/* v holds the first path's encoding of all nmax tiles */
		x3_viterbi_set_isa(paths[0]);
		x3_viterbi_encode(K, cb, xs, nmax, NULL, v, nt);
		x3_viterbi_set_isa(X3_ISA_AUTO);
		double mse = 0;
		for (int j = 0; j < 256 * nmax; j++) {
			double d = v[j] / rms - x[j];
			mse += d * d;
		}
		mse /= 256.0 * nmax;
		double wr = NAN;
		if (doref) {
			double c0 = clk(CLOCK_THREAD_CPUTIME_ID);
			x3_viterbi_encode_ref(K, cb, xs, 1, NULL, v);
			wr = 256.0 / (clk(CLOCK_THREAD_CPUTIME_ID) - c0);
		}
		double at = NOTES_GHZ * 1e9 * 256.0 / (cyc * 2.0 * 256 * 4096);
		if (paths[0] != X3_ISA_SCALAR) {
			if (w1[0] < minc)
				minc = w1[0];
			if (wc < minc)
				minc = wc;
		}
		char nb[32] = "-";
		if (notes_exact[K] > 0)
			snprintf(nb, sizeof nb, "%.0fk / %.0fk", notes_exact[K], notes_fast[K]);
		printf("%2d", K);
		for (int j = 0; j < np; j++)
			printf(" %10.0f", w1[j]);
		printf(" %10.0f %11.0f", wc, wn);
		if (doref)
			printf(" %8.0f %7.0fx", wr, w1[0] / wr);
		else
			printf(" %8s %8s", "-", "-");
		printf(" %5.2f %6.2f %9.0f %8.5f %13s\n", ghz, cyc, at, mse, nb);
		jl += snprintf(json + jl, sizeof json - jl, "%s\"%d\":{", i ? "," : "", K);
		for (int j = 0; j < np; j++)
			jl += snprintf(json + jl, sizeof json - jl, "\"%s_wps_1thr\":%.0f,",
			               x3_viterbi_isa_name(paths[j]), w1[j]);
		jl += snprintf(json + jl, sizeof json - jl, "\"wps_core\":%.0f,\"wps_all_wall\":%.0f,"
		               "\"ref_wps\":%.0f,\"clock_ghz\":%.3f,\"cycles_per_vector\":%.3f,"
		               "\"wps_at_notes_ghz\":%.0f,\"mse\":%.6f,\"notes_exact_wps\":%.0f,"
		               "\"notes_fastest_wps\":%.0f}", wc, wn, doref ? wr : 0.0, ghz, cyc, at,
		               mse, notes_exact[K] * 1e3, notes_fast[K] * 1e3);
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
