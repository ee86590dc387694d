/* quant.c: the EXL3 quantizer on CPU, reference C (exl3(5) §9.2, §9).
 * Dense algebra goes through BLAS/LAPACK; the tile quantizer is the
 * Viterbi encoder of codec.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <cblas.h>
#include <lapacke.h>
#include <omp.h>
#include <xxhash.h>
#include "blas.h"
#include "codec.h"
#include "device.h"
#include "quant.h"

/* -1.24371088: RMS of the 3INST codebook, negated (exl3(5) §9.2 step 7) */
#define NEG_CB_SCALE (-1.24371088f)

static void *xcalloc(size_t n, size_t size)
{
	if (n == 0)
		n = 1;
	return calloc(n, size);
}

static void *xmalloc(size_t n, size_t size)
{
	if (n == 0)
		n = 1;
	if (size && n > SIZE_MAX / size)
		return NULL;
	return malloc(n * size);
}

int x3_out_scales_parse(const char *s, int *policy)
{
	static const char *names[] = { "always", "never", "auto" };
	for (int i = 0; i < 3; i++)
		if (!strcasecmp(s, names[i])) {
			*policy = i;
			return X3_OK;
		}
	return x3_err(X3_EINVAL, "unknown out_scales policy '%s' (always, never, auto)", s);
}

const char *x3_out_scales_name(int policy)
{
	switch (policy) {
	case X3_OUT_SCALES_ALWAYS: return "always";
	case X3_OUT_SCALES_NEVER: return "never";
	case X3_OUT_SCALES_AUTO: return "auto";
	}
	return "?";
}

void x3_quant_signs(uint64_t seed, const char *name, int64_t n, float *sign)
{
	x3_rng r;
	x3_rng_seed(&r, seed, x3_rng_stream_of(name ? name : ""));
	uint64_t bits = 0;
	for (int64_t i = 0; i < n; i++) {
		if ((i & 63) == 0)
			bits = x3_rng_u64(&r);
		sign[i] = (bits >> (i & 63)) & 1 ? -1.0f : 1.0f;
	}
}

void x3_quant_signs_draw(uint64_t seed, int draw, const char *name, int64_t n, float *sign)
{
	if (draw <= 0) {
		x3_quant_signs(seed, name, n, sign);
		return;
	}
	char nm[1200];
	snprintf(nm, sizeof nm, "%s#%d", name ? name : "", draw);
	x3_quant_signs(seed, nm, n, sign);
}

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
	snprintf(h->why, sizeof h->why, "no hessian");
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
 * 2-core Zen 3 host. Up to X3_LDL_NB it is the one potrf call as before
 * (the same bits); above, the rounding differs from one call's. A is
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

/* Where the Hadamard rotations and the block LDL of x3_qhess_finalize and
 * x3_regularize run (x3_quant_set_device): the GPU backend's table, or
 * NULL for the CPU (like x3_viterbi_set_backend). */
static const x3_gpu *quant_gpu;

int x3_quant_set_device(int dev)
{
	if (dev != X3_DEVICE_CPU && dev != X3_DEVICE_CUDA)
		return x3_err(X3_EINVAL, "quantizer device %s (cpu or cuda expected)",
		              x3_device_name(dev));
	const x3_gpu *g = NULL;
	if (dev == X3_DEVICE_CUDA && x3_gpu_open(&g))
		return X3_EUNSUP;
	quant_gpu = g;
	return X3_OK;
}

/* Where LDLQ runs (x3_quant_set_ldlq_device): the GPU backend, or NULL */
static const x3_gpu *ldlq_gpu;

int x3_quant_set_ldlq_device(int dev)
{
	if (dev != X3_DEVICE_CPU && dev != X3_DEVICE_CUDA)
		return x3_err(X3_EINVAL, "LDLQ device %s (cpu or cuda expected)", x3_device_name(dev));
	const x3_gpu *g = NULL;
	if (dev == X3_DEVICE_CUDA && x3_gpu_open(&g))
		return X3_EUNSUP;
	ldlq_gpu = g;
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

/* x3_had128_rows/cols on the quantizer's device */
static int had_rows(float *x, int64_t rows, int64_t cols)
{
	if (quant_gpu)
		return quant_gpu->had128_rows(x, rows, cols);
	x3_had128_rows(x, rows, cols);
	return X3_OK;
}

static int had_cols(float *x, int64_t rows, int64_t cols)
{
	if (quant_gpu)
		return quant_gpu->had128_cols(x, rows, cols);
	x3_had128_cols(x, rows, cols);
	return X3_OK;
}

/* H <- Hb diag(s) H diag(s) Hb (exl3(5) §9.1 step 6) */
static int rotate_hessian(float *H, int64_t k, const float *s)
{
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < k; j++)
			H[i * k + j] *= s[j];
	int rc = had_rows(H, k, k);
	if (rc)
		return rc;
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < k; j++)
			H[i * k + j] *= s[i];
	return had_cols(H, k, k);
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
	 * 14336 (each element as before: the same bits) */
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
	if (quant_gpu) {
		/* the same loop on the device (cuSOLVER SPOTRF) */
		rc = quant_gpu->block_ldl_retry(H, k, X3_LDL_RETRIES, h->L, &h->retries);
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

static int cmp_desc(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

int x3_out_scales_auto(const float *d, int64_t k, double *skew)
{
	double *s = xmalloc((size_t)k, sizeof(double));
	if (!s) {
		*skew = 0;
		return 1;
	}
	for (int64_t i = 0; i < k; i++)
		s[i] = d[i] > 0 ? sqrt((double)d[i]) : 0.0;
	qsort(s, (size_t)k, sizeof *s, cmp_desc);
	double top = 0, all = 0;
	for (int64_t i = 0; i < k; i++) {
		if (i < k / 50)
			top += s[i];
		all += s[i];
	}
	free(s);
	*skew = all > 0 ? top / all : 0;
	return *skew < 0.15;
}

/* ---- regularization ---------------------------------------------------- */

void x3_qweight_free(x3_qweight *w)
{
	if (!w)
		return;
	free(w->W);
	free(w->su);
	free(w->sv);
	free(w);
}

x3_qweight *x3_qweight_wrap(int64_t k0, int64_t n0, int64_t k, int64_t n,
                            float *W, float *su, float *sv)
{
	x3_qweight *w = calloc(1, sizeof *w);
	if (!w)
		return NULL;
	w->k0 = k0, w->n0 = n0, w->k = k, w->n = n;
	w->W = W, w->su = su, w->sv = sv;
	return w;
}

int x3_regularize(const float *Whf, int64_t n0, int64_t k0, const x3_qhess *h,
                  const float *sign_v, int policy, x3_qweight **out)
{
	*out = NULL;
	if (n0 <= 0 || k0 <= 0)
		return x3_err(X3_EINVAL, "empty weight %lldx%lld", (long long)n0, (long long)k0);
	int64_t k = x3_pad128(k0), n = x3_pad128(n0);
	if (h->k != k)
		return x3_err(X3_EINVAL, "hessian is %lldx%lld but the weight has %lld inputs (padded %lld)",
		              (long long)h->k, (long long)h->k, (long long)k0, (long long)k);
	if ((size_t)k > SIZE_MAX / sizeof(float) / (size_t)n)
		return x3_err(X3_ENOMEM, "weight too large");
	float *W = xcalloc((size_t)(k * n), sizeof(float));
	float *su = xmalloc((size_t)k, sizeof(float));
	float *sv = xmalloc((size_t)n, sizeof(float));
	double *c = xcalloc((size_t)n, sizeof(double));
	x3_qweight *w = x3_qweight_wrap(k0, n0, k, n, W, su, sv);
	if (!W || !su || !sv || !c || !w) {
		free(c);
		if (w)
			x3_qweight_free(w);
		else
			free(W), free(su), free(sv);
		return x3_err(X3_ENOMEM, "out of memory for a %lldx%lld weight", (long long)k, (long long)n);
	}
	int rc = X3_OK;
	/* fp16 rounding as ExLlamaV3 loads it, transpose, pad */
	for (int64_t o = 0; o < n0 && rc == X3_OK; o++)
		for (int64_t i = 0; i < k0; i++) {
			float v = Whf[o * k0 + i];
			if (!isfinite(v)) {
				rc = x3_err(X3_ENUM, "non-finite value %g at [%lld][%lld]", v, (long long)o, (long long)i);
				break;
			}
			float f = x3_round_f16(v);
			if (!isfinite(f)) {
				rc = x3_err(X3_ENUM, "value %g at [%lld][%lld] overflows fp16", v, (long long)o, (long long)i);
				break;
			}
			W[i * n + o] = f;
		}
	if (rc) {
		free(c);
		x3_qweight_free(w);
		return rc;
	}
	/* 1. output-channel RMS, normalized to mean 1 */
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++)
			c[j] += (double)W[i * n + j] * W[i * n + j];
	double cmean = 0;
	for (int64_t j = 0; j < n; j++) {
		c[j] = sqrt(c[j] / (double)k);
		cmean += c[j];
	}
	cmean /= (double)n;
	w->zeros = !(cmean > 1e-30);
	if (!w->zeros)
		for (int64_t j = 0; j < n; j++)
			c[j] /= cmean;
	int apply;
	if (policy == X3_OUT_SCALES_ALWAYS)
		apply = 1;
	else if (policy == X3_OUT_SCALES_NEVER)
		apply = 0;
	else if (h->fallback || !h->diag)
		apply = 0;
	else {
		double skew;
		apply = x3_out_scales_auto(h->diag, k, &skew);
	}
	/* an all-zero weight must come out exactly zero: svh = 0 does that */
	if (w->zeros)
		apply = 1;
	w->out_scales = apply;
	/* 2.-4. output scales */
	for (int64_t j = 0; j < n; j++) {
		int zero = fabs(c[j]) < 1e-30;
		if (apply)
			sv[j] = sign_v[j] * (zero ? 0.1f : (float)c[j]) + 1e-10f;
		else
			sv[j] = sign_v[j];
		c[j] = zero; /* reuse: zero-column flag */
	}
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++)
			W[i * n + j] /= sv[j];
	for (int64_t j = 0; j < n; j++)
		if (c[j] != 0)
			sv[j] = 0;
	/* 5. right Hadamard */
	if ((rc = had_rows(W, k, n))) {
		free(c);
		x3_qweight_free(w);
		return x3_errprefix(rc, "weight rotation");
	}
	/* 6.-8. input-channel RMS, rows normalized to the codebook RMS */
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++) {
		double s = 0;
		for (int64_t j = 0; j < n; j++)
			s += (double)W[i * n + j] * W[i * n + j];
		float ri = (float)sqrt(s / (double)n);
		if (ri < 1e-30f)
			ri = 0.1f;
		su[i] = h->sign[i] * ri / NEG_CB_SCALE + 1e-10f;
		for (int64_t j = 0; j < n; j++)
			W[i * n + j] /= su[i];
	}
	/* 9. left Hadamard */
	if ((rc = had_cols(W, k, n))) {
		free(c);
		x3_qweight_free(w);
		return x3_errprefix(rc, "weight rotation");
	}
	free(c);
	*out = w;
	return X3_OK;
}

