/* exl3_impl.h: private to exl3.c and exl3mm.c (not installed). */
#ifndef X3_EXL3_IMPL_H
#define X3_EXL3_IMPL_H

#include "exl3.h"

struct x3_exl3 {
	char *key;
	int K, cb;
	int64_t k, n;             /* padded sizes, multiples of 128 */
	int64_t in, out;          /* original sizes */
	uint16_t *trellis;        /* (n/16, k/16, 16K) words: the stored tiles
	                           * transposed to column-major tile order, so
	                           * that walking down an output column block is
	                           * sequential; 64-byte aligned, with 64 zero
	                           * bytes before and 128 after */
	void *trellis_mem;        /* the allocation */
	float *suh;               /* (k) */
	float *svh;               /* (n) */
	float *bias;              /* (n) or NULL */
	int known;                /* X3_EXL3_*_KNOWN: in/out stated, not padded sizes */
};

/* y' = x'·W~ with tiles decoded inside the loop: xh is (rows, k), yh is
 * (rows, n), both row-major. The fast kernels of exl3mm.c. */
int x3__exl3_mm_fast(const struct x3_exl3 *e, const float *xh, int64_t rows,
                     float *yh, int threads);

#endif
