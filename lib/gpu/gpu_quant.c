/* gpu_quant.c: the quantizer's dense algebra on the device (exl3(5) §9.1,
 * exl3(5) §9.4): Hessian accumulation X^T X (cuBLAS SSYRK), block LDL (cuSOLVER
 * SPOTRF + normalization kernel) with the damping retries of
 * x3_qhess_finalize, and LDLQ with cuBLAS feedback products and the GPU
 * Viterbi. Each function mirrors the CPU one in quant.h (same structure,
 * same spans and blocks); only the fp32 summation order of the products
 * differs. See device.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cusolverDn.h>

#include "codec.h"
#include "gpu_impl.h"
#include "gpu_kern.h"

#define SIGMA_REG 0.025   /* quant.h X3_SIGMA_REG (exl3(5) §9.1 step 4) */
#define QSPAN 128         /* quant.h X3_QSPAN: buf_size_k of ldlq (exl3(5) §9.4) */

static int solvererr(cusolverStatus_t s, const char *what)
{
	if (s == CUSOLVER_STATUS_SUCCESS)
		return X3_OK;
	if (s == CUSOLVER_STATUS_ALLOC_FAILED)
		return x3_err(X3_ENOMEM, "cusolver: %s: out of memory", what);
	return x3_err(X3_EIO, "cusolver: %s: status %d", what, (int)s);
}

/* ---- Hessian ------------------------------------------------------------ */

#define HROWS 4096   /* rows per host upload */

struct x3_gpu_hessian {
	int64_t k;
	float *H_d;      /* (k, k), lower triangle (column-major) accumulated */
	float *x_d;      /* (HROWS, k) staging */
	double count;
	cublasHandle_t blas;
};

void x3_gpu_hessian_free(x3_gpu_hessian *h)
{
	if (!h)
		return;
	x3_gpu_free(h->H_d);
	x3_gpu_free(h->x_d);
	if (h->blas)
		cublasDestroy(h->blas);
	free(h);
}

int x3_gpu_hessian_create(int64_t k, x3_gpu_hessian **out)
{
	*out = NULL;
	if (k <= 0 || k > 1 << 20)
		return x3_err(X3_EINVAL, "hessian: bad size %lld", (long long)k);
	if (!x3_gpu_dev_available())
		return X3_EUNSUP;
	x3_gpu_hessian *h = calloc(1, sizeof *h);
	if (!h)
		return x3_err(X3_ENOMEM, "out of memory");
	h->k = k;
	int rc = x3_gpu_alloc((void **)&h->H_d, (size_t)(k * k) * sizeof(float));
	if (!rc)
		rc = x3_gpu_memset(h->H_d, 0, (size_t)(k * k) * sizeof(float));
	if (!rc)
		rc = x3_gpu_blaserr(cublasCreate(&h->blas), "create handle");
	if (rc) {
		x3_gpu_hessian_free(h);
		return rc;
	}
	*out = h;
	return X3_OK;
}

int x3_gpu_hessian_add_d(x3_gpu_hessian *h, const float *x_d, int64_t rows)
{
	if (!h || (rows > 0 && !x_d) || rows < 0 || rows > 1 << 30)
		return x3_err(X3_EINVAL, "hessian: bad arguments");
	if (rows == 0)
		return X3_OK;
	/* row-major x (rows, k) is column-major A = x^T (k, rows), lda k;
	 * H += A A^T = x^T x, lower triangle */
	const float one = 1.0f;
	int rc = x3_gpu_blaserr(cublasSsyrk(h->blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, (int)h->k,
	                             (int)rows, &one, x_d, (int)h->k, &one, h->H_d, (int)h->k),
	                 "ssyrk");
	if (!rc)
		h->count += (double)rows;
	return rc;
}

