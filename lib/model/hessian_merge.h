/* hessian_merge.h: sets of Hessian accumulators by name, the frames of a
 * chunk's partial capture (hessian-capture --part), and the merge of
 * Hessian streams (hessian-capture --merge).
 *
 * A part's frames are the F64 sums of one chunk of the calibration's rows,
 * each with the provenance metadata below (which chunk of which
 * calibration). The merge adds the chunks of every group in chunk order,
 * whatever the order of its inputs, each chunk a chunk of its own
 * (hessian.h: ((P0 + P1) + P2) ...), so the merged frames are the bytes of
 * the single capture of all the rows; the MoE fallback of experts routed
 * too few tokens in all runs after the sum (moe_fallback.h). */
#ifndef X3_HESSIAN_MERGE_H
#define X3_HESSIAN_MERGE_H

#include "x3.h"
#include "frame.h"
#include "hessian.h"

/* ---- accumulators by name, in first-seen order ------------------------ */
typedef struct x3_hset {
	x3_hess **h;
	int n, cap;
	const char *spill_dir;   /* new accumulators keep their total in a file
	                          * there (x3_hess_spill), or NULL */
	int device;              /* ... new F32 ones accumulate there
	                          * (x3_hess_set_device; 0: the CPU) */
} x3_hset;

x3_hess *x3_hset_find(const x3_hset *s, const char *name);
/* A new zero accumulator (x3_hess_new's arguments) appended to s. Errors
 * name the Hessian. */
int x3_hset_add(x3_hset *s, const char *name, int64_t n, int f64, const char *members,
                int layer, x3_hess **out);
/* Free every accumulator and the list (s is empty after, its options kept). */
void x3_hset_free(x3_hset *s);

/* ---- a part's provenance ---------------------------------------------- */
/* chunk (its number), chunks (of the calibration), chunk_rows, calib_rows,
 * calib_xxh3 (XXH3-64 of the calibration's token ids, 16 hex digits),
 * products (f32 or f64, the --f64 of the capture): the merge takes parts
 * alike in all but chunk. */
enum { X3_PART_NPROV = 6 };
extern const char *const x3_part_prov_keys[X3_PART_NPROV];
struct x3_part_prov {
	char val[X3_PART_NPROV][32];
};
void x3_part_prov_set(struct x3_part_prov *pv, long chunk, long chunks, long chunk_rows,
                      long calib_rows, const char *calib_xxh3, int f64);
int x3_part_is_prov_key(const char *key);

/* Called for an accumulator written with rows dropped for non-finite values
 * (a whole capture's: not in a part), under the 10% limit. */
typedef void x3_hset_dropped_fn(void *ctx, const char *name, int64_t dropped, int64_t rows);

/* Write every accumulator of s as a frame of dtype dt (x3_hess_frame) and
 * free them. A part's (pv non-NULL): its frames get pv's metadata. Else a
 * whole capture's: an accumulator over the dropped rows' limit is an error
 * (X3_ENUM), one with dropped rows calls dropped (may be NULL), and the
 * metadata only parts carry for the merge (expert groups' routed_w2,
 * min_tokens, top_k, all_tokens; part_role) is left out. Errors name the
 * Hessian. */
int x3_hset_write(x3_hset *s, x3_writer *w, x3_dtype dt, const struct x3_part_prov *pv,
                  x3_hset_dropped_fn *dropped, void *ctx);

/* Write all-token Hessian h (the rows of every token, for the merge's
 * fallback) into a part: exact (F64), with pv's metadata, part_role =
 * all_tokens and all_tokens_scope = layer (read by every expert group of
 * the layer that names it) or group (read by its group of the same
 * name alone). */
int x3_part_put_all_tokens(x3_writer *w, const x3_hess *h, int layer_scope,
                           const struct x3_part_prov *pv);

/* ---- the merge -------------------------------------------------------- */
struct x3_merge_opts {
	int f64;                  /* write F64 (else: as the inputs) */
	const char *spill_dir;    /* x3_hset.spill_dir of the sums, or NULL */
	x3_hset_dropped_fn *dropped;
	/* a merged layer's experts that used the fallback, "E (routed), ..."
	 * (may be NULL) */
	void (*starved)(void *ctx, int64_t layer, int64_t min_tokens, const char *experts);
	void *ctx;
};

/* Merge the frame streams of files[0..n) ("-": standard input) into w.
 * Whole streams (frames without chunk metadata): summed by name in the
 * order given, written in first-seen order, F32 unless the first frame is
 * F64. Parts (--part outputs, every frame with chunk metadata): every
 * chunk of one capture exactly once, read in lockstep one group at a time
 * (a group's sums added in chunk order, blended, written and freed before
 * the next is read), the result the single capture's bytes. A mix of the
 * two, a chunk missing or twice, parts of another capture, frames out of
 * order are errors (X3_EFORMAT, or the reader's) naming the file and
 * frame. */
int x3_hess_merge(const char *const *files, int n, const struct x3_merge_opts *o, x3_writer *w);

#endif
