/* cusim_blas.cpp: the cuBLAS and cuSOLVER functions exl3kit uses, on the
 * CPU over OpenBLAS and LAPACKE, with their column-major semantics and
 * argument checks. Matrices must lie in device memory (cudaMalloc of
 * cusim); a host pointer is an illegal address, as on a device.
 * cublasGemmEx with CUDA_R_16F operands reads them as fp16 (each value is
 * exact in fp32) and accumulates in fp32 (CUBLAS_COMPUTE_32F*). The
 * summation order is OpenBLAS's, not cuBLAS's: results equal a device's up
 * to fp32 rounding. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
#include <cusolverDn.h>
#include <cblas.h>
#include <lapacke.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cusim_rt.h"

using namespace cusim;

#define MAGIC_BLAS 0x626c6173u
#define MAGIC_SOLV 0x736f6c76u

struct cublasContext {
	unsigned magic;
	cudaStream_t stream;
};
struct cusolverDnContext {
	unsigned magic;
	cudaStream_t stream;
};

/* elements spanned by a column-major (rows, cols) matrix with leading
 * dimension ld */
static size_t span(int rows, int cols, int ld)
{
	return rows > 0 && cols > 0 ? (size_t)(cols - 1) * (size_t)ld + (size_t)rows : 0;
}

static bool in_device(const void *p, size_t bytes, const char *what)
{
	if (bytes == 0 || rt_is_device(p, bytes))
		return true;
	char b[200];
	snprintf(b, sizeof b, "%s: %zu bytes at %p are not device memory", what, bytes, p);
	fprintf(stderr, "cusim: %s\n", b);
	rt_set_sticky(cudaErrorIllegalAddress, b);
	return false;
}

static CBLAS_TRANSPOSE tr(cublasOperation_t t)
{
	return t == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
}

static bool op_ok(cublasOperation_t t)
{
	return t == CUBLAS_OP_N || t == CUBLAS_OP_T || t == CUBLAS_OP_C;
}

