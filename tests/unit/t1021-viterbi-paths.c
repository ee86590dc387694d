/* t1021-viterbi-paths: every code path of the fast Viterbi encoder is
 * bit-identical to the reference (x3_viterbi_encode_ref): each instruction
 * set this CPU has x each K = 1..8 x the three codebooks, on five tiles
 * per case (random N(0, s), tie-heavy: zeros, a constant, exact codebook
 * values and a huge constant, tiny/large alternating values, a constant
 * tile, three repeated values), encoded with one and two threads, so
 * tiles run in lock-step pairs where the path has them plus a single
 * leftover tile, and with three threads, one tile at a time (fewer than
 * two tiles per thread: no pairs). At K = 1 AVX-512 that covers the
 * in-place fused steps for a pair and for one tile; at K = 2, 3 AVX2 the
 * recompute mode that keeps the costs of every 3rd / 2nd position only,
 * so that the trace-back recomputes the others (tbr_body) in every tile,
 * on the tie-heavy tiles too. Also larger odd
 * batches (9 and 7 tiles) at K = 1..8 on one thread (pairs and a single
 * tile) against the fast path with one tile per thread. */
#include <math.h>
#include "test.h"
#include "codec.h"

#define NT 5

static void make_tiles(int K, int cb, float *x)
{
	x3_rng r;
	x3_rng_seed(&r, 1021 + 10 * (uint64_t)K + (uint64_t)cb, 1);
	const double sd = cb == X3_CB_MUL1 ? 1.0 : X3_CODEBOOK_SCALE;
	const float *tab = x3_codebook_table(cb);
	for (int i = 0; i < 256; i++)
		x[i] = (float)(x3_rng_normal(&r) * sd);
	for (int i = 0; i < 256; i++) {
		float *t = x + 256;
		if (i < 64)
			t[i] = 0.0f;                               /* all candidates tie often */
		else if (i < 128)
			t[i] = 0.5f;
		else if (i < 192)
			t[i] = tab[x3_rng_u64(&r) & 0xFFFF];      /* exact codebook values */
		else
			t[i] = 3e6f;                               /* d^2 ulp ~1e6: costs tie */
		x[512 + i] = (i & 1) ? 1e3f : -1e-3f;
		/* a constant tile (every path costs the same up to the codebook
		 * value: ties between whole paths) and one of three repeated
		 * values, one of them a codebook value */
		x[768 + i] = 0.25f;
		x[1024 + i] = i % 3 == 0 ? tab[0x1234] : i % 3 == 1 ? -0.75f : 0.0f;
	}
}

static const int isas[3] = { X3_ISA_SCALAR, X3_ISA_AVX2, X3_ISA_AVX512 };

static void test_paths(void)
{
	float x[NT * 256], vr[NT * 256], v[NT * 256];
	uint16_t sr[NT * 256], s[NT * 256];
	for (int K = 1; K <= 8; K++)
		for (int cb = 0; cb < X3_CB_COUNT; cb++) {
			const char *cn = x3_codebook_name(cb);
			make_tiles(K, cb, x);
			CHECK_OK(x3_viterbi_encode_ref(K, cb, x, NT, sr, vr), "K=%d %s: reference", K, cn);
			for (int j = 0; j < 3; j++) {
				const char *in = x3_viterbi_isa_name(isas[j]);
				if (x3_viterbi_set_isa(isas[j]) != X3_OK) {
					SKIP("K=%d %s: %s not supported here", K, cn, in);
					continue;
				}
				/* the portable path is as slow as the reference: K = 1, 4, 8 */
				if (isas[j] == X3_ISA_SCALAR && K != 1 && K != 4 && K != 8) {
					SKIP("K=%d %s: portable path checked at K = 1, 4, 8 only", K, cn);
					continue;
				}
				for (int th = 1; th <= 3; th++) {
					memset(s, 0, sizeof s);
					memset(v, 0, sizeof v);
					CHECK_OK(x3_viterbi_encode(K, cb, x, NT, s, v, th), "K=%d %s %s: encode",
					         K, cn, in);
					int bad = -1;
					for (int i = 0; i < NT * 256 && bad < 0; i++)
						if (s[i] != sr[i] || memcmp(&v[i], &vr[i], 4))
							bad = i;
					CHECK(bad < 0, "K=%d %s %s, %d thread(s): random, tie-heavy, tiny/large, constant and "
					      "repeated-value tiles bit-identical to the reference%s", K, cn, in, th,
					      bad < 0 ? "" : " (first difference below)");
					if (bad >= 0)
						printf("#   tile %d position %d: state %u, reference %u\n", bad / 256,
						       bad % 256, s[bad], sr[bad]);
				}
			}
			x3_viterbi_set_isa(X3_ISA_AUTO);
		}
}

/* pairs and singles agree on a bigger odd batch (fast path only) */
static void test_batch(void)
{
	enum { NMAX = 9 };
	static float x[NMAX * 256];
	static uint16_t a[NMAX * 256], b[NMAX * 256];
	x3_rng r;
	x3_rng_seed(&r, 10211, 1);
	for (int i = 0; i < NMAX * 256; i++)
		x[i] = (float)x3_rng_normal(&r) * (i < 4 * 256 ? 1.0f : 0.3f);
	for (int N = 9; N >= 7; N -= 2)
		for (int K = 1; K <= 8; K++) {
			CHECK_OK(x3_viterbi_encode(K, X3_CB_3INST, x, N, a, NULL, 1), "K=%d: 1 thread", K);
			CHECK_OK(x3_viterbi_encode(K, X3_CB_3INST, x, N, b, NULL, N), "K=%d: %d threads",
			         K, N);
			CHECK(memcmp(a, b, sizeof(uint16_t) * 256 * N) == 0, "K=%d: %d tiles on 1 thread "
			      "(lock-step groups) == one tile per thread", K, N);
		}
}

int main(void)
{
	test_paths();
	test_batch();
	TEST_DONE();
}
