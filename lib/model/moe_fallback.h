/* moe_fallback.h: the Hessians of a mixture-of-experts layer's experts
 * (hessian-capture --moe-capture, --min-tokens) and their metadata.
 *
 * An expert group's Hessian (one input of an expert's linears) sums the rows
 * the router sends to the expert (routed), the same rows scaled by their
 * routing weight w (weighted: H = Σ w² xᵀx, the weight the expert's error
 * has in the block's output), or every token's (all, as ExLlamaV3). An
 * expert routed n < m tokens (m = --min-tokens) gets the fallback, the
 * all-token Hessian H_all of the layer's first chunk (T rows) blended in:
 *   H = H_routed + s (m - n)/T · H_all,   count m,
 * the mean of its n routed rows and of m - n rows of the all-token mean;
 * s = 1 (routed) or, weighted, the expert's mean w², Σw²/n (1/k² with no
 * rows: an even split of the top k). An expert with no rows and no
 * all-token Hessian is an error.
 *
 * A group's frame carries capture (routed|weighted|all), expert,
 * routed_tokens and expert_fallback (1 or 0) with fallback_tokens (m - n)
 * when used. A part (hessian-capture --part) writes its raw routed sums
 * instead, with routed_w2 (Σ w², C99 hex: exact), min_tokens, top_k and
 * all_tokens (the all-token Hessian's name); the merge adds the parts'
 * sums and metadata and blends then, with the same bits as one process. */
#ifndef X3_MOE_FALLBACK_H
#define X3_MOE_FALLBACK_H

#include "x3.h"
#include "hessian.h"

enum { X3_MOE_ROUTED, X3_MOE_WEIGHTED, X3_MOE_ALL, X3_MOE_NCAPTURE };
/* the metadata only a part's groups carry: routed_w2, min_tokens, top_k,
 * all_tokens */
enum { X3_MOE_NPART_KEYS = 4 };
extern const char *const x3_moe_part_keys[X3_MOE_NPART_KEYS];
/* "routed", "weighted", "all"; NULL out of range */
const char *x3_moe_capture_name(int mode);
/* X3_MOE_* of a name, or -1 */
int x3_moe_capture_parse(const char *s);

/* Weighted capture: H += Σ_r (w_r x_r)ᵀ(w_r x_r) over x (rows, n) and
 * routing weights w (rows), and *w2 += Σ w_r² (summed in double in row
 * order). */
int x3_moe_add_weighted(x3_hess *h, const float *x, const float *w, int64_t rows, int64_t n,
                        double *w2);

/* The fallback of group h routed n < m tokens (weighted: Σ w² = w2 over
 * them), from all-token Hessian all (NULL: none), taken at the output's
 * precision (F64 if f64, else F32) as a frame: *fallback = m - n, or 0
 * without an all-token Hessian. Errors name the group. */
int x3_moe_blend(x3_hess *h, const x3_hess *all, int expert, int64_t n, int64_t m, int weighted,
                 double w2, int64_t top_k, int f64, int64_t *fallback);

/* An expert group at the end of its layer (or of a part's layer) */
struct x3_moe_group {
	int expert;
	int64_t routed;   /* rows the router sent to it */
	double w2;        /* Σ w² over them (weighted) */
};

/* Finish group h of expert g with all-token Hessian all (may be NULL
 * where the mode does not need it): capture all adds all to h (its sum at
 * F64 if f64 or part, else F32); routed and weighted blend below m, but
 * in a part (part non-zero), whose raw sums the merge blends; then the
 * metadata above. *fallback: the fallback rows (0: none). */
int x3_moe_group_finish(x3_hess *h, const x3_hess *all, const struct x3_moe_group *g, int mode,
                        int64_t m, int64_t top_k, int f64, int part, int64_t *fallback);

/* Merge: the first of the capture's options that an expert group's part
 * frames carry (capture, min_tokens, top_k) on which part frames a and b
 * differ, or NULL: the parts of one capture agree on them all. */
const char *x3_moe_part_differs(const x3_tensor *a, const x3_tensor *b);

/* Merge: add the expert metadata of part frame t into h (the group's
 * merged sum so far): routed_tokens, fallback_tokens and routed_w2 add
 * up, expert_fallback is 1 when a part's is. */
int x3_moe_merge_meta(x3_hess *h, const x3_tensor *t);

/* Merge: the fallback of group h once every part's sums are in, from
 * all-token Hessian all (the frame named all_name that part 0 carried;
 * all_name NULL: the group names none), as x3_moe_group_finish makes it
 * in one process, and its expert_fallback metadata. A group without
 * min_tokens (not a part's expert group) is left as it is, *fallback -1.
 * g gets the expert and its routed tokens, *m the threshold. */
int x3_moe_merged_blend(x3_hess *h, const char *all_name, const x3_hess *all, int f64,
                        struct x3_moe_group *g, int64_t *m, int64_t *fallback);

#endif
