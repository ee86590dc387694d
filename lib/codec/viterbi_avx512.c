/* viterbi_avx512.c: the Viterbi encoder's AVX-512 kernels (F, BW, VL;
 * compiled with target attributes, so the binary needs no -march and runs
 * them only where the CPU has them): layout A and B steps, fused pairs of
 * steps with their masks sent out line by line, in-place pairs at
 * K = IN_PLACE_K, two tiles in lock step, and the trace-back's
 * recomputation 16 candidates at a time. viterbi.c describes the scheme. */
#include "viterbi_impl.h"
#ifdef X3_X86
#include <immintrin.h>

#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* Store a mask register straight to memory (kmovw m16, k). Without this
 * gcc merges the four 16-bit stores through general registers (kmovw to a
 * GPR, shifts, ors), which costs more than the arithmetic. */
#define STORE_MASK(ptr, m) __asm__("kmovw %1, %0" : "=m"(*(ptr)) : "k"(m))

/* One kernel body's call, for T = 1 tile or T = 2 tiles in lock step
 * ([1] = tile b's target, predecessor costs, outputs and masks, at the
 * same offsets as tile a's): a step's arguments (vit_step) per tile. */
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

/* a one-tile blk of a step's arguments */
VIT_INLINE struct blk blk1(const struct vit_step *s)
{
	return (struct blk){ s->cbo, { s->w, s->w }, { s->pb, s->pb }, s->ks, s->poff,
	                     { s->out, s->out }, { s->bp, s->bp }, s->g0, s->g1 };
}

/* One group: four independent running-min chains over k. One codebook
 * load serves both tiles. */
TGT512 VIT_INLINE void body512t(const int K, const int wbp, const int T, const struct blk *a)
{
	const int NK = 1 << K;
	const float *cbo = a->cbo;
	const size_t ks = a->ks;
	const int poff = a->poff, g0 = a->g0, g1 = a->g1;
	const __m512 vw[2] = { _mm512_set1_ps(a->w[0]), _mm512_set1_ps(a->w[1]) };
	/* K < 4: the 64 lanes of a group need p[(64g >> K) + ((16u + l) >> K)],
	 * 64 >> K consecutive costs: one or two aligned-size loads per k,
	 * expanded by a permute per u (no line-splitting loads per u) */
	const int NV = K == 1 ? 2 : 1;
	__m512i ixu[4];
	for (int u = 0; u < 4; u++)
		ixu[u] = _mm512_add_epi32(_mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10,
		                          9, 8, 7, 6, 5, 4, 3, 2, 1, 0), (unsigned)(K < 4 ? K : 0)),
		                          _mm512_set1_epi32(((16 * u) >> K) & 15));
	const float *pt[2] = { a->p[0], a->p[1] };
	float *ot[2] = { a->o[0], a->o[1] };
	uint16_t *bt[2] = { a->b[0], a->b[1] };
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

TGT512 VIT_INLINE void body512(const int K, const int wbp, const struct vit_step *s)
{
	const struct blk a = blk1(s);
	body512t(K, wbp, 1, &a);
}

/* Where body512bo stores its outputs and masks: contiguous from a->o
 * (ipo = 0) or, for the in-place pairs (ipo = 1), edge 16 NK b at chunk
 * rotr_n(c, s1) of its logical chunk c; masks at their place in a
 * position (mrel = 0) or from a->b on (mrel = 1, the L1 lines of
 * fused512p and fusedip512). */
struct bo_out { int ipo, s1, mrel; };

/* Layout B (AVX-512, K <= LAYOUT_B_MAX_K): lanes are 16 consecutive
 * predecessor groups gv = e >> K, so the predecessor costs k*ks + gv are
 * one contiguous load shared by the NK candidates j = e & (NK-1) of every
 * gv, with no expand permute. The NK result vectors R_j (lane gv) are then
 * interleaved to natural edge order e = gv*NK + j by K rounds of zips.
 *  codebook: cbo[((b*NK + k)*NK + j)*16 + l] = cb[(k << (16-K)) | ((16b+l) << K) | j]
 *  masks:    bp[(b*(NK-1) + k-1)*NK + j], bit l, for g-block b (16 gv). */
