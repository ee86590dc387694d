/* sha256.h: small SHA-256 (FIPS 180-4) for test vectors; tests only. */
#ifndef X3_TEST_SHA256_H
#define X3_TEST_SHA256_H
#include <stdint.h>
#include <string.h>

static inline uint32_t sha_ror(uint32_t x, int n) { return x >> n | x << (32 - n); }

static void sha256_block(uint32_t h[8], const uint8_t *p)
{
	static const uint32_t k[64] = {
		0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
		0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
		0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
		0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
		0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
		0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
		0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
		0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
	};
	uint32_t w[64], a[8];
	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		       (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = sha_ror(w[i - 15], 7) ^ sha_ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = sha_ror(w[i - 2], 17) ^ sha_ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	memcpy(a, h, sizeof a);
	for (int i = 0; i < 64; i++) {
		uint32_t S1 = sha_ror(a[4], 6) ^ sha_ror(a[4], 11) ^ sha_ror(a[4], 25);
		uint32_t ch = (a[4] & a[5]) ^ (~a[4] & a[6]);
		uint32_t t1 = a[7] + S1 + ch + k[i] + w[i];
		uint32_t S0 = sha_ror(a[0], 2) ^ sha_ror(a[0], 13) ^ sha_ror(a[0], 22);
		uint32_t mj = (a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]);
		uint32_t t2 = S0 + mj;
		memmove(a + 1, a, 7 * sizeof a[0]);
		a[4] += t1;
		a[0] = t1 + t2;
	}
	for (int i = 0; i < 8; i++)
		h[i] += a[i];
}

/* hex digest of n bytes into out (65 chars) */
static void sha256_hex(const void *data, size_t n, char out[65])
{
	uint32_t h[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
	                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
	const uint8_t *p = data;
	uint8_t blk[128];
	size_t i = 0;
	for (; i + 64 <= n; i += 64)
		sha256_block(h, p + i);
	size_t r = n - i;
	memset(blk, 0, sizeof blk);
	memcpy(blk, p + i, r);
	blk[r] = 0x80;
	size_t tot = r + 9 <= 64 ? 64 : 128;
	uint64_t bits = (uint64_t)n * 8;
	for (int j = 0; j < 8; j++)
		blk[tot - 1 - j] = (uint8_t)(bits >> (8 * j));
	sha256_block(h, blk);
	if (tot == 128)
		sha256_block(h, blk + 64);
	for (int j = 0; j < 8; j++)
		snprintf(out + 8 * j, 9, "%08x", h[j]);
}
#endif
