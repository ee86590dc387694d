/* t1205-determinism: what the toolkit's numbers may and may not depend on
 * (exl3kit(7), REPRODUCIBILITY; lib/common/blas.h).
 *
 * The test runs itself as a child under several OpenBLAS kernels
 * (OPENBLAS_CORETYPE: those this CPU can run, tests/lib-blas.sh's list,
 * so run it from the top of the checkout) and 1 or 2 BLAS and OpenMP
 * threads. Each child computes, from fixed seeded inputs: the proxy error
 * (our fixed-order loops), the dense linear (x3_gemm_xwt), the Hessian sums
 * (x3_gram_acc_*, the packed F32 ones at a width of several product chunks), the block LDL (at one
 * panel and at three, the blocked factor's threaded calls) and an LDLQ encode, and prints them. The
 * parent checks:
 *   - the proxy error is bit-identical under every kernel and thread count;
 *   - every BLAS-backed result is bit-identical for every thread count under
 *     one kernel (and may differ between kernels, which is why the proxy
 *     error does not go through BLAS);
 *   - within a child: a row of the dense linear is the same whatever batch
 *     it is multiplied in, and Hessian halves merged in F64 equal the whole
 *     to F64 rounding. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include <xxhash.h>
#include "blas.h"
#include "codec.h"
#include "quant.h"
#include "test.h"

static void fill(float *a, int64_t n, uint64_t seed, double scale)
{
	x3_rng r;
	x3_rng_seed(&r, seed, 0);
	for (int64_t i = 0; i < n; i++)
		a[i] = (float)(x3_rng_normal(&r) * scale);
}

/* H = XᵀX / m + 0.01 I, X (m, k): a positive definite stand-in Hessian */
static float *spd(int64_t k, int64_t m, uint64_t seed)
{
	float *x = malloc((size_t)(m * k) * sizeof *x), *H = calloc((size_t)(k * k), sizeof *H);
	fill(x, m * k, seed, 1.0);
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < k; j++) {
			double s = 0;
			for (int64_t r = 0; r < m; r++)
				s += (double)x[r * k + i] * x[r * k + j];
			H[i * k + j] = (float)(s / m + (i == j ? 0.01 : 0));
		}
	free(x);
	return H;
}

static unsigned long long h64(const void *p, size_t n) { return XXH64(p, n, 0); }

