/* gpu.h: the CUDA path of exl3kit (kernels in kernels/, launched through
 * gpu_kern.h). Every function checks its arguments and returns an X3_*
 * status with a message, like the rest of the library; a CUDA, cuBLAS or
 * cuSOLVER failure is X3_EIO ("cuda: what: why"), out of device memory is
 * X3_ENOMEM, no usable device is X3_EUNSUP. In a build without CUDA
 * (make CUDA=0) every function returns X3_EUNSUP "built without CUDA" and
 * x3_gpu_available() returns 0.
 *
 * Functions without a suffix take and return host memory and mirror a CPU
 * function of codec.h / quant.h / exl3.h with the same contract; *_d
 * variants take device pointers. All use the current CUDA device and the
 * default stream and return after the work is done. */
#ifndef X3_GPU_H
#define X3_GPU_H

#include <stddef.h>
#include <stdint.h>
#include "x3.h"

/* ---- device selection ------------------------------------------------ */
/* 1 if a CUDA device can be used (driver, runtime and at least one
 * device), else 0 with the reason in x3_errmsg(). Never crashes without a
 * driver. */
int x3_gpu_available(void);
/* One line describing device 0, e.g. "NVIDIA H200, sm_90, 132 SMs,
 * 139.8 GiB"; X3_EUNSUP without a device. */
int x3_gpu_describe(char *buf, size_t len);

/* The --device option of the programs: "cpu", "cuda" or "auto". */
enum { X3_DEVICE_CPU = 0, X3_DEVICE_CUDA = 1, X3_DEVICE_AUTO = 2 };
/* Parse a --device value (X3_EINVAL with a message naming the value). */
int x3_device_parse(const char *s, int *dev);
/* Resolve a choice to CPU or CUDA: auto -> CUDA when x3_gpu_available(),
 * else CPU; cuda without a usable device -> X3_EUNSUP (why in message). */
int x3_device_resolve(int want, int *dev);
const char *x3_device_name(int dev);
/* Both at once: parse and resolve (for "--device X" handling in mains). */
int x3_device_select(const char *s, int *dev);

/* ---- device memory ---------------------------------------------------- */
int x3_gpu_alloc(void **p, size_t bytes);
void x3_gpu_free(void *p);
int x3_gpu_upload(void *dst_d, const void *src, size_t bytes);
int x3_gpu_download(void *dst, const void *src_d, size_t bytes);
int x3_gpu_memset(void *dst_d, int byte, size_t bytes);
int x3_gpu_sync(void);
/* free and total device memory in bytes */
int x3_gpu_meminfo(size_t *free_b, size_t *total_b);

/* ---- Viterbi encoder (codec.h x3_viterbi_encode, bit-identical) ------- */
/* Host memory in and out; tiles go to the device in batches.
 * Returns X3_ENUM (naming tile and position) on a target that is not
 * finite or exceeds 1e16, X3_EINVAL on bad K/cb/counts. */
int x3_gpu_viterbi_encode(int K, int cb, const float *x, int64_t ntiles,
                          uint16_t *states, float *values);
/* Device memory: x_d (ntiles, 256); states_d / values_d (ntiles, 256) may
 * be NULL. max_scratch: device scratch allowed for back-pointers and
 * costs (0: a quarter of the free memory, at most 2 GiB); the bytes used
 * go to *scratch_used if not NULL. */
int x3_gpu_viterbi_encode_d(int K, int cb, const float *x_d, int64_t ntiles,
                            uint16_t *states_d, float *values_d,
                            size_t max_scratch, size_t *scratch_used);

/* Route every x3_viterbi_encode (and so the scale search and LDLQ of
 * quant.h, i.e. trellis-encode) to the GPU encoder (on = 1) or back to the
 * CPU (on = 0). Results are bit-identical either way. X3_EUNSUP without a
 * usable device. */
int x3_gpu_viterbi_backend(int on);

