/* exl3mm.c: fast y' = x'·W~ straight from the packed trellis (exl3(5) §3.3,
 * exl3(5) §4.2, §5). Tiles are decoded inside the loop, never the whole weight.
 *
 * Work split: OpenMP over output tiles nb (16 columns each); each thread
 * walks all kb of its columns, so the accumulators stay in registers. The
 * object keeps the tiles in column-major tile order (exl3.c), so that walk
 * reads memory sequentially (in row-major tile order every tile would be
 * a new cache line 32K·n/16 bytes away, and the loop latency-bound).
 *
 * State extraction (exl3(5) §3.3): state s_i of a tile is the 16 stream bits ending
 * at bit (i+1)K, circularly. In "ext" coordinates, ext[0] = U[8K-1] and
 * ext[1..8K] = U (the tile's 8K uint32 words), every window lies in two
 * adjacent words (the tail-biting wrap only reaches back into the last
 * word). For a group of W consecutive states (W = 8 or 16) the words lie
 * within W dwords of a per-group base, so one unaligned load, two permutes
 * and two variable shifts give W states at once, for any K (patterns
 * precomputed per K in struct xtab). The load is made straight from the
 * tile (the buffer is padded on both sides); only groups whose base is 0
 * take a window with U[8K-1] inserted in lane 0. (Copying tiles to a small
 * buffer first made every load a store-forwarding stall.)
 *
 * Codebooks are computed, not looked up: a 65536-entry float table is
 * 256 KiB, out of L1, and AVX-512 gathers from it measured 1.9x slower at
 * batch 1 than the ~12 vector ops of the formula. The fp16 results are
 * bit-exact (exl3(5) §5): 3INST/MCG halves have biased exponents 12..15, always
 * normal, so their float bits are formed with shifts and ternary logic; the
 * sum of two is exact in fp32 and one cvtps2ph rounds it like __hadd.
 * MUL1's byte sum S comes from maddubs/madd (u8·1 pairs, then pairs), and
 * S·K_INV + (1024·K_INV + K_BIAS) is exact in fp32 (21 significant bits),
 * then rounded once to fp16.
 *
 * Consumption (exl3(5) §4.2): trellis position i = 8t + j holds row
 * r = 2(t%4) + (j&1) + 8((j>>1)&1), column c = t/4 + 8(j>>2).
 *  - batch 1 (GEMV): for lane t the 8 rows are {r0, r0+1, r0+8, r0+9} twice
 *    (r0 = 2(t%4)), so x' is pre-arranged per 16-row block into 4 vectors
 *    xq[q] (q = t%4) of 8 floats, and lanes t = 4c..4c+3 accumulate into one
 *    vector per column pair (c, c+8); reduced once per column tile.
 *  - batch > 1 (GEMM): rows of X are the SIMD lanes (X' transposed into
 *    chunks of W rows); each decoded weight is broadcast and multiplied with
 *    the X'ᵀ row of its input channel, accumulating per output column; the
 *    16 X'ᵀ rows of a tile row stay in registers across NBLK tiles. */
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "codec.h"
#include "exl3_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define X3_HAVE_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

enum { ISA_SCALAR, ISA_AVX2, ISA_AVX512, ISA_AUTO };
static const char *const isa_names[] = { "scalar", "avx2", "avx512" };
static int isa_cur = ISA_AUTO;