static int child(void)
{
	printf("core %s\n", openblas_get_corename());
	/* proxy error of fixed W, Q, H */
	enum { K = 256, N = 384 };
	float *W = malloc(K * N * sizeof *W), *Q = malloc(K * N * sizeof *Q);
	fill(W, K * N, 1, 1.0);
	fill(Q, K * N, 2, 0.05);
	for (int64_t i = 0; i < K * N; i++)
		Q[i] += W[i];
	float *H = spd(K, 300, 3);
	double e = 0;
	if (x3_proxy_error(W, Q, H, K, N, &e))
		return 1;
	printf("proxy %a\n", e);

	/* the dense linear: a batch of 3 sequences of 65 rows (a partial,
	 * padded block each), then each sequence alone and the last two
	 * together, must agree bit for bit within this process */
	enum { S = 65, R = 3 * S, IN = 200, OUT = 300 };
	float *x = malloc(R * IN * sizeof *x), *w = malloc(OUT * IN * sizeof *w);
	float *y = malloc(R * OUT * sizeof *y), *y1 = malloc(R * OUT * sizeof *y1);
	fill(x, R * IN, 4, 1.0);
	fill(w, OUT * IN, 5, 0.1);
	if (x3_gemm_xwt(x, R, S, IN, w, OUT, y))
		return 1;
	int same = 1;
	for (int64_t r = 0; r < R; r += S)
		if (x3_gemm_xwt(x + r * IN, S, S, IN, w, OUT, y1 + r * OUT))
			return 1;
	same &= !memcmp(y, y1, R * OUT * sizeof *y);
	memset(y1, 0, R * OUT * sizeof *y1);
	if (x3_gemm_xwt(x, S, 0, IN, w, OUT, y1) || x3_gemm_xwt(x + S * IN, R - S, S, IN, w, OUT, y1 + S * OUT))
		return 1;
	same &= !memcmp(y, y1, R * OUT * sizeof *y);
	/* the same in segments of 512 rows (blocks of X3_GEMM_ROWS_BIG): two
	 * sequences together, each alone */
	enum { S2 = 512, R2 = 2 * S2 };
	float *x2 = malloc(R2 * IN * sizeof *x2), *z = malloc(R2 * OUT * sizeof *z);
	float *z1 = malloc(R2 * OUT * sizeof *z1);
	fill(x2, R2 * IN, 7, 1.0);
	if (x3_gemm_xwt(x2, R2, S2, IN, w, OUT, z) || x3_gemm_xwt(x2, S2, S2, IN, w, OUT, z1) ||
	    x3_gemm_xwt(x2 + S2 * IN, S2, 0, IN, w, OUT, z1 + S2 * OUT))
		return 1;
	same &= !memcmp(z, z1, R2 * OUT * sizeof *z);
	printf("rows_independent %d\n", same);
	printf("xwt %016llx %016llx\n", h64(y, R * OUT * sizeof *y), h64(z, R2 * OUT * sizeof *z));

	/* Hessian sums over 3 column blocks (n = 600): F32 and F64, whole and
	 * halves merged */
	enum { M = 100, NH = 600 };
	float *xa = malloc(M * NH * sizeof *xa), *g = calloc(NH * NH, sizeof *g);
	double *xd = malloc(M * NH * sizeof *xd), *gd = calloc(NH * NH, sizeof *gd);
	double *ga = calloc(NH * NH, sizeof *ga), *gb = calloc(NH * NH, sizeof *gb);
	fill(xa, M * NH, 6, 1.0);
	for (int64_t i = 0; i < M * NH; i++)
		xd[i] = xa[i];
	x3_gram_acc_f32(xa, M, NH, g);
	x3_gram_acc_f64(xd, M, NH, gd);
	x3_gram_acc_f64(xd, 41, NH, ga);
	x3_gram_acc_f64(xd + 41 * NH, M - 41, NH, gb);
	double err = 0, ref = 0, uerr = 0;
	unsigned long long hg = 0, hgd = 0;
	for (int64_t i = 0; i < NH; i++)
		for (int64_t j = i; j < NH; j++) {
			double exact = 0;
			for (int64_t r = 0; r < M; r++)
				exact += (double)xa[r * NH + i] * xa[r * NH + j];
			err = fmax(err, fabs(ga[i * NH + j] + gb[i * NH + j] - gd[i * NH + j]));
			uerr = fmax(uerr, fabs(gd[i * NH + j] - exact));
			ref = fmax(ref, fabs(exact));
			hg = XXH64(&g[i * NH + j], sizeof *g, hg);
			hgd = XXH64(&gd[i * NH + j], sizeof *gd, hgd);
		}
	printf("gram_merge_relerr %.3g\n", err / ref);
	printf("gram_vs_exact_relerr %.3g\n", uerr / ref);
	printf("gram32 %016llx\ngram64 %016llx\n", hg, hgd);
	/* the packed F32 sums (the Hessians' default) at a width of several
	 * product chunks (X3_GRAM_CHUNK) per row block */
	{
		const int64_t NT = 2 * X3_GRAM_CHUNK + 300, MT = 24;
		float *xt = malloc((size_t)(MT * NT) * sizeof *xt);
		double *tt = calloc((size_t)x3_tri_size(NT), sizeof *tt);
		fill(xt, MT * NT, 7, 1.0);
		if (x3_gram_acc_tri_f32_f64(xt, MT, NT, tt))
			return 1;
		printf("gramtri %016llx\n", h64(tt, (size_t)x3_tri_size(NT) * sizeof *tt));
		free(xt), free(tt);
	}

	/* block LDL and an LDLQ encode with feedback (K=2, 256 x 384) */
	float *L = malloc(K * K * sizeof *L);
	memcpy(L, H, K * K * sizeof *L);
	if (x3_block_ldl(L, K))
		return 1;
	printf("ldl %016llx\n", h64(L, K * K * sizeof *L));
	/* the blocked factor at a size of several panels and a partial one
	 * (X3_LDL_NB 256: 256 + 256 + 144), where its calls run on the threads */
	{
		const int64_t KB = 656;
		float *HB = spd(KB, KB + 64, 8);
		if (x3_block_ldl(HB, KB))
			return 1;
		printf("ldlb %016llx\n", h64(HB, (size_t)(KB * KB) * sizeof *HB));
		free(HB);
	}
	uint16_t *st = malloc(K * N * sizeof *st);
	if (x3_ldlq(W, K, N, L, 2, X3_CB_MUL1, 0, st, Q))
		return 1;
	printf("ldlq %016llx %016llx\n", h64(st, K * N * sizeof *st), h64(Q, K * N * sizeof *Q));
	if (x3_proxy_error(W, Q, H, K, N, &e))
		return 1;
	printf("ldlq_proxy %a\n", e);
	fflush(stdout);
	return 0;
}

