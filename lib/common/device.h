/* device.h: where the work runs. The --device values of the programs, and
 * the GPU backend: a shared object (lib/libexl3kit-cuda.so, built from
 * the kernels/ and lib/gpu/gpu*.c when CUDA is found) that the library loads
 * with dlopen the first time a program asks for cuda or auto, and then
 * calls through one table of function pointers, struct x3_gpu. Nothing
 * else of the library or the programs links or includes CUDA: a program
 * that never asks for the device never loads it, and starts in
 * milliseconds on a machine without the CUDA libraries.
 *
 * Where the object is looked for (the first that exists is loaded):
 *   $EXL3KIT_BACKEND          (a path; when set, the only place looked at)
 *   DIR/../lib/libexl3kit-cuda.so   DIR = the program's own directory
 *                             (/proc/self/exe): the build tree
 *   LIBEXECDIR/libexl3kit-cuda.so   compiled in (config.mk): make install
 *
 * Every table function checks its arguments and returns an X3_* status
 * with a message, like the rest of the library: a CUDA, cuBLAS or cuSOLVER
 * failure is X3_EIO ("cuda: what: why"), out of device memory X3_ENOMEM,
 * no usable device X3_EUNSUP. Functions without a suffix take and return
 * host memory and mirror a CPU function of codec.h / quant.h / exl3.h with
 * the same contract; *_d variants take device pointers. All use the
 * current CUDA device and the default stream and return after the work
 * is done. */
#ifndef X3_DEVICE_H
#define X3_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include "x3.h"

/* ---- device selection ------------------------------------------------ */
/* The --device option of the programs: "cpu", "cuda" or "auto". */
enum { X3_DEVICE_CPU = 0, X3_DEVICE_CUDA = 1, X3_DEVICE_AUTO = 2 };
/* Parse a --device value (X3_EINVAL with a message naming the value). */
int x3_device_parse(const char *s, int *dev);
/* Resolve a choice to CPU or CUDA: auto -> CUDA when x3_gpu_available(),
 * else CPU (the reason stays in x3_errmsg()); cuda without a usable
 * device -> X3_EUNSUP naming what is missing. */
int x3_device_resolve(int want, int *dev);
const char *x3_device_name(int dev);
/* Both at once: parse and resolve. */
int x3_device_select(const char *s, int *dev);

/* ---- the backend ------------------------------------------------------- */
typedef struct x3_gpu x3_gpu;
typedef struct x3_gpu_linear x3_gpu_linear;
typedef struct x3_gpu_dense x3_gpu_dense;
typedef struct x3_gpu_hessian x3_gpu_hessian;
struct x3_exl3;

/* Load the backend object (once per process; later calls return the first
 * call's result and message). X3_EUNSUP "no CUDA backend: PATH: why"
 * (the dlerror) when it is missing or unusable; does not look for a
 * device. */
int x3_gpu_load(const x3_gpu **g);
/* Load it and check for a usable device (driver, runtime, at least one
 * device): X3_EUNSUP naming the missing piece (the backend's path and the
 * driver's error). Never crashes without a driver. */
int x3_gpu_open(const x3_gpu **g);
/* 1 when x3_gpu_open succeeds, else 0 with the reason in x3_errmsg(). */
int x3_gpu_available(void);
/* The path of the loaded object ("" before a successful load). */
const char *x3_gpu_path(void);

/* Fused GEMV row limit (x3_gpu.linear_forward_d paths 1, 3, 4, 5). */
#define X3_GPU_GEMV_MAX_M 16

/* The table. Version X3_GPU_ABI; a backend built for another version or
 * table size is refused at load. */
#define X3_GPU_ABI 1
struct x3_gpu {
	int abi;            /* X3_GPU_ABI */
	size_t size;        /* sizeof(struct x3_gpu) */
	const char *name;   /* "cuda" (the CUDA libraries) or "cusim" (the emulator) */

	/* device: 1 if usable, else 0 with the reason in x3_errmsg();
	 * describe: one line on device 0, e.g. "NVIDIA H200, sm_90, 132 SMs,
	 * 139.8 GiB, L2 60 MiB" (X3_EUNSUP without a device) */
	int (*available)(void);
	int (*describe)(char *buf, size_t len);

	/* device memory; meminfo: free and total bytes */
	int (*alloc)(void **p, size_t bytes);
	void (*free)(void *p);
	int (*upload)(void *dst_d, const void *src, size_t bytes);
	int (*download)(void *dst, const void *src_d, size_t bytes);
	int (*memset)(void *dst_d, int byte, size_t bytes);
	int (*sync)(void);
	int (*meminfo)(size_t *free_b, size_t *total_b);

