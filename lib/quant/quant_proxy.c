/* quant_proxy.c: the proxy error tr(Eᵀ H E) / tr(Wᵀ H W) (exl3(5) §9.5),
 * blocked and threaded with a fixed reduction order, with AVX2 and
 * AVX-512 panel kernels picked at run time and a portable reference. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "blas.h"
#include "quant.h"
#include "quant_impl.h"

/* ---- proxy error ---------------------------------------------------------- */

/* The proxy error's quadratic form tr(Aᵀ H A) in our own loops, so that
 * it is a fixed function of its operands. H is symmetric, so only the
 * blocks of PX_LB rows at and right of the diagonal are multiplied (half
 * the work): for row i in row block I, T[i, j] = sum_l H[i, l] A[l, j] over
 * l from I's first row to k-1 in that order into one float, each step one
 * fused multiply-add (fmaf: one rounding); D[i, j], the same sum over I's
 * own columns, is the value T[i, j] has right after them (the first
 * panel that reaches row i is its diagonal one). Then, in double, over j
 * in order within a column block of PX_JB, the blocks in order:
 * tr = 2 sum A[i, j] T[i, j] - sum A[i, j] D[i, j] (the pairs (i, l) in
 * different blocks are counted twice, those within one once). Blocking over
 * l keeps each element's order: the accumulator goes to memory and comes
 * back unchanged. The vectors run
 * across j, one lane per element, so the AVX-512 and AVX2 forms and the
 * scalar reference (proxy_panel_ref; fmaf, which is slow only where the
 * processor has no FMA) give the same bits on every machine and thread
 * count (t1200 compares them). */
#define PX_JB 256   /* columns of A per block (a thread's unit of work) */
#define PX_LB 256   /* rows of A per panel kept in L2 */

/* T (k, w) += H[:, l0:l0+lw] A[l0:l0+lw, c0:c0+w] for the rows i0..i1-1 of
 * T and the columns j0..w-1 (H has k columns) */
