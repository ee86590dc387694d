/* linear.c: dense or EXL3 linear layers for the model forward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "blas.h"
#include "device.h"
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
	/* a dense weight's source: rows [row0, row0 + out) of the (rows, in)
	 * tensor src, borrowed from the open checkpoint; with on_use the F32
	 * weight is made from it for each x3_linear_apply (in wb when it is
	 * set and free) and let go after */
	const x3_tensor *src;
	int64_t row0, rows;
	int on_use;
	x3_wbuf *wb;
	/* on the device (x3_linear_set_device cuda): a dense weight, or an
	 * EXL3 linear plus, made on the first batch of more than
	 * GPU_GEMV_ROWS rows, its dense reconstruction */
	int dev;
	const x3_gpu *gpu;   /* the backend, on the device */
	x3_gpu_dense *gd;
	x3_gpu_linear *gq;
};

/* EXL3 batches up to this many rows go through the fused fp32 GEMV
 * (device.h linear_forward_d path 3, m <= 16), larger ones through the dense
 * reconstruction and SGEMM. */
#define GPU_GEMV_ROWS 16

static int check_finite(const float *v, int64_t rows, int64_t cols, const char *name)
{
	for (int64_t i = 0; i < rows * cols; i++)
		if (!isfinite(v[i])) {
			if (rows == 1)
				return x3_err(X3_EFORMAT, "tensor '%s': non-finite value %g at [%lld]", name,
				              (double)v[i], (long long)i);
			return x3_err(X3_EFORMAT, "tensor '%s': non-finite value %g at [%lld][%lld]", name,
			              (double)v[i], (long long)(i / cols), (long long)(i % cols));
		}
	return X3_OK;
}

/* The EXL3 group of key: padded sizes k, n are multiples of 128 that hold
 * in, out with less than 128 of padding (exl3(5) §1.1). */
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

/* rows [row0, row0 + n) of the (rows, cols) tensor t into dst as F32, in
 * blocks over the threads (each element converted alone: the same values
 * as x3_tensor_f32's), then the mapped pages read dropped. t is not
 * block-scaled. */
static int rows_f32_into(const x3_tensor *t, int64_t row0, int64_t n, int64_t cols, float *dst)
{
	const size_t es = x3_dtype_size(t->dtype), cnt = (size_t)(n * cols), B = (size_t)1 << 20;
	const char *p = (const char *)t->data + (size_t)(row0 * cols) * es;
	const int64_t nb = (int64_t)((cnt + B - 1) / B);
	int fail = 0;
	#pragma omp parallel for schedule(static) if(nb > 1)
	for (int64_t b = 0; b < nb; b++) {
		const size_t i0 = (size_t)b * B, m = cnt - i0 < B ? cnt - i0 : B;
		if (x3_convert(dst + i0, X3_F32, p + i0 * es, t->dtype, m) != X3_OK) {
			#pragma omp atomic write
			fail = 1;
		}
	}
	if (fail)
		return x3_err(X3_EUNSUP, "tensor '%s': cannot convert %s to F32", t->name,
		              x3_dtype_name(t->dtype));
	x3_st_drop(t, p, cnt * es);
	return X3_OK;
}

/* Rows [row0, row0 + n) of the (rows, cols) tensor t as F32 (malloc'd):
 * all of it when n is its row count. Only those rows are read (an expert
 * of a fused 3-D tensor is a small part of it), but of a block-scaled
 * tensor, which x3_tensor_f32 converts whole. */
static float *rows_f32(const x3_tensor *t, int64_t row0, int64_t n, int64_t rows, int64_t cols)
{
	if (!t->scale_inv && t->data) {
		float *r = malloc((size_t)(n * cols) * sizeof *r + 1);
		if (!r) {
			x3_err(X3_ENOMEM, "out of memory converting '%s'", t->name);
			return NULL;
		}
		if (rows_f32_into(t, row0, n, cols, r)) {
			free(r);
			return NULL;
		}
		return r;
	}
	float *all = x3_tensor_f32(t);
	if (all)
		x3_st_drop(t, t->data, t->nbytes);
	if (!all || n == rows)
		return all;
	float *r = malloc((size_t)(n * cols) * sizeof *r + 1);
	if (r)
		memcpy(r, all + row0 * cols, (size_t)(n * cols) * sizeof *r);
	free(all);
	return r;
}

