/* quant_hess.c: Hessian preparation (exl3(5) §9.1): the fallback without
 * a Hessian, the blocked Cholesky and block LDL, the damping (sigma_reg),
 * and x3_qhess_finalize (normalize, damp, rotate, factor, retry). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <lapacke.h>
#include <omp.h>
#include "blas.h"
#include "codec.h"
#include "quant.h"
#include "quant_impl.h"
#include "pack.h"

/* ---- Hessian ----------------------------------------------------------- */

void x3_qhess_free(x3_qhess *h)
{
	if (!h)
		return;
	free(h->sign);
	free(h->diag);
	free(h->H);
	free(h->L);
	free(h);
}

static x3_qhess *qhess_alloc(int64_t k, const float *sign)
{
	x3_qhess *h = calloc(1, sizeof *h);
	if (!h)
		return NULL;
	h->k = k;
	h->sign = xmalloc((size_t)k, sizeof(float));
	if (!h->sign) {
		free(h);
		return NULL;
	}
	memcpy(h->sign, sign, (size_t)k * sizeof(float));
	return h;
}

int x3_qhess_none(int64_t k, const float *sign, x3_qhess **out)
{
	*out = NULL;
	if (k <= 0 || k % X3_QPAD)
		return x3_err(X3_EINVAL, "hessian size %lld is not a positive multiple of 128", (long long)k);
	x3_qhess *h = qhess_alloc(k, sign);
	if (!h)
		return x3_err(X3_ENOMEM, "out of memory");
	h->fallback = 1;
	snprintf(h->why, sizeof h->why, "%s", X3_FALLBACK_NO_HESSIAN);
	*out = h;
	return X3_OK;
}

/* Fall back: drop H and L, keep the signs (and diag if any). */
static void qhess_fallback(x3_qhess *h, const char *why)
{
	free(h->H);
	free(h->L);
	h->H = h->L = NULL;
	h->fallback = 1;
	snprintf(h->why, sizeof h->why, "%s", why);
}

/* The Cholesky factor of x3_block_ldl, blocked by hand so that it runs on
 * every OpenMP thread and its bits still depend on nothing but A and the
 * BLAS kernel (blas.h): right-looking, panels of X3_LDL_NB columns from the
 * top left; per panel the diagonal block by LAPACK's potrf, the rows below
 * it by trsm in blocks of X3_LDL_NB rows, and the trailing lower triangle
 * by one sgemm per block of X3_LDL_NB rows, as wide as its diagonal block,
 * each call on one BLAS thread, the calls' shapes fixed by k alone. OpenBLAS
 * threads potrf itself with a blocking that follows the thread count, and
 * its single-threaded potrf left every core but one idle: an 8B down_proj's
 * 14336x14336 factor took 10-12 s of had-rotate's 22 s on one core of the
 * 2-core Zen 3 host. Up to X3_LDL_NB it is a single potrf call; above,
 * the rounding differs from a single call's. A is
 * row-major, its lower triangle read (the upper is scratch); on return
 * the lower triangle holds L (A = L Lᵀ); *bad is the 1-based column where
 * a leading minor is not positive definite, 0 if none, LAPACK's negative
 * argument code if potrf refused its input. */
#define X3_LDL_NB 256

static void chol_blocked(float *A, int64_t k, int64_t *bad)
{
	*bad = 0;
	for (int64_t b = 0; b < k; b += X3_LDL_NB) {
		const int64_t nb = k - b < X3_LDL_NB ? k - b : X3_LDL_NB, r0 = b + nb, m = k - r0;
		/* row-major lower at (b, b) is column-major upper: no transposed copy */
		lapack_int info = LAPACKE_spotrf(LAPACK_COL_MAJOR, 'U', (lapack_int)nb, A + b * k + b,
		                                 (lapack_int)k);
		if (info != 0) {
			*bad = info > 0 ? b + info : info;
			return;
		}
		if (m == 0)
			break;
		const int64_t R = X3_LDL_NB, nr = (m + R - 1) / R;
		/* the panel below: X L11ᵀ = A21 */
		#pragma omp parallel for schedule(dynamic, 1) if(nr > 1)
		for (int64_t i = 0; i < nr; i++) {
			int64_t i0 = r0 + i * R, mi = k - i0 < R ? k - i0 : R;
			cblas_strsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, (int)mi,
			            (int)nb, 1.0f, A + b * k + b, (int)k, A + i0 * k + b, (int)k);
		}
		/* A22 -= X Xᵀ on and below the diagonal blocks: row block i against
		 * row blocks 0..i, the widest first */
		#pragma omp parallel for schedule(dynamic, 1) if(nr > 1)
		for (int64_t ii = 0; ii < nr; ii++) {
			int64_t i = nr - 1 - ii, i0 = r0 + i * R, mi = k - i0 < R ? k - i0 : R;
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)mi, (int)(i0 + mi - r0),
			            (int)nb, -1.0f, A + i0 * k + b, (int)k, A + r0 * k + b, (int)k, 1.0f,
			            A + i0 * k + r0, (int)k);
		}
	}
}