static void proxy_panel_ref(const float *H, const float *A, int64_t k, int64_t n, int64_t l0,
                            int64_t lw, int64_t c0, int64_t w, float *T, int64_t i0, int64_t i1,
                            int64_t j0)
{
	for (int64_t i = i0; i < i1; i++)
		for (int64_t j = j0; j < w; j++) {
			float acc = T[i * w + j];
			for (int64_t l = 0; l < lw; l++)
				acc = fmaf(H[i * k + l0 + l], A[(l0 + l) * n + c0 + j], acc);
			T[i * w + j] = acc;
		}
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* One kernel, written once for both vector widths (V lanes of type VT):
 * 6 rows x 2V columns of T a step (12 accumulators: FMA's latency wants
 * more than 8 in flight), then single rows 2V columns at a time, the
 * columns left (w mod 2V) by the reference. The panel of A comes packed
 * (px_pack): P[g][l][2V] for the column groups g of 2V, so the 2V values
 * of row l + 1 follow those of row l. Read in place, a group's rows are n
 * floats apart, which for n a multiple of 1024 maps them all to the same
 * few L1 sets: on the 2-core Zen 3 host the packed panel computes
 * tr(Aᵀ H A) of a 4096x4096 A in 0.52 s against 1.03 s read in place, and
 * of a 14336x1024 A (down_proj's k) in 1.36 s against 2.07 s (2 threads;
 * the same bits). The 6 rows, measured with A read in place on
 * bench/proxy-error's 2048x2048 (2-core EPYC): AVX-512 0.22 s against
 * 0.33 s with 4 rows and 0.43 s with 8 rows held as an array; AVX2 0.32 s
 * (4 rows are slower than the unfused loops' 0.46 s). */
#define PX_KERNEL(NAME, TARGET, VT, V, LD, ST, SET1, FMA)                                    \
__attribute__((target(TARGET)))                                                              \
static void NAME(const float *H, const float *A, const float *P, int64_t k, int64_t n,       \
                 int64_t l0, int64_t lw, int64_t c0, int64_t w, float *T, int64_t m)         \
{                                                                                            \
	const int64_t wf = w / (2 * (V)) * (2 * (V));                                           \
	int64_t i = 0;                                                                           \
	for (; i + 6 <= m; i += 6) {                                                             \
		const float *h = H + i * k + l0;                                                     \
		for (int64_t j = 0; j < wf; j += 2 * (V)) {                                          \
			float *t = T + i * w + j;                                                        \
			VT a00 = LD(t), a01 = LD(t + (V)), a10 = LD(t + w), a11 = LD(t + w + (V));       \
			VT a20 = LD(t + 2 * w), a21 = LD(t + 2 * w + (V));                               \
			VT a30 = LD(t + 3 * w), a31 = LD(t + 3 * w + (V));                               \
			VT a40 = LD(t + 4 * w), a41 = LD(t + 4 * w + (V));                               \
			VT a50 = LD(t + 5 * w), a51 = LD(t + 5 * w + (V));                               \
			const float *e = P + j * lw;                                                     \
			for (int64_t l = 0; l < lw; l++, e += 2 * (V)) {                                 \
				VT e0 = LD(e), e1 = LD(e + (V)), b;                                          \
				b = SET1(h[l]), a00 = FMA(b, e0, a00), a01 = FMA(b, e1, a01);                \
				b = SET1(h[k + l]), a10 = FMA(b, e0, a10), a11 = FMA(b, e1, a11);            \
				b = SET1(h[2 * k + l]), a20 = FMA(b, e0, a20), a21 = FMA(b, e1, a21);        \
				b = SET1(h[3 * k + l]), a30 = FMA(b, e0, a30), a31 = FMA(b, e1, a31);        \
				b = SET1(h[4 * k + l]), a40 = FMA(b, e0, a40), a41 = FMA(b, e1, a41);        \
				b = SET1(h[5 * k + l]), a50 = FMA(b, e0, a50), a51 = FMA(b, e1, a51);        \
			}                                                                                \
			ST(t, a00), ST(t + (V), a01), ST(t + w, a10), ST(t + w + (V), a11);              \
			ST(t + 2 * w, a20), ST(t + 2 * w + (V), a21);                                    \
			ST(t + 3 * w, a30), ST(t + 3 * w + (V), a31);                                    \
			ST(t + 4 * w, a40), ST(t + 4 * w + (V), a41);                                    \
			ST(t + 5 * w, a50), ST(t + 5 * w + (V), a51);                                    \
		}                                                                                    \
		if (wf < w)                                                                          \
			proxy_panel_ref(H, A, k, n, l0, lw, c0, w, T, i, i + 6, wf);                     \
	}                                                                                        \
	for (; i < m; i++) {                                                                     \
		const float *h = H + i * k + l0;                                                     \
		for (int64_t j = 0; j < wf; j += 2 * (V)) {                                          \
			float *t = T + i * w + j;                                                        \
			VT a0 = LD(t), a1 = LD(t + (V));                                                 \
			const float *e = P + j * lw;                                                     \
			for (int64_t l = 0; l < lw; l++, e += 2 * (V)) {                                 \
				VT b = SET1(h[l]);                                                           \
				a0 = FMA(b, LD(e), a0), a1 = FMA(b, LD(e + (V)), a1);                        \
			}                                                                                \
			ST(t, a0), ST(t + (V), a1);                                                      \
		}                                                                                    \
		if (wf < w)                                                                          \
			proxy_panel_ref(H, A, k, n, l0, lw, c0, w, T, i, i + 1, wf);                     \
	}                                                                                        \
}
PX_KERNEL(proxy_panel_avx2, "avx2,fma", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
          _mm256_set1_ps, _mm256_fmadd_ps)
PX_KERNEL(proxy_panel_avx512, "avx512f", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
          _mm512_set1_ps, _mm512_fmadd_ps)
#undef PX_KERNEL
#endif

/* the proxy error's panel form: the widest the processor has, narrowed by
 * X3_PROXY_PATH (ref or avx2; avx512 changes nothing); x3_proxy_path says
 * which */
static int px_path = -1;   /* 0 ref, 1 avx2, 2 avx512 */

static int px_pick(void)
{
	if (px_path >= 0)
		return px_path;
	int p = 0;
#if defined(__x86_64__) && defined(__GNUC__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f"))
		p = 2;
	else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		p = 1;
#endif
	const char *f = getenv("X3_PROXY_PATH");
	if (f && !strcmp(f, "ref"))
		p = 0;
	else if (f && !strcmp(f, "avx2") && p >= 1)
		p = 1;
	px_path = p;
	return p;
}

static const char *px_names[] = { "ref", "avx2", "avx512" };

const char *x3_proxy_path(void)
{
	return px_names[px_pick()];
}

int x3_proxy_set_path(const char *name)
{
	px_path = -1;
	int best = px_pick();
	for (int p = 0; p < 3; p++)
		if (!strcmp(name, px_names[p])) {
			if (p > best)
				return x3_err(X3_EUNSUP, "proxy error: this processor has no %s", name);
			px_path = p;
			return X3_OK;
		}
	return x3_err(X3_EINVAL, "proxy error: no form '%s' (ref, avx2, avx512)", name);
}

/* the column groups of the vector form in use: 2V floats (0: the reference,
 * which reads A in place) */
static int px_group(void)
{
	static const int g[] = { 0, 16, 32 };
	return g[px_pick()];
}

/* P[g][l][G] = A[l0 + l, c0 + g G + 0 .. G-1] for the whole groups of G
 * columns of the block's w (the vector kernels' packed panel) */
static void px_pack(const float *A, int64_t n, int64_t l0, int64_t lw, int64_t c0, int64_t w,
                    int G, float *P)
{
	for (int64_t j = 0; j + G <= w; j += G)
		for (int64_t l = 0; l < lw; l++)
			memcpy(P + j * lw + l * G, A + (l0 + l) * n + c0 + j, (size_t)G * sizeof *P);
}

/* rows 0..m-1 of T += H[:, l0:l0+lw] A[l0:l0+lw, c0:c0+w]; P: that panel
 * of A packed by px_pack for px_group() (unused by the reference) */
static void proxy_panel(const float *H, const float *A, const float *P, int64_t k, int64_t n,
                        int64_t l0, int64_t lw, int64_t c0, int64_t w, float *T, int64_t m)
{
	switch (px_pick()) {
#if defined(__x86_64__) && defined(__GNUC__)
	case 2:
		proxy_panel_avx512(H, A, P, k, n, l0, lw, c0, w, T, m);
		return;
	case 1:
		proxy_panel_avx2(H, A, P, k, n, l0, lw, c0, w, T, m);
		return;
#endif
	default:
		(void)P;
		proxy_panel_ref(H, A, k, n, l0, lw, c0, w, T, 0, m, 0);
	}
}

/* sum A[i, c0 + j] T[i, j] over rows i0..i1-1 (j in order, then i), in double */
static double proxy_dot(const float *A, int64_t n, int64_t c0, int64_t w, const float *T,
                        int64_t i0, int64_t i1)
{
	double s = 0;
	for (int64_t i = i0; i < i1; i++) {
		const float *a = A + i * n + c0, *t = T + i * w;
		double si = 0;
		for (int64_t j = 0; j < w; j++)
			si += (double)a[j] * t[j];
		s += si;
	}
	return s;
}

/* tr(Aᵀ H A) for A (k, n), H symmetric: per column block, T and the
 * diagonal blocks' sums panel by panel (above), then the block's sum in
 * double; the blocks' sums added in block order. */
static int proxy_quad(const float *A, const float *H, int64_t k, int64_t n, double *out)
{
	int64_t nb = (n + PX_JB - 1) / PX_JB;
	double *part = xcalloc((size_t)nb, sizeof *part);
	if (!part)
		return x3_err(X3_ENOMEM, "out of memory for the proxy error");
	int fail = 0;
	const int G = px_group();   /* px_pick once, before the threads */
	#pragma omp parallel if(k * k * n > (1 << 22))
	{
		float *T = malloc((size_t)(k * PX_JB) * sizeof *T);
		float *P = G ? malloc((size_t)(PX_LB * PX_JB) * sizeof *P) : NULL;
		if (!T || (G && !P)) {
			#pragma omp atomic write
			fail = 1;
		}
		#pragma omp for schedule(dynamic, 1)
		for (int64_t b = 0; b < nb; b++) {
			if (!T || (G && !P))
				continue;
			int64_t c0 = b * PX_JB, w = n - c0 < PX_JB ? n - c0 : PX_JB;
			memset(T, 0, (size_t)(k * w) * sizeof *T);
			double diag = 0;
			for (int64_t l0 = 0; l0 < k; l0 += PX_LB) {
				int64_t lw = k - l0 < PX_LB ? k - l0 : PX_LB;
				if (G)
					px_pack(A, n, l0, lw, c0, w, G, P);
				proxy_panel(H, A, P, k, n, l0, lw, c0, w, T, l0 + lw);
				diag += proxy_dot(A, n, c0, w, T, l0, l0 + lw);
			}
			part[b] = 2 * proxy_dot(A, n, c0, w, T, 0, k) - diag;
		}
		free(T);
		free(P);
	}
	double t = 0;
	for (int64_t b = 0; b < nb; b++)
		t += part[b];
	free(part);
	if (fail)
		return x3_err(X3_ENOMEM, "out of memory for the proxy error");
	*out = t;
	return X3_OK;
}

int x3_proxy_error(const float *W, const float *Q, const float *H, int64_t k,
                   int64_t n, double *err)
{
	*err = -1;
	if (!H) {
		double s = 0;
		for (int64_t i = 0; i < k * n; i++) {
			double d = (double)W[i] - Q[i];
			s += d * d;
		}
		*err = s / (double)(k * n);
		return X3_OK;
	}
	float *E = xmalloc((size_t)(k * n), sizeof(float));
	if (!E)
		return x3_err(X3_ENOMEM, "out of memory for the proxy error");
	for (int64_t i = 0; i < k * n; i++)
		E[i] = W[i] - Q[i];
	double num = 0, den = 0;
	int rc = proxy_quad(E, H, k, n, &num);
	free(E);
	if (!rc)
		rc = proxy_quad(W, H, k, n, &den);
	if (rc)
		return rc;
	*err = num / (den > 1e-8 ? den : 1e-8);
	return X3_OK;
}
