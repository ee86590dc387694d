/* viterbi.c: tail-biting two-pass Viterbi encoder for 256-value tiles
 * (exl3(5) §9.6), with a plain C reference and a SIMD fast path that gives
 * bit-identical results.
 *
 * Definition (the reference below is the executable form of it):
 *  - E = 2^(16-K) edges. A cost is kept per out-edge e = s & (E-1). The step
 *    at trellis position p with target w computes, for every e and every
 *    k = 0 .. 2^K-1 in increasing order, s = (k << (16-K)) | e,
 *    d = cb[s] - w (fp32), c = fmaf(d, d, prev[s >> K]), and keeps the
 *    minimum with strict < (ties keep the smallest k).
 *  - Costs are fp32 (ExLlamaV3 uses fp16; fp32 costs lose nothing and keep
 *    the MSE at the literature values). Targets are used as given in fp32,
 *    NOT rounded to fp16 first (ExLlamaV3 rounds them): rounding would add
 *    error for no gain here. Non-finite targets and |x| > 1e16 are refused.
 *  - Pass 1 runs positions 128..255, 0..127 from all-zero start costs, takes
 *    the argmin of the FINAL costs (lowest e wins ties; ExLlamaV3 reads the
 *    penultimate buffer, an off-by-one we do not reproduce) and traces back
 *    to position 0: pre = s_0 >> K.
 *  - Pass 2 runs positions 0..255 with start costs 0 at e == pre and +inf
 *    elsewhere (so step 0 is fmaf(d, d, 0) = d*d on allowed edges), and
 *    traces back from out-edge pre at position 255. Hence
 *    s_0 >> K == s_255 & (E-1) (tail-biting) by construction.
 *
 * Fast path: costs are edge-indexed; the codebook is re-laid-out in the
 * order the step consumes it (one sequential 256 KB stream per step);
 * lanes are 16 consecutive out-edges, four 16-edge blocks in flight per
 * group (independent min chains), running min m_k = min(m_{k-1}, c_k).
 * vminps returns its first operand iff it is strictly less, so the min
 * is the strict-< winner's cost bit for bit (costs are never NaN or -0).
 * Back-pointers, two ways:
 *  - masks (K <= 3 on AVX-512 and the portable path, K = 1 on AVX2): the
 *    mask c_k < m_{k-1} per candidate (2^K - 1 bits per edge); the winner
 *    is the largest k whose bit is set, or 0, exactly the strict-< argmin.
 *    Two steps are fused per 1024-edge block so the intermediate costs
 *    stay in L1 (two_steps); AVX-512 uses layout B at K = 1..3 (body512bt)
 *    and at K = 1 updates the costs in place, in rotated chunks
 *    (fusedip512), AVX2 layout B at K = 1 (body256bo). At K <= 2 the masks
 *    leave with non-temporal stores: AVX-512 collects them in 64-byte lines
 *    in L1 and stores each line when full (fusedip512, fused512p), the
 *    other paths stage whole positions in L1 and copy them out
 *    (stream_copy).
 *  - recompute (K >= 4, and K = 2, 3 on AVX2): no compare, no mask; the
 *    costs entering every S-th position the trace-back visits are kept
 *    (hist), and the trace-back recomputes the 2^K candidates of the one
 *    edge on the path (tb_*, tbr_body). 3 vector ops per 16 candidates
 *    instead of 4 (and on AVX2 no movemask and byte store per 8).
 * Pass 1's trace-back visits positions 127..0 only, so its first half
 * (positions 128..255) keeps neither. AVX-512 runs two tiles in lock step
 * (one codebook load for both) at K <= 2 and K >= 4, AVX2 at every K
 * (body256bo at K <= 3, body256t2 above), when there are at least two
 * tiles per thread. Kernels are
 * instantiated per K. Dispatch is at run time (AVX-512 F/BW/VL, AVX2+FMA,
 * portable C); the binary needs no -march. The re-laid-out codebooks are
 * built once per (K, codebook, layout) and kept.
 * Alternatives measured and not used (build host, AVX-512): in-place
 * pairs at K = 2 (4-8% slower there: the store stream is not the bound;
 * with one call per chunk, slower still), software prefetch of the
 * in-place chunks, 1024-edge in-place blocks at K = 1 (7% slower); four
 * tiles in lock step at K = 2 (a kernel-only loop gains 9%, the encoder
 * loses 7-10%) and at K = 1 in place (slower: four tiles' chunks do not
 * stay in L1); mask staging at K = 3 (5% slower); pairs at K = 3 (no
 * gain); software prefetch of the codebook stream (slower); non-temporal
 * copies of the K = 4 costs (hist is 4 MB per tile there; 10-25% slower);
 * an fp16 copy of the codebook and eight chains at K >= 4 (slower).
 * Alternatives measured and not used (Zen 3, AVX2): masks at K = 2, 3
 * (layout B, fused, pairs at K <= 2: 86k and 89k weights/s against 114k
 * and 110k in recompute mode); pairs at K = 3 in layout A (104k); the
 * minima of a half in groups of 4 candidates j with 16-byte stores
 * instead of the transposes' lane permutes (no gain); at K = 3 (S = 2)
 * the two steps into each kept position fused as in two_steps, the
 * intermediate costs in L1 (113k -> 114k: the cost stream is not the bound). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define X3_X86 1
#endif

#include "codec.h"

#define TARGET_MAX 1e16f   /* |d|^2 * 256 stays far below FLT_MAX */
/* Tuning constants: per K, the fastest of paths that give the same bits
 * (measured on the build host, AVX-512, and on Zen 3, AVX2). */
enum {
	/* AVX-512 uses layout B (body512bt) for K <= this (at K = 1 thanks to
	 * fusedip512's in-place pairs; with a second cost buffer A is faster) */
	LAYOUT_B_MAX_K = 3,
	/* AVX2 uses layout B (body256bo) and inlined fused pairs for K <= this */
	LAYOUT_B2_MAX_K = 3,
	/* fused step pairs (K <= 3) take blocks of FUSE_B_SMALL edges for
	 * K <= this (two tiles, two scratch blocks), of FUSE_MAX above */
	FUSE_B_SMALL_MAX_K = 2,
	/* 3-10% faster than 1024 at K = 1, 2; 2048 and 4096 are slower */
	FUSE_B_SMALL = 512,
	/* AVX-512 fused pairs update the costs in place (fusedip512) at this
	 * K; K = 2 works too (bit-identical) but is 5-8% slower than fused512p */
	IN_PLACE_K = 1,
};
/* edges per block of the fused step pair; the mid scratch holds FUSE_MAX */
#define FUSE_B(K) ((K) <= FUSE_B_SMALL_MAX_K ? FUSE_B_SMALL : FUSE_MAX)
#define FUSE_MAX 1024
#define PAD 16             /* floats past the end of a cost buffer */
#define IP_N 8                        /* chunk index bits */
#define IP_C(K) (1 << (8 - (K)))      /* floats per chunk: 2^(16-K) / 2^IP_N */
#define IP_B(K) (IP_C(K) << 2 * (K))  /* block: 512 at K = 1, 1024 at K = 2 */

static inline unsigned rotr_n(unsigned c, int s)
{
	return s ? ((c >> s) | (c << (IP_N - s))) & ((1u << IP_N) - 1) : c;
}

static int check_args(int K, int cb, const float *x, int64_t ntiles)
{
	if (K < 1 || K > 8)
		return x3_err(X3_EINVAL, "viterbi: K=%d out of range 1..8", K);
	if (cb < 0 || cb >= X3_CB_COUNT)
		return x3_err(X3_EINVAL, "viterbi: bad codebook id %d", cb);
	if (ntiles < 0 || (ntiles > 0 && !x))
		return x3_err(X3_EINVAL, "viterbi: bad tile count or NULL input");
	for (int64_t i = 0; i < ntiles * 256; i++)
		if (!(fabsf(x[i]) <= TARGET_MAX))
			return x3_err(X3_ENUM, "viterbi: tile %lld position %d: target %g "
			              "is not finite or exceeds 1e16", (long long)(i / 256),
			              (int)(i % 256), (double)x[i]);
	return X3_OK;
}

/* ---- reference --------------------------------------------------------- */

/* One forward pass: positions (i + roll) & 255 for i = 0..255, start costs
 * 0 (pre < 0) or 0 at e == pre and +inf elsewhere. Back-pointer k of the
 * winner at (p, e) goes to bp[p * E + e]. Returns the buffer holding the
 * final costs. */
static float *ref_pass(int K, const float *tab, const float *x, int roll,
                       int pre, float *prev, float *next, uint8_t *bp)
{
	const int E = 1 << (16 - K), NK = 1 << K;
	for (int e = 0; e < E; e++)
		prev[e] = (pre < 0 || e == pre) ? 0.0f : INFINITY;
	for (int i = 0; i < 256; i++) {
		int p = (i + roll) & 255;
		float w = x[p];
		for (int e = 0; e < E; e++) {
			float best = 0.0f;
			int bk = 0;
			for (int k = 0; k < NK; k++) {
				uint32_t s = (uint32_t)k << (16 - K) | (uint32_t)e;
				float d = tab[s] - w;
				float c = fmaf(d, d, prev[s >> K]);
				if (k == 0 || c < best) {
					best = c;
					bk = k;
				}
			}
			next[e] = best;
			bp[(size_t)p * E + e] = (uint8_t)bk;
		}
		float *t = prev;
		prev = next;
		next = t;
	}
	return prev;
}

int x3_viterbi_encode_ref(int K, int cb, const float *x, int64_t ntiles,
                          uint16_t *states, float *values)
{
	int rc = check_args(K, cb, x, ntiles);
	if (rc)
		return rc;
	const float *tab = x3_codebook_table(cb);
	const int E = 1 << (16 - K);
	float *ca = malloc(sizeof(float) * E), *cbuf = malloc(sizeof(float) * E);
	uint8_t *bp = malloc((size_t)256 * E);
	if (!ca || !cbuf || !bp) {
		free(ca); free(cbuf); free(bp);
		return x3_err(X3_ENOMEM, "viterbi: out of memory");
	}
	for (int64_t t = 0; t < ntiles; t++) {
		const float *xt = x + t * 256;
		uint16_t st[256];
		/* pass 1: anchor */
		float *fin = ref_pass(K, tab, xt, 128, -1, ca, cbuf, bp);
		int e = 0;
		for (int i = 1; i < E; i++)
			if (fin[i] < fin[e])
				e = i;
		for (int p = 127; p >= 0; p--) {
			uint32_t s = (uint32_t)bp[(size_t)p * E + e] << (16 - K) | (uint32_t)e;
			e = (int)(s >> K);
		}
		int pre = e;
		/* pass 2: constrained to start and end at edge pre */
		ref_pass(K, tab, xt, 0, pre, ca, cbuf, bp);
		e = pre;
		for (int p = 255; p >= 0; p--) {
			uint32_t s = (uint32_t)bp[(size_t)p * E + e] << (16 - K) | (uint32_t)e;
			st[p] = (uint16_t)s;
			e = (int)(s >> K);
		}
		for (int i = 0; i < 256; i++) {
			if (states)
				states[t * 256 + i] = st[i];
			if (values)
				values[t * 256 + i] = tab[st[i]];
		}
	}
	free(ca); free(cbuf); free(bp);
	return X3_OK;
}

