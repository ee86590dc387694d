/* hadamard.c: blockwise normalized Hadamard-128 (exl3(5) §6.1): natural-order
 * Sylvester H128[i][j] = (-1)^popcount(i & j), scaled by 1/sqrt(128).
 * Fast Walsh-Hadamard butterflies in fp32, then one multiply by the scale.
 * The stage with stride h maps (a, b) = (x[j], x[j+h]) to (a+b, a-b), which
 * is the Sylvester recursion [[H, H], [H, -H]]. */
#include "codec.h"

#define HAD_SCALE 0.08838834764831845f   /* 1/sqrt(128) */
#define STRIP 64                          /* columns per strip (32 KB block) */

/* (a, b) <- (a + b, a - b) on 8 floats; the halves never overlap, and
 * restrict with a fixed length lets the compiler vectorize it */
static inline void bfly8(float *restrict a, float *restrict b)
{
	for (int l = 0; l < 8; l++) {
		float u = a[l], v = b[l];
		a[l] = u + v;
		b[l] = u - v;
	}
}

static inline void bfly16(float *restrict a, float *restrict b)
{
	for (int l = 0; l < 16; l++) {
		float u = a[l], v = b[l];
		a[l] = u + v;
		b[l] = u - v;
	}
}

/* One 128-float chunk, contiguous. The strides >= 8 are plain loops over
 * contiguous runs that the compiler vectorizes; the three small strides are
 * done together as an 8-point transform. */
static void fwht128(float *x)
{
	for (int i = 0; i < 128; i += 8) {
		float *v = x + i;
		float a0 = v[0] + v[1], a1 = v[0] - v[1];
		float a2 = v[2] + v[3], a3 = v[2] - v[3];
		float a4 = v[4] + v[5], a5 = v[4] - v[5];
		float a6 = v[6] + v[7], a7 = v[6] - v[7];
		float b0 = a0 + a2, b2 = a0 - a2, b1 = a1 + a3, b3 = a1 - a3;
		float b4 = a4 + a6, b6 = a4 - a6, b5 = a5 + a7, b7 = a5 - a7;
		v[0] = b0 + b4; v[4] = b0 - b4;
		v[1] = b1 + b5; v[5] = b1 - b5;
		v[2] = b2 + b6; v[6] = b2 - b6;
		v[3] = b3 + b7; v[7] = b3 - b7;
	}
	for (int h = 8; h < 128; h <<= 1)
		for (int i = 0; i < 128; i += 2 * h)
			for (int j = i; j < i + h; j += 8)
				bfly8(x + j, x + j + h);
	for (int j = 0; j < 128; j++)
		x[j] *= HAD_SCALE;
}

void x3_had128_rows(float *x, int64_t rows, int64_t cols)
{
	int64_t nchunks = rows * (cols / 128);
	#pragma omp parallel for schedule(static) if (nchunks >= 256)
	for (int64_t c = 0; c < nchunks; c++)
		fwht128(x + c * 128);
}

/* 128 rows x w columns (w <= STRIP) starting at x, row stride ld. */
static void fwht128_cols(float *x, int64_t ld, int w)
{
	for (int h = 1; h < 128; h <<= 1)
		for (int i = 0; i < 128; i += 2 * h)
			for (int j = i; j < i + h; j++) {
				float *a = x + j * ld, *b = x + (j + h) * ld;
				int c = 0;
				for (; c + 16 <= w; c += 16)
					bfly16(a + c, b + c);
				for (; c < w; c++) {
					float u = a[c], v = b[c];
					a[c] = u + v;
					b[c] = u - v;
				}
			}
	for (int j = 0; j < 128; j++) {
		float *a = x + j * ld;
		int c = 0;
		for (; c + 16 <= w; c += 16)
			for (int l = 0; l < 16; l++)
				a[c + l] *= HAD_SCALE;
		for (; c < w; c++)
			a[c] *= HAD_SCALE;
	}
}

void x3_had128_cols(float *x, int64_t rows, int64_t cols)
{
	int64_t rblocks = rows / 128;
	int64_t strips = (cols + STRIP - 1) / STRIP;
	int64_t nwork = rblocks * strips;
	#pragma omp parallel for schedule(static) if (rows * cols >= 65536)
	for (int64_t wk = 0; wk < nwork; wk++) {
		int64_t rb = wk / strips, sp = wk % strips;
		int64_t c0 = sp * STRIP;
		int w = (int)(cols - c0 < STRIP ? cols - c0 : STRIP);
		fwht128_cols(x + rb * 128 * cols + c0, cols, w);
	}
}