/* ---- scale search ------------------------------------------------------ */

int64_t x3_scale_sample_max(int64_t k, int64_t n)
{
	int64_t tk = k / 16, tn = n / 16, D = tk > tn ? tk : tn;
	int64_t nx = 3 * D / 16 > 8 ? 3 * D / 16 : 8;
	if (nx > (tk * tn + 1) / 2)
		nx = (tk * tn + 1) / 2;
	return 3 * D + 2 * nx;
}

/* tile (tr, tc) of W (k x n) in trellis order */
static void get_tile(const float *W, int64_t n, int64_t tr, int64_t tc, float *t)
{
	for (int i = 0; i < 256; i++) {
		int p = x3_tile_perm[i];
		t[i] = W[(tr * 16 + p / 16) * n + tc * 16 + p % 16];
	}
}

struct ms { double v; int64_t i; };

static int cmp_ms(const void *a, const void *b)
{
	const struct ms *x = a, *y = b;
	if (x->v != y->v)
		return x->v < y->v ? -1 : 1;
	return x->i < y->i ? -1 : x->i > y->i;
}

int64_t x3_scale_sample(const float *W, int64_t k, int64_t n, float *tiles)
{
	int64_t tk = k / 16, tn = n / 16, D = tk > tn ? tk : tn, m = 0;
	/* wrapped diagonal of width 3 */
	for (int64_t ii = 0; ii < D; ii++)
		for (int64_t ww = 0; ww < 3; ww++)
			get_tile(W, n, ii % tk, (ii + ww) % tn, tiles + 256 * m++);
	/* outlier insurance: the tiles of highest and lowest mean square */
	int64_t nx = 3 * D / 16 > 8 ? 3 * D / 16 : 8;
	if (nx > (tk * tn + 1) / 2)
		nx = (tk * tn + 1) / 2;
	struct ms *v = xmalloc((size_t)(tk * tn), sizeof *v);
	if (!v)
		return m;
	for (int64_t t = 0; t < tk * tn; t++) {
		int64_t tr = t / tn, tc = t % tn;
		double s = 0;
		for (int r = 0; r < 16; r++)
			for (int c = 0; c < 16; c++) {
				double x = W[(tr * 16 + r) * n + tc * 16 + c];
				s += x * x;
			}
		v[t].v = s / 256, v[t].i = t;
	}
	qsort(v, (size_t)(tk * tn), sizeof *v, cmp_ms);
	for (int64_t j = 0; j < nx; j++) {
		int64_t t = v[tk * tn - 1 - j].i;
		get_tile(W, n, t / tn, t % tn, tiles + 256 * m++);
	}
	for (int64_t j = 0; j < nx; j++) {
		int64_t t = v[j].i;
		get_tile(W, n, t / tn, t % tn, tiles + 256 * m++);
	}
	free(v);
	return m;
}

/* ---- encoding equal tiles once ---------------------------------------- */
/* The Viterbi result of a tile is a function of its 256 input values alone
 * (codec.h), so a batch encodes each distinct tile once and copies the
 * result to its repeats; the output is what encoding every tile gives.
 * Repeats are common where padding meets the Hadamard transform: a 128-block
 * whose upper half is zero comes out of the transform as two equal halves,
 * so a 64x64 weight padded to 128x128 is four copies of one 64x64 block,
 * and the scale search's sample often holds a tile twice. A memo can also
 * keep the results between batches (the scale search's coarse and fine
 * grids share a scale). */
struct tmemo {
	int64_t n, cap;      /* entries, entry capacity */
	int64_t nslot;       /* hash slots, a power of 2 */
	int64_t *slot;       /* entry index, -1 when free */
	uint64_t *hash;      /* (cap) */
	float *x, *v;        /* (cap, 256) input tile, decoded values */
	uint16_t *s;         /* (cap, 256) states */
};

static void tmemo_free(struct tmemo *m)
{
	free(m->slot), free(m->hash), free(m->x), free(m->v), free(m->s);
	memset(m, 0, sizeof *m);
}

/* Room for `more` new entries (the slots at most half full). */
static int tmemo_reserve(struct tmemo *m, int64_t more)
{
	int64_t need = m->n + more;
	if (need > m->cap) {
		int64_t cap = m->cap ? m->cap : 64;
		while (cap < need)
			cap *= 2;
		uint64_t *h = realloc(m->hash, (size_t)cap * sizeof *h);
		if (h)
			m->hash = h;
		float *x = realloc(m->x, (size_t)cap * 256 * sizeof *x);
		if (x)
			m->x = x;
		float *v = realloc(m->v, (size_t)cap * 256 * sizeof *v);
		if (v)
			m->v = v;
		uint16_t *s = realloc(m->s, (size_t)cap * 256 * sizeof *s);
		if (s)
			m->s = s;
		if (!h || !x || !v || !s)
			return X3_ENOMEM;
		m->cap = cap;
	}
	if (2 * need > m->nslot) {
		int64_t ns = m->nslot ? m->nslot : 128;
		while (ns < 2 * need)
			ns *= 2;
		int64_t *sl = malloc((size_t)ns * sizeof *sl);
		if (!sl)
			return X3_ENOMEM;
		for (int64_t i = 0; i < ns; i++)
			sl[i] = -1;
		for (int64_t e = 0; e < m->n; e++) {
			int64_t j = (int64_t)(m->hash[e] & (uint64_t)(ns - 1));
			while (sl[j] >= 0)
				j = (j + 1) & (ns - 1);
			sl[j] = e;
		}
		free(m->slot);
		m->slot = sl;
		m->nslot = ns;
	}
	return X3_OK;
}

/* Entry of tile t (256 floats, hash h), or -1 with *free_slot set. */
static int64_t tmemo_find(const struct tmemo *m, const float *t, uint64_t h, int64_t *free_slot)
{
	int64_t j = (int64_t)(h & (uint64_t)(m->nslot - 1));
	for (; m->slot[j] >= 0; j = (j + 1) & (m->nslot - 1)) {
		int64_t e = m->slot[j];
		if (m->hash[e] == h && !memcmp(m->x + e * 256, t, 256 * sizeof *t))
			return e;
	}
	*free_slot = j;
	return -1;
}

/* wall seconds of this thread's x3_viterbi_encode calls (x3_qresult.t_viterbi) */
static _Thread_local double vit_seconds;

/* x3_viterbi_encode of nt tiles x (states and values may be NULL), each
 * distinct tile encoded once; memo keeps the results for later calls (it
 * starts empty: {0}). */

