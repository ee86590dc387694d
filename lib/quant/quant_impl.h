/* quant_impl.h: what the quantizer's files (quant*.c) share and nothing
 * outside lib/quant/ sees: allocation helpers, the quantizer's device,
 * the tiles and their memo, and the stages' internal entry points that
 * also count the Viterbi's tiles. */
#ifndef X3_QUANT_IMPL_H
#define X3_QUANT_IMPL_H

#include <stdint.h>
#include <stdlib.h>
#include "device.h"

/* calloc and malloc of n elements of size bytes that never ask for 0 bytes
 * (so NULL always means out of memory) and refuse an n * size that
 * overflows */
static inline void *xcalloc(size_t n, size_t size)
{
	if (n == 0)
		n = 1;
	return calloc(n, size);
}

static inline void *xmalloc(size_t n, size_t size)
{
	if (n == 0)
		n = 1;
	if (size && n > SIZE_MAX / size)
		return NULL;
	return malloc(n * size);
}

/* Where the Hadamard rotations and the block LDL of x3_qhess_finalize and
 * x3_regularize run (x3_quant_set_device, quant_rotate.c): the GPU
 * backend's table, or NULL for the CPU. */
extern const x3_gpu *x3q_gpu;
/* x3_had128_rows/cols on that device */
int x3q_had_rows(float *x, int64_t rows, int64_t cols);
int x3q_had_cols(float *x, int64_t rows, int64_t cols);

/* ---- tiles (quant_tiles.c) ------------------------------------------------ */
/* tile (tr, tc) of W (k x n) in trellis order */
void x3q_get_tile(const float *W, int64_t n, int64_t tr, int64_t tc, float *t);

/* The results of distinct tiles already encoded, found by the hash of the
 * tile's 256 values (zero-initialized: empty) */
struct x3q_tmemo {
	int64_t n, cap;      /* entries, entry capacity */
	int64_t nslot;       /* hash slots, a power of 2 */
	int64_t *slot;       /* entry index, -1 when free */
	uint64_t *hash;      /* (cap) */
	float *x, *v;        /* (cap, 256) input tile, decoded values */
	uint16_t *s;         /* (cap, 256) states */
};
void x3q_tmemo_free(struct x3q_tmemo *m);

/* wall seconds of this thread's x3_viterbi_encode calls (x3_qresult.t_viterbi) */
extern _Thread_local double x3q_vit_seconds;

/* x3_viterbi_encode of nt tiles x (states and values may be NULL), each
 * distinct tile encoded once; memo keeps the results for later calls;
 * *count (may be NULL) += the tiles the Viterbi encoded */
int x3q_encode_tiles(int K, int cb, const float *x, int64_t nt, uint16_t *states,
                     float *values, int threads, struct x3q_tmemo *memo, int64_t *count);

/* ---- the stages, counting the Viterbi's tiles into *count (may be NULL) ---- */
/* x3_scale_search_cap (quant_scale.c); center > 0: the fine grid only,
 * around center; center < 0: around the scale predicted from the tiles */
int x3q_scale_search(const float *W, int64_t k, int64_t n, int K, int cb, int threads,
                     int64_t cap, double center, double *g, int64_t *count);
/* x3_ldlq (quant_ldlq.c) */
int x3q_ldlq(const float *W, int64_t k, int64_t n, const float *L, int K, int cb,
             int threads, uint16_t *states, float *Q, int64_t *count);
/* the refinement passes after LDLQ (quant_ldlq.c); *kept += the blocks
 * whose new codes were kept */
int x3q_ldlq_refine(const float *W, int64_t k, int64_t n, const float *H, int K, int cb,
                    int threads, int passes, uint16_t *states, float *Q, int64_t *count,
                    int64_t *kept);
/* The output metric M = R H R, R = Hb diag(|su|) Hb, of a rotated H (k x k)
 * (quant_refit.c); NULL when out of memory */
float *x3q_output_metric(const float *H, const float *su, int64_t k);

#endif
