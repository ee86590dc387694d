/* hessian.h: accumulation of input Hessians H = Σ xᵀx of linear layers
 * (exl3(5) §10.2): unnormalized, with the number of rows accumulated ("count")
 * and the number dropped for holding non-finite values ("dropped").
 *
 * A Hessian frame (what hessian-capture writes) is a square F32 or F64
 * tensor (in, in), symmetric, named after the input group (e.g.
 * "model.layers.0.self_attn.input"), with string metadata
 *   role=hessian, count=<rows>, dropped=<rows>, members=<comma list of the
 *   weight tensors that read this input>, layer=<index; n_layers = head>.
 *
 * The sum is kept in double and runs over chunks of rows in a fixed order:
 * the rows of the open chunk are summed on their own (P), and a chunk that
 * ends is added to the total, H = ((P0 + P1) + P2) + ... So an H summed
 * over chunks by one process and the merge of per-chunk partial frames,
 * added in chunk order with x3_hess_add_frame, are the same bits; that is
 * what makes hessian-capture's --part runs merge into the single run. */
#ifndef X3_HESSIAN_H
#define X3_HESSIAN_H

#include "x3.h"

typedef struct x3_hess x3_hess;

/* New zero accumulator for n inputs; f64: the products of the rows in
 * double (DGEMM), else in float (SGEMM over the rows of one
 * x3_hess_add_rows call, from zero, then added in double). members may be
 * NULL; layer -1 leaves it out. */
int x3_hess_new(const char *name, int64_t n, int f64, const char *members,
                int layer, x3_hess **out);
void x3_hess_free(x3_hess *h);
const char *x3_hess_name(const x3_hess *h);
int64_t x3_hess_count(const x3_hess *h);
const char *x3_hess_members(const x3_hess *h);   /* or NULL */
int64_t x3_hess_dropped(const x3_hess *h);

/* Accumulate the rows of x3_hess_add_rows on X3_DEVICE_CUDA (the GPU
 * backend's hessian_* of device.h, cuBLAS SSYRK: equal to the CPU's SSYRK up to F32
 * rounding) or X3_DEVICE_CPU (default). F32 accumulators only; set it
 * before the first row. The device sums a chunk's rows in F32; the chunk's
 * end adds them to the host's double total. */
int x3_hess_set_device(x3_hess *h, int dev);
/* The open chunk's H += xᵀx over the rows of x (rows, n); rows holding any
 * non-finite value are skipped and counted as dropped. */
int x3_hess_add_rows(x3_hess *h, const float *x, int64_t rows, int64_t n);
/* End the open chunk: its sum is added to the total (nothing when it got no
 * rows); the next rows open a new one. */
int x3_hess_end_chunk(x3_hess *h);
/* Keep the ended chunks' total in a file of its own (made in dir and
 * unlinked at once) while a later chunk runs, instead of in memory: one
 * packed triangle in memory instead of two from the second chunk on, for
 * a read and a write of the total at each chunk's end. Same bits. A
 * single chunk never spills. Errors (a full disk) name the Hessian and dir. */
int x3_hess_spill(x3_hess *h, const char *dir);
/* Add another Hessian frame (F32/F64 (n, n), metadata count/dropped) as a
 * chunk of its own (the open chunk ends first): H, count and dropped add
 * up. Errors name the frame. */
int x3_hess_add_frame(x3_hess *h, const x3_tensor *t);
/* The same with weight w standing for rows rows: H += w * frame,
 * count += rows, dropped unchanged (a blend, e.g. hessian-capture's
 * fallback for starved experts). */
int x3_hess_add_frame_w(x3_hess *h, const x3_tensor *t, double w, int64_t rows);
/* Extra metadata copied onto the frame (e.g. "tied"); keys role, count,
 * dropped, members, layer are computed and cannot be set here. */
int x3_hess_set_meta(x3_hess *h, const char *key, const char *val);
/* The value of an extra metadata key, or NULL. */
const char *x3_hess_get_meta(const x3_hess *h, const char *key);
/* Is key one of the computed ones (or a frame-format key x3f/xxh3)? */
int x3_hess_meta_is_computed(const char *key);
/* Over the limit of ExLlamaV3 (more than 10% of the rows dropped)? */
int x3_hess_too_many_dropped(const x3_hess *h);
/* The finished frame: symmetrized H (with the open chunk ended) in dtype
 * (X3_F32 or X3_F64, rounded once from the double sum) with the metadata
 * above. The accumulator stays valid. NULL on allocation error. */
x3_tensor *x3_hess_frame(const x3_hess *h, x3_dtype dtype);

#endif