static int encode_tiles(int K, int cb, const float *x, int64_t nt, uint16_t *states,
                        float *values, int threads, struct tmemo *memo, int64_t *count)
{
	int64_t *ent = xmalloc((size_t)nt, sizeof *ent);
	int rc = ent ? tmemo_reserve(memo, nt) : X3_ENOMEM;
	if (rc) {
		free(ent);
		return x3_err(X3_ENOMEM, "out of memory for %lld tiles", (long long)nt);
	}
	int64_t first = memo->n;   /* entries from here on are new: to encode */
	for (int64_t t = 0; t < nt; t++) {
		const float *xt = x + t * 256;
		uint64_t h = XXH3_64bits(xt, 256 * sizeof *xt);
		int64_t fs = 0, e = tmemo_find(memo, xt, h, &fs);
		if (e < 0) {
			e = memo->n++;
			memo->slot[fs] = e;
			memo->hash[e] = h;
			memcpy(memo->x + e * 256, xt, 256 * sizeof *xt);
		}
		ent[t] = e;
	}
	int64_t nnew = memo->n - first;
	if (count)
		*count += nnew;
	double tv = x3_now();
	rc = x3_viterbi_encode(K, cb, memo->x + first * 256, nnew, memo->s + first * 256,
	                       memo->v + first * 256, threads);
	vit_seconds += x3_now() - tv;
	if (rc) {
		/* the error names a tile of the batch as given */
		free(ent);
		return x3_viterbi_encode(K, cb, x, nt, states, values, threads);
	}
	for (int64_t t = 0; t < nt; t++) {
		if (states)
			memcpy(states + t * 256, memo->s + ent[t] * 256, 256 * sizeof *states);
		if (values)
			memcpy(values + t * 256, memo->v + ent[t] * 256, 256 * sizeof *values);
	}
	free(ent);
	return X3_OK;
}

/* mse(s) for ns scales on m tiles of stride `step` in src (one Viterbi
 * batch of ns*m tiles); *count += the tiles the Viterbi encoded */
static int eval_scales(const float *src, int64_t m, int64_t step, const double *s,
                       int ns, int K, int cb, int threads, struct tmemo *memo, double *mse,
                       int64_t *count)
{
	int64_t cnt = (m + step - 1) / step, nt = cnt * ns;
	float *x = xcalloc((size_t)(nt * 256), sizeof(float));
	float *q = xmalloc((size_t)(nt * 256), sizeof(float));
	if (!x || !q) {
		free(x), free(q);
		return x3_err(X3_ENOMEM, "out of memory in the scale search");
	}
	for (int j = 0; j < ns; j++)
		for (int64_t t = 0; t < cnt; t++)
			for (int i = 0; i < 256; i++)
				x[((j * cnt) + t) * 256 + i] = (float)(src[t * step * 256 + i] * s[j]);
	int rc = encode_tiles(K, cb, x, nt, NULL, q, threads, memo, count);
	if (rc == X3_OK)
		for (int j = 0; j < ns; j++) {
			double e = 0;
			for (int64_t t = 0; t < cnt; t++)
				for (int i = 0; i < 256; i++) {
					double d = q[((j * cnt) + t) * 256 + i] / s[j] - src[t * step * 256 + i];
					e += d * d;
				}
			mse[j] = e / (double)(cnt * 256);
		}
	free(x), free(q);
	return rc;
}

/* The coarse grid needs only its argmin, so a scale whose partial error
 * (the tiles summed in eval_scales' order) already exceeds a complete
 * scale's cannot win and is dropped (y = +inf): its final error is at least
 * the partial one. The argmin is eval_scales' exactly. The middle scale
 * (0.9; the optimum is usually near) is evaluated first, in full; then the
 * others together, a chunk of tiles at a time (one Viterbi batch per chunk,
 * of every scale still in the race). */
static int coarse_grid(const float *src, int64_t m, const double *s, int ns, int K, int cb,
                       int threads, struct tmemo *memo, double *y, int64_t *count)
{
	const int64_t step = 3, cnt = (m + step - 1) / step;
	const double N = (double)(cnt * 256);
	const int mid = (ns - 1) / 2;
	int rc = eval_scales(src, m, step, s + mid, 1, K, cb, threads, memo, y + mid, count);
	if (rc)
		return rc;
	int64_t chunk = 4 * (int64_t)(threads > 0 ? threads : omp_get_max_threads());
	if (chunk < (cnt + 7) / 8)
		chunk = (cnt + 7) / 8;
	if (chunk > cnt)
		chunk = cnt;
	float *x = xcalloc((size_t)(ns * chunk * 256), sizeof(float));
	float *q = xmalloc((size_t)(ns * chunk * 256), sizeof(float));
	double *e = xcalloc((size_t)ns, sizeof(double));
	int *alive = xmalloc((size_t)ns, sizeof(int));
	if (!x || !q || !e || !alive) {
		free(x), free(q), free(e), free(alive);
		return x3_err(X3_ENOMEM, "out of memory in the scale search");
	}
	int na = 0;
	for (int j = 0; j < ns; j++)
		if (j != mid)
			alive[na++] = j;
	for (int64_t t0 = 0; t0 < cnt && na > 0; t0 += chunk) {
		int64_t c = cnt - t0 < chunk ? cnt - t0 : chunk;
		for (int a = 0; a < na; a++)
			for (int64_t t = 0; t < c; t++)
				for (int i = 0; i < 256; i++)
					x[(a * c + t) * 256 + i] = (float)(src[(t0 + t) * step * 256 + i] * s[alive[a]]);
		if ((rc = encode_tiles(K, cb, x, na * c, NULL, q, threads, memo, count)))
			break;
		int keep = 0;
		for (int a = 0; a < na; a++) {
			int j = alive[a], dropped = 0;
			for (int64_t t = 0; t < c && !dropped; t++) {
				for (int i = 0; i < 256; i++) {
					double d = q[(a * c + t) * 256 + i] / s[j] - src[(t0 + t) * step * 256 + i];
					e[j] += d * d;
				}
				dropped = e[j] / N > y[mid];
			}
			if (dropped)
				y[j] = INFINITY;
			else
				alive[keep++] = j;
		}
		na = keep;
	}
	for (int a = 0; a < na; a++)
		y[alive[a]] = e[alive[a]] / N;
	free(x), free(q), free(e), free(alive);
	return rc;
}

/* The search encodes at most 10 ceil(m/3) + 5 m <= 9 m tiles for m sampled
 * tiles (coarse grid on every third, fine grid on all), and the encode
 * itself k n / 256 tiles. The full sample (3 max(k, n) / 16 + outliers)
 * grows with the longer side, not the area: a 128x128 weight has 64 tiles
 * and a 40-tile sample, so the search cost ~5 encodes of it, a 1024x1024
 * one ~27% of its encode. The cap keeps the search within 1/8 of the
 * encode, but at least X3_SCALE_MIN_TILES tiles (with 8, stories260K's mean
 * proxy error at K=4 rose 6%; with 16 it moved by <1%, within the noise). */
int64_t x3_scale_sample_cap(int64_t k, int64_t n)
{
	int64_t cap = (k / 16) * (n / 16) / (8 * 9);
	return cap > X3_SCALE_MIN_TILES ? cap : X3_SCALE_MIN_TILES;
}

int x3_scale_search(const float *W, int64_t k, int64_t n, int K, int cb,
                    int threads, double *g)
{
	return x3_scale_search_cap(W, k, n, K, cb, threads, x3_scale_sample_cap(k, n), g);
}

static int scale_search(const float *W, int64_t k, int64_t n, int K, int cb,
                        int threads, int64_t cap, double center, double *g, int64_t *count);

int x3_scale_search_cap(const float *W, int64_t k, int64_t n, int K, int cb,
                        int threads, int64_t cap, double *g)
{
	return scale_search(W, k, n, K, cb, threads, cap, 0, g, NULL);
}

/* The global scale a search would find, predicted from the RMS of its
 * sampled tiles: g RMS falls with K as c(K) = 0.90 * 0.965^(K - 3) (the
 * fit to full searches of stories260K's and a generated Llama's linears at
 * K = 2..6: g RMS 0.96/0.91/0.87/0.85/0.82 on average, within 2-10% of it
 * per tensor; real weights' heavier tails lower it, Gaussian ones raise it) */
static double scale_predict(const float *tiles, int64_t m, int K)
{
	double ss = 0;
	for (int64_t i = 0; i < m * 256; i++)
		ss += (double)tiles[i] * tiles[i];
	double rms = m > 0 ? sqrt(ss / (double)(m * 256)) : 0;
	return rms > 1e-12 ? 0.90 * pow(0.965, K - 3) / rms : 1.0;
}

/* x3_scale_search_cap; *count (may be NULL) += the tiles the Viterbi
 * encoded. center > 0: no coarse grid, the fine grid around center (a
 * scale found before on fewer tiles, refined on this search's sample);
 * center < 0: the same around scale_predict's scale */
