/* dtype conversions against exact, independent references:
 * every F16 and BF16 bit pattern, and F32 -> F16/BF16 rounding. */
#include <math.h>
#include "test.h"

static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* f16 value from bits by the definition (independent of the library) */
static double f16_def(uint16_t h)
{
	int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
	double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
	return s ? -v : v;
}

/* nearest-even f16 of a finite float by search over the monotonic positive
 * patterns 0x0000..0x7c00 (0x7c00 standing for 65536 in the tie rule) */
static uint16_t f16_ref(float f)
{
	double a = fabs((double)f);
	uint16_t sign = signbit(f) ? 0x8000 : 0;
	int lo = 0, hi = 0x7c00;
	while (lo < hi) {   /* largest h with value(h) <= a */
		int mid = (lo + hi + 1) / 2;
		double v = mid == 0x7c00 ? 65536.0 : f16_def((uint16_t)mid);
		if (v <= a) lo = mid; else hi = mid - 1;
	}
	if (lo == 0x7c00)
		return sign | 0x7c00;
	double v0 = f16_def((uint16_t)lo), v1 = lo + 1 == 0x7c00 ? 65536.0 : f16_def((uint16_t)(lo + 1));
	int r = (a - v0 < v1 - a) ? lo : (a - v0 > v1 - a) ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
	return sign | (uint16_t)r;
}

static uint16_t bf16_ref(float f)
{
	uint32_t u = f2u(f), lo = u & 0xffff0000u;
	double a = fabs((double)f), v0 = fabs((double)u2f(lo)), v1 = fabs((double)u2f(lo + 0x10000));
	uint32_t r = (a - v0 < v1 - a) ? lo : (a - v0 > v1 - a) ? lo + 0x10000 : (((lo >> 16) & 1) ? lo + 0x10000 : lo);
	return (uint16_t)(r >> 16);
}

int main(void)
{
	/* every F16 pattern -> F32 is exact, and back is the identity */
	int bad = 0, badrt = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = x3_f16_to_f32((uint16_t)h);
		double d = f16_def((uint16_t)h);
		if (isnan(d) ? !isnan(f) : ((double)f != d || !signbit(f) != !signbit(d)))
			bad++;
		if (!isnan(f) && x3_f32_to_f16(f) != h)
			badrt++;
		if (isnan(f) && !isnan(x3_f16_to_f32(x3_f32_to_f16(f))))
			badrt++;
	}
	CHECK(bad == 0, "all 65536 F16 patterns convert exactly to F32 (%d wrong)", bad);
	CHECK(badrt == 0, "all 65536 F16 patterns round-trip through F32 (%d wrong)", badrt);

	bad = badrt = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = x3_bf16_to_f32((uint16_t)h);
		if (f2u(f) != h << 16 && !isnan(f))
			bad++;
		if (isnan(f) ? !isnan(x3_bf16_to_f32(x3_f32_to_bf16(f))) : x3_f32_to_bf16(f) != h)
			badrt++;
	}
	CHECK(bad == 0, "all 65536 BF16 patterns convert exactly to F32");
	CHECK(badrt == 0, "all 65536 BF16 patterns round-trip (%d wrong)", badrt);

	/* F32 -> F16 / BF16 rounding: every midpoint and its neighbours between
	 * consecutive F16 values, plus random F32 patterns */
	int bad16 = 0, badbf = 0, n16 = 0;
	for (uint32_t h = 0; h < 0x7c00; h++) {
		double v0 = f16_def((uint16_t)h), v1 = h + 1 == 0x7c00 ? 65536.0 : f16_def((uint16_t)(h + 1));
		float mid = (float)((v0 + v1) / 2);
		float cand[5] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), (float)v0, -mid};
		for (int k = 0; k < 5; k++, n16++)
			if (x3_f32_to_f16(cand[k]) != f16_ref(cand[k]))
				bad16++;
	}
	x3_rng r;
	x3_rng_seed(&r, 1, 0);
	for (int i = 0; i < 2000000; i++) {
		float f = u2f((uint32_t)x3_rng_u64(&r));
		if (isnan(f))
			continue;
		if (x3_f32_to_f16(f) != f16_ref(f))
			bad16++;
		if (!isinf(f) && x3_f32_to_bf16(f) != bf16_ref(f) && fabsf(f) < 3.3e38f)
			badbf++;
		n16++;
	}
	CHECK(bad16 == 0, "F32 -> F16 is round-to-nearest-even on %d values incl. every tie (%d wrong)", n16, bad16);
	CHECK(badbf == 0, "F32 -> BF16 is round-to-nearest-even on 2M random values (%d wrong)", badbf);
	CHECK(x3_f32_to_f16(65519.996f) == 0x7bff && x3_f32_to_f16(65520.0f) == 0x7c00, "F16 overflow threshold");
	CHECK(isnan(x3_f16_to_f32(x3_f32_to_f16(NAN))) && isnan(x3_bf16_to_f32(x3_f32_to_bf16(NAN))), "NaN stays NaN");

	/* x3_convert: every numeric dtype to F32, and F16 <-> BF16 */
	int64_t iv[3] = {-5, 0, 7};
	float out[3];
	CHECK_OK(x3_convert(out, X3_F32, iv, X3_I64, 3), "I64 -> F32");
	CHECK(out[0] == -5 && out[2] == 7, "I64 values");
	uint8_t e4[4] = {0x38, 0xb8, 0x7e, 0x01};   /* 1.0, -1.0, 448, 2^-9 */
	CHECK_OK(x3_convert(out, X3_F32, e4, X3_F8_E4M3, 3), "F8_E4M3 -> F32");
	float e4v[4];
	x3_convert(e4v, X3_F32, e4, X3_F8_E4M3, 4);
	CHECK(e4v[0] == 1 && e4v[1] == -1 && e4v[2] == 448 && e4v[3] == 0x1p-9f, "F8_E4M3 values");
	uint8_t e5[2] = {0x3c, 0x7c};   /* 1.0, inf */
	x3_convert(out, X3_F32, e5, X3_F8_E5M2, 2);
	CHECK(out[0] == 1 && isinf(out[1]), "F8_E5M2 values");
	uint16_t hb[2] = {0x3c00, 0xc000}, bb[2];
	CHECK_OK(x3_convert(bb, X3_BF16, hb, X3_F16, 2), "F16 -> BF16");
	CHECK(bb[0] == 0x3f80 && bb[1] == 0xc000, "F16 -> BF16 values");
	CHECK(x3_convert(bb, X3_I16, hb, X3_F16, 2) == X3_EUNSUP, "F16 -> I16 refused");
	x3_dtype t;
	CHECK(x3_dtype_parse("BF16", &t) == X3_OK && t == X3_BF16, "parse BF16");
	CHECK(x3_dtype_parse("F12", &t) == X3_EFORMAT, "parse F12 fails");
	for (int i = 0; i < X3_DTYPE_COUNT; i++) {
		x3_dtype u;
		if (x3_dtype_parse(x3_dtype_name((x3_dtype)i), &u) || u != (x3_dtype)i)
			bad++;
	}
	CHECK(bad == 0, "every dtype name parses back to its id");
	TEST_DONE();
}
