/* failalloc.c: LD_PRELOAD shim that fails the allocations of one chosen
 * size. Every malloc, calloc (count times size), realloc, aligned_alloc,
 * memalign and posix_memalign of exactly FAILALLOC_SIZE bytes fails with
 * ENOMEM; every other goes to glibc's allocator (__libc_*). A program run
 * under it with the size of one of its buffers sees that buffer's
 * allocation fail, wherever the call sits, without knowing the order of
 * its other allocations.
 *   FAILALLOC_SIZE  bytes (decimal); unset or 0: nothing fails
 *   FAILALLOC_LOG   file that gets one line "SIZE" per failed allocation
 * Built by tests/t1212-quant-oom.sh:
 *   cc -shared -fPIC -o failalloc.so tests/shim/failalloc.c */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);

static size_t fail_size;   /* 0: none */
static int inited;

/* getenv and strtoull allocate nothing */
static void init(void)
{
	if (inited)
		return;
	inited = 1;
	const char *s = getenv("FAILALLOC_SIZE");
	if (s && *s)
		fail_size = (size_t)strtoull(s, NULL, 10);
}

static int hit(size_t n)
{
	init();
	if (!fail_size || n != fail_size)
		return 0;
	const char *log = getenv("FAILALLOC_LOG");
	if (log && *log) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			char b[32];
			int l = snprintf(b, sizeof b, "%zu\n", n);
			if (write(fd, b, (size_t)l) < 0) { /* the log is best effort */ }
			close(fd);
		}
	}
	errno = ENOMEM;
	return 1;
}

void *malloc(size_t n)
{
	return hit(n) ? NULL : __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
	if (size && n > SIZE_MAX / size)
		return __libc_calloc(n, size);   /* glibc refuses the overflow */
	return hit(n * size) ? NULL : __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
	return hit(n) ? NULL : __libc_realloc(p, n);
}

void *memalign(size_t align, size_t n)
{
	return hit(n) ? NULL : __libc_memalign(align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
	return hit(n) ? NULL : __libc_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
	if (hit(n))
		return ENOMEM;
	void *p = __libc_memalign(align, n);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}