static int scale_search(const float *W, int64_t k, int64_t n, int K, int cb,
                        int threads, int64_t cap, double center, double *g, int64_t *count)
{
	*g = 1.0;
	int64_t mmax = x3_scale_sample_max(k, n);
	float *tiles = xmalloc((size_t)(mmax * 256), sizeof(float));
	if (!tiles)
		return x3_err(X3_ENOMEM, "out of memory in the scale search");
	int64_t m = x3_scale_sample(W, k, n, tiles);
	/* over the cap: every (m/cap)-th sampled tile, in sample order (the
	 * diagonal and the outliers in proportion) */
	if (cap > 0 && m > cap) {
		for (int64_t i = 0; i < cap; i++) {
			int64_t j = (2 * i + 1) * m / (2 * cap);
			if (j != i)
				memcpy(tiles + 256 * i, tiles + 256 * j, 256 * sizeof *tiles);
		}
		m = cap;
	}
	struct tmemo memo = { 0 };
	double c = center < 0 ? scale_predict(tiles, m, K) : center;
	int rc, best;
	if (center == 0) {   /* coarse grid 0.1, 0.3, ..., 1.9 on every third sampled tile */
		double s[10], y[10];
		for (int i = 0; i < 10; i++)
			s[i] = 0.1 + 0.2 * i;
		if ((rc = coarse_grid(tiles, m, s, 10, K, cb, threads, &memo, y, count))) {
			free(tiles);
			tmemo_free(&memo);
			return rc;
		}
		best = 0;
		for (int i = 1; i < 10; i++)
			if (y[i] < y[best])
				best = i;
		c = s[best];
	}
	/* fine grid c + 0.075 (i - 2) on all sampled tiles; scales <= 0 (only
	 * around c = 0.1) are skipped */
	double fs[5], fy[5], ps[5], py[5];
	int np = 0, idx[5];
	for (int i = 0; i < 5; i++) {
		fs[i] = c + 0.075 * (i - 2);
		fy[i] = INFINITY;
		if (fs[i] > 1e-6) {
			idx[np] = i;
			ps[np++] = fs[i];
		}
	}
	rc = eval_scales(tiles, m, 1, ps, np, K, cb, threads, &memo, py, count);
	for (int j = 0; !rc && j < np; j++)
		fy[idx[j]] = py[j];
	best = 0;
	for (int i = 1; i < 5; i++)
		if (fy[i] < fy[best])
			best = i;
	/* a centre given from outside may be off by more than the grid: while
	 * its best is an end, slide the grid a step that way (at most
	 * X3_SCALE_WALK steps; the coarse grid's 0.2 spacing needs none) */
	for (int w = 0; !rc && center != 0 && w < X3_SCALE_WALK && (best == 4 || (best == 0 && fs[0] > 0.0875)); w++) {
		int up = best == 4;
		double ns = up ? fs[4] + 0.075 : fs[0] - 0.075, ny;
		if ((rc = eval_scales(tiles, m, 1, &ns, 1, K, cb, threads, &memo, &ny, count)))
			break;
		if (up) {
			memmove(fs, fs + 1, 4 * sizeof *fs), memmove(fy, fy + 1, 4 * sizeof *fy);
			fs[4] = ns, fy[4] = ny;
		} else {
			memmove(fs + 1, fs, 4 * sizeof *fs), memmove(fy + 1, fy, 4 * sizeof *fy);
			fs[0] = ns, fy[0] = ny;
		}
		best = 0;
		for (int i = 1; i < 5; i++)
			if (fy[i] < fy[best])
				best = i;
	}
	free(tiles);
	tmemo_free(&memo);
	if (rc)
		return rc;
	double off = 0;
	if (best > 0 && best < 4 && isfinite(fy[best - 1]) && isfinite(fy[best + 1])) {
		double den = fy[best - 1] - 2 * fy[best] + fy[best + 1];
		if (den > 0) {
			off = 0.5 * (fy[best - 1] - fy[best + 1]) / den;
			off = off > 0.5 ? 0.5 : off < -0.5 ? -0.5 : off;
		}
	}
	*g = fs[best] + off * 0.075;
	if (*g < 0.01)
		*g = 0.01;
	return X3_OK;
}

/* ---- LDLQ --------------------------------------------------------------- */

/* Quantize the 16-row block X (16 x n): tiles to trellis order, Viterbi,
 * states of the n/16 tiles to st, decoded values back to Q (16 x n). */
static int quant_block(const float *X, int64_t n, int K, int cb, int threads,
                       float *tiles, float *vals, uint16_t *st, float *Q, int64_t *count)
{
	int64_t tn = n / 16;
	for (int64_t t = 0; t < tn; t++)
		get_tile(X, n, 0, t, tiles + 256 * t);
	struct tmemo memo = { 0 };   /* equal tiles of this block only */
	int rc = encode_tiles(K, cb, tiles, tn, st, vals, threads, &memo, count);
	tmemo_free(&memo);
	if (rc)
		return rc;
	for (int64_t t = 0; t < tn; t++)
		for (int i = 0; i < 256; i++) {
			int p = x3_tile_perm[i];
			Q[(p / 16) * n + t * 16 + p % 16] = vals[256 * t + i];
		}
	return X3_OK;
}

static int ldlq(const float *W, int64_t k, int64_t n, const float *L, int K,
                int cb, int threads, uint16_t *states, float *Q, int64_t *count);

int x3_ldlq(const float *W, int64_t k, int64_t n, const float *L, int K,
            int cb, int threads, uint16_t *states, float *Q)
{
	return ldlq(W, k, n, L, K, cb, threads, states, Q, NULL);
}

/* x3_ldlq; *count (may be NULL) += the tiles the Viterbi encoded */
static int ldlq(const float *W, int64_t k, int64_t n, const float *L, int K,
                int cb, int threads, uint16_t *states, float *Q, int64_t *count)
{
	if (K < 1 || K > 8)
		return x3_err(X3_EINVAL, "K=%d is outside 1..8", K);
	if (k <= 0 || n <= 0 || k % X3_QSPAN || n % 16)
		return x3_err(X3_EINVAL, "ldlq: bad shape %lldx%lld", (long long)k, (long long)n);
	int64_t tn = n / 16;
	float *tiles = xmalloc((size_t)(tn * 256), sizeof(float));
	float *vals = xmalloc((size_t)(tn * 256), sizeof(float));
	float *X = xmalloc((size_t)(16 * n), sizeof(float));
	float *E = L ? xmalloc((size_t)(k * n), sizeof(float)) : NULL;  /* W - Q */
	float *P = L ? xmalloc((size_t)(X3_QSPAN * n), sizeof(float)) : NULL; /* prod_cache */
	int rc = X3_OK;
	if (!tiles || !vals || !X || (L && (!E || !P))) {
		rc = x3_err(X3_ENOMEM, "out of memory in ldlq");
		goto out;
	}
	for (int64_t s1 = k; s1 > 0 && rc == X3_OK; s1 -= X3_QSPAN) {
		int64_t s0 = s1 - X3_QSPAN;
		/* feedback from the spans below, once per span:
		 * P = L[s1:k, s0:s1]^T E[s1:k, :]  (128 x n) */
		if (L && s1 < k)
			x3_gemm_atb(X3_QSPAN, n, k - s1, L + s1 * k + s0, k, E + s1 * n, n, 0.0f, P, n);
		else if (L)
			memset(P, 0, (size_t)(X3_QSPAN * n) * sizeof(float));
		for (int64_t b1 = s1; b1 > s0; b1 -= 16) {
			int64_t b0 = b1 - 16;
			memcpy(X, W + b0 * n, (size_t)(16 * n) * sizeof(float));
			if (L) {
				/* X = W_B + P_B + L[b1:s1, B]^T E[b1:s1, :] */
				const float *Pb = P + (b0 - s0) * n;
				for (int64_t i = 0; i < 16 * n; i++)
					X[i] += Pb[i];
				if (b1 < s1)
					x3_gemm_atb(16, n, s1 - b1, L + b1 * k + b0, k, E + b1 * n, n, 1.0f, X, n);
			}
			rc = quant_block(X, n, K, cb, threads, tiles, vals,
			                 states + (b0 / 16) * tn * 256, Q + b0 * n, count);
			if (rc)
				break;
			if (L)
				for (int64_t i = b0 * n; i < b1 * n; i++)
					E[i] = W[i] - Q[i];
		}
	}
out:
	free(tiles), free(vals), free(X), free(E), free(P);
	return rc;
}

/* ---- refinement passes after LDLQ (x3_quant_set_ldlq_passes) -----------
 * LDLQ encodes each 16-row block knowing the error of the blocks below it
 * only. A pass goes over the blocks again, in LDLQ's order (the last block
 * first), and re-encodes each with every other block's error known: the
 * proxy error tr(Eᵀ H E) as a function of block B's error E_B, the rest
 * fixed, is
 * tr(E_Bᵀ H_BB E_B) + 2 tr(E_Bᵀ g_B) + const with g_B = H[B, not B] E[not B],
 * least at E_B = -H_BB⁻¹ g_B, so the Viterbi's target is W_B + H_BB⁻¹ g_B.
 * The Viterbi's codes are kept only where they lower that function (the
 * Viterbi weighs the block's rows alike, not by H_BB), so no pass raises
 * the proxy error. A block coordinate descent on it: each pass one more
 * Viterbi of every tile. The objective is a sum over output columns, so a
 * sample of columns (x3_quantize_sample) refines as the whole would. HE is
 * kept up to date through the kept changes (x3_gemm_atb, whose column j
 * depends on column j alone: the result does not depend on the threads). */
static int ldlq_passes = 0;

int x3_quant_set_ldlq_passes(int p)
{
	if (p < 0 || p > X3_LDLQ_PASSES_MAX)
		return x3_err(X3_EINVAL, "LDLQ refinement passes %d are outside 0..%d", p,
		              X3_LDLQ_PASSES_MAX);
	ldlq_passes = p;
	return X3_OK;
}

int x3_quant_ldlq_passes(void)
{
	return ldlq_passes;
}

