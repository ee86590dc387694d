/* gpu_kern.h: launch functions of the CUDA kernels in kernels/ (*.cu files)
 * (internal to the library: lib/gpu/gpu*.c are the only callers; programs use
 * gpu.h). Every pointer is a device pointer; every function only launches
 * (asynchronously, on `stream`, a cudaStream_t or NULL for the default
 * stream) and returns the cudaError_t of the launch as an int (0 = ok).
 * Arguments are checked by the C wrappers, not here. Shapes are given as
 * (rows, cols) of row-major arrays. */
#ifndef X3_GPU_KERN_H
#define X3_GPU_KERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- viterbi.cu ------------------------------------------------------ */
/* Plan of one Viterbi launch for bit width K on the current device:
 * threads per block, dynamic shared memory, whether the cost buffers live
 * in shared memory (else in `scratch`), resident blocks per SM, and the
 * scratch bytes one resident block needs (back-pointers + costs). */
struct x3k_viterbi_plan {
	int threads;
	int smem_bytes;
	int costs_in_smem;
	int blocks_per_sm;
	size_t scratch_per_block;
};
int x3k_viterbi_plan(int K, int cb, struct x3k_viterbi_plan *p);
/* Encode ntiles tiles: x (ntiles, 256) targets in trellis order; states
 * (ntiles, 256) and values (ntiles, 256) may be NULL. nblocks persistent
 * blocks (grid), each with scratch_per_block bytes of scratch at
 * scratch + b * scratch_per_block. bad (one unsigned long long, set to
 * ~0 by the caller) receives the lowest flat index of a target that is
 * not finite or exceeds 1e16 in magnitude; such tiles are not encoded. */
int x3k_viterbi(int K, int cb, const float *x, int64_t ntiles,
                uint16_t *states, float *values, void *scratch,
                int nblocks, unsigned long long *bad, void *stream);

/* ---- decode.cu ------------------------------------------------------- */
/* W~ (k, n) from trellis (k/16, n/16, 16K) int16: fp32 (out_f16 = 0) or
 * fp16 bits (out_f16 = 1). */
int x3k_decode(int K, int cb, const uint16_t *trellis, int64_t k, int64_t n,
               void *w, int out_f16, void *stream);
/* Original basis W = diag(suh) Hb_k W~ Hb_n diag(svh) (k, n), fp32 or fp16,
 * suh (k) and svh (n) fp32; k, n multiples of 128. */
int x3k_reconstruct(int K, int cb, const uint16_t *trellis, const float *suh,
                    const float *svh, int64_t k, int64_t n, void *w,
                    int out_f16, void *stream);

/* ---- hadamard.cu ----------------------------------------------------- */
/* y (rows, cols) = (H128 (x (.) pre) * scale) (.) post + add, over each
 * 128-chunk of each row; pre/post/add are (cols) vectors or NULL; y may
 * equal x. cols % 128 == 0. */
int x3k_had128_rows(const float *x, float *y, int64_t rows, int64_t cols,
                    const float *pre, const float *post, const float *add,
                    float scale, void *stream);
/* Same along columns (each 128-chunk of rows of each column); pre/post are
 * (rows) vectors or NULL, in place. rows % 128 == 0. */
int x3k_had128_cols(float *x, int64_t rows, int64_t cols, const float *pre,
                    const float *post, float scale, void *stream);

/* ---- gemv.cu --------------------------------------------------------- */
/* The decode-in-the-loop GEMV for 1 <= m <= 16. use_mma: tensor-core
 * product with x' rounded to fp16 (1), or fp32 FMAs (0). ksplit: number
 * of k-slices wanted (>= 1; rounded to the shared-memory cap and, fused,
 * to whole 128-column chunks). */
#define X3K_GEMV_MAX_M 16
/* default ksplit for a (k, n) weight on the current device */
int x3k_gemv_ksplit(int64_t k, int64_t n);
/* Unfused: y (m, n) += x (m, k) W~, x = x' already rotated; y must be
 * zeroed by the caller (partial sums are added atomically). k, n
 * multiples of 16. */
int x3k_gemv(int K, int cb, const uint16_t *trellis, int64_t k, int64_t n,
             const float *x, int m, float *y, int ksplit, int use_mma, void *stream);
/* Fused, one launch: y (m, n) = Hb(Hb(x (.) suh) / sqrt128 W~) / sqrt128
 * (.) svh (+ bias) (exl3(5) §6.2), x (m, k), suh (k), svh (n), bias (n) or
 * NULL; k, n multiples of 128. y1 (16, n) fp32 scratch and cnt (n / 128)
 * ints must be zero on entry and are zero again when the launch
 * completes; they must not be used by two launches at once (one set per
 * stream). y must not overlap x. */
int x3k_gemv_fused(int K, int cb, const uint16_t *trellis, int64_t k, int64_t n,
                   const float *x, int m, const float *suh, const float *svh,
                   const float *bias, float *y, float *y1, int *cnt, int ksplit,
                   int use_mma, void *stream);

/* ---- util.cu --------------------------------------------------------- */
int x3k_f32_to_f16(const float *x, uint16_t *y, int64_t n, void *stream);
/* Copy the lower triangle of the column-major (n, n) matrix a to its upper
 * triangle (lower = 1), or the upper to the lower (lower = 0). */
int x3k_symmetrize(float *a, int64_t n, int lower, void *stream);
/* a[i][i] += v for the (n, n) matrix a. */
int x3k_add_diag(float *a, int64_t n, float v, void *stream);
/* sum of the diagonal of the (n, n) matrix a, into *out (device double). */
int x3k_diag_sum(const float *a, int64_t n, double *out, void *stream);
/* Block LDL normalization of row-major lower L (k, k) in place:
 * L <- L blockdiag(D_b)^-1 with D_b the 16x16 lower diagonal blocks, then
 * zero the diagonal blocks and everything above; *bad (device int) is set
 * to 1 if a diagonal entry is not finite and positive. */
int x3k_block_ldl_normalize(float *L, int64_t k, int *bad, void *stream);
/* Gather the 16 rows of X (16, n) into n/16 tiles of 256 in trellis order;
 * scatter values (n/16, 256) back to Q (16, n) and E = W - Q (16, n) (E may
 * be NULL). */
int x3k_tiles_gather(const float *X, int64_t n, float *tiles, void *stream);
int x3k_tiles_scatter(const float *vals, const float *W, int64_t n, float *Q,
                      float *E, void *stream);
/* y[i] += x[i] for n elements */
int x3k_add(float *y, const float *x, int64_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