	/* Viterbi encoder, codec.h x3_viterbi_encode bit-identical (pass
	 * viterbi_encode to x3_viterbi_set_backend to route every encode,
	 * i.e. the scale search and LDLQ of quant.h, to it). Host memory in
	 * and out; tiles go to the device in batches. X3_ENUM (naming tile and
	 * position) on a target that is not finite or exceeds 1e16, X3_EINVAL
	 * on bad K/cb/counts. */
	int (*viterbi_encode)(int K, int cb, const float *x, int64_t ntiles,
	                      uint16_t *states, float *values);
	/* Device memory: x_d (ntiles, 256); states_d / values_d (ntiles, 256)
	 * may be NULL. max_scratch: device scratch allowed for back-pointers
	 * and costs (0: a quarter of the free memory, at most 2 GiB); the
	 * bytes used go to *scratch_used if not NULL. */
	int (*viterbi_encode_d)(int K, int cb, const float *x_d, int64_t ntiles,
	                        uint16_t *states_d, float *values_d, size_t max_scratch,
	                        size_t *scratch_used);

	/* decode, codec.h x3_trellis_decode bit-identical: w (k, n) */
	int (*trellis_decode)(int K, int cb, const uint16_t *trellis, int64_t k, int64_t n,
	                      float *w);
	int (*trellis_decode_d)(int K, int cb, const uint16_t *trellis_d, int64_t k, int64_t n,
	                        void *w_d, int out_f16);
	/* Dense W = diag(suh) Hb_k W~ Hb_n diag(svh) (k, n) straight from the
	 * trellis (quant.h x3_reconstruct of the decoded W~, fp32 arithmetic,
	 * equal up to rounding); suh (k), svh (n) are fp16 bits as stored. */
	int (*reconstruct)(int K, int cb, const uint16_t *trellis, const uint16_t *suh,
	                   const uint16_t *svh, int64_t k, int64_t n, float *w);

	/* codec.h x3_had128_rows/cols, equal up to rounding */
	int (*had128_rows)(float *x, int64_t rows, int64_t cols);
	int (*had128_cols)(float *x, int64_t rows, int64_t cols);

	/* ---- EXL3 linear (exl3.h x3_exl3_matmul) ---- */
	/* Upload one linear: trellis (k/16, n/16, 16K) words, suh (k) and svh
	 * (n) fp16 bits, bias (n) fp16 bits or NULL; k, n multiples of 128.
	 * linear_create_f32: the same with fp32 scales and bias. (A CPU layer
	 * of exl3.h goes up with x3_exl3_upload.) */
	int (*linear_create)(int K, int cb, int64_t k, int64_t n, const uint16_t *trellis,
	                     const uint16_t *suh, const uint16_t *svh, const uint16_t *bias,
	                     x3_gpu_linear **out);
	int (*linear_create_f32)(int K, int cb, int64_t k, int64_t n, const uint16_t *trellis,
	                         const float *suh, const float *svh, const float *bias,
	                         x3_gpu_linear **out);
	void (*linear_free)(x3_gpu_linear *L);
	/* bytes of device memory the linear holds (weights + workspace) */
	size_t (*linear_bytes)(const x3_gpu_linear *L);
	/* y (m, n) = x (m, k) W (+ bias), host memory. m <= 16: the fused
	 * decode GEMV, ONE kernel launch (input Hadamard in fp32 in shared
	 * memory, decode-in-the-loop tensor-core product with x' rounded to
	 * fp16 and fp32 accumulation, output Hadamard, svh and bias by the
	 * last block of each 128-column group); m > 16: reconstruct W in fp16
	 * and one cuBLAS GEMM (fp32 accumulate, x rounded to fp16). x' and x
	 * must stay within the fp16 range. Not reentrant: one linear must not
	 * run two forwards at once (from two threads or streams); it keeps
	 * device scratch between calls. */
	int (*linear_forward)(x3_gpu_linear *L, const float *x, int64_t m, float *y);
	/* Same with device pointers. path: 0 auto (1 for m <= 16, or 4 when
	 * x_d and y_d overlap; 2 above), 1 the fused GEMV with tensor cores
	 * (m <= 16, one launch), 2 reconstruct + GEMM, 3 the fused GEMV with
	 * fp32 x' and fp32 FMAs (slower, no fp16 rounding; m <= 16), 4 and 5
	 * the unfused forms of 1 and 3 (input Hadamard, memset, GEMV, output
	 * Hadamard: four launches, kept to compare). Paths 1 and 3 need y_d
	 * apart from x_d (X3_EINVAL); 0, 2, 4, 5 also work in place. Results
	 * of 1 and 4 (3 and 5) differ only in the order of the fp32 atomic
	 * sums over k-slices. */
	int (*linear_forward_d)(x3_gpu_linear *L, const float *x_d, int64_t m, float *y_d,
	                        int path);
	/* Dense weight (k, n) in the EXL3 orientation (inner = 0: original
	 * basis W; inner = 1: W~), host memory. */
	int (*linear_weight)(x3_gpu_linear *L, int inner, float *w);
	/* k-slices the GEMV asks for on a (k, n) weight on this device */
	int (*gemv_ksplit)(int64_t k, int64_t n);

