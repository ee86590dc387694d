/* tok_rows.c: documents and rows: a text split into documents (by blank
 * lines or lines) and tokenized documents packed into calibration rows. */
#include <stdlib.h>
#include <string.h>
#include "tok_impl.h"

/* ---- documents and rows -------------------------------------------------------------- */
static int blank(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n' && s[i] != '\f' && s[i] != '\v') return 0;
	return 1;
}

int x3_tok_split_docs(const char *text, size_t len, enum x3_tok_split mode, size_t **off, size_t **lens, size_t *n)
{
	size_t cap = 0, k = 0, *o = NULL, *l = NULL, capl = 0;
	int rc = X3_OK;
	*off = *lens = NULL;
	*n = 0;
#define PUSHDOC(a, b) do { \
		if (!blank(text + (a), (b) - (a))) { \
			if ((rc = grow((void **)&o, &cap, k + 1, sizeof *o)) || \
			    (rc = grow((void **)&l, &capl, k + 1, sizeof *l))) goto fail; \
			o[k] = (a); l[k] = (b) - (a); k++; \
		} } while (0)
	if (mode == X3_SPLIT_WHOLE) {
		PUSHDOC(0, len);
	} else if (mode == X3_SPLIT_LINES || mode == X3_SPLIT_BLANK) {
		size_t i = 0, start = 0, last = 0;   /* BLANK: paragraph [start, last) */
		int inpar = 0;
		while (i < len) {
			const char *nl = memchr(text + i, '\n', len - i);
			size_t e = nl ? (size_t)(nl - text) : len, ce = e;
			if (ce > i && text[ce - 1] == '\r') ce--;
			if (mode == X3_SPLIT_LINES) PUSHDOC(i, ce);
			else if (blank(text + i, ce - i)) {
				if (inpar) PUSHDOC(start, last);
				inpar = 0;
			} else {
				if (!inpar) start = i;
				inpar = 1;
				last = ce;
			}
			i = nl ? e + 1 : len;
		}
		if (mode == X3_SPLIT_BLANK && inpar) PUSHDOC(start, last);
	} else
		return x3_err(X3_EINVAL, "unknown document split mode %d", (int)mode);
#undef PUSHDOC
	if (!o && ((rc = grow((void **)&o, &cap, 1, sizeof *o)) || (rc = grow((void **)&l, &capl, 1, sizeof *l)))) goto fail;
	*off = o;
	*lens = l;
	*n = k;
	return X3_OK;
fail:
	free(o);
	free(l);
	return rc;
}

void x3_tok_pack_defaults(const x3_tok *t, struct x3_tok_pack_opts *o)
{
	memset(o, 0, sizeof *o);
	o->mode = X3_PACK_ARTICLES;
	o->bos = 1;
	o->pad_id = t->eos >= 0 ? t->eos : 0;
}

int x3_tok_pack_rows(x3_tok *t, const char *const *docs, const size_t *lens, size_t ndocs, size_t rows, size_t cols,
                     const struct x3_tok_pack_opts *o, int32_t **out, size_t *rows_out)
{
	*out = NULL;
	*rows_out = 0;
	if (!rows || !cols) return x3_err(X3_EINVAL, "rows and cols must be positive");
	if (rows > SIZE_MAX / sizeof(int32_t) / cols) return x3_err(X3_ENOMEM, "%zu x %zu tokens: too large", rows, cols);
	if (o->mode != X3_PACK_ARTICLES && o->mode != X3_PACK_STREAM)
		return x3_err(X3_EINVAL, "unknown packing mode %d", (int)o->mode);
	int32_t *m = malloc(rows * cols * sizeof *m);
	if (!m) return x3_err(X3_ENOMEM, "out of memory for %zu x %zu tokens", rows, cols);
	size_t r = 0, c = 0;
	int rc = X3_OK;
	for (size_t d = 0; d < ndocs && r < rows; d++) {
		int even = r % 2 == 0;
		int bos = (o->even_odd ? even : o->bos) && t->bos >= 0;
		int eos = (o->even_odd ? even : o->eos) && t->eos >= 0;
		int32_t *ids;
		size_t n;
		if ((rc = x3_tok_encode(t, docs[d], lens[d], 0, &ids, &n))) { free(m); return x3_errprefix(rc, "document %zu", d); }
		size_t total = n + (size_t)bos + (size_t)eos;
		for (size_t i = 0; i < total && r < rows; i++) {
			int32_t id = i == 0 && bos ? t->bos : (eos && i == total - 1) ? t->eos : ids[i - (size_t)bos];
			m[r * cols + c] = id;
			if (++c == cols) {
				c = 0;
				r++;
				if (o->mode == X3_PACK_ARTICLES) break;   /* the rest of this document is dropped */
			}
		}
		free(ids);
	}
	if (c > 0 && r < rows) {
		if (o->keep_partial) {
			for (; c < cols; c++) m[r * cols + c] = o->pad_id;
			r++;
		}
	}
	*out = m;
	*rows_out = r;
	return X3_OK;
}

int x3_tok_pack_text(x3_tok *t, const char *text, size_t len, enum x3_tok_split split, size_t rows, size_t cols,
                     const struct x3_tok_pack_opts *o, int32_t **out, size_t *rows_out)
{
	size_t *off, *lens, n;
	int rc = x3_tok_split_docs(text, len, split, &off, &lens, &n);
	if (rc) return rc;
	const char **docs = malloc((n ? n : 1) * sizeof *docs);
	if (!docs) { free(off); free(lens); return x3_err(X3_ENOMEM, "out of memory"); }
	for (size_t i = 0; i < n; i++) docs[i] = text + off[i];
	rc = x3_tok_pack_rows(t, docs, lens, n, rows, cols, o, out, rows_out);
	free(docs);
	free(off);
	free(lens);
	return rc;
}