TGT512 VIT_INLINE void body512bo(const int K, const int wbp, const int T, const struct blk *a,
                                 const struct bo_out oo)
{
	const int NK = 1 << K;
	const float *cbo = a->cbo;
	const size_t ks = a->ks;
	const int poff = a->poff;
	const int b0 = a->g0 * 4 / NK, b1 = a->g1 * 4 / NK;   /* 64-edge groups -> g-blocks */
	const __m512 vw[2] = { _mm512_set1_ps(a->w[0]), _mm512_set1_ps(a->w[1]) };
	const __m512i zl = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
	const __m512i zh = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10,
	                                    25, 9, 24, 8);
	const float *pt[2] = { a->p[0], a->p[1] };
	float *ot[2] = { a->o[0], a->o[1] };
	uint16_t *bt[2] = { a->b[0], a->b[1] };
	if (wbp && !oo.mrel)
		for (int t = 0; t < T; t++)
			bt[t] += (size_t)b0 * (NK - 1) * NK;
	for (int b = b0; b < b1; b++) {
		const float *c = cbo + (size_t)b * NK * NK * 16;
		float *o[2];
		for (int t = 0; t < T; t++)
			o[t] = oo.ipo ? ot[t] + (size_t)rotr_n((unsigned)(16 * NK * b / IP_C(K)), oo.s1) *
			                        IP_C(K) + 16 * NK * b % IP_C(K)
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

TGT512 VIT_INLINE void body512bt(const int K, const int wbp, const int T, const struct blk *a)
{
	body512bo(K, wbp, T, a, (struct bo_out){ 0, 0, 0 });
}

TGT512 VIT_INLINE void body512b(const int K, const int wbp, const struct vit_step *s)
{
	const struct blk a = blk1(s);
	body512bt(K, wbp, 1, &a);
}

/* one instance per K and back-pointer mode: shifts and trip counts are
 * constants; bp == NULL selects the instance without masks */
#define BODY512(K, wbp) do { \
		if ((K) <= LAYOUT_B_MAX_K) \
			body512b(K, wbp, s); \
		else \
			body512(K, wbp, s); \
	} while (0)
#define SWITCH_K(M, wbp) switch (K) { \
	case 1: M(1, wbp); break; case 2: M(2, wbp); break; \
	case 3: M(3, wbp); break; case 4: M(4, wbp); break; \
	case 5: M(5, wbp); break; case 6: M(6, wbp); break; \
	case 7: M(7, wbp); break; default: M(8, wbp); break; }

TGT512 static void step_avx512(int K, const struct vit_step *s)
{
	if (s->bp)
		SWITCH_K(BODY512, 1)
	else
		SWITCH_K(BODY512, 0)
}

/* The fused step pair of two_steps() (viterbi.c) with the kernels inlined:
 * one call per pair of steps instead of NK + 1 calls per 1024-edge block.
 * One tile, a's [0]. */
TGT512 VIT_INLINE void fused512(const int K, const int wbp, const struct vit_pair *ap)
{
	const struct vit_pair A = *ap;   /* a copy: the stores below cannot alias it */
	const int E = 1 << (16 - K), NK = 1 << K, G = 1 << (16 - 2 * K);
	const int L = FUSE_B(K) / NK;
	for (int e0 = 0; e0 < E; e0 += FUSE_B(K)) {
		for (int kk = 0; kk < NK; kk++) {
			int x0 = kk * G + e0 / NK;
			const struct vit_step s = { A.cbo, A.w0[0], A.prev[0], G, 0,
			                            A.mid[0] + kk * L, A.bp0[0], x0 / 64, (x0 + L) / 64 };
			if ((K) <= LAYOUT_B_MAX_K)
				body512b(K, wbp, &s);
			else
				body512(K, wbp, &s);
		}
		const struct vit_step s = { A.cbo, A.w1[0], A.mid[0], L, e0 / NK, A.next[0] + e0,
		                            A.bp1[0], e0 / 64, (e0 + FUSE_B(K)) / 64 };
		if ((K) <= LAYOUT_B_MAX_K)
			body512b(K, wbp, &s);
		else
			body512(K, wbp, &s);
	}
}

/* Two tiles in lock step (K = 1 in place, fusedip512; K = 2 fused with
 * masks, fused512p; recompute mode K >= 4, whole steps without masks).
 * One codebook load serves the candidates of both tiles: the 64-byte load
 * per 16 candidates asks ~40 B/cycle of L2 at the recompute kernels' 1.5
 * cycles per vector, about all L2 delivers. */

