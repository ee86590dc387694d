/* linear.c: dense or EXL3 linear layers for the model forward. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include "linear.h"

struct x3_linear {
	int64_t in, out;
	float *w;       /* (out, in) dense weight, or NULL */
	float *b;       /* (out) or NULL */
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

int x3_linear_open(x3_st *st, const char *key, int64_t in, int64_t out, int bias,
                   int check_only, x3_linear **lin)
{
	char wn[300], bn[300], tn[300];
	snprintf(wn, sizeof wn, "%s.weight", key);
	snprintf(bn, sizeof bn, "%s.bias", key);
	snprintf(tn, sizeof tn, "%s.trellis", key);
	const x3_tensor *w = x3_st_find(st, wn);
	if (!w && x3_st_find(st, tn))
		return x3_err(X3_EUNSUP, "tensor '%s': EXL3 linears are not supported yet", tn);
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

int x3_linear_apply(const x3_linear *l, const float *x, int64_t rows, float *y)
{
	if (rows <= 0)
		return X3_OK;
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

int x3_linear_is_exl3(const x3_linear *l) { (void)l; return 0; }

void x3_linear_free(x3_linear *l)
{
	if (!l)
		return;
	free(l->w);
	free(l->b);
	free(l);
}
