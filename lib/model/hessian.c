/* hessian.c: H = Σ xᵀx accumulators (see hessian.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "blas.h"
#include "device.h"
#include "hessian.h"
#include "io.h"

/* The sum runs over chunks of rows (x3_hess_end_chunk): the open chunk's
 * rows are summed into part, and a chunk that ends is added to tot, so H =
 * ((P0 + P1) + P2) + ... in double, in chunk order. A merge of the chunks'
 * partial frames (x3_hess_add_frame, in chunk order) is the same sum, bit
 * for bit. Both sums hold the upper triangle only, packed (blas.h
 * x3_tri_at): half of n^2 doubles each, 0.82 GB for an 8B Llama's down_proj
 * input instead of 1.64. With x3_hess_spill, the ended chunks' total is kept
 * in a file while a later chunk runs, so that only one of the two is in
 * memory at a time. */
struct x3_hess {
	char *name, *members;
	int layer, f64;
	int64_t n, count, dropped;
	double *part;   /* the open chunk's sum (x3_tri_size(n), packed), or NULL */
	int popen;      /* rows in the open chunk (part is meaningful) */
	double *tot;    /* the ended chunks' sum (packed), or NULL: none yet, or spilled */
	char *spill;    /* x3_hess_spill's directory, or NULL */
	int sfd;        /* the spilled total's file (unlinked), or -1 */
	const x3_gpu *gpu;  /* the backend of g */
	x3_gpu_hessian *g; /* the open chunk's rows accumulated on the device, or NULL */
	int gopen;      /* rows on the device in the open chunk */
	struct x3_kv *extra;
	int nextra;
};

static const char *const computed[] = { "role", "count", "dropped", "members", "layer",
                                        "x3f", "xxh3" };

