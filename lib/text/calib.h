/* calib.h: inputs of the calibration and evaluation programs: text files
 * (plain or zstd-compressed) and token-id frames, cut into rows x cols. */
#ifndef X3_CALIB_H
#define X3_CALIB_H

#include <stddef.h>
#include <stdint.h>
#include "x3.h"
#include "tokenizer.h"

/* Whole file ("-": stdin) into a malloc'd NUL-terminated buffer; a zstd
 * stream (detected by magic) is decompressed. At most max_bytes (0: 4 GiB)
 * after decompression. */
int x3_text_read(const char *path, size_t max_bytes, char **buf, size_t *len);

/* Append the token ids of every frame of a stream ("-": stdin; integer
 * dtypes, any shape, row-major) to *ids (malloc'd/realloc'd, *n entries).
 * *last_dim (may be NULL) gets the last dimension of the first frame if it
 * is still 0. Values outside int32 are an error naming the frame. */
int x3_tokens_read(const char *path, int32_t **ids, size_t *n, int64_t *last_dim);

/* Read text files (x3_text_read), cut each into documents (split: enum
 * x3_tok_split) and pack them all, in order, into rows of cols tokens with
 * x3_tok_pack_rows and the options po. rows == 0: as many rows as the text
 * gives. *out (rows x cols, malloc'd), *rows_out rows filled (may be fewer
 * than asked for, even 0: the caller decides). */
int x3_text_rows(x3_tok *tok, char *const *paths, int npaths, int split,
                 const struct x3_tok_pack_opts *po, size_t rows, size_t cols,
                 int32_t **out, size_t *rows_out);

#endif
