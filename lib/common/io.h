/* io.h: the toolkit's one write loop, one atomic-file helper and one way
 * to open an input that must be a regular file. Every
 * file an exl3kit program leaves behind is written under a temporary name
 * beside its final one and renamed into place when complete (fsynced,
 * then the directory fsynced), so a crash or a full disk never leaves a
 * half-written file that looks finished. */
#ifndef X3_IO_H
#define X3_IO_H

#include <limits.h>
#include <stddef.h>
#include <sys/types.h>

/* write(2) all n bytes, retrying short writes and EINTR: 0, or -1 with
 * errno set. */
int x3_write_full(int fd, const void *p, size_t n);
/* pwrite(2) (wr) or pread(2) all n bytes at off, retrying short transfers
 * and EINTR: 0, or -1 with errno set (EIO for end of file first). */
int x3_pio_full(int fd, int wr, void *p, size_t n, off_t off);

/* A file being written atomically: PATH.tmp-XXXXXX until committed. */
typedef struct {
	int fd;                /* -1 once closed */
	char tmp[PATH_MAX];    /* "" once renamed or removed */
	char path[PATH_MAX];
} x3_afile;

/* Create PATH's temporary file (0600 until committed). X3_EIO naming PATH. */
int x3_afile_open(x3_afile *f, const char *path);
/* Give it the usual mode (0666 & ~umask), fsync and close it, without the
 * rename (for a set of files renamed together, x3_afile_rename). */
int x3_afile_close(x3_afile *f);
/* Rename a closed file into place. */
int x3_afile_rename(x3_afile *f);
/* x3_afile_close, x3_afile_rename and the fsync of PATH's directory (a
 * failure there says the file is written but may not survive a crash). On
 * failure the temporary file is removed. */
int x3_afile_commit(x3_afile *f);
/* Close and remove the temporary file (no-op once committed). */
void x3_afile_abort(x3_afile *f);

/* fsync directory DIR after a rename of PATH into it. */
int x3_fsync_dir(const char *dir, const char *path);
/* The directory of PATH ("." when it has no slash). */
void x3_dir_of(const char *path, char *dir, size_t n);

/* Open PATH for reading into *fd when it is a regular file (symbolic links
 * followed): X3_OK, X3_EIO, or X3_EFORMAT "not a regular file" for a FIFO,
 * socket, device or directory. A FIFO is opened without blocking, so a
 * missing writer cannot hang the reader. */
int x3_open_regular(const char *path, int *fd);

/* Write buf to path atomically (x3_afile). */
int x3_write_file_atomic(const char *path, const void *buf, size_t n);

#endif