/* The dense linear KEY from the (rows, in) tensor SRC.weight (and
 * SRC.bias), rows [row0, row0 + out) of it: SRC = KEY, row0 = 0, rows =
 * out for a linear of its own. */
static int open_dense(x3_st *st, const char *key, const char *src, int64_t row0, int64_t rows,
                      int64_t in, int64_t out, int bias, int check_only, x3_linear **lin)
{
	char wn[300], bn[300];
	snprintf(wn, sizeof wn, "%s.weight", src);
	snprintf(bn, sizeof bn, "%s.bias", src);
	const x3_tensor *w = x3_st_find(st, wn), *b = NULL;
	int rc;
	if (!w && src != key && (w = x3_st_find(st, src)) && w->rank == 3) {
		/* the experts of a layer fused in one 3-D (experts, rows /
		 * experts, in) tensor SRC (arch.h x3_fused_expert): its rows */
		char sh[64];
		snprintf(wn, sizeof wn, "%s", src);
		if (bias)
			return x3_err(X3_EFORMAT, "linear '%s': a bias, but its weight is in the fused '%s'", key, src);
		if (w->shape[0] <= 0 || w->shape[0] * w->shape[1] != rows || w->shape[2] != in)
			return x3_err(X3_EFORMAT, "tensor '%s': shape %s, config says %lld rows of %lld in all", src,
			              x3_shape_str(w, sh, sizeof sh), (long long)rows, (long long)in);
		rc = x3_tensor_check_float(w, wn, 3, w->shape[0], w->shape[1]);
	} else
		rc = x3_tensor_check_float(w, wn, 2, rows, in);
	if (!rc && bias) {
		b = x3_st_find(st, bn);
		rc = x3_tensor_check_float(b, bn, 1, rows, 0);
	}
	if (rc || check_only)
		return rc;
	x3_linear *l = calloc(1, sizeof *l);
	if (!l || !(l->key = strdup(key))) {
		free(l);
		return x3_err(X3_ENOMEM, "tensor '%s': out of memory", wn);
	}
	l->in = in, l->out = out;
	l->src = w, l->row0 = row0, l->rows = rows;
	l->w = rows_f32(w, row0, out, rows, in);
	if (!l->w || (b && !(l->b = rows_f32(b, row0, out, rows, 1)))) {
		x3_linear_free(l);
		return x3_errprefix(X3_ENOMEM, "tensor '%s'", wn);
	}
	/* one NaN or Inf in a weight makes every output row non-finite: name
	 * it here rather than let every calibration row be dropped later */
	if ((rc = check_finite(l->w, out, in, wn)) || (l->b && (rc = check_finite(l->b, 1, out, bn)))) {
		x3_linear_free(l);
		return rc;
	}
	*lin = l;
	return X3_OK;
}

int x3_linear_open(x3_st *st, const char *key, int64_t in, int64_t out, int bias,
                   int check_only, x3_linear **lin)
{
	char wn[300], tn[300];
	snprintf(wn, sizeof wn, "%s.weight", key);
	snprintf(tn, sizeof tn, "%s.trellis", key);
	if (!x3_st_find(st, wn) && x3_st_find(st, tn))
		return open_exl3(st, key, in, out, bias, check_only, lin);
	return open_dense(st, key, key, 0, out, in, out, bias, check_only, lin);
}

int x3_linear_open_rows(x3_st *st, const char *key, const char *src, int64_t row0, int64_t src_rows,
                        int64_t in, int64_t out, int bias, int check_only, x3_linear **lin)
{
	char wn[300], tn[300];
	snprintf(wn, sizeof wn, "%s.weight", key);
	snprintf(tn, sizeof tn, "%s.trellis", key);
	/* a converted (EXL3) or split checkpoint holds KEY itself */
	if (!src || !strcmp(src, key) || x3_st_find(st, wn) || x3_st_find(st, tn))
		return x3_linear_open(st, key, in, out, bias, check_only, lin);
	if (row0 < 0 || row0 + out > src_rows)
		return x3_err(X3_EINVAL, "linear '%s': rows %lld..%lld past the %lld rows of '%s.weight'", key,
		              (long long)row0, (long long)(row0 + out), (long long)src_rows, src);
	return open_dense(st, key, src, row0, src_rows, in, out, bias, check_only, lin);
}

/* The fp32 bias of an EXL3 linear: the product of a zero row (y = 0·Wᵀ + b),
 * as the CPU path takes it. */