static cublasStatus_t blas_state(cublasHandle_t h)
{
	if (!h || h->magic != MAGIC_BLAS)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	return rt_sticky() ? CUBLAS_STATUS_EXECUTION_FAILED : CUBLAS_STATUS_SUCCESS;
}

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
	int n = 0;
	if (!h)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
		(void)cudaGetLastError();
		return CUBLAS_STATUS_NOT_INITIALIZED;
	}
	*h = new cublasContext{MAGIC_BLAS, NULL};
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
	if (!h || h->magic != MAGIC_BLAS)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	h->magic = 0;
	delete h;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
	if (!h || h->magic != MAGIC_BLAS)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	h->stream = s;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *s)
{
	if (!h || h->magic != MAGIC_BLAS)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	*s = h->stream;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
	(void)m;
	return !h || h->magic != MAGIC_BLAS ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
	cublasStatus_t s = blas_state(h);
	if (s)
		return s;
	const int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
	const int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
	if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0 || lda < (ar > 1 ? ar : 1) ||
	    ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1) || !alpha || !beta)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (m == 0 || n == 0)
		return CUBLAS_STATUS_SUCCESS;
	const bool use_ab = k > 0 && *alpha != 0.0f;
	if ((use_ab && (!in_device(A, span(ar, ac, lda) * 4, "cublasSgemm A") ||
	                !in_device(B, span(br, bc, ldb) * 4, "cublasSgemm B"))) ||
	    !in_device(C, span(m, n, ldc) * 4, "cublasSgemm C"))
		return CUBLAS_STATUS_EXECUTION_FAILED;
	if (!use_ab) {   /* C = beta C; beta = 0 does not read C */
		for (int j = 0; j < n; j++)
			for (int i = 0; i < m; i++)
				C[(size_t)j * ldc + i] = *beta == 0.0f ? 0.0f : *beta * C[(size_t)j * ldc + i];
		return CUBLAS_STATUS_SUCCESS;
	}
	if (*beta == 0.0f)
		for (int j = 0; j < n; j++)
			memset(C + (size_t)j * ldc, 0, (size_t)m * 4);
	cblas_sgemm(CblasColMajor, tr(ta), tr(tb), m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSsyrk(cublasHandle_t h, cublasFillMode_t uplo, cublasOperation_t t, int n,
                           int k, const float *alpha, const float *A, int lda, const float *beta,
                           float *C, int ldc)
{
	cublasStatus_t s = blas_state(h);
	if (s)
		return s;
	const int ar = t == CUBLAS_OP_N ? n : k, ac = t == CUBLAS_OP_N ? k : n;
	if ((uplo != CUBLAS_FILL_MODE_LOWER && uplo != CUBLAS_FILL_MODE_UPPER) || !op_ok(t) || n < 0 ||
	    k < 0 || lda < (ar > 1 ? ar : 1) || ldc < (n > 1 ? n : 1) || !alpha || !beta)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (n == 0)
		return CUBLAS_STATUS_SUCCESS;
	if ((k > 0 && !in_device(A, span(ar, ac, lda) * 4, "cublasSsyrk A")) ||
	    !in_device(C, span(n, n, ldc) * 4, "cublasSsyrk C"))
		return CUBLAS_STATUS_EXECUTION_FAILED;
	const bool lower = uplo == CUBLAS_FILL_MODE_LOWER;
	if (*beta == 0.0f)   /* beta = 0 does not read C */
		for (int j = 0; j < n; j++)
			for (int i = lower ? j : 0; i < (lower ? n : j + 1); i++)
				C[(size_t)j * ldc + i] = 0.0f;
	cblas_ssyrk(CblasColMajor, lower ? CblasLower : CblasUpper, tr(t), n, k, *alpha, A, lda, *beta,
	            C, ldc);
	return CUBLAS_STATUS_SUCCESS;
}

/* an fp16 or fp32 column-major operand as fp32 (same leading dimension) */
static bool as_f32(const void *p, cudaDataType t, int rows, int cols, int ld, const char *what,
                   std::vector<float> &buf, const float **out)
{
	const size_t n = span(rows, cols, ld);
	if (!in_device(p, n * (t == CUDA_R_16F ? 2 : 4), what))
		return false;
	if (t == CUDA_R_32F) {
		*out = (const float *)p;
		return true;
	}
	buf.resize(n);
	const __half *h = (const __half *)p;
	for (size_t i = 0; i < n; i++)
		buf[i] = __half2float(h[i]);
	*out = buf.data();
	return true;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                            int lda, const void *B, cudaDataType Btype, int ldb, const void *beta,
                            void *C, cudaDataType Ctype, int ldc, cublasComputeType_t ct,
                            cublasGemmAlgo_t algo)
{
	cublasStatus_t s = blas_state(h);
	if (s)
		return s;
	(void)algo;
	if (ct != CUBLAS_COMPUTE_32F && ct != CUBLAS_COMPUTE_32F_FAST_16F &&
	    ct != CUBLAS_COMPUTE_32F_PEDANTIC)
		return CUBLAS_STATUS_NOT_SUPPORTED;
	if ((Atype != CUDA_R_16F && Atype != CUDA_R_32F) || (Btype != CUDA_R_16F && Btype != CUDA_R_32F) ||
	    (Ctype != CUDA_R_32F && Ctype != CUDA_R_16F) || (Atype == CUDA_R_32F) != (Btype == CUDA_R_32F) ||
	    (Atype == CUDA_R_32F && Ctype != CUDA_R_32F))
		return CUBLAS_STATUS_NOT_SUPPORTED;
	const int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
	const int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
	if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0 || lda < (ar > 1 ? ar : 1) ||
	    ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1) || !alpha || !beta)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (m == 0 || n == 0)
		return CUBLAS_STATUS_SUCCESS;
	const float al = *(const float *)alpha, be = *(const float *)beta;
	std::vector<float> ba, bb, bc_;
	const float *a = NULL, *b = NULL;
	if (k > 0 && al != 0.0f &&
	    (!as_f32(A, Atype, ar, ac, lda, "cublasGemmEx A", ba, &a) ||
	     !as_f32(B, Btype, br, bc, ldb, "cublasGemmEx B", bb, &b)))
		return CUBLAS_STATUS_EXECUTION_FAILED;
	if (!in_device(C, span(m, n, ldc) * (Ctype == CUDA_R_16F ? 2 : 4), "cublasGemmEx C"))
		return CUBLAS_STATUS_EXECUTION_FAILED;
	/* C in fp32 (beta = 0 does not read C) */
	float *c = (float *)C;
	int ldc32 = ldc;
	if (Ctype == CUDA_R_16F) {
		bc_.assign((size_t)m * n, 0.0f);
		c = bc_.data();
		ldc32 = m;
	}
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			float v = 0.0f;
			if (be != 0.0f)
				v = be * (Ctype == CUDA_R_16F ? __half2float(((const __half *)C)[(size_t)j * ldc + i])
				                              : c[(size_t)j * ldc + i]);
			c[(size_t)j * ldc32 + i] = v;
		}
	if (k > 0 && al != 0.0f)
		cblas_sgemm(CblasColMajor, tr(ta), tr(tb), m, n, k, al, a, lda, b, ldb, 1.0f, c, ldc32);
	if (Ctype == CUDA_R_16F)
		for (int j = 0; j < n; j++)
			for (int i = 0; i < m; i++)
				((__half *)C)[(size_t)j * ldc + i] = __float2half_rn(c[(size_t)j * m + i]);
	return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuSOLVER ------------------------------------------------------------- */