/* ---- fast path ---------------------------------------------------------- */
/* Layout. Edges come in groups of 64 (four blocks u of 16 lanes).
 *  codebook, consumption order: cbo[((g*NK + k)*4 + u)*16 + lane]
 *      = cb[(k << (16-K)) | (64g + 16u + lane)]
 *  masks of one position: bp[(g*(NK-1) + k-1)*4 + u], bit lane set iff
 *      candidate k beat the running min of candidates 0..k-1.
 * A step kernel computes the output groups g0 <= g < g1 into out[0..] and
 * reads the cost of predecessor edge (k << (16-2K)) | (e >> K) at
 * pb[k*ks + (e >> K) - poff]: for a whole step pb = prev, ks = 2^(16-2K),
 * poff = 0; the fused two-step scheme below points it into an L1 scratch. */
typedef void (*step_fn)(int K, const float *cbo, float w, const float *pb,
                        size_t ks, int poff, float *out, uint16_t *bp,
                        int g0, int g1);

/* a fused pair of steps (K <= 3), see two_steps() */
typedef void (*fused_fn)(int K, const float *cbo, float w0, float w1,
                         const float *prev, float *next, float *mid,
                         uint16_t *bp0, uint16_t *bp1);

/* the same for one tile (cb2 == NULL) or two tiles in lock step, with the
 * costs updated in place (pair m of the pass), see fusedip512() */
typedef void (*fusedip_fn)(int K, const float *cbo, float wa0, float wa1, float wb0,
                           float wb1, float *ca, float *cb2, float *mida, float *midb,
                           uint16_t *ba0, uint16_t *ba1, uint16_t *bb0, uint16_t *bb1, int m);

static void step_scalar(int K, const float *cbo, float w, const float *pb,
                        size_t ks, int poff, float *out, uint16_t *bp,
                        int g0, int g1)
{
	const int NK = 1 << K;
	if (bp)
		bp += (size_t)g0 * (NK - 1) * 4;
	for (int g = g0; g < g1; g++, out += 64) {
		const float *c = cbo + (size_t)g * NK * 64;
		const float *p = pb - poff;
		float m[64];
		for (int l = 0; l < 64; l++) {
			float d = c[l] - w;
			m[l] = fmaf(d, d, p[(64 * g + l) >> K]);
		}
		c += 64;
		for (int k = 1; k < NK; k++, c += 64, bp = bp ? bp + 4 : bp)
			for (int u = 0; u < 4; u++) {
				unsigned mask = 0;
				const float *pv = p + k * ks;
				for (int l = 0; l < 16; l++) {
					float d = c[16 * u + l] - w;
					float v = fmaf(d, d, pv[(64 * g + 16 * u + l) >> K]);
					if (v < m[16 * u + l]) {
						m[16 * u + l] = v;
						mask |= 1u << l;
					}
				}
				if (bp)
					bp[u] = (uint16_t)mask;
			}
		memcpy(out, m, sizeof m);
	}
}

#ifdef X3_X86
#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define TGT2 __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

/* Store a mask register straight to memory (kmovw m16, k). Without this
 * gcc merges the four 16-bit stores through general registers (kmovw to a
 * GPR, shifts, ors), which costs more than the arithmetic. */
#define STORE_MASK(ptr, m) __asm__("kmovw %1, %0" : "=m"(*(ptr)) : "k"(m))

/* One group: four independent running-min chains over k, for T = 1 tile
 * or T = 2 tiles in lock step (one codebook load serves both; tile b's
 * predecessor costs, outputs and masks at pbb, ob, bb, at the same offsets
 * as tile a's). */
TGT512 INLINE void body512t(const int K, const int wbp, const int T, const float *cbo,
                            float wa, float wb, const float *pa, const float *pbb,
                            size_t ks, int poff, float *oa, float *ob, uint16_t *ba,
                            uint16_t *bb, int g0, int g1)
{
	const int NK = 1 << K;
	const __m512 vw[2] = { _mm512_set1_ps(wa), _mm512_set1_ps(wb) };
	/* K < 4: the 64 lanes of a group need p[(64g >> K) + ((16u + l) >> K)],
	 * 64 >> K consecutive costs: one or two aligned-size loads per k,
	 * expanded by a permute per u (no line-splitting loads per u) */
	const int NV = K == 1 ? 2 : 1;
	__m512i ixu[4];
	for (int u = 0; u < 4; u++)
		ixu[u] = _mm512_add_epi32(_mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10,
		                          9, 8, 7, 6, 5, 4, 3, 2, 1, 0), (unsigned)(K < 4 ? K : 0)),
		                          _mm512_set1_epi32(((16 * u) >> K) & 15));
	const float *pt[2] = { pa, pbb };
	float *ot[2] = { oa, ob };
	uint16_t *bt[2] = { ba, bb };
	if (wbp)
		for (int t = 0; t < T; t++)
			bt[t] += (size_t)g0 * (NK - 1) * 4;
	for (int g = g0; g < g1; g++) {
		const float *c = cbo + (size_t)g * NK * 64;
		/* (64g + 16u) >> K == (64g >> K) + (16u >> K) for K <= 8 */
		const float *q[2];
		__m512 m[2][4], V[2][2];
#pragma GCC unroll 2
		for (int t = 0; t < T; t++) {
			q[t] = pt[t] + ((64 * g) >> K) - poff;
			if (K < 4)
				for (int i = 0; i < NV; i++)
					V[t][i] = _mm512_loadu_ps(q[t] + 16 * i);
		}
#pragma GCC unroll 4
		for (int u = 0; u < 4; u++) {
			__m512 x = _mm512_load_ps(c + 16 * u);
#pragma GCC unroll 2
			for (int t = 0; t < T; t++) {
				__m512 d = _mm512_sub_ps(x, vw[t]);
				__m512 pv = K >= 4 ? _mm512_set1_ps(q[t][(16 * u) >> K])
				                   : _mm512_permutexvar_ps(ixu[u], V[t][((16 * u) >> K) >> 4]);
				m[t][u] = _mm512_fmadd_ps(d, d, pv);
			}
		}
		c += 64;
		for (int k = 1; k < NK; k++, c += 64) {
			const size_t o = k * ks;
			if (K < 4)
#pragma GCC unroll 2
				for (int t = 0; t < T; t++)
					for (int i = 0; i < NV; i++)
						V[t][i] = _mm512_loadu_ps(q[t] + o + 16 * i);
#pragma GCC unroll 4
			for (int u = 0; u < 4; u++) {
				__m512 x = _mm512_load_ps(c + 16 * u);
#pragma GCC unroll 2
				for (int t = 0; t < T; t++) {
					__m512 d = _mm512_sub_ps(x, vw[t]);
					__m512 pv = K >= 4 ? _mm512_set1_ps(q[t][o + ((16 * u) >> K)])
					                   : _mm512_permutexvar_ps(ixu[u],
					                                           V[t][((16 * u) >> K) >> 4]);
					__m512 v = _mm512_fmadd_ps(d, d, pv);
					if (wbp)
						STORE_MASK(bt[t] + u, _mm512_cmp_ps_mask(v, m[t][u], _CMP_LT_OQ));
					m[t][u] = _mm512_min_ps(v, m[t][u]);
				}
			}
			if (wbp)
				for (int t = 0; t < T; t++)
					bt[t] += 4;
		}
#pragma GCC unroll 2
		for (int t = 0; t < T; t++)
#pragma GCC unroll 4
			for (int u = 0; u < 4; u++)
				_mm512_store_ps(ot[t] + (size_t)64 * (g - g0) + 16 * u, m[t][u]);
	}
}

TGT512 INLINE void body512(const int K, const int wbp, const float *cbo, float w,
                           const float *pb, size_t ks, int poff, float *out, uint16_t *bp,
                           int g0, int g1)
{
	body512t(K, wbp, 1, cbo, w, w, pb, pb, ks, poff, out, out, bp, bp, g0, g1);
}

/* Layout B (AVX-512, K <= LAYOUT_B_MAX_K): lanes are 16 consecutive
 * predecessor groups gv = e >> K, so the predecessor costs k*ks + gv are
 * one contiguous load shared by the NK candidates j = e & (NK-1) of every
 * gv, with no expand permute. The NK result vectors R_j (lane gv) are then
 * interleaved to natural edge order e = gv*NK + j by K rounds of zips.
 *  codebook: cbo[((b*NK + k)*NK + j)*16 + l] = cb[(k << (16-K)) | ((16b+l) << K) | j]
 *  masks:    bp[(b*(NK-1) + k-1)*NK + j], bit l, for g-block b (16 gv). */
TGT512 INLINE void body512bo(const int K, const int wbp, const int T, const float *cbo,
                             float wa, float wb, const float *pa, const float *pbb,
                             size_t ks, int poff, float *oa, float *ob, uint16_t *ba,
                             uint16_t *bb, int g0, int g1, const int ipo, int s1,
                             const int mrel)
{
	const int NK = 1 << K;
	const int b0 = g0 * 4 / NK, b1 = g1 * 4 / NK;   /* 64-edge groups -> g-blocks */
	const __m512 vw[2] = { _mm512_set1_ps(wa), _mm512_set1_ps(wb) };
	const __m512i zl = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
	const __m512i zh = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10,
	                                    25, 9, 24, 8);
	const float *pt[2] = { pa, pbb };
	float *ot[2] = { oa, ob };
	uint16_t *bt[2] = { ba, bb };
	if (wbp && !mrel)   /* mrel: masks from ba, bb on, not at their place in a position */
		for (int t = 0; t < T; t++)
			bt[t] += (size_t)b0 * (NK - 1) * NK;
	for (int b = b0; b < b1; b++) {
		const float *c = cbo + (size_t)b * NK * NK * 16;
		/* outputs: contiguous from ot, or (ipo, in-place pairs) edge
		 * 16 NK b lies in logical chunk c, stored at chunk rotr_n(c, s1) */
		float *o[2];
		for (int t = 0; t < T; t++)
			o[t] = ipo ? ot[t] + (size_t)rotr_n((unsigned)(16 * NK * b / IP_C(K)), s1) * IP_C(K) +
			             16 * NK * b % IP_C(K)
			           : ot[t] + (size_t)16 * NK * (b - b0);
		__m512 m[2][8], P[2];
#pragma GCC unroll 2
		for (int t = 0; t < T; t++)
			P[t] = _mm512_loadu_ps(pt[t] + 16 * b - poff);
#pragma GCC unroll 8
		for (int j = 0; j < NK; j++) {
			__m512 x = _mm512_load_ps(c + 16 * j);
#pragma GCC unroll 2
			for (int t = 0; t < T; t++) {
				__m512 d = _mm512_sub_ps(x, vw[t]);
				m[t][j] = _mm512_fmadd_ps(d, d, P[t]);
			}
		}
		c += 16 * NK;
#pragma GCC unroll 8
		for (int k = 1; k < NK; k++, c += 16 * NK) {
#pragma GCC unroll 2
			for (int t = 0; t < T; t++)
				P[t] = _mm512_loadu_ps(pt[t] + 16 * b - poff + k * ks);
#pragma GCC unroll 8
			for (int j = 0; j < NK; j++) {
				__m512 x = _mm512_load_ps(c + 16 * j);
#pragma GCC unroll 2
				for (int t = 0; t < T; t++) {
					__m512 d = _mm512_sub_ps(x, vw[t]);
					__m512 v = _mm512_fmadd_ps(d, d, P[t]);
					if (wbp)
						STORE_MASK(bt[t] + j, _mm512_cmp_ps_mask(v, m[t][j], _CMP_LT_OQ));
					m[t][j] = _mm512_min_ps(v, m[t][j]);
				}
			}
			if (wbp)
				for (int t = 0; t < T; t++)
					bt[t] += NK;
		}
#pragma GCC unroll 2
		for (int t = 0; t < T; t++) {
			__m512 r[8], u[8];
#pragma GCC unroll 8
			for (int j = 0; j < NK; j++)
				r[j] = m[t][j];
			/* round: u[2i], u[2i+1] = zip_lo, zip_hi of r[i], r[i + NK/2] */
#pragma GCC unroll 3
			for (int q = 0; q < K; q++) {
#pragma GCC unroll 4
				for (int i = 0; i < NK / 2; i++) {
					u[2 * i] = _mm512_permutex2var_ps(r[i], zl, r[i + NK / 2]);
					u[2 * i + 1] = _mm512_permutex2var_ps(r[i], zh, r[i + NK / 2]);
				}
#pragma GCC unroll 8
				for (int j = 0; j < NK; j++)
					r[j] = u[j];
			}
#pragma GCC unroll 8
			for (int j = 0; j < NK; j++)
				_mm512_store_ps(o[t] + 16 * j, r[j]);
		}
	}
}