static int exl3_bias(x3_linear *l, float **b)
{
	*b = NULL;
	if (!x3_exl3_has_bias(l->q))
		return X3_OK;
	float *z = calloc((size_t)l->in, sizeof *z);
	*b = malloc((size_t)l->out * sizeof **b);
	int rc = !z || !*b ? x3_err(X3_ENOMEM, "out of memory") : x3_exl3_matmul(l->q, z, 1, l->in, *b, 1);
	free(z);
	if (rc)
		free(*b), *b = NULL;
	return rc;
}

/* The dense reconstruction of an EXL3 linear on the device, from the
 * device's decode (linear_weight, fp32): (k, n) to HF (out, in). */
static int exl3_gpu_dense(x3_linear *l)
{
	int64_t k = x3_exl3_k(l->q), n = x3_exl3_n(l->q);
	float *wk = malloc((size_t)(k * n) * sizeof *wk);
	float *w = malloc((size_t)(l->out * l->in) * sizeof *w), *b = NULL;
	int rc = !wk || !w ? x3_err(X3_ENOMEM, "out of memory") : l->gpu->linear_weight(l->gq, 0, wk);
	if (!rc) {
		for (int64_t o = 0; o < l->out; o++)
			for (int64_t i = 0; i < l->in; i++)
				w[o * l->in + i] = wk[i * n + o];
		rc = exl3_bias(l, &b);
	}
	if (!rc)
		rc = l->gpu->dense_create(w, b, l->in, l->out, &l->gd);
	free(wk), free(w), free(b);
	return rc;
}

/* An EXL3 batch of at most GPU_GEMV_ROWS rows: x zero-extended to k, the
 * fp32 GEMV, y trimmed to out. */
static int exl3_gpu_gemv(x3_linear *l, const float *x, int64_t rows, float *y)
{
	const x3_gpu *g = l->gpu;
	int64_t k = x3_exl3_k(l->q), n = x3_exl3_n(l->q);
	float *xk = calloc((size_t)(rows * k), sizeof *xk);
	float *yn = malloc((size_t)(rows * n) * sizeof *yn);
	float *x_d = NULL, *y_d = NULL;
	int rc = !xk || !yn ? x3_err(X3_ENOMEM, "out of memory") : X3_OK;
	if (!rc) {
		for (int64_t r = 0; r < rows; r++)
			memcpy(xk + r * k, x + r * l->in, (size_t)l->in * sizeof *xk);
		rc = g->alloc((void **)&x_d, (size_t)(rows * k) * sizeof(float));
	}
	if (!rc)
		rc = g->alloc((void **)&y_d, (size_t)(rows * n) * sizeof(float));
	if (!rc)
		rc = g->upload(x_d, xk, (size_t)(rows * k) * sizeof(float));
	if (!rc)
		rc = g->linear_forward_d(l->gq, x_d, rows, y_d, 3);
	if (!rc)
		rc = g->download(yn, y_d, (size_t)(rows * n) * sizeof(float));
	if (!rc)
		for (int64_t r = 0; r < rows; r++)
			memcpy(y + r * l->out, yn + r * n, (size_t)l->out * sizeof *y);
	g->free(x_d), g->free(y_d);
	free(xk), free(yn);
	return rc;
}

static int apply_gpu(x3_linear *l, const float *x, int64_t rows, float *y)
{
	int rc = X3_OK;
	if (l->q && rows <= GPU_GEMV_ROWS) {
		rc = exl3_gpu_gemv(l, x, rows, y);
	} else {
		if (!l->gd)
			rc = exl3_gpu_dense(l);
		if (!rc)
			rc = l->gpu->dense_forward(l->gd, x, rows, y);
	}
	return rc ? x3_errprefix(rc, "linear '%s' on cuda", l->key) : X3_OK;
}

/* back to the CPU: free what is on the device */
static void gpu_release(x3_linear *l)
{
	if (l->gd)
		l->gpu->dense_free(l->gd);
	if (l->gq)
		l->gpu->linear_free(l->gq);
	l->gd = NULL, l->gq = NULL;
	l->dev = X3_DEVICE_CPU;
}

int x3_linear_on_use(x3_linear *l, x3_wbuf *buf)
{
	if (l->q || !l->src || l->dev != X3_DEVICE_CPU)
		return X3_OK;
	free(l->w);
	l->w = NULL;
	l->on_use = 1;
	l->wb = buf;
	return X3_OK;
}

