/* calib.c: text and token inputs (see calib.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include "calib.h"
#include "frame.h"

static int grow(char **buf, size_t *cap, size_t need, size_t max, const char *path)
{
	if (need <= *cap)
		return X3_OK;
	if (need > max)
		return x3_err(X3_ENOMEM, "%s: larger than %zu bytes", path, max);
	size_t nc = *cap ? *cap : 1 << 16;
	while (nc < need)
		nc *= 2;
	if (nc > max + 1)
		nc = max + 1;
	char *nb = realloc(*buf, nc);
	if (!nb)
		return x3_err(X3_ENOMEM, "%s: out of memory", path);
	*buf = nb, *cap = nc;
	return X3_OK;
}

int x3_text_read(const char *path, size_t max_bytes, char **out, size_t *outlen)
{
	if (!max_bytes)
		max_bytes = (size_t)4 << 30;
	int is_stdin = !strcmp(path, "-");
	FILE *f = is_stdin ? stdin : fopen(path, "rb");
	if (!f)
		return x3_err(X3_EIO, "%s: %s", path, strerror(errno));
	char *raw = NULL;
	size_t len = 0, cap = 0;
	int rc = X3_OK;
	for (;;) {
		if ((rc = grow(&raw, &cap, len + 65536, max_bytes + 65536, path)))
			break;
		size_t n = fread(raw + len, 1, cap - len, f);
		len += n;
		if (n == 0)
			break;
	}
	if (!rc && ferror(f))
		rc = x3_err(X3_EIO, "%s: read error: %s", path, strerror(errno));
	if (!is_stdin)
		fclose(f);
	if (rc) {
		free(raw);
		return rc;
	}
	static const unsigned char zmagic[4] = { 0x28, 0xb5, 0x2f, 0xfd };
	if (len >= 4 && !memcmp(raw, zmagic, 4)) {
		ZSTD_DStream *z = ZSTD_createDStream();
		char *dec = NULL;
		size_t dlen = 0, dcap = 0;
		if (!z) {
			free(raw);
			return x3_err(X3_ENOMEM, "%s: zstd: out of memory", path);
		}
		ZSTD_initDStream(z);
		ZSTD_inBuffer in = { raw, len, 0 };
		size_t ret = 1;
		while (!rc && in.pos < in.size) {
			if ((rc = grow(&dec, &dcap, dlen + (1 << 17), max_bytes + (1 << 17), path)))
				break;
			ZSTD_outBuffer ob = { dec + dlen, dcap - dlen - 1, 0 };
			ret = ZSTD_decompressStream(z, &ob, &in);
			if (ZSTD_isError(ret))
				rc = x3_err(X3_EFORMAT, "%s: zstd: %s", path, ZSTD_getErrorName(ret));
			dlen += ob.pos;
			if (dlen > max_bytes)
				rc = x3_err(X3_ENOMEM, "%s: larger than %zu bytes", path, max_bytes);
		}
		if (!rc && ret != 0)
			rc = x3_err(X3_EIO, "%s: truncated zstd stream", path);
		ZSTD_freeDStream(z);
		free(raw);
		if (rc) {
			free(dec);
			return rc;
		}
		raw = dec, len = dlen, cap = dcap;
	}
	if ((rc = grow(&raw, &cap, len + 1, max_bytes + 65536, path))) {
		free(raw);
		return rc;
	}
	raw[len] = 0;
	*out = raw;
	*outlen = len;
	return X3_OK;
}

int x3_tokens_read(const char *path, int32_t **ids, size_t *n, int64_t *last_dim)
{
	x3_reader *r;
	int rc = x3_reader_open(path, &r);
	if (rc)
		return rc;
	x3_tensor *t;
	while ((rc = x3_reader_next(r, &t)) == X3_OK) {
		int64_t m = x3_tensor_numel(t);
		if (t->dtype != X3_I32 && t->dtype != X3_I64 && t->dtype != X3_I16 &&
		    t->dtype != X3_U16 && t->dtype != X3_U32 && t->dtype != X3_U8 && t->dtype != X3_I8) {
			rc = x3_err(X3_EFORMAT, "%s: frame '%s': dtype %s is not an integer type",
			            path, t->name, x3_dtype_name(t->dtype));
			x3_tensor_free(t);
			break;
		}
		int32_t *nv = realloc(*ids, (*n + (size_t)m + 1) * sizeof *nv);
		if (!nv) {
			x3_tensor_free(t);
			rc = x3_err(X3_ENOMEM, "%s: out of memory", path);
			break;
		}
		*ids = nv;
		for (int64_t i = 0; i < m && !rc; i++) {
			int64_t v;
			const void *d = t->data;
			switch (t->dtype) {
			case X3_I64: v = ((const int64_t *)d)[i]; break;
			case X3_I32: v = ((const int32_t *)d)[i]; break;
			case X3_U32: v = ((const uint32_t *)d)[i]; break;
			case X3_I16: v = ((const int16_t *)d)[i]; break;
			case X3_U16: v = ((const uint16_t *)d)[i]; break;
			case X3_I8: v = ((const int8_t *)d)[i]; break;
			default: v = ((const uint8_t *)d)[i]; break;
			}
			if (v < INT32_MIN || v > INT32_MAX)
				rc = x3_err(X3_EFORMAT, "%s: frame '%s': token id %lld out of range",
				            path, t->name, (long long)v);
			(*ids)[*n + (size_t)i] = (int32_t)v;
		}
		if (!rc) {
			*n += (size_t)m;
			if (last_dim && !*last_dim && t->rank > 0)
				*last_dim = t->shape[t->rank - 1];
		}
		x3_tensor_free(t);
		if (rc)
			break;
	}
	x3_reader_close(r);
	if (rc == X3_EOF)
		rc = X3_OK;
	return rc;
}

int x3_text_rows(x3_tok *tok, char *const *paths, int npaths, int split,
                 const struct x3_tok_pack_opts *po, size_t rows, size_t cols,
                 int32_t **out, size_t *rows_out)
{
	char **bufs = calloc((size_t)npaths + 1, sizeof *bufs);
	const char **docs = NULL;
	size_t *dlens = NULL, ndocs = 0, bytes = 0;
	int rc = bufs ? X3_OK : x3_err(X3_ENOMEM, "out of memory");
	for (int i = 0; i < npaths && !rc; i++) {
		size_t len, *off = NULL, *lens = NULL, nd = 0;
		if ((rc = x3_text_read(paths[i], 0, &bufs[i], &len)))
			break;
		if ((rc = x3_tok_split_docs(bufs[i], len, split, &off, &lens, &nd))) {
			x3_errprefix(rc, "%s", paths[i]);
			break;
		}
		const char **nd_docs = realloc(docs, (ndocs + nd + 1) * sizeof *docs);
		size_t *nd_lens = nd_docs ? realloc(dlens, (ndocs + nd + 1) * sizeof *dlens) : NULL;
		if (nd_docs)
			docs = nd_docs;
		if (nd_lens)
			dlens = nd_lens;
		if (!nd_docs || !nd_lens) {
			rc = x3_err(X3_ENOMEM, "%s: out of memory", paths[i]);
		} else {
			for (size_t j = 0; j < nd; j++) {
				docs[ndocs + j] = bufs[i] + off[j];
				dlens[ndocs + j] = lens[j];
				bytes += lens[j] + 2;   /* at most a token per byte, + BOS/EOS */
			}
			ndocs += nd;
		}
		free(off);
		free(lens);
	}
	if (!rc && !rows)
		rows = bytes / cols + 1;
	if (!rc)
		rc = x3_tok_pack_rows(tok, docs, dlens, ndocs, rows, cols, po, out, rows_out);
	for (int i = 0; bufs && i < npaths; i++)
		free(bufs[i]);
	free(bufs);
	free(docs);
	free(dlens);
	return rc;
}
