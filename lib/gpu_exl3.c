/* gpu_exl3.c: an EXL3 linear of exl3.h (CPU layer) on the device. The CPU
 * layer keeps its tiles in column-major tile order (exl3_impl.h); the
 * device kernels read the stored (k/16, n/16) order, so the tiles are put
 * back on the way. */
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "exl3_impl.h"

int x3_gpu_linear_from_exl3(const struct x3_exl3 *e, x3_gpu_linear **out)
{
	*out = NULL;
	if (!e)
		return x3_err(X3_EINVAL, "linear: NULL layer");
	const int64_t tk = e->k / 16, tn = e->n / 16, w = 16 * (int64_t)e->K;
	uint16_t *tr = malloc((size_t)(tk * tn * w) * sizeof(uint16_t));
	if (!tr)
		return x3_err(X3_ENOMEM, "out of memory");
	for (int64_t kb = 0; kb < tk; kb++)
		for (int64_t nb = 0; nb < tn; nb++)
			memcpy(tr + (kb * tn + nb) * w, e->trellis + (nb * tk + kb) * w,
			       (size_t)w * sizeof(uint16_t));
	int rc = x3_gpu_linear_create_f32(e->K, e->cb, e->k, e->n, tr, e->suh, e->svh, e->bias, out);
	free(tr);
	return rc ? x3_errprefix(rc, "'%s'", e->key ? e->key : "?") : X3_OK;
}