static int isa_supported(int isa)
{
	if (isa == ISA_SCALAR)
		return 1;
#ifdef X3_HAVE_X86
	__builtin_cpu_init();
	unsigned a, b, c, d;
	int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
	if (!f16c || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
		return 0;
	if (isa == ISA_AVX2)
		return 1;
	if (isa == ISA_AVX512)
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
	return 0;
}

static int isa_parse(const char *s)
{
	for (int i = 0; i < 3; i++)
		if (strcmp(s, isa_names[i]) == 0)
			return i;
	return -1;
}

static int isa_get(void)
{
	if (isa_cur != ISA_AUTO)
		return isa_cur;
	const char *env = getenv("X3_SIMD");
	int want = env && *env && strcmp(env, "auto") ? isa_parse(env) : -1;
	if (want >= 0 && isa_supported(want))
		return want;
	for (int i = ISA_AVX512; i > ISA_SCALAR; i--)
		if (isa_supported(i))
			return i;
	return ISA_SCALAR;
}

const char *x3_exl3_simd(void)
{
	return isa_names[isa_get()];
}

int x3_exl3_simd_set(const char *name)
{
	if (!name || strcmp(name, "auto") == 0) {
		isa_cur = ISA_AUTO;
		return X3_OK;
	}
	int i = isa_parse(name);
	if (i < 0)
		return x3_err(X3_EINVAL, "unknown SIMD level '%s' (scalar, avx2, avx512)", name);
	if (!isa_supported(i))
		return x3_err(X3_EUNSUP, "SIMD level '%s' not supported by this CPU or build", name);
	isa_cur = i;
	return X3_OK;
}

/* ---- extraction tables ------------------------------------------------ */
/* For groups of W consecutive states (W = 8 or 16), group g covering states
 * gW .. gW+W-1: window base word in ext, and per lane the index of the high
 * (earlier) word, of the low word, and the right/left shift counts. */
#define EXT_WORDS (8 * 8 + 1 + 16)
struct xtab {
	int nwrap;            /* groups 0..nwrap-1 have base 0 */
	int32_t base[32];
	int32_t hi[32][16], lo[32][16], sr[32][16], sl[32][16];
};

static void xtab_init(struct xtab *T, int K, int W)
{
	T->nwrap = 0;
	for (int g = 0; g < 256 / W; g++)
		for (int j = 0; j < W; j++) {
			int B = (g * W + j + 1) * K + 32;   /* end bit in ext */
			int w1 = (B - 1) >> 5, w0 = w1 - 1;
			if (j == 0)
				T->base[g] = w0;
			T->hi[g][j] = w0 - T->base[g];
			T->lo[g][j] = w1 - T->base[g];
			T->sr[g][j] = 32 * (w1 + 1) - B;
			T->sl[g][j] = 32 - T->sr[g][j];
		}
	while (T->nwrap < 256 / W && T->base[T->nwrap] == 0)
		T->nwrap++;
}

static inline const uint32_t *tile_u32(const struct x3_exl3 *e, int64_t kb, int64_t nb)
{
	return (const uint32_t *)(e->trellis + (nb * (e->k / 16) + kb) * 16 * e->K);
}

/* Tile (kb, nb) copied to ext[0..8K] (scalar path). */
static inline void load_ext(const struct x3_exl3 *e, int64_t kb, int64_t nb,
                            uint32_t *ext)
{
	const uint16_t *w = e->trellis + (nb * (e->k / 16) + kb) * 16 * e->K;
	memcpy(ext + 1, w, (size_t)32 * e->K);
	ext[0] = ext[8 * e->K];
}

/* ---- scalar reference-style fast path ---------------------------------- */
static void decode_tile_scalar(const uint32_t *ext, int K, const float *tab,
                               float *v /* 256, trellis order */)
{
	for (int i = 0; i < 256; i++) {
		int B = (i + 1) * K + 32;
		int w1 = (B - 1) >> 5, s = 32 * (w1 + 1) - B;
		uint64_t win = (uint64_t)ext[w1 - 1] << 32 | ext[w1];
		v[i] = tab[(win >> s) & 0xFFFF];
	}
}

static void mm_scalar(const struct x3_exl3 *e, const float *xh, int64_t rows,
                      float *yh, int threads)
{
	const float *tab = x3_codebook_table(e->cb);
	int64_t ntk = e->k / 16, ntn = e->n / 16;
	uint8_t rr[256], cc[256];
	for (int i = 0; i < 256; i++) {
		int t = i >> 3, j = i & 7;
		rr[i] = (uint8_t)(2 * (t % 4) + (j & 1) + 8 * ((j >> 1) & 1));
		cc[i] = (uint8_t)(t / 4 + 8 * (j >> 2));
	}
	memset(yh, 0, (size_t)rows * (size_t)e->n * sizeof *yh);
#pragma omp parallel for schedule(static) num_threads(threads)
	for (int64_t nb = 0; nb < ntn; nb++) {
		uint32_t ext[EXT_WORDS] = { 0 };
		float v[256];
		for (int64_t kb = 0; kb < ntk; kb++) {
			load_ext(e, kb, nb, ext);
			decode_tile_scalar(ext, e->K, tab, v);
			for (int64_t m = 0; m < rows; m++) {
				const float *x = xh + m * e->k + 16 * kb;
				float *y = yh + m * e->n + 16 * nb;
				for (int i = 0; i < 256; i++)
					y[cc[i]] += x[rr[i]] * v[i];
			}
		}
	}
}

#ifdef X3_HAVE_X86
/* fp16 constants of MUL1 (exl3(5) §5.3) and the 3INST/MCG multipliers
 * (exl3(5) §5.1-§5.2) */
#define MUL1_KINV 0.00676727294921875f     /* half 0x1EEE = 887/131072 */
#define MUL1_KBIAS (-10.3828125f)          /* half 0xC931 */
#define MUL1_C0 (-3.453125f)               /* 1024·K_INV + K_BIAS, exact */
#define INST3_MULT 89226354u
#define INST3_ADD 64248484u

/* ---- AVX2 (8 states per group) --------------------------------------- */
#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE_AVX2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* The window of group g: ext[base .. base+8) read straight from the tile
 * (ext[j] = U[j-1] for j >= 1; the trellis buffer is padded on both sides);
 * groups with base 0 use w0, the window at 0 with U[8K-1] in lane 0. */
INLINE_AVX2 __m256i window8(const uint32_t *U, __m256i w0, const struct xtab *T, int g)
{
	return g < T->nwrap ? w0 : _mm256_loadu_si256((const __m256i *)(U - 1 + T->base[g]));
}

INLINE_AVX2 __m256i window8_0(const uint32_t *U, int K)
{
	return _mm256_blend_epi32(_mm256_loadu_si256((const __m256i *)(U - 1)),
	                          _mm256_set1_epi32((int)U[8 * K - 1]), 1);
}

INLINE_AVX2 __m256i states8(__m256i win, const struct xtab *T, int g)
{
	__m256i hi = _mm256_permutevar8x32_epi32(win, _mm256_loadu_si256((const __m256i *)T->hi[g]));
	__m256i lo = _mm256_permutevar8x32_epi32(win, _mm256_loadu_si256((const __m256i *)T->lo[g]));
	__m256i s = _mm256_or_si256(
		_mm256_srlv_epi32(lo, _mm256_loadu_si256((const __m256i *)T->sr[g])),
		_mm256_sllv_epi32(hi, _mm256_loadu_si256((const __m256i *)T->sl[g])));
	return _mm256_and_si256(s, _mm256_set1_epi32(0xFFFF));
}

INLINE_AVX2 __m256 round16_avx2(__m256 f)
{
	return _mm256_cvtph_ps(_mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

INLINE_AVX2 __m256 codebook8(int cb, __m256i s)
{
	if (cb == X3_CB_MUL1) {
		/* byte sum S: u8 x 1 pairs to 16 bits, then pairs to 32 bits;
		 * S·K_INV + (1024·K_INV + K_BIAS) is exact in fp32 */
		__m256i x = _mm256_mullo_epi32(s, _mm256_set1_epi32((int)X3_MUL1_MULT));
		__m256i S = _mm256_madd_epi16(_mm256_maddubs_epi16(x, _mm256_set1_epi8(1)),
		                              _mm256_set1_epi16(1));
		return round16_avx2(_mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(MUL1_KINV),
		                                    _mm256_set1_ps(MUL1_C0)));
	}
	__m256i x = _mm256_mullo_epi32(s, _mm256_set1_epi32(
		(int)(cb == X3_CB_MCG ? X3_MCG_MULT : INST3_MULT)));
	if (cb == X3_CB_3INST)
		x = _mm256_add_epi32(x, _mm256_set1_epi32((int)INST3_ADD));
	x = _mm256_xor_si256(_mm256_and_si256(x, _mm256_set1_epi32((int)0x8FFF8FFFu)),
	                     _mm256_set1_epi32(0x3B603B60));
	const __m256i bias = _mm256_set1_epi32(0x38000000);   /* (127-15) << 23 */
	__m256i lo = _mm256_or_si256(
		_mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x8000)), 16),
		_mm256_add_epi32(_mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFF)), 13), bias));
	__m256i hi = _mm256_or_si256(
		_mm256_and_si256(x, _mm256_set1_epi32((int)0x80000000u)),
		_mm256_add_epi32(_mm256_srli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFF0000)), 3), bias));
	return round16_avx2(_mm256_add_ps(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi)));
}

