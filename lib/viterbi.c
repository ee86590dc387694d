/* viterbi.c: tail-biting two-pass Viterbi encoder for 256-value tiles
 * (spec §8.6), with a plain C reference and a SIMD fast path that gives
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
 * group (independent min chains). The running min m_k = min(m_{k-1}, c_k)
 * and the mask c_k < m_{k-1} are computed per candidate; the masks are the
 * back-pointers (2^K - 1 bits per edge): the winner is the largest k whose
 * mask bit is set, or 0, which is exactly the strict-< argmin. vminps
 * returns its first operand iff it is strictly less, so min and the blend
 * agree bit for bit (costs are never NaN or -0). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define X3_X86 1
#endif

#include "codec.h"

#define TARGET_MAX 1e16f   /* |d|^2 * 256 stays far below FLT_MAX */
#define PAD 16             /* floats past the end of a cost buffer */

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
 *      candidate k beat the running min of candidates 0..k-1. */
typedef void (*step_fn)(int K, const float *cbo, float w, const float *prev,
                        float *next, uint16_t *bp);

static void step_scalar(int K, const float *cbo, float w, const float *prev,
                        float *next, uint16_t *bp)
{
	const int NK = 1 << K, ng = 1 << (10 - K), sh = 16 - 2 * K;
	for (int g = 0; g < ng; g++) {
		const float *c = cbo + (size_t)g * NK * 64;
		float m[64];
		for (int u = 0; u < 4; u++)
			for (int l = 0; l < 16; l++) {
				float d = c[16 * u + l] - w;
				m[16 * u + l] = fmaf(d, d, prev[(64 * g + 16 * u + l) >> K]);
			}
		c += 64;
		for (int k = 1; k < NK; k++, c += 64, bp += 4)
			for (int u = 0; u < 4; u++) {
				unsigned mask = 0;
				const float *pv = prev + ((size_t)k << sh);
				for (int l = 0; l < 16; l++) {
					float d = c[16 * u + l] - w;
					float v = fmaf(d, d, pv[(64 * g + 16 * u + l) >> K]);
					if (v < m[16 * u + l]) {
						m[16 * u + l] = v;
						mask |= 1u << l;
					}
				}
				bp[u] = (uint16_t)mask;
			}
		memcpy(next + 64 * g, m, sizeof m);
	}
}

#ifdef X3_X86
#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define TGT2 __attribute__((target("avx2,fma")))

/* Store a mask register straight to memory (kmovw m16, k). Without this
 * gcc merges the four 16-bit stores through general registers (kmovw to a
 * GPR, shifts, ors), which costs more than the arithmetic. */
#define STORE_MASK(ptr, m) __asm__("kmovw %1, %0" : "=m"(*(ptr)) : "k"(m))

/* K >= 4: the 16 lanes of a block share one predecessor (broadcast).
 * K < 4: lane l needs prev[base + (l >> K)] (expand permute). */
