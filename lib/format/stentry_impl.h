/* stentry_impl.h: the one check of a tensor's entry in a safetensors-style
 * JSON header, shared by the frame reader (frame.c) and the safetensors
 * reader (safetensors.c), so both refuse the same headers with the same
 * messages (man/exl3-frames.5 lists them). Private to format/. */
#ifndef X3_STENTRY_IMPL_H
#define X3_STENTRY_IMPL_H

#include <stdint.h>
#include <jansson.h>
#include "x3.h"

/* Check the entry ent of tensor name: {"dtype": T, "shape": [d0, ...],
 * "data_offsets": [b, e]}. The name must be non-empty valid UTF-8, T a
 * known dtype, the rank at most X3_MAX_RANK, every dimension a
 * non-negative integer, the payload size (product of the dimensions times
 * the element size) free of overflow, and 0 <= b <= e <= avail with
 * e - b that size.
 *
 * frame != 0: a frame's entry: b must be 0 and avail is the largest
 * payload a frame may declare (what follows is not known yet); otherwise
 * avail is the size of the file's data section.
 *
 * Messages are "WHERE 'NAME': PROBLEM", where is the caller's location
 * ("stdin: frame 3", "x.safetensors: tensor"). On success *out is a
 * tensor without data (nbytes set) and *off its begin offset. */
int x3_stentry_check(const char *where, const char *name, const json_t *ent, uint64_t avail,
                     int frame, x3_tensor **out, uint64_t *off);

#endif