cusolverStatus_t cusolverDnCreate(cusolverDnHandle_t *h)
{
	int n = 0;
	if (!h)
		return CUSOLVER_STATUS_INVALID_VALUE;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
		(void)cudaGetLastError();
		return CUSOLVER_STATUS_NOT_INITIALIZED;
	}
	*h = new cusolverDnContext{MAGIC_SOLV, NULL};
	return CUSOLVER_STATUS_SUCCESS;
}

cusolverStatus_t cusolverDnDestroy(cusolverDnHandle_t h)
{
	if (!h || h->magic != MAGIC_SOLV)
		return CUSOLVER_STATUS_NOT_INITIALIZED;
	h->magic = 0;
	delete h;
	return CUSOLVER_STATUS_SUCCESS;
}

cusolverStatus_t cusolverDnSetStream(cusolverDnHandle_t h, cudaStream_t s)
{
	if (!h || h->magic != MAGIC_SOLV)
		return CUSOLVER_STATUS_NOT_INITIALIZED;
	h->stream = s;
	return CUSOLVER_STATUS_SUCCESS;
}

/* workspace: one 64-column panel (the emulation needs none, but a caller
 * that passes less than it asked for is wrong) */
static int potrf_lwork(int n) { return n > 0 ? 64 * n : 1; }

cusolverStatus_t cusolverDnSpotrf_bufferSize(cusolverDnHandle_t h, cublasFillMode_t uplo, int n,
                                             float *A, int lda, int *lwork)
{
	if (!h || h->magic != MAGIC_SOLV)
		return CUSOLVER_STATUS_NOT_INITIALIZED;
	if ((uplo != CUBLAS_FILL_MODE_LOWER && uplo != CUBLAS_FILL_MODE_UPPER) || n < 0 ||
	    lda < (n > 1 ? n : 1) || !lwork)
		return CUSOLVER_STATUS_INVALID_VALUE;
	(void)A;
	*lwork = potrf_lwork(n);
	return CUSOLVER_STATUS_SUCCESS;
}

cusolverStatus_t cusolverDnSpotrf(cusolverDnHandle_t h, cublasFillMode_t uplo, int n, float *A,
                                  int lda, float *work, int lwork, int *info)
{
	if (!h || h->magic != MAGIC_SOLV)
		return CUSOLVER_STATUS_NOT_INITIALIZED;
	if (rt_sticky())
		return CUSOLVER_STATUS_EXECUTION_FAILED;
	if ((uplo != CUBLAS_FILL_MODE_LOWER && uplo != CUBLAS_FILL_MODE_UPPER) || n < 0 ||
	    lda < (n > 1 ? n : 1) || lwork < potrf_lwork(n))
		return CUSOLVER_STATUS_INVALID_VALUE;
	if (!in_device(info, sizeof *info, "cusolverDnSpotrf devInfo") ||
	    !in_device(A, span(n, n, lda) * 4, "cusolverDnSpotrf A") ||
	    !in_device(work, (size_t)lwork * 4, "cusolverDnSpotrf workspace"))
		return CUSOLVER_STATUS_EXECUTION_FAILED;
	*info = n == 0 ? 0 : (int)LAPACKE_spotrf_work(LAPACK_COL_MAJOR,
	                                              uplo == CUBLAS_FILL_MODE_UPPER ? 'U' : 'L', n, A,
	                                              lda);
	return CUSOLVER_STATUS_SUCCESS;
}

} /* extern "C" */
