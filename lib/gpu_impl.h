/* gpu_impl.h: internal to lib/gpu*.c (built with CUDA): one translation
 * of CUDA runtime and cuBLAS failures into X3_* statuses with a message,
 * defined in gpu.c. */
#ifndef X3_GPU_IMPL_H
#define X3_GPU_IMPL_H

/* cudaError_t e: X3_OK for cudaSuccess; else clears a non-sticky error
 * and returns X3_ENOMEM (out of memory), X3_EUNSUP (no device or driver)
 * or X3_EIO, with "cuda: WHAT: why". */
int x3_gpu_cuerr(int e, const char *what);
/* cublasStatus_t s: X3_OK, X3_ENOMEM or X3_EIO with "cublas: WHAT: ..." */
int x3_gpu_blaserr(int s, const char *what);

#endif