static int ldlq_refine(const float *W, int64_t k, int64_t n, const float *H, int K, int cb,
                       int threads, int passes, uint16_t *states, float *Q, int64_t *count,
                       int64_t *kept)
{
	int64_t tn = n / 16;
	size_t bn = (size_t)(16 * n);
	float *E = xmalloc((size_t)(k * n), sizeof(float));
	float *HE = xmalloc((size_t)(k * n), sizeof(float));
	float *G = xmalloc(bn, sizeof(float)), *X = xmalloc(bn, sizeof(float));
	float *Qn = xmalloc(bn, sizeof(float)), *D = xmalloc(bn, sizeof(float));
	float *tiles = xmalloc((size_t)(tn * 256), sizeof(float));
	float *vals = xmalloc((size_t)(tn * 256), sizeof(float));
	uint16_t *stn = xmalloc((size_t)(tn * 256), sizeof(uint16_t));
	float Hb[256], C[256];
	int rc = X3_OK;
	if (!E || !HE || !G || !X || !Qn || !D || !tiles || !vals || !stn) {
		rc = x3_err(X3_ENOMEM, "out of memory in ldlq_refine");
		goto out;
	}
	for (int64_t i = 0; i < k * n; i++)
		E[i] = W[i] - Q[i];
	x3_gemm_atb(k, n, k, H, k, E, n, 0.0f, HE, n);
	for (int pass = 0; pass < passes && rc == X3_OK; pass++)
		for (int64_t b0 = k - 16; b0 >= 0; b0 -= 16) {
			for (int i = 0; i < 16; i++)
				for (int j = 0; j < 16; j++)
					Hb[i * 16 + j] = C[i * 16 + j] = H[(b0 + i) * k + b0 + j];
			/* g = HE_B - H_BB E_B */
			const float *Eb = E + b0 * n;
			for (int i = 0; i < 16; i++)
				for (int64_t c = 0; c < n; c++) {
					double a = HE[(b0 + i) * n + c];
					for (int j = 0; j < 16; j++)
						a -= (double)Hb[i * 16 + j] * Eb[j * n + c];
					G[i * n + c] = (float)a;
				}
			memcpy(X, G, bn * sizeof(float));
			/* H_BB is a principal block of the damped SPD Hessian whose
			 * block LDL succeeded; should its Cholesky fail all the
			 * same (non-finite input), the block keeps its codes */
			if (LAPACKE_spotrf(LAPACK_ROW_MAJOR, 'L', 16, C, 16) ||
			    LAPACKE_spotrs(LAPACK_ROW_MAJOR, 'L', 16, (lapack_int)n, C, 16, X, (lapack_int)n))
				continue;
			for (size_t i = 0; i < bn; i++)
				X[i] += W[b0 * n + (int64_t)i];
			if ((rc = quant_block(X, n, K, cb, threads, tiles, vals, stn, Qn, count)))
				break;
			/* f(e) = e^T H_BB e + 2 e^T g, old against new */
			double fo = 0, fn = 0;
			for (int64_t c = 0; c < n; c++) {
				float eo[16], en[16];
				for (int i = 0; i < 16; i++) {
					eo[i] = Eb[i * n + c];
					en[i] = W[(b0 + i) * n + c] - Qn[i * n + c];
				}
				for (int i = 0; i < 16; i++) {
					double ho = 0, hn = 0;
					for (int j = 0; j < 16; j++)
						ho += (double)Hb[i * 16 + j] * eo[j], hn += (double)Hb[i * 16 + j] * en[j];
					fo += eo[i] * (ho + 2.0 * G[i * n + c]);
					fn += en[i] * (hn + 2.0 * G[i * n + c]);
				}
			}
			if (!(fn < fo))
				continue;
			for (size_t i = 0; i < bn; i++) {
				float e = W[b0 * n + (int64_t)i] - Qn[i];
				D[i] = e - E[b0 * n + (int64_t)i];
				E[b0 * n + (int64_t)i] = e;
			}
			memcpy(Q + b0 * n, Qn, bn * sizeof(float));
			(*kept)++;
			memcpy(states + (b0 / 16) * tn * 256, stn, (size_t)(tn * 256) * sizeof(uint16_t));
			x3_gemm_atb(k, n, 16, H + b0 * k, k, D, n, 1.0f, HE, n);
		}
out:
	free(E), free(HE), free(G), free(X), free(Qn), free(D), free(tiles), free(vals), free(stn);
	return rc;
}

/* ---- proxy error ---------------------------------------------------------- */

/* The proxy error's quadratic form tr(Aᵀ H A) in our own loops, so that
 * it is a fixed function of its operands. H is symmetric, so only the
 * blocks of PX_LB rows at and right of the diagonal are multiplied (half
 * the work): for row i in row block I, T[i, j] = sum_l H[i, l] A[l, j] over
 * l from I's first row to k-1 in that order into one float, each step one
 * fused multiply-add (fmaf: one rounding); D[i, j], the same sum over I's
 * own columns, is the value T[i, j] has right after them (the first
 * panel that reaches row i is its diagonal one). Then, in double, over j
 * in order within a column block of PX_JB, the blocks in order:
 * tr = 2 sum A[i, j] T[i, j] - sum A[i, j] D[i, j] (the pairs (i, l) in
 * different blocks are counted twice, those within one once). Blocking over
 * l keeps each element's order: the accumulator goes to memory and comes
 * back unchanged. The vectors run
 * across j, one lane per element, so the AVX-512 and AVX2 forms and the
 * scalar reference (proxy_panel_ref; fmaf, which is slow only where the
 * processor has no FMA) give the same bits on every machine and thread
 * count (t1200 compares them). */
#define PX_JB 256   /* columns of A per block (a thread's unit of work) */
#define PX_LB 256   /* rows of A per panel kept in L2 */

/* T (k, w) += H[:, l0:l0+lw] A[l0:l0+lw, c0:c0+w] for the rows i0..i1-1 of
 * T and the columns j0..w-1 (H has k columns) */