INLINE_AVX2 void gemv_avx2_cb(const struct x3_exl3 *e, int cb, const float *xq,
                              float *yh, const struct xtab *T, int64_t nb0, int64_t nb1)
{
	int64_t ntk = e->k / 16;
	int K = e->K;
	for (int64_t nb = nb0; nb < nb1; nb++) {
		__m256 acc[8];
		for (int c = 0; c < 8; c++)
			acc[c] = _mm256_setzero_ps();
		for (int64_t kb = 0; kb < ntk; kb++) {
			if (kb + 4 < ntk) {
				const char *pf = (const char *)tile_u32(e, kb + 4, nb);
				for (int o = 0; o < 32 * K; o += 64)
					_mm_prefetch(pf + o, _MM_HINT_T0);
			}
			const uint32_t *U = tile_u32(e, kb, nb);
			__m256i w0 = window8_0(U, K);
			const float *xp = xq + kb * 32;
			__m256 x0 = _mm256_loadu_ps(xp), x1 = _mm256_loadu_ps(xp + 8);
			__m256 x2 = _mm256_loadu_ps(xp + 16), x3 = _mm256_loadu_ps(xp + 24);
#define DQ8(g) codebook8(cb, states8(window8(U, w0, T, (g)), T, (g)))
#pragma GCC unroll 8
			for (int c = 0; c < 8; c++) {
				__m256 a = acc[c];
				a = _mm256_fmadd_ps(DQ8(4 * c + 0), x0, a);
				a = _mm256_fmadd_ps(DQ8(4 * c + 1), x1, a);
				a = _mm256_fmadd_ps(DQ8(4 * c + 2), x2, a);
				a = _mm256_fmadd_ps(DQ8(4 * c + 3), x3, a);
				acc[c] = a;
			}
		}
		float s[8][8];
		for (int c = 0; c < 8; c++)
			_mm256_storeu_ps(s[c], acc[c]);
		float *y = yh + 16 * nb;
		for (int c = 0; c < 8; c++) {
			y[c] = (s[c][0] + s[c][1]) + (s[c][2] + s[c][3]);
			y[c + 8] = (s[c][4] + s[c][5]) + (s[c][6] + s[c][7]);
		}
	}
}