/* ---- decode (codec.h x3_trellis_decode, bit-identical) ---------------- */
int x3_gpu_trellis_decode(int K, int cb, const uint16_t *trellis, int64_t k,
                          int64_t n, float *w /* (k, n) */);
int x3_gpu_trellis_decode_d(int K, int cb, const uint16_t *trellis_d,
                            int64_t k, int64_t n, void *w_d, int out_f16);
/* Dense W = diag(suh) Hb_k W~ Hb_n diag(svh) (k, n) straight from the
 * trellis (quant.h x3_reconstruct of the decoded W~, fp32 arithmetic,
 * equal up to rounding); suh (k), svh (n) are fp16 bits as stored. */
int x3_gpu_reconstruct(int K, int cb, const uint16_t *trellis,
                       const uint16_t *suh, const uint16_t *svh, int64_t k,
                       int64_t n, float *w /* (k, n) */);

/* ---- Hadamard (codec.h x3_had128_rows/cols, equal up to rounding) ---- */
int x3_gpu_had128_rows(float *x, int64_t rows, int64_t cols);
int x3_gpu_had128_cols(float *x, int64_t rows, int64_t cols);

/* ---- EXL3 linear on the device (exl3.h x3_exl3_matmul) ---------------- */
typedef struct x3_gpu_linear x3_gpu_linear;
/* Upload one linear: trellis (k/16, n/16, 16K) words, suh (k) and svh (n)
 * fp16 bits, bias (n) fp16 bits or NULL; k, n multiples of 128. */
int x3_gpu_linear_create(int K, int cb, int64_t k, int64_t n,
                         const uint16_t *trellis, const uint16_t *suh,
                         const uint16_t *svh, const uint16_t *bias,
                         x3_gpu_linear **out);
/* Same with fp32 scale vectors (and bias). */
int x3_gpu_linear_create_f32(int K, int cb, int64_t k, int64_t n,
                             const uint16_t *trellis, const float *suh,
                             const float *svh, const float *bias,
                             x3_gpu_linear **out);
/* From a CPU layer of exl3.h (lib/gpu_exl3.c). Inputs to the forward
 * functions must then be k wide (zero-extend in_features) and outputs are
 * n wide (trim to out_features). */
struct x3_exl3;
int x3_gpu_linear_from_exl3(const struct x3_exl3 *e, x3_gpu_linear **out);
void x3_gpu_linear_free(x3_gpu_linear *L);
/* Bytes of device memory the linear holds (weights + workspace). */
size_t x3_gpu_linear_bytes(const x3_gpu_linear *L);
/* y (m, n) = x (m, k) W (+ bias), host memory. m <= 16: the fused decode
 * GEMV, ONE kernel launch (input Hadamard in fp32 in shared memory,
 * decode-in-the-loop tensor-core product with x' rounded to fp16 and fp32
 * accumulation, output Hadamard, svh and bias by the last block of each
 * 128-column group); m > 16: reconstruct W in fp16 and one cuBLAS GEMM
 * (fp32 accumulate, x rounded to fp16). x' and x must stay within the
 * fp16 range. Not reentrant: one linear must not run two forwards at once
 * (from two threads or streams); it keeps device scratch between calls. */
int x3_gpu_linear_forward(x3_gpu_linear *L, const float *x, int64_t m, float *y);
/* Same with device pointers. path: 0 auto (1 for m <= 16, or 4 when x_d
 * and y_d overlap; 2 above), 1 the fused GEMV with tensor cores (m <= 16,
 * one launch), 2 reconstruct + GEMM, 3 the fused GEMV with fp32 x' and
 * fp32 FMAs (slower, no fp16 rounding; m <= 16), 4 and 5 the unfused
 * forms of 1 and 3 (input Hadamard, memset, GEMV, output Hadamard: four
 * launches, kept to compare). Paths 1 and 3 need y_d apart from x_d
 * (X3_EINVAL); 0, 2, 4, 5 also work in place. Results of 1 and 4 (3 and
 * 5) differ only in the order of the fp32 atomic sums over k-slices. */