int x3_hess_set_meta(x3_hess *h, const char *key, const char *val)
{
	for (size_t i = 0; i < sizeof computed / sizeof *computed; i++)
		if (!strcmp(key, computed[i]))
			return x3_err(X3_EINVAL, "hessian '%s': metadata '%s' is computed", h->name, key);
	for (int i = 0; i < h->nextra; i++)
		if (!strcmp(h->extra[i].key, key)) {
			char *v = strdup(val);
			if (!v)
				return x3_err(X3_ENOMEM, "out of memory");
			free(h->extra[i].val);
			h->extra[i].val = v;
			return X3_OK;
		}
	struct x3_kv *e = realloc(h->extra, (size_t)(h->nextra + 1) * sizeof *e);
	if (!e)
		return x3_err(X3_ENOMEM, "out of memory");
	h->extra = e;
	e[h->nextra].key = strdup(key);
	e[h->nextra].val = strdup(val);
	if (!e[h->nextra].key || !e[h->nextra].val) {
		free(e[h->nextra].key), free(e[h->nextra].val);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	h->nextra++;
	return X3_OK;
}

const char *x3_hess_get_meta(const x3_hess *h, const char *key)
{
	for (int i = 0; i < h->nextra; i++)
		if (!strcmp(h->extra[i].key, key))
			return h->extra[i].val;
	return NULL;
}

int x3_hess_meta_is_computed(const char *key)
{
	for (size_t i = 0; i < sizeof computed / sizeof *computed; i++)
		if (!strcmp(key, computed[i]))
			return 1;
	return 0;
}

int x3_hess_new(const char *name, int64_t n, int f64, const char *members, int layer,
                x3_hess **out)
{
	*out = NULL;
	if (n < 1 || n > (1 << 20))
		return x3_err(X3_EINVAL, "hessian '%s': bad size %lld", name, (long long)n);
	x3_hess *h = calloc(1, sizeof *h);
	if (!h)
		return x3_err(X3_ENOMEM, "hessian '%s': out of memory", name);
	h->name = strdup(name);
	h->members = members ? strdup(members) : NULL;
	h->layer = layer, h->f64 = f64, h->n = n, h->sfd = -1;
	if (!h->name || (members && !h->members)) {
		x3_hess_free(h);
		return x3_err(X3_ENOMEM, "hessian '%s': out of memory", name);
	}
	*out = h;
	return X3_OK;
}

void x3_hess_free(x3_hess *h)
{
	if (!h)
		return;
	free(h->name), free(h->members), free(h->part), free(h->tot), free(h->spill);
	if (h->sfd >= 0)
		close(h->sfd);
	if (h->g)
		h->gpu->hessian_free(h->g);
	for (int i = 0; i < h->nextra; i++)
		free(h->extra[i].key), free(h->extra[i].val);
	free(h->extra);
	free(h);
}

const char *x3_hess_name(const x3_hess *h) { return h->name; }
int64_t x3_hess_count(const x3_hess *h) { return h->count; }
const char *x3_hess_members(const x3_hess *h) { return h->members; }
int64_t x3_hess_dropped(const x3_hess *h) { return h->dropped; }

int x3_hess_too_many_dropped(const x3_hess *h)
{
	return h->dropped * 10 > h->count + h->dropped;
}

int x3_hess_spill(x3_hess *h, const char *dir)
{
	char *d = strdup(dir);
	if (!d)
		return x3_err(X3_ENOMEM, "out of memory");
	free(h->spill);
	h->spill = d;
	return X3_OK;
}

/* The spilled total: whole reads and writes of nb bytes at off. */
static int spill_io(x3_hess *h, int wr, void *buf, size_t nb, off_t off)
{
	if (x3_pio_full(h->sfd, wr, buf, nb, off))
		return x3_err(X3_EIO, "hessian '%s': %s its sum spilled to %s: %s", h->name,
		              wr ? "cannot write" : "cannot read", h->spill, strerror(errno));
	return X3_OK;
}

/* The total to a new unlinked file in the spill directory; freed here. */
static int spill_out(x3_hess *h)
{
	char *path = malloc(strlen(h->spill) + 32);
	if (!path)
		return x3_err(X3_ENOMEM, "out of memory");
	sprintf(path, "%s/x3hess-XXXXXX", h->spill);
	h->sfd = mkstemp(path);
	if (h->sfd < 0) {
		int e = errno;
		free(path);
		return x3_err(X3_EIO, "hessian '%s': cannot make a file in %s to spill its sum to: %s",
		              h->name, h->spill, strerror(e));
	}
	unlink(path);
	free(path);
	int rc = spill_io(h, 1, h->tot, (size_t)x3_tri_size(h->n) * sizeof *h->tot, 0);
	if (rc) {
		close(h->sfd);
		h->sfd = -1;
		return rc;
	}
	free(h->tot);
	h->tot = NULL;
	return X3_OK;
}

/* A copy of the spilled total in memory (the file stays). */
static int spill_read(x3_hess *h, double **tot)
{
	size_t nb = (size_t)x3_tri_size(h->n) * sizeof **tot;
	if (!(*tot = malloc(nb)))
		return x3_err(X3_ENOMEM, "hessian '%s': out of memory", h->name);
	int rc = spill_io(h, 0, *tot, nb, 0);
	if (rc) {
		free(*tot);
		*tot = NULL;
	}
	return rc;
}

/* The spilled total += the open chunk's sum, a block at a time: the same
 * additions, element by element, as the total in memory gets. */
static int spill_add(x3_hess *h)
{
	int64_t nn = x3_tri_size(h->n), B = nn < (1 << 20) ? nn : (1 << 20);
	double *b = malloc((size_t)B * sizeof *b);
	if (!b)
		return x3_err(X3_ENOMEM, "hessian '%s': out of memory", h->name);
	int rc = X3_OK;
	for (int64_t o = 0; o < nn && !rc; o += B) {
		int64_t m = nn - o < B ? nn - o : B;
		size_t nb = (size_t)m * sizeof *b;
		if (!(rc = spill_io(h, 0, b, nb, (off_t)(o * (int64_t)sizeof *b)))) {
			for (int64_t i = 0; i < m; i++)
				b[i] += h->part[o + i];
			rc = spill_io(h, 1, b, nb, (off_t)(o * (int64_t)sizeof *b));
		}
	}
	free(b);
	return rc;
}

/* The total back in memory, the file closed. */
static int unspill(x3_hess *h)
{
	if (h->sfd < 0)
		return X3_OK;
	int rc = spill_read(h, &h->tot);
	if (rc)
		return rc;
	close(h->sfd);
	h->sfd = -1;
	return X3_OK;
}

/* The open chunk's sum, zeroed when it is new. With a spill directory, a
 * total in memory goes to its file first: a chunk after the first. */
static int part_get(x3_hess *h)
{
	if (h->part)
		return X3_OK;
	int rc;
	if (h->spill && h->tot && (rc = spill_out(h)))
		return rc;
	if (!(h->part = calloc((size_t)x3_tri_size(h->n), sizeof *h->part)))
		return x3_err(X3_ENOMEM, "hessian '%s': out of memory for %lldx%lld", h->name,
		              (long long)h->n, (long long)h->n);
	return X3_OK;
}

/* Accumulate a block of finite rows into the open chunk: F32 products of
 * the block (one SGEMM per block of columns) rounded into the chunk's
 * double sum, or with f64 the products in double. */
static int add_block(x3_hess *h, const float *x, int64_t rows)
{
	int64_t n = h->n;
	if (!rows)
		return X3_OK;
	if (h->g) {
		h->gopen = 1;
		return h->gpu->hessian_add(h->g, x, rows);
	}
	int rc = part_get(h);
	if (rc)
		return rc;
	h->popen = 1;
	if (!h->f64)
		return x3_gram_acc_tri_f32_f64(x, rows, n, h->part);
	double *xd = malloc((size_t)(rows * n) * sizeof *xd);
	if (!xd)
		return x3_err(X3_ENOMEM, "hessian '%s': out of memory", h->name);
	for (int64_t i = 0; i < rows * n; i++)
		xd[i] = x[i];
	x3_gram_acc_tri_f64(xd, rows, n, h->part);
	free(xd);
	return X3_OK;
}

/* The device's sum of the open chunk (full symmetric, F32) into gh. */
static int gpu_fetch(const x3_hess *h, float **gh)
{
	*gh = malloc((size_t)(h->n * h->n) * sizeof **gh);
	if (!*gh)
		return x3_err(X3_ENOMEM, "hessian '%s': out of memory", h->name);
	if (h->gpu->hessian_get(h->g, *gh, NULL)) {
		free(*gh);
		*gh = NULL;
		return x3_errprefix(X3_EIO, "hessian '%s' on cuda", h->name);
	}
	return X3_OK;
}

int x3_hess_end_chunk(x3_hess *h)
{
	int64_t nn = x3_tri_size(h->n);
	int rc;
	if (h->g && h->gopen) {
		/* the device's rows join the chunk; a new device sum for the next */
		float *gh;
		if ((rc = gpu_fetch(h, &gh)) || (rc = part_get(h))) {
			free(gh);
			return rc;
		}
		x3_tri_add_full(h->part, h->n, gh, 1, 1.0, 0);
		free(gh);
		h->popen = 1, h->gopen = 0;
		h->gpu->hessian_free(h->g);
		h->g = NULL;
		if ((rc = h->gpu->hessian_create(h->n, &h->g)))
			return x3_errprefix(rc, "hessian '%s' on cuda", h->name);
	}
	if (!h->popen)
		return X3_OK;
	if (h->sfd >= 0) {   /* spilled: added in its file, the chunk's memory freed */
		if ((rc = spill_add(h)))
			return rc;
		free(h->part);
		h->part = NULL;
	} else if (!h->tot) {   /* the first chunk is the sum so far */
		h->tot = h->part;
		h->part = NULL;
	} else {
		for (int64_t i = 0; i < nn; i++)
			h->tot[i] += h->part[i];
		memset(h->part, 0, (size_t)nn * sizeof *h->part);
	}
	h->popen = 0;
	return X3_OK;
}

int x3_hess_set_device(x3_hess *h, int dev)
{
	if (dev == X3_DEVICE_CPU)
		return h->g ? x3_err(X3_EINVAL, "hessian '%s': rows already accumulated on cuda",
		                     h->name) : X3_OK;
	if (dev != X3_DEVICE_CUDA)
		return x3_err(X3_EINVAL, "hessian '%s': device %s (cpu or cuda expected)", h->name,
		              x3_device_name(dev));
	if (h->f64)
		return x3_err(X3_EINVAL, "hessian '%s': F64 accumulation runs on the CPU", h->name);
	if (h->g)
		return X3_OK;
	int rc = x3_gpu_open(&h->gpu);
	if (!rc)
		rc = h->gpu->hessian_create(h->n, &h->g);
	return rc ? x3_errprefix(rc, "hessian '%s' on cuda", h->name) : X3_OK;
}

int x3_hess_add_rows(x3_hess *h, const float *x, int64_t rows, int64_t n)
{
	if (n != h->n)
		return x3_err(X3_EINVAL, "hessian '%s': rows of %lld values, expected %lld",
		              h->name, (long long)n, (long long)h->n);
	/* Split into runs of finite rows; the SYRKs see blocks of >= 64 rows
	 * unless bad rows are dense (then copying beats tiny calls). */
	int64_t bad = 0;
	unsigned char *ok = malloc((size_t)(rows > 0 ? rows : 1));
	if (!ok)
		return x3_err(X3_ENOMEM, "hessian '%s': out of memory", h->name);
	#pragma omp parallel for if(rows * n > (1 << 16)) schedule(static) reduction(+:bad)
	for (int64_t r = 0; r < rows; r++) {
		const float *xr = x + r * n;
		int fin = 1;
		for (int64_t i = 0; i < n; i++)
			fin &= isfinite(xr[i]) != 0;
		ok[r] = (unsigned char)fin;
		bad += !fin;
	}
	int rc = X3_OK;
	if (!bad) {
		rc = add_block(h, x, rows);
	} else {
		float *c = malloc((size_t)((rows - bad) * n + 1) * sizeof *c);
		if (!c) {
			free(ok);
			return x3_err(X3_ENOMEM, "hessian '%s': out of memory", h->name);
		}
		int64_t k = 0;
		for (int64_t r = 0; r < rows; r++)
			if (ok[r])
				memcpy(c + (k++) * n, x + r * n, (size_t)n * sizeof *c);
		rc = add_block(h, c, k);
		free(c);
	}
	free(ok);
	if (!rc) {
		h->count += rows - bad;
		h->dropped += bad;
	}
	return rc;
}

static int add_frame(x3_hess *h, const x3_tensor *t, double w, int64_t rows);

int x3_hess_add_frame(x3_hess *h, const x3_tensor *t)
{
	return add_frame(h, t, 1.0, -1);
}

int x3_hess_add_frame_w(x3_hess *h, const x3_tensor *t, double w, int64_t rows)
{
	return add_frame(h, t, w, rows < 0 ? 0 : rows);
}

/* rows < 0: count and dropped from the frame's metadata */
static int add_frame(x3_hess *h, const x3_tensor *t, double w, int64_t rows)
{
	char b[64];
	if (t->rank != 2 || t->shape[0] != h->n || t->shape[1] != h->n)
		return x3_err(X3_EFORMAT, "frame '%s': shape %s, expected %lldx%lld", t->name,
		              x3_shape_str(t, b, sizeof b), (long long)h->n, (long long)h->n);
	if (t->dtype != X3_F32 && t->dtype != X3_F64)
		return x3_err(X3_EFORMAT, "frame '%s': dtype %s (F32 or F64 expected)", t->name,
		              x3_dtype_name(t->dtype));
	if (!t->data)
		return x3_err(X3_EFORMAT, "frame '%s': no payload", t->name);
	int64_t cnt = 0, drop = 0;
	int rc = x3_meta_get_i64(t, "count", &cnt);
	if (rc || cnt < 0)
		return x3_err(X3_EFORMAT, "frame '%s': %s metadata 'count'", t->name,
		              rc == X3_EINVAL ? "no" : "bad");
	rc = x3_meta_get_i64(t, "dropped", &drop);
	if (rc == X3_EFORMAT || drop < 0)
		return x3_err(X3_EFORMAT, "frame '%s': bad metadata 'dropped'", t->name);
	/* the frame is one more chunk: the open one ends first. Frames are
	 * symmetric; their upper triangle is added (what x3_hess_frame
	 * writes) */
	if ((rc = x3_hess_end_chunk(h)) || (rc = unspill(h)))
		return rc;
	int first = !h->tot;
	if (first && !(h->tot = calloc((size_t)x3_tri_size(h->n), sizeof *h->tot)))
		return x3_err(X3_ENOMEM, "hessian '%s': out of memory for %lldx%lld", h->name,
		              (long long)h->n, (long long)h->n);
	x3_tri_add_full(h->tot, h->n, t->data, t->dtype == X3_F32, w, first);
	h->count += rows < 0 ? cnt : rows;
	h->dropped += rows < 0 ? drop : 0;
	return X3_OK;
}

x3_tensor *x3_hess_frame(const x3_hess *h, x3_dtype dtype)
{
	int64_t n = h->n;
	x3_tensor *t = x3_tensor_new2(h->name, dtype, n, n);
	if (!t)
		return NULL;
	/* the sum with the open chunk ended (as x3_hess_end_chunk would end
	 * it: the device's rows join the chunk, which is added to the total) */
	float *gh = NULL;
	if (h->g && h->gopen && gpu_fetch(h, &gh)) {
		x3_tensor_free(t);
		return NULL;
	}
	double *stot = NULL;   /* a spilled total, read back */
	if (h->sfd >= 0 && spill_read((x3_hess *)h, &stot)) {
		free(gh);
		x3_tensor_free(t);
		return NULL;
	}
	const double *tot = stot ? stot : h->tot;
	const double *src = tot ? tot : h->part;
	double *sum = NULL;
	if ((tot && h->popen) || gh) {
		/* tot + part (+ the device's rows), added as end_chunk would */
		int64_t nn = x3_tri_size(n);
		if (!(sum = malloc((size_t)nn * sizeof *sum))) {
			free(gh), free(stot);
			x3_tensor_free(t);
			x3_err(X3_ENOMEM, "hessian '%s': out of memory", h->name);
			return NULL;
		}
		if (h->popen)
			memcpy(sum, h->part, (size_t)nn * sizeof *sum);
		else
			memset(sum, 0, (size_t)nn * sizeof *sum);
		if (gh)
			x3_tri_add_full(sum, n, gh, 1, 1.0, 0);
		if (tot)
			for (int64_t i = 0; i < nn; i++)
				sum[i] = tot[i] + sum[i];
		src = sum;
	}
	free(gh);
	if (src)
		x3_tri_unpack(src, n, dtype == X3_F64, t->data);
	free(sum), free(stot);
	if (x3_meta_set(t, "role", "hessian") ||
	    x3_meta_setf(t, "count", "%lld", (long long)h->count) ||
	    x3_meta_setf(t, "dropped", "%lld", (long long)h->dropped) ||
	    (h->members && x3_meta_set(t, "members", h->members)) ||
	    (h->layer >= 0 && x3_meta_setf(t, "layer", "%d", h->layer))) {
		x3_tensor_free(t);
		return NULL;
	}
	for (int i = 0; i < h->nextra; i++)
		if (x3_meta_set(t, h->extra[i].key, h->extra[i].val)) {
			x3_tensor_free(t);
			return NULL;
		}
	return t;
}
