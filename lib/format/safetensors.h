/* safetensors.h: reading .safetensors files and HF model directories
 * (mmap, unaligned data offsets allowed, sharded via
 * model.safetensors.index.json), and writing them atomically. */
#ifndef X3_SAFETENSORS_H
#define X3_SAFETENSORS_H

#include "x3.h"

typedef struct x3_st x3_st;

/* path: a .safetensors file, or a directory holding
 * model.safetensors.index.json, model.safetensors, or *.safetensors. */
int x3_st_open(const char *path, x3_st **out);
int x3_st_count(const x3_st *s);
/* i-th tensor in file order (shard order, then offset order). The tensor
 * is borrowed: data points into the mapping; do not free or modify. */
const x3_tensor *x3_st_get(const x3_st *s, int i);
/* By name, or NULL (no error message set). */
const x3_tensor *x3_st_find(const x3_st *s, const char *name);
/* __metadata__ value of the (first) file, or NULL. */
const char *x3_st_meta(const x3_st *s, const char *key);
/* Drop the memory pages of the bytes [p, p + n) of a tensor's payload from
 * this process (madvise MADV_DONTNEED on the read-only mapping; the next
 * read of them faults them in from the file again, the same bytes): for a
 * tensor that was converted to a copy of its own, so that the mapping does
 * not keep a second copy resident, and a forward over many layers does not
 * grow by every layer it has run. A tensor that owns its data (not
 * mapped) is left alone. */
void x3_st_drop(const x3_tensor *t, const void *p, size_t n);
/* MXFP4 weights (GPT-OSS's experts): NAME_blocks, U8 (..., G, 16), and
 * NAME_scales, U8 (..., G): x3_mxfp4_decode's groups (x3.h). Is T such a
 * NAME_blocks, its NAME_scales in the checkpoint (whatever their shapes:
 * x3_st_mxfp4 checks them)? */
int x3_st_is_mxfp4(const x3_st *s, const x3_tensor *t);
/* The F32 tensor NAME (..., G * 32) that BLOCKS (NAME_blocks) and its
 * NAME_scales hold, in their layout: (experts, rows, cols) for GPT-OSS,
 * whose Hugging Face parameter is the transpose of the last two dims.
 * X3_EFORMAT naming the tensor: a missing NAME_scales, a dtype other than
 * U8, blocks not (..., G, 16), scales not the blocks' leading shape; a
 * scale 0xFF or a value beyond F32 (naming the group's index). */
int x3_st_mxfp4(const x3_st *s, const x3_tensor *blocks, x3_tensor **out);
/* Which file holds tensor i (for messages). */
const char *x3_st_file(const x3_st *s, int i);
void x3_st_close(x3_st *s);

/* Is this byte prefix (>= 8 bytes) plausibly a safetensors header?
 * (Frames are safetensors too; the distinction is made by x3f meta.) */

/* ---- writer ---------------------------------------------------------- */
typedef struct x3_stw x3_stw;

/* Create a writer. dir_or_file: with shard_bytes == 0 and a path ending in
 * ".safetensors", a single file; otherwise a directory into which
 * model.safetensors (one shard) or model-0000i-of-0000N.safetensors plus
 * model.safetensors.index.json are written. Payloads are spooled to a
 * temporary file beside the output, so memory stays small. */
int x3_stw_create(const char *dir_or_file, uint64_t shard_bytes, x3_stw **out);
/* Start a new module: shards break only between modules. */
int x3_stw_module(x3_stw *w);
/* Add a tensor (payload copied to the spool). meta of the tensor is not
 * written; file-level metadata goes with x3_stw_meta. */
int x3_stw_add(x3_stw *w, const x3_tensor *t);
int x3_stw_meta(x3_stw *w, const char *key, const char *val);
/* Write all files under temporary names, fsync, rename into place.
 * On failure nothing with a final name is left behind. Frees w. */
int x3_stw_commit(x3_stw *w);
/* Drop everything written so far. Frees w. */
void x3_stw_abort(x3_stw *w);
/* A writer that writes nothing, to know a layout's size before any data
 * exists: x3_stw_add takes headers without data (nbytes counts), and
 * x3_stw_size gives the bytes x3_stw_commit would write for them (every
 * shard's length prefix, header and padding, and payloads, plus the index
 * of a sharded directory), by the same shard and header code. single: as
 * a writer to one .safetensors file. x3_stw_size frees w. */
int x3_stw_create_sizer(uint64_t shard_bytes, int single, x3_stw **out);
int x3_stw_size(x3_stw *w, uint64_t *bytes, int *nshards);

/* Direct writing, for a caller that knows every header before the first
 * payload byte: declare each tensor (header only, in order; no
 * x3_stw_add on the same writer), then x3_stw_commit_direct writes the
 * shards with each payload written once, straight into its shard: for
 * declared tensor i it asks fn(ctx, i, &p, &owned) for its nbytes bytes at
 * p (owned, if set, is freed after the write). Names, renames and
 * failures as x3_stw_commit. Frees w. */
int x3_stw_declare(x3_stw *w, const x3_tensor *t);
typedef int (*x3_stw_payload)(void *ctx, int i, const void **p, void **owned);
int x3_stw_commit_direct(x3_stw *w, x3_stw_payload fn, void *ctx);

/* x3_write_file_atomic: io.h */
#include "io.h"

#endif