TGT512 INLINE void body512bt(const int K, const int wbp, const int T, const float *cbo,
                             float wa, float wb, const float *pa, const float *pbb,
                             size_t ks, int poff, float *oa, float *ob, uint16_t *ba,
                             uint16_t *bb, int g0, int g1)
{
	body512bo(K, wbp, T, cbo, wa, wb, pa, pbb, ks, poff, oa, ob, ba, bb, g0, g1, 0, 0, 0);
}

TGT512 INLINE void body512b(const int K, const int wbp, const float *cbo, float w,
                            const float *pb, size_t ks, int poff, float *out, uint16_t *bp,
                            int g0, int g1)
{
	body512bt(K, wbp, 1, cbo, w, w, pb, pb, ks, poff, out, out, bp, bp, g0, g1);
}

/* one instance per K and back-pointer mode: shifts and trip counts are
 * constants; bp == NULL selects the instance without masks */
#define BODY512(K, wbp) do { \
		if ((K) <= LAYOUT_B_MAX_K) \
			body512b(K, wbp, cbo, w, pb, ks, poff, out, bp, g0, g1); \
		else \
			body512(K, wbp, cbo, w, pb, ks, poff, out, bp, g0, g1); \
	} while (0)
#define SWITCH_K(M, wbp) switch (K) { \
	case 1: M(1, wbp); break; case 2: M(2, wbp); break; \
	case 3: M(3, wbp); break; case 4: M(4, wbp); break; \
	case 5: M(5, wbp); break; case 6: M(6, wbp); break; \
	case 7: M(7, wbp); break; default: M(8, wbp); break; }

TGT512 static void step_avx512(int K, const float *cbo, float w, const float *pb,
                               size_t ks, int poff, float *out, uint16_t *bp,
                               int g0, int g1)
{
	if (bp)
		SWITCH_K(BODY512, 1)
	else
		SWITCH_K(BODY512, 0)
}

/* The fused step pair of two_steps() with the kernels inlined: one call
 * per pair of steps instead of NK + 1 calls per 1024-edge block. */
TGT512 INLINE void fused512(const int K, const int wbp, const float *cbo, float w0,
                            float w1, const float *prev, float *next, float *mid,
                            uint16_t *bp0, uint16_t *bp1)
{
	const int E = 1 << (16 - K), NK = 1 << K, G = 1 << (16 - 2 * K);
	const int L = FUSE_B(K) / NK;
	for (int e0 = 0; e0 < E; e0 += FUSE_B(K)) {
		for (int kk = 0; kk < NK; kk++) {
			int x0 = kk * G + e0 / NK;
			if ((K) <= LAYOUT_B_MAX_K)
				body512b(K, wbp, cbo, w0, prev, G, 0, mid + kk * L, bp0, x0 / 64,
				         (x0 + L) / 64);
			else
				body512(K, wbp, cbo, w0, prev, G, 0, mid + kk * L, bp0, x0 / 64,
				        (x0 + L) / 64);
		}
		if ((K) <= LAYOUT_B_MAX_K)
			body512b(K, wbp, cbo, w1, mid, L, e0 / NK, next + e0, bp1, e0 / 64,
			         (e0 + FUSE_B(K)) / 64);
		else
			body512(K, wbp, cbo, w1, mid, L, e0 / NK, next + e0, bp1, e0 / 64,
			        (e0 + FUSE_B(K)) / 64);
	}
}

#define FUSED512(K, wbp) fused512(K, wbp, cbo, w0, w1, prev, next, mid, bp0, bp1)

/* Two tiles in lock step (AVX-512: K = 1 in place, fusedip512; K = 2
 * fused with masks, fused512p; recompute mode K >= 4, whole steps without
 * masks). One codebook load serves the candidates of both tiles: the
 * 64-byte load per 16 candidates asks ~40 B/cycle of L2 at the recompute
 * kernels' 1.5 cycles per vector, about all L2 delivers. */
typedef void (*step2_fn)(int K, const float *cbo, float wa, float wb, const float *pa,
                         const float *pb, float *oa, float *ob);
typedef void (*fused2_fn)(int K, const float *cbo, float wa0, float wa1, float wb0,
                          float wb1, const float *preva, const float *prevb, float *nexta,
                          float *nextb, float *mida, float *midb, uint16_t *ba0,
                          uint16_t *ba1, uint16_t *bb0, uint16_t *bb1);

/* the kernels of the recompute mode (K >= 4), instantiated per K */
#define SWITCH_HIST_K(M) switch (K) { \
	case 4: M(4); break; case 5: M(5); break; case 6: M(6); break; \
	case 7: M(7); break; default: M(8); break; }

#define BODY2(K) body512t(K, 0, 2, cbo, wa, wb, pa, pb, (size_t)1 << (16 - 2 * (K)), 0, \
                          oa, ob, NULL, NULL, 0, 1 << (10 - (K)))

TGT512 static void step2_avx512(int K, const float *cbo, float wa, float wb, const float *pa,
                                const float *pb, float *oa, float *ob)
{
	SWITCH_HIST_K(BODY2)
}

/* fused512 at K = 2 for T = 1 tile or T = 2 tiles in lock step, its masks
 * written to 64-byte lines kept in L1 and sent on with non-temporal stores
 * (instead of the per-position staging of run_pass): a block's second
 * step writes 8 g-blocks x 12 masks = 3 lines, the first step's call for
 * kk 2 x 12 masks, so four blocks fill 3 lines per kk. */
_Static_assert(FUSE_B(2) == 512, "fused512p's mask lines (R, r0, r1) assume FUSE_B(2) == 512");
/* Send n masks (whole 64-byte lines) of each of the T tiles from their L1
 * lines s0, s1 to dst[t] + off, one non-temporal store per line. */
TGT512 INLINE void stream_masks(int T, uint16_t *const dst[2], size_t off, const uint16_t *s0,
                                const uint16_t *s1, int n)
{
	for (int t = 0; t < T; t++)
		for (int i = 0; i < n; i += 32)
			_mm512_stream_si512((void *)(dst[t] + off + i),
			                    _mm512_load_si512((t ? s1 : s0) + i));
}

TGT512 INLINE void fused512p(const int K, const int wbp, const int T, const float *cbo,
                             float wa0, float wa1, float wb0, float wb1, const float *preva,
                             const float *prevb, float *nexta, float *nextb, float *mida,
                             float *midb, uint16_t *ba0, uint16_t *ba1, uint16_t *bb0,
                             uint16_t *bb1)
{
	const int E = 1 << (16 - K), NK = 1 << K, G = 1 << (16 - 2 * K);
	const int FB = FUSE_B(K), L = FB / NK;
	const int MB = (NK - 1) * NK;                               /* masks per g-block */
	const int MC1 = L / (16 * NK) * MB, MC2 = FB / (16 * NK) * MB;   /* per call: 24, 96 */
	const int R = 4;                                            /* calls per kk line set */
	_Alignas(64) uint16_t r0[2][4][4 * 24], r1[2][96];
	uint16_t *bp0[2] = { ba0, bb0 }, *bp1[2] = { ba1, bb1 };
	for (int e0 = 0, j = 0; e0 < E; e0 += FB, j++) {
		for (int kk = 0; kk < NK; kk++) {
			int x0 = kk * G + e0 / NK;
			body512bo(K, wbp, T, cbo, wa0, wb0, preva, prevb, G, 0, mida + kk * L,
			          midb + kk * L, r0[0][kk] + j % R * MC1, r0[1][kk] + j % R * MC1,
			          x0 / 64, (x0 + L) / 64, 0, 0, 1);
			if (wbp && j % R == R - 1) {
				/* masks of intermediate edges x0 - (R-1) L .. x0 + L */
				stream_masks(T, bp0, (size_t)(x0 - (R - 1) * L) / (16 * NK) * MB,
				             r0[0][kk], r0[1][kk], R * MC1);
			}
		}
		body512bo(K, wbp, T, cbo, wa1, wb1, mida, midb, L, e0 / NK, nexta + e0, nextb + e0,
		          r1[0], r1[1], e0 / 64, (e0 + FB) / 64, 0, 0, 1);
		if (wbp)
			stream_masks(T, bp1, (size_t)e0 / (16 * NK) * MB, r1[0], r1[1], MC2);
	}
}

TGT512 static void fused2_avx512(int K, const float *cbo, float wa0, float wa1, float wb0,
                                 float wb1, const float *preva, const float *prevb,
                                 float *nexta, float *nextb, float *mida, float *midb,
                                 uint16_t *ba0, uint16_t *ba1, uint16_t *bb0, uint16_t *bb1)
{
	(void)K;   /* K = 2 only (K = 1: fusedip_avx512; K = 3: no pairs) */
	if (ba0)
		fused512p(2, 1, 2, cbo, wa0, wa1, wb0, wb1, preva, prevb, nexta, nextb, mida, midb,
		          ba0, ba1, bb0, bb1);
	else
		fused512p(2, 0, 2, cbo, wa0, wa1, wb0, wb1, preva, prevb, nexta, nextb, mida, midb,
		          ba0, ba1, bb0, bb1);
}

