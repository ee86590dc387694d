/* gpu_impl.h: internal to the backend object (lib/gpu/gpu*.c, built with
 * CUDA into lib/libexl3kit-cuda.so): the functions behind the table of
 * device.h (x3_gpu_FOO is the table's FOO, same contract; gpu_entry.c
 * fills the table), and one translation of CUDA runtime and cuBLAS
 * failures into X3_* statuses with a message, defined in gpu.c.
 * Programs and the CPU library never include this (they dlopen the
 * object, device.h). */
#ifndef X3_GPU_IMPL_H
#define X3_GPU_IMPL_H

#include "device.h"

/* cudaError_t e: X3_OK for cudaSuccess; else clears a non-sticky error
 * and returns X3_ENOMEM (out of memory), X3_EUNSUP (no device or driver)
 * or X3_EIO, with "cuda: WHAT: why". */
int x3_gpu_cuerr(int e, const char *what);
/* cublasStatus_t s: X3_OK, X3_ENOMEM or X3_EIO with "cublas: WHAT: ..." */
int x3_gpu_blaserr(int s, const char *what);

/* gpu.c */
int x3_gpu_dev_available(void);
int x3_gpu_describe(char *buf, size_t len);
int x3_gpu_alloc(void **p, size_t bytes);
void x3_gpu_free(void *p);
int x3_gpu_upload(void *dst_d, const void *src, size_t bytes);
int x3_gpu_download(void *dst, const void *src_d, size_t bytes);
int x3_gpu_memset(void *dst_d, int byte, size_t bytes);
int x3_gpu_sync(void);
int x3_gpu_meminfo(size_t *free_b, size_t *total_b);
int x3_gpu_viterbi_encode(int K, int cb, const float *x, int64_t ntiles,
                          uint16_t *states, float *values);
int x3_gpu_viterbi_encode_d(int K, int cb, const float *x_d, int64_t ntiles,
                            uint16_t *states_d, float *values_d,
                            size_t max_scratch, size_t *scratch_used);
int x3_gpu_trellis_decode(int K, int cb, const uint16_t *trellis, int64_t k,
                          int64_t n, float *w);
int x3_gpu_trellis_decode_d(int K, int cb, const uint16_t *trellis_d,
                            int64_t k, int64_t n, void *w_d, int out_f16);
int x3_gpu_reconstruct(int K, int cb, const uint16_t *trellis,
                       const uint16_t *suh, const uint16_t *svh, int64_t k,
                       int64_t n, float *w);
int x3_gpu_had128_rows(float *x, int64_t rows, int64_t cols);
int x3_gpu_had128_cols(float *x, int64_t rows, int64_t cols);
int x3_gpu_linear_create(int K, int cb, int64_t k, int64_t n,
                         const uint16_t *trellis, const uint16_t *suh,
                         const uint16_t *svh, const uint16_t *bias,
                         x3_gpu_linear **out);
int x3_gpu_linear_create_f32(int K, int cb, int64_t k, int64_t n,
                             const uint16_t *trellis, const float *suh,
                             const float *svh, const float *bias,
                             x3_gpu_linear **out);
void x3_gpu_linear_free(x3_gpu_linear *L);
size_t x3_gpu_linear_bytes(const x3_gpu_linear *L);
int x3_gpu_linear_forward(x3_gpu_linear *L, const float *x, int64_t m, float *y);
int x3_gpu_linear_forward_d(x3_gpu_linear *L, const float *x_d, int64_t m,
                            float *y_d, int path);
int x3_gpu_linear_weight(x3_gpu_linear *L, int inner, float *w);
int x3_gpu_gemv_ksplit(int64_t k, int64_t n);

/* gpu_dense.c */
int x3_gpu_dense_create(const float *w, const float *bias, int64_t in,
                        int64_t out, x3_gpu_dense **res);
void x3_gpu_dense_free(x3_gpu_dense *d);
size_t x3_gpu_dense_bytes(const x3_gpu_dense *d);
int x3_gpu_dense_forward(x3_gpu_dense *d, const float *x, int64_t rows, float *y);
int x3_gpu_dense_forward_d(x3_gpu_dense *d, const float *x_d, int64_t rows,
                           float *y_d);

/* gpu_quant.c */
int x3_gpu_hessian_create(int64_t k, x3_gpu_hessian **out);
void x3_gpu_hessian_free(x3_gpu_hessian *h);
int x3_gpu_hessian_add(x3_gpu_hessian *h, const float *x, int64_t rows);
int x3_gpu_hessian_add_d(x3_gpu_hessian *h, const float *x_d, int64_t rows);
int x3_gpu_hessian_get(x3_gpu_hessian *h, float *H, double *count);
int x3_gpu_block_ldl(float *A, int64_t k);
int x3_gpu_block_ldl_retry(float *H, int64_t k, int max_retries, float *L,
                           int *retries);
int x3_gpu_ldlq(const float *W, int64_t k, int64_t n, const float *L, int K,
                int cb, uint16_t *states, float *Q);

#endif
