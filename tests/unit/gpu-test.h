/* gpu-test.h: shared by the GPU unit tests (t17xx-gpu-*.c): the start of
 * main (skip without a device, name the device, tell whether it is the
 * cusim emulator, on which the tests scale their data, not their
 * coverage) and a float64 reference of the blockwise Hadamard-128. */
#ifndef X3_GPU_TEST_H
#define X3_GPU_TEST_H

#include <math.h>
#include <string.h>
#include "test.h"
#include "gpu.h"

/* In main: skips the whole test without a usable device; else sets
 * int EMULATED to 1 on cusim, 0 on a real GPU. */
#define GPU_TEST_START(EMULATED)                                              \
	int EMULATED = 0;                                                     \
	do {                                                                  \
		if (!x3_gpu_available()) {                                    \
			SKIP("no CUDA device (%s)", x3_errmsg());             \
			TEST_DONE();                                          \
		}                                                             \
		char gpu_desc_[256] = "";                                     \
		if (x3_gpu_describe(gpu_desc_, sizeof gpu_desc_) == X3_OK)    \
			printf("# %s\n", gpu_desc_);                          \
		EMULATED = strstr(gpu_desc_, "emulated") != NULL;             \
	} while (0)

/* x (rows, cols) <- x Hb_cols in float64, Hb = blockwise normalized
 * Sylvester Hadamard of size 128 (cols a multiple of 128) */
static inline void had_ref_rows(double *x, int64_t rows, int64_t cols)
{
	double t[128];
	for (int64_t r = 0; r < rows; r++)
		for (int64_t c0 = 0; c0 < cols; c0 += 128) {
			double *v = x + r * cols + c0;
			for (int i = 0; i < 128; i++) {
				double s = 0;
				for (int j = 0; j < 128; j++)
					s += (__builtin_popcount(i & j) & 1) ? -v[j] : v[j];
				t[i] = s / sqrt(128.0);
			}
			memcpy(v, t, sizeof t);
		}
}

#endif