T_AVX2 static void gemv_avx2(const struct x3_exl3 *e, const float *xq, float *yh,
                             const struct xtab *T, int64_t nb0, int64_t nb1)
{
	switch (e->cb) {
	case X3_CB_3INST: gemv_avx2_cb(e, X3_CB_3INST, xq, yh, T, nb0, nb1); break;
	case X3_CB_MCG: gemv_avx2_cb(e, X3_CB_MCG, xq, yh, T, nb0, nb1); break;
	default: gemv_avx2_cb(e, X3_CB_MUL1, xq, yh, T, nb0, nb1); break;
	}
}

/* 2..GEMV_ROWS rows: the same decode, once per tile, and per row the FMAs
 * of the one-row kernel into accumulators kept in L1 (8 vectors a row).
 * xq is (nr, k/16, 32), yh is (nr, n). */
#define GEMV_ROWS 4   /* above, the GEMM kernel measured faster */
INLINE_AVX2 void gemvm_avx2_cb(const struct x3_exl3 *e, int cb, const float *xq, int nr,
                               float *yh, const struct xtab *T, int64_t nb0, int64_t nb1)
{
	int64_t ntk = e->k / 16;
	int K = e->K;
	__m256 acc[GEMV_ROWS * 8];
	for (int64_t nb = nb0; nb < nb1; nb++) {
		for (int i = 0; i < nr * 8; i++)
			acc[i] = _mm256_setzero_ps();
		for (int64_t kb = 0; kb < ntk; kb++) {
			const uint32_t *U = tile_u32(e, kb, nb);
			__m256i w0 = window8_0(U, K);
			for (int c = 0; c < 8; c++) {
				__m256 v0 = DQ8(4 * c), v1 = DQ8(4 * c + 1);
				__m256 v2 = DQ8(4 * c + 2), v3 = DQ8(4 * c + 3);
				for (int m = 0; m < nr; m++) {
					const float *xp = xq + (m * ntk + kb) * 32;
					__m256 a = acc[m * 8 + c];
					a = _mm256_fmadd_ps(v0, _mm256_loadu_ps(xp), a);
					a = _mm256_fmadd_ps(v1, _mm256_loadu_ps(xp + 8), a);
					a = _mm256_fmadd_ps(v2, _mm256_loadu_ps(xp + 16), a);
					a = _mm256_fmadd_ps(v3, _mm256_loadu_ps(xp + 24), a);
					acc[m * 8 + c] = a;
				}
			}
		}
		for (int m = 0; m < nr; m++) {
			float s[8][8];
			for (int c = 0; c < 8; c++)
				_mm256_storeu_ps(s[c], acc[m * 8 + c]);
			float *y = yh + m * e->n + 16 * nb;
			for (int c = 0; c < 8; c++) {
				y[c] = (s[c][0] + s[c][1]) + (s[c][2] + s[c][3]);
				y[c + 8] = (s[c][4] + s[c][5]) + (s[c][6] + s[c][7]);
			}
		}
	}
}

T_AVX2 static void gemvm_avx2(const struct x3_exl3 *e, const float *xq, int nr, float *yh,
                              const struct xtab *T, int64_t nb0, int64_t nb1)
{
	switch (e->cb) {
	case X3_CB_3INST: gemvm_avx2_cb(e, X3_CB_3INST, xq, nr, yh, T, nb0, nb1); break;
	case X3_CB_MCG: gemvm_avx2_cb(e, X3_CB_MCG, xq, nr, yh, T, nb0, nb1); break;
	default: gemvm_avx2_cb(e, X3_CB_MUL1, xq, nr, yh, T, nb0, nb1); break;
	}
}

/* Row offsets within a 32-position column slab: trellis index of (r, c) is
 * 32(c%8) + 4(c/8) + off[r] (exl3(5) §4.2 inverse). */
#define OFF_LIST 0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27

/* X'ᵀ chunks: xt is (nch, k, W): row-chunk ch, input channel i, lane m. */
#define NBLK 4   /* column tiles per block: X'ᵀ rows loaded once for 4 tiles */