	/* ---- dense F32 linear (linear.h), for the model forward ---- */
	/* The weight is uploaded once, y = x Wᵀ (+ bias) is a cuBLAS SGEMM in
	 * fp32 (no TF32) and the bias a rank-1 update, i.e. linear.c's
	 * cblas_sgemm and bias add up to the summation order. W (out, in)
	 * row-major (HF orientation), bias (out) or NULL. */
	int (*dense_create)(const float *w, const float *bias, int64_t in, int64_t out,
	                    x3_gpu_dense **res);
	void (*dense_free)(x3_gpu_dense *d);
	/* bytes of device memory held (weight, bias, staging) */
	size_t (*dense_bytes)(const x3_gpu_dense *d);
	/* y (rows, out) = x (rows, in) Wᵀ (+ bias), host memory (staged
	 * through device buffers kept with the linear) or device memory */
	int (*dense_forward)(x3_gpu_dense *d, const float *x, int64_t rows, float *y);
	int (*dense_forward_d)(x3_gpu_dense *d, const float *x_d, int64_t rows, float *y_d);

	/* ---- quantizer pieces (quant.h) ---- */
	/* Hessian accumulator H = sum x^T x over row blocks, fp32 via cuBLAS
	 * SSYRK. add: x (rows, k) (rows with non-finite values must be dropped
	 * by the caller; this refuses them with X3_ENUM). get: the full
	 * symmetric H (k, k) and the row count so far. */
	int (*hessian_create)(int64_t k, x3_gpu_hessian **out);
	void (*hessian_free)(x3_gpu_hessian *h);
	int (*hessian_add)(x3_gpu_hessian *h, const float *x, int64_t rows);
	int (*hessian_add_d)(x3_gpu_hessian *h, const float *x_d, int64_t rows);
	int (*hessian_get)(x3_gpu_hessian *h, float *H, double *count);
	/* quant.h x3_block_ldl (cuSOLVER SPOTRF + normalization): same
	 * contract, A (k, k) host memory in place; X3_ENUM if the Cholesky
	 * fails. */
	int (*block_ldl)(float *A, int64_t k);
	/* The damping-retry loop of x3_qhess_finalize (exl3(5) §9.1 step 7): factor a copy
	 * of H (k, k); while it fails add 2*sigma_reg*mean(diag(H)) to H's
	 * diagonal (sigma_reg = 0.025) and retry, at most max_retries times.
	 * On X3_OK, L (k, k) holds the block-LDL factor, H the damped matrix
	 * actually factored, *retries the count. X3_ENUM when all fail. */
	int (*block_ldl_retry)(float *H, int64_t k, int max_retries, float *L, int *retries);
	/* quant.h x3_ldlq: same contract (W (k, n), L (k, k) or NULL, states
	 * (k/16, n/16, 256), Q (k, n)), host memory. The Viterbi is
	 * bit-identical to the CPU; the feedback sums (cuBLAS) round
	 * differently, so states may differ where X differs in the last bit. */
	int (*ldlq)(const float *W, int64_t k, int64_t n, const float *L, int K, int cb,
	            uint16_t *states, float *Q);
};

/* ---- the other direction: what the library lends the backend ------------ */
/* A backend object exports one function, X3_GPU_ENTRY, of type
 * x3_gpu_entry_fn: given the host's services it returns its table (or
 * NULL). The backend links nothing of libexl3kit: its messages go into
 * the program's x3_errmsg() through these pointers. */
struct x3_gpu_host {
	int abi;   /* X3_GPU_ABI */
	int (*err)(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
	int (*errprefix)(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
	float (*f16_to_f32)(uint16_t h);
};
#define X3_GPU_ENTRY "x3_gpu_backend"
typedef const struct x3_gpu *(*x3_gpu_entry_fn)(const struct x3_gpu_host *host);

#endif