/* the kernels of the recompute mode (K >= 4), instantiated per K */
#define SWITCH_HIST_K(M) switch (K) { \
	case 4: M(4); break; case 5: M(5); break; case 6: M(6); break; \
	case 7: M(7); break; default: M(8); break; }

#define BODY2(K) body512t(K, 0, 2, &(struct blk){ a->cbo, { a->w0[0], a->w0[1] }, \
		{ a->prev[0], a->prev[1] }, (size_t)1 << (16 - 2 * (K)), 0, \
		{ a->next[0], a->next[1] }, { NULL, NULL }, 0, 1 << (10 - (K)) })

TGT512 static void step2_avx512(int K, const struct vit_pair *a)
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
TGT512 VIT_INLINE void stream_masks(int T, uint16_t *const dst[2], size_t off, const uint16_t *s0,
                                    const uint16_t *s1, int n)
{
	for (int t = 0; t < T; t++)
		for (int i = 0; i < n; i += 32)
			_mm512_stream_si512((void *)(dst[t] + off + i),
			                    _mm512_load_si512((t ? s1 : s0) + i));
}

TGT512 VIT_INLINE void fused512p(const int K, const int wbp, const int T, const struct vit_pair *ap)
{
	const struct vit_pair A = *ap;   /* a copy: the stores below cannot alias it */
	const int E = 1 << (16 - K), NK = 1 << K, G = 1 << (16 - 2 * K);
	const int FB = FUSE_B(K), L = FB / NK;
	const int MB = (NK - 1) * NK;                               /* masks per g-block */
	const int MC1 = L / (16 * NK) * MB, MC2 = FB / (16 * NK) * MB;   /* per call: 24, 96 */
	const int R = 4;                                            /* calls per kk line set */
	_Alignas(64) uint16_t r0[2][4][4 * 24], r1[2][96];
	uint16_t *const bp0[2] = { A.bp0[0], A.bp0[1] }, *const bp1[2] = { A.bp1[0], A.bp1[1] };
	for (int e0 = 0, j = 0; e0 < E; e0 += FB, j++) {
		for (int kk = 0; kk < NK; kk++) {
			int x0 = kk * G + e0 / NK;
			const struct blk s = { A.cbo, { A.w0[0], A.w0[1] }, { A.prev[0], A.prev[1] },
			                       G, 0, { A.mid[0] + kk * L, A.mid[1] + kk * L },
			                       { r0[0][kk] + j % R * MC1, r0[1][kk] + j % R * MC1 },
			                       x0 / 64, (x0 + L) / 64 };
			body512bo(K, wbp, T, &s, (struct bo_out){ 0, 0, 1 });
			if (wbp && j % R == R - 1) {
				/* masks of intermediate edges x0 - (R-1) L .. x0 + L */
				stream_masks(T, bp0, (size_t)(x0 - (R - 1) * L) / (16 * NK) * MB,
				             r0[0][kk], r0[1][kk], R * MC1);
			}
		}
		const struct blk s = { A.cbo, { A.w1[0], A.w1[1] }, { A.mid[0], A.mid[1] }, L,
		                       e0 / NK, { A.next[0] + e0, A.next[1] + e0 }, { r1[0], r1[1] },
		                       e0 / 64, (e0 + FB) / 64 };
		body512bo(K, wbp, T, &s, (struct bo_out){ 0, 0, 1 });
		if (wbp)
			stream_masks(T, bp1, (size_t)e0 / (16 * NK) * MB, r1[0], r1[1], MC2);
	}
}

/* K = 2 only (K = 1: fusedip_avx512; K = 3: no pairs) */
TGT512 static void fused2_avx512(int K, const struct vit_pair *a)
{
	(void)K;
	if (a->bp0[0])
		fused512p(2, 1, 2, a);
	else
		fused512p(2, 0, 2, a);
}

/* K = 2, 3 (K = 1: fusedip_avx512); K = 2 sends its masks out itself */
TGT512 static void fused_avx512(int K, const struct vit_pair *a)
{
	if (K == 2) {
		if (a->bp0[0])
			fused512p(2, 1, 1, a);
		else
			fused512p(2, 0, 1, a);
	} else if (a->bp0[0])
		fused512(3, 1, a);
	else
		fused512(3, 0, a);
}

