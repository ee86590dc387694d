/* viterbi.c: tail-biting two-pass Viterbi encoder for 256-value tiles
 * (exl3(5) §9.6): the plain C reference, the choice of instruction set and
 * the fast path's driver (passes, trace-backs, workspace, tables). The
 * kernels of each instruction set are in viterbi_scalar.c, viterbi_avx2.c
 * and viterbi_avx512.c (viterbi_impl.h); all give bit-identical results.
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
 * The alternatives measured and not kept are in exl3(5) §9.6. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <pthread.h>
#include "codec.h"
#include "viterbi_impl.h"
#ifdef X3_X86
#include <immintrin.h>
#endif

#define TARGET_MAX 1e16f   /* |d|^2 * 256 stays far below FLT_MAX */
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

/* ---- instruction set ----------------------------------------------------- */

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

/* ---- fast path: the driver ----------------------------------------------- */
/* Layout. Edges come in groups of 64 (four blocks u of 16 lanes).
 *  codebook, consumption order: cbo[((g*NK + k)*4 + u)*16 + lane]
 *      = cb[(k << (16-K)) | (64g + 16u + lane)]
 *  masks of one position: bp[(g*(NK-1) + k-1)*4 + u], bit lane set iff
 *      candidate k beat the running min of candidates 0..k-1.
 * A step kernel (struct vit_step) computes the output groups g0 <= g < g1
 * into out[0..] and reads the cost of predecessor edge
 * (k << (16-2K)) | (e >> K) at
 * pb[k*ks + (e >> K) - poff]: for a whole step pb = prev, ks = 2^(16-2K),
 * poff = 0; the fused two-step scheme below points it into an L1 scratch. */

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
 * HIST_K on, and on AVX2 from K = 2, see x3_vit_kernels_avx2). The steps keep only
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

/* One encode's kernels and tables: K, the codebook re-laid-out for the
 * steps (cbo) and by edge for the trace-back (cbt, recompute mode). */
struct enc {
	int K;
	const float *cbo, *cbt;
	struct vit_kernels kn;
};

/* Fused pair of steps for K <= 3, where the cost buffers (128/64/32 KB) do
 * not fit in L1 next to the codebook stream. Output edges e of the second
 * step in a block [e0, e0 + B) need exactly the intermediate edges
 * (k << (16-2K)) | (e >> K), i.e. NK ranges of B/NK edges that no
 * other block needs; they are computed into the scratch mid and consumed
 * at once, so intermediate costs never leave L1. The arithmetic is the
 * same as two plain steps. One tile: a's [0]. */
static void two_steps(const struct enc *c, const struct vit_pair *a)
{
	const int K = c->K;
	const int E = 1 << (16 - K), NK = 1 << K, G = 1 << (16 - 2 * K);
	const int L = FUSE_B(K) / NK;   /* a multiple of 64 for K <= 3 */
	for (int e0 = 0; e0 < E; e0 += FUSE_B(K)) {
		for (int kk = 0; kk < NK; kk++) {
			int x0 = kk * G + e0 / NK;
			const struct vit_step s = { c->cbo, a->w0[0], a->prev[0], G, 0, a->mid[0] + kk * L,
			                            a->bp0[0], x0 / 64, (x0 + L) / 64 };
			c->kn.step(K, &s);
		}
		const struct vit_step s = { c->cbo, a->w1[0], a->mid[0], L, e0 / NK, a->next[0] + e0,
		                            a->bp1[0], e0 / 64, (e0 + FUSE_B(K)) / 64 };
		c->kn.step(K, &s);
	}
}

/* One forward pass: 256 steps at positions (i + roll) & 255, roll = 128
 * for pass 1 (whose trace-back visits positions 127..0 only) and 0 for
 * pass 2. Start costs are in wk->ca (pass 1) or, in recompute mode, the
 * hist slot of position 0 (pass 2). Back-pointers (masks) or the costs
 * entering a position (hist, every S-th position) are kept only for
 * positions the trace-back visits: the first half of pass 1 runs without
 * either. Returns the buffer holding the final costs (pass 1; pass 2 in
 * recompute mode stops before its last step, whose costs nothing reads). */