struct run {
	char core[64], proxy[64], xwt[80], gram32[32], gram64[32], gramtri[32], ldl[32], ldlb[32], ldlq[80], ldlq_proxy[64];
	int rows_ok;
	double merge, exact;
};

static int run_child(const char *coretype, int threads, struct run *r)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	         "OPENBLAS_CORETYPE=%s OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d /proc/%d/exe --child",
	         coretype, threads, threads, (int)getpid());
	FILE *p = popen(cmd, "r");
	if (!p)
		return -1;
	memset(r, 0, sizeof *r);
	char line[256];
	while (fgets(line, sizeof line, p)) {
		line[strcspn(line, "\n")] = 0;
		if (!strncmp(line, "core ", 5)) snprintf(r->core, sizeof r->core, "%s", line + 5);
		else if (!strncmp(line, "proxy ", 6)) snprintf(r->proxy, sizeof r->proxy, "%s", line + 6);
		else if (!strncmp(line, "rows_independent ", 17)) r->rows_ok = atoi(line + 17);
		else if (!strncmp(line, "xwt ", 4)) snprintf(r->xwt, sizeof r->xwt, "%s", line + 4);
		else if (!strncmp(line, "gram_merge_relerr ", 18)) r->merge = atof(line + 18);
		else if (!strncmp(line, "gram_vs_exact_relerr ", 21)) r->exact = atof(line + 21);
		else if (!strncmp(line, "gram32 ", 7)) snprintf(r->gram32, sizeof r->gram32, "%s", line + 7);
		else if (!strncmp(line, "gram64 ", 7)) snprintf(r->gram64, sizeof r->gram64, "%s", line + 7);
		else if (!strncmp(line, "gramtri ", 8)) snprintf(r->gramtri, sizeof r->gramtri, "%s", line + 8);
		else if (!strncmp(line, "ldl ", 4)) snprintf(r->ldl, sizeof r->ldl, "%s", line + 4);
		else if (!strncmp(line, "ldlb ", 5)) snprintf(r->ldlb, sizeof r->ldlb, "%s", line + 5);
		else if (!strncmp(line, "ldlq ", 5)) snprintf(r->ldlq, sizeof r->ldlq, "%s", line + 5);
		else if (!strncmp(line, "ldlq_proxy ", 11)) snprintf(r->ldlq_proxy, sizeof r->ldlq_proxy, "%s", line + 11);
	}
	return pclose(p);
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--child"))
		return child();
	/* the kernels this CPU can run (OpenBLAS would fault on the others):
	 * the list of tests/lib-blas.sh, which the command-line tests use too */
	char cores[8][32];
	int nc = 0;
	FILE *kl = popen("bash tests/lib-blas.sh", "r");
	while (kl && nc < 8 && fgets(cores[nc], sizeof cores[nc], kl)) {
		cores[nc][strcspn(cores[nc], "\n")] = 0;
		nc += cores[nc][0] != 0;
	}
	int krc = kl ? pclose(kl) : -1;
	CHECK(krc == 0 && nc > 0, "the OpenBLAS kernels this CPU runs, from tests/lib-blas.sh: %d", nc);
	if (krc || !nc)
		TEST_DONE();
	struct run runs[16];
	int nr = 0, ok = 1;
	for (int c = 0; c < nc; c++)
		for (int t = 1; t <= 2; t++) {
			struct run *r = &runs[nr];
			int rc = run_child(cores[c], t, r);
			CHECK(rc == 0 && r->proxy[0] && r->ldlq_proxy[0],
			      "child under OPENBLAS_CORETYPE=%s, %d thread(s): ran (core %s)", cores[c], t,
			      r->core[0] ? r->core : "?");
			ok &= rc == 0;
			nr++;
		}
	if (!ok)
		TEST_DONE();
	int distinct = 0;
	for (int i = 0; i < nr; i++) {
		int seen = 0;
		for (int j = 0; j < i; j++)
			seen |= !strcmp(runs[i].core, runs[j].core);
		distinct += !seen;
		CHECK(runs[i].rows_ok, "%s/%dt: a row of the dense linear is the same in any batch of sequences",
		      runs[i].core, i % 2 + 1);
		CHECK(runs[i].merge < 1e-14, "%s/%dt: Hessian halves merged in F64 == whole (rel err %.2g)",
		      runs[i].core, i % 2 + 1, runs[i].merge);
		CHECK(runs[i].exact < 1e-14, "%s/%dt: F64 Hessian == the exact sum (rel err %.2g)",
		      runs[i].core, i % 2 + 1, runs[i].exact);
		CHECK(!strcmp(runs[i].proxy, runs[0].proxy),
		      "%s/%dt: proxy error bit-identical to %s/1t (%s vs %s)", runs[i].core, i % 2 + 1,
		      runs[0].core, runs[i].proxy, runs[0].proxy);
	}
	/* under one kernel: every BLAS-backed result the same on 1 and 2 threads */
	for (int i = 0; i + 1 < nr; i += 2) {
		struct run *a = &runs[i], *b = &runs[i + 1];
		CHECK(!strcmp(a->xwt, b->xwt), "%s: dense linear, 1 vs 2 threads identical", a->core);
		CHECK(!strcmp(a->gram32, b->gram32) && !strcmp(a->gram64, b->gram64),
		      "%s: Hessian sums (F32, F64), 1 vs 2 threads identical", a->core);
		CHECK(a->gramtri[0] && !strcmp(a->gramtri, b->gramtri),
		      "%s: packed F32 Hessian sums over product chunks, 1 vs 2 threads identical", a->core);
		CHECK(!strcmp(a->ldl, b->ldl), "%s: block LDL, 1 vs 2 threads identical", a->core);
		CHECK(a->ldlb[0] && !strcmp(a->ldlb, b->ldlb),
		      "%s: block LDL of 656 (three panels), 1 vs 2 threads identical", a->core);
		CHECK(!strcmp(a->ldlq, b->ldlq) && !strcmp(a->ldlq_proxy, b->ldlq_proxy),
		      "%s: LDLQ states, Q and proxy error, 1 vs 2 threads identical", a->core);
	}
	if (distinct < 2)
		SKIP("only one OpenBLAS kernel ran (%s): the proxy error was not compared across kernels",
		     runs[0].core);
	else
		printf("# %d distinct OpenBLAS kernels compared\n", distinct);
	TEST_DONE();
}
