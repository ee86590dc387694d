/* frame.c: the frame stream (see frame.h and man/exl3-frames.5). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <jansson.h>
#include <xxhash.h>
#include <zstd.h>
#include "frame.h"
#include "io.h"
#include "stentry_impl.h"
#include "utf8.h"

#define RAW_CAP (1u << 20)
#define ZSTD_MAGIC 0xFD2FB528u

struct x3_reader {
	int fd, own_fd;
	char *label;
	unsigned char *raw;          /* bytes as read from fd */
	size_t rcap, rpos, rlen;     /* raw holds rcap bytes */
	int eof;                     /* fd reached end */
	int zstd;                    /* stream is zstd compressed */
	ZSTD_DStream *zd;
	unsigned char *out;          /* decompressed bytes */
	size_t ocap, opos, olen;     /* out holds ocap bytes */
	int zframe_open;             /* inside an unfinished zstd frame */
	long index;                  /* frames started */
	uint64_t total;              /* bytes consumed (for messages) */
	/* current payload */
	x3_tensor *cur;
	uint64_t left;
	uint64_t want;
	XXH3_state_t *hs;
};

static int fill_raw(x3_reader *r)
{
	if (r->rpos < r->rlen || r->eof)
		return X3_OK;
	for (;;) {
		ssize_t n = read(r->fd, r->raw, r->rcap);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return x3_err(X3_EIO, "%s: read error: %s", r->label, strerror(errno));
		r->rpos = 0;
		r->rlen = (size_t)n;
		if (n == 0)
			r->eof = 1;
		return X3_OK;
	}
}

/* The buffered bytes of the (decompressed) stream, refilled when empty:
 * *p and *n, with *n == 0 only at the end of input. */
static int avail(x3_reader *r, const unsigned char **p, size_t *n)
{
	for (;;) {
		if (!r->zstd) {
			int rc = fill_raw(r);
			*p = r->raw + r->rpos;
			*n = r->rlen - r->rpos;
			return rc;
		}
		if (r->opos < r->olen) {
			*p = r->out + r->opos;
			*n = r->olen - r->opos;
			return X3_OK;
		}
		int rc = fill_raw(r);
		if (rc)
			return rc;
		if (r->rpos == r->rlen) {
			if (r->zframe_open)
				return x3_err(X3_EIO, "%s: truncated zstd stream", r->label);
			*n = 0;
			return X3_OK;
		}
		ZSTD_inBuffer in = {r->raw, r->rlen, r->rpos};
		ZSTD_outBuffer out = {r->out, r->ocap, 0};
		size_t z = ZSTD_decompressStream(r->zd, &out, &in);
		if (ZSTD_isError(z))
			return x3_err(X3_EFORMAT, "%s: zstd: %s", r->label, ZSTD_getErrorName(z));
		r->zframe_open = z != 0;
		r->rpos = in.pos;
		r->opos = 0;
		r->olen = out.pos;
	}
}

static void consume(x3_reader *r, size_t k)
{
	if (r->zstd)
		r->opos += k;
	else
		r->rpos += k;
	r->total += k;
}

/* Read up to n bytes of the stream; *got < n only at the end of input. */
static int src_read(x3_reader *r, void *dst, size_t n, size_t *got)
{
	size_t done = 0;
	while (done < n) {
		const unsigned char *p;
		size_t k;
		int rc = avail(r, &p, &k);
		if (rc)
			return rc;
		if (!k)
			break;
		if (k > n - done)
			k = n - done;
		memcpy((unsigned char *)dst + done, p, k);
		consume(r, k);
		done += k;
	}
	*got = done;
	return X3_OK;
}

/* Pipes default to 64 KiB; 1 MiB lets both ends move whole chunks per
 * system call. Failure (not a pipe, over the user's limit) is harmless. */
static void grow_pipe(int fd)
{
	struct stat st;
	if (fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode))
		(void)fcntl(fd, F_SETPIPE_SZ, 1 << 20);
}

