/* t1010-trellis: tile permutation, packing, unpacking and decoding against
 * exl3(5) §3, §4.2, §7 and the K=4 tile vector of exl3(5) §12.2. */
#include <math.h>
#include <unistd.h>
#include "test.h"
#include "codec.h"

/* sha256 of a buffer through coreutils' sha256sum (hashing is not ours to
 * write); hex stays empty if the tool is missing. */
static void sha256_hex_tool(const uint8_t *p, size_t n, char hex[65])
{
	char path[] = "/tmp/x3shaXXXXXX", cmd[128];
	int fd = mkstemp(path);
	if (fd < 0)
		return;
	if (write(fd, p, n) != (ssize_t)n) {
		close(fd);
		unlink(path);
		return;
	}
	close(fd);
	snprintf(cmd, sizeof cmd, "sha256sum %s", path);
	FILE *f = popen(cmd, "r");
	if (f) {
		if (fscanf(f, "%64s", hex) != 1)
			hex[0] = 0;
		pclose(f);
	}
	unlink(path);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)   /* splitmix64 */
{
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* states of the circular symbol sequence a[0..255] at K bits */
static void states_of(int K, const unsigned *a, uint16_t *s)
{
	for (int t = 0; t < 256; t++) {
		uint32_t v = 0;
		for (int j = 15 / K; j >= 0; j--)   /* ceil(16/K) symbols */
			v = v << K | a[(t - j + 256) & 255];
		s[t] = (uint16_t)v;
	}
}

static const uint16_t vec_words[64] = {
	0xbb2b, 0x6e1b, 0xcc17, 0x46df, 0x62f7, 0x1f1e, 0xa8c9, 0x7679,
	0x2518, 0xa63b, 0x7e5b, 0xc45f, 0xc3a6, 0xa298, 0xfff6, 0xef99,
	0xdae6, 0xe38d, 0xc9de, 0xa46e, 0x0bf1, 0xf610, 0x9c3d, 0x8505,
	0x232d, 0xab89, 0x2638, 0x6fa5, 0xc281, 0x921e, 0x16f7, 0xc265,
	0xa845, 0x69d6, 0x1bd1, 0x8c7c, 0x71bf, 0xef09, 0xd5dd, 0x3d10,
	0xefe6, 0xb3de, 0x1331, 0x846a, 0xa001, 0x847b, 0x7235, 0x3f90,
	0x5258, 0x0117, 0xb4f0, 0xfee9, 0xb600, 0xd9ea, 0x65a8, 0x6f7c,
	0x7942, 0xcb0b, 0x5675, 0x3280, 0x4b34, 0x77c0, 0x359e, 0x263c,
};

static void test_vector(void)
{
	unsigned a[256];
	uint32_t x = 1;
	for (int i = 0; i < 256; i++) {
		x = (x * 1103515245u + 12345u) & 0x7FFFFFFF;
		a[i] = (x >> 16) & 15;
	}
	CHECK(a[0] == 6 && a[1] == 14 && a[9] == 6 && a[250] == 3 && a[255] == 14,
	      "tile vector symbols");
	uint16_t s[256], w[64], u[256];
	states_of(4, a, s);
	static const uint16_t s_want[8] = { 0x59e6, 0x9e6e, 0xe6e1, 0x6e1b, 0xe1bb, 0x1bbb, 0xbbb2, 0xbb2b };
	CHECK(memcmp(s, s_want, sizeof s_want) == 0, "tile vector states s[0..7]");
	x3_trellis_pack(4, s, w);
	int bad = -1;
	for (int i = 0; i < 64; i++)
		if (w[i] != vec_words[i] && bad < 0)
			bad = i;
	CHECK(bad < 0, "tile vector: all 64 stored words (first mismatch %d)", bad);
	x3_trellis_unpack(4, vec_words, u);
	CHECK(memcmp(u, s, sizeof s) == 0, "tile vector: unpack gives the 256 states");

	static const struct { double t0[4], t10, tff, sum; const char *sha; } want[3] = {
		{ { 0.122314453125, -1.6533203125, 2.01171875, -0.185302734375 }, -0.896484375,
		  -0.374755859375, -5.388794, "4415289fd93d340e" },
		{ { -0.0390625, -2.0859375, -1.3369140625, -1.8935546875 }, -0.71875,
		  -0.1083984375, 16.875977, "0053caba4215a94e" },
		{ { -1.111328125, -2.03125, -0.177734375, -0.71240234375 }, 1.5888671875,
		  -0.204833984375, 1.462868, "f10294501cc14146" },
	};
	for (int cb = 0; cb < X3_CB_COUNT; cb++) {
		float tile[256];
		CHECK_OK(x3_trellis_decode(4, cb, vec_words, 16, 16, tile), "decode tile vector %s",
		         x3_codebook_name(cb));
		CHECK(tile[0] == (float)want[cb].t0[0] && tile[1] == (float)want[cb].t0[1] &&
		      tile[2] == (float)want[cb].t0[2] && tile[3] == (float)want[cb].t0[3],
		      "%s tile[0][0..3] = %.12g %.12g %.12g %.12g", x3_codebook_name(cb),
		      (double)tile[0], (double)tile[1], (double)tile[2], (double)tile[3]);
		CHECK(tile[16] == (float)want[cb].t10, "%s tile[1][0] = %.12g", x3_codebook_name(cb),
		      (double)tile[16]);
		CHECK(tile[255] == (float)want[cb].tff, "%s tile[15][15] = %.12g",
		      x3_codebook_name(cb), (double)tile[255]);
		double sum = 0;
		uint8_t bytes[512];
		const float *tab = x3_codebook_table(cb);
		int same = 1;
		for (int i = 0; i < 256; i++) {
			sum += tile[i];
			/* fp16 bits of the value: the codebook's bits at the state */
			uint16_t h = x3_codebook_f16(cb, s[x3_tile_iperm[i]]);
			if (tab[s[x3_tile_iperm[i]]] != tile[i])
				same = 0;
			bytes[2 * i] = (uint8_t)(h & 0xFF);
			bytes[2 * i + 1] = (uint8_t)(h >> 8);
		}
		CHECK(same, "%s decoded tile = codebook of the states, un-permuted", x3_codebook_name(cb));
		CHECK(fabs(sum - want[cb].sum) < 1e-5, "%s sum %.6f (want %.6f)", x3_codebook_name(cb),
		      sum, want[cb].sum);
		char hex[65] = "";
		sha256_hex_tool(bytes, sizeof bytes, hex);
		CHECK(strncmp(hex, want[cb].sha, 16) == 0, "%s sha256 %.16s (want %s)",
		      x3_codebook_name(cb), hex, want[cb].sha);
	}
}

static void test_perm(void)
{
	int inv = 1;
	for (int i = 0; i < 256; i++)
		if (x3_tile_iperm[x3_tile_perm[i]] != i || x3_tile_perm[x3_tile_iperm[i]] != i)
			inv = 0;
	CHECK(inv, "tile_perm and tile_iperm are inverse permutations");
	/* rows of the index grid of exl3(5) §4.2 */
	static const uint8_t r0[16] = { 0, 32, 64, 96, 128, 160, 192, 224, 4, 36, 68, 100, 132, 164, 196, 228 };
	static const uint8_t r9[16] = { 3, 35, 67, 99, 131, 163, 195, 227, 7, 39, 71, 103, 135, 167, 199, 231 };
	static const uint8_t r14[16] = { 26, 58, 90, 122, 154, 186, 218, 250, 30, 62, 94, 126, 158, 190, 222, 254 };
	CHECK(memcmp(x3_tile_iperm, r0, 16) == 0, "index grid row 0");
	CHECK(memcmp(x3_tile_iperm + 16 * 9, r9, 16) == 0, "index grid row 9");
	CHECK(memcmp(x3_tile_iperm + 16 * 14, r14, 16) == 0, "index grid row 14");
	CHECK(x3_tile_iperm[16 * 2] == 8 && x3_tile_iperm[16 * 8] == 2 && x3_tile_iperm[255] == 255,
	      "index grid corners");
	/* formula of exl3(5) §4.2 */
	int ok = 1;
	for (int i = 0; i < 256; i++) {
		int t = i >> 3, j = i & 7;
		int r = 2 * (t % 4) + (j & 1) + 8 * ((j >> 1) & 1), c = t / 4 + 8 * (j >> 2);
		if (x3_tile_perm[i] != 16 * r + c)
			ok = 0;
	}
	CHECK(ok, "tile_perm follows the mma B-fragment formula");
}

static void test_roundtrip(void)
{
	for (int K = 1; K <= 8; K++) {
		int ok_rt = 1, ok_tb = 1, ok_hi = 1, ok_words = 1;
		for (int rep = 0; rep < 20; rep++) {
			unsigned a[256];
			uint16_t s[256], w[128], w2[128], u[256], noisy[256];
			for (int i = 0; i < 256; i++)
				a[i] = (unsigned)(rnd() & ((1u << K) - 1));
			states_of(K, a, s);
			x3_trellis_pack(K, s, w);
			/* only the low K bits of each state matter */
			for (int i = 0; i < 256; i++)
				noisy[i] = (uint16_t)(a[i] | (rnd() << K));
			x3_trellis_pack(K, noisy, w2);
			if (memcmp(w, w2, 32 * K))
				ok_hi = 0;
			x3_trellis_unpack(K, w, u);
			if (memcmp(u, s, sizeof s))
				ok_rt = 0;
			uint32_t mask = (1u << (16 - K)) - 1;
			for (int t = 0; t < 256; t++)
				if ((uint32_t)(u[t] >> K) != (u[(t + 255) & 255] & mask))
					ok_tb = 0;
			/* random words: unpack then pack returns the same words */
			for (int i = 0; i < 16 * K; i++)
				w[i] = (uint16_t)rnd();
			x3_trellis_unpack(K, w, u);
			x3_trellis_pack(K, u, w2);
			if (memcmp(w, w2, 32 * K))
				ok_words = 0;
		}
		CHECK(ok_rt, "K=%d: pack/unpack round trip of 20 random tiles", K);
		CHECK(ok_tb, "K=%d: shift-register and tail-biting invariants", K);
		CHECK(ok_hi, "K=%d: pack ignores bits above K", K);
		CHECK(ok_words, "K=%d: unpack/pack of random words is the identity", K);
	}
}

static void test_decode_tensor(void)
{
	const int K = 3, k = 32, n = 48, tk = 2, tn = 3;
	uint16_t tr[6 * 48];
	for (int i = 0; i < 6 * 48; i++)
		tr[i] = (uint16_t)rnd();
	for (int cb = 0; cb < X3_CB_COUNT; cb++) {
		float w[32 * 48];
		CHECK_OK(x3_trellis_decode(K, cb, tr, k, n, w), "decode 32x48 K=3 %s", x3_codebook_name(cb));
		int ok = 1;
		for (int kb = 0; kb < tk; kb++)
			for (int nb = 0; nb < tn; nb++) {
				uint16_t st[256];
				x3_trellis_unpack(K, tr + (kb * tn + nb) * 16 * K, st);
				for (int r = 0; r < 16; r++)
					for (int c = 0; c < 16; c++) {
						float v = x3_codebook(cb, st[x3_tile_iperm[16 * r + c]]);
						if (w[(16 * kb + r) * n + 16 * nb + c] != v)
							ok = 0;
					}
			}
		CHECK(ok, "%s: decoded tensor places tile (kb, nb) at rows 16kb, cols 16nb", x3_codebook_name(cb));
	}
	float w[256];
	CHECK(x3_trellis_decode(0, 0, tr, 16, 16, w) == X3_EINVAL, "K=0 rejected: %s", x3_errmsg());
	CHECK(x3_trellis_decode(9, 0, tr, 16, 16, w) == X3_EINVAL, "K=9 rejected");
	CHECK(x3_trellis_decode(2, 3, tr, 16, 16, w) == X3_EINVAL, "codebook 3 rejected");
	CHECK(x3_trellis_decode(2, 0, tr, 16, 24, w) == X3_EINVAL && strstr(x3_errmsg(), "16x24"),
	      "shape 16x24 rejected: %s", x3_errmsg());
}

int main(void)
{
	test_perm();
	test_vector();
	test_roundtrip();
	test_decode_tensor();
	TEST_DONE();
}
