/* enospc.c: LD_PRELOAD shim that simulates a full disk. After
 * ENOSPC_AFTER bytes have been written to regular files (fds > 2), every
 * further write to a regular file fails with ENOSPC, as do fallocate and
 * posix_fallocate. Built by tests/t1612-pack-write-atomic.sh:
 *   cc -shared -fPIC -o enospc.so tests/shim/enospc.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long long budget = -1;   /* bytes left; -1: not read yet */

static int full(int fd, size_t n)
{
	struct stat st;
	if (fd <= 2 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
		return 0;
	if (budget < 0) {
		const char *e = getenv("ENOSPC_AFTER");
		budget = e ? atoll(e) : 0;
	}
	if ((long long)n > budget) {
		budget = 0;
		errno = ENOSPC;
		return 1;
	}
	budget -= (long long)n;
	return 0;
}

ssize_t write(int fd, const void *buf, size_t n)
{
	static ssize_t (*real)(int, const void *, size_t);
	if (!real)
		real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
	if (full(fd, n))
		return -1;
	return real(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	static ssize_t (*real)(int, const void *, size_t, off_t);
	if (!real)
		real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
	if (full(fd, n))
		return -1;
	return real(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
	return pwrite(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	static ssize_t (*real)(int, const struct iovec *, int);
	if (!real)
		real = (ssize_t (*)(int, const struct iovec *, int))dlsym(RTLD_NEXT, "writev");
	size_t n = 0;
	for (int i = 0; i < cnt; i++)
		n += iov[i].iov_len;
	if (full(fd, n))
		return -1;
	return real(fd, iov, cnt);
}

int fallocate(int fd, int mode, off_t off, off_t len)
{
	static int (*real)(int, int, off_t, off_t);
	if (!real)
		real = (int (*)(int, int, off_t, off_t))dlsym(RTLD_NEXT, "fallocate");
	if (!(mode & 0x02 /* FALLOC_FL_PUNCH_HOLE frees space */) && full(fd, (size_t)len))
		return -1;
	return real(fd, mode, off, len);
}

int posix_fallocate(int fd, off_t off, off_t len)
{
	static int (*real)(int, off_t, off_t);
	if (!real)
		real = (int (*)(int, off_t, off_t))dlsym(RTLD_NEXT, "posix_fallocate");
	if (full(fd, (size_t)len))
		return ENOSPC;
	return real(fd, off, len);
}