int x3_reader_open_fd(int fd, const char *label, int own_fd, x3_reader **out)
{
	x3_reader *r = calloc(1, sizeof *r);
	if (!r)
		return x3_err(X3_ENOMEM, "out of memory");
	/* a regular file smaller than the buffer needs no more than its size
	 * (a small stream costs no 1 MiB buffer: the fuzz targets open
	 * thousands a second); a pipe or a growing file gets the whole buffer */
	struct stat st;
	off_t pos = lseek(fd, 0, SEEK_CUR);
	r->rcap = RAW_CAP;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && pos >= 0 && st.st_size - pos < (off_t)RAW_CAP / 2)
		r->rcap = st.st_size - pos < 4096 ? 4096 : (size_t)(st.st_size - pos) + 4096;
	if (!(r->raw = malloc(r->rcap)) || !(r->label = strdup(label ? label : "stream"))) {
		if (r) { free(r->raw); free(r); }
		return x3_err(X3_ENOMEM, "out of memory");
	}
	r->fd = fd;
	r->own_fd = own_fd;
	r->index = -1;
	grow_pipe(fd);
	/* sniff the zstd magic in the first 4 bytes */
	while (r->rlen < 4 && !r->eof) {
		ssize_t n = read(fd, r->raw + r->rlen, r->rcap - r->rlen);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int rc = x3_err(X3_EIO, "%s: read error: %s", r->label, strerror(errno));
			x3_reader_close(r);
			return rc;
		}
		if (n == 0)
			r->eof = 1;
		r->rlen += (size_t)n;
	}
	if (r->rlen >= 4) {
		uint32_t m = r->raw[0] | r->raw[1] << 8 | r->raw[2] << 16 | (uint32_t)r->raw[3] << 24;
		if (m == ZSTD_MAGIC) {
			r->zstd = 1;
			r->zd = ZSTD_createDStream();
			/* a small file: zstd's own recommended output size */
			r->ocap = r->rcap < RAW_CAP ? ZSTD_DStreamOutSize() : RAW_CAP;
			r->out = malloc(r->ocap);
			if (!r->zd || !r->out) {
				x3_reader_close(r);
				return x3_err(X3_ENOMEM, "out of memory");
			}
			ZSTD_initDStream(r->zd);
		}
	}
	*out = r;
	return X3_OK;
}

int x3_reader_open(const char *path, x3_reader **out)
{
	if (!strcmp(path, "-"))
		return x3_reader_open_fd(STDIN_FILENO, "stdin", 0, out);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return x3_err(X3_EIO, "%s: %s", path, strerror(errno));
	int rc = x3_reader_open_fd(fd, path, 1, out);
	if (rc)
		close(fd);
	return rc;
}

long x3_reader_index(const x3_reader *r) { return r->index; }
uint64_t x3_reader_checksum(const x3_reader *r) { return r->want; }
const char *x3_reader_label(const x3_reader *r) { return r->label; }

static int finish_payload(x3_reader *r)
{
	/* called when r->left reached 0 */
	uint64_t h = XXH3_64bits_digest(r->hs);
	if (h != r->want)
		return x3_err(X3_EFORMAT, "%s: frame %ld '%s': checksum mismatch "
		              "(header says %016" PRIx64 ", payload hashes to %016" PRIx64 ")",
		              r->label, r->index, r->cur ? r->cur->name : "?", r->want, h);
	return X3_OK;
}