TGT512 static void fused_avx512(int K, const float *cbo, float w0, float w1,
                                const float *prev, float *next, float *mid,
                                uint16_t *bp0, uint16_t *bp1)
{
	/* K = 2, 3 (K = 1: fusedip_avx512); K = 2 sends its masks out itself */
	if (K == 2) {
		if (bp0)
			fused512p(2, 1, 1, cbo, w0, w1, w0, w1, prev, prev, next, next, mid, mid, bp0,
			          bp1, bp0, bp1);
		else
			fused512p(2, 0, 1, cbo, w0, w1, w0, w1, prev, prev, next, next, mid, mid, bp0,
			          bp1, bp0, bp1);
	} else if (bp0)
		FUSED512(3, 1);
	else
		FUSED512(3, 0);
}

/* In-place fused pairs of steps (AVX-512, layout B, K = IN_PLACE_K = 1).
 * At K = 1 a cost buffer (128 KB) lives in L2, and writing the second
 * step's outputs to a second buffer costs a read-for-ownership from L2 per
 * line; with layout B that store stream, not the arithmetic, bounded the
 * fused pair (measured: the second step of a pair took twice the first).
 * Instead each block of the pair writes its outputs over the very costs its
 * first step has just read (still in L1), so one buffer per tile suffices
 * and no line is fetched only to be overwritten. (The scheme holds for
 * K = 2 as well, with n = 8; measured slower there, so not used by
 * default, see IN_PLACE_K.)
 *
 * Why that works. Cut the edges into chunks of C = B / NK^2 (B = IP_B(K)
 * outputs per block). Block j (outputs e0 = jB .. e0 + B - 1, logical
 * chunks (j << 2K) | q for q < NK^2) reads, through its first step, the
 * predecessor costs at k*G + kk*G/NK + e0/NK^2 + [0, C) for k, kk < NK:
 * exactly the NK^2 logical chunks (k << (n-K)) | (kk << (n-2K)) | j, where
 * n = log2(E / C) is the width of a chunk index. Reading chunk index
 * c = (j << 2K) | q as the read chunk (q << (n-2K)) | j is a rotation right
 * by 2K bits, so if logical chunk c is stored at chunk rotr_n(c, s_m) before
 * pair m (s_0 = 0, the natural order), writing the outputs at
 * s_{m+1} = s_m + 2K puts each output chunk on a chunk its block has read.
 * Blocks read disjoint chunks, so no block overwrites a cost another still
 * needs. C is chosen so that K divides n: the NK chunks of one kk (k = 0 ..
 * NK-1, the top K bits) then stay equally spaced after any rotation by a
 * multiple of K, which is the (pb, ks, poff) form the kernels read. With
 * n = 8 and 128 pairs per pass, s_128 = 256K = 0 mod 8: a pass ends in the
 * natural order, so the anchor's argmin reads the costs as they are. The
 * arithmetic, the masks and the trace-back are those of two_steps(). */
/* pair m of a pass for T = 1 tile (ca) or T = 2 tiles in lock step (ca,
 * cb2); costs in and out in the same buffer, chunks rotated as above */
TGT512 INLINE void fusedip512(const int K, const int wbp, const int T, const float *cbo,
                              float wa0, float wa1, float wb0, float wb1, float *ca, float *cb2,
                              float *mida, float *midb, uint16_t *ba0, uint16_t *ba1,
                              uint16_t *bb0, uint16_t *bb1, int m)
{
	const int E = 1 << (16 - K), NK = 1 << K, G = 1 << (16 - 2 * K);
	const int B = IP_B(K), L = B / NK, C = IP_C(K);
	const int s0 = 2 * K * m % IP_N, s1 = 2 * K * (m + 1) % IP_N;
	/* storage distance between the chunks of k and k + 1 (the k field, bits
	 * n-K .. n-1 of a chunk index, lands at bit n-K-s0 mod n) */
	const size_t ks = (size_t)C << ((IP_N - K - s0 + IP_N) % IP_N);
	/* Masks are written to 64-byte lines kept in L1 and sent on with one
	 * non-temporal store per line: MB masks per g-block of 16 NK edges, MC1
	 * per first-step call (L edges: K = 1: 16, K = 2: 48), MC2 per block's
	 * second step (B edges: 32, 192, whole lines); R = 2 calls for kk fill
	 * whole lines, the next block completing what one leaves. */
	const int MB = (NK - 1) * NK, MC1 = L / (16 * NK) * MB, MC2 = B / (16 * NK) * MB;
	const int R = 2;
	_Alignas(64) uint16_t r0[2][4][96], r1[2][192];
	uint16_t *bp0[2] = { ba0, bb0 }, *bp1[2] = { ba1, bb1 };
	for (int e0 = 0, j = 0; e0 < E; e0 += B, j++) {
		for (int kk = 0; kk < NK; kk++) {
			const size_t base = (size_t)rotr_n((unsigned)(kk << (IP_N - 2 * K) | j), s0) * C;
			const int x0 = kk * G + e0 / NK;   /* first intermediate edge */
			body512bo(K, wbp, T, cbo, wa0, wb0, ca + base, cb2 + base, ks, x0 / NK,
			          mida + kk * L, midb + kk * L, r0[0][kk] + j % R * MC1,
			          r0[1][kk] + j % R * MC1, x0 / 64, (x0 + L) / 64, 0, 0, 1);
			if (wbp && j % R == R - 1) {
				/* masks of intermediate edges x0 - (R-1) L .. x0 + L */
				stream_masks(T, bp0, (size_t)(x0 - (R - 1) * L) / (16 * NK) * MB,
				             r0[0][kk], r0[1][kk], R * MC1);
			}
		}
		/* the NK^2 output chunks go to the chunks just read */
		body512bo(K, wbp, T, cbo, wa1, wb1, mida, midb, L, e0 / NK, ca, cb2, r1[0], r1[1],
		          e0 / 64, (e0 + B) / 64, 1, s1, 1);
		if (wbp)
			stream_masks(T, bp1, (size_t)e0 / (16 * NK) * MB, r1[0], r1[1], MC2);
	}
}

/* cb2 == NULL: one tile; K = 1, 2 (IN_PLACE_K) */
TGT512 static void fusedip_avx512(int K, const float *cbo, float wa0, float wa1, float wb0,
                                  float wb1, float *ca, float *cb2, float *mida, float *midb,
                                  uint16_t *ba0, uint16_t *ba1, uint16_t *bb0, uint16_t *bb1,
                                  int m)
{
#define FUSEDIP(K, wbp, T) fusedip512(K, wbp, T, cbo, wa0, wa1, wb0, wb1, ca, T == 2 ? cb2 : ca, \
                                      mida, T == 2 ? midb : mida, ba0, ba1, \
                                      T == 2 ? bb0 : ba0, T == 2 ? bb1 : ba1, m)
	if (cb2) {
		if (ba0) {
			if (K == 1) FUSEDIP(1, 1, 2); else FUSEDIP(2, 1, 2);
		} else {
			if (K == 1) FUSEDIP(1, 0, 2); else FUSEDIP(2, 0, 2);
		}
	} else {
		if (ba0) {
			if (K == 1) FUSEDIP(1, 1, 1); else FUSEDIP(2, 1, 1);
		} else {
			if (K == 1) FUSEDIP(1, 0, 1); else FUSEDIP(2, 0, 1);
		}
	}
#undef FUSEDIP
}

/* AVX2: each 16-lane block is two 8-lane halves; masks are joined. */
TGT2 INLINE __m256 pv256(const int K, const float *p, __m256i ix)
{
	if (K >= 3)
		return _mm256_broadcast_ss(p);
	return _mm256_permutevar8x32_ps(_mm256_loadu_ps(p), ix);
}

TGT2 INLINE void body256(const int K, const int wbp, const float *cbo, float w,
                         const float *pb, size_t ks, int poff, float *out, uint16_t *bp,
                         int g0, int g1)
{
	const int NK = 1 << K;
	const __m256 vw = _mm256_set1_ps(w);
	const __m256i ix = _mm256_srli_epi32(_mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0),
	                                     K < 3 ? K : 0);
	if (wbp)
		bp += (size_t)g0 * (NK - 1) * 4;
	for (int g = g0; g < g1; g++, out += 64) {
		const float *c = cbo + (size_t)g * NK * 64;
		/* (64g + 8h) >> K == (64g >> K) + (8h >> K) for K <= 8 */
		const float *p = pb + ((64 * g) >> K) - poff;
		__m256 m[8];
#pragma GCC unroll 8
		for (int h = 0; h < 8; h++) {
			__m256 d = _mm256_sub_ps(_mm256_load_ps(c + 8 * h), vw);
			m[h] = _mm256_fmadd_ps(d, d, pv256(K, p + ((8 * h) >> K), ix));
		}
		c += 64;
		for (int k = 1; k < NK; k++, c += 64, bp = wbp ? bp + 4 : bp) {
			const float *pk = p + k * ks;
			unsigned bits[8];
#pragma GCC unroll 8
			for (int h = 0; h < 8; h++) {
				__m256 d = _mm256_sub_ps(_mm256_load_ps(c + 8 * h), vw);
				__m256 v = _mm256_fmadd_ps(d, d, pv256(K, pk + ((8 * h) >> K), ix));
				if (wbp)
					bits[h] = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, m[h],
					                                                     _CMP_LT_OQ));
				m[h] = _mm256_min_ps(v, m[h]);
			}
			if (!wbp)
				continue;
			/* one 64-bit store of the four 16-bit masks */
			uint64_t q = (uint64_t)(bits[0] | bits[1] << 8 | bits[2] << 16 | bits[3] << 24) |
			             (uint64_t)(bits[4] | bits[5] << 8 | bits[6] << 16 | bits[7] << 24) << 32;
			memcpy(bp, &q, 8);
		}
#pragma GCC unroll 8
		for (int h = 0; h < 8; h++)
			_mm256_store_ps(out + 8 * h, m[h]);
	}
}

/* Layout B for AVX2 (K <= LAYOUT_B2_MAX_K): the codebook and mask layout of
 * body512bo (16 predecessor groups gv per g-block b), each g-block done as
 * two 8-lane halves h (gv 16b + 8h .. +7) one after the other, so that the
 * NK running minima of a half (and of T = 2 tiles at K <= 2) stay in
 * registers. A half's mask for (k, j) is the byte h of the 16-bit mask
 * body512bo writes, so the trace-back (bp_k, lb = 1) is the same. The NK
 * result vectors of a half (lane gv, vector j) are turned into natural edge
 * order e = gv*NK + j by an NK x 8 transpose (tr256). */
