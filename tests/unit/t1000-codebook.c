/* t1000-codebook: the three EXL3 codebooks against exl3(5) §12.1. */
#include <math.h>
#include "test.h"
#include "codec.h"

static const struct { uint32_t s; uint16_t h[3]; double v[3]; } ex[] = {
	{ 0x0000, { 0x3a25, 0x3f60, 0xc2e8 }, { 0.76806640625, 1.84375, -3.453125 } },
	{ 0x0001, { 0xbb5b, 0x304e, 0x3921 }, { -0.91943359375, 0.134521484375, 0.64111328125 } },
	{ 0x0002, { 0x3b74, 0xba13, 0xb72d }, { 0.931640625, -0.75927734375, -0.448486328125 } },
	{ 0x1234, { 0xc066, 0x3e0f, 0xb89e }, { -2.19921875, 1.5146484375, -0.5771484375 } },
	{ 0x8000, { 0xb7f8, 0xb915, 0xbaf2 }, { -0.498046875, -0.63525390625, -0.8681640625 } },
	{ 0xFFFF, { 0xb110, 0x3acd, 0xb936 }, { -0.158203125, 0.85009765625, -0.6513671875 } },
};

int main(void)
{
	static const double rms_want[3] = { 1.24371092, 1.24411185, 1.00031207 };
	for (int cb = 0; cb < X3_CB_COUNT; cb++) {
		for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
			uint16_t h = x3_codebook_f16(cb, ex[i].s);
			float v = x3_codebook(cb, ex[i].s);
			CHECK(h == ex[i].h[cb] && v == (float)ex[i].v[cb],
			      "%s(0x%04x) = %.12g [%04x], want %.12g [%04x]",
			      x3_codebook_name(cb), ex[i].s, (double)v, h, ex[i].v[cb], ex[i].h[cb]);
		}
		const float *tab = x3_codebook_table(cb);
		CHECK(tab != NULL && tab == x3_codebook_table(cb), "%s table is static",
		      x3_codebook_name(cb));
		double ss = 0, sum = 0;
		int same = 1, finite = 1;
		float lo = INFINITY, hi = -INFINITY;
		for (uint32_t s = 0; s < 65536; s++) {
			if (tab[s] != x3_codebook(cb, s))
				same = 0;
			if (!isfinite(tab[s]))
				finite = 0;
			ss += (double)tab[s] * tab[s];
			sum += tab[s];
			lo = fminf(lo, tab[s]);
			hi = fmaxf(hi, tab[s]);
		}
		double rms = sqrt(ss / 65536);
		CHECK(same && finite, "%s table equals the per-state function", x3_codebook_name(cb));
		CHECK(fabs(rms - rms_want[cb]) < 5e-8, "%s RMS %.8f (want %.8f)",
		      x3_codebook_name(cb), rms, rms_want[cb]);
		/* state 0x10000 aliases 0 (only the low 16 bits are used) */
		CHECK(x3_codebook_f16(cb, 0x10000 | 0x1234) == ex[3].h[cb],
		      "%s uses the low 16 bits of the state", x3_codebook_name(cb));
		printf("# %s: rms %.8f mean %.3g range [%.4f, %.4f]\n", x3_codebook_name(cb),
		       rms, sum / 65536, (double)lo, (double)hi);
	}
	/* 3INST range (-4, 4), MUL1 range from exl3(5) §12.1 */
	CHECK(x3_codebook_table(X3_CB_MUL1)[0] == -3.453125f, "mul1 minimum value at state 0");
	CHECK(x3_codebook_table(3) == NULL && x3_codebook_table(-1) == NULL,
	      "bad codebook id gives no table");

	int cb = -1;
	CHECK(x3_codebook_parse("mul1", &cb) == X3_OK && cb == X3_CB_MUL1, "parse mul1");
	CHECK(x3_codebook_parse("mcg", &cb) == X3_OK && cb == X3_CB_MCG, "parse mcg");
	CHECK(x3_codebook_parse("3INST", &cb) == X3_OK && cb == X3_CB_3INST, "parse 3INST");
	CHECK(x3_codebook_parse("1mad", &cb) == X3_EINVAL && strstr(x3_errmsg(), "1mad"),
	      "parse rejects 1mad: %s", x3_errmsg());
	CHECK(strcmp(x3_codebook_name(X3_CB_MCG), "mcg") == 0 &&
	      strcmp(x3_codebook_name(X3_CB_3INST), "3inst") == 0 &&
	      strcmp(x3_codebook_name(X3_CB_MUL1), "mul1") == 0, "names");
	TEST_DONE();
}
