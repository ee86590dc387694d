/* t1710-gpu-viterbi: the GPU tail-biting Viterbi encoder gives states and
 * values bit-identical to the CPU encoder (codec.h) for K = 1..8 and all
 * three codebooks, on random N(0, s) tiles and on tie-heavy tiles (zeros,
 * constants, a repeated codebook value); ideal tiles (decoded from random
 * valid trellises) are reproduced exactly; bad targets are refused naming
 * the tile. Skips without a device. On cusim, the CPU emulator (device
 * name "... emulated ..."), fewer random tiles per K and codebook. */
#include <math.h>
#include "gpu-test.h"
#include "codec.h"
#include "device.h"

#define NRAND_MAX 12
#define NSPEC 4
static int NRAND = NRAND_MAX, NT = NRAND_MAX + NSPEC;

static void make_tiles(int K, int cb, float *x)
{
	x3_rng r;
	x3_rng_seed(&r, 1700 + 10 * (uint64_t)K + (uint64_t)cb, 1);
	const float sd = cb == X3_CB_MUL1 ? 1.0f : X3_CODEBOOK_SCALE;
	for (int i = 0; i < NRAND * 256; i++)
		x[i] = (float)(x3_rng_normal(&r) * sd * (i < 256 ? 3.0 : 1.0));
	float *s = x + NRAND * 256;
	for (int i = 0; i < 256; i++) {
		s[i] = 0.0f;                                   /* all zero: many ties */
		s[256 + i] = i < 128 ? 0.75f : 3e6f;           /* constant, then huge: d^2's
		                                                  ulp ~1e6, costs tie */
		s[512 + i] = x3_codebook(cb, 0x1234);          /* an exact codebook value */
		s[768 + i] = (i & 1) ? 1e3f : -1e-3f;          /* large and tiny */
	}
}

int main(void)
{
	GPU_TEST_START(emulated);
	if (emulated) {   /* cusim: scale the data, not the coverage */
		NRAND = 1;
		NT = NRAND + NSPEC;
		printf("# emulated device: %d random tiles per K and codebook\n", NRAND);
	}
	float *x = malloc(sizeof(float) * 256 * (NRAND_MAX + NSPEC)), *vc = malloc(sizeof(float) * 256 * NT),
	      *vg = malloc(sizeof(float) * 256 * NT);
	uint16_t *sc = malloc(sizeof(uint16_t) * 256 * NT), *sg = malloc(sizeof(uint16_t) * 256 * NT);
	for (int K = 1; K <= 8; K++)
		for (int cb = 0; cb < X3_CB_COUNT; cb++) {
			make_tiles(K, cb, x);
			CHECK_OK(x3_viterbi_encode(K, cb, x, NT, sc, vc, 0), "cpu K=%d cb=%d", K, cb);
			CHECK_OK(G->viterbi_encode(K, cb, x, NT, sg, vg), "gpu K=%d cb=%d", K, cb);
			int bad = -1;
			for (int i = 0; i < 256 * NT && bad < 0; i++)
				if (sc[i] != sg[i] || memcmp(&vc[i], &vg[i], sizeof(float)))
					bad = i;
			CHECK(bad < 0, "K=%d %s: %d tiles bit-identical%s", K, x3_codebook_name(cb), NT,
			      bad < 0 ? "" : " (first difference below)");
			if (bad >= 0)
				printf("#   tile %d pos %d: cpu %04x %.9g gpu %04x %.9g\n", bad / 256,
				       bad % 256, sc[bad], (double)vc[bad], sg[bad], (double)vg[bad]);
			int tb = 1;
			const uint32_t mask = (1u << (16 - K)) - 1;
			for (int t = 0; t < NT; t++)
				if ((uint32_t)(sg[256 * t] >> K) != (sg[256 * t + 255] & mask))
					tb = 0;
			CHECK(tb, "K=%d %s: tail-biting holds on every tile", K, x3_codebook_name(cb));
		}

	/* the plain reference on one tile per codebook */
	for (int cb = 0; cb < X3_CB_COUNT; cb++) {
		make_tiles(3, cb, x);
		CHECK_OK(x3_viterbi_encode_ref(3, cb, x + 256, 1, sc, vc), "ref K=3");
		CHECK_OK(G->viterbi_encode(3, cb, x + 256, 1, sg, vg), "gpu K=3");
		CHECK(!memcmp(sc, sg, 512) && !memcmp(vc, vg, 1024), "K=3 %s equals the plain reference",
		      x3_codebook_name(cb));
	}

	/* ideal tiles: values of a valid tail-biting trellis are reproduced */
	for (int K = 1; K <= 8; K += 3) {
		const int cb = K % 3;
		x3_rng r;
		x3_rng_seed(&r, 17100 + (uint64_t)K, 2);
		uint16_t words[128], st[256];
		for (int t = 0; t < 4; t++) {
			for (int i = 0; i < 16 * K; i++)
				words[i] = (uint16_t)x3_rng_u64(&r);
			x3_trellis_unpack(K, words, st);
			for (int i = 0; i < 256; i++)
				x[256 * t + i] = x3_codebook(cb, st[i]);
		}
		CHECK_OK(G->viterbi_encode(K, cb, x, 4, sg, vg), "gpu ideal K=%d", K);
		double err = 0;
		for (int i = 0; i < 1024; i++)
			err += fabs((double)vg[i] - x[i]);
		CHECK(err == 0, "K=%d %s: ideal tiles reproduced exactly (sum |err| %g)", K,
		      x3_codebook_name(cb), err);
	}

	/* refusal of bad targets, naming the tile */
	make_tiles(2, 0, x);
	x[3 * 256 + 17] = NAN;
	int rc = G->viterbi_encode(2, 0, x, NT, sg, vg);
	CHECK(rc == X3_ENUM && strstr(x3_errmsg(), "tile 3 position 17"),
	      "NaN target refused: %s", x3_errmsg());
	x[3 * 256 + 17] = 2e16f;
	rc = G->viterbi_encode(2, 0, x, NT, sg, vg);
	CHECK(rc == X3_ENUM, "target 2e16 refused: %s", x3_errmsg());

	free(x), free(vc), free(vg), free(sc), free(sg);
	TEST_DONE();
}