static float *run_pass(const struct enc *c, const float *x, int pass1, float *start,
                       struct work *wk)
{
	const int K = c->K;
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
			/* one tile: [1] as [0] */
			const struct vit_pair a = { c->cbo, 1, { x[p], x[p] }, { x[q], x[q] }, { prev, prev },
			                            { next, next }, { wk->mid, wk->mid }, { b0, b0 },
			                            { b1, b1 }, i / 2 };
			if (c->kn.fusedip) {   /* in place: the costs stay in prev (wk->ca) */
				c->kn.fusedip(K, &a);
				next = prev;
			} else if (c->kn.fused)
				c->kn.fused(K, &a);
			else
				two_steps(c, &a);
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
			const struct vit_step s = { c->cbo, x[p], prev, G, 0, next, NULL, 0, E / 64 };
			c->kn.step(K, &s);
			i++;
		}
		prev = next;
	}
	stream_fence();
	return prev;
}

/* back-pointer k at (p, e): recomputed (hist) or from the masks */
static inline int k_at(const struct enc *c, const float *x, const struct work *wk, int p, int e)
{
	const int K = c->K;
	if (wk->S)
		return p % wk->S ? c->kn.tbr(K, wk->S, c->cbt, wk->hist, wk->hs, x, p, e)
		                 : c->kn.tb(K, c->cbt, wk->hist + p / wk->S * wk->hs, x[p], e);
	const size_t ps = (size_t)(1 << (12 - K)) * ((1 << K) - 1);
	return bp_k(K, c->kn.lb, wk->bp + p * ps, e);
}

