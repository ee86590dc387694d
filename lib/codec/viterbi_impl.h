/* viterbi_impl.h: what the Viterbi encoder's files share (viterbi.c, the
 * driver and the reference; viterbi_scalar.c, viterbi_avx2.c and
 * viterbi_avx512.c, the kernels of each instruction set): the tuning
 * constants, the layouts, the kernels' argument structs and the table of
 * kernels an instruction set offers for a K. viterbi.c describes the
 * scheme. */
#ifndef X3_VITERBI_IMPL_H
#define X3_VITERBI_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#define X3_X86 1
#endif

#define VIT_INLINE static inline __attribute__((always_inline))

/* Tuning constants: per K, the fastest of paths that give the same bits
 * (measured on the build host, AVX-512, and on Zen 3, AVX2; the
 * alternatives measured and their numbers are in exl3(5) §9.6). */
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
	/* run_pass stages the masks in L1 for K <= this (K = 3: 5% slower) */
	STAGE_MAX_K = 2,
	/* AVX-512 masks mode: two tiles in lock step for K <= this (faster) */
	PAIR_MASKS_MAX_K = 2,
	/* AVX2 recompute mode: two tiles in lock step at every K */
	PAIR_HIST2 = 1,
	/* AVX-512 and the portable path: recompute mode from K = HIST_K on */
	HIST_K = 4,
};
/* edges per block of the fused step pair; the mid scratch holds FUSE_MAX */
#define FUSE_B(K) ((K) <= FUSE_B_SMALL_MAX_K ? FUSE_B_SMALL : FUSE_MAX)
#define FUSE_MAX 1024
#define PAD 16             /* floats past the end of a cost buffer */
#define IP_N 8                        /* chunk index bits */
#define IP_C(K) (1 << (8 - (K)))      /* floats per chunk: 2^(16-K) / 2^IP_N */
#define IP_B(K) (IP_C(K) << 2 * (K))  /* block: 512 at K = 1, 1024 at K = 2 */
/* tbr_body's bound on the costs it recomputes: NK^S <= RMAX */
#define RMAX 256

static inline unsigned rotr_n(unsigned c, int s)
{
	return s ? ((c >> s) | (c << (IP_N - s))) & ((1u << IP_N) - 1) : c;
}

/* One step's kernel call: the output groups g0 <= g < g1 (64 edges each)
 * into out[0..], the cost of predecessor edge (k << (16-2K)) | (e >> K)
 * read at pb[k*ks + (e >> K) - poff] (for a whole step pb = prev,
 * ks = 2^(16-2K), poff = 0; the fused pair points it into an L1 scratch),
 * masks to bp (NULL: none). */
struct vit_step {
	const float *cbo;   /* the codebook in the step's consumption order */
	float w;            /* the target of the position */
	const float *pb;
	size_t ks;
	int poff;
	float *out;
	uint16_t *bp;
	int g0, g1;
};

/* A pair of steps (positions p and p + 1) for one tile ([0]) or two tiles
 * in lock step ([0] and [1]; a one-tile call fills [1] as [0]). */
struct vit_pair {
	const float *cbo;
	int T;                   /* tiles: 1 or 2 */
	float w0[2], w1[2];      /* targets at p and p + 1 */
	float *prev[2];          /* costs entering p (in place: and leaving p + 1) */
	float *next[2];          /* costs leaving p + 1 (not in place) */
	float *mid[2];           /* L1 scratch of the intermediate costs */
	uint16_t *bp0[2], *bp1[2];   /* masks of p and p + 1, or NULL */
	int m;                   /* in place: the pair's index in the pass */
};

typedef void (*vit_step_fn)(int K, const struct vit_step *s);
/* fused pairs of steps with masks, in-place pairs, two tiles' steps in
 * recompute mode (step2: w0, prev, next of each tile, one step) */
typedef void (*vit_pair_fn)(int K, const struct vit_pair *a);
/* k of the winner at (p, e): cbt = the codebook by edge, cbt[e * NK + k]
 * = cb[(k << (16-K)) | e]; h = costs entering position p. */
typedef int (*vit_tb_fn)(int K, const float *cbt, const float *h, float w, int e);
/* the same where the costs entering p were not kept (tbr_body) */
typedef int (*vit_tbr_fn)(int K, int S, const float *cbt, const float *hist, size_t hs,
                          const float *x, int p, int e);

/* The kernels of one instruction set at one K, filled by the portable
 * path's x3_vit_kernels_scalar and then by the instruction set's own. */
struct vit_kernels {
	int lb;              /* codebook and masks in layout B */
	int S;               /* recompute mode: costs kept every S-th position; 0: masks */
	int stage;           /* run_pass stages the masks (kernels that do not send
	                      * them out themselves) */
	vit_step_fn step;
	vit_tb_fn tb;
	vit_tbr_fn tbr;
	vit_pair_fn fused;   /* one tile, masks mode; NULL: two_steps on step */
	vit_pair_fn fusedip; /* in place, one or two tiles; NULL: none */
	vit_pair_fn step2;   /* two tiles, recompute mode; NULL: none */
	vit_pair_fn fused2;  /* two tiles, masks mode; NULL: none */
};

void x3_vit_kernels_scalar(int K, struct vit_kernels *k);
#ifdef X3_X86
void x3_vit_kernels_avx2(int K, struct vit_kernels *k);
void x3_vit_kernels_avx512(int K, struct vit_kernels *k);
#endif

/* The trace-back's recomputation, shared by the portable and the AVX2
 * paths (inlined into each, where fmaf is a libm call or an instruction):
 * the strict-< argmin over the 2^K candidates of edge e at position p
 * from the costs entering it, h[(k << (16-2K)) | (e >> K)]. */
VIT_INLINE int tb_body(int K, const float *cbt, const float *h, float w, int e)
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

/* The same where the costs entering p were not kept (p % S != 0): they
 * are recomputed from the kept position below, p - r with r = p % S, but
 * only where the argmin needs them: the NK costs entering p that the edge
 * e's candidates read, the NK^2 entering p - 1 that those read, ..., NK^(r+1)
 * at p - r, read from hist. Each recomputed cost is the minimum of the
 * same fmaf values the step computed (a minimum is the same value in any
 * order: costs are never NaN or -0), so the back-pointer is the one the
 * kept costs would give. NK^S <= RMAX: S is chosen so (viterbi.c). */
VIT_INLINE int tbr_body(int K, int S, const float *cbt, const float *hist, size_t hs,
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

#endif
