/* util-device.h: the --device option of the programs that compute
 * (bin/util-device.c; linked only into exl3-matmul, had-rotate,
 * hessian-capture, model-eval and trellis-encode). */
#ifndef X3_BIN_UTIL_DEVICE_H
#define X3_BIN_UTIL_DEVICE_H

#include "device.h"

/* --device cpu|cuda|auto (device.h): parse one (a bad value is a usage
 * error, exit 2, naming it) ... */
int device_parse(const char *usage, const char *s);
/* ... and resolve it to X3_DEVICE_CPU or X3_DEVICE_CUDA: cuda without a
 * usable device exits 1 with the reason; auto without one runs on the CPU
 * and says so on stderr unless quiet. Call after option parsing (-q). */
int device_resolve(int want);
#endif
