/* libFuzzer target: the frame stream reader (plain and zstd) on arbitrary
 * bytes. Every input must end in X3_EOF or an error, never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
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
		if (x3_reader_next(r, &t) != X3_OK)
			break;
		x3_tensor_free(t);
	}
	x3_reader_close(r);
	return 0;
}