int x3_gpu_hessian_add(x3_gpu_hessian *h, const float *x, int64_t rows)
{
	if (!h || (rows > 0 && !x) || rows < 0)
		return x3_err(X3_EINVAL, "hessian: bad arguments");
	for (int64_t i = 0; i < rows * h->k; i++)
		if (!isfinite(x[i]))
			return x3_err(X3_ENUM, "hessian: row %lld column %lld is not finite",
			              (long long)(i / h->k), (long long)(i % h->k));
	int rc = X3_OK;
	if (!h->x_d && rows > 0)
		rc = x3_gpu_alloc((void **)&h->x_d, (size_t)(HROWS * h->k) * sizeof(float));
	for (int64_t r0 = 0; !rc && r0 < rows; r0 += HROWS) {
		const int64_t nr = rows - r0 < HROWS ? rows - r0 : HROWS;
		rc = x3_gpu_upload(h->x_d, x + r0 * h->k, (size_t)(nr * h->k) * sizeof(float));
		if (!rc)
			rc = x3_gpu_hessian_add_d(h, h->x_d, nr);
	}
	return rc;
}

int x3_gpu_hessian_get(x3_gpu_hessian *h, float *H, double *count)
{
	if (!h || !H)
		return x3_err(X3_EINVAL, "hessian: NULL argument");
	int rc = x3_gpu_cuerr(x3k_symmetrize(h->H_d, h->k, 1, NULL), "symmetrize launch");
	if (!rc)
		rc = x3_gpu_download(H, h->H_d, (size_t)(h->k * h->k) * sizeof(float));
	if (!rc && count)
		*count = h->count;
	return rc;
}

/* ---- block LDL ------------------------------------------------------------ */

/* A_d (k, k) in place. X3_ENUM when not positive definite. */
static int block_ldl_d(cusolverDnHandle_t sol, float *A_d, int64_t k)
{
	int lwork = 0, info = 0;
	float *work = NULL;
	int *info_d = NULL, *bad_d = NULL;
	/* row-major lower L (A = L L^T) is column-major upper U = L^T with
	 * A = U^T U, as in x3_block_ldl */
	int rc = solvererr(cusolverDnSpotrf_bufferSize(sol, CUBLAS_FILL_MODE_UPPER, (int)k, A_d,
	                                               (int)k, &lwork), "spotrf buffer size");
	if (!rc)
		rc = x3_gpu_alloc((void **)&work, (size_t)(lwork > 0 ? lwork : 1) * sizeof(float));
	if (!rc)
		rc = x3_gpu_alloc((void **)&info_d, 2 * sizeof(int));
	if (!rc)
		rc = x3_gpu_memset(info_d, 0, 2 * sizeof(int));
	bad_d = info_d + 1;
	if (!rc)
		rc = solvererr(cusolverDnSpotrf(sol, CUBLAS_FILL_MODE_UPPER, (int)k, A_d, (int)k, work,
		                                lwork, info_d), "spotrf");
	if (!rc)
		rc = x3_gpu_download(&info, info_d, sizeof info);
	if (!rc && info != 0)
		rc = x3_err(X3_ENUM, "cholesky failed (%s %d)",
		            info > 0 ? "leading minor not positive definite at" : "bad argument", info);
	if (!rc)
		rc = x3_gpu_cuerr(x3k_block_ldl_normalize(A_d, k, bad_d, NULL), "ldl normalize launch");
	int bad = 0;
	if (!rc)
		rc = x3_gpu_download(&bad, bad_d, sizeof bad);
	if (!rc && bad)
		rc = x3_err(X3_ENUM, "cholesky gave a non-positive pivot");
	x3_gpu_free(work);
	x3_gpu_free(info_d);
	return rc;
}

int x3_gpu_block_ldl(float *A, int64_t k)
{
	if (k <= 0 || k % 16 || k / 16 > 65535)
		return x3_err(X3_EINVAL, "block LDL: size %lld is not a multiple of 16", (long long)k);
	if (!A)
		return x3_err(X3_EINVAL, "block LDL: NULL matrix");
	if (!x3_gpu_dev_available())
		return X3_EUNSUP;
	cusolverDnHandle_t sol = NULL;
	float *A_d = NULL;
	const size_t b = (size_t)(k * k) * sizeof(float);
	int rc = solvererr(cusolverDnCreate(&sol), "create handle");
	if (!rc)
		rc = x3_gpu_alloc((void **)&A_d, b);
	if (!rc)
		rc = x3_gpu_upload(A_d, A, b);
	if (!rc)
		rc = block_ldl_d(sol, A_d, k);
	if (!rc)
		rc = x3_gpu_download(A, A_d, b);
	for (int64_t i = 0; !rc && i < k * k; i++)
		if (!isfinite(A[i]))
			rc = x3_err(X3_ENUM, "block LDL produced non-finite values");
	x3_gpu_free(A_d);
	if (sol)
		cusolverDnDestroy(sol);
	return rc;
}

