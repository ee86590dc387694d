/* libFuzzer target: the frame stream reader (plain and zstd) on arbitrary
 * bytes. Every input must end in X3_EOF or an error, never a crash.
 *
 * Kept fast (issue 15 part 3: 10 million executions) without leaving any
 * of the reader out:
 *   - a payload is loaded whole (x3_reader_load) when it declares at most
 *     LOAD_MAX bytes; a larger claim (an input is at most a few KiB, so it
 *     is a truncated payload) is read through the streaming calls instead,
 *     alternately x3_reader_data in small chunks, x3_reader_peek and
 *     x3_reader_skip, so each input does not cost the load's first 64 MiB
 *     buffer (ASan maps and poisons all of it);
 *   - a zstd frame whose header asks for a window above WINDOW_MAX is
 *     rejected before the reader sees it: zstd would allocate the window
 *     (up to 128 MiB) for each such input, and the reader's own code runs
 *     the same on a small window (zstd itself is fuzzed upstream). */
#define ZSTD_STATIC_LINKING_ONLY
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zstd.h>
#include "frame.h"

#define LOAD_MAX (1u << 20)
#define WINDOW_MAX (1ull << 20)

/* 1 if some zstd frame of data asks for a window above WINDOW_MAX */
static int big_window(const uint8_t *data, size_t size)
{
	while (size >= 4 && (data[0] | data[1] << 8 | data[2] << 16 | (uint32_t)data[3] << 24) == ZSTD_MAGICNUMBER) {
		ZSTD_frameHeader h;
		if (ZSTD_getFrameHeader(&h, data, size) != 0)
			return 0;   /* malformed or cut: zstd refuses it before allocating */
		if (h.windowSize > WINDOW_MAX)
			return 1;
		size_t n = ZSTD_findFrameCompressedSize(data, size);
		if (ZSTD_isError(n) || n > size)
			return 0;
		data += n, size -= n;
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (big_window(data, size))
		return -1;   /* not added to the corpus */
	int fd = memfd_create("fuzz", 0);
	if (fd < 0)
		return 0;
	if (write(fd, data, size) != (ssize_t)size) {
		close(fd);
		return 0;
	}
	lseek(fd, 0, SEEK_SET);
	x3_reader *r;
	if (x3_reader_open_fd(fd, "fuzz", 1, &r) != X3_OK) {
		close(fd);
		return 0;
	}
	for (int i = 0; i < 64; i++) {
		x3_tensor *t;
		if (x3_reader_next_header(r, &t) != X3_OK)
			break;
		int rc = X3_OK;
		if (t->nbytes <= LOAD_MAX) {
			rc = x3_reader_load(r, t);
		} else if (i % 3 == 0) {
			unsigned char buf[256];
			size_t left = t->nbytes;
			while (!rc && left) {
				size_t k = left < sizeof buf ? left : sizeof buf;
				rc = x3_reader_data(r, buf, k);
				left -= k;
			}
		} else if (i % 3 == 1) {
			const void *p;
			size_t got, left = t->nbytes;
			while (!rc && left && !(rc = x3_reader_peek(r, &p, left, &got)))
				left -= got;
		} else {
			rc = x3_reader_skip(r);
		}
		x3_tensor_free(t);
		if (rc != X3_OK)
			break;
	}
	x3_reader_close(r);
	return 0;
}
