/* libFuzzer target: the safetensors parser on arbitrary file contents. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char path[512];
	if (!path[0]) {   /* tests/fuzz/run gives each run a TMPDIR of its own */
		const char *tmp = getenv("TMPDIR");
		snprintf(path, sizeof path, "%s/x3fuzz-%d.safetensors", tmp && *tmp ? tmp : "/tmp", (int)getpid());
	}
	/* a scratch file that cannot be written stops the run: every input
	 * would return here untested and still count as an execution */
	FILE *f = fopen(path, "wb");
	size_t w = f ? fwrite(data, 1, size, f) : 0;
	if (!f || fclose(f) || w != size) {
		fprintf(stderr, "fuzz_safetensors: cannot write the scratch file %s\n", path);
		abort();
	}
	x3_st *s;
	if (x3_st_open(path, &s) == X3_OK) {
		volatile unsigned char sink = 0;
		for (int i = 0; i < x3_st_count(s); i++) {
			const x3_tensor *t = x3_st_get(s, i);
			if (t->nbytes)   /* touch first and last byte: must be mapped */
				sink ^= ((const unsigned char *)t->data)[0] ^
				        ((const unsigned char *)t->data)[t->nbytes - 1];
		}
		(void)sink;
		x3_st_close(s);
	}
	return 0;
}
