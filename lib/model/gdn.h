/* gdn.h: the Gated DeltaNet (linear attention) of the Qwen3-Next and
 * Qwen3.5 hybrids, from the projections' outputs to out_proj's input.
 *
 * Shapes: nk key heads of dk, nv value heads of dv (nv a multiple of nk:
 * value head h reads key head h / (nv / nk)); key_dim = nk * dk, value_dim
 * = nv * dv, conv_dim = 2 key_dim + value_dim. Per token of a row (each row
 * from position 0, a zero state):
 *   mixed (conv_dim) = [q | k | v], the split layout's in_proj_qkv output;
 *   the causal depthwise conv1d over the row (kernel kconv, weight
 *   (conv_dim, kconv), zero before the row's start), then SiLU;
 *   q, k L2-normalized per key head (x / sqrt(sum x^2 + 1e-6)), q times
 *   dk^-1/2;
 *   beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) per value head;
 *   the delta rule, S (dk, dv) per value head:
 *     S = exp(g) S;  u = beta (v - S^T k);  S = S + k u^T;  o = S^T q;
 *   the gated RMSNorm per value head: o / rms(o) * w * silu(z)   (w: a
 *   plain weight (dv), not 1 + w).
 * The output (value_dim per token) is what out_proj reads.
 *
 * Qwen3-Next fuses the projections and groups them per key head:
 * in_proj_qkvz's rows are, for each key head, [q (dk) | k (dk) | v (r dv) |
 * z (r dv)] (r = nv / nk), in_proj_ba's [b (r) | a (r)]. x3_gdn_qkvz_row /
 * x3_gdn_ba_row map a row of the split layout ([q | k | v | z], [b | a],
 * each all heads in order) to its row of the fused one.
 *
 * x3_gdn_forward is the fast form: per (row, value head) the delta rule in
 * chunks of X3_GDN_CHUNK tokens (the WY form: a chunk's updates from a
 * triangular solve, its outputs and the state after it from SGEMMs), on one
 * BLAS thread per task (blas.h's rule: a row's output depends on that row
 * and the BLAS kernel only). x3_gdn_reference is the same in double,
 * token by token: what the tests compare the fast form with. */
#ifndef X3_GDN_H
#define X3_GDN_H

#include <stdint.h>

#define X3_GDN_CHUNK 64

typedef struct x3_gdn_shape {
	int64_t nk, nv, dk, dv; /* key heads, value heads, their widths */
	int64_t kconv;          /* the conv1d's kernel (linear_conv_kernel_dim) */
	double eps;             /* the gated RMSNorm's epsilon (rms_norm_eps) */
} x3_gdn_shape;

/* The weights a layer keeps in the source precision. */
typedef struct x3_gdn_weights {
	const float *conv;      /* (conv_dim, kconv) */
	const float *a_log;     /* (nv) */
	const float *dt_bias;   /* (nv) */
	const float *norm;      /* (dv) */
} x3_gdn_weights;

int64_t x3_gdn_conv_dim(const x3_gdn_shape *s);
/* X3_EINVAL naming what is wrong when the shape is not one */
int x3_gdn_check(const x3_gdn_shape *s);

/* out (ntok, value_dim) from mixed (ntok, conv_dim), z (ntok, value_dim),
 * b and a (ntok, nv); ntok = nrows * cols. X3_OK or X3_ENOMEM. */
int x3_gdn_forward(const x3_gdn_shape *s, const x3_gdn_weights *w, const float *mixed,
                   const float *z, const float *b, const float *a, int64_t nrows, int64_t cols,
                   float *out);
/* The same in double, token by token. */
int x3_gdn_reference(const x3_gdn_shape *s, const x3_gdn_weights *w, const float *mixed,
                     const float *z, const float *b, const float *a, int64_t nrows, int64_t cols,
                     double *out);

/* The delta rule alone for one sequence of one head, q, k (T, dk) (q
 * already scaled, both normalized), v (T, dv), g, beta (T): o (T, dv).
 * The chunked float form (scratch from x3_gdn_rule_scratch floats) and
 * the double recurrence. */
int64_t x3_gdn_rule_scratch(int64_t dk, int64_t dv);
void x3_gdn_rule_chunked(const float *q, const float *k, const float *v, const float *g,
                         const float *beta, int64_t T, int64_t dk, int64_t dv, float *o,
                         float *scratch);
void x3_gdn_rule_ref(const double *q, const double *k, const double *v, const double *g,
                     const double *beta, int64_t T, int64_t dk, int64_t dv, double *o);

/* Row i of the split layout's [q | k | v | z] (2 key_dim + 2 value_dim
 * rows) is row x3_gdn_qkvz_row(s, i) of in_proj_qkvz; row i of [b | a]
 * (2 nv) is row x3_gdn_ba_row(s, i) of in_proj_ba. */
int64_t x3_gdn_qkvz_row(const x3_gdn_shape *s, int64_t i);
int64_t x3_gdn_ba_row(const x3_gdn_shape *s, int64_t i);
/* Regroup fused projection outputs qkvz (ntok, 2 key_dim + 2 value_dim)
 * and ba (ntok, 2 nv) into the split layout's mixed, z, b, a. */
void x3_gdn_unfuse(const x3_gdn_shape *s, const float *qkvz, const float *ba, int64_t ntok,
                   float *mixed, float *z, float *b, float *a);

#endif
