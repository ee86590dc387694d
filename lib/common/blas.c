/* blas.c: fixed-shape blocking around OpenBLAS (see blas.h for the rule). */
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <omp.h>
#include "blas.h"
#include "x3.h"

int x3_blas_serial_begin(void)
{
	int prev = openblas_get_num_threads();
	openblas_set_num_threads(1);
	return prev;
}

void x3_blas_serial_end(int prev) { openblas_set_num_threads(prev); }

/* Enough blocks to keep every OpenMP thread busy? Otherwise one block on
 * one thread is still right, just slower than it could be. */
static int par_if(int64_t blocks, int64_t work) { return blocks > 1 && work > (1 << 18); }

int x3_gemm_xwt(const float *x, int64_t rows, int64_t seg, int64_t in, const float *w,
                int64_t out, float *y)
{
	if (rows <= 0 || out <= 0)
		return X3_OK;
	if (seg <= 0 || seg > rows || rows % seg)
		seg = rows;
	if (in <= 0) {
		memset(y, 0, (size_t)(rows * out) * sizeof *y);
		return X3_OK;
	}
	/* blocks of R rows counted from each segment's start; a segment's last,
	 * partial block goes through a whole, zero-padded block, so that every
	 * row meets the kernel at the same place whatever else is in the call.
	 * R depends on the segment's length alone (blas.h) */
	const int64_t R = seg % X3_GEMM_ROWS_BIG == 0 ? X3_GEMM_ROWS_BIG : X3_GEMM_ROWS;
	const int64_t per = (seg + R - 1) / R, nb = rows / seg * per;
	int fail = 0;
	int prev = x3_blas_serial_begin();
	#pragma omp parallel for schedule(dynamic, 1) if(par_if(nb, rows * in * out))
	for (int64_t b = 0; b < nb; b++) {
		int64_t r0 = b / per * seg + b % per * R, n = b % per == per - 1 ? seg - b % per * R : R;
		const float *xb = x + r0 * in;
		float *yb = y + r0 * out, *px = NULL, *py = NULL;
		if (n < R) {
			px = calloc((size_t)(R * in), sizeof *px);
			py = malloc((size_t)(R * out) * sizeof *py);
			if (!px || !py) {
				free(px), free(py);
				#pragma omp atomic write
				fail = 1;
				continue;
			}
			memcpy(px, xb, (size_t)(n * in) * sizeof *px);
			xb = px, yb = py;
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)R, (int)out, (int)in, 1.0f,
		            xb, (int)in, w, (int)in, 0.0f, yb, (int)out);
		if (py)
			memcpy(y + r0 * out, py, (size_t)(n * out) * sizeof *y);
		free(px), free(py);
	}
	x3_blas_serial_end(prev);
	if (fail)
		return x3_err(X3_ENOMEM, "out of memory for a %lldx%lld product", (long long)rows,
		              (long long)out);
	return X3_OK;
}

void x3_gemm_atb(int64_t m, int64_t n, int64_t kk, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
	if (m <= 0 || n <= 0)
		return;
	const int64_t W = X3_GEMM_COLS, nb = (n + W - 1) / W;
	int prev = x3_blas_serial_begin();
	#pragma omp parallel for schedule(dynamic, 1) if(par_if(nb, m * n * kk))
	for (int64_t b = 0; b < nb; b++) {
		int64_t c0 = b * W, w = n - c0 < W ? n - c0 : W;
		if (kk <= 0) {
			for (int64_t i = 0; i < m; i++)
				for (int64_t j = 0; j < w; j++)
					C[i * ldc + c0 + j] = beta == 0 ? 0 : beta * C[i * ldc + c0 + j];
			continue;
		}
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)w, (int)kk, 1.0f, A,
		            (int)lda, B + c0, (int)ldb, beta, C + c0, (int)ldc);
	}
	x3_blas_serial_end(prev);
}

/* The upper triangle of H (n, n) += xᵀx, x (rows, n): one product per pair
 * of column blocks (bi <= bj) of X3_GEMM_COLS, the diagonal blocks in full
 * (their lower half is not read). Same blocks whatever the thread count. */
