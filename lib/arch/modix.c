/* modix.c: an index of a module list, so that the lookups by tensor name
 * that x3_modules_find/owner/slice_of/out_name/src_name make by scanning
 * the list take O(log n): the same answers (the first module in the list's
 * order where several match), for the callers that look up every tensor of
 * a model (a DeepSeek-V3 has ~45,000 linears and ~180,000 stream tensors). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "arch.h"

struct x3_modix {
	const x3_module *m;
	int n;
	int *bykey;          /* every module, by (key, position) */
	int *slice;          /* the row slices, by (src, position) */
	int nslice;
	int *ren;            /* the renamed modules, in list order */
	int nren;
};

/* qsort has no context argument: the list being sorted */
static const x3_module *sort_m;

static int by_key(const void *a, const void *b)
{
	int i = *(const int *)a, j = *(const int *)b;
	int c = strcmp(sort_m[i].key, sort_m[j].key);
	return c ? c : (i > j) - (i < j);
}

static int by_src(const void *a, const void *b)
{
	int i = *(const int *)a, j = *(const int *)b;
	int c = strcmp(sort_m[i].src, sort_m[j].src);
	return c ? c : (i > j) - (i < j);
}

/* the module reads its own tensors under another name (fused_key) */
static int renamed(const x3_module *m)
{
	return !m->sliced && strcmp(m->src, m->key);
}

int x3_modix_build(const x3_module *m, int n, x3_modix **out)
{
	x3_modix *ix = calloc(1, sizeof *ix);
	if (!ix || !(ix->bykey = malloc(((size_t)n + 1) * sizeof(int))) ||
	    !(ix->slice = malloc(((size_t)n + 1) * sizeof(int))) || !(ix->ren = malloc(((size_t)n + 1) * sizeof(int)))) {
		x3_modix_free(ix);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	ix->m = m, ix->n = n;
	for (int i = 0; i < n; i++) {
		ix->bykey[i] = i;
		if (m[i].sliced)
			ix->slice[ix->nslice++] = i;
		else if (renamed(&m[i]))
			ix->ren[ix->nren++] = i;
	}
	sort_m = m;
	qsort(ix->bykey, (size_t)n, sizeof(int), by_key);
	qsort(ix->slice, (size_t)ix->nslice, sizeof(int), by_src);
	sort_m = NULL;
	*out = ix;
	return X3_OK;
}

void x3_modix_free(x3_modix *ix)
{
	if (!ix)
		return;
	free(ix->bykey);
	free(ix->slice);
	free(ix->ren);
	free(ix);
}

/* strcmp of s with the first len bytes of k (as a string of that length) */
static int cmp_n(const char *s, const char *k, size_t len)
{
	int c = strncmp(s, k, len);
	return c ? c : s[len] ? 1 : 0;
}

/* the first position of idx[0..n) whose string (key or src) is the len
 * bytes at k, or -1 */
static int lower(const x3_modix *ix, const int *idx, int n, int src, const char *k, size_t len)
{
	int lo = 0, hi = n;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		const x3_module *mm = &ix->m[idx[mid]];
		if (cmp_n(src ? mm->src : mm->key, k, len) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < n && !cmp_n(src ? ix->m[idx[lo]].src : ix->m[idx[lo]].key, k, len))
		return lo;
	return -1;
}

const x3_module *x3_modix_find(const x3_modix *ix, const char *key)
{
	int p = lower(ix, ix->bykey, ix->n, 0, key, strlen(key));
	return p < 0 ? NULL : &ix->m[ix->bykey[p]];
}

const x3_module *x3_modix_owner(const x3_modix *ix, const char *name)
{
	const char *dot = strrchr(name, '.');
	if (!dot)
		return NULL;
	int p = lower(ix, ix->bykey, ix->n, 0, name, (size_t)(dot - name));
	return p < 0 ? NULL : &ix->m[ix->bykey[p]];
}

/* the first slice (by position) whose src is the len bytes at name and
 * whose fused flag is fused, or best (the best position so far) when
 * that is earlier */
static int slice_match(const x3_modix *ix, const char *name, size_t len, int fused, int best)
{
	int p = lower(ix, ix->slice, ix->nslice, 1, name, len);
	for (; p >= 0 && p < ix->nslice && !cmp_n(ix->m[ix->slice[p]].src, name, len); p++) {
		int i = ix->slice[p];
		if (!ix->m[i].fused == !fused && (best < 0 || i < best)) {
			best = i;
			break;   /* by position within one src */
		}
	}
	return best;
}

const x3_module *x3_modix_slice_of(const x3_modix *ix, const char *name)
{
	size_t nl = strlen(name);
	int best = slice_match(ix, name, nl, 1, -1);
	static const char *const sfx[] = { ".weight", ".bias" };
	for (int s = 0; s < 2; s++) {
		size_t sl = strlen(sfx[s]);
		if (nl > sl && !strcmp(name + nl - sl, sfx[s]))
			best = slice_match(ix, name, nl - sl, 0, best);
	}
	return best < 0 ? NULL : &ix->m[best];
}

void x3_modix_out_name(const x3_modix *ix, const char *name, char *buf, size_t len)
{
	for (int r = 0; r < ix->nren; r++) {
		const x3_module *m = &ix->m[ix->ren[r]];
		size_t sl = strlen(m->src);
		if (!strncmp(name, m->src, sl) && name[sl] == '.') {
			snprintf(buf, len, "%s%s", m->key, name + sl);
			return;
		}
	}
	snprintf(buf, len, "%s", name);
}

void x3_modix_src_name(const x3_modix *ix, const char *name, char *buf, size_t len)
{
	const x3_module *o = x3_modix_owner(ix, name);
	if (o && renamed(o))
		snprintf(buf, len, "%s%s", o->src, name + strlen(o->key));
	else
		snprintf(buf, len, "%s", name);
}