/* the in-edge of the state at (p, e) */
static inline int back(const struct enc *c, const float *x, const struct work *wk, int p, int e)
{
	return (int)(((uint32_t)k_at(c, x, wk, p, e) << (16 - c->K) | (uint32_t)e) >> c->K);
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

static int anchor(const struct enc *c, const float *x, const struct work *wk, const float *fin)
{
	int e = argmin_edge(fin, 1 << (16 - c->K));
	for (int p = 127; p >= 0; p--)
		e = back(c, x, wk, p, e);
	return e;
}

/* pass-2 trace-back from out-edge pre at position 255 */
static void trace(const struct enc *c, const float *x, const struct work *wk, int pre,
                  uint16_t *st)
{
	int e = pre;
	for (int p = 255; p >= 0; p--) {
		uint32_t s = (uint32_t)k_at(c, x, wk, p, e) << (16 - c->K) | (uint32_t)e;
		st[p] = (uint16_t)s;
		e = (int)(s >> c->K);
	}
}

/* start costs: 0 everywhere (pre < 0) or 0 at e == pre and +inf elsewhere */
static void start_costs(float *c, int E, int pre)
{
	for (int i = 0; i < E; i++)
		c[i] = pre < 0 || i == pre ? 0.0f : INFINITY;
}

/* pass 2 starts in the hist slot of position 0 (recompute mode) */
static float *start2(struct work *wk)
{
	return wk->S ? wk->hist : wk->ca;
}

static void fast_tile(const struct enc *c, const float *x, struct work *wk, uint16_t *st)
{
	const int E = 1 << (16 - c->K);
	start_costs(wk->ca, E, -1);
	const float *fin = run_pass(c, x, 1, wk->ca, wk);
	const int pre = anchor(c, x, wk, fin);
	start_costs(start2(wk), E, pre);
	run_pass(c, x, 0, start2(wk), wk);
	trace(c, x, wk, pre, st);
}

/* one of two tiles in lock step: its targets, workspace and states */
struct tile {
	const float *x;
	struct work *wk;
	uint16_t *st;
};

/* run_pass for two tiles in lock step (fused pairs of steps with masks at
 * K <= 3, whole steps in recompute mode), from the start costs s[0], s[1];
 * the final costs of each tile go to fin[0], fin[1] */
static void run_pass2(const struct enc *c, const struct tile t[2], int pass1, float *const s[2],
                      float *fin[2])
{
	const int K = c->K;
	const int roll = pass1 ? 128 : 0;
	const size_t ps = (size_t)(1 << (12 - K)) * ((1 << K) - 1);
	struct work *wa = t[0].wk, *wb = t[1].wk;
	const float *xa = t[0].x, *xb = t[1].x;
	float *pa = s[0], *pb = s[1];
	for (int i = 0; i < 256;) {
		int p = (i + roll) & 255, q = (p + 1) & 255;
		float *na = pa == wa->ca ? wa->cb : wa->ca, *nb = pb == wb->ca ? wb->cb : wb->ca;
		if (!wa->S) {   /* masks */
			/* the pair kernels send their masks out themselves (no staging) */
			int keep = !pass1 || p < 128;
			uint16_t *ba = wa->bp + p * ps, *bb = wb->bp + p * ps;
			uint16_t *ba1 = wa->bp + q * ps, *bb1 = wb->bp + q * ps;
			const struct vit_pair a = { c->cbo, 2, { xa[p], xb[p] }, { xa[q], xb[q] }, { pa, pb },
			                            { na, nb }, { wa->mid, wb->mid },
			                            { keep ? ba : NULL, keep ? bb : NULL },
			                            { keep ? ba1 : NULL, keep ? bb1 : NULL }, i / 2 };
			if (c->kn.fusedip) {   /* in place */
				c->kn.fusedip(K, &a);
				na = pa;
				nb = pb;
			} else
				c->kn.fused2(K, &a);
			i += 2;
		} else {
			if (!pass1 && i == 255)
				break;   /* as in run_pass */
			if (i < 255 && (!pass1 || q < 128) && q % wa->S == 0) {
				na = wa->hist + q / wa->S * wa->hs;
				nb = wb->hist + q / wb->S * wb->hs;
			}
			const struct vit_pair a = { c->cbo, 2, { xa[p], xb[p] }, { 0, 0 }, { pa, pb },
			                            { na, nb }, { NULL, NULL }, { NULL, NULL },
			                            { NULL, NULL }, 0 };
			c->kn.step2(K, &a);
			i++;
		}
		pa = na;
		pb = nb;
	}
	stream_fence();
	fin[0] = pa;
	fin[1] = pb;
}

/* fast_tile for a pair of tiles in lock step */
static void fast_pair(const struct enc *c, const struct tile t[2])
{
	const int K = c->K, E = 1 << (16 - K);
	float *fin[2];
	start_costs(t[0].wk->ca, E, -1);
	start_costs(t[1].wk->ca, E, -1);
	run_pass2(c, t, 1, (float *const[2]){ t[0].wk->ca, t[1].wk->ca }, fin);
	int pa = argmin_edge(fin[0], E), pb = argmin_edge(fin[1], E);
	/* the two trace-backs are independent latency chains: interleaved,
	 * they overlap */
	for (int p = 127; p >= 0; p--) {
		pa = back(c, t[0].x, t[0].wk, p, pa);
		pb = back(c, t[1].x, t[1].wk, p, pb);
	}
	start_costs(start2(t[0].wk), E, pa);
	start_costs(start2(t[1].wk), E, pb);
	run_pass2(c, t, 0, (float *const[2]){ start2(t[0].wk), start2(t[1].wk) }, fin);
	int ea = pa, eb = pb;
	for (int p = 255; p >= 0; p--) {
		uint32_t s = (uint32_t)k_at(c, t[0].x, t[0].wk, p, ea) << (16 - K) | (uint32_t)ea;
		uint32_t u = (uint32_t)k_at(c, t[1].x, t[1].wk, p, eb) << (16 - K) | (uint32_t)eb;
		t[0].st[p] = (uint16_t)s;
		t[1].st[p] = (uint16_t)u;
		ea = (int)(s >> K);
		eb = (int)(u >> K);
	}
}

/* codec.h x3_viterbi_set_backend */
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

/* The kernels of the instruction set in use at K: the portable path's,
 * overridden by the instruction set's own; then the recompute stride
 * bounded by tbr_body's NK^S <= RMAX. */
static void pick_kernels(int isa, int K, struct vit_kernels *kn)
{
	x3_vit_kernels_scalar(K, kn);
#ifdef X3_X86
	if (isa == X3_ISA_AVX512)
		x3_vit_kernels_avx512(K, kn);
	if (isa == X3_ISA_AVX2)
		x3_vit_kernels_avx2(K, kn);
#else
	(void)isa;
#endif
	while (kn->S > 1 && K * kn->S > 8)
		kn->S--;
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
	struct enc c = { .K = K };
	pick_kernels(x3_viterbi_isa(), K, &c.kn);
	const int S = c.kn.S;
	if (get_tables(K, cb, c.kn.lb, S > 0, &c.cbo, &c.cbt))
		return x3_err(X3_ENOMEM, "viterbi: out of memory");
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
	const int pair = (c.kn.step2 || c.kn.fused2 || c.kn.fusedip) && ntiles >= 2 * (int64_t)nt;
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
				wk[j].stg = c.kn.stage && !c.kn.fusedip;
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
				fast_pair(&c, (const struct tile[2]){ { x + t * 256, &wk[0], st },
				                                      { x + (t + 1) * 256, &wk[1], st + 256 } });
			else
				fast_tile(&c, x + t * 256, &wk[0], st);
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