INLINE_AVX2 void gemm_avx2_cb(const struct x3_exl3 *e, int cb, const float *xt,
                              int64_t nch, float *yt, const struct xtab *T,
                              int64_t nb0, int64_t nb1)
{
	int64_t ntk = e->k / 16;
	static const int off[16] = { OFF_LIST };
	for (int64_t nbb = nb0; nbb < nb1; nbb += NBLK) {
		float v[NBLK][256] __attribute__((aligned(64)));
		for (int64_t kb = 0; kb < ntk; kb++) {
			for (int u = 0; u < NBLK; u++) {
				const uint32_t *U = tile_u32(e, kb, nbb + u);
				__m256i w0 = window8_0(U, e->K);
				for (int g = 0; g < 32; g++)
					_mm256_store_ps(v[u] + 8 * g, DQ8(g));
			}
			for (int64_t ch = 0; ch < nch; ch++) {
				const float *xp = xt + (ch * e->k + 16 * kb) * 8;
				__m256 x[16];
#pragma GCC unroll 16
				for (int r = 0; r < 16; r++)
					x[r] = _mm256_load_ps(xp + 8 * r);
				for (int u = 0; u < NBLK; u++) {
					float *y = yt + (ch * e->n + 16 * (nbb + u)) * 8;
					for (int c = 0; c < 8; c++) {
						const float *vc = v[u] + 32 * c;
						__m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
#pragma GCC unroll 8
						for (int r = 0; r < 16; r += 2) {
							a0 = _mm256_fmadd_ps(x[r], _mm256_broadcast_ss(vc + off[r]), a0);
							b0 = _mm256_fmadd_ps(x[r], _mm256_broadcast_ss(vc + 4 + off[r]), b0);
							a1 = _mm256_fmadd_ps(x[r + 1], _mm256_broadcast_ss(vc + off[r + 1]), a1);
							b1 = _mm256_fmadd_ps(x[r + 1], _mm256_broadcast_ss(vc + 4 + off[r + 1]), b1);
						}
						float *ya = y + 8 * c, *yb = y + 8 * (c + 8);
						_mm256_store_ps(ya, _mm256_add_ps(_mm256_load_ps(ya), _mm256_add_ps(a0, a1)));
						_mm256_store_ps(yb, _mm256_add_ps(_mm256_load_ps(yb), _mm256_add_ps(b0, b1)));
					}
				}
			}
		}
	}
}

T_AVX2 static void gemm_avx2(const struct x3_exl3 *e, const float *xt, int64_t nch,
                             float *yt, const struct xtab *T, int64_t nb0, int64_t nb1)
{
	switch (e->cb) {
	case X3_CB_3INST: gemm_avx2_cb(e, X3_CB_3INST, xt, nch, yt, T, nb0, nb1); break;
	case X3_CB_MCG: gemm_avx2_cb(e, X3_CB_MCG, xt, nch, yt, T, nb0, nb1); break;
	default: gemm_avx2_cb(e, X3_CB_MUL1, xt, nch, yt, T, nb0, nb1); break;
	}
}

/* ---- AVX-512 (16 states per group) ----------------------------------- */
#define T_AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
#define INLINE_AVX512 static inline __attribute__((always_inline, target("avx512f,avx512bw,avx2,fma,f16c")))

INLINE_AVX512 __m512i window16(const uint32_t *U, __m512i w0, const struct xtab *T, int g)
{
	return g < T->nwrap ? w0 : _mm512_loadu_si512((const void *)(U - 1 + T->base[g]));
}

INLINE_AVX512 __m512i window16_0(const uint32_t *U, int K)
{
	return _mm512_mask_set1_epi32(_mm512_loadu_si512((const void *)(U - 1)), 1,
	                              (int)U[8 * K - 1]);
}

INLINE_AVX512 __m512i states16(__m512i win, const struct xtab *T, int g)
{
	__m512i hi = _mm512_permutexvar_epi32(_mm512_loadu_si512((const void *)T->hi[g]), win);
	__m512i lo = _mm512_permutexvar_epi32(_mm512_loadu_si512((const void *)T->lo[g]), win);
	__m512i s = _mm512_or_si512(
		_mm512_srlv_epi32(lo, _mm512_loadu_si512((const void *)T->sr[g])),
		_mm512_sllv_epi32(hi, _mm512_loadu_si512((const void *)T->sl[g])));
	return _mm512_and_si512(s, _mm512_set1_epi32(0xFFFF));
}

INLINE_AVX512 __m512 round16_avx512(__m512 f)
{
	return _mm512_cvtph_ps(_mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

INLINE_AVX512 __m512 codebook16(int cb, __m512i s)
{
	if (cb == X3_CB_MUL1) {
		__m512i x = _mm512_mullo_epi32(s, _mm512_set1_epi32((int)X3_MUL1_MULT));
		__m512i S = _mm512_madd_epi16(_mm512_maddubs_epi16(x, _mm512_set1_epi8(1)),
		                              _mm512_set1_epi16(1));
		return round16_avx512(_mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_set1_ps(MUL1_KINV),
		                                      _mm512_set1_ps(MUL1_C0)));
	}
	__m512i x = _mm512_mullo_epi32(s, _mm512_set1_epi32(
		(int)(cb == X3_CB_MCG ? X3_MCG_MULT : INST3_MULT)));
	if (cb == X3_CB_3INST)
		x = _mm512_add_epi32(x, _mm512_set1_epi32((int)INST3_ADD));
	/* (x & 0x8FFF8FFF) ^ 0x3B603B60: ternary logic imm = (A & B) ^ C = 0x6A */
	x = _mm512_ternarylogic_epi32(x, _mm512_set1_epi32((int)0x8FFF8FFFu),
	                              _mm512_set1_epi32(0x3B603B60), 0x6A);
	/* fp32 bits of each half h: sign to bit 31, exponent and mantissa
	 * (h & 0x7FFF) << 13, exponent rebias +112 << 23 = 0x38000000, which
	 * is an OR because the half exponent is 12..15 (bit 4 clear).
	 * sel(m, a, b) = (a & m) | (b & ~m) is ternary logic 0xCA with m first. */
	const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
	const __m512i mbits = _mm512_set1_epi32(0x0FFFE000), bias = _mm512_set1_epi32(0x38000000);
	/* (b & m) | c: imm 0xEA with (b, m, c) */
	__m512i lo = _mm512_ternarylogic_epi32(_mm512_slli_epi32(x, 13), mbits, bias, 0xEA);
	lo = _mm512_ternarylogic_epi32(sign, _mm512_slli_epi32(x, 16), lo, 0xCA);
	__m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi32(x, 3), mbits, bias, 0xEA);
	hi = _mm512_ternarylogic_epi32(sign, x, hi, 0xCA);
	return round16_avx512(_mm512_add_ps(_mm512_castsi512_ps(lo), _mm512_castsi512_ps(hi)));
}

