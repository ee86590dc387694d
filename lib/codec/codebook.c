/* codebook.c: the three procedural EXL3 codebooks (exl3(5) §5): a 16-bit
 * trellis state -> an fp16 value, bit-exact with ExLlamaV3's codebook.cuh.
 *
 * 3INST / MCG: x = s*M (+ A) mod 2^32, lop3 (x & 0x8FFF8FFF) ^ 0x3B603B60,
 *   value = fp16(half(x & 0xFFFF) + half(x >> 16)) with one RNE rounding.
 *   Both halves have magnitude in [0.125, 2) and 10-bit mantissas, so their
 *   sum is exact in fp32; rounding that float to fp16 is the single rounding.
 * MUL1: S = sum of the 4 bytes of s*0x83DCD12D, value =
 *   RNE_fp16((1024 + S) * 887/131072 - 10.3828125). The numerator
 *   (1024+S)*887 - 10.3828125*131072 is an integer below 2^21, so the value
 *   is exact in fp32 before the one rounding to fp16. */
#include <pthread.h>
#include <string.h>
#include <strings.h>

#include "codec.h"

/* 3INST constants (QTIP's, exl3(5) §5.1) */
#define INST3_MULT 89226354u
#define INST3_ADD  64248484u
#define LOP3_MASK  0x8FFF8FFFu
#define LOP3_XOR   0x3B603B60u
/* MUL1: K_INV = half 0x1EEE = 887/131072, K_BIAS = half 0xC931 = -10.3828125
 * = -1360896/131072 (exl3(5) §5.3) */
#define MUL1_NUM_INV  887
#define MUL1_NUM_BIAS 1360896

static uint16_t lop3_sum(uint32_t x)
{
	x = (x & LOP3_MASK) ^ LOP3_XOR;
	float sum = x3_f16_to_f32((uint16_t)(x & 0xFFFF)) + x3_f16_to_f32((uint16_t)(x >> 16));
	return x3_f32_to_f16(sum);
}

uint16_t x3_codebook_f16(int cb, uint32_t state)
{
	uint32_t s = state & 0xFFFF;
	switch (cb) {
	case X3_CB_3INST:
		return lop3_sum(s * INST3_MULT + INST3_ADD);
	case X3_CB_MCG:
		return lop3_sum(s * X3_MCG_MULT);
	case X3_CB_MUL1: {
		uint32_t x = s * X3_MUL1_MULT;
		int S = (int)(x & 0xFF) + (int)((x >> 8) & 0xFF) +
		        (int)((x >> 16) & 0xFF) + (int)(x >> 24);
		int num = (1024 + S) * MUL1_NUM_INV - MUL1_NUM_BIAS;
		return x3_f32_to_f16((float)num / 131072.0f);
	}
	default:
		return 0x7E00;   /* NaN for an invalid codebook id */
	}
}

float x3_codebook(int cb, uint32_t state)
{
	return x3_f16_to_f32(x3_codebook_f16(cb, state));
}

static float cb_table[X3_CB_COUNT][65536];
static pthread_once_t cb_once[X3_CB_COUNT] = {
	PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT
};

#define DEF_INIT(id) static void cb_init_##id(void) { \
	for (uint32_t s = 0; s < 65536; s++) \
		cb_table[id][s] = x3_codebook(id, s); }
DEF_INIT(0)
DEF_INIT(1)
DEF_INIT(2)

const float *x3_codebook_table(int cb)
{
	static void (*const init[X3_CB_COUNT])(void) = {
		cb_init_0, cb_init_1, cb_init_2
	};
	if (cb < 0 || cb >= X3_CB_COUNT)
		return NULL;
	pthread_once(&cb_once[cb], init[cb]);
	return cb_table[cb];
}

static const char *const cb_names[X3_CB_COUNT] = { "3inst", "mcg", "mul1" };

const char *x3_codebook_name(int cb)
{
	return cb >= 0 && cb < X3_CB_COUNT ? cb_names[cb] : "?";
}

int x3_codebook_parse(const char *s, int *cb)
{
	for (int i = 0; s && i < X3_CB_COUNT; i++)
		if (strcasecmp(s, cb_names[i]) == 0) {
			*cb = i;
			return X3_OK;
		}
	return x3_err(X3_EINVAL, "unknown codebook '%s' (want mul1, mcg or 3inst)",
	              s ? s : "");
}