int x3_gpu_block_ldl_retry(float *H, int64_t k, int max_retries, float *L, int *retries)
{
	if (!H || !L || !retries || max_retries < 0)
		return x3_err(X3_EINVAL, "block LDL: bad arguments");
	*retries = 0;
	for (;;) {
		memcpy(L, H, (size_t)(k * k) * sizeof(float));
		int rc = x3_gpu_block_ldl(L, k);
		if (rc != X3_ENUM)
			return rc;
		if (*retries == max_retries)
			return x3_errprefix(X3_ENUM, "not positive definite after %d damping retries",
			                    max_retries);
		/* exl3(5) §9.1 step 7: add 2*sigma_reg*mean(diag(H)) and retry */
		double s = 0;
		for (int64_t i = 0; i < k; i++)
			s += H[i * k + i];
		const float add = (float)(2 * SIGMA_REG * (s / (double)k));
		for (int64_t i = 0; i < k; i++)
			H[i * k + i] += add;
		(*retries)++;
	}
}

/* ---- LDLQ ------------------------------------------------------------------ */

int x3_gpu_ldlq(const float *W, int64_t k, int64_t n, const float *L, int K, int cb,
                uint16_t *states, float *Q)
{
	if (K < 1 || K > 8)
		return x3_err(X3_EINVAL, "K=%d is outside 1..8", K);
	if (cb < 0 || cb >= X3_CB_COUNT)
		return x3_err(X3_EINVAL, "ldlq: bad codebook id %d", cb);
	if (k <= 0 || n <= 0 || k % QSPAN || n % 16)
		return x3_err(X3_EINVAL, "ldlq: bad shape %lldx%lld", (long long)k, (long long)n);
	if (!W || !states || !Q)
		return x3_err(X3_EINVAL, "ldlq: NULL argument");
	if (!x3_gpu_dev_available())
		return X3_EUNSUP;
	const int64_t tn = n / 16;
	float *W_d = NULL, *L_d = NULL, *E_d = NULL, *P_d = NULL, *X_d = NULL, *T_d = NULL,
	      *V_d = NULL, *Q_d = NULL;
	uint16_t *S_d = NULL;
	cublasHandle_t blas = NULL;
	const size_t kn = (size_t)(k * n) * sizeof(float);
	int rc = x3_gpu_blaserr(cublasCreate(&blas), "create handle");
	if (!rc)
		rc = x3_gpu_alloc((void **)&W_d, kn);
	if (!rc)
		rc = x3_gpu_alloc((void **)&Q_d, kn);
	if (!rc)
		rc = x3_gpu_alloc((void **)&X_d, (size_t)(16 * n) * sizeof(float));
	if (!rc)
		rc = x3_gpu_alloc((void **)&T_d, (size_t)(16 * n) * sizeof(float));
	if (!rc)
		rc = x3_gpu_alloc((void **)&V_d, (size_t)(16 * n) * sizeof(float));
	if (!rc)
		rc = x3_gpu_alloc((void **)&S_d, (size_t)(k * n) * sizeof(uint16_t));
	if (!rc && L) {
		rc = x3_gpu_alloc((void **)&L_d, (size_t)(k * k) * sizeof(float));
		if (!rc)
			rc = x3_gpu_alloc((void **)&E_d, kn);
		if (!rc)
			rc = x3_gpu_alloc((void **)&P_d, (size_t)(QSPAN * n) * sizeof(float));
		if (!rc)
			rc = x3_gpu_upload(L_d, L, (size_t)(k * k) * sizeof(float));
	}
	if (!rc)
		rc = x3_gpu_upload(W_d, W, kn);
	/* Viterbi scratch sized for one block row of tiles */
	struct x3k_viterbi_plan plan;
	void *vs = NULL;
	unsigned long long *bad_d = NULL;
	int nblocks = 0;
	if (!rc)
		rc = x3_gpu_cuerr(x3k_viterbi_plan(K, cb, &plan), "viterbi plan");
	if (!rc) {
		int dev, sms;
		rc = x3_gpu_cuerr(cudaGetDevice(&dev), "get device");
		if (!rc)
			rc = x3_gpu_cuerr(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SMs");
		int64_t nb = (int64_t)plan.blocks_per_sm * (rc ? 1 : sms);
		if (nb > tn)
			nb = tn;
		nblocks = (int)nb;
		if (!rc)
			rc = x3_gpu_alloc(&vs, (size_t)nblocks * plan.scratch_per_block);
		if (!rc)
			rc = x3_gpu_alloc((void **)&bad_d, sizeof *bad_d);
	}
	const float one = 1.0f, zero = 0.0f;
	for (int64_t s1 = k; !rc && s1 > 0; s1 -= QSPAN) {
		const int64_t s0 = s1 - QSPAN;
		/* P = L[s1:k, s0:s1]^T E[s1:k, :] (128 x n); row-major C = A^T B is
		 * column-major C^T = B^T A: gemm(N, T) on (E, ld n) and (L, ld k) */
		if (L && s1 < k)
			rc = x3_gpu_blaserr(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)n, QSPAN,
			                         (int)(k - s1), &one, E_d + s1 * n, (int)n,
			                         L_d + s1 * k + s0, (int)k, &zero, P_d, (int)n), "sgemm");
		else if (L)
			rc = x3_gpu_memset(P_d, 0, (size_t)(QSPAN * n) * sizeof(float));
		for (int64_t b1 = s1; !rc && b1 > s0; b1 -= 16) {
			const int64_t b0 = b1 - 16;
			rc = x3_gpu_cuerr(cudaMemcpy(X_d, W_d + b0 * n, (size_t)(16 * n) * sizeof(float),
			                      cudaMemcpyDeviceToDevice), "copy");
			if (!rc && L) {
				/* X = W_B + P_B + L[b1:s1, B]^T E[b1:s1, :] */
				rc = x3_gpu_cuerr(x3k_add(X_d, P_d + (b0 - s0) * n, 16 * n, NULL), "add launch");
				if (!rc && b1 < s1)
					rc = x3_gpu_blaserr(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)n, 16,
					                         (int)(s1 - b1), &one, E_d + b1 * n, (int)n,
					                         L_d + b1 * k + b0, (int)k, &one, X_d, (int)n),
					             "sgemm");
			}
			if (!rc)
				rc = x3_gpu_cuerr(x3k_tiles_gather(X_d, n, T_d, NULL), "gather launch");
			if (!rc)
				rc = x3_gpu_memset(bad_d, 0xff, sizeof *bad_d);
			if (!rc)
				rc = x3_gpu_cuerr(x3k_viterbi(K, cb, T_d, tn, S_d + (b0 / 16) * tn * 256, V_d, vs,
				                       nblocks, bad_d, NULL), "viterbi launch");
			unsigned long long bad = 0;
			if (!rc)
				rc = x3_gpu_download(&bad, bad_d, sizeof bad);
			if (!rc && bad != ~0ull)
				rc = x3_err(X3_ENUM, "ldlq: rows %lld..%lld tile %lld: a target is not finite "
				            "or exceeds 1e16", (long long)b0, (long long)(b1 - 1),
				            (long long)(bad / 256));
			if (!rc)
				rc = x3_gpu_cuerr(x3k_tiles_scatter(V_d, W_d + b0 * n, n, Q_d + b0 * n,
				                             L ? E_d + b0 * n : NULL, NULL), "scatter launch");
		}
	}
	if (!rc)
		rc = x3_gpu_download(Q, Q_d, kn);
	if (!rc)
		rc = x3_gpu_download(states, S_d, (size_t)(k * n) * sizeof(uint16_t));
	x3_gpu_free(W_d);
	x3_gpu_free(L_d);
	x3_gpu_free(E_d);
	x3_gpu_free(P_d);
	x3_gpu_free(X_d);
	x3_gpu_free(T_d);
	x3_gpu_free(V_d);
	x3_gpu_free(Q_d);
	x3_gpu_free(S_d);
	x3_gpu_free(vs);
	x3_gpu_free(bad_d);
	if (blas)
		cublasDestroy(blas);
	return rc;
}
