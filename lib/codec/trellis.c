/* trellis.c: tile permutation (exl3(5) §4.2), packing of a tile's 256 states
 * into 16*K int16 words (exl3(5) §3.2), unpacking with circular 16-bit windows
 * (exl3(5) §3.3), and the decoder of a whole trellis tensor to W~ (exl3(5) §7). */
#include <string.h>

#include "codec.h"

/* trellis position i -> 16*r + c, with t = i>>3 (mma lane), j = i&7:
 * r = 2(t%4) + (j&1) + 8((j>>1)&1), c = t/4 + 8(j>>2). Written out as a
 * table so it can be read against the 16x16 index grid of exl3(5) §4.2. */
#define P(i) (uint8_t)(16 * (2 * (((i) >> 3) % 4) + ((i) & 1) + 8 * (((i) >> 1) & 1)) \
                       + ((i) >> 3) / 4 + 8 * (((i) >> 2) & 1))
#define P8(i) P(i), P(i + 1), P(i + 2), P(i + 3), P(i + 4), P(i + 5), P(i + 6), P(i + 7)
#define P64(i) P8(i), P8(i + 8), P8(i + 16), P8(i + 24), P8(i + 32), P8(i + 40), \
               P8(i + 48), P8(i + 56)
const uint8_t x3_tile_perm[256] = { P64(0), P64(64), P64(128), P64(192) };

/* 16*r + c -> i = 32(c%8) + 8((r%8)/2) + 4(c/8) + 2(r/8) + r%2 */
#define Q(x) (uint8_t)(32 * (((x) & 15) % 8) + 8 * ((((x) >> 4) % 8) / 2) + \
                       4 * (((x) & 15) / 8) + 2 * (((x) >> 4) / 8) + ((x) >> 4) % 2)
#define Q8(i) Q(i), Q(i + 1), Q(i + 2), Q(i + 3), Q(i + 4), Q(i + 5), Q(i + 6), Q(i + 7)
#define Q64(i) Q8(i), Q8(i + 8), Q8(i + 16), Q8(i + 24), Q8(i + 32), Q8(i + 40), \
               Q8(i + 48), Q8(i + 56)
const uint8_t x3_tile_iperm[256] = { Q64(0), Q64(64), Q64(128), Q64(192) };

/* The stream is MSB-first over uint32 words U[0..8K-1]; stored int16 word
 * 2j is the low half of U[j] and 2j+1 the high half (the 16-bit swap of
 * exl3(5) §3.2 step 3 makes the little-endian uint32 view come out MSB-first). */
void x3_trellis_pack(int K, const uint16_t *states, uint16_t *words)
{
	uint32_t U[64];
	int nw = 8 * K;
	memset(U, 0, sizeof U);
	uint32_t mask = (1u << K) - 1;
	for (int t = 0; t < 256; t++) {
		uint32_t sym = states[t] & mask;
		for (int b = 0; b < K; b++) {
			int p = t * K + b;   /* stream bit, MSB of the symbol first */
			if (sym >> (K - 1 - b) & 1)
				U[p >> 5] |= 1u << (31 - (p & 31));
		}
	}
	for (int j = 0; j < nw; j++) {
		words[2 * j] = (uint16_t)(U[j] & 0xFFFF);
		words[2 * j + 1] = (uint16_t)(U[j] >> 16);
	}
}

void x3_trellis_unpack(int K, const uint16_t *words, uint16_t *states)
{
	uint32_t U[64];
	int nw = 8 * K;
	for (int j = 0; j < nw; j++)
		U[j] = (uint32_t)words[2 * j] | (uint32_t)words[2 * j + 1] << 16;
	for (int t = 0; t < 256; t++) {
		/* window [(t+1)K - 16, (t+1)K) of the circular 256K-bit stream */
		int b1 = (t + 1) * K + 256 * K;
		int b0 = b1 - 16;
		int i0 = b0 / 32, i1 = (b1 - 1) / 32;
		int shift = 32 * (i1 + 1) - b1;
		uint64_t pair = (uint64_t)U[i0 % nw] << 32 | U[i1 % nw];
		states[t] = (uint16_t)((pair >> shift) & 0xFFFF);
	}
}

int x3_trellis_decode(int K, int cb, const uint16_t *trellis, int64_t k,
                      int64_t n, float *w)
{
	if (K < 1 || K > 8)
		return x3_err(X3_EINVAL, "trellis decode: K=%d out of range 1..8", K);
	const float *tab = x3_codebook_table(cb);
	if (!tab)
		return x3_err(X3_EINVAL, "trellis decode: bad codebook id %d", cb);
	if (k <= 0 || n <= 0 || k % 16 || n % 16)
		return x3_err(X3_EINVAL, "trellis decode: shape %lldx%lld is not a "
		              "positive multiple of 16", (long long)k, (long long)n);
	int64_t tk = k / 16, tn = n / 16, ntiles = tk * tn;
	#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < ntiles; t++) {
		int64_t kb = t / tn, nb = t % tn;
		uint16_t st[256];
		x3_trellis_unpack(K, trellis + t * 16 * K, st);
		float *dst = w + kb * 16 * n + nb * 16;
		for (int i = 0; i < 256; i++) {
			int rc = x3_tile_perm[i];
			dst[(rc >> 4) * n + (rc & 15)] = tab[st[i]];
		}
	}
	return X3_OK;
}
