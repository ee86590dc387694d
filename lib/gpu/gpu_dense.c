/* gpu_dense.c: a dense F32 linear on the device (device.h dense_*),
 * for the model forward of hessian-capture and model-eval: the weight is
 * uploaded once, then y = x Wᵀ (+ bias) is one cuBLAS SGEMM (fp32 inputs,
 * fp32 accumulation: CUBLAS_DEFAULT_MATH, no TF32) per block of rows and
 * the bias a rank-1 update (an SGEMM of inner size 1 with beta = 1:
 * y + b·1 rounded once, as the CPU's y += b). Equal to linear.c's
 * cblas_sgemm up to the summation order. Only cublasSgemm is used, so the
 * CPU emulator of tests/gpu/cusim runs this file unchanged. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <cublas_v2.h>

#include "gpu_impl.h"

/* Device staging of host rows: at most this many floats per buffer. */
#define DENSE_STAGE_FLOATS ((int64_t)1 << 24)

struct x3_gpu_dense {
	int64_t in, out;
	float *w_d;      /* (out, in) row-major = (in, out) column-major */
	float *b_d;      /* (out) or NULL */
	float *ones_d;   /* (stage_rows) ones, for the bias update */
	float *x_d, *y_d;/* (stage_rows, in), (stage_rows, out) staging */
	int64_t stage_rows;
	cublasHandle_t blas;
};

void x3_gpu_dense_free(x3_gpu_dense *d)
{
	if (!d)
		return;
	x3_gpu_free(d->w_d);
	x3_gpu_free(d->b_d);
	x3_gpu_free(d->ones_d);
	x3_gpu_free(d->x_d);
	x3_gpu_free(d->y_d);
	if (d->blas)
		cublasDestroy(d->blas);
	free(d);
}

int x3_gpu_dense_create(const float *w, const float *bias, int64_t in, int64_t out,
                        x3_gpu_dense **res)
{
	*res = NULL;
	if (!w || in <= 0 || out <= 0 || in > INT_MAX || out > INT_MAX ||
	    in > INT64_MAX / out / (int64_t)sizeof(float))
		return x3_err(X3_EINVAL, "dense linear: bad arguments (%lldx%lld)", (long long)out,
		              (long long)in);
	if (!x3_gpu_dev_available())
		return X3_EUNSUP;
	x3_gpu_dense *d = calloc(1, sizeof *d);
	if (!d)
		return x3_err(X3_ENOMEM, "out of memory");
	d->in = in, d->out = out;
	const size_t wb = (size_t)(in * out) * sizeof(float);
	int rc = x3_gpu_alloc((void **)&d->w_d, wb);
	if (!rc)
		rc = x3_gpu_upload(d->w_d, w, wb);
	if (!rc && bias) {
		rc = x3_gpu_alloc((void **)&d->b_d, (size_t)out * sizeof(float));
		if (!rc)
			rc = x3_gpu_upload(d->b_d, bias, (size_t)out * sizeof(float));
	}
	if (!rc)
		rc = x3_gpu_blaserr(cublasCreate(&d->blas), "create handle");
	if (!rc)
		rc = x3_gpu_blaserr(cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH), "set math mode");
	if (rc) {
		x3_gpu_dense_free(d);
		return rc;
	}
	*res = d;
	return X3_OK;
}

size_t x3_gpu_dense_bytes(const x3_gpu_dense *d)
{
	if (!d)
		return 0;
	return (size_t)((d->in * d->out + (d->b_d ? d->out : 0) +
	                 d->stage_rows * (d->in + d->out + 1)) * (int64_t)sizeof(float));
}

/* Ones (rows) on the device for the bias update, grown on demand. */
static int ensure_ones(x3_gpu_dense *d, int64_t rows, float **ones_d, int *own)
{
	*own = 0;
	if (rows <= d->stage_rows && d->ones_d) {
		*ones_d = d->ones_d;
		return X3_OK;
	}
	float *h = malloc((size_t)rows * sizeof *h);
	if (!h)
		return x3_err(X3_ENOMEM, "out of memory");
	for (int64_t i = 0; i < rows; i++)
		h[i] = 1.0f;
	int rc = x3_gpu_alloc((void **)ones_d, (size_t)rows * sizeof(float));
	if (!rc)
		rc = x3_gpu_upload(*ones_d, h, (size_t)rows * sizeof(float));
	free(h);
	if (rc) {
		x3_gpu_free(*ones_d);
		*ones_d = NULL;
		return rc;
	}
	*own = 1;
	return X3_OK;
}

