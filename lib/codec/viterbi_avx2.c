/* viterbi_avx2.c: the Viterbi encoder's AVX2 + FMA kernels (compiled with
 * target attributes, so the binary needs no -march and runs them only
 * where the CPU has them): each 16-lane block as two 8-lane halves, layout
 * A and B steps, fused pairs with masks at K = 1, two tiles in lock step
 * in recompute mode, and the trace-back with fmaf as an instruction.
 * viterbi.c describes the scheme. */
#include <string.h>
#include "viterbi_impl.h"
#ifdef X3_X86
#include <immintrin.h>

#define TGT2 __attribute__((target("avx2,fma")))

TGT2 VIT_INLINE __m256 pv256(const int K, const float *p, __m256i ix)
{
	if (K >= 3)
		return _mm256_broadcast_ss(p);
	return _mm256_permutevar8x32_ps(_mm256_loadu_ps(p), ix);
}

/* layout A; masks are joined from the two halves */
TGT2 VIT_INLINE void body256(const int K, const int wbp, const struct vit_step *s)
{
	const int NK = 1 << K;
	const float *cbo = s->cbo;
	const size_t ks = s->ks;
	const int poff = s->poff;
	float *out = s->out;
	uint16_t *bp = s->bp;
	const __m256 vw = _mm256_set1_ps(s->w);
	const __m256i ix = _mm256_srli_epi32(_mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0),
	                                     K < 3 ? K : 0);
	if (wbp)
		bp += (size_t)s->g0 * (NK - 1) * 4;
	for (int g = s->g0; g < s->g1; g++, out += 64) {
		const float *c = cbo + (size_t)g * NK * 64;
		/* (64g + 8h) >> K == (64g >> K) + (8h >> K) for K <= 8 */
		const float *p = s->pb + ((64 * g) >> K) - poff;
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
TGT2 VIT_INLINE void tr256(const int K, __m256 *r)
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

/* One kernel body's call for T = 1 tile or T = 2 tiles in lock step ([1]:
 * tile b's, at the same offsets as tile a's). */
struct blk {
	const float *cbo;
	float w[2];
	const float *p[2];
	size_t ks;
	int poff;
	float *o[2];
	uint16_t *b[2];
	int g0, g1;
};

TGT2 VIT_INLINE void body256bo(const int K, const int wbp, const int T, const struct blk *a)
{
	const int NK = 1 << K;
	const float *cbo = a->cbo;
	const size_t ks = a->ks;
	const int poff = a->poff;
	const int b0 = a->g0 * 4 / NK, b1 = a->g1 * 4 / NK;   /* 64-edge groups -> g-blocks */
	const __m256 vw[2] = { _mm256_set1_ps(a->w[0]), _mm256_set1_ps(a->w[1]) };
	const float *pt[2] = { a->p[0], a->p[1] };
	float *ot[2] = { a->o[0], a->o[1] };
	uint8_t *bt[2] = { (uint8_t *)a->b[0], (uint8_t *)a->b[1] };
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

/* fused pair of steps (two_steps, viterbi.c) with the layout-B kernels
 * inlined, for one tile or two in lock step */
TGT2 VIT_INLINE void fused256(const int K, const int wbp, const int T, const struct vit_pair *ap)
{
	const struct vit_pair A = *ap;   /* a copy: the stores below cannot alias it */
	const int E = 1 << (16 - K), NK = 1 << K, G = 1 << (16 - 2 * K);
	const int L = FUSE_B(K) / NK;
	for (int e0 = 0; e0 < E; e0 += FUSE_B(K)) {
		for (int kk = 0; kk < NK; kk++) {
			int x0 = kk * G + e0 / NK;
			const struct blk s = { A.cbo, { A.w0[0], A.w0[1] }, { A.prev[0], A.prev[1] },
			                       G, 0, { A.mid[0] + kk * L, A.mid[1] + kk * L },
			                       { A.bp0[0], A.bp0[1] }, x0 / 64, (x0 + L) / 64 };
			body256bo(K, wbp, T, &s);
		}
		const struct blk s = { A.cbo, { A.w1[0], A.w1[1] }, { A.mid[0], A.mid[1] }, L,
		                       e0 / NK, { A.next[0] + e0, A.next[1] + e0 },
		                       { A.bp1[0], A.bp1[1] }, e0 / 64, (e0 + FUSE_B(K)) / 64 };
		body256bo(K, wbp, T, &s);
	}
}

/* masks mode on AVX2 is K = 1 only (x3_vit_kernels_avx2; a stride of 0 at
 * K = 2, 3 would run two_steps on step_avx2) */
TGT2 static void fused_avx2(int K, const struct vit_pair *a)
{
	(void)K;
	if (a->bp0[0])
		fused256(1, 1, 1, a);
	else
		fused256(1, 0, 1, a);
}

/* K = 1, as fused_avx2 */
TGT2 static void fused2_avx2(int K, const struct vit_pair *a)
{
	(void)K;
	if (a->bp0[0])
		fused256(1, 1, 2, a);
	else
		fused256(1, 0, 2, a);
}

#define BODY256(K, wbp) do { \
		if ((K) <= LAYOUT_B2_MAX_K) \
			body256bo(K, wbp, 1, &(struct blk){ s->cbo, { s->w, s->w }, { s->pb, s->pb }, \
			          s->ks, s->poff, { s->out, s->out }, { s->bp, s->bp }, s->g0, s->g1 }); \
		else \
			body256(K, wbp, s); \
	} while (0)
#define SWITCH_K(M, wbp) switch (K) { \
	case 1: M(1, wbp); break; case 2: M(2, wbp); break; \
	case 3: M(3, wbp); break; case 4: M(4, wbp); break; \
	case 5: M(5, wbp); break; case 6: M(6, wbp); break; \
	case 7: M(7, wbp); break; default: M(8, wbp); break; }