INLINE_AVX512 void gemv_avx512_cb(const struct x3_exl3 *e, int cb, const float *xq,
                                  float *yh, const struct xtab *T, int64_t nb0, int64_t nb1)
{
	int64_t ntk = e->k / 16;
	int K = e->K;
	for (int64_t nb = nb0; nb < nb1; nb++) {
		__m512 acc[8];
		for (int c = 0; c < 8; c++)
			acc[c] = _mm512_setzero_ps();
		for (int64_t kb = 0; kb < ntk; kb++) {
			if (kb + 4 < ntk) {
				const char *pf = (const char *)tile_u32(e, kb + 4, nb);
				for (int o = 0; o < 32 * K; o += 64)
					_mm_prefetch(pf + o, _MM_HINT_T0);
			}
			const uint32_t *U = tile_u32(e, kb, nb);
			__m512i w0 = window16_0(U, K);
			/* group p = lanes 2p, 2p+1: q = t%4 = 2(p&1) + lane/8 */
			const float *xp = xq + kb * 32;
			__m512 x0 = _mm512_loadu_ps(xp), x1 = _mm512_loadu_ps(xp + 16);
#define DQ16(g) codebook16(cb, states16(window16(U, w0, T, (g)), T, (g)))
#pragma GCC unroll 8
			for (int c = 0; c < 8; c++) {
				__m512 a = acc[c];
				a = _mm512_fmadd_ps(DQ16(2 * c), x0, a);
				a = _mm512_fmadd_ps(DQ16(2 * c + 1), x1, a);
				acc[c] = a;
			}
		}
		float s[8][16];
		for (int c = 0; c < 8; c++)
			_mm512_storeu_ps(s[c], acc[c]);
		float *y = yh + 16 * nb;
		for (int c = 0; c < 8; c++) {
			y[c] = ((s[c][0] + s[c][1]) + (s[c][2] + s[c][3])) +
			       ((s[c][8] + s[c][9]) + (s[c][10] + s[c][11]));
			y[c + 8] = ((s[c][4] + s[c][5]) + (s[c][6] + s[c][7])) +
			           ((s[c][12] + s[c][13]) + (s[c][14] + s[c][15]));
		}
	}
}

T_AVX512 static void gemv_avx512(const struct x3_exl3 *e, const float *xq, float *yh,
                                 const struct xtab *T, int64_t nb0, int64_t nb1)
{
	switch (e->cb) {
	case X3_CB_3INST: gemv_avx512_cb(e, X3_CB_3INST, xq, yh, T, nb0, nb1); break;
	case X3_CB_MCG: gemv_avx512_cb(e, X3_CB_MCG, xq, yh, T, nb0, nb1); break;
	default: gemv_avx512_cb(e, X3_CB_MUL1, xq, yh, T, nb0, nb1); break;
	}
}

INLINE_AVX512 void gemvm_avx512_cb(const struct x3_exl3 *e, int cb, const float *xq, int nr,
                                   float *yh, const struct xtab *T, int64_t nb0, int64_t nb1)
{
	int64_t ntk = e->k / 16;
	int K = e->K;
	__m512 acc[GEMV_ROWS * 8];
	for (int64_t nb = nb0; nb < nb1; nb++) {
		for (int i = 0; i < nr * 8; i++)
			acc[i] = _mm512_setzero_ps();
		for (int64_t kb = 0; kb < ntk; kb++) {
			const uint32_t *U = tile_u32(e, kb, nb);
			__m512i w0 = window16_0(U, K);
#pragma GCC unroll 8
			for (int c = 0; c < 8; c++) {
				__m512 v0 = DQ16(2 * c), v1 = DQ16(2 * c + 1);
				for (int m = 0; m < nr; m++) {
					const float *xp = xq + (m * ntk + kb) * 32;
					__m512 a = acc[m * 8 + c];
					a = _mm512_fmadd_ps(v0, _mm512_loadu_ps(xp), a);
					a = _mm512_fmadd_ps(v1, _mm512_loadu_ps(xp + 16), a);
					acc[m * 8 + c] = a;
				}
			}
		}
		for (int m = 0; m < nr; m++) {
			float s[8][16];
			for (int c = 0; c < 8; c++)
				_mm512_storeu_ps(s[c], acc[m * 8 + c]);
			float *y = yh + m * e->n + 16 * nb;
			for (int c = 0; c < 8; c++) {
				y[c] = ((s[c][0] + s[c][1]) + (s[c][2] + s[c][3])) +
				       ((s[c][8] + s[c][9]) + (s[c][10] + s[c][11]));
				y[c + 8] = ((s[c][4] + s[c][5]) + (s[c][6] + s[c][7])) +
				           ((s[c][12] + s[c][13]) + (s[c][14] + s[c][15]));
			}
		}
	}
}

