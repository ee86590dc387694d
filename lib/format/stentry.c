/* stentry.c: the tensor-entry check shared by the frame and safetensors
 * readers (stentry_impl.h). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "stentry_impl.h"
#include "utf8.h"

int x3_stentry_check(const char *where, const char *name, const json_t *ent, uint64_t avail,
                     int frame, x3_tensor **out, uint64_t *off)
{
	const int rc = X3_EFORMAT;
	*out = NULL;
	size_t nl = strlen(name);
	if (!nl)
		return x3_err(rc, "%s '': empty tensor name", where);
	/* jansson gives UTF-8 keys; checked again because the name goes into
	 * messages, file names and other headers */
	char nm[160];   /* the name as messages show it, control bytes as \xNN: */
#define NM x3_str_escape(name, nm, sizeof nm)   /* made only for a message */
	if (x3_utf8_valid_prefix(name, nl) != nl)
		return x3_err(rc, "%s '%s': tensor name is not valid UTF-8", where, NM);
	if (!json_is_object(ent))
		return x3_err(rc, "%s '%s': tensor entry is not an object", where, NM);
	const json_t *jd = json_object_get(ent, "dtype"), *js = json_object_get(ent, "shape"),
	             *jo = json_object_get(ent, "data_offsets");
	x3_dtype dt;
	if (!json_is_string(jd))
		return x3_err(rc, "%s '%s': missing dtype", where, NM);
	/* x3_dtype_parse is lenient (case, aliases); a header spells the name exactly */
	if (x3_dtype_parse(json_string_value(jd), &dt) != X3_OK || strcmp(x3_dtype_name(dt), json_string_value(jd)))
	{
		char ds[64];
		return x3_err(rc, "%s '%s': unknown dtype '%s'", where, NM,
		              x3_str_escape(json_string_value(jd), ds, sizeof ds));
	}
	if (!json_is_array(js))
		return x3_err(rc, "%s '%s': missing shape", where, NM);
	size_t rank = json_array_size(js);
	if (rank > X3_MAX_RANK)
		return x3_err(rc, "%s '%s': rank %zu exceeds the limit of %d", where, NM, rank, X3_MAX_RANK);
	int64_t shape[X3_MAX_RANK];
	for (size_t i = 0; i < rank; i++) {
		const json_t *d = json_array_get(js, i);
		if (!json_is_integer(d) || json_integer_value(d) < 0)
			return x3_err(rc, "%s '%s': dimension %zu is not a non-negative integer", where, NM, i);
		shape[i] = json_integer_value(d);
	}
	size_t nb;
	if (x3_shape_nbytes(dt, (int)rank, shape, &nb) != X3_OK)
		return x3_errprefix(rc, "%s '%s'", where, NM);
	if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
	    !json_is_integer(json_array_get(jo, 1)))
		return x3_err(rc, "%s '%s': bad data_offsets (not two integers)", where, NM);
	json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
	if (frame && b != 0)
		return x3_err(rc, "%s '%s': data_offsets [%lld, %lld] must start at 0", where, NM,
		              (long long)b, (long long)e);
	if (b < 0 || e < b)
		return x3_err(rc, "%s '%s': data_offsets [%lld, %lld] are not an increasing pair", where, NM,
		              (long long)b, (long long)e);
	if ((uint64_t)e > avail) {
		if (frame)
			return x3_err(rc, "%s '%s': data_offsets [%lld, %lld] exceed the frame payload limit of "
			              "%" PRIu64 " bytes", where, NM, (long long)b, (long long)e, avail);
		return x3_err(rc, "%s '%s': data_offsets [%lld, %lld] outside the %" PRIu64
		              "-byte data section (truncated file?)", where, NM, (long long)b, (long long)e, avail);
	}
	if ((uint64_t)(e - b) != nb) {
		char sb[160];
		size_t o = 0;
		sb[0] = 0;
		for (size_t i = 0; i < rank && o < sizeof sb; i++)
			o += (size_t)snprintf(sb + o, sizeof sb - o, i ? "x%lld" : "%lld", (long long)shape[i]);
		return x3_err(rc, "%s '%s': shape/length disagreement: %s %s needs %zu bytes, "
		              "data_offsets [%lld, %lld] hold %lld", where, NM, x3_dtype_name(dt),
		              rank ? sb : "scalar", nb, (long long)b, (long long)e, (long long)(e - b));
	}
	x3_tensor *t = x3_tensor_new(name, dt, (int)rank, shape, 0);
	if (!t)
		return X3_ENOMEM;
	*out = t;
	*off = (uint64_t)b;
	return X3_OK;
#undef NM
}
