/* failio.c: LD_PRELOAD shim that fails one chosen write, fsync or rename.
 * Every write(2)-family call on a regular file (any fd, stdout included),
 * every fsync/fdatasync and every rename/renameat/renameat2 is an
 * operation; operations are numbered from 1 across every process that
 * shares FAILIO_COUNTER, and operation number FAILIO_N fails (once) with
 * FAILIO_ERRNO (ENOSPC, the default, or EIO). FAILIO_N=0 only counts: the
 * counter file then holds the number of operations a run made.
 *   FAILIO_COUNTER  file holding the shared counter (8 bytes; created);
 *                   unset: each process counts on its own
 *   FAILIO_PROGS    comma list of program names that count (e.g.
 *                   tensor-cat,pack-write); unset: every process
 *   FAILIO_LOG      file that gets "N PROGRAM OP" of the failed operation
 * Built by tests/t1615-write-faults.sh:
 *   cc -shared -fPIC -o failio.so tests/shim/failio.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int inited, active, fail_errno = ENOSPC;
static long long fail_n;
static uint64_t *counter, local_counter;

static void init(void)
{
	if (inited)
		return;
	inited = 1;
	const char *progs = getenv("FAILIO_PROGS");
	active = 1;
	if (progs && *progs) {
		size_t n = strlen(program_invocation_short_name);
		const char *p = progs;
		active = 0;
		while (*p && !active) {
			const char *e = strchr(p, ',');
			size_t len = e ? (size_t)(e - p) : strlen(p);
			active = len == n && !strncmp(p, program_invocation_short_name, n);
			p += len + (e != NULL);
		}
	}
	const char *s = getenv("FAILIO_N");
	fail_n = s ? atoll(s) : 0;
	s = getenv("FAILIO_ERRNO");
	if (s && !strcmp(s, "EIO"))
		fail_errno = EIO;
	counter = &local_counter;
	s = getenv("FAILIO_COUNTER");
	if (s && active) {
		int fd = open(s, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		if (fd >= 0) {
			struct stat st;
			if (fstat(fd, &st) == 0 && st.st_size < 8 && ftruncate(fd, 8) != 0) {
				close(fd);
				return;
			}
			void *m = mmap(NULL, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			close(fd);
			if (m != MAP_FAILED)
				counter = m;
		}
	}
}

/* 1 if this operation is the one to fail (errno set) */
static int hit(const char *op)
{
	init();
	if (!active)
		return 0;
	uint64_t n = __atomic_add_fetch(counter, 1, __ATOMIC_SEQ_CST);
	if (fail_n <= 0 || n != (uint64_t)fail_n)
		return 0;
	const char *log = getenv("FAILIO_LOG");
	if (log) {
		FILE *f = fopen(log, "a");
		if (f) {
			fprintf(f, "%llu %s %s\n", (unsigned long long)n, program_invocation_short_name, op);
			fclose(f);
		}
	}
	errno = fail_errno;
	return 1;
}

static int regular(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

#define REAL(ret, name, ...) \
	static ret (*real)(__VA_ARGS__); \
	if (!real) \
		real = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

ssize_t write(int fd, const void *buf, size_t n)
{
	REAL(ssize_t, "write", int, const void *, size_t);
	if (regular(fd) && hit("write"))
		return -1;
	return real(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	REAL(ssize_t, "pwrite", int, const void *, size_t, off_t);
	if (regular(fd) && hit("pwrite"))
		return -1;
	return real(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
	return pwrite(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	REAL(ssize_t, "writev", int, const struct iovec *, int);
	if (regular(fd) && hit("writev"))
		return -1;
	return real(fd, iov, cnt);
}

int fsync(int fd)
{
	REAL(int, "fsync", int);
	if (hit("fsync"))
		return -1;
	return real(fd);
}

int fdatasync(int fd)
{
	REAL(int, "fdatasync", int);
	if (hit("fdatasync"))
		return -1;
	return real(fd);
}

int rename(const char *a, const char *b)
{
	REAL(int, "rename", const char *, const char *);
	if (hit("rename"))
		return -1;
	return real(a, b);
}

int renameat(int da, const char *a, int db, const char *b)
{
	REAL(int, "renameat", int, const char *, int, const char *);
	if (hit("renameat"))
		return -1;
	return real(da, a, db, b);
}

int renameat2(int da, const char *a, int db, const char *b, unsigned flags)
{
	REAL(int, "renameat2", int, const char *, int, const char *, unsigned);
	if (hit("renameat2"))
		return -1;
	return real(da, a, db, b, flags);
}
