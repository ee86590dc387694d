/* frame stream: round trips of every dtype with metadata, streaming API,
 * zstd, limits, truncation at every byte. */
#include <fcntl.h>
#include <unistd.h>
#include "frame.h"
#include "safetensors.h"
#include "test.h"

static x3_tensor *mk(const char *name, x3_dtype t, int rank, const int64_t *shape, uint64_t seed)
{
	x3_tensor *x = x3_tensor_new(name, t, rank, shape, 1);
	x3_rng r;
	x3_rng_seed(&r, seed, 0);
	for (size_t i = 0; i < x->nbytes; i++)
		((unsigned char *)x->data)[i] = (unsigned char)x3_rng_u64(&r);
	return x;
}

/* write tensors into a temp file (optionally zstd) and return its fd at 0 */
static int write_tmp(x3_tensor **v, int n, int level)
{
	char path[] = "/tmp/x3frameXXXXXX";
	int fd = mkstemp(path);
	unlink(path);
	x3_writer *w;
	if (x3_writer_open_fd(fd, level, &w))
		return -1;
	for (int i = 0; i < n; i++)
		if (x3_writer_put(w, v[i]))
			return -1;
	if (x3_writer_close(w))
		return -1;
	lseek(fd, 0, SEEK_SET);
	return fd;
}

static int same(const x3_tensor *a, const x3_tensor *b)
{
	if (strcmp(a->name, b->name) || a->dtype != b->dtype || a->rank != b->rank || a->nbytes != b->nbytes)
		return 0;
	for (int i = 0; i < a->rank; i++)
		if (a->shape[i] != b->shape[i])
			return 0;
	return memcmp(a->data, b->data, a->nbytes) == 0;
}

