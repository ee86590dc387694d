/* io.c: the write loop and the atomic-file helper (io.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include "x3.h"
#include "io.h"

int x3_write_full(int fd, const void *p, size_t n)
{
	const unsigned char *c = p;
	while (n) {
		ssize_t k = write(fd, c, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -1;
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

int x3_pio_full(int fd, int wr, void *p, size_t n, off_t off)
{
	unsigned char *c = p;
	while (n) {
		ssize_t k = wr ? pwrite(fd, c, n, off) : pread(fd, c, n, off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			if (!k)
				errno = EIO;   /* end of file before n bytes */
			return -1;
		}
		c += k, off += k;
		n -= (size_t)k;
	}
	return 0;
}

void x3_dir_of(const char *path, char *dir, size_t n)
{
	snprintf(dir, n, "%s", path);
	char *sl = strrchr(dir, '/');
	if (sl)
		*(sl == dir ? sl + 1 : sl) = 0;
	else
		snprintf(dir, n, ".");
}

int x3_fsync_dir(const char *dir, const char *path)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return x3_err(X3_EIO, "%s: %s", dir, strerror(errno));
	int rc = fsync(fd) != 0 && errno != EINVAL
		? x3_err(X3_EIO, "fsync %s: %s (%s is written, but may not survive a crash)", dir,
		         strerror(errno), path)
		: X3_OK;
	close(fd);
	return rc;
}

int x3_afile_open(x3_afile *f, const char *path)
{
	f->fd = -1;
	f->tmp[0] = 0;
	if (snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path ||
	    snprintf(f->tmp, sizeof f->tmp, "%s.tmp-XXXXXX", path) >= (int)sizeof f->tmp) {
		f->tmp[0] = 0;
		return x3_err(X3_EINVAL, "%s: path too long", path);
	}
	if ((f->fd = mkstemp(f->tmp)) < 0) {
		f->tmp[0] = 0;
		return x3_err(X3_EIO, "%s: cannot create a temporary file: %s", path, strerror(errno));
	}
	return X3_OK;
}

int x3_afile_close(x3_afile *f)
{
	/* mkstemp makes 0600 files; finished outputs get 0666 & ~umask */
	mode_t um = umask(022);
	umask(um);
	int rc = X3_OK;
	if (fchmod(f->fd, 0666 & ~um) != 0 || fsync(f->fd) != 0)
		rc = x3_err(X3_EIO, "fsync %s: %s", f->path, strerror(errno));
	if (close(f->fd) != 0 && !rc)
		rc = x3_err(X3_EIO, "close %s: %s", f->path, strerror(errno));
	f->fd = -1;
	return rc;
}

int x3_afile_rename(x3_afile *f)
{
	if (rename(f->tmp, f->path) != 0)
		return x3_err(X3_EIO, "rename to %s: %s", f->path, strerror(errno));
	f->tmp[0] = 0;
	return X3_OK;
}

void x3_afile_abort(x3_afile *f)
{
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
	if (f->tmp[0])
		unlink(f->tmp);
	f->tmp[0] = 0;
}

int x3_afile_commit(x3_afile *f)
{
	int rc = x3_afile_close(f);
	if (!rc)
		rc = x3_afile_rename(f);
	if (rc) {
		x3_afile_abort(f);
		return rc;
	}
	char dir[PATH_MAX];
	x3_dir_of(f->path, dir, sizeof dir);
	return x3_fsync_dir(dir, f->path);
}

int x3_write_file_atomic(const char *path, const void *buf, size_t n)
{
	x3_afile f;
	int rc = x3_afile_open(&f, path);
	if (rc)
		return rc;
	if (x3_write_full(f.fd, buf, n)) {
		rc = x3_err(X3_EIO, "writing %s: %s", path, strerror(errno));
		x3_afile_abort(&f);
		return rc;
	}
	return x3_afile_commit(&f);
}

int x3_open_regular(const char *path, int *out)
{
	*out = -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return x3_err(X3_EIO, "%s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0) {
		int e = errno;
		close(fd);
		return x3_err(X3_EIO, "%s: %s", path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return x3_err(X3_EFORMAT, "%s: not a regular file (%s)", path,
		              S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory" :
		              S_ISSOCK(st.st_mode) ? "a socket" : "a device");
	}
	/* blocking reads from here on, as from a plain open */
	int fl = fcntl(fd, F_GETFL);
	if (fl != -1)
		(void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	*out = fd;
	return X3_OK;
}