int x3_gpu_linear_forward_d(x3_gpu_linear *L, const float *x_d, int64_t m,
                            float *y_d, int path);
/* Dense weight (k, n) in the EXL3 orientation (inner = 0: original basis
 * W; inner = 1: W~), host memory. */
int x3_gpu_linear_weight(x3_gpu_linear *L, int inner, float *w);

/* ---- dense F32 linear (linear.h), lib/gpu_dense.c ---------------------- */
/* For the model forward on the device (hessian-capture, model-eval): the
 * weight is uploaded once, y = x Wᵀ (+ bias) is a cuBLAS SGEMM in fp32
 * (no TF32) and the bias a rank-1 update, i.e. linear.c's cblas_sgemm and
 * bias add up to the summation order (equal up to F32 rounding, not
 * bit-identical). */
typedef struct x3_gpu_dense x3_gpu_dense;
/* Upload W (out, in) row-major (HF orientation) and bias (out) or NULL. */
int x3_gpu_dense_create(const float *w, const float *bias, int64_t in,
                        int64_t out, x3_gpu_dense **res);
void x3_gpu_dense_free(x3_gpu_dense *d);
/* Bytes of device memory held (weight, bias, staging). */
size_t x3_gpu_dense_bytes(const x3_gpu_dense *d);
/* y (rows, out) = x (rows, in) Wᵀ (+ bias), host memory (staged through
 * device buffers kept with the linear). */
int x3_gpu_dense_forward(x3_gpu_dense *d, const float *x, int64_t rows, float *y);
/* Same with device pointers. */
int x3_gpu_dense_forward_d(x3_gpu_dense *d, const float *x_d, int64_t rows,
                           float *y_d);

/* ---- quantizer pieces (quant.h), lib/gpu_quant.c ----------------------- */
/* Hessian accumulator H = sum x^T x over row blocks, fp32 on the device
 * via cuBLAS SSYRK. */
typedef struct x3_gpu_hessian x3_gpu_hessian;
int x3_gpu_hessian_create(int64_t k, x3_gpu_hessian **out);
void x3_gpu_hessian_free(x3_gpu_hessian *h);
/* Add x (rows, k) host memory (rows with non-finite values must be
 * dropped by the caller; this refuses them with X3_ENUM). */
int x3_gpu_hessian_add(x3_gpu_hessian *h, const float *x, int64_t rows);
int x3_gpu_hessian_add_d(x3_gpu_hessian *h, const float *x_d, int64_t rows);
/* The full symmetric H (k, k) and the row count so far. */
int x3_gpu_hessian_get(x3_gpu_hessian *h, float *H, double *count);

/* quant.h x3_block_ldl on the device (cuSOLVER SPOTRF + normalization):
 * same contract, A (k, k) host memory in place; X3_ENUM if the Cholesky
 * fails. */
int x3_gpu_block_ldl(float *A, int64_t k);
/* The damping-retry loop of x3_qhess_finalize (exl3(5) §9.1 step 7): factor a copy of
 * H (k, k); while it fails add 2*sigma_reg*mean(diag(H)) to H's diagonal
 * (sigma_reg = 0.025) and retry, at most max_retries times. On X3_OK, L
 * (k, k) holds the block-LDL factor, H the damped matrix actually
 * factored, *retries the count. X3_ENUM when all retries fail. */
int x3_gpu_block_ldl_retry(float *H, int64_t k, int max_retries, float *L,
                           int *retries);
/* quant.h x3_ldlq on the device: same contract (W (k, n), L (k, k) or
 * NULL, states (k/16, n/16, 256), Q (k, n)), host memory. The Viterbi is
 * bit-identical to the CPU; the feedback sums (cuBLAS) round differently,
 * so states may differ from the CPU's where X differs in the last bit. */
int x3_gpu_ldlq(const float *W, int64_t k, int64_t n, const float *L, int K,
                int cb, uint16_t *states, float *Q);

#endif