#define GRAM_BODY(GEMM, T)                                                              \
	if (rows <= 0 || n <= 0)                                                            \
		return;                                                                         \
	const int64_t W = X3_GEMM_COLS, nb = (n + W - 1) / W, np = nb * (nb + 1) / 2;       \
	int prev = x3_blas_serial_begin();                                                  \
	_Pragma("omp parallel for schedule(dynamic, 1) if(par_if(np, rows * n * n))")       \
	for (int64_t p = 0; p < np; p++) {                                                  \
		int64_t bi = 0, r = p;                                                          \
		while (r >= nb - bi)                                                            \
			r -= nb - bi, bi++;                                                         \
		int64_t bj = bi + r, i0 = bi * W, j0 = bj * W;                                  \
		int64_t wi = n - i0 < W ? n - i0 : W, wj = n - j0 < W ? n - j0 : W;             \
		GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)wi, (int)wj, (int)rows,      \
		     (T)1, x + i0, (int)n, x + j0, (int)n, (T)1, H + i0 * n + j0, (int)n);      \
	}                                                                                   \
	x3_blas_serial_end(prev);

void x3_gram_acc_f32(const float *x, int64_t rows, int64_t n, float *H)
{
	GRAM_BODY(cblas_sgemm, float)
}

void x3_gram_acc_f64(const double *x, int64_t rows, int64_t n, double *H)
{
	GRAM_BODY(cblas_dgemm, double)
}

/* The packed blocks (blas.h): every block is B x B but those of the last
 * row and column of blocks, which are as high or wide as what is left (e
 * = n - (nb - 1) B), so a row of blocks bi holds h(bi) rows of n - bi*B
 * elements. The offset of block (bi, bj), stored h(bi) x w(bj) row-major: */
static int64_t tri_off(int64_t n, int64_t B, int64_t bi, int64_t bj)
{
	return B * (bi * n - B * bi * (bi - 1) / 2) + (n - bi * B < B ? n - bi * B : B) * (bj - bi) * B;
}

int64_t x3_tri_size(int64_t n)
{
	if (n <= 0)
		return 0;
	const int64_t B = n < X3_GEMM_COLS ? n : X3_GEMM_COLS, nb = (n + B - 1) / B, e = n - (nb - 1) * B;
	return tri_off(n, B, nb - 1, nb - 1) + e * e;
}

int64_t x3_tri_at(int64_t n, int64_t i, int64_t j)
{
	const int64_t B = n < X3_GEMM_COLS ? n : X3_GEMM_COLS;
	if (i > j) {
		int64_t t = i;
		i = j, j = t;
	}
	int64_t bi = i / B, bj = j / B, wj = n - bj * B < B ? n - bj * B : B;
	return tri_off(n, B, bi, bj) + (i % B) * wj + j % B;
}

/* The blocks of the upper triangle in the order they are packed: pair p
 * (bi <= bj) at rows i0..i0+wi, columns j0..j0+wj, stored from T + off
 * with leading dimension wj. */
#define TRI_BLOCK(p)                                                                    \
	int64_t bi = 0, r = p;                                                              \
	while (r >= nb - bi)                                                                \
		r -= nb - bi, bi++;                                                             \
	int64_t bj = bi + r, i0 = bi * B, j0 = bj * B;                                      \
	int64_t wi = n - i0 < B ? n - i0 : B, wj = n - j0 < B ? n - j0 : B;                 \
	int64_t off = tri_off(n, B, bi, bj);                                                \
	(void)wi, (void)wj, (void)off

void x3_gram_acc_tri_f64(const double *x, int64_t rows, int64_t n, double *T)
{
	if (rows <= 0 || n <= 0)
		return;
	const int64_t B = n < X3_GEMM_COLS ? n : X3_GEMM_COLS, nb = (n + B - 1) / B, np = nb * (nb + 1) / 2;
	int prev = x3_blas_serial_begin();
	#pragma omp parallel for schedule(dynamic, 1) if(par_if(np, rows * n * n))
	for (int64_t p = 0; p < np; p++) {
		TRI_BLOCK(p);
		cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)wi, (int)wj, (int)rows, 1.0,
		            x + i0, (int)n, x + j0, (int)n, 1.0, T + off, (int)wj);
	}
	x3_blas_serial_end(prev);
}

/* The same elements, each an F32 sum over the rows of this call (from
 * zero) rounded once into T in double; the F32 sum never runs over more
 * rows than one call holds. The products are wider than the packed blocks:
 * row block bi against the columns from its diagonal on, in chunks of
 * X3_GRAM_CHUNK (a multiple of B) counted from the diagonal, one SGEMM each
 * (OpenBLAS packs a call's operands once: at 256 x 256 the packing was a
 * sixth of the time). A chunk's shape follows from n and bi alone, so an
 * element's bits do not depend on the thread count. */
