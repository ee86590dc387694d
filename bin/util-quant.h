/* util-quant.h: helpers of the quantizer programs (had-rotate,
 * trellis-encode), in bin/util-quant.c, linked into those two only: the
 * Hessian cache (which finalizes Hessians: quant.o, and with it LAPACK,
 * BLAS and OpenMP) and their frame output. */
#ifndef X3_BIN_UTIL_QUANT_H
#define X3_BIN_UTIL_QUANT_H

#include <stdint.h>
#include "x3.h"

struct x3_writer;
struct x3_qhess;
/* The current Hessian frame and its finalized form for one input size. */
typedef struct {
	x3_tensor *raw;
	int from_file;          /* came from --hessian FILE */
	struct x3_qhess *fin;   /* finalized for k0 inputs */
	int64_t k0;
} hess_cache;
/* Replace the current Hessian frame (takes ownership). */
void hess_cache_set(hess_cache *c, x3_tensor *t);
/* Load the first frame of FILE as the Hessian; exits on error. */
void hess_cache_load(hess_cache *c, const char *path);
/* The finalized Hessian for weight W (k0 = W's input features): the cached
 * frame's, finalized once per input size with warnings on fallback and
 * extra damping; or, without a Hessian frame, an identity Hessian with input
 * signs drawn from (seed, "<key>/su"), returned in *own for the caller to
 * free. Exits on error, naming the weight. */
struct x3_qhess *hess_cache_for(hess_cache *c, const x3_tensor *W, const char *key,
                                uint64_t seed, struct x3_qhess **own);
void hess_cache_free(hess_cache *c);
/* Write a frame "<key>.<role>" with metadata role and key (plus meta's),
 * borrowing data. Exits on error. */
void put_frame(struct x3_writer *w, const char *key, const char *role, x3_dtype dt,
               int rank, const int64_t *shape, void *data, const x3_tensor *meta);

#endif