T_AVX512 static void gemvm_avx512(const struct x3_exl3 *e, const float *xq, int nr, float *yh,
                                  const struct xtab *T, int64_t nb0, int64_t nb1)
{
	switch (e->cb) {
	case X3_CB_3INST: gemvm_avx512_cb(e, X3_CB_3INST, xq, nr, yh, T, nb0, nb1); break;
	case X3_CB_MCG: gemvm_avx512_cb(e, X3_CB_MCG, xq, nr, yh, T, nb0, nb1); break;
	default: gemvm_avx512_cb(e, X3_CB_MUL1, xq, nr, yh, T, nb0, nb1); break;
	}
}

INLINE_AVX512 void gemm_avx512_cb(const struct x3_exl3 *e, int cb, const float *xt,
                                  int64_t nch, float *yt, const struct xtab *T,
                                  int64_t nb0, int64_t nb1)
{
	int64_t ntk = e->k / 16;
	static const int off[16] = { OFF_LIST };
	for (int64_t nbb = nb0; nbb < nb1; nbb += NBLK) {
		float v[NBLK][256] __attribute__((aligned(64)));
		for (int64_t kb = 0; kb < ntk; kb++) {
			for (int u = 0; u < NBLK; u++) {
				const uint32_t *U = tile_u32(e, kb, nbb + u);
				__m512i w0 = window16_0(U, e->K);
				for (int g = 0; g < 16; g++)
					_mm512_store_ps(v[u] + 16 * g, DQ16(g));
			}
			for (int64_t ch = 0; ch < nch; ch++) {
				const float *xp = xt + (ch * e->k + 16 * kb) * 16;
				__m512 x[16];
#pragma GCC unroll 16
				for (int r = 0; r < 16; r++)
					x[r] = _mm512_load_ps(xp + 16 * r);
				for (int u = 0; u < NBLK; u++) {
					float *y = yt + (ch * e->n + 16 * (nbb + u)) * 16;
#pragma GCC unroll 4
					for (int c = 0; c < 8; c++) {
						const float *vc = v[u] + 32 * c;
						__m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
#pragma GCC unroll 8
						for (int r = 0; r < 16; r += 2) {
							a0 = _mm512_fmadd_ps(x[r], _mm512_set1_ps(vc[off[r]]), a0);
							b0 = _mm512_fmadd_ps(x[r], _mm512_set1_ps(vc[4 + off[r]]), b0);
							a1 = _mm512_fmadd_ps(x[r + 1], _mm512_set1_ps(vc[off[r + 1]]), a1);
							b1 = _mm512_fmadd_ps(x[r + 1], _mm512_set1_ps(vc[4 + off[r + 1]]), b1);
						}
						float *ya = y + 16 * c, *yb = y + 16 * (c + 8);
						_mm512_store_ps(ya, _mm512_add_ps(_mm512_load_ps(ya), _mm512_add_ps(a0, a1)));
						_mm512_store_ps(yb, _mm512_add_ps(_mm512_load_ps(yb), _mm512_add_ps(b0, b1)));
					}
				}
			}
		}
	}
}

T_AVX512 static void gemm_avx512(const struct x3_exl3 *e, const float *xt, int64_t nch,
                                 float *yt, const struct xtab *T, int64_t nb0, int64_t nb1)
{
	switch (e->cb) {
	case X3_CB_3INST: gemm_avx512_cb(e, X3_CB_3INST, xt, nch, yt, T, nb0, nb1); break;
	case X3_CB_MCG: gemm_avx512_cb(e, X3_CB_MCG, xt, nch, yt, T, nb0, nb1); break;
	default: gemm_avx512_cb(e, X3_CB_MUL1, xt, nch, yt, T, nb0, nb1); break;
	}
}
#endif /* X3_HAVE_X86 */

#ifdef X3_HAVE_X86
/* Work units of UNIT column tiles, handed out dynamically: a thread that
 * the OS starts late (a busy machine) finds less left to do instead of
 * holding the others up with a fixed share. Each tile column is computed
 * by one thread in a fixed order, so results do not depend on the split.
 * (OpenMP regions stay outside the target-attributed kernels: clang does
 * not carry the target attribute into outlined parallel regions.) */