TGT2 INLINE void tr256(const int K, __m256 *r)
{
	if (K == 1) {
		__m256 lo = _mm256_unpacklo_ps(r[0], r[1]), hi = _mm256_unpackhi_ps(r[0], r[1]);
		r[0] = _mm256_permute2f128_ps(lo, hi, 0x20);
		r[1] = _mm256_permute2f128_ps(lo, hi, 0x31);
		return;
	}
	/* K = 2: rows 0-3; K = 3: rows 0-3 and 4-7 (u[4..7]) */
	__m256 u[8];
	for (int q = 0; q < (K == 3 ? 2 : 1); q++) {
		const __m256 *s = r + 4 * q;
		__m256 t0 = _mm256_unpacklo_ps(s[0], s[1]), t1 = _mm256_unpackhi_ps(s[0], s[1]);
		__m256 t2 = _mm256_unpacklo_ps(s[2], s[3]), t3 = _mm256_unpackhi_ps(s[2], s[3]);
		/* u[4q + i]: rows 4q .. 4q+3 of gv i (low 128 bits), gv i + 4 (high) */
		u[4 * q + 0] = _mm256_shuffle_ps(t0, t2, 0x44);
		u[4 * q + 1] = _mm256_shuffle_ps(t0, t2, 0xEE);
		u[4 * q + 2] = _mm256_shuffle_ps(t1, t3, 0x44);
		u[4 * q + 3] = _mm256_shuffle_ps(t1, t3, 0xEE);
	}
	if (K == 2) {
		r[0] = _mm256_permute2f128_ps(u[0], u[1], 0x20);   /* gv 0, 1 */
		r[1] = _mm256_permute2f128_ps(u[2], u[3], 0x20);   /* gv 2, 3 */
		r[2] = _mm256_permute2f128_ps(u[0], u[1], 0x31);   /* gv 4, 5 */
		r[3] = _mm256_permute2f128_ps(u[2], u[3], 0x31);   /* gv 6, 7 */
	} else {
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++) {
			r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);       /* gv i */
			r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);   /* gv i + 4 */
		}
	}
}

TGT2 INLINE void body256bo(const int K, const int wbp, const int T, const float *cbo,
                           float wa, float wb, const float *pa, const float *pbb,
                           size_t ks, int poff, float *oa, float *ob, uint16_t *ba,
                           uint16_t *bb, int g0, int g1)
{
	const int NK = 1 << K;
	const int b0 = g0 * 4 / NK, b1 = g1 * 4 / NK;   /* 64-edge groups -> g-blocks */
	const __m256 vw[2] = { _mm256_set1_ps(wa), _mm256_set1_ps(wb) };
	const float *pt[2] = { pa, pbb };
	float *ot[2] = { oa, ob };
	uint8_t *bt[2] = { (uint8_t *)ba, (uint8_t *)bb };
	if (wbp)
		for (int t = 0; t < T; t++)
			bt[t] += (size_t)b0 * (NK - 1) * NK * 2;
	for (int b = b0; b < b1; b++) {
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			const float *c = cbo + (size_t)b * NK * NK * 16 + 8 * h;
			__m256 m[2][8], P[2];
#pragma GCC unroll 2
			for (int t = 0; t < T; t++)
				P[t] = _mm256_loadu_ps(pt[t] + 16 * b + 8 * h - poff);
#pragma GCC unroll 8
			for (int j = 0; j < NK; j++) {
				__m256 x = _mm256_load_ps(c + 16 * j);
#pragma GCC unroll 2
				for (int t = 0; t < T; t++) {
					__m256 d = _mm256_sub_ps(x, vw[t]);
					m[t][j] = _mm256_fmadd_ps(d, d, P[t]);
				}
			}
			c += 16 * NK;
#pragma GCC unroll 8
			for (int k = 1; k < NK; k++, c += 16 * NK) {
#pragma GCC unroll 2
				for (int t = 0; t < T; t++)
					P[t] = _mm256_loadu_ps(pt[t] + 16 * b + 8 * h - poff + k * ks);
#pragma GCC unroll 8
				for (int j = 0; j < NK; j++) {
					__m256 x = _mm256_load_ps(c + 16 * j);
#pragma GCC unroll 2
					for (int t = 0; t < T; t++) {
						__m256 d = _mm256_sub_ps(x, vw[t]);
						__m256 v = _mm256_fmadd_ps(d, d, P[t]);
						if (wbp)
							bt[t][(((size_t)(b - b0) * (NK - 1) + k - 1) * NK + j) * 2 + h] =
								(uint8_t)_mm256_movemask_ps(_mm256_cmp_ps(v, m[t][j],
								                                          _CMP_LT_OQ));
						m[t][j] = _mm256_min_ps(v, m[t][j]);
					}
				}
			}
#pragma GCC unroll 2
			for (int t = 0; t < T; t++) {
				tr256(K, m[t]);
				float *o = ot[t] + (size_t)16 * NK * (b - b0) + 8 * NK * h;
#pragma GCC unroll 8
				for (int j = 0; j < NK; j++)
					_mm256_store_ps(o + 8 * j, m[t][j]);
			}
		}
	}
}

/* fused pair of steps (two_steps) with the layout-B kernels inlined, for
 * one tile or two in lock step (T = 2: tile b's buffers at the b
 * arguments) */
TGT2 INLINE void fused256(const int K, const int wbp, const int T, const float *cbo,
                          float wa0, float wa1, float wb0, float wb1, const float *preva,
                          const float *prevb, float *nexta, float *nextb, float *mida,
                          float *midb, uint16_t *ba0, uint16_t *ba1, uint16_t *bb0,
                          uint16_t *bb1)
{
	const int E = 1 << (16 - K), NK = 1 << K, G = 1 << (16 - 2 * K);
	const int L = FUSE_B(K) / NK;
	for (int e0 = 0; e0 < E; e0 += FUSE_B(K)) {
		for (int kk = 0; kk < NK; kk++) {
			int x0 = kk * G + e0 / NK;
			body256bo(K, wbp, T, cbo, wa0, wb0, preva, prevb, G, 0, mida + kk * L,
			          midb + kk * L, ba0, bb0, x0 / 64, (x0 + L) / 64);
		}
		body256bo(K, wbp, T, cbo, wa1, wb1, mida, midb, L, e0 / NK, nexta + e0, nextb + e0,
		          ba1, bb1, e0 / 64, (e0 + FUSE_B(K)) / 64);
	}
}

#define FUSED256(K, wbp) fused256(K, wbp, 1, cbo, w0, w1, w0, w1, prev, prev, next, next, \
                                  mid, mid, bp0, bp1, bp0, bp1)

/* masks mode on AVX2 is K = 1 only (pick_stride; a stride of 0 at K = 2, 3
 * runs two_steps on step_avx2) */
TGT2 static void fused_avx2(int K, const float *cbo, float w0, float w1, const float *prev,
                            float *next, float *mid, uint16_t *bp0, uint16_t *bp1)
{
	(void)K;
	if (bp0)
		FUSED256(1, 1);
	else
		FUSED256(1, 0);
}

#define FUSED256P(K, wbp) fused256(K, wbp, 2, cbo, wa0, wa1, wb0, wb1, preva, prevb, nexta, \
                                   nextb, mida, midb, ba0, ba1, bb0, bb1)

TGT2 static void fused2_avx2(int K, const float *cbo, float wa0, float wa1, float wb0,
                             float wb1, const float *preva, const float *prevb, float *nexta,
                             float *nextb, float *mida, float *midb, uint16_t *ba0,
                             uint16_t *ba1, uint16_t *bb0, uint16_t *bb1)
{
	(void)K;   /* K = 1, as fused_avx2 */
	if (ba0)
		FUSED256P(1, 1);
	else
		FUSED256P(1, 0);
}

#define BODY256(K, wbp) do { \
		if ((K) <= LAYOUT_B2_MAX_K) \
			body256bo(K, wbp, 1, cbo, w, w, pb, pb, ks, poff, out, out, bp, bp, g0, g1); \
		else \
			body256(K, wbp, cbo, w, pb, ks, poff, out, bp, g0, g1); \
	} while (0)

TGT2 static void step_avx2(int K, const float *cbo, float w, const float *pb,
                           size_t ks, int poff, float *out, uint16_t *bp,
                           int g0, int g1)
{
	if (bp)
		SWITCH_K(BODY256, 1)
	else
		SWITCH_K(BODY256, 0)
}

/* Two tiles in lock step, recompute mode (K >= 4: whole steps, no
 * masks): one codebook load serves both tiles' candidates, as in
 * step2_avx512. A group's 64 lanes are done as two halves of 32 so that
 * both tiles' running minima (8 vectors) stay in registers (AVX2 has 16),
 * and each predecessor cost is broadcast once per half and k (one per 16
 * lanes at K = 4, one per half above) instead of once per vector. Same
 * arithmetic, same order: the same bits. Measured on Zen 3 (2-core EPYC,
 * tests/bench/viterbi -i avx2, one thread): K = 4 128k -> 155k weights/s,
 * K = 5 146k -> 172k, K = 6 156k -> 172k (3.05 -> 2.52 cycles per 16
 * candidates at K = 4); the pairs alone, broadcasting per vector, gave
 * 134k at K = 4. Kept as floats: the running minima as int32 (integer
 * min, which Zen runs on more pipes; the costs are non-negative, so the
 * order is the same) measured 7% slower. */
TGT2 INLINE void body256t2(const int K, const float *cbo, float wa, float wb, const float *pa,
                           const float *pb, float *oa, float *ob)
{
	const int NK = 1 << K;
	const size_t ks = (size_t)1 << (16 - 2 * K);
	const __m256 vwa = _mm256_set1_ps(wa), vwb = _mm256_set1_ps(wb);
	for (int g = 0; g < 1 << (10 - K); g++)
#pragma GCC unroll 2
		for (int hh = 0; hh < 2; hh++) {
			/* lanes 32 hh .. 32 hh + 31; their predecessor costs: one per
			 * 16 lanes at K = 4, one for all 32 at K >= 5 */
			const float *c = cbo + (size_t)g * NK * 64 + 32 * hh;
			const int p0 = ((64 * g) >> K) + ((32 * hh) >> K), p1 = p0 + (K == 4);
			__m256 ma[4], mb[4];
			for (int k = 0; k < NK; k++, c += 64) {
				const size_t o = k * ks;
				const __m256 a0 = _mm256_broadcast_ss(pa + o + p0);
				const __m256 a1 = _mm256_broadcast_ss(pa + o + p1);
				const __m256 b0 = _mm256_broadcast_ss(pb + o + p0);
				const __m256 b1 = _mm256_broadcast_ss(pb + o + p1);
#pragma GCC unroll 4
				for (int h = 0; h < 4; h++) {
					__m256 x = _mm256_load_ps(c + 8 * h);
					__m256 da = _mm256_sub_ps(x, vwa), db = _mm256_sub_ps(x, vwb);
					__m256 va = _mm256_fmadd_ps(da, da, h < 2 ? a0 : a1);
					__m256 vb = _mm256_fmadd_ps(db, db, h < 2 ? b0 : b1);
					ma[h] = k ? _mm256_min_ps(va, ma[h]) : va;
					mb[h] = k ? _mm256_min_ps(vb, mb[h]) : vb;
				}
			}
#pragma GCC unroll 4
			for (int h = 0; h < 4; h++) {
				_mm256_store_ps(oa + (size_t)64 * g + 32 * hh + 8 * h, ma[h]);
				_mm256_store_ps(ob + (size_t)64 * g + 32 * hh + 8 * h, mb[h]);
			}
		}
}

TGT2 static void step2_avx2(int K, const float *cbo, float wa, float wb, const float *pa,
                            const float *pb, float *oa, float *ob)
{
#define BODY256T2(K, wbp) do { \
		if ((K) <= LAYOUT_B2_MAX_K) \
			body256bo(K, 0, 2, cbo, wa, wb, pa, pb, (size_t)1 << (16 - 2 * (K)), 0, oa, ob, \
			          NULL, NULL, 0, 1 << (10 - (K))); \
		else \
			body256t2(K, cbo, wa, wb, pa, pb, oa, ob); \
	} while (0)
	SWITCH_K(BODY256T2, 0)
}
#endif

