/* strix.c: strings to ints by open addressing with linear probing, at
 * most half full so that every probe ends at an empty slot. */
#include <stdlib.h>
#include <string.h>
#include "strix.h"
#include "x3.h"

static size_t slot_of(const x3_strix *x, const char *key)
{
	size_t h = (size_t)x3_hash64(key, strlen(key)) & (x->cap - 1);
	while (x->key[h] && strcmp(x->key[h], key))
		h = (h + 1) & (x->cap - 1);
	return h;
}

int x3_strix_get(const x3_strix *x, const char *key)
{
	if (!x->cap)
		return -1;
	size_t h = slot_of(x, key);
	return x->key[h] ? x->val[h] : -1;
}

static int grow(x3_strix *x)
{
	size_t cap = x->cap ? 2 * x->cap : 64;
	x3_strix nx = { calloc(cap, sizeof *nx.key), malloc(cap * sizeof *nx.val), cap, x->n };
	if (!nx.key || !nx.val) {
		free(nx.key);
		free(nx.val);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < x->cap; i++)
		if (x->key[i]) {
			size_t h = slot_of(&nx, x->key[i]);
			nx.key[h] = x->key[i];
			nx.val[h] = x->val[i];
		}
	x3_strix_free(x);
	*x = nx;
	return X3_OK;
}

int x3_strix_put(x3_strix *x, const char *key, int val)
{
	if (2 * (x->n + 1) > x->cap) {
		int rc = grow(x);
		if (rc)
			return rc;
	}
	size_t h = slot_of(x, key);
	if (!x->key[h]) {
		x->key[h] = key;
		x->n++;
	}
	x->val[h] = val;
	return X3_OK;
}

/* Empties the slot and moves back the entries of its probe run that an
 * empty slot there would cut off from their home slot. */
void x3_strix_del(x3_strix *x, const char *key)
{
	if (!x->cap)
		return;
	size_t m = x->cap - 1, h = slot_of(x, key);
	if (!x->key[h])
		return;
	x->key[h] = NULL;
	x->n--;
	for (size_t j = (h + 1) & m; x->key[j]; j = (j + 1) & m) {
		size_t home = (size_t)x3_hash64(x->key[j], strlen(x->key[j])) & m;
		/* j stays reachable unless home lies cyclically in (h, j] */
		if (((j - home) & m) >= ((j - h) & m)) {
			x->key[h] = x->key[j], x->val[h] = x->val[j];
			x->key[j] = NULL;
			h = j;
		}
	}
}

void x3_strix_free(x3_strix *x)
{
	free(x->key);
	free(x->val);
	x->key = NULL, x->val = NULL, x->cap = 0, x->n = 0;
}