TGT2 static void step_avx2(int K, const struct vit_step *s)
{
	if (s->bp)
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
TGT2 VIT_INLINE void body256t2(const int K, const struct vit_pair *ap)
{
	const struct vit_pair A = *ap;   /* a copy: the stores below cannot alias it */
	const int NK = 1 << K;
	const size_t ks = (size_t)1 << (16 - 2 * K);
	const float *pa = A.prev[0], *pb = A.prev[1];
	float *oa = A.next[0], *ob = A.next[1];
	const __m256 vwa = _mm256_set1_ps(A.w0[0]), vwb = _mm256_set1_ps(A.w0[1]);
	for (int g = 0; g < 1 << (10 - K); g++)
#pragma GCC unroll 2
		for (int hh = 0; hh < 2; hh++) {
			/* lanes 32 hh .. 32 hh + 31; their predecessor costs: one per
			 * 16 lanes at K = 4, one for all 32 at K >= 5 */
			const float *c = A.cbo + (size_t)g * NK * 64 + 32 * hh;
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

TGT2 static void step2_avx2(int K, const struct vit_pair *a)
{
#define BODY256T2(K, wbp) do { \
		if ((K) <= LAYOUT_B2_MAX_K) \
			body256bo(K, 0, 2, &(struct blk){ a->cbo, { a->w0[0], a->w0[1] }, \
			          { a->prev[0], a->prev[1] }, (size_t)1 << (16 - 2 * (K)), 0, \
			          { a->next[0], a->next[1] }, { NULL, NULL }, 0, 1 << (10 - (K)) }); \
		else \
			body256t2(K, a); \
	} while (0)
	SWITCH_K(BODY256T2, 0)
}

/* tb_body and tbr_body (viterbi_impl.h) where fmaf is an instruction
 * instead of a libm call */
TGT2 static int tb_fma(int K, const float *cbt, const float *h, float w, int e)
{
	return tb_body(K, cbt, h, w, e);
}

TGT2 static int tbr_fma(int K, int S, const float *cbt, const float *hist, size_t hs,
                        const float *x, int p, int e)
{
	return tbr_body(K, S, cbt, hist, hs, x, p, e);
}

/* Recompute mode's stride S by K on AVX2 (0: masks). Zen 3 (2-core EPYC,
 * tests/bench/viterbi -i avx2, one thread, best of alternated runs):
 * K = 2 masks 56k (layout A) -> S = 3 114k weights/s (S = 2 ~3% and S = 4
 * ~9% slower, S = 1 slower still on two threads: 16 MB of costs per tile);
 * K = 3 masks 85k -> S = 2 110k (S = 1 ~5% slower); K = 1: S = 8 no faster
 * than the layout-B masks (97k); K = 4: S = 2 no faster than 1. */
static const unsigned char stride2[9] = { 0, 0, 3, 2, 1, 1, 1, 1, 1 };

/* on top of x3_vit_kernels_scalar's */
void x3_vit_kernels_avx2(int K, struct vit_kernels *k)
{
	k->lb = K <= LAYOUT_B2_MAX_K;
	k->S = stride2[K];
	k->step = step_avx2;
	k->tb = tb_fma;
	k->tbr = tbr_fma;
	/* masks mode (S = 0) is K = 1 only: fused pairs, one tile or two */
	k->fused = K <= LAYOUT_B2_MAX_K && K == 1 && !k->S ? fused_avx2 : NULL;
	k->fused2 = K <= LAYOUT_B2_MAX_K && K == 1 && !k->S ? fused2_avx2 : NULL;
	k->step2 = k->S && PAIR_HIST2 ? step2_avx2 : NULL;
}
#endif