int x3_block_ldl(float *A, int64_t k)
{
	if (k <= 0 || k % X3_QBLOCK)
		return x3_err(X3_EINVAL, "block LDL: size %lld is not a multiple of 16", (long long)k);
	/* each BLAS call on one thread (blas.h): the result does not depend on
	 * the thread count */
	int nthr = x3_blas_serial_begin();
	int64_t bad;
	chol_blocked(A, k, &bad);
	if (bad != 0) {
		x3_blas_serial_end(nthr);
		if (bad == -4)   /* LAPACKE's check of its 4th argument, the matrix */
			return x3_err(X3_ENUM, "cholesky failed (non-finite values in the matrix)");
		return x3_err(X3_ENUM, "cholesky failed (%s %lld)",
		              bad > 0 ? "leading minor not positive definite at" : "bad argument",
		              (long long)bad);
	}
	for (int64_t i = 0; i < k; i++)
		if (!isfinite(A[i * k + i]) || A[i * k + i] <= 0) {
			x3_blas_serial_end(nthr);
			return x3_err(X3_ENUM, "cholesky gave a non-positive pivot at %lld", (long long)i);
		}
	/* L <- L blockdiag(D_i)^-1, D_i the 16x16 diagonal blocks of L: the
	 * column blocks are independent, one call each */
	#pragma omp parallel for schedule(dynamic, 8) if(k > 512)
	for (int64_t b = 0; b < k; b += X3_QBLOCK) {
		float D[X3_QBLOCK * X3_QBLOCK];
		for (int r = 0; r < X3_QBLOCK; r++)
			for (int c = 0; c < X3_QBLOCK; c++)
				D[r * X3_QBLOCK + c] = c <= r ? A[(b + r) * k + b + c] : 0.0f;
		cblas_strsm(CblasRowMajor, CblasRight, CblasLower, CblasNoTrans, CblasNonUnit,
		            (int)(k - b), X3_QBLOCK, 1.0f, D, X3_QBLOCK, A + b * k + b, (int)k);
	}
	x3_blas_serial_end(nthr);
	/* zero the diagonal blocks (now I up to rounding) and everything above */
	for (int64_t i = 0; i < k; i++) {
		int64_t c0 = i / X3_QBLOCK * X3_QBLOCK;
		memset(A + i * k + c0, 0, (size_t)(k - c0) * sizeof(float));
	}
	for (int64_t i = 0; i < k * k; i++)
		if (!isfinite(A[i]))
			return x3_err(X3_ENUM, "block LDL produced non-finite values");
	return X3_OK;
}

/* sigma_reg of the damping (x3_quant_set_sigma_reg) */
static double sigma_reg = X3_SIGMA_REG;

int x3_quant_set_sigma_reg(double s)
{
	if (!(s > 0 && s <= 1))
		return x3_err(X3_EINVAL, "sigma_reg %g is outside (0, 1]", s);
	sigma_reg = s;
	return X3_OK;
}

double x3_quant_sigma_reg(void)
{
	return sigma_reg;
}

/* H <- Hb diag(s) H diag(s) Hb (exl3(5) §9.1 step 6) */
static int rotate_hessian(float *H, int64_t k, const float *s)
{
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < k; j++)
			H[i * k + j] *= s[j];
	int rc = x3q_had_rows(H, k, k);
	if (rc)
		return rc;
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < k; j++)
			H[i * k + j] *= s[i];
	return x3q_had_cols(H, k, k);
}

static double diag_mean(const float *H, int64_t k)
{
	double s = 0;
	for (int64_t i = 0; i < k; i++)
		s += H[i * k + i];
	return s / (double)k;
}