static int isa_forced = X3_ISA_AUTO;

static int isa_supported(int isa)
{
	switch (isa) {
	case X3_ISA_SCALAR:
		return 1;
#ifdef X3_X86
	case X3_ISA_AVX2:
		__builtin_cpu_init();
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	case X3_ISA_AVX512:
		__builtin_cpu_init();
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl");
#endif
	default:
		return 0;
	}
}

int x3_viterbi_isa(void)
{
	if (isa_forced != X3_ISA_AUTO)
		return isa_forced;
	if (isa_supported(X3_ISA_AVX512))
		return X3_ISA_AVX512;
	if (isa_supported(X3_ISA_AVX2))
		return X3_ISA_AVX2;
	return X3_ISA_SCALAR;
}

int x3_viterbi_set_isa(int isa)
{
	if (isa == X3_ISA_AUTO || (isa > X3_ISA_AUTO && isa <= X3_ISA_AVX512 &&
	                           isa_supported(isa))) {
		isa_forced = isa;
		return X3_OK;
	}
	return x3_err(X3_EUNSUP, "viterbi: instruction set %s not supported here",
	              x3_viterbi_isa_name(isa));
}

const char *x3_viterbi_isa_name(int isa)
{
	switch (isa) {
	case X3_ISA_AUTO: return "auto";
	case X3_ISA_SCALAR: return "scalar";
	case X3_ISA_AVX2: return "avx2";
	case X3_ISA_AVX512: return "avx512";
	default: return "?";
	}
}

static step_fn pick_step(void)
{
	switch (x3_viterbi_isa()) {
#ifdef X3_X86
	case X3_ISA_AVX512: return step_avx512;
	case X3_ISA_AVX2: return step_avx2;
#endif
	default: return step_scalar;
	}
}

/* k of the winner at edge e from the masks of one position (layout A or
 * B): the largest k whose mask bit is set, or 0 */
static inline int bp_k(int K, int lb, const uint16_t *bpp, int e)
{
	const int NK = 1 << K;
	const uint16_t *q;
	int lane, stride;
	if (lb) {
		int gv = e >> K, j = e & (NK - 1);
		q = bpp + (size_t)(gv >> 4) * (NK - 1) * NK + j;
		lane = gv & 15;
		stride = NK;
	} else {
		int blk = e >> 4, g = blk >> 2, u = blk & 3;
		q = bpp + (size_t)g * (NK - 1) * 4 + u;
		lane = e & 15;
		stride = 4;
	}
	for (int k = NK - 1; k >= 1; k--)
		if (q[(k - 1) * stride] >> lane & 1)
			return k;
	return 0;
}

/* Per-thread workspace, kept between calls (OpenMP reuses its threads):
 * allocating and freeing the 1-2.5 MB on every call lets glibc hand the
 * memory back to the kernel and fault it in again, which costs more than
 * encoding a few tiles (LDLQ encodes one 16-row block of tiles per call).
 * One block per thread that ever encoded; never freed. */
static _Thread_local char *ws_mem;
static _Thread_local size_t ws_cap;

static void *ws_get(size_t n)
{
	if (n > ws_cap) {
		free(ws_mem);
		ws_mem = aligned_alloc(64, (n + 63) & ~(size_t)63);
		ws_cap = ws_mem ? n : 0;
	}
	return ws_mem;
}

/* Masks (K <= 2, AVX2 and portable paths; AVX-512 sends them out line by
 * line itself) are written by the kernels into an L1 staging area (two
 * positions, 4-7 KB each) and copied out with non-temporal stores: the
 * 256 positions' masks (1-1.8 MB per tile) then neither pass through L2,
 * where they evicted the codebook and the cost buffers, nor cost a
 * read-for-ownership; the trace-back reads one line per position back.
 * n and both addresses are multiples of 64. */
enum {
	STAGE_MAX_K = 2,      /* run_pass stages the masks for K <= this (K = 3: 5% slower) */
	PAIR_MASKS_MAX_K = 2, /* AVX-512 masks mode: two tiles in lock step for K <= this (faster) */
	PAIR_HIST2 = 1,       /* AVX2 recompute mode: two tiles in lock step at every K */
};

static void stream_copy(void *dst, const void *src, size_t n)
{
#ifdef X3_X86
	for (size_t i = 0; i < n; i += 16)
		_mm_stream_si128((__m128i *)((char *)dst + i),
		                 _mm_load_si128((const __m128i *)((const char *)src + i)));
#else
	memcpy(dst, src, n);
#endif
}

static void stream_fence(void)
{
#ifdef X3_X86
	_mm_sfence();
#endif
}

struct work {
	float *ca, *cb;    /* E + PAD floats each, 64-byte aligned */
	float *mid;        /* FUSE_MAX + PAD floats: fused intermediate costs */
	uint16_t *bp;      /* masks: 256 positions x E/16 x (2^K - 1) */
	uint16_t *stage;   /* masks of the two positions in the works */
	float *hist;       /* recompute mode: the kept positions, hs floats each */
	size_t hs;         /* floats per position in hist (E + PAD, 64-byte multiple) */
	int S;             /* recompute mode: costs kept every S-th position; 0: masks */
	int stg;           /* run_pass stages the masks (K <= STAGE_MAX_K, kernels that do not
	                    * send them out themselves) */
};

/* Back-pointers by recomputation (recompute mode, stride S > 0: from K =
 * HIST_K on, and on AVX2 from K = 2, see pick_stride). The steps keep only
 * the running minimum (sub, fma, min per 16 candidates: no compare, no
 * mask store), and the costs entering every S-th position the trace-back
 * visits are kept (hist). The trace-back then recomputes, at each position
 * on the path only, the 2^K candidates of its one edge with the same fmaf
 * from the same costs (kept, or recomputed from the kept position below,
 * tbr_body) and takes the strict-< argmin (the first k that attains the
 * minimum): exactly the back-pointer the step would have stored. Memory
 * per kept position is E floats instead of E (2^K - 1) bits: 16 KB at
 * K = 4, 32 and 64 KB at K = 3 and 2, hence the strides there (4 and 5.4
 * MB of costs per tile). */
enum { HIST_K = 4 };   /* AVX-512 and portable path: recompute mode from K = HIST_K on */

/* k of the winner at (p, e): cbt = the codebook by edge, cbt[e * NK + k]
 * = cb[(k << (16-K)) | e] (contiguous per edge); h = costs entering
 * position p. The candidates' costs come from h[(k << (16-2K)) | (e >> K)]. */
typedef int (*tb_fn)(int K, const float *cbt, const float *h, float w, int e);

INLINE int tb_body(int K, const float *cbt, const float *h, float w, int e)
{
	const int NK = 1 << K;
	const size_t G = (size_t)1 << (16 - 2 * K);
	const float *c = cbt + (size_t)e * NK, *hp = h + (e >> K);
	float best = 0.0f;
	int bk = 0;
	for (int k = 0; k < NK; k++) {
		float d = c[k] - w;
		float v = fmaf(d, d, hp[k * G]);
		if (k == 0 || v < best) {
			best = v;
			bk = k;
		}
	}
	return bk;
}

static int tb_scalar(int K, const float *cbt, const float *h, float w, int e)
{
	return tb_body(K, cbt, h, w, e);
}

/* The same where the costs entering p were not kept (p % S != 0): they
 * are recomputed from the kept position below, p - r with r = p % S, but
 * only where the argmin needs them: the NK costs entering p that the edge
 * e's candidates read, the NK^2 entering p - 1 that those read, ..., NK^(r+1)
 * at p - r, read from hist. Each recomputed cost is the minimum of the
 * same fmaf values the step computed (a minimum is the same value in any
 * order: costs are never NaN or -0), so the back-pointer is the one the
 * kept costs would give. NK^S <= RMAX: S is chosen so (pick_stride). */
#define RMAX 256
INLINE int tbr_body(int K, int S, const float *cbt, const float *hist, size_t hs,
                    const float *x, int p, int e)
{
	const int NK = 1 << K, r = p % S;
	uint16_t ed[2 * RMAX];   /* the edges of all levels, level d at off[d] */
	float val[2 * RMAX];
	int off[9];
	off[0] = 0;
	for (int k = 0; k < NK; k++)
		ed[k] = (uint16_t)(k << (16 - 2 * K) | e >> K);
	int n = NK;   /* edges at level d: NK^(d+1) */
	for (int d = 0; d < r; d++, n *= NK) {
		off[d + 1] = off[d] + n;
		for (int i = 0; i < n; i++)
			for (int k = 0; k < NK; k++)
				ed[off[d + 1] + i * NK + k] =
					(uint16_t)(k << (16 - 2 * K) | ed[off[d] + i] >> K);
	}
	/* level r: kept costs entering p - r */
	const float *h = hist + (size_t)(p - r) / S * hs;
	for (int i = 0; i < n; i++)
		val[off[r] + i] = h[ed[off[r] + i]];
	/* up: the costs entering p - d from those entering p - d - 1 */
	for (int d = r - 1; d >= 0; d--) {
		n /= NK;
		const float w = x[p - d - 1];
		for (int i = 0; i < n; i++) {
			const float *c = cbt + (size_t)ed[off[d] + i] * NK;
			float best = 0.0f;
			for (int k = 0; k < NK; k++) {
				float dd = c[k] - w;
				float v = fmaf(dd, dd, val[off[d + 1] + i * NK + k]);
				if (k == 0 || v < best)
					best = v;
			}
			val[off[d] + i] = best;
		}
	}
	/* the argmin at p, as tb_body */
	const float *c = cbt + (size_t)e * NK;
	float best = 0.0f;
	int bk = 0;
	for (int k = 0; k < NK; k++) {
		float dd = c[k] - x[p];
		float v = fmaf(dd, dd, val[k]);
		if (k == 0 || v < best) {
			best = v;
			bk = k;
		}
	}
	return bk;
}

/* S > 1 only on AVX2 (pick_stride), so fmaf is an instruction there */
#ifdef X3_X86
TGT2
#endif
static int tbr(int K, int S, const float *cbt, const float *hist, size_t hs, const float *x,
               int p, int e)
{
	return tbr_body(K, S, cbt, hist, hs, x, p, e);
}

#ifdef X3_X86
/* the same, inlined where fmaf is an instruction instead of a libm call */
TGT2 static int tb_fma(int K, const float *cbt, const float *h, float w, int e)
{
	return tb_body(K, cbt, h, w, e);
}

/* 16 candidates at a time (a gather of the costs unless G = 1); the
 * minimum over all by a tree, then the first k attaining it (costs are
 * never NaN, so this is the strict-< argmin) */
TGT512 INLINE int tb512(const int K, const float *cbt, const float *h, float w, int e)
{
	const int NK = 1 << K, NV = NK / 16;
	const int G = 1 << (16 - 2 * K);
	const float *c = cbt + (size_t)e * NK, *hp = h + (e >> K);
	const __m512i ih = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8,
	                                      7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(G));
	const __m512 vw = _mm512_set1_ps(w);
	__m512 v[16], t[16];
