/* linear.c: dense or EXL3 linear layers for the model forward. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include "exl3.h"
#include "linear.h"

/* Batches of at least this many rows multiply an EXL3 linear through a
 * dense reconstruction made once (sgemm beats decoding tiles per call);
 * smaller ones (generation) use the decode-in-the-loop matmul. */
#define EXL3_DENSE_ROWS 64

struct x3_linear {
	int64_t in, out;
	float *w;       /* (out, in) dense weight, or NULL */
	float *b;       /* (out) or NULL */
	x3_exl3 *q;     /* EXL3 linear, or NULL */
	char *key;
};

static int is_float(x3_dtype t) { return t == X3_F32 || t == X3_F16 || t == X3_BF16; }

static int check_tensor(const x3_tensor *t, const char *name, int rank, int64_t d0, int64_t d1)
{
	char b[64];
	if (!t)
		return x3_err(X3_EFORMAT, "tensor '%s' is missing", name);
	if (!is_float(t->dtype))
		return x3_err(X3_EFORMAT, "tensor '%s': dtype %s (F32, F16 or BF16 expected)",
		              name, x3_dtype_name(t->dtype));
	if (t->rank != rank || t->shape[0] != d0 || (rank > 1 && t->shape[1] != d1)) {
		if (rank == 1)
			return x3_err(X3_EFORMAT, "tensor '%s': shape %s, config says %lld", name,
			              x3_shape_str(t, b, sizeof b), (long long)d0);
		return x3_err(X3_EFORMAT, "tensor '%s': shape %s, config says %lldx%lld", name,
		              x3_shape_str(t, b, sizeof b), (long long)d0, (long long)d1);
	}
	return X3_OK;
}

/* The EXL3 group of key: padded sizes k, n are multiples of 128 that hold
 * in, out with less than 128 of padding (spec §1). */
static int open_exl3(x3_st *st, const char *key, int64_t in, int64_t out, int bias,
                     int check_only, x3_linear **lin)
{
	x3_exl3 *q;
	int rc = x3_exl3_from_st(st, key, &q);
	if (rc)
		return rc;
	int64_t k = x3_exl3_k(q), n = x3_exl3_n(q);
	if (k < in || n < out || k - in >= 128 || n - out >= 128) {
		x3_exl3_free(q);
		return x3_err(X3_EFORMAT, "tensor '%s.trellis': padded size %lldx%lld does not "
		              "hold %lldx%lld (in x out) from the config", key, (long long)k,
		              (long long)n, (long long)in, (long long)out);
	}
	if (bias && !x3_exl3_has_bias(q)) {
		x3_exl3_free(q);
		return x3_err(X3_EFORMAT, "tensor '%s.bias' is missing", key);
	}
	if ((rc = x3_exl3_set_orig(q, in, out))) {
		x3_exl3_free(q);
		return x3_errprefix(rc, "tensor '%s.trellis'", key);
	}
	if (check_only) {
		x3_exl3_free(q);
		return X3_OK;
	}
	x3_linear *l = calloc(1, sizeof *l);
	if (!l || !(l->key = strdup(key))) {
		free(l);
		x3_exl3_free(q);
		return x3_err(X3_ENOMEM, "tensor '%s.trellis': out of memory", key);
	}
	l->in = in, l->out = out, l->q = q;
	*lin = l;
	return X3_OK;
}

int x3_linear_open(x3_st *st, const char *key, int64_t in, int64_t out, int bias,
                   int check_only, x3_linear **lin)
{
	char wn[300], bn[300], tn[300];
	snprintf(wn, sizeof wn, "%s.weight", key);
	snprintf(bn, sizeof bn, "%s.bias", key);
	snprintf(tn, sizeof tn, "%s.trellis", key);
	const x3_tensor *w = x3_st_find(st, wn);
	if (!w && x3_st_find(st, tn))
		return open_exl3(st, key, in, out, bias, check_only, lin);
	int rc = check_tensor(w, wn, 2, out, in);
	const x3_tensor *b = NULL;
	if (!rc && bias) {
		b = x3_st_find(st, bn);
		rc = check_tensor(b, bn, 1, out, 0);
	}
	if (rc || check_only)
		return rc;
	x3_linear *l = calloc(1, sizeof *l);
	if (!l)
		return x3_err(X3_ENOMEM, "tensor '%s': out of memory", wn);
	l->in = in, l->out = out;
	l->w = x3_tensor_f32(w);
	if (!l->w || (b && !(l->b = x3_tensor_f32(b)))) {
		x3_linear_free(l);
		return x3_errprefix(X3_ENOMEM, "tensor '%s'", wn);
	}
	*lin = l;
	return X3_OK;
}

int x3_linear_apply(x3_linear *l, const float *x, int64_t rows, float *y)
{
	if (rows <= 0)
		return X3_OK;
	if (l->q && !l->w && rows < EXL3_DENSE_ROWS) {
		int rc = x3_exl3_matmul(l->q, x, rows, l->in, y, 0);
		return rc ? x3_errprefix(rc, "linear '%s'", l->key) : X3_OK;
	}
	if (l->q && !l->w) {
		/* dense reconstruction, once; the bias comes from the matmul of
		 * a zero row (y = 0·Wᵀ + b) */
		l->w = malloc((size_t)(l->out * l->in) * sizeof *l->w);
		float *z = calloc((size_t)l->in, sizeof *z);
		if (x3_exl3_has_bias(l->q))
			l->b = malloc((size_t)l->out * sizeof *l->b);
		int rc = !l->w || !z || (x3_exl3_has_bias(l->q) && !l->b)
		         ? x3_err(X3_ENOMEM, "out of memory") : x3_exl3_dequant(l->q, l->w);
		if (!rc && l->b)
			rc = x3_exl3_matmul(l->q, z, 1, l->in, l->b, 1);
		free(z);
		if (rc) {
			free(l->w), free(l->b);
			l->w = l->b = NULL;
			return x3_errprefix(rc, "linear '%s'", l->key);
		}
	}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)l->out, (int)l->in,
	            1.0f, x, (int)l->in, l->w, (int)l->in, 0.0f, y, (int)l->out);
	if (l->b) {
		#pragma omp parallel for if(rows * l->out > (1 << 16)) schedule(static)
		for (int64_t r = 0; r < rows; r++)
			for (int64_t o = 0; o < l->out; o++)
				y[r * l->out + o] += l->b[o];
	}
	return X3_OK;
}

int x3_linear_is_exl3(const x3_linear *l) { return l->q != NULL; }

void x3_linear_free(x3_linear *l)
{
	if (!l)
		return;
	free(l->w);
	free(l->b);
	free(l->key);
	x3_exl3_free(l->q);
	free(l);
}