TGT512 static void step_avx512(int K, const float *cbo, float w,
                               const float *prev, float *next, uint16_t *bp)
{
	const int NK = 1 << K, ng = 1 << (10 - K), sh = 16 - 2 * K;
	const __m512 vw = _mm512_set1_ps(w);
	if (K >= 4) {
		for (int g = 0; g < ng; g++) {
			const float *c = cbo + (size_t)g * NK * 64;
			const float *p0 = prev + ((64 * g) >> K), *p1 = prev + ((64 * g + 16) >> K);
			const float *p2 = prev + ((64 * g + 32) >> K), *p3 = prev + ((64 * g + 48) >> K);
			__m512 d0 = _mm512_sub_ps(_mm512_load_ps(c), vw);
			__m512 d1 = _mm512_sub_ps(_mm512_load_ps(c + 16), vw);
			__m512 d2 = _mm512_sub_ps(_mm512_load_ps(c + 32), vw);
			__m512 d3 = _mm512_sub_ps(_mm512_load_ps(c + 48), vw);
			__m512 m0 = _mm512_fmadd_ps(d0, d0, _mm512_set1_ps(*p0));
			__m512 m1 = _mm512_fmadd_ps(d1, d1, _mm512_set1_ps(*p1));
			__m512 m2 = _mm512_fmadd_ps(d2, d2, _mm512_set1_ps(*p2));
			__m512 m3 = _mm512_fmadd_ps(d3, d3, _mm512_set1_ps(*p3));
			c += 64;
			for (int k = 1; k < NK; k++, c += 64, bp += 4) {
				const size_t o = (size_t)k << sh;
				d0 = _mm512_sub_ps(_mm512_load_ps(c), vw);
				d1 = _mm512_sub_ps(_mm512_load_ps(c + 16), vw);
				d2 = _mm512_sub_ps(_mm512_load_ps(c + 32), vw);
				d3 = _mm512_sub_ps(_mm512_load_ps(c + 48), vw);
				__m512 v0 = _mm512_fmadd_ps(d0, d0, _mm512_set1_ps(p0[o]));
				__m512 v1 = _mm512_fmadd_ps(d1, d1, _mm512_set1_ps(p1[o]));
				__m512 v2 = _mm512_fmadd_ps(d2, d2, _mm512_set1_ps(p2[o]));
				__m512 v3 = _mm512_fmadd_ps(d3, d3, _mm512_set1_ps(p3[o]));
				STORE_MASK(bp + 0, _mm512_cmp_ps_mask(v0, m0, _CMP_LT_OQ));
				STORE_MASK(bp + 1, _mm512_cmp_ps_mask(v1, m1, _CMP_LT_OQ));
				STORE_MASK(bp + 2, _mm512_cmp_ps_mask(v2, m2, _CMP_LT_OQ));
				STORE_MASK(bp + 3, _mm512_cmp_ps_mask(v3, m3, _CMP_LT_OQ));
				m0 = _mm512_min_ps(v0, m0);
				m1 = _mm512_min_ps(v1, m1);
				m2 = _mm512_min_ps(v2, m2);
				m3 = _mm512_min_ps(v3, m3);
			}
			_mm512_store_ps(next + 64 * g, m0);
			_mm512_store_ps(next + 64 * g + 16, m1);
			_mm512_store_ps(next + 64 * g + 32, m2);
			_mm512_store_ps(next + 64 * g + 48, m3);
		}
	} else {
		const __m512i ix = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8,
		                                     7, 6, 5, 4, 3, 2, 1, 0), (unsigned)K);
		for (int g = 0; g < ng; g++) {
			const float *c = cbo + (size_t)g * NK * 64;
			const float *p0 = prev + ((64 * g) >> K), *p1 = prev + ((64 * g + 16) >> K);
			const float *p2 = prev + ((64 * g + 32) >> K), *p3 = prev + ((64 * g + 48) >> K);
			__m512 d0 = _mm512_sub_ps(_mm512_load_ps(c), vw);
			__m512 d1 = _mm512_sub_ps(_mm512_load_ps(c + 16), vw);
			__m512 d2 = _mm512_sub_ps(_mm512_load_ps(c + 32), vw);
			__m512 d3 = _mm512_sub_ps(_mm512_load_ps(c + 48), vw);
			__m512 m0 = _mm512_fmadd_ps(d0, d0, _mm512_permutexvar_ps(ix, _mm512_loadu_ps(p0)));
			__m512 m1 = _mm512_fmadd_ps(d1, d1, _mm512_permutexvar_ps(ix, _mm512_loadu_ps(p1)));
			__m512 m2 = _mm512_fmadd_ps(d2, d2, _mm512_permutexvar_ps(ix, _mm512_loadu_ps(p2)));
			__m512 m3 = _mm512_fmadd_ps(d3, d3, _mm512_permutexvar_ps(ix, _mm512_loadu_ps(p3)));
			c += 64;
			for (int k = 1; k < NK; k++, c += 64, bp += 4) {
				const size_t o = (size_t)k << sh;
				d0 = _mm512_sub_ps(_mm512_load_ps(c), vw);
				d1 = _mm512_sub_ps(_mm512_load_ps(c + 16), vw);
				d2 = _mm512_sub_ps(_mm512_load_ps(c + 32), vw);
				d3 = _mm512_sub_ps(_mm512_load_ps(c + 48), vw);
				__m512 v0 = _mm512_fmadd_ps(d0, d0, _mm512_permutexvar_ps(ix, _mm512_loadu_ps(p0 + o)));
				__m512 v1 = _mm512_fmadd_ps(d1, d1, _mm512_permutexvar_ps(ix, _mm512_loadu_ps(p1 + o)));
				__m512 v2 = _mm512_fmadd_ps(d2, d2, _mm512_permutexvar_ps(ix, _mm512_loadu_ps(p2 + o)));
				__m512 v3 = _mm512_fmadd_ps(d3, d3, _mm512_permutexvar_ps(ix, _mm512_loadu_ps(p3 + o)));
				STORE_MASK(bp + 0, _mm512_cmp_ps_mask(v0, m0, _CMP_LT_OQ));
				STORE_MASK(bp + 1, _mm512_cmp_ps_mask(v1, m1, _CMP_LT_OQ));
				STORE_MASK(bp + 2, _mm512_cmp_ps_mask(v2, m2, _CMP_LT_OQ));
				STORE_MASK(bp + 3, _mm512_cmp_ps_mask(v3, m3, _CMP_LT_OQ));
				m0 = _mm512_min_ps(v0, m0);
				m1 = _mm512_min_ps(v1, m1);
				m2 = _mm512_min_ps(v2, m2);
				m3 = _mm512_min_ps(v3, m3);
			}
			_mm512_store_ps(next + 64 * g, m0);
			_mm512_store_ps(next + 64 * g + 16, m1);
			_mm512_store_ps(next + 64 * g + 32, m2);
			_mm512_store_ps(next + 64 * g + 48, m3);
		}
	}
}