int x3_qhess_finalize(const float *Hin, int64_t kh, int64_t k, double count,
                      const float *sign, x3_qhess **out)
{
	*out = NULL;
	if (k <= 0 || k % X3_QPAD)
		return x3_err(X3_EINVAL, "hessian size %lld is not a positive multiple of 128", (long long)k);
	if (kh <= 0 || kh > k)
		return x3_err(X3_EINVAL, "hessian is %lldx%lld, expected at most %lldx%lld",
		              (long long)kh, (long long)kh, (long long)k, (long long)k);
	if ((uint64_t)k > (uint64_t)1 << 31 || (size_t)k > SIZE_MAX / sizeof(float) / (size_t)k)
		return x3_err(X3_ENOMEM, "hessian size %lld too large", (long long)k);
	x3_qhess *h = qhess_alloc(k, sign);
	if (!h)
		return x3_err(X3_ENOMEM, "out of memory");
	h->count = count;
	if (!(count > 0) || !isfinite(count)) {
		qhess_fallback(h, "sample count is 0");
		*out = h;
		return X3_OK;
	}
	float *H = h->H = xcalloc((size_t)(k * k), sizeof(float));
	h->diag = xmalloc((size_t)k, sizeof(float));
	if (!H || !h->diag) {
		x3_qhess_free(h);
		return x3_err(X3_ENOMEM, "out of memory for a %lldx%lld hessian", (long long)k, (long long)k);
	}
	/* normalize by count, symmetrize, pad with zeros; in 64x64 tiles of the
	 * lower triangle, which the column reads of Hin need at widths like
	 * 14336 (each element computed as in a plain loop over (i, j): the
	 * order of the tiles changes no bit) */
	int64_t bad = 0;
	#pragma omp parallel for schedule(dynamic, 1) reduction(+ : bad) if(kh > 256)
	for (int64_t ib = 0; ib < kh; ib += 64)
		for (int64_t jb = 0; jb <= ib; jb += 64)
			for (int64_t i = ib; i < ib + 64 && i < kh; i++)
				for (int64_t j = jb; j < jb + 64 && j <= i; j++) {
					double a = Hin[i * kh + j], b = Hin[j * kh + i];
					if (!isfinite(a) || !isfinite(b)) {
						bad++;
						continue;
					}
					float v = (float)((a + b) * 0.5 / count);
					H[i * k + j] = H[j * k + i] = v;
				}
	double dm = diag_mean(H, k);
	h->diag_mean = dm;
	if (bad) {
		char why[120];
		snprintf(why, sizeof why, "hessian has %lld non-finite entries", (long long)bad);
		qhess_fallback(h, why);
		dm = 0;
	} else if (!isfinite(dm) || dm < 1e-20) {
		char why[120];
		snprintf(why, sizeof why, "mean diagonal %g is %s", dm,
		         isfinite(dm) ? "too small" : "not finite");
		qhess_fallback(h, why);
		dm = isfinite(dm) ? dm : 0;
	}
	/* damping, kept (before rotation) for the out_scales auto decision */
	if (h->H)
		for (int64_t i = 0; i < k; i++)
			H[i * k + i] += (float)(sigma_reg * dm);
	for (int64_t i = 0; i < k; i++)
		h->diag[i] = h->H ? H[i * k + i] : (float)(sigma_reg * dm);
	if (h->fallback) {
		*out = h;
		return X3_OK;
	}
	int rc = rotate_hessian(H, k, sign);
	if (rc) {
		x3_qhess_free(h);
		return x3_errprefix(rc, "hessian rotation");
	}
	h->L = xmalloc((size_t)(k * k), sizeof(float));
	if (!h->L) {
		x3_qhess_free(h);
		return x3_err(X3_ENOMEM, "out of memory for a %lldx%lld LDL factor", (long long)k, (long long)k);
	}
	if (x3q_gpu) {
		/* the same loop on the device (cuSOLVER SPOTRF) */
		rc = x3q_gpu->block_ldl_retry(H, k, X3_LDL_RETRIES, h->L, &h->retries);
		if (rc == X3_ENUM) {
			char why[200];
			snprintf(why, sizeof why, "not positive definite after %d damping retries (%s)",
			         X3_LDL_RETRIES, x3_errmsg());
			h->retries = X3_LDL_RETRIES;
			qhess_fallback(h, why);
		} else if (rc) {
			x3_qhess_free(h);
			return x3_errprefix(rc, "block LDL");
		}
		*out = h;
		return X3_OK;
	}
	for (;;) {
		memcpy(h->L, H, (size_t)(k * k) * sizeof(float));
		if (x3_block_ldl(h->L, k) == X3_OK)
			break;
		if (h->retries == X3_LDL_RETRIES) {
			char why[200];
			snprintf(why, sizeof why, "not positive definite after %d damping retries (%s)",
			         X3_LDL_RETRIES, x3_errmsg());
			qhess_fallback(h, why);
			break;
		}
		/* exl3(5) §9.1 step 7: add 2*sigma_reg*mean(diag(H)) and retry */
		float add = (float)(2 * sigma_reg * diag_mean(H, k));
		for (int64_t i = 0; i < k; i++)
			H[i * k + i] += add;
		h->retries++;
	}
	*out = h;
	return X3_OK;
}
