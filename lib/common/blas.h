/* blas.h: the toolkit's dense products, with the reproducibility rule that
 * every caller relies on.
 *
 * OpenBLAS picks its blocking, its edge kernels and its split between
 * threads from the call's shape and from OPENBLAS_NUM_THREADS, so one output
 * element of a plain cblas_sgemm can round differently when the same row is
 * multiplied in a call with more rows, or on two threads instead of one. The
 * functions here cut every product into blocks of a fixed shape (rows in
 * X3_GEMM_ROWS, or X3_GEMM_ROWS_BIG in segments of a multiple of it,
 * columns in X3_GEMM_COLS, the last partial row block padded with zero
 * rows), multiply each block on one BLAS thread and spread the
 * blocks over OpenMP threads. An element's value then depends on nothing but
 * its operands and the BLAS kernel of the machine:
 *   - the same on any thread count (BLAS or OpenMP) and any batch it shares;
 *   - NOT the same under another OpenBLAS kernel (OPENBLAS_CORETYPE Haswell
 *     vs SkylakeX, say): those order their fused multiply-adds differently.
 * Numbers the toolkit decides on (proxy errors, scale search, the plan) are
 * computed by our own fixed-order loops instead (lib/quant/), so they do not
 * depend on the kernel either; exl3kit(7), REPRODUCIBILITY, states the whole
 * rule. */
#ifndef X3_BLAS_H
#define X3_BLAS_H

#include <stdint.h>

#define X3_GEMM_ROWS 64
/* x3_gemm_xwt's row blocks in a segment whose length is a multiple of it
 * (a calibration row of 256, 512, ..., 2048 tokens): OpenBLAS packs the
 * whole weight for every block, which at 64 rows cost a fifth of the time
 * of an 8B layer's products (103-114 against 133-142 GFLOP/s on 2 Zen3
 * cores, 2048 rows of 4096 x 14336 and 14336 x 4096) */
#define X3_GEMM_ROWS_BIG 256
#define X3_GEMM_COLS 256
/* x3_gram_acc_tri_f32_f64's products: a row block of X3_GEMM_COLS against
 * up to this many columns (a multiple of X3_GEMM_COLS) */
#define X3_GRAM_CHUNK 2048

/* y (rows, out) = x (rows, in) · wᵀ, w (out, in) row-major: the dense linear.
 * rows are segments of seg rows each (the tokens of one calibration row;
 * seg <= 0, or not dividing rows, means one segment). Row p of a segment
 * depends on that row of x, on p and on seg (the block size) alone, not on
 * the other rows or segments in the call: the kernels round a row by its
 * place in a block (OpenBLAS Haswell: by p mod 12), so blocks count from
 * each segment's start. Returns X3_OK or X3_ENOMEM. */
int x3_gemm_xwt(const float *x, int64_t rows, int64_t seg, int64_t in, const float *w,
                int64_t out, float *y);

/* C (m, n) = Aᵀ B + beta C, A (kk, m) with leading dimension lda, B (kk, n)
 * with ldb, C with ldc, all row-major (LDLQ's feedback products). The blocks
 * are whole column blocks of X3_GEMM_COLS: column j of C depends on column j
 * of B and on A alone. */
void x3_gemm_atb(int64_t m, int64_t n, int64_t kk, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* The upper triangle of H (n, n) += xᵀx for x (rows, n), row-major: the
 * Hessian sums. Element (i, j) depends on columns i and j of x alone (the
 * lower triangle is left partly written and is not meaningful). */
void x3_gram_acc_f32(const float *x, int64_t rows, int64_t n, float *H);
void x3_gram_acc_f64(const double *x, int64_t rows, int64_t n, double *H);
/* The upper triangle of a symmetric (n, n) matrix in about half the memory
 * (the Hessian sums): the blocks (bi <= bj) of B = min(n, X3_GEMM_COLS)
 * rows and columns (the last row and column of blocks what is left), in
 * the order the Gram products below run them, each row-major (the lower
 * half of a diagonal block not meaningful): n^2 / 2 + n B / 2 elements.
 * x3_tri_size: the element count; x3_tri_at: the index of (i, j), either
 * order. */
int64_t x3_tri_size(int64_t n);
int64_t x3_tri_at(int64_t n, int64_t i, int64_t j);
/* The whole symmetric (n, n) matrix out (F64 when f64, else F32 rounded
 * once) from its packed upper triangle T. */
void x3_tri_unpack(const double *T, int64_t n, int f64, void *out);
/* T (packed) += w times the upper triangle of the full symmetric (n, n) g
 * (F32 when f32, else F64); first: T = that instead. */
void x3_tri_add_full(double *T, int64_t n, const void *g, int f32, double w, int first);
/* T (packed, n) += xᵀx: the blocks of x3_gram_acc_f64, each product the
 * same DGEMM, so the same bits. */
void x3_gram_acc_tri_f64(const double *x, int64_t rows, int64_t n, double *T);
/* The same, each element an F32 sum over the rows of this call (from
 * zero), rounded once into T in double: the Hessians' default (hessian.c);
 * the products row blocks of X3_GEMM_COLS against X3_GRAM_CHUNK columns.
 * Element (i, j) depends on columns i and j of x (and on n) alone.
 * Returns X3_OK or X3_ENOMEM. */
int x3_gram_acc_tri_f32_f64(const float *x, int64_t rows, int64_t n, double *T);

/* Run OpenBLAS on one thread until x3_blas_serial_end(prev); for LAPACK
 * calls whose threaded form blocks differently. Not reentrant across
 * threads: call from the program's main thread. */
int x3_blas_serial_begin(void);
void x3_blas_serial_end(int prev);

#endif
