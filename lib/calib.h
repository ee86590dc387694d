/* calib.h: inputs of the calibration and evaluation programs: text files
 * (plain or zstd-compressed) and token-id frames, cut into rows x cols. */
#ifndef X3_CALIB_H
#define X3_CALIB_H

#include <stddef.h>
#include <stdint.h>
#include "x3.h"

/* Whole file ("-": stdin) into a malloc'd NUL-terminated buffer; a zstd
 * stream (detected by magic) is decompressed. At most max_bytes (0: 4 GiB)
 * after decompression. */
int x3_text_read(const char *path, size_t max_bytes, char **buf, size_t *len);

/* Append the token ids of every frame of a stream ("-": stdin; integer
 * dtypes, any shape, row-major) to *ids (malloc'd/realloc'd, *n entries).
 * *last_dim (may be NULL) gets the last dimension of the first frame if it
 * is still 0. Values outside int32 are an error naming the frame. */
int x3_tokens_read(const char *path, int32_t **ids, size_t *n, int64_t *last_dim);

#endif