int main(void)
{
	x3_tensor *v[X3_DTYPE_COUNT + 2];
	int n = 0;
	for (int t = 0; t < X3_DTYPE_COUNT; t++) {
		int64_t sh[3] = {3, 5, 2};
		char nm[32];
		snprintf(nm, sizeof nm, "t.%s", x3_dtype_name((x3_dtype)t));
		v[n] = mk(nm, (x3_dtype)t, 1 + t % 3, sh, (uint64_t)t);
		x3_meta_set(v[n], "role", "test");
		x3_meta_setf(v[n], "K", "%d", t);
		n++;
	}
	v[n++] = mk("scalar", X3_I32, 0, NULL, 99);
	int64_t z[2] = {0, 7};
	v[n++] = mk("empty \"quoted\" ünïcode", X3_F16, 2, z, 1);
	x3_meta_set(v[n - 2], "role", "test");
	x3_meta_set(v[n - 1], "role", "test");
	for (int level = 0; level <= 3; level += 3) {
		int fd = write_tmp(v, n, level);
		x3_reader *r;
		CHECK_OK(x3_reader_open_fd(fd, "tmp", 1, &r), "open (zstd %d)", level);
		int ok = 1, i = 0;
		x3_tensor *t;
		int rc;
		while ((rc = x3_reader_next(r, &t)) == X3_OK) {
			if (i >= n || !same(t, v[i]) || !x3_meta_get(t, "role") || strcmp(x3_meta_get(t, "role"), "test"))
				ok = 0;
			int64_t k;
			if (i < X3_DTYPE_COUNT && (x3_meta_get_i64(t, "K", &k) || k != i))
				ok = 0;
			x3_tensor_free(t);
			i++;
		}
		CHECK(rc == X3_EOF && ok && i == n, "round trip of %d tensors, every dtype, metadata (zstd %d)", n, level);
		x3_reader_close(r);
	}

	/* streaming API: header, then payload in odd-sized chunks */
	{
		int64_t sh[1] = {100000};
		x3_tensor *big = mk("big", X3_F32, 1, sh, 7);
		int fd = write_tmp(&big, 1, 0);
		x3_reader *r;
		x3_reader_open_fd(fd, "tmp", 1, &r);
		x3_tensor *h;
		CHECK_OK(x3_reader_next_header(r, &h), "streaming header");
		unsigned char *buf = malloc(h->nbytes);
		size_t off = 0, step = 777;
		int rc = X3_OK;
		while (off < h->nbytes && !rc) {
			size_t k = h->nbytes - off < step ? h->nbytes - off : step;
			rc = x3_reader_data(r, buf + off, k);
			off += k;
		}
		CHECK(rc == X3_OK && !memcmp(buf, big->data, big->nbytes), "streamed payload identical");
		x3_tensor *t;
		CHECK(x3_reader_next(r, &t) == X3_EOF, "then EOF");
		free(buf);
		x3_tensor_free(h);
		x3_reader_close(r);

		/* truncation at every byte of a small frame: an error, never a crash */
		x3_tensor *small = mk("s", X3_F16, 1, (int64_t[]){9}, 3);
		char path[] = "/tmp/x3truncXXXXXX";
		int pfd = mkstemp(path);
		x3_writer *w;
		x3_writer_open_fd(pfd, 0, &w);
		x3_writer_put(w, small);
		x3_writer_close(w);
		off_t len = lseek(pfd, 0, SEEK_END);
		int errs = 0, eofs = 0;
		for (off_t cut = 0; cut < len; cut++) {
			if (ftruncate(pfd, cut))
				break;
			lseek(pfd, 0, SEEK_SET);
			int fd2 = open(path, O_RDONLY);
			x3_reader_open_fd(fd2, "cut", 1, &r);
			rc = x3_reader_next(r, &t);
			if (rc == X3_EOF) eofs++;
			else if (rc != X3_OK) errs++;
			else x3_tensor_free(t);
			x3_reader_close(r);
			/* rebuild */
			lseek(pfd, 0, SEEK_SET);
			x3_writer_open_fd(pfd, 0, &w);
			x3_writer_put(w, small);
			x3_writer_close(w);
		}
		CHECK(eofs == 1 && errs == len - 1, "every truncation of a %lld-byte frame is an error (%d errors, %d EOF)",
		      (long long)len, errs, eofs);
		/* flipping any single payload byte is a checksum error */
		int caught = 0;
		for (off_t p = len - 18; p < len; p++) {
			unsigned char c;
			if (pread(pfd, &c, 1, p) != 1)
				break;
			c ^= 0x40;
			if (pwrite(pfd, &c, 1, p) != 1)
				break;
			int fd2 = open(path, O_RDONLY);
			x3_reader_open_fd(fd2, "flip", 1, &r);
			rc = x3_reader_next(r, &t);
			if (rc == X3_EFORMAT && strstr(x3_errmsg(), "checksum mismatch"))
				caught++;
			else if (rc == X3_OK)
				x3_tensor_free(t);
			x3_reader_close(r);
			c ^= 0x40;
			if (pwrite(pfd, &c, 1, p) != 1)
				break;
		}
		CHECK(caught == 18, "every corrupted payload byte is a checksum mismatch (%d/18)", caught);
		close(pfd);
		unlink(path);
		x3_tensor_free(small);
		x3_tensor_free(big);
	}

	/* names and metadata that JSON cannot hold: refused by both writers,
	 * naming the key (jansson would drop them and write a header without
	 * the tensor or without the note) */
	{
		char path[] = "/tmp/x3utf8XXXXXX";
		int fd = mkstemp(path);
		unlink(path);
		x3_writer *w;
		CHECK_OK(x3_writer_open_fd(fd, 0, &w), "writer for the UTF-8 checks");
		x3_tensor *bn = mk("w\xff", X3_F32, 0, NULL, 1), *bm = mk("w", X3_F32, 0, NULL, 2),
		          *bk = mk("w", X3_F32, 0, NULL, 3), *md = mk("__metadata__", X3_F32, 0, NULL, 4);
		x3_meta_set(bm, "note", "\xfe");
		x3_meta_set(bk, "n\xfe", "x");
		int rc = x3_writer_put(w, bn);
		CHECK(rc == X3_EFORMAT && !strcmp(x3_errmsg(), "tensor name 'w\\xff' is not valid UTF-8"),
		      "frame writer: a name that is not UTF-8 (%s)", x3_errmsg());
		rc = x3_writer_put(w, bm);
		CHECK(rc == X3_EFORMAT && !strcmp(x3_errmsg(), "metadata 'note': value '\\xfe' is not valid UTF-8"),
		      "frame writer: a metadata value that is not UTF-8 (%s)", x3_errmsg());
		rc = x3_writer_put(w, bk);
		CHECK(rc == X3_EFORMAT && !strcmp(x3_errmsg(), "metadata key 'n\\xfe' is not valid UTF-8"),
		      "frame writer: a metadata key that is not UTF-8 (%s)", x3_errmsg());
		CHECK(x3_writer_put(w, md) == X3_EINVAL && strstr(x3_errmsg(), "'__metadata__' is reserved"),
		      "frame writer: a tensor named __metadata__ (%s)", x3_errmsg());
		CHECK(lseek(fd, 0, SEEK_CUR) == 0, "nothing was written");
		x3_writer_close(w);
		close(fd);
		char dir[] = "/tmp/x3utf8dXXXXXX", sp[64];
		CHECK(mkdtemp(dir) != NULL, "temp dir");
		snprintf(sp, sizeof sp, "%s/a.safetensors", dir);
		x3_stw *sw;
		CHECK_OK(x3_stw_create(sp, 0, &sw), "safetensors writer");
		rc = x3_stw_add(sw, bn);
		CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "tensor name 'w\\xff' is not valid UTF-8"),
		      "safetensors writer: a name that is not UTF-8 (%s)", x3_errmsg());
		rc = x3_stw_meta(sw, "note", "\xfe");
		CHECK(rc == X3_EFORMAT && !strcmp(x3_errmsg(), "metadata 'note': value '\\xfe' is not valid UTF-8"),
		      "safetensors writer: a metadata value that is not UTF-8 (%s)", x3_errmsg());
		x3_stw_abort(sw);
		rmdir(dir);
		char b[16];
		CHECK(!strcmp(x3_str_escape("ab\ncd\xe2\x82\xac", b, sizeof b), "ab\\x0acd\xe2\x82\xac"),
		      "x3_str_escape: control bytes escaped, valid UTF-8 kept (%s)", b);
		CHECK(!strcmp(x3_str_escape("abcdefghijklmnop", b, sizeof b), "abcdefghijk..."),
		      "x3_str_escape: cut to fit (%s)", b);
		x3_tensor_free(bn);
		x3_tensor_free(bm);
		x3_tensor_free(bk);
		x3_tensor_free(md);
	}

	/* limits enforced before allocating */
	{
		int64_t sh[2] = {1LL << 40, 1LL << 40};
		size_t nb;
		CHECK(x3_shape_nbytes(X3_F32, 2, sh, &nb) == X3_ENOMEM, "overflowing shape refused");
		CHECK(x3_tensor_new("x", X3_F32, 9, sh, 0) == NULL, "rank 9 refused");
	}
	for (int i = 0; i < n; i++)
		x3_tensor_free(v[i]);
	TEST_DONE();
}