#define UNIT 8
#define ROWBLK 256   /* rows per GEMM pass */
#endif

int x3__exl3_mm_fast(const struct x3_exl3 *e, const float *xh, int64_t rows,
                     float *yh, int threads)
{
	if (threads <= 0)
		threads = omp_get_max_threads();
	/* below ~1M weight decodes a fork/join costs more than it saves */
	if (e->k * e->n * ((rows + 15) / 16) < ((int64_t)1 << 20))
		threads = 1;
	int isa = isa_get();
	if (isa == ISA_SCALAR) {
		mm_scalar(e, xh, rows, yh, threads);
		return X3_OK;
	}
#ifdef X3_HAVE_X86
	int W = isa == ISA_AVX512 ? 16 : 8;
	struct xtab *T = aligned_alloc(64, (sizeof *T + 63) / 64 * 64);
	if (!T)
		return x3_err(X3_ENOMEM, "tensor '%s': out of memory", e->key);
	xtab_init(T, e->K, W);
	int64_t k = e->k, n = e->n;
	int rc = X3_OK;
	if (rows <= GEMV_ROWS) {
		/* xq[m][kb][q][j]: x'[m][16kb + 2q + {0,1,8,9}[j%4]] (exl3(5) §4.2, lane t%4 = q) */
		float *xq = aligned_alloc(64, (size_t)rows * (size_t)k * 2 * sizeof *xq);
		if (!xq) {
			rc = x3_err(X3_ENOMEM, "tensor '%s': out of memory", e->key);
			goto out;
		}
		static const int rj[4] = { 0, 1, 8, 9 };
		for (int64_t m = 0; m < rows; m++)
			for (int64_t kb = 0; kb < k / 16; kb++)
				for (int q = 0; q < 4; q++)
					for (int j = 0; j < 8; j++)
						xq[(m * (k / 16) + kb) * 32 + q * 8 + j] =
							xh[m * k + 16 * kb + 2 * q + rj[j % 4]];
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
		for (int64_t u = 0; u < n / 16 / UNIT; u++) {
			int64_t nb0 = u * UNIT, nb1 = nb0 + UNIT;
			if (rows == 1 && isa == ISA_AVX512)
				gemv_avx512(e, xq, yh, T, nb0, nb1);
			else if (rows == 1)
				gemv_avx2(e, xq, yh, T, nb0, nb1);
			else if (isa == ISA_AVX512)
				gemvm_avx512(e, xq, (int)rows, yh, T, nb0, nb1);
			else
				gemvm_avx2(e, xq, (int)rows, yh, T, nb0, nb1);
		}
		free(xq);
	} else {
		/* rows in blocks of ROWBLK: bounded buffers; the tiles are decoded
		 * once per block, which is noise next to ROWBLK rows of FMAs */
		int64_t rb = rows < ROWBLK ? rows : ROWBLK;
		int64_t nchmax = (rb + W - 1) / W;
		float *xt = aligned_alloc(64, (size_t)nchmax * (size_t)k * (size_t)W * sizeof *xt);
		float *yt = aligned_alloc(64, (size_t)nchmax * (size_t)n * (size_t)W * sizeof *yt);
		if (!xt || !yt) {
			free(xt);
			free(yt);
			rc = x3_err(X3_ENOMEM, "tensor '%s': out of memory", e->key);
			goto out;
		}
		for (int64_t r0 = 0; r0 < rows; r0 += ROWBLK) {
			int64_t nr = rows - r0 < ROWBLK ? rows - r0 : ROWBLK;
			int64_t nch = (nr + W - 1) / W;
			const float *xb = xh + r0 * k;
			for (int64_t ch = 0; ch < nch; ch++)
				for (int64_t i = 0; i < k; i++)
					for (int m = 0; m < W; m++) {
						int64_t row = ch * W + m;
						xt[(ch * k + i) * W + m] = row < nr ? xb[row * k + i] : 0.0f;
					}
			memset(yt, 0, (size_t)nch * (size_t)n * (size_t)W * sizeof *yt);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
			for (int64_t u = 0; u < n / 16 / UNIT; u++) {
				int64_t nb0 = u * UNIT, nb1 = nb0 + UNIT;   /* a multiple of NBLK */
				if (isa == ISA_AVX512)
					gemm_avx512(e, xt, nch, yt, T, nb0, nb1);
				else
					gemm_avx2(e, xt, nch, yt, T, nb0, nb1);
			}
			float *yb = yh + r0 * n;
			for (int64_t row = 0; row < nr; row++) {
				int64_t ch = row / W, m = row % W;
				for (int64_t j = 0; j < n; j++)
					yb[row * n + j] = yt[(ch * n + j) * W + m];
			}
		}
		free(xt);
		free(yt);
	}
out:
	free(T);
	return rc;
#else
	return x3_err(X3_EUNSUP, "no SIMD path in this build");
#endif
}
