/* gpu-test.h: shared by the GPU unit tests (t17xx-gpu-*.c): the start of
 * main (load the backend object, skip without a device, name the device,
 * tell whether it is the cusim emulator, on which the tests scale their
 * data, not their coverage), the backend's table G, and a float64
 * reference of the blockwise Hadamard-128. */
#ifndef X3_GPU_TEST_H
#define X3_GPU_TEST_H

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "test.h"
#include "device.h"

/* The backend's table (set by GPU_TEST_START). */
static const x3_gpu *G;

/* A test binary lives in tests/unit/ (or tests/tmp/cusim/tests/unit/):
 * unless EXL3KIT_BACKEND says otherwise, the backend object of its tree is
 * ../../lib/libexl3kit-cuda.so from there (a program finds it as
 * ../lib/libexl3kit-cuda.so from bin/, device.h). */
static inline void gpu_test_backend_env(void)
{
	char exe[PATH_MAX], path[PATH_MAX + 64];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	const char *env = getenv("EXL3KIT_BACKEND");
	if ((env && *env) || n <= 0)
		return;
	exe[n] = 0;
	char *slash = strrchr(exe, '/');
	if (!slash)
		return;
	*slash = 0;
	snprintf(path, sizeof path, "%s/../../lib/libexl3kit-cuda.so", exe);
	char *real = realpath(path, NULL);
	setenv("EXL3KIT_BACKEND", real ? real : path, 1);
	free(real);
}

/* In main: skips the whole test without the backend or a usable device;
 * else sets G and int EMULATED to 1 on cusim, 0 on a real GPU. */
#define GPU_TEST_START(EMULATED)                                              \
	int EMULATED = 0;                                                     \
	do {                                                                  \
		gpu_test_backend_env();                                       \
		if (x3_gpu_open(&G)) {                                        \
			SKIP("no CUDA device (%s)", x3_errmsg());             \
			TEST_DONE();                                          \
		}                                                             \
		char gpu_desc_[256] = "";                                     \
		if (G->describe(gpu_desc_, sizeof gpu_desc_) == X3_OK)        \
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