int x3_gram_acc_tri_f32_f64(const float *x, int64_t rows, int64_t n, double *T)
{
	if (rows <= 0 || n <= 0)
		return X3_OK;
	const int64_t B = n < X3_GEMM_COLS ? n : X3_GEMM_COLS, nb = (n + B - 1) / B;
	const int64_t CW = X3_GRAM_CHUNK, nc = (n + CW - 1) / CW;
	/* tasks (bi, c): chunk c of row block bi, where it exists */
	int64_t *task = malloc((size_t)(nb * nc) * sizeof *task), nt = 0;
	if (!task)
		return x3_err(X3_ENOMEM, "out of memory for the Gram products");
	for (int64_t bi = 0; bi < nb; bi++)
		for (int64_t c = 0; bi * B + c * CW < n; c++)
			task[nt++] = bi * nc + c;
	int fail = 0;
	int prev = x3_blas_serial_begin();
	#pragma omp parallel if(par_if(nt, rows * n * n))
	{
		/* one product buffer per thread for all its tasks (a malloc per
		 * task mapped and faulted in fresh pages each time) */
		float *cm = malloc((size_t)(B * (CW < n ? CW : n)) * sizeof *cm);
		if (!cm) {
			#pragma omp atomic write
			fail = 1;
		}
		#pragma omp for schedule(dynamic, 1)
		for (int64_t q = 0; q < nt; q++) {
			if (!cm)
				continue;
			const int64_t bi = task[q] / nc, c = task[q] % nc, i0 = bi * B;
			const int64_t wi = n - i0 < B ? n - i0 : B, c0 = i0 + c * CW;
			const int64_t w = n - c0 < CW ? n - c0 : CW;
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)wi, (int)w, (int)rows, 1.0f,
			            x + i0, (int)n, x + c0, (int)n, 0.0f, cm, (int)w);
			/* into the packed blocks (bi, bj) the chunk covers (B divides CW) */
			for (int64_t bj = c0 / B; bj * B < c0 + w; bj++) {
				const int64_t j0 = bj * B, wj = n - j0 < B ? n - j0 : B;
				double *t = T + tri_off(n, B, bi, bj);
				for (int64_t i = 0; i < wi; i++)
					for (int64_t j = 0; j < wj; j++)
						t[i * wj + j] += cm[i * w + (j0 - c0) + j];
			}
		}
		free(cm);
	}
	x3_blas_serial_end(prev);
	free(task);
	if (fail)
		return x3_err(X3_ENOMEM, "out of memory for a %lldx%lld Gram product", (long long)B,
		              (long long)CW);
	return X3_OK;
}

/* Between the packed T and a full symmetric (n, n) matrix F (F32 when f32,
 * else F64), block by block in the packed order: TRI_UNPACK writes both
 * halves of F from T; TRI_SET sets T to w times F's upper triangle;
 * TRI_ADD adds that to T (exact when w is 1). */
enum { TRI_UNPACK, TRI_SET, TRI_ADD };
static void tri_walk(double *T, int64_t n, void *F, int f32, double w, int op)
{
	if (n <= 0)
		return;
	const int64_t B = n < X3_GEMM_COLS ? n : X3_GEMM_COLS, nb = (n + B - 1) / B, np = nb * (nb + 1) / 2;
	#pragma omp parallel for schedule(dynamic, 1) if(np > 1 && n * n > (1 << 18))
	for (int64_t p = 0; p < np; p++) {
		TRI_BLOCK(p);
		double *t = T + off;
		for (int64_t i = 0; i < wi; i++)
			for (int64_t j = bi == bj ? i : 0; j < wj; j++) {
				int64_t a = (i0 + i) * n + j0 + j, b = (j0 + j) * n + i0 + i;
				double *d = &t[i * wj + j];
				if (op == TRI_UNPACK) {
					if (f32)
						((float *)F)[a] = ((float *)F)[b] = (float)*d;
					else
						((double *)F)[a] = ((double *)F)[b] = *d;
					continue;
				}
				double v = f32 ? (double)((const float *)F)[a] : ((const double *)F)[a];
				*d = op == TRI_SET ? w * v : *d + w * v;
			}
	}
}

void x3_tri_unpack(const double *T, int64_t n, int f64, void *out)
{
	tri_walk((double *)T, n, out, !f64, 1.0, TRI_UNPACK);   /* T is only read */
}

void x3_tri_add_full(double *T, int64_t n, const void *g, int f32, double w, int first)
{
	tri_walk(T, n, (void *)g, f32, w, first ? TRI_SET : TRI_ADD);   /* g is only read */
}