void x3_wbuf_free(x3_wbuf *b)
{
	if (!b)
		return;
	free(b->p);
	b->p = NULL, b->cap = 0, b->busy = 0;
}

/* The F32 weight of an on_use linear, made now: in l->wb (*from_buf set;
 * the caller gives it back with wb->busy = 0) where it is set and free,
 * else allocated (the caller frees it). */
static int use_weight(const x3_linear *l, float **w, int *from_buf)
{
	x3_wbuf *b = l->wb;
	const size_t need = (size_t)(l->out * l->in);
	*from_buf = 0;
	if (b && !b->busy && !l->src->scale_inv && l->src->data) {
		if (b->cap < need) {
			free(b->p);   /* nothing in it to keep: no realloc's copy */
			b->cap = 0;
			if (!(b->p = malloc(need * sizeof *b->p + 1)))
				return x3_err(X3_ENOMEM, "linear '%s': out of memory for its F32 weight", l->key);
			b->cap = need;
		}
		int rc = rows_f32_into(l->src, l->row0, l->out, l->in, b->p);
		if (rc)
			return x3_errprefix(rc, "linear '%s'", l->key);
		b->busy = 1;
		*w = b->p;
		*from_buf = 1;
		return X3_OK;
	}
	*w = rows_f32(l->src, l->row0, l->out, l->rows, l->in);
	return *w ? X3_OK : x3_errprefix(X3_ENOMEM, "linear '%s'", l->key);
}

/* done with use_weight's w */
static void put_weight(const x3_linear *l, float *w, int from_buf)
{
	if (from_buf)
		l->wb->busy = 0;
	else
		free(w);
}

int x3_linear_set_device(x3_linear *l, int dev)
{
	if (dev != X3_DEVICE_CPU && dev != X3_DEVICE_CUDA)
		return x3_err(X3_EINVAL, "linear '%s': device %s (cpu or cuda expected)", l->key,
		              x3_device_name(dev));
	if (dev == l->dev)
		return X3_OK;
	gpu_release(l);
	if (dev == X3_DEVICE_CPU)
		return X3_OK;
	int rc = x3_gpu_open(&l->gpu);
	float *tw = NULL;
	int fb = 0;
	if (!rc && !l->q && l->on_use)
		rc = use_weight(l, &tw, &fb);
	if (!rc)
		rc = l->q ? x3_exl3_upload(l->q, l->gpu, &l->gq)
		          : l->gpu->dense_create(tw ? tw : l->w, l->b, l->in, l->out, &l->gd);
	put_weight(l, tw, fb);
	if (rc)
		return x3_errprefix(rc, "linear '%s': upload to cuda", l->key);
	l->dev = X3_DEVICE_CUDA;
	return X3_OK;
}

int x3_linear_apply(x3_linear *l, const float *x, int64_t rows, int64_t seg, float *y)
{
	if (rows <= 0)
		return X3_OK;
	if (l->dev == X3_DEVICE_CUDA)
		return apply_gpu(l, x, rows, y);
	if (l->q && !l->w && rows < EXL3_DENSE_ROWS) {
		int rc = x3_exl3_matmul(l->q, x, rows, l->in, y, 0);
		return rc ? x3_errprefix(rc, "linear '%s'", l->key) : X3_OK;
	}
	if (l->q && !l->w) {
		/* dense reconstruction, once; the bias comes from the matmul of
		 * a zero row (y = 0·Wᵀ + b) */
		l->w = malloc((size_t)(l->out * l->in) * sizeof *l->w);
		int rc = !l->w ? x3_err(X3_ENOMEM, "out of memory") : x3_exl3_dequant(l->q, l->w);
		if (!rc)
			rc = exl3_bias(l, &l->b);
		if (rc) {
			free(l->w), free(l->b);
			l->w = l->b = NULL;
			return x3_errprefix(rc, "linear '%s'", l->key);
		}
	}
	float *tw = NULL;
	int fb = 0;
	if (l->on_use && !l->w) {
		int rc = use_weight(l, &tw, &fb);
		if (rc)
			return rc;
	}
	/* fixed row blocks from each segment's start: a row's output does not
	 * depend on the batch it is in or on the thread count (blas.h) */
	int rc = x3_gemm_xwt(x, rows, seg, l->in, tw ? tw : l->w, l->out, y);
	put_weight(l, tw, fb);
	if (rc)
		return x3_errprefix(rc, "linear '%s'", l->key);
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
	gpu_release(l);
	free(l);
}