/* AVX2: each 16-lane block is two 8-lane halves; masks are joined. */
TGT2 static inline __m256 avx2_prev(int K, const float *p, __m256i ix)
{
	if (K >= 3)
		return _mm256_broadcast_ss(p);
	return _mm256_permutevar8x32_ps(_mm256_loadu_ps(p), ix);
}

TGT2 static void step_avx2(int K, const float *cbo, float w, const float *prev,
                           float *next, uint16_t *bp)
{
	const int NK = 1 << K, ng = 1 << (10 - K), sh = 16 - 2 * K;
	const __m256 vw = _mm256_set1_ps(w);
	const __m256i ix = _mm256_srli_epi32(_mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0), K);
	for (int g = 0; g < ng; g++) {
		const float *c = cbo + (size_t)g * NK * 64;
		const float *pp[8];
		__m256 m[8];
		for (int h = 0; h < 8; h++) {
			pp[h] = prev + ((64 * g + 8 * h) >> K);
			__m256 d = _mm256_sub_ps(_mm256_load_ps(c + 8 * h), vw);
			m[h] = _mm256_fmadd_ps(d, d, avx2_prev(K, pp[h], ix));
		}
		c += 64;
		for (int k = 1; k < NK; k++, c += 64, bp += 4) {
			const size_t o = (size_t)k << sh;
			int bits[8];
			for (int h = 0; h < 8; h++) {
				__m256 d = _mm256_sub_ps(_mm256_load_ps(c + 8 * h), vw);
				__m256 v = _mm256_fmadd_ps(d, d, avx2_prev(K, pp[h] + o, ix));
				bits[h] = _mm256_movemask_ps(_mm256_cmp_ps(v, m[h], _CMP_LT_OQ));
				m[h] = _mm256_min_ps(v, m[h]);
			}
			for (int u = 0; u < 4; u++)
				bp[u] = (uint16_t)(bits[2 * u] | bits[2 * u + 1] << 8);
		}
		for (int h = 0; h < 8; h++)
			_mm256_store_ps(next + 64 * g + 8 * h, m[h]);
	}
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

/* k of the winner at edge e from the masks of one position */
static inline int bp_k(int K, const uint16_t *bpp, int e)
{
	const int NK = 1 << K;
	int blk = e >> 4, lane = e & 15, g = blk >> 2, u = blk & 3;
	const uint16_t *q = bpp + (size_t)g * (NK - 1) * 4 + u;
	for (int k = NK - 1; k >= 1; k--)
		if (q[(k - 1) * 4] >> lane & 1)
			return k;
	return 0;
}

struct work {
	float *ca, *cb;    /* E + PAD floats each, 64-byte aligned */
	uint16_t *bp;      /* 256 positions x E/16 x (2^K - 1) masks */
};