/* Parse and validate a frame header; on success *out is a data-less tensor. */
static int parse_header(x3_reader *r, const char *json, size_t n, x3_tensor **out)
{
	json_error_t je;
	const char *fr = r->label;
	long fi = r->index;
	size_t u = x3_utf8_valid_prefix(json, n);   /* JSON text is UTF-8 (RFC 8259) */
	if (u != n)
		return x3_err(X3_EFORMAT, "%s: frame %ld: header is not valid UTF-8 (byte 0x%02x at offset %zu)",
		              fr, fi, (unsigned char)json[u], u);
	json_t *root = json_loadb(json, n, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return x3_err(X3_EFORMAT, "%s: frame %ld: invalid JSON header: %s (line %d, column %d)",
		              fr, fi, je.text, je.line, je.column);
	int rc = X3_EFORMAT;
	x3_tensor *t = NULL;
	const char *name = NULL, *k;
	json_t *ent = NULL, *meta = NULL, *v;
	if (!json_is_object(root)) {
		x3_err(rc, "%s: frame %ld: header is not a JSON object", fr, fi);
		goto out;
	}
	json_object_foreach(root, k, v) {
		if (!strcmp(k, "__metadata__")) {
			meta = v;
			continue;
		}
		if (name) {
			x3_err(rc, "%s: frame %ld: header holds more than one tensor ('%s', '%s')", fr, fi, name, k);
			goto out;
		}
		name = k;
		ent = v;
	}
	if (!name) {
		x3_err(rc, "%s: frame %ld: header holds no tensor", fr, fi);
		goto out;
	}
	char where[4200];
	snprintf(where, sizeof where, "%s: frame %ld", fr, fi);
	uint64_t off;
	if ((rc = x3_stentry_check(where, name, ent, X3_FRAME_MAX_PAYLOAD, 1, &t, &off)) != X3_OK)
		goto out;
	rc = X3_EFORMAT;
	if (meta) {
		if (!json_is_object(meta)) {
			x3_err(rc, "%s: frame %ld '%s': __metadata__ is not an object", fr, fi, name);
			goto out;
		}
		json_object_foreach(meta, k, v) {
			if (!json_is_string(v)) {
				x3_err(rc, "%s: frame %ld '%s': metadata '%s' is not a string", fr, fi, name, k);
				goto out;
			}
			if (x3_meta_set(t, k, json_string_value(v)) != X3_OK) {
				rc = X3_ENOMEM;
				goto out;
			}
		}
	}
	const char *hx = x3_meta_get(t, "xxh3");
	if (!hx) {
		x3_err(rc, "%s: frame %ld '%s': no xxh3 checksum in __metadata__ (not an exl3kit frame)",
		       fr, fi, name);
		goto out;
	}
	char *endp;
	errno = 0;
	r->want = strtoull(hx, &endp, 16);
	if (errno || strlen(hx) != 16 || *endp) {
		x3_err(rc, "%s: frame %ld '%s': malformed xxh3 checksum '%s'", fr, fi, name, hx);
		goto out;
	}
	x3_meta_del(t, "xxh3");
	x3_meta_del(t, "x3f");
	rc = X3_OK;
	*out = t;
	t = NULL;
out:
	x3_tensor_free(t);
	json_decref(root);
	return rc;
}

int x3_reader_next_header(x3_reader *r, x3_tensor **out)
{
	int rc;
	*out = NULL;
	if (r->cur) {  /* previous payload not consumed: skip it */
		if ((rc = x3_reader_skip(r)))
			return rc;
	}
	unsigned char lb[8];
	size_t got;
	r->index++;
	if ((rc = src_read(r, lb, 8, &got)))
		return rc;
	if (got == 0)
		return X3_EOF;
	if (got < 8)
		return x3_err(X3_EIO, "%s: frame %ld: truncated header length: got %zu of 8 bytes",
		              r->label, r->index, got);
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | lb[i];
	if (n > X3_FRAME_MAX_HEADER || n < 2)
		return x3_err(X3_EFORMAT, "%s: frame %ld: bad magic: not a frame stream "
		              "(header length %" PRIu64 " is outside 2..%u)", r->label, r->index, n,
		              X3_FRAME_MAX_HEADER);
	char *hb = malloc(n + 1);
	if (!hb)
		return x3_err(X3_ENOMEM, "out of memory reading a header of %" PRIu64 " bytes", n);
	if ((rc = src_read(r, hb, n, &got))) {
		free(hb);
		return rc;
	}
	if (got < n) {
		free(hb);
		return x3_err(X3_EIO, "%s: frame %ld: truncated header: got %zu of %" PRIu64 " bytes",
		              r->label, r->index, got, n);
	}
	hb[n] = 0;
	if (hb[0] != '{') {
		free(hb);
		return x3_err(X3_EFORMAT, "%s: frame %ld: bad magic: header does not start with '{'",
		              r->label, r->index);
	}
	/* trailing spaces are padding */
	size_t len = n;
	while (len > 0 && hb[len - 1] == ' ')
		len--;
	x3_tensor *t;
	rc = parse_header(r, hb, len, &t);
	free(hb);
	if (rc)
		return rc;
	if (!r->hs && !(r->hs = XXH3_createState())) {
		x3_tensor_free(t);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	XXH3_64bits_reset(r->hs);
	r->left = t->nbytes;
	r->cur = t;
	if (r->left == 0) {
		r->cur = NULL;
		rc = finish_payload(r);
		if (rc) {
			x3_tensor_free(t);
			return rc;
		}
	}
	*out = t;
	return X3_OK;
}

int x3_reader_data(x3_reader *r, void *buf, size_t n)
{
	if (!r->cur || n > r->left)
		return x3_err(X3_EINVAL, "%s: read past the end of the payload", r->label);
	size_t got;
	int rc = src_read(r, buf, n, &got);
	if (rc)
		return rc;
	if (got < n) {
		uint64_t miss = r->left - got;
		const char *nm = r->cur->name;
		uint64_t total = r->cur->nbytes;
		x3_err(X3_EIO, "%s: frame %ld '%s': truncated payload: got %" PRIu64 " of %" PRIu64
		       " bytes (%" PRIu64 " missing)", r->label, r->index, nm, total - miss, total, miss);
		r->cur = NULL;
		return X3_EIO;
	}
	XXH3_64bits_update(r->hs, buf, n);
	r->left -= n;
	if (r->left == 0) {
		rc = finish_payload(r);
		r->cur = NULL;
		return rc;
	}
	return X3_OK;
}

int x3_reader_peek(x3_reader *r, const void **p, size_t max, size_t *got)
{
	*got = 0;
	if (!r->cur || !r->left)
		return x3_err(X3_EINVAL, "%s: read past the end of the payload", r->label);
	if (max > r->left)
		max = (size_t)r->left;
	const unsigned char *src;
	size_t k;
	int rc = avail(r, &src, &k);
	if (rc)
		return rc;
	if (k == 0) {   /* end of input inside the payload: report the truncation */
		unsigned char one;
		return x3_reader_data(r, &one, 1);
	}
	if (k > max)
		k = max;
	XXH3_64bits_update(r->hs, src, k);
	consume(r, k);
	r->left -= k;
	*p = src;
	*got = k;
	if (r->left == 0) {
		rc = finish_payload(r);
		r->cur = NULL;
		return rc;
	}
	return X3_OK;
}

int x3_reader_skip(x3_reader *r)
{
	static _Thread_local unsigned char tmp[1 << 16];
	while (r->cur && r->left) {
		size_t k = r->left < sizeof tmp ? (size_t)r->left : sizeof tmp;
		int rc = x3_reader_data(r, tmp, k);
		if (rc)
			return rc;
	}
	r->cur = NULL;
	return X3_OK;
}

int x3_reader_load(x3_reader *r, x3_tensor *t)
{
	/* The header's size is a claim: grow the buffer as the bytes arrive
	 * (doubling from 64 MiB), so that a frame declaring 4 TiB on a short
	 * stream is a "truncated payload", not "out of memory". */
	const size_t first = (size_t)64 << 20;
	size_t cap = t->nbytes < first ? t->nbytes : first, got = 0;
	unsigned char *buf = malloc(cap ? cap : 1);
	if (!buf)
		return x3_err(X3_ENOMEM, "out of memory for '%s' (%zu bytes)", t->name, cap);
	while (got < t->nbytes) {
		if (got == cap) {
			size_t nc = cap > t->nbytes / 2 ? t->nbytes : 2 * cap;
			unsigned char *nb = realloc(buf, nc);
			if (!nb) {
				free(buf);
				return x3_err(X3_ENOMEM, "out of memory for '%s' (%zu bytes)", t->name, t->nbytes);
			}
			buf = nb;
			cap = nc;
		}
		int rc = x3_reader_data(r, buf + got, cap - got);
		if (rc) {
			free(buf);
			return rc;
		}
		got = cap;
	}
	t->data = buf;
	t->owns_data = 1;
	return X3_OK;
}

int x3_reader_next(x3_reader *r, x3_tensor **out)
{
	x3_tensor *t;
	*out = NULL;
	int rc = x3_reader_next_header(r, &t);
	if (!rc && (rc = x3_reader_load(r, t)))
		x3_tensor_free(t);
	if (!rc)
		*out = t;
	return rc;
}

void x3_reader_close(x3_reader *r)
{
	if (!r)
		return;
	if (r->own_fd)
		close(r->fd);
	if (r->zd)
		ZSTD_freeDStream(r->zd);
	if (r->hs)
		XXH3_freeState(r->hs);
	free(r->out);
	free(r->raw);
	free(r->label);
	free(r);
}

/* ---- writer ------------------------------------------------------------ */
struct x3_writer {
	int fd;
	int err;
	ZSTD_CStream *zc;
	unsigned char *buf;   /* plain: pending output; zstd: compressed output */
	size_t len;
	uint64_t left;        /* payload bytes still expected */
};

static int write_all(x3_writer *w, const void *p, size_t n)
{
	if (x3_write_full(w->fd, p, n)) {
		/* the writer has no name; standard output is the common case */
		w->err = w->fd == 1 ? x3_err(X3_EIO, "writing standard output: %s", strerror(errno))
		                    : x3_err(X3_EIO, "write error: %s", strerror(errno));
		return w->err;
	}
	return X3_OK;
}

static int wflush_plain(x3_writer *w)
{
	int rc = w->len ? write_all(w, w->buf, w->len) : X3_OK;
	w->len = 0;
	return rc;
}

static int wbytes(x3_writer *w, const void *p, size_t n)
{
	if (w->err)
		return w->err;
	if (!w->zc) {
		if (w->len + n > RAW_CAP || n >= (1u << 16)) {
			/* large chunks go straight to the fd, without a copy */
			if (wflush_plain(w))
				return w->err;
			if (n >= (1u << 16))
				return write_all(w, p, n);
		}
		memcpy(w->buf + w->len, p, n);
		w->len += n;
		return X3_OK;
	}
	ZSTD_inBuffer in = {p, n, 0};
	while (in.pos < in.size) {
		ZSTD_outBuffer out = {w->buf, RAW_CAP, 0};
		size_t z = ZSTD_compressStream2(w->zc, &out, &in, ZSTD_e_continue);
		if (ZSTD_isError(z))
			return w->err = x3_err(X3_EIO, "zstd: %s", ZSTD_getErrorName(z));
		if (out.pos && write_all(w, w->buf, out.pos))
			return w->err;
	}
	return X3_OK;
}

int x3_writer_open_fd(int fd, int zstd_level, x3_writer **out)
{
	x3_writer *w = calloc(1, sizeof *w);
	if (!w || !(w->buf = malloc(RAW_CAP))) {
		free(w);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	w->fd = fd;
	grow_pipe(fd);
	if (zstd_level > 0) {
		w->zc = ZSTD_createCCtx();
		if (!w->zc) {
			free(w->buf);
			free(w);
			return x3_err(X3_ENOMEM, "out of memory");
		}
		ZSTD_CCtx_setParameter(w->zc, ZSTD_c_compressionLevel, zstd_level);
		ZSTD_CCtx_setParameter(w->zc, ZSTD_c_checksumFlag, 1);
	}
	*out = w;
	return X3_OK;
}

int x3_writer_put_header(x3_writer *w, const x3_tensor *t, uint64_t xxh3)
{
	if (w->err)
		return w->err;
	if (w->left)
		return x3_err(X3_EINVAL, "previous payload incomplete (%llu bytes missing)",
		              (unsigned long long)w->left);
	size_t nb;
	int rc = x3_shape_nbytes(t->dtype, t->rank, t->shape, &nb);
	if (rc)
		return rc;
	/* jansson drops what is not UTF-8 (a set_new of a NULL string fails):
	 * a header without its tensor or a note would be written silently */
	if ((rc = x3_tensor_check_utf8(t, 1)))
		return rc;
	if (!strcmp(t->name, "__metadata__"))
		return x3_err(X3_EINVAL, "tensor name '__metadata__' is reserved for the frame's metadata");
	json_t *root = json_object(), *ent = json_object(), *shape = json_array(), *meta = json_object(),
	       *off = json_array();
	int bad = !root || !ent || !shape || !meta || !off;
	for (int i = 0; !bad && i < t->rank; i++)
		bad |= json_array_append_new(shape, json_integer(t->shape[i]));
	bad |= json_array_append_new(off, json_integer(0));
	bad |= json_array_append_new(off, json_integer((json_int_t)nb));
	bad |= json_object_set_new(ent, "dtype", json_string(x3_dtype_name(t->dtype)));
	bad |= json_object_set_new(ent, "shape", shape);
	bad |= json_object_set_new(ent, "data_offsets", off);
	bad |= json_object_set_new(root, t->name, ent);
	bad |= json_object_set_new(meta, "x3f", json_string(X3_FRAME_VERSION));
	char hx[17];
	snprintf(hx, sizeof hx, "%016" PRIx64, xxh3);
	bad |= json_object_set_new(meta, "xxh3", json_string(hx));
	for (int i = 0; i < t->nmeta; i++)
		if (strcmp(t->meta[i].key, "xxh3") && strcmp(t->meta[i].key, "x3f"))
			bad |= json_object_set_new(meta, t->meta[i].key, json_string(t->meta[i].val));
	bad |= json_object_set_new(root, "__metadata__", meta);
	char *s = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	if (!s)
		return x3_err(X3_ENOMEM, "frame '%s': cannot build the header: out of memory", t->name);
	size_t n = strlen(s), pad = (8 - n % 8) % 8;
	unsigned char lb[8];
	uint64_t hn = n + pad;
	for (int i = 0; i < 8; i++)
		lb[i] = (unsigned char)(hn >> (8 * i));
	rc = wbytes(w, lb, 8);
	if (!rc)
		rc = wbytes(w, s, n);
	if (!rc)
		rc = wbytes(w, "        ", pad);
	free(s);
	if (rc)
		return rc;
	w->left = nb;
	return X3_OK;
}

int x3_writer_put_data(x3_writer *w, const void *buf, size_t n)
{
	if (n > w->left)
		return x3_err(X3_EINVAL, "payload longer than declared");
	w->left -= n;
	return wbytes(w, buf, n);
}

int x3_writer_put(x3_writer *w, const x3_tensor *t)
{
	if (!t->data && t->nbytes)
		return x3_err(X3_EINVAL, "tensor '%s' has no data", t->name);
	int rc = x3_writer_put_header(w, t, XXH3_64bits(t->data, t->nbytes));
	if (!rc && t->nbytes)
		rc = x3_writer_put_data(w, t->data, t->nbytes);
	return rc;
}

int x3_writer_flush(x3_writer *w)
{
	if (w->err)
		return w->err;
	if (!w->zc)
		return wflush_plain(w);
	ZSTD_inBuffer in = {NULL, 0, 0};
	size_t z;
	do {
		ZSTD_outBuffer out = {w->buf, RAW_CAP, 0};
		z = ZSTD_compressStream2(w->zc, &out, &in, ZSTD_e_flush);
		if (ZSTD_isError(z))
			return w->err = x3_err(X3_EIO, "zstd: %s", ZSTD_getErrorName(z));
		if (out.pos && write_all(w, w->buf, out.pos))
			return w->err;
	} while (z);
	return X3_OK;
}

int x3_writer_close(x3_writer *w)
{
	if (!w)
		return X3_OK;
	int rc = w->err;
	if (!rc && w->left)
		rc = x3_err(X3_EIO, "stream closed inside a payload (%llu bytes missing)",
		            (unsigned long long)w->left);
	if (!rc && w->zc) {
		ZSTD_inBuffer in = {NULL, 0, 0};
		size_t z;
		do {
			ZSTD_outBuffer out = {w->buf, RAW_CAP, 0};
			z = ZSTD_compressStream2(w->zc, &out, &in, ZSTD_e_end);
			if (ZSTD_isError(z)) {
				rc = x3_err(X3_EIO, "zstd: %s", ZSTD_getErrorName(z));
				break;
			}
			if (out.pos && (rc = write_all(w, w->buf, out.pos)))
				break;
		} while (z);
	} else if (!rc) {
		rc = wflush_plain(w);
	}
	if (w->zc)
		ZSTD_freeCCtx(w->zc);
	free(w->buf);
	free(w);
	return rc;
}

int x3_read_all(const char *path, x3_tensor ***out, int *n)
{
	x3_reader *r;
	int rc = x3_reader_open(path, &r);
	*out = NULL;
	*n = 0;
	if (rc)
		return rc;
	x3_tensor **v = NULL;
	int cnt = 0;
	for (;;) {
		x3_tensor *t;
		rc = x3_reader_next(r, &t);
		if (rc == X3_EOF) {
			rc = X3_OK;
			break;
		}
		if (rc)
			break;
		x3_tensor **nv = realloc(v, (cnt + 1) * sizeof *nv);
		if (!nv) {
			x3_tensor_free(t);
			rc = x3_err(X3_ENOMEM, "out of memory");
			break;
		}
		v = nv;
		v[cnt++] = t;
	}
	x3_reader_close(r);
	if (rc) {
		x3_tensors_free(v, cnt);
		return rc;
	}
	*out = v;
	*n = cnt;
	return X3_OK;
}

void x3_tensors_free(x3_tensor **v, int n)
{
	for (int i = 0; i < n; i++)
		x3_tensor_free(v[i]);
	free(v);
}

int x3_source_kind(const char *path, int *kind)
{
	struct stat st;
	if (!strcmp(path, "-")) {
		*kind = X3_SRC_FRAMES;
		return X3_OK;
	}
	if (stat(path, &st) != 0)
		return x3_err(X3_EIO, "%s: %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		*kind = X3_SRC_DIR;
		return X3_OK;
	}
	/* A file whose header parses as JSON is safetensors unless its
	 * __metadata__ carries "x3f"; an unparsable one is judged by its name,
	 * so that the right reader reports what is wrong with it. */
	size_t pl = strlen(path);
	int st_name = pl >= 12 && !strcmp(path + pl - 12, ".safetensors");
	*kind = st_name ? X3_SRC_SAFETENSORS : X3_SRC_FRAMES;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return x3_err(X3_EIO, "%s: %s", path, strerror(errno));
	unsigned char b[8];
	ssize_t n = read(fd, b, 8);
	if (n >= 4 && (b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24) == ZSTD_MAGIC) {
		*kind = X3_SRC_FRAMES;
	} else if (n == 8) {
		uint64_t hn = 0;
		for (int i = 7; i >= 0; i--)
			hn = hn << 8 | b[i];
		if (hn >= 2 && hn <= X3_FRAME_MAX_HEADER) {
			char *h = malloc(hn + 1);
			ssize_t k = h ? read(fd, h, hn) : -1;
			json_t *root = k == (ssize_t)hn ? json_loadb(h, (size_t)k, 0, NULL) : NULL;
			if (root) {
				json_t *m = json_object_get(root, "__metadata__");
				*kind = m && json_object_get(m, "x3f") ? X3_SRC_FRAMES : X3_SRC_SAFETENSORS;
				json_decref(root);
			}
			free(h);
		}
	}
	close(fd);
	return X3_OK;
}
