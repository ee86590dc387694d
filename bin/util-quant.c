/* util-quant.c: helpers of the quantizer programs (util-quant.h), apart
 * from util.c so that only had-rotate and trellis-encode link the quantizer
 * (quant.o and with it LAPACKE, OpenBLAS and OpenMP): every other program
 * starts without loading those. */
#include <stdio.h>
#include <stdlib.h>
#include "frame.h"
#include "quant.h"
#include "util.h"
#include "util-quant.h"

void hess_cache_set(hess_cache *c, x3_tensor *t)
{
	x3_tensor_free(c->raw);
	x3_qhess_free(c->fin);
	c->raw = t;
	c->fin = NULL;
	c->k0 = -1;
}

void hess_cache_load(hess_cache *c, const char *path)
{
	x3_reader *r;
	x3_tensor *t;
	if (x3_reader_open(path, &r))
		die_x3("%s", path);
	int rc = x3_reader_next(r, &t);
	if (rc == X3_EOF)
		die("%s: no hessian frame in the file", path);
	if (rc)
		die_x3("%s", path);
	x3_reader_close(r);
	hess_cache_set(c, t);
	c->from_file = 1;
}

struct x3_qhess *hess_cache_for(hess_cache *c, const x3_tensor *W, const char *key,
                                uint64_t seed, struct x3_qhess **own)
{
	char shp[64];
	/* before any Hessian is sized from it ("hessian size 0 is not ...") */
	if (W->rank != 2 || W->shape[0] <= 0 || W->shape[1] <= 0)
		die("weight '%s': shape %s is not a non-empty matrix (out x in)", W->name,
		    x3_shape_str(W, shp, sizeof shp));
	int64_t k0 = W->shape[1], k = x3_pad128(k0);
	*own = NULL;
	if (c->raw) {
		if (!c->fin || c->k0 != k0) {
			x3_qhess_free(c->fin);
			c->fin = NULL;
			if (x3_qhess_from_frame(c->raw, k0, seed, &c->fin))
				die_x3("weight '%s': hessian '%s'", W->name, c->raw->name);
			c->k0 = k0;
			if (c->fin->fallback && !quiet)
				warnx("warning: hessian '%s': %s; '%s' is quantized without error feedback (fallback)",
				      c->raw->name, c->fin->why, key);
			else if (c->fin->retries && !quiet)
				warnx("warning: hessian '%s': not positive definite, needed %d extra damping rounds",
				      c->raw->name, c->fin->retries);
		}
		return c->fin;
	}
	float *s = malloc((size_t)k * sizeof(float));
	char nm[1100];
	if (!s)
		die("out of memory");
	snprintf(nm, sizeof nm, "%s/su", key);
	x3_quant_signs(seed, nm, k, s);
	if (x3_qhess_none(k, s, own))
		die_x3("weight '%s'", W->name);
	free(s);
	return *own;
}

void hess_cache_free(hess_cache *c)
{
	hess_cache_set(c, NULL);
}

void put_frame(struct x3_writer *w, const char *key, const char *role, x3_dtype dt,
               int rank, const int64_t *shape, void *data, const x3_tensor *meta)
{
	char name[1100];
	snprintf(name, sizeof name, "%s.%s", key, role);
	x3_tensor *t = x3_tensor_new(name, dt, rank, shape, 0);
	if (!t)
		die_x3("frame '%s'", name);
	t->data = data;
	t->owns_data = 0;
	if ((meta && x3_meta_copy(t, meta)) || x3_meta_set(t, "role", role) || x3_meta_set(t, "key", key))
		die_x3("frame '%s'", name);
	if (x3_writer_put(w, t))
		die_x3("writing frame '%s'", name);
	t->data = NULL;
	x3_tensor_free(t);
}