static void proxy_panel_ref(const float *H, const float *A, int64_t k, int64_t n, int64_t l0,
                            int64_t lw, int64_t c0, int64_t w, float *T, int64_t i0, int64_t i1,
                            int64_t j0)
{
	for (int64_t i = i0; i < i1; i++)
		for (int64_t j = j0; j < w; j++) {
			float acc = T[i * w + j];
			for (int64_t l = 0; l < lw; l++)
				acc = fmaf(H[i * k + l0 + l], A[(l0 + l) * n + c0 + j], acc);
			T[i * w + j] = acc;
		}
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* One kernel, written once for both vector widths (V lanes of type VT):
 * 6 rows x 2V columns of T a step (12 accumulators: FMA's latency wants
 * more than 8 in flight), then single rows 2V columns at a time, the
 * columns left (w mod 2V) by the reference. The panel of A comes packed
 * (px_pack): P[g][l][2V] for the column groups g of 2V, so the 2V values
 * of row l + 1 follow those of row l. Read in place, a group's rows are n
 * floats apart, which for n a multiple of 1024 maps them all to the same
 * few L1 sets: on the 2-core Zen 3 host the packed panel computes
 * tr(Aᵀ H A) of a 4096x4096 A in 0.52 s against 1.03 s read in place, and
 * of a 14336x1024 A (down_proj's k) in 1.36 s against 2.07 s (2 threads;
 * the same bits). The 6 rows, measured with A read in place on
 * bench/proxy-error's 2048x2048 (2-core EPYC): AVX-512 0.22 s against
 * 0.33 s with 4 rows and 0.43 s with 8 rows held as an array; AVX2 0.32 s
 * (4 rows are slower than the unfused loops' 0.46 s). */
#define PX_KERNEL(NAME, TARGET, VT, V, LD, ST, SET1, FMA)                                    \
__attribute__((target(TARGET)))                                                              \
static void NAME(const float *H, const float *A, const float *P, int64_t k, int64_t n,       \
                 int64_t l0, int64_t lw, int64_t c0, int64_t w, float *T, int64_t m)         \
{                                                                                            \
	const int64_t wf = w / (2 * (V)) * (2 * (V));                                           \
	int64_t i = 0;                                                                           \
	for (; i + 6 <= m; i += 6) {                                                             \
		const float *h = H + i * k + l0;                                                     \
		for (int64_t j = 0; j < wf; j += 2 * (V)) {                                          \
			float *t = T + i * w + j;                                                        \
			VT a00 = LD(t), a01 = LD(t + (V)), a10 = LD(t + w), a11 = LD(t + w + (V));       \
			VT a20 = LD(t + 2 * w), a21 = LD(t + 2 * w + (V));                               \
			VT a30 = LD(t + 3 * w), a31 = LD(t + 3 * w + (V));                               \
			VT a40 = LD(t + 4 * w), a41 = LD(t + 4 * w + (V));                               \
			VT a50 = LD(t + 5 * w), a51 = LD(t + 5 * w + (V));                               \
			const float *e = P + j * lw;                                                     \
			for (int64_t l = 0; l < lw; l++, e += 2 * (V)) {                                 \
				VT e0 = LD(e), e1 = LD(e + (V)), b;                                          \
				b = SET1(h[l]), a00 = FMA(b, e0, a00), a01 = FMA(b, e1, a01);                \
				b = SET1(h[k + l]), a10 = FMA(b, e0, a10), a11 = FMA(b, e1, a11);            \
				b = SET1(h[2 * k + l]), a20 = FMA(b, e0, a20), a21 = FMA(b, e1, a21);        \
				b = SET1(h[3 * k + l]), a30 = FMA(b, e0, a30), a31 = FMA(b, e1, a31);        \
				b = SET1(h[4 * k + l]), a40 = FMA(b, e0, a40), a41 = FMA(b, e1, a41);        \
				b = SET1(h[5 * k + l]), a50 = FMA(b, e0, a50), a51 = FMA(b, e1, a51);        \
			}                                                                                \
			ST(t, a00), ST(t + (V), a01), ST(t + w, a10), ST(t + w + (V), a11);              \
			ST(t + 2 * w, a20), ST(t + 2 * w + (V), a21);                                    \
			ST(t + 3 * w, a30), ST(t + 3 * w + (V), a31);                                    \
			ST(t + 4 * w, a40), ST(t + 4 * w + (V), a41);                                    \
			ST(t + 5 * w, a50), ST(t + 5 * w + (V), a51);                                    \
		}                                                                                    \
		if (wf < w)                                                                          \
			proxy_panel_ref(H, A, k, n, l0, lw, c0, w, T, i, i + 6, wf);                     \
	}                                                                                        \
	for (; i < m; i++) {                                                                     \
		const float *h = H + i * k + l0;                                                     \
		for (int64_t j = 0; j < wf; j += 2 * (V)) {                                          \
			float *t = T + i * w + j;                                                        \
			VT a0 = LD(t), a1 = LD(t + (V));                                                 \
			const float *e = P + j * lw;                                                     \
			for (int64_t l = 0; l < lw; l++, e += 2 * (V)) {                                 \
				VT b = SET1(h[l]);                                                           \
				a0 = FMA(b, LD(e), a0), a1 = FMA(b, LD(e + (V)), a1);                        \
			}                                                                                \
			ST(t, a0), ST(t + (V), a1);                                                      \
		}                                                                                    \
		if (wf < w)                                                                          \
			proxy_panel_ref(H, A, k, n, l0, lw, c0, w, T, i, i + 1, wf);                     \
	}                                                                                        \
}
PX_KERNEL(proxy_panel_avx2, "avx2,fma", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
          _mm256_set1_ps, _mm256_fmadd_ps)
PX_KERNEL(proxy_panel_avx512, "avx512f", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
          _mm512_set1_ps, _mm512_fmadd_ps)
#undef PX_KERNEL
#endif

/* the proxy error's panel form: the widest the processor has, narrowed by
 * X3_PROXY_PATH (ref or avx2; avx512 changes nothing); x3_proxy_path says
 * which */
static int px_path = -1;   /* 0 ref, 1 avx2, 2 avx512 */

static int px_pick(void)
{
	if (px_path >= 0)
		return px_path;
	int p = 0;
#if defined(__x86_64__) && defined(__GNUC__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f"))
		p = 2;
	else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		p = 1;
#endif
	const char *f = getenv("X3_PROXY_PATH");
	if (f && !strcmp(f, "ref"))
		p = 0;
	else if (f && !strcmp(f, "avx2") && p >= 1)
		p = 1;
	px_path = p;
	return p;
}

static const char *px_names[] = { "ref", "avx2", "avx512" };

const char *x3_proxy_path(void)
{
	return px_names[px_pick()];
}

int x3_proxy_set_path(const char *name)
{
	px_path = -1;
	int best = px_pick();
	for (int p = 0; p < 3; p++)
		if (!strcmp(name, px_names[p])) {
			if (p > best)
				return x3_err(X3_EUNSUP, "proxy error: this processor has no %s", name);
			px_path = p;
			return X3_OK;
		}
	return x3_err(X3_EINVAL, "proxy error: no form '%s' (ref, avx2, avx512)", name);
}

/* the column groups of the vector form in use: 2V floats (0: the reference,
 * which reads A in place) */
static int px_group(void)
{
	static const int g[] = { 0, 16, 32 };
	return g[px_pick()];
}

/* P[g][l][G] = A[l0 + l, c0 + g G + 0 .. G-1] for the whole groups of G
 * columns of the block's w (the vector kernels' packed panel) */
static void px_pack(const float *A, int64_t n, int64_t l0, int64_t lw, int64_t c0, int64_t w,
                    int G, float *P)
{
	for (int64_t j = 0; j + G <= w; j += G)
		for (int64_t l = 0; l < lw; l++)
			memcpy(P + j * lw + l * G, A + (l0 + l) * n + c0 + j, (size_t)G * sizeof *P);
}

/* rows 0..m-1 of T += H[:, l0:l0+lw] A[l0:l0+lw, c0:c0+w]; P: that panel
 * of A packed by px_pack for px_group() (unused by the reference) */
static void proxy_panel(const float *H, const float *A, const float *P, int64_t k, int64_t n,
                        int64_t l0, int64_t lw, int64_t c0, int64_t w, float *T, int64_t m)
{
	switch (px_pick()) {
#if defined(__x86_64__) && defined(__GNUC__)
	case 2:
		proxy_panel_avx512(H, A, P, k, n, l0, lw, c0, w, T, m);
		return;
	case 1:
		proxy_panel_avx2(H, A, P, k, n, l0, lw, c0, w, T, m);
		return;
#endif
	default:
		(void)P;
		proxy_panel_ref(H, A, k, n, l0, lw, c0, w, T, 0, m, 0);
	}
}

/* sum A[i, c0 + j] T[i, j] over rows i0..i1-1 (j in order, then i), in double */
static double proxy_dot(const float *A, int64_t n, int64_t c0, int64_t w, const float *T,
                        int64_t i0, int64_t i1)
{
	double s = 0;
	for (int64_t i = i0; i < i1; i++) {
		const float *a = A + i * n + c0, *t = T + i * w;
		double si = 0;
		for (int64_t j = 0; j < w; j++)
			si += (double)a[j] * t[j];
		s += si;
	}
	return s;
}

/* tr(Aᵀ H A) for A (k, n), H symmetric: per column block, T and the
 * diagonal blocks' sums panel by panel (above), then the block's sum in
 * double; the blocks' sums added in block order. */
static int proxy_quad(const float *A, const float *H, int64_t k, int64_t n, double *out)
{
	int64_t nb = (n + PX_JB - 1) / PX_JB;
	double *part = xcalloc((size_t)nb, sizeof *part);
	if (!part)
		return x3_err(X3_ENOMEM, "out of memory for the proxy error");
	int fail = 0;
	const int G = px_group();   /* px_pick once, before the threads */
	#pragma omp parallel if(k * k * n > (1 << 22))
	{
		float *T = malloc((size_t)(k * PX_JB) * sizeof *T);
		float *P = G ? malloc((size_t)(PX_LB * PX_JB) * sizeof *P) : NULL;
		if (!T || (G && !P)) {
			#pragma omp atomic write
			fail = 1;
		}
		#pragma omp for schedule(dynamic, 1)
		for (int64_t b = 0; b < nb; b++) {
			if (!T || (G && !P))
				continue;
			int64_t c0 = b * PX_JB, w = n - c0 < PX_JB ? n - c0 : PX_JB;
			memset(T, 0, (size_t)(k * w) * sizeof *T);
			double diag = 0;
			for (int64_t l0 = 0; l0 < k; l0 += PX_LB) {
				int64_t lw = k - l0 < PX_LB ? k - l0 : PX_LB;
				if (G)
					px_pack(A, n, l0, lw, c0, w, G, P);
				proxy_panel(H, A, P, k, n, l0, lw, c0, w, T, l0 + lw);
				diag += proxy_dot(A, n, c0, w, T, l0, l0 + lw);
			}
			part[b] = 2 * proxy_dot(A, n, c0, w, T, 0, k) - diag;
		}
		free(T);
		free(P);
	}
	double t = 0;
	for (int64_t b = 0; b < nb; b++)
		t += part[b];
	free(part);
	if (fail)
		return x3_err(X3_ENOMEM, "out of memory for the proxy error");
	*out = t;
	return X3_OK;
}

int x3_proxy_error(const float *W, const float *Q, const float *H, int64_t k,
                   int64_t n, double *err)
{
	*err = -1;
	if (!H) {
		double s = 0;
		for (int64_t i = 0; i < k * n; i++) {
			double d = (double)W[i] - Q[i];
			s += d * d;
		}
		*err = s / (double)(k * n);
		return X3_OK;
	}
	float *E = xmalloc((size_t)(k * n), sizeof(float));
	if (!E)
		return x3_err(X3_ENOMEM, "out of memory for the proxy error");
	for (int64_t i = 0; i < k * n; i++)
		E[i] = W[i] - Q[i];
	double num = 0, den = 0;
	int rc = proxy_quad(E, H, k, n, &num);
	free(E);
	if (!rc)
		rc = proxy_quad(W, H, k, n, &den);
	if (rc)
		return rc;
	*err = num / (den > 1e-8 ? den : 1e-8);
	return X3_OK;
}

/* ---- one K ---------------------------------------------------------------- */

void x3_qresult_free(x3_qresult *r)
{
	if (!r)
		return;
	free(r->trellis);
	free(r->suh);
	free(r->svh);
	free(r->Q);
	free(r->Wg);
	free(r->strip);
	free(r);
}

int64_t x3_quant_bytes(int64_t k, int64_t n, int K, int cb, int has_bias)
{
	return k * n * K / 8 + 2 * k + 2 * n + (cb == X3_CB_3INST ? 0 : 4) + (has_bias ? 2 * n : 0);
}

/* The per-K step on the columns W (k x n) of a regularized weight, with
 * their input scales su (k) and output scales sv (n): scale search over at
 * most cap sampled tiles of the whole weight Wall (k x nall), LDLQ, proxy
 * error, packing. r is allocated and has K, cb, k, n and fallback set; the
 * rest is filled here. */
static int quantize_cols(const float *W, const float *su, const float *sv, int64_t k, int64_t n,
                         const float *Wall, int64_t nall, int zeros, const x3_qhess *h, int K,
                         int cb, int threads, int keep, int64_t cap, double gfix, int refine,
                         x3_qresult *r)
{
	size_t kn = (size_t)(k * n);
	float *Wg = xmalloc(kn, sizeof(float));
	float *Q = xmalloc(kn, sizeof(float));
	uint16_t *st = xmalloc(kn, sizeof(uint16_t));
	r->trellis = xmalloc(kn / 16 * (size_t)K, sizeof(uint16_t));
	r->suh = xmalloc((size_t)k, sizeof(uint16_t));
	r->svh = xmalloc((size_t)n, sizeof(uint16_t));
	int rc = X3_OK;
	if (!Wg || !Q || !st || !r->trellis || !r->suh || !r->svh) {
		rc = x3_err(X3_ENOMEM, "out of memory for a %lldx%lld weight", (long long)k, (long long)n);
		goto fail;
	}
	/* gfix > 0: a scale found before (x3_quantize_g): no search, or with
	 * refine the fine grid around it; gfix = 0 with refine: the fine grid
	 * around the predicted scale (x3_quantize_sample); else the search */
	const double v0 = vit_seconds;
	double t = x3_now(), t1;
	if (gfix > 0 && !refine)
		r->g = gfix;
	else if ((rc = scale_search(Wall, k, nall, K, cb, threads, cap, refine ? (gfix > 0 ? gfix : -1) : 0,
	                            &r->g, &r->search_tiles)))
		goto fail;
	float g = (float)r->g;
	#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < kn; i++)
		Wg[i] = W[i] * g;
	t1 = x3_now(), r->t_search = t1 - t, t = t1;
	if (ldlq_gpu) {
		rc = ldlq_gpu->ldlq(Wg, k, n, h->fallback ? NULL : h->L, K, cb, st, Q);
		r->ldlq_tiles += (int64_t)(kn / 256);
	} else
		rc = ldlq(Wg, k, n, h->fallback ? NULL : h->L, K, cb, threads, st, Q, &r->ldlq_tiles);
	if (rc)
		goto fail;
	t1 = x3_now(), r->t_ldlq = t1 - t, t = t1;
	if (ldlq_passes > 0 && !h->fallback &&
	    (rc = ldlq_refine(Wg, k, n, h->H, K, cb, threads, ldlq_passes, st, Q, &r->ldlq_tiles,
	                      &r->refine_kept)))
		goto fail;
	t1 = x3_now(), r->t_refine = t1 - t, t = t1;
	rc = x3_proxy_error(Wg, Q, h->fallback ? NULL : h->H, k, n, &r->proxy_err);
	if (rc)
		goto fail;
	r->t_proxy = x3_now() - t;
	r->t_viterbi = vit_seconds - v0;
	if (zeros)
		r->proxy_err = 0;
	#pragma omp parallel for schedule(static)
	for (size_t t = 0; t < kn / 256; t++)
		x3_trellis_pack(K, st + 256 * t, r->trellis + (size_t)16 * K * t);
	for (int64_t i = 0; i < k; i++)
		r->suh[i] = x3_f32_to_f16(su[i] / g);
	for (int64_t j = 0; j < n; j++)
		r->svh[j] = x3_f32_to_f16(sv[j]);
	free(st);
	if (keep & X3_QKEEP_Q)
		r->Q = Q;
	else
		free(Q);
	if (keep & X3_QKEEP_W)
		r->Wg = Wg;
	else
		free(Wg);
	return X3_OK;
fail:
	free(Wg), free(Q), free(st);
	return rc;
}

static int quantize_check(const x3_qweight *w, const x3_qhess *h, int K, int cb)
{
	if (K < 1 || K > 8)
		return x3_err(X3_EINVAL, "K=%d is outside 1..8", K);
	if (cb < 0 || cb >= X3_CB_COUNT)
		return x3_err(X3_EINVAL, "bad codebook id %d", cb);
	if (h->k != w->k)
		return x3_err(X3_EINVAL, "hessian is %lldx%lld but the weight has %lld (padded) inputs",
		              (long long)h->k, (long long)h->k, (long long)w->k);
	return X3_OK;
}

static x3_qresult *qresult_new(const x3_qweight *w, const x3_qhess *h, int K, int cb, int64_t n)
{
	x3_qresult *r = calloc(1, sizeof *r);
	if (!r) {
		x3_err(X3_ENOMEM, "out of memory");
		return NULL;
	}
	r->K = K, r->cb = cb, r->k = w->k, r->n = n;
	r->fallback = h->fallback;
	r->strips_total = w->n / 16;
	return r;
}

int x3_quantize(const x3_qweight *w, const x3_qhess *h, int K, int cb,
                int threads, int keep, x3_qresult **out)
{
	return x3_quantize_g(w, h, K, cb, threads, keep, 0, 0, out);
}

int x3_quantize_g(const x3_qweight *w, const x3_qhess *h, int K, int cb,
                  int threads, int keep, double g, int refine, x3_qresult **out)
{
	*out = NULL;
	int rc = quantize_check(w, h, K, cb);
	if (rc)
		return rc;
	if (!(g >= 0 && isfinite(g)))
		return x3_err(X3_EINVAL, "global scale %g is not a positive number", g);
	double t0 = x3_now();
	x3_qresult *r = qresult_new(w, h, K, cb, w->n);
	if (!r)
		return X3_ENOMEM;
	r->nstrips = r->strips_total;
	rc = quantize_cols(w->W, w->su, w->sv, w->k, w->n, w->W, w->n, w->zeros, h, K, cb, threads,
	                   keep, x3_scale_sample_cap(w->k, w->n), g, refine, r);
	if (rc) {
		x3_qresult_free(r);
		return rc;
	}
	r->seconds = x3_now() - t0;
	*out = r;
	return X3_OK;
}

int64_t x3_sample_strips(int64_t n, double frac, uint64_t seed, const char *name, int64_t *strip)
{
	int64_t ns = n / 16;
	if (ns <= 0)
		return 0;
	int64_t m = frac >= 1 ? ns : (int64_t)ceil(frac * (double)ns - 1e-9);
	/* at least X3_SAMPLE_MIN_STRIPS: one strip of a narrow linear is too
	 * noisy an estimate (it measured KL +2.5-2.9% on 128-wide linears) */
	m = m < X3_SAMPLE_MIN_STRIPS ? X3_SAMPLE_MIN_STRIPS : m;
	m = m > ns ? ns : m;
	/* one strip drawn uniformly from each of m equal runs of strips
	 * (stratified: the sample spans the width, e.g. both 128-column
	 * Hadamard blocks of a padded weight, in proportion) */
	char nm[1100];
	snprintf(nm, sizeof nm, "%s/strips", name ? name : "");
	x3_rng rng;
	x3_rng_seed(&rng, seed, x3_rng_stream_of(nm));
	for (int64_t j = 0; j < m; j++) {
		int64_t lo = j * ns / m, hi = (j + 1) * ns / m;
		strip[j] = lo + (int64_t)(x3_rng_u64(&rng) % (uint64_t)(hi - lo));
	}
	return m;
}

int x3_quantize_sample(const x3_qweight *w, const x3_qhess *h, int K, int cb, int threads,
                       double frac, int predict, uint64_t seed, const char *name, x3_qresult **out)
{
	*out = NULL;
	int rc = quantize_check(w, h, K, cb);
	if (rc)
		return rc;
	if (!(frac > 0 && frac <= 1))
		return x3_err(X3_EINVAL, "sample fraction %g is not in (0, 1]", frac);
	double t0 = x3_now();
	int64_t k = w->k, ns = w->n / 16;
	int64_t *strip = xmalloc((size_t)ns, sizeof *strip);
	int64_t m = strip ? x3_sample_strips(w->n, frac, seed, name, strip) : 0;
	if (m <= 0) {
		free(strip);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	int64_t n = 16 * m;
	x3_qresult *r = qresult_new(w, h, K, cb, n);
	float *W = xmalloc((size_t)(k * n), sizeof *W), *sv = xmalloc((size_t)n, sizeof *sv);
	if (!r || !W || !sv) {
		free(strip), free(W), free(sv), x3_qresult_free(r);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	r->strip = strip, r->nstrips = m;
	/* the chosen strips' columns, in order: LDLQ mixes rows only (its
	 * feedback is L^T E over the input dimension; x3_gemm_atb's column j
	 * depends on column j alone) and a tile lies within one strip, so
	 * these columns quantize as they would within the whole */
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < m; j++)
			memcpy(W + i * n + 16 * j, w->W + i * w->n + 16 * strip[j], 16 * sizeof *W);
	for (int64_t j = 0; j < m; j++)
		memcpy(sv + 16 * j, w->sv + 16 * strip[j], 16 * sizeof *sv);
	/* the scale search samples the whole weight as x3_quantize's does (its
	 * diagonal and outliers), with the tile cap in proportion to the
	 * strips kept (with every strip, x3_quantize's), at least one tile */
	int64_t capf = x3_scale_sample_cap(k, w->n), cap = (capf * m + ns - 1) / ns;
	rc = quantize_cols(W, w->su, sv, k, n, w->W, w->n, w->zeros, h, K, cb, threads, 0,
	                   cap > 0 ? cap : 1, 0, predict, r);
	free(W), free(sv);
	if (rc) {
		x3_qresult_free(r);
		return rc;
	}
	r->seconds = x3_now() - t0;
	*out = r;
	return X3_OK;
}

int x3_reconstruct(const float *Wt, const uint16_t *suh, const uint16_t *svh,
                   int64_t k, int64_t n, float *W)
{
	if (k <= 0 || n <= 0 || k % 128 || n % 128)
		return x3_err(X3_EINVAL, "reconstruct: shape %lldx%lld is not a multiple of 128",
		              (long long)k, (long long)n);
	memcpy(W, Wt, (size_t)(k * n) * sizeof(float));
	x3_had128_rows(W, k, n);
	x3_had128_cols(W, k, n);
	for (int64_t i = 0; i < k; i++) {
		float a = x3_f16_to_f32(suh[i]);
		for (int64_t j = 0; j < n; j++)
			W[i * n + j] *= a * x3_f16_to_f32(svh[j]);
	}
	return X3_OK;
}

/* ---- output scales refit after the trellis -------------------------------- */

static float *output_metric(const float *H, const float *su, int64_t k);

int x3_refit_out_scales(const x3_qweight *w, const x3_qhess *h, int metric, x3_qresult *r,
                        double *alpha)
{
	int64_t k = w->k, n = w->n;
	if (!r->Q || !r->Wg || r->n != n || r->k != k)
		return x3_err(X3_EINVAL, "refit: the result has no kept Q and Wg of the whole %lldx%lld weight",
		              (long long)k, (long long)n);
	if (metric != X3_EST_PROXY && metric != X3_EST_OUTPUT)
		return x3_err(X3_EINVAL, "refit: bad metric %d", metric);
	r->proxy_err_before = r->proxy_err;
	if (w->zeros) {
		for (int64_t j = 0; alpha && j < n; j++)
			alpha[j] = 1;
		return X3_OK;
	}
	size_t kn = (size_t)(k * n);
	/* A = Wg Hb_n, B = Q Hb_n (k x n): the output side back in the basis
	 * where svh scales each column; T = M B, M the metric (k x k) */
	float *A = xmalloc(kn, sizeof(float)), *B = xmalloc(kn, sizeof(float));
	float *T = xmalloc(kn, sizeof(float)), *M = NULL;
	double *al = xmalloc((size_t)n, sizeof(double));
	int rc = X3_OK;
	if (!A || !B || !T || !al) {
		rc = x3_err(X3_ENOMEM, "out of memory for the refit of a %lldx%lld weight", (long long)k, (long long)n);
		goto done;
	}
	const float *H = h->fallback ? NULL : h->H;
	if (H && metric == X3_EST_OUTPUT) {
		if (!(M = output_metric(h->H, w->su, k))) {
			rc = x3_err(X3_ENOMEM, "out of memory for the output metric");
			goto done;
		}
		H = M;
	}
	memcpy(A, r->Wg, kn * sizeof(float));
	memcpy(B, r->Q, kn * sizeof(float));
	x3_had128_rows(A, k, n);
	x3_had128_rows(B, k, n);
	if (H)   /* H symmetric: T = H^T B = H B */
		x3_gemm_atb(k, n, k, H, k, B, n, 0.0f, T, n);
	else
		memcpy(T, B, kn * sizeof(float));
	#pragma omp parallel for schedule(static)
	for (int64_t j = 0; j < n; j++) {
		double num = 0, den = 0;
		for (int64_t i = 0; i < k; i++) {
			num += (double)A[i * n + j] * T[i * n + j];
			den += (double)B[i * n + j] * T[i * n + j];
		}
		/* alpha = argmin (a - alpha b)^T H (a - alpha b); keep 1 where the
		 * column is empty or zeroed by its scale. A non-finite sum (NaN
		 * from the inputs, or an overflow) stays NaN: an error below. */
		al[j] = !isfinite(num) || !isfinite(den) ? NAN
		      : den > 1e-30 && w->sv[j] != 0 ? num / den : 1.0;
	}
	for (int64_t j = 0; j < n; j++) {
		if (!isfinite(al[j])) {
			rc = x3_err(X3_ENUM, "refit: output channel %lld: the least-squares scale is not finite",
			            (long long)j);
			goto done;
		}
		uint16_t s = x3_f32_to_f16((float)(w->sv[j] * al[j]));
		if (!isfinite(x3_f16_to_f32(s))) {
			rc = x3_err(X3_ENUM, "refit: output scale %lld overflows fp16 (%g x %g)",
			            (long long)j, (double)w->sv[j], al[j]);
			goto done;
		}
		r->svh[j] = s;
		if (alpha)
			alpha[j] = al[j];
	}
	/* the proxy error of what is stored now: Q_eff = (B diag(alpha)) Hb_n */
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++)
			B[i * n + j] = (float)(B[i * n + j] * al[j]);
	x3_had128_rows(B, k, n);
	rc = x3_proxy_error(r->Wg, B, h->fallback ? NULL : h->H, k, n, &r->proxy_err);
done:
	free(A), free(B), free(T), free(M), free(al);
	return rc;
}

/* ---- cheap estimate (for the sign search) --------------------------------- */

int64_t x3_estimate_strips(int64_t n)
{
	int64_t tn = n / 16, s = tn / 8;
	if (s < X3_EST_MIN_STRIPS)
		s = X3_EST_MIN_STRIPS;
	return s < tn ? s : tn;
}

/* The output metric M = R H R, R = Hb diag(|su|) Hb, of a rotated H (k x k):
 * H is Hb diag(sigma_u) H0 diag(sigma_u) Hb, so M is the Hessian of the
 * reconstruction's input side diag(su) Hb (exl3(5) section 1.2), the true
 * output error's metric up to the output scales. */
static float *output_metric(const float *H, const float *su, int64_t k)
{
	float *M = xmalloc((size_t)(k * k), sizeof(float));
	if (!M)
		return NULL;
	memcpy(M, H, (size_t)(k * k) * sizeof(float));
	x3_had128_rows(M, k, k);
	x3_had128_cols(M, k, k);
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < k; j++)
			M[i * k + j] *= fabsf(su[i]) * fabsf(su[j]);
	x3_had128_rows(M, k, k);
	x3_had128_cols(M, k, k);
	return M;
}

int x3_quantize_estimate(const x3_qweight *w, const x3_qhess *h, int K, int cb,
                         int threads, int64_t strips, int metric, double *g, double *err)
{
	*err = -1;
	if (K < 1 || K > 8)
		return x3_err(X3_EINVAL, "K=%d is outside 1..8", K);
	if (cb < 0 || cb >= X3_CB_COUNT)
		return x3_err(X3_EINVAL, "bad codebook id %d", cb);
	int64_t k = w->k, n = w->n, tn = n / 16;
	if (k < 1 || tn < 1)
		return x3_err(X3_EINVAL, "a %lldx%lld weight has no 16x16 tiles", (long long)k,
		              (long long)n);
	if (h->k != k)
		return x3_err(X3_EINVAL, "hessian is %lldx%lld but the weight has %lld (padded) inputs",
		              (long long)h->k, (long long)h->k, (long long)k);
	if (w->zeros) {
		*err = 0;
		return X3_OK;
	}
	if (strips <= 0 || strips > tn)
		strips = tn;
	int rc;
	if (!(*g > 0) && (rc = x3_scale_search(w->W, k, n, K, cb, threads, g)))
		return rc;
	/* the strips: 16 output columns each, evenly spaced; LDLQ feeds the
	 * error back along the input only, so a strip quantizes as it would in
	 * the whole matrix */
	int64_t ns = 16 * strips;
	float *Ws = xmalloc((size_t)(k * ns), sizeof(float));
	float *Q = xmalloc((size_t)(k * ns), sizeof(float));
	uint16_t *st = xmalloc((size_t)(k * ns), sizeof(uint16_t));
	if (!Ws || !Q || !st) {
		free(Ws), free(Q), free(st);
		return x3_err(X3_ENOMEM, "out of memory for the estimate of a %lldx%lld weight",
		              (long long)k, (long long)n);
	}
	float gf = (float)*g;
	for (int64_t s = 0; s < strips; s++) {
		int64_t c0 = 16 * ((2 * s + 1) * tn / (2 * strips));
		for (int64_t i = 0; i < k; i++)
			for (int j = 0; j < 16; j++)
				Ws[i * ns + 16 * s + j] = w->W[i * n + c0 + j] * gf;
	}
	rc = x3_ldlq(Ws, k, ns, h->fallback ? NULL : h->L, K, cb, threads, st, Q);
	float *M = NULL;
	if (!rc && metric == X3_EST_OUTPUT && !h->fallback && !(M = output_metric(h->H, w->su, k)))
		rc = x3_err(X3_ENOMEM, "out of memory for the output metric");
	if (!rc)
		rc = x3_proxy_error(Ws, Q, h->fallback ? NULL : M ? M : h->H, k, ns, err);
	free(Ws), free(Q), free(st), free(M);
	return rc;
}