/* In-place fused pairs of steps (layout B, K = IN_PLACE_K = 1).
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
/* pair a->m of a pass for T tiles; costs in and out in a->prev, chunks
 * rotated as above */
TGT512 VIT_INLINE void fusedip512(const int K, const int wbp, const int T, const struct vit_pair *ap)
{
	const struct vit_pair A = *ap;   /* a copy: the stores below cannot alias it */
	const int E = 1 << (16 - K), NK = 1 << K, G = 1 << (16 - 2 * K);
	const int B = IP_B(K), L = B / NK, C = IP_C(K);
	const int m = A.m;
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
	uint16_t *const bp0[2] = { A.bp0[0], A.bp0[1] }, *const bp1[2] = { A.bp1[0], A.bp1[1] };
	float *const ca = A.prev[0], *const cb2 = A.prev[1];
	for (int e0 = 0, j = 0; e0 < E; e0 += B, j++) {
		for (int kk = 0; kk < NK; kk++) {
			const size_t base = (size_t)rotr_n((unsigned)(kk << (IP_N - 2 * K) | j), s0) * C;
			const int x0 = kk * G + e0 / NK;   /* first intermediate edge */
			const struct blk s = { A.cbo, { A.w0[0], A.w0[1] }, { ca + base, cb2 + base },
			                       ks, x0 / NK, { A.mid[0] + kk * L, A.mid[1] + kk * L },
			                       { r0[0][kk] + j % R * MC1, r0[1][kk] + j % R * MC1 },
			                       x0 / 64, (x0 + L) / 64 };
			body512bo(K, wbp, T, &s, (struct bo_out){ 0, 0, 1 });
			if (wbp && j % R == R - 1) {
				/* masks of intermediate edges x0 - (R-1) L .. x0 + L */
				stream_masks(T, bp0, (size_t)(x0 - (R - 1) * L) / (16 * NK) * MB,
				             r0[0][kk], r0[1][kk], R * MC1);
			}
		}
		/* the NK^2 output chunks go to the chunks just read */
		const struct blk s = { A.cbo, { A.w1[0], A.w1[1] }, { A.mid[0], A.mid[1] }, L,
		                       e0 / NK, { ca, cb2 }, { r1[0], r1[1] }, e0 / 64, (e0 + B) / 64 };
		body512bo(K, wbp, T, &s, (struct bo_out){ 1, s1, 1 });
		if (wbp)
			stream_masks(T, bp1, (size_t)e0 / (16 * NK) * MB, r1[0], r1[1], MC2);
	}
}

/* K = IN_PLACE_K; one tile or two (a->T) */
TGT512 static void fusedip_avx512(int K, const struct vit_pair *a)
{
#define FUSEDIP(K, wbp, T) fusedip512(K, wbp, T, a)
	if (a->T == 2) {
		if (a->bp0[0]) {
			if (K == 1) FUSEDIP(1, 1, 2); else FUSEDIP(2, 1, 2);
		} else {
			if (K == 1) FUSEDIP(1, 0, 2); else FUSEDIP(2, 0, 2);
		}
	} else {
		if (a->bp0[0]) {
			if (K == 1) FUSEDIP(1, 1, 1); else FUSEDIP(2, 1, 1);
		} else {
			if (K == 1) FUSEDIP(1, 0, 1); else FUSEDIP(2, 0, 1);
		}
	}
#undef FUSEDIP
}

/* 16 candidates at a time (a gather of the costs unless G = 1); the
 * minimum over all by a tree, then the first k attaining it (costs are
 * never NaN, so this is the strict-< argmin) */
TGT512 VIT_INLINE int tb512(const int K, const float *cbt, const float *h, float w, int e)
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

/* K >= HIST_K (recompute mode) */
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

/* on top of x3_vit_kernels_scalar's (whose tbr is never called here: S <= 1) */
void x3_vit_kernels_avx512(int K, struct vit_kernels *k)
{
	k->lb = K <= LAYOUT_B_MAX_K;
	k->stage = 0;   /* the fused kernels send their masks out themselves */
	k->step = step_avx512;
	k->tb = tb_avx512;
	k->fused = fused_avx512;
	k->fusedip = K == IN_PLACE_K ? fusedip_avx512 : NULL;
	k->step2 = k->S ? step2_avx512 : NULL;
	k->fused2 = K <= PAIR_MASKS_MAX_K ? fused2_avx512 : NULL;
}
#endif