#pragma GCC unroll 16
	for (int j = 0; j < NV; j++) {
		__m512 d = _mm512_sub_ps(_mm512_load_ps(c + 16 * j), vw);
		__m512 hv = G == 1 ? _mm512_loadu_ps(hp + 16 * j)
		                   : _mm512_i32gather_ps(ih, hp + (size_t)16 * j * G, 4);
		t[j] = v[j] = _mm512_fmadd_ps(d, d, hv);
	}
#pragma GCC unroll 4
	for (int n = NV; n > 1; n /= 2)
#pragma GCC unroll 8
		for (int j = 0; j < n / 2; j++)
			t[j] = _mm512_min_ps(t[2 * j], t[2 * j + 1]);
	const __m512 mn = _mm512_set1_ps(_mm512_reduce_min_ps(t[0]));
	for (int j = 0; j < NV; j++) {
		unsigned q = _mm512_cmp_ps_mask(v[j], mn, _CMP_EQ_OQ);
		if (q)
			return 16 * j + __builtin_ctz(q);
	}
	return 0;   /* not reached: the minimum is one of the candidates */
}

TGT512 static int tb_avx512(int K, const float *cbt, const float *h, float w, int e)
{
	switch (K) {
	case 4: return tb512(4, cbt, h, w, e);
	case 5: return tb512(5, cbt, h, w, e);
	case 6: return tb512(6, cbt, h, w, e);
	case 7: return tb512(7, cbt, h, w, e);
	default: return tb512(8, cbt, h, w, e);
	}
}
#endif

static tb_fn pick_tb(void)
{
	switch (x3_viterbi_isa()) {
#ifdef X3_X86
	case X3_ISA_AVX512: return tb_avx512;
	case X3_ISA_AVX2: return tb_fma;
#endif
	default: return tb_scalar;
	}
}

/* Recompute mode's stride S per instruction set and K: the costs entering
 * every S-th position are kept; 0: masks instead. AVX2 on Zen 3 (2-core
 * EPYC, tests/bench/viterbi -i avx2, one thread, best of alternated runs):
 * K = 2 masks 56k (layout A) -> S = 3 114k weights/s (S = 2 ~3% and S = 4
 * ~9% slower, S = 1 slower still on two threads: 16 MB of costs per tile);
 * K = 3 masks 85k -> S = 2 110k (S = 1 ~5% slower); K = 1: S = 8 no faster
 * than the layout-B masks (97k); K = 4: S = 2 no faster than 1. AVX-512
 * and the portable path: S = 1 from K = HIST_K (not measured otherwise). */
static const unsigned char stride2[9] = { 0, 0, 3, 2, 1, 1, 1, 1, 1 };   /* AVX2's S by K */
static int pick_stride(int isa, int K)
{
	int S = isa == X3_ISA_AVX2 ? stride2[K] : K >= HIST_K;
	/* tbr_body's bound: NK^S <= RMAX */
	while (S > 1 && K * S > 8)
		S--;
	return S;
}

/* Fused pair of steps for K <= 3, where the cost buffers (128/64/32 KB) do
 * not fit in L1 next to the codebook stream. Output edges e of the second
 * step in a block [e0, e0 + B) need exactly the intermediate edges
 * (k << (16-2K)) | (e >> K), i.e. NK ranges of B/NK edges that no
 * other block needs; they are computed into the scratch mid and consumed
 * at once, so intermediate costs never leave L1. The arithmetic is the
 * same as two plain steps. */

static void two_steps(step_fn step, int K, const float *cbo, float w0, float w1,
                      const float *prev, float *next, float *mid, uint16_t *bp0,
                      uint16_t *bp1)
{
	const int E = 1 << (16 - K), NK = 1 << K, G = 1 << (16 - 2 * K);
	const int L = FUSE_B(K) / NK;   /* a multiple of 64 for K <= 3 */
	for (int e0 = 0; e0 < E; e0 += FUSE_B(K)) {
		for (int kk = 0; kk < NK; kk++) {
			int x0 = kk * G + e0 / NK;
			step(K, cbo, w0, prev, G, 0, mid + kk * L, bp0, x0 / 64, (x0 + L) / 64);
		}
		step(K, cbo, w1, mid, L, e0 / NK, next + e0, bp1, e0 / 64, (e0 + FUSE_B(K)) / 64);
	}
}

/* One forward pass: 256 steps at positions (i + roll) & 255, roll = 128
 * for pass 1 (whose trace-back visits positions 127..0 only) and 0 for
 * pass 2. Start costs are in wk->ca (pass 1) or, in recompute mode, the
 * hist slot of position 0 (pass 2). Back-pointers (masks) or the costs
 * entering a position (hist, every S-th position) are kept only for
 * positions the trace-back visits: the first half of pass 1 runs without
 * either. Returns the
 * buffer holding the final costs (pass 1; pass 2 in recompute mode stops
 * before its last step, whose costs nothing reads). */
static float *run_pass(step_fn step, fused_fn fused, fusedip_fn ip, int K, const float *cbo,
                       const float *x, int pass1, float *start, struct work *wk)
{
	const int E = 1 << (16 - K), NK = 1 << K, G = 1 << (16 - 2 * K);
	const size_t ps = (size_t)(E / 16) * (NK - 1);   /* masks per position */
	const int roll = pass1 ? 128 : 0;
	float *prev = start;
	for (int i = 0; i < 256;) {
		int p = (i + roll) & 255, q = (p + 1) & 255;
		float *next = prev == wk->ca ? wk->cb : wk->ca;
		if (!wk->S) {   /* masks */
			/* the AVX-512 kernels at K <= 2 send their masks out themselves */
			int keep = !pass1 || p < 128, stg = keep && wk->stg;
			uint16_t *b0 = stg ? wk->stage : keep ? wk->bp + p * ps : NULL;
			uint16_t *b1 = stg ? wk->stage + ps : keep ? wk->bp + q * ps : NULL;
			if (ip) {   /* in place: the costs stay in prev (wk->ca) */
				ip(K, cbo, x[p], x[q], 0.0f, 0.0f, prev, NULL, wk->mid, NULL, b0, b1, NULL,
				   NULL, i / 2);
				next = prev;
			} else if (fused)
				fused(K, cbo, x[p], x[q], prev, next, wk->mid, b0, b1);
			else
				two_steps(step, K, cbo, x[p], x[q], prev, next, wk->mid, b0, b1);
			if (stg) {
				stream_copy(wk->bp + p * ps, wk->stage, ps * sizeof(uint16_t));
				stream_copy(wk->bp + q * ps, wk->stage + ps, ps * sizeof(uint16_t));
			}
			i += 2;
		} else {
			/* pass 2's last step: its costs are never read (the trace-back
			 * recomputes position 255 from the costs entering it) */
			if (!pass1 && i == 255)
				break;
			/* the output enters position q; keep it if the trace-back
			 * visits q */
			if (i < 255 && (!pass1 || q < 128) && q % wk->S == 0)
				next = wk->hist + q / wk->S * wk->hs;
			step(K, cbo, x[p], prev, G, 0, next, NULL, 0, E / 64);
			i++;
		}
		prev = next;
	}
	stream_fence();
	return prev;
}

/* back-pointer k at (p, e): recomputed (hist) or from the masks */
static inline int k_at(tb_fn tb, int K, int lb, const float *cbt, const float *x,
                       const struct work *wk, int p, int e)
{
	if (wk->S)
		return p % wk->S ? tbr(K, wk->S, cbt, wk->hist, wk->hs, x, p, e)
		                 : tb(K, cbt, wk->hist + p / wk->S * wk->hs, x[p], e);
	const size_t ps = (size_t)(1 << (12 - K)) * ((1 << K) - 1);
	return bp_k(K, lb, wk->bp + p * ps, e);
}

/* pass-1 anchor: argmin of the final costs (lowest e on ties), traced
 * back to position 0 */
static int argmin_edge(const float *fin, int E)
{
	int e = 0;
	for (int i = 1; i < E; i++)
		if (fin[i] < fin[e])
			e = i;
	return e;
}

static int anchor(tb_fn tb, int K, int lb, const float *cbt, const float *x,
                  const struct work *wk, const float *fin)
{
	int e = argmin_edge(fin, 1 << (16 - K));
	for (int p = 127; p >= 0; p--)
		e = (int)(((uint32_t)k_at(tb, K, lb, cbt, x, wk, p, e) << (16 - K) | (uint32_t)e) >> K);
	return e;
}

/* pass-2 trace-back from out-edge pre at position 255 */
static void trace(tb_fn tb, int K, int lb, const float *cbt, const float *x,
                  const struct work *wk, int pre, uint16_t *st)
{
	int e = pre;
	for (int p = 255; p >= 0; p--) {
		uint32_t s = (uint32_t)k_at(tb, K, lb, cbt, x, wk, p, e) << (16 - K) | (uint32_t)e;
		st[p] = (uint16_t)s;
		e = (int)(s >> K);
	}
}

/* start costs: 0 everywhere (pre < 0) or 0 at e == pre and +inf elsewhere */
static void start_costs(float *c, int E, int pre)
{
	for (int i = 0; i < E; i++)
		c[i] = pre < 0 || i == pre ? 0.0f : INFINITY;
}

/* pass 2 starts in the hist slot of position 0 (recompute mode) */
static float *start2(int K, struct work *wk)
{
	return wk->S ? wk->hist : wk->ca;
}

static void fast_tile(step_fn step, fused_fn fused, fusedip_fn ip, tb_fn tb, int K, int lb,
                      const float *cbo, const float *cbt, const float *x, struct work *wk,
                      uint16_t *st)
{
	const int E = 1 << (16 - K);
	start_costs(wk->ca, E, -1);
	const float *fin = run_pass(step, fused, ip, K, cbo, x, 1, wk->ca, wk);
	const int pre = anchor(tb, K, lb, cbt, x, wk, fin);
	start_costs(start2(K, wk), E, pre);
	run_pass(step, fused, ip, K, cbo, x, 0, start2(K, wk), wk);
	trace(tb, K, lb, cbt, x, wk, pre, st);
}

/* run_pass for two tiles in lock step (fused pairs of steps with masks at
 * K <= 3, whole steps in recompute mode); the final costs of each tile go
 * to *fa, *fb */
