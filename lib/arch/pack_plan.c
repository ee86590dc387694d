/* pack_plan.c: a bitalloc plan as pack-write reads it (x3_pack_plan,
 * see pack.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "x3.h"
#include "pack.h"

int x3_pack_plan_parse(const char *text, const char *label, const x3_module *mods,
                       int nmods, x3_pack_plan *p)
{
	memset(p, 0, sizeof *p);
	p->bits = NAN;
	json_error_t je;
	json_t *o = json_loads(text, 0, &je);
	if (!o)
		return x3_err(X3_EFORMAT, "%s: line %d: %s", label, je.line, je.text);
	x3_modix *ix = NULL;
	json_t *t = json_object_get(o, "tensors");
	int rc = X3_OK;
	if (!json_is_object(t)) {
		rc = x3_err(X3_EFORMAT, "%s: no \"tensors\" object (not a bitalloc plan)", label);
		goto out;
	}
	if (!(p->K = calloc(nmods > 0 ? (size_t)nmods : 1, sizeof *p->K)) || x3_modix_build(mods, nmods, &ix)) {
		rc = x3_err(X3_ENOMEM, "%s: out of memory", label);
		goto out;
	}
	const char *k;
	json_t *v;
	json_object_foreach(t, k, v) {
		const x3_module *m = x3_modix_find(ix, k);
		if (!m || m->d->kind != X3_KIND_LINEAR) {
			rc = x3_err(X3_EFORMAT, "%s: tensor '%s' is not a linear of the architecture", label, k);
			goto out;
		}
		if (!json_is_integer(v)) {
			rc = x3_err(X3_EFORMAT, "%s: tensor '%s': K is not an integer", label, k);
			goto out;
		}
		json_int_t K = json_integer_value(v);
		if (K < 1 || K > 8) {
			rc = x3_err(X3_EFORMAT, "%s: tensor '%s': K=%lld is not 1..8", label, k, (long long)K);
			goto out;
		}
		p->K[m - mods] = (int)K;
	}
	json_t *hb = json_object_get(o, "head_bits");
	if (hb) {
		json_int_t h = json_is_integer(hb) ? json_integer_value(hb) : 0;
		if (!json_is_integer(hb) || h < 1 || (h > 8 && h != 16)) {
			rc = x3_err(X3_EFORMAT, "%s: \"head_bits\" is not an integer 1..8 or 16", label);
			goto out;
		}
		p->head_bits = (int)h;
	}
	json_t *b = json_object_get(o, "bits");
	if (b && json_is_number(b))
		p->bits = json_number_value(b);
	json_t *ms = json_object_get(o, "measurement");
	if (json_is_object(ms) &&
	    !(p->measurement = json_dumps(ms, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15))))
		rc = x3_err(X3_ENOMEM, "out of memory");
out:
	x3_modix_free(ix);
	json_decref(o);
	if (rc)
		x3_pack_plan_free(p);
	return rc;
}

void x3_pack_plan_free(x3_pack_plan *p)
{
	free(p->K);
	p->K = NULL;
	free(p->measurement);
	p->measurement = NULL;
}
