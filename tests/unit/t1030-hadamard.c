/* t1030-hadamard: blockwise normalized Hadamard-128 against the dense
 * Sylvester matrix H128[i][j] = (-1)^popcount(i & j) / sqrt(128). */
#include <math.h>
#include "test.h"
#include "codec.h"

static uint64_t rng_state = 12345;
static double urand(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (double)(rng_state >> 11) / 9007199254740992.0 * 2 - 1;
}

int main(void)
{
	static double H[128][128];
	for (int i = 0; i < 128; i++)
		for (int j = 0; j < 128; j++)
			H[i][j] = (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) / sqrt(128.0);

	/* rows: the transform of the identity is H itself, applied twice is I */
	static float I[128 * 128];
	for (int i = 0; i < 128 * 128; i++)
		I[i] = (i / 128 == i % 128);
	x3_had128_rows(I, 128, 128);
	double e = 0;
	for (int i = 0; i < 128; i++)
		for (int j = 0; j < 128; j++)
			e = fmax(e, fabs(I[i * 128 + j] - H[i][j]));
	CHECK(e < 1e-7, "rows transform of I is H128/sqrt(128) (max err %.3g)", e);
	x3_had128_rows(I, 128, 128);
	e = 0;
	for (int i = 0; i < 128 * 128; i++)
		e = fmax(e, fabs(I[i] - (i / 128 == i % 128)));
	CHECK(e < 1e-6, "H*H = I (max err %.3g)", e);

	/* rows variant on a 3 x 384 matrix vs dense products per chunk */
	const int R = 3, C = 384;
	float x[3 * 384], y[3 * 384];
	for (int i = 0; i < R * C; i++)
		x[i] = y[i] = (float)urand();
	x3_had128_rows(y, R, C);
	e = 0;
	for (int r = 0; r < R; r++)
		for (int b = 0; b < C / 128; b++)
			for (int j = 0; j < 128; j++) {
				double s = 0;
				for (int i = 0; i < 128; i++)
					s += x[r * C + 128 * b + i] * H[i][j];
				e = fmax(e, fabs(s - y[r * C + 128 * b + j]));
			}
	CHECK(e < 1e-5, "rows: 3x384 equals dense chunk products (max err %.3g)", e);

	/* cols variant on 256 x 70 (70 > one 64-column strip, not a multiple) */
	const int R2 = 256, C2 = 70;
	static float a[256 * 70], b2[256 * 70];
	for (int i = 0; i < R2 * C2; i++)
		a[i] = b2[i] = (float)urand();
	x3_had128_cols(b2, R2, C2);
	e = 0;
	for (int blk = 0; blk < R2 / 128; blk++)
		for (int c = 0; c < C2; c++)
			for (int i = 0; i < 128; i++) {
				double s = 0;
				for (int j = 0; j < 128; j++)
					s += H[i][j] * a[(128 * blk + j) * C2 + c];
				e = fmax(e, fabs(s - b2[(128 * blk + i) * C2 + c]));
			}
	CHECK(e < 1e-5, "cols: 256x70 equals dense block products (max err %.3g)", e);
	/* cols == transpose of rows on the transposed matrix */
	static float t[70 * 256];
	for (int r = 0; r < R2; r++)
		for (int c = 0; c < C2; c++)
			t[c * R2 + r] = a[r * C2 + c];
	x3_had128_rows(t, C2, R2);
	int same = 1;
	for (int r = 0; r < R2; r++)
		for (int c = 0; c < C2; c++)
			if (fabsf(t[c * R2 + r] - b2[r * C2 + c]) > 1e-5f)
				same = 0;
	CHECK(same, "cols equals rows on the transpose");
	/* involution on a bigger matrix (exercises the threaded path) */
	const int R3 = 384, C3 = 512;
	float *m = malloc(sizeof(float) * R3 * C3), *m0 = malloc(sizeof(float) * R3 * C3);
	for (int i = 0; i < R3 * C3; i++)
		m[i] = m0[i] = (float)urand();
	x3_had128_cols(m, R3, C3);
	x3_had128_rows(m, R3, C3);
	x3_had128_rows(m, R3, C3);
	x3_had128_cols(m, R3, C3);
	e = 0;
	for (int i = 0; i < R3 * C3; i++) {
		e = fmax(e, fabs(m[i] - m0[i]));
	}
	CHECK(e < 1e-5, "384x512: cols, rows, rows, cols returns the input (max err %.3g)", e);
	free(m);
	free(m0);
	TEST_DONE();
}