static void fast_tile(step_fn step, int K, const float *cbo, const float *x,
                      struct work *wk, uint16_t *st)
{
	const int E = 1 << (16 - K), NK = 1 << K;
	const size_t ps = (size_t)(E / 16) * (NK - 1);   /* masks per position */
	float *prev = wk->ca, *next = wk->cb, *t;

	/* pass 1: positions 128..255, 0..127, unconstrained start */
	for (int e = 0; e < E + PAD; e++)
		prev[e] = 0.0f;
	for (int i = 0; i < 256; i++) {
		int p = (i + 128) & 255;
		step(K, cbo, x[p], prev, next, wk->bp + p * ps);
		t = prev; prev = next; next = t;
	}
	int e = 0;
	for (int i = 1; i < E; i++)
		if (prev[i] < prev[e])
			e = i;
	for (int p = 127; p >= 0; p--) {
		uint32_t s = (uint32_t)bp_k(K, wk->bp + p * ps, e) << (16 - K) | (uint32_t)e;
		e = (int)(s >> K);
	}
	const int pre = e;

	/* pass 2: start and end at edge pre */
	for (int i = 0; i < E; i++)
		prev[i] = i == pre ? 0.0f : INFINITY;
	for (int p = 0; p < 256; p++) {
		step(K, cbo, x[p], prev, next, wk->bp + p * ps);
		t = prev; prev = next; next = t;
	}
	e = pre;
	for (int p = 255; p >= 0; p--) {
		uint32_t s = (uint32_t)bp_k(K, wk->bp + p * ps, e) << (16 - K) | (uint32_t)e;
		st[p] = (uint16_t)s;
		e = (int)(s >> K);
	}
}

int x3_viterbi_encode(int K, int cb, const float *x, int64_t ntiles,
                      uint16_t *states, float *values, int threads)
{
	int rc = check_args(K, cb, x, ntiles);
	if (rc)
		return rc;
	if (ntiles == 0)
		return X3_OK;
	const float *tab = x3_codebook_table(cb);
	const int E = 1 << (16 - K), NK = 1 << K, ng = E / 64;
	float *cbo = aligned_alloc(64, sizeof(float) * 65536);
	if (!cbo)
		return x3_err(X3_ENOMEM, "viterbi: out of memory");
	for (int g = 0; g < ng; g++)
		for (int k = 0; k < NK; k++)
			for (int j = 0; j < 64; j++)
				cbo[((size_t)g * NK + k) * 64 + j] =
					tab[(uint32_t)k << (16 - K) | (uint32_t)(64 * g + j)];
	step_fn step = pick_step();
	int nt = threads > 0 ? threads : omp_get_max_threads();
	if (nt > ntiles)
		nt = (int)ntiles;
	int failed = 0;
	const size_t bpn = (size_t)256 * (E / 16) * (NK - 1);
	const size_t cbytes = ((sizeof(float) * (E + PAD)) + 63) & ~(size_t)63;

	#pragma omp parallel num_threads(nt)
	{
		struct work wk;
		wk.ca = aligned_alloc(64, cbytes);
		wk.cb = aligned_alloc(64, cbytes);
		wk.bp = aligned_alloc(64, (bpn * sizeof(uint16_t) + 63) & ~(size_t)63);
		int ok = wk.ca && wk.cb && wk.bp;
		if (!ok) {
			#pragma omp atomic write
			failed = 1;
		} else {
			/* pads are read by the expand loads but never selected */
			for (int i = 0; i < E + PAD; i++)
				wk.ca[i] = wk.cb[i] = 0.0f;
		}
		#pragma omp for schedule(dynamic, 1)
		for (int64_t t = 0; t < ntiles; t++) {
			if (!ok)
				continue;
			uint16_t st[256];
			fast_tile(step, K, cbo, x + t * 256, &wk, st);
			for (int i = 0; i < 256; i++) {
				if (states)
					states[t * 256 + i] = st[i];
				if (values)
					values[t * 256 + i] = tab[st[i]];
			}
		}
		free(wk.ca);
		free(wk.cb);
		free(wk.bp);
	}
	free(cbo);
	if (failed)
		return x3_err(X3_ENOMEM, "viterbi: out of memory for the encoder buffers");
	return X3_OK;
}