static void run_pass2(step2_fn s2, fused2_fn f2, fusedip_fn ip, int K, const float *cbo, const float *xa,
                      const float *xb, int pass1, float *sa, float *sb, struct work *wa,
                      struct work *wb, float **fa, float **fb)
{
	const int roll = pass1 ? 128 : 0;
	const size_t ps = (size_t)(1 << (12 - K)) * ((1 << K) - 1);
	float *pa = sa, *pb = sb;
	for (int i = 0; i < 256;) {
		int p = (i + roll) & 255, q = (p + 1) & 255;
		float *na = pa == wa->ca ? wa->cb : wa->ca, *nb = pb == wb->ca ? wb->cb : wb->ca;
		if (!wa->S) {   /* masks */
			/* the pair kernels send their masks out themselves (no staging) */
			int keep = !pass1 || p < 128;
			uint16_t *ba = wa->bp + p * ps, *bb = wb->bp + p * ps;
			uint16_t *ba1 = wa->bp + q * ps, *bb1 = wb->bp + q * ps;
			if (ip) {   /* in place */
				ip(K, cbo, xa[p], xa[q], xb[p], xb[q], pa, pb, wa->mid, wb->mid,
				   keep ? ba : NULL, keep ? ba1 : NULL, keep ? bb : NULL, keep ? bb1 : NULL,
				   i / 2);
				na = pa;
				nb = pb;
			} else
				f2(K, cbo, xa[p], xa[q], xb[p], xb[q], pa, pb, na, nb, wa->mid, wb->mid,
				   keep ? ba : NULL, keep ? ba1 : NULL, keep ? bb : NULL, keep ? bb1 : NULL);
			i += 2;
		} else {
			if (!pass1 && i == 255)
				break;   /* as in run_pass */
			if (i < 255 && (!pass1 || q < 128) && q % wa->S == 0) {
				na = wa->hist + q / wa->S * wa->hs;
				nb = wb->hist + q / wb->S * wb->hs;
			}
			s2(K, cbo, xa[p], xb[p], pa, pb, na, nb);
			i++;
		}
		pa = na;
		pb = nb;
	}
	stream_fence();
	*fa = pa;
	*fb = pb;
}

/* fast_tile for a pair of tiles in lock step */
static void fast_pair(step2_fn s2, fused2_fn f2, fusedip_fn ip, tb_fn tb, int K, int lb, const float *cbo,
                      const float *cbt, const float *xa, const float *xb, struct work *wa,
                      struct work *wb, uint16_t *sta, uint16_t *stb)
{
	const int E = 1 << (16 - K);
	float *fa, *fb;
	start_costs(wa->ca, E, -1);
	start_costs(wb->ca, E, -1);
	run_pass2(s2, f2, ip, K, cbo, xa, xb, 1, wa->ca, wb->ca, wa, wb, &fa, &fb);
	int pa = argmin_edge(fa, E), pb = argmin_edge(fb, E);
	/* the two trace-backs are independent latency chains: interleaved,
	 * they overlap */
	for (int p = 127; p >= 0; p--) {
		pa = (int)(((uint32_t)k_at(tb, K, lb, cbt, xa, wa, p, pa) << (16 - K) | (uint32_t)pa) >> K);
		pb = (int)(((uint32_t)k_at(tb, K, lb, cbt, xb, wb, p, pb) << (16 - K) | (uint32_t)pb) >> K);
	}
	start_costs(start2(K, wa), E, pa);
	start_costs(start2(K, wb), E, pb);
	run_pass2(s2, f2, ip, K, cbo, xa, xb, 0, start2(K, wa), start2(K, wb), wa, wb, &fa, &fb);
	int ea = pa, eb = pb;
	for (int p = 255; p >= 0; p--) {
		uint32_t s = (uint32_t)k_at(tb, K, lb, cbt, xa, wa, p, ea) << (16 - K) | (uint32_t)ea;
		uint32_t t = (uint32_t)k_at(tb, K, lb, cbt, xb, wb, p, eb) << (16 - K) | (uint32_t)eb;
		sta[p] = (uint16_t)s;
		stb[p] = (uint16_t)t;
		ea = (int)(s >> K);
		eb = (int)(t >> K);
	}
}

/* codec.h x3_viterbi_set_backend (added by the cuda branch) */
static x3_viterbi_backend_fn backend;

void x3_viterbi_set_backend(x3_viterbi_backend_fn fn)
{
	backend = fn;
}

/* The codebook re-laid-out for the steps (cbo: layout A, or B where lb)
 * and, in recompute mode, by edge for the trace-back (cbt). Built on first
 * use per (K, codebook, layout), 256 KB each, kept for the process's life
 * like the codebook tables: rebuilding them cost more than encoding the
 * few tiles of one LDLQ block. */
static struct { float *cbo, *cbt; } tables[8][X3_CB_COUNT][2];
static pthread_mutex_t tables_lock = PTHREAD_MUTEX_INITIALIZER;

static int get_tables(int K, int cb, int lb, int hist, const float **cbo, const float **cbt)
{
	const float *tab = x3_codebook_table(cb);
	const int E = 1 << (16 - K), NK = 1 << K;
	int rc = 0;
	pthread_mutex_lock(&tables_lock);
	float **po = &tables[K - 1][cb][lb].cbo, **pt = &tables[K - 1][cb][lb].cbt;
	if (!*po) {
		float *o = aligned_alloc(64, sizeof(float) * 65536);
		if (o && lb) {
			for (int b = 0; b < E / (16 * NK); b++)
				for (int k = 0; k < NK; k++)
					for (int j = 0; j < NK; j++)
						for (int l = 0; l < 16; l++)
							o[(((size_t)b * NK + k) * NK + j) * 16 + l] =
								tab[(uint32_t)k << (16 - K) | (uint32_t)(16 * b + l) << K |
								    (uint32_t)j];
		} else if (o) {
			for (int g = 0; g < E / 64; g++)
				for (int k = 0; k < NK; k++)
					for (int j = 0; j < 64; j++)
						o[((size_t)g * NK + k) * 64 + j] =
							tab[(uint32_t)k << (16 - K) | (uint32_t)(64 * g + j)];
		}
		*po = o;
	}
	if (*po && hist && !*pt) {
		float *t = aligned_alloc(64, sizeof(float) * 65536);
		if (t)
			for (int k = 0; k < NK; k++)
				for (int e = 0; e < E; e++)
					t[(size_t)e * NK + k] = tab[(uint32_t)k << (16 - K) | (uint32_t)e];
		*pt = t;
	}
	if (!*po || (hist && !*pt))
		rc = X3_ENOMEM;
	*cbo = *po;
	*cbt = *pt;
	pthread_mutex_unlock(&tables_lock);
	return rc;
}

int x3_viterbi_encode(int K, int cb, const float *x, int64_t ntiles,
                      uint16_t *states, float *values, int threads)
{
	int rc = check_args(K, cb, x, ntiles);
	if (rc)
		return rc;
	if (backend && ntiles > 0)
		return backend(K, cb, x, ntiles, states, values);
	if (ntiles == 0)
		return X3_OK;
	const float *tab = x3_codebook_table(cb);
	const int E = 1 << (16 - K), NK = 1 << K;
	const int isa = x3_viterbi_isa();
	const int lb = (isa == X3_ISA_AVX512 && K <= LAYOUT_B_MAX_K) || (isa == X3_ISA_AVX2 && K <= LAYOUT_B2_MAX_K);
	const int S = pick_stride(isa, K);
	const float *cbo, *cbt;
	if (get_tables(K, cb, lb, S > 0, &cbo, &cbt))
		return x3_err(X3_ENOMEM, "viterbi: out of memory");
	step_fn step = pick_step();
	tb_fn tb = pick_tb();
	fused_fn fused = NULL;
	fusedip_fn ip = NULL;
#ifdef X3_X86
	if (isa == X3_ISA_AVX512)
		fused = fused_avx512;
	if (isa == X3_ISA_AVX2 && K <= LAYOUT_B2_MAX_K && K == 1 && !S)
		fused = fused_avx2;
	if (isa == X3_ISA_AVX512 && K == IN_PLACE_K)
		ip = fusedip_avx512;
#endif
	int nt = threads > 0 ? threads : omp_get_max_threads();
	if (nt > ntiles)
		nt = (int)ntiles;
	int failed = 0;
	const size_t bpn = S ? 0 : (size_t)256 * (E / 16) * (NK - 1);
	const size_t hs = S ? ((size_t)E + PAD + 15) & ~(size_t)15 : 0;
	const size_t cbytes = ((sizeof(float) * (E + PAD)) + 63) & ~(size_t)63;

	const size_t ma = (sizeof(float) * (FUSE_MAX + PAD) + 63) & ~(size_t)63;
	const size_t ba = (bpn * sizeof(uint16_t) + 63) & ~(size_t)63;
	const size_t ha = S ? (256 + S - 1) / S * hs * sizeof(float) : 0;
	const size_t sa = K <= STAGE_MAX_K ? 2 * (bpn / 256) * sizeof(uint16_t) : 0;   /* 64-multiple */

	/* two tiles in lock step where there are at least two per thread */
	step2_fn s2 = NULL;
	fused2_fn f2 = NULL;
#ifdef X3_X86
	if (isa == X3_ISA_AVX512 && S)
		s2 = step2_avx512;
	if (isa == X3_ISA_AVX2 && S && PAIR_HIST2)
		s2 = step2_avx2;
	if (isa == X3_ISA_AVX512 && K <= PAIR_MASKS_MAX_K)
		f2 = fused2_avx512;
	if (isa == X3_ISA_AVX2 && K <= LAYOUT_B2_MAX_K && K == 1 && !S)
		f2 = fused2_avx2;
#endif
	const int pair = (s2 || f2 || ip) && ntiles >= 2 * (int64_t)nt;
	const int64_t nunits = pair ? (ntiles + 1) / 2 : ntiles;
	const size_t one = 2 * cbytes + ma + ba + ha + sa;

	#pragma omp parallel num_threads(nt)
	{
		struct work wk[2];
		char *mem = ws_get(pair ? 2 * one : one);
		int ok = mem != NULL;
		if (!ok) {
			#pragma omp atomic write
			failed = 1;
		} else {
			for (int j = 0; j < 1 + pair; j++) {
				char *m = mem + j * one;
				wk[j].ca = (float *)m;
				wk[j].cb = (float *)(m + cbytes);
				wk[j].mid = (float *)(m + 2 * cbytes);
				wk[j].bp = (uint16_t *)(m + 2 * cbytes + ma);
				wk[j].hist = (float *)(m + 2 * cbytes + ma + ba);
				wk[j].hs = hs;
				wk[j].S = S;
				wk[j].stg = K <= STAGE_MAX_K && !ip && !(fused && isa == X3_ISA_AVX512);
				wk[j].stage = (uint16_t *)(m + 2 * cbytes + ma + ba + ha);
				/* pads are read by the expand loads but never selected */
				for (int i = 0; i < E + PAD; i++)
					wk[j].ca[i] = wk[j].cb[i] = 0.0f;
				for (int i = 0; i < FUSE_MAX + PAD; i++)
					wk[j].mid[i] = 0.0f;
			}
		}
		#pragma omp for schedule(dynamic, 1)
		for (int64_t u = 0; u < nunits; u++) {
			if (!ok)
				continue;
			uint16_t st[512];
			int64_t t = pair ? 2 * u : u;
			int n = pair && t + 1 < ntiles ? 2 : 1;
			if (n == 2)
				fast_pair(s2, f2, ip, tb, K, lb, cbo, cbt, x + t * 256, x + (t + 1) * 256, &wk[0],
				          &wk[1], st, st + 256);
			else
				fast_tile(step, fused, ip, tb, K, lb, cbo, cbt, x + t * 256, &wk[0], st);
			for (int i = 0; i < 256 * n; i++) {
				if (states)
					states[t * 256 + i] = st[i];
				if (values)
					values[t * 256 + i] = tab[st[i]];
			}
		}
	}
	if (failed)
		return x3_err(X3_ENOMEM, "viterbi: out of memory for the encoder buffers");
	return X3_OK;
}