/* y_d (rows, out) = x_d (rows, in) Wᵀ + b, rows <= INT_MAX. */
static int dense_block(x3_gpu_dense *d, const float *x_d, int64_t rows, float *y_d,
                       float *ones_d)
{
	/* column-major view: X' = x^T (in, rows), W' = W^T (in, out),
	 * Y' = y^T (out, rows) = W'^T X' */
	const float one = 1.0f, zero = 0.0f;
	int rc = x3_gpu_blaserr(cublasSgemm(d->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)d->out, (int)rows,
	                             (int)d->in, &one, d->w_d, (int)d->in, x_d, (int)d->in, &zero,
	                             y_d, (int)d->out), "sgemm");
	/* Y' += b 1^T: (out, 1) times (1, rows) */
	if (!rc && d->b_d)
		rc = x3_gpu_blaserr(cublasSgemm(d->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)d->out, (int)rows, 1,
		                         &one, d->b_d, (int)d->out, ones_d, 1, &one, y_d,
		                         (int)d->out), "sgemm (bias)");
	return rc;
}

int x3_gpu_dense_forward_d(x3_gpu_dense *d, const float *x_d, int64_t rows, float *y_d)
{
	if (!d || rows < 0 || (rows > 0 && (!x_d || !y_d)))
		return x3_err(X3_EINVAL, "dense linear: bad arguments");
	int rc = X3_OK;
	for (int64_t r0 = 0; !rc && r0 < rows; r0 += INT_MAX / 2) {
		const int64_t nr = rows - r0 < INT_MAX / 2 ? rows - r0 : INT_MAX / 2;
		float *ones_d = NULL;
		int own = 0;
		if (d->b_d && (rc = ensure_ones(d, nr, &ones_d, &own)))
			break;
		rc = dense_block(d, x_d + r0 * d->in, nr, y_d + r0 * d->out, ones_d);
		if (own)
			x3_gpu_free(ones_d);
	}
	return rc ? rc : x3_gpu_sync();
}

int x3_gpu_dense_forward(x3_gpu_dense *d, const float *x, int64_t rows, float *y)
{
	if (!d || rows < 0 || (rows > 0 && (!x || !y)))
		return x3_err(X3_EINVAL, "dense linear: bad arguments");
	if (rows == 0)
		return X3_OK;
	int64_t wide = d->in > d->out ? d->in : d->out;
	int64_t stage = DENSE_STAGE_FLOATS / wide;
	if (stage < 1)
		stage = 1;
	if (stage > rows)
		stage = rows;
	int rc = X3_OK;
	if (stage > d->stage_rows) {
		/* grow the staging buffers (and the ones) to this block size */
		x3_gpu_free(d->x_d), x3_gpu_free(d->y_d), x3_gpu_free(d->ones_d);
		d->x_d = d->y_d = d->ones_d = NULL;
		d->stage_rows = 0;
		rc = x3_gpu_alloc((void **)&d->x_d, (size_t)(stage * d->in) * sizeof(float));
		if (!rc)
			rc = x3_gpu_alloc((void **)&d->y_d, (size_t)(stage * d->out) * sizeof(float));
		if (!rc && d->b_d) {
			int own;
			rc = ensure_ones(d, stage, &d->ones_d, &own);
		}
		if (rc) {
			x3_gpu_free(d->x_d), x3_gpu_free(d->y_d), x3_gpu_free(d->ones_d);
			d->x_d = d->y_d = d->ones_d = NULL;
			return rc;
		}
		d->stage_rows = stage;
	}
	for (int64_t r0 = 0; !rc && r0 < rows; r0 += d->stage_rows) {
		const int64_t nr = rows - r0 < d->stage_rows ? rows - r0 : d->stage_rows;
		rc = x3_gpu_upload(d->x_d, x + r0 * d->in, (size_t)(nr * d->in) * sizeof(float));
		if (!rc)
			rc = dense_block(d, d->x_d, nr, d->y_d, d->ones_d);
		if (!rc)
			rc = x3_gpu_download(y + r0 * d->out, d->y_d, (size_t)(nr * d->out) * sizeof(float));
	}
	return rc;
}
