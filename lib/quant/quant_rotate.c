/* quant_rotate.c: the random signs of the rotation and the 128-point
 * Hadamard transforms on the quantizer's device (exl3(5) §9.1 step 6,
 * exl3(5) §9.2 step 3): the sign vectors and their draws for the sign search,
 * x3_quant_set_device and the row/column transforms that honour it. */
#include <stdio.h>
#include "codec.h"
#include "quant.h"
#include "quant_impl.h"

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

/* Where the Hadamard rotations and the block LDL of x3_qhess_finalize and
 * x3_regularize run (x3_quant_set_device): the GPU backend's table, or
 * NULL for the CPU (like x3_viterbi_set_backend). */
const x3_gpu *x3q_gpu;

int x3_quant_set_device(int dev)
{
	if (dev != X3_DEVICE_CPU && dev != X3_DEVICE_CUDA)
		return x3_err(X3_EINVAL, "quantizer device %s (cpu or cuda expected)",
		              x3_device_name(dev));
	const x3_gpu *g = NULL;
	if (dev == X3_DEVICE_CUDA && x3_gpu_open(&g))
		return X3_EUNSUP;
	x3q_gpu = g;
	return X3_OK;
}

/* x3_had128_rows/cols on the quantizer's device */
int x3q_had_rows(float *x, int64_t rows, int64_t cols)
{
	if (x3q_gpu)
		return x3q_gpu->had128_rows(x, rows, cols);
	x3_had128_rows(x, rows, cols);
	return X3_OK;
}

int x3q_had_cols(float *x, int64_t rows, int64_t cols)
{
	if (x3q_gpu)
		return x3q_gpu->had128_cols(x, rows, cols);
	x3_had128_cols(x, rows, cols);
	return X3_OK;
}
