/* quant_tiles.c: tiles in trellis order and the Viterbi of a batch of
 * tiles with each distinct tile encoded once (the memo), timed per thread
 * for x3_qresult.t_viterbi. Shared by the scale search and LDLQ. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "codec.h"
#include "quant.h"
#include "quant_impl.h"

/* tile (tr, tc) of W (k x n) in trellis order */
void x3q_get_tile(const float *W, int64_t n, int64_t tr, int64_t tc, float *t)
{
	for (int i = 0; i < 256; i++) {
		int p = x3_tile_perm[i];
		t[i] = W[(tr * 16 + p / 16) * n + tc * 16 + p % 16];
	}
}

/* ---- encoding equal tiles once ---------------------------------------- */
/* The Viterbi result of a tile is a function of its 256 input values alone
 * (codec.h), so a batch encodes each distinct tile once and copies the
 * result to its repeats; the output is what encoding every tile gives.
 * Repeats are common where padding meets the Hadamard transform: a 128-block
 * whose upper half is zero comes out of the transform as two equal halves,
 * so a 64x64 weight padded to 128x128 is four copies of one 64x64 block,
 * and the scale search's sample often holds a tile twice. A memo can also
 * keep the results between batches (the scale search's coarse and fine
 * grids share a scale). */
void x3q_tmemo_free(struct x3q_tmemo *m)
{
	free(m->slot), free(m->hash), free(m->x), free(m->v), free(m->s);
	memset(m, 0, sizeof *m);
}

/* Room for `more` new entries (the slots at most half full). */
static int tmemo_reserve(struct x3q_tmemo *m, int64_t more)
{
	int64_t need = m->n + more;
	if (need > m->cap) {
		int64_t cap = m->cap ? m->cap : 64;
		while (cap < need)
			cap *= 2;
		uint64_t *h = realloc(m->hash, (size_t)cap * sizeof *h);
		if (h)
			m->hash = h;
		float *x = realloc(m->x, (size_t)cap * 256 * sizeof *x);
		if (x)
			m->x = x;
		float *v = realloc(m->v, (size_t)cap * 256 * sizeof *v);
		if (v)
			m->v = v;
		uint16_t *s = realloc(m->s, (size_t)cap * 256 * sizeof *s);
		if (s)
			m->s = s;
		if (!h || !x || !v || !s)
			return X3_ENOMEM;
		m->cap = cap;
	}
	if (2 * need > m->nslot) {
		int64_t ns = m->nslot ? m->nslot : 128;
		while (ns < 2 * need)
			ns *= 2;
		int64_t *sl = malloc((size_t)ns * sizeof *sl);
		if (!sl)
			return X3_ENOMEM;
		for (int64_t i = 0; i < ns; i++)
			sl[i] = -1;
		for (int64_t e = 0; e < m->n; e++) {
			int64_t j = (int64_t)(m->hash[e] & (uint64_t)(ns - 1));
			while (sl[j] >= 0)
				j = (j + 1) & (ns - 1);
			sl[j] = e;
		}
		free(m->slot);
		m->slot = sl;
		m->nslot = ns;
	}
	return X3_OK;
}

/* Entry of tile t (256 floats, hash h), or -1 with *free_slot set. */
static int64_t tmemo_find(const struct x3q_tmemo *m, const float *t, uint64_t h, int64_t *free_slot)
{
	int64_t j = (int64_t)(h & (uint64_t)(m->nslot - 1));
	for (; m->slot[j] >= 0; j = (j + 1) & (m->nslot - 1)) {
		int64_t e = m->slot[j];
		if (m->hash[e] == h && !memcmp(m->x + e * 256, t, 256 * sizeof *t))
			return e;
	}
	*free_slot = j;
	return -1;
}

/* wall seconds of this thread's x3_viterbi_encode calls (x3_qresult.t_viterbi) */
_Thread_local double x3q_vit_seconds;

/* x3_viterbi_encode of nt tiles x (states and values may be NULL), each
 * distinct tile encoded once; memo keeps the results for later calls (it
 * starts empty: {0}). */

int x3q_encode_tiles(int K, int cb, const float *x, int64_t nt, uint16_t *states,
                        float *values, int threads, struct x3q_tmemo *memo, int64_t *count)
{
	int64_t *ent = xmalloc((size_t)nt, sizeof *ent);
	int rc = ent ? tmemo_reserve(memo, nt) : X3_ENOMEM;
	if (rc) {
		free(ent);
		return x3_err(X3_ENOMEM, "out of memory for %lld tiles", (long long)nt);
	}
	int64_t first = memo->n;   /* entries from here on are new: to encode */
	for (int64_t t = 0; t < nt; t++) {
		const float *xt = x + t * 256;
		uint64_t h = XXH3_64bits(xt, 256 * sizeof *xt);
		int64_t fs = 0, e = tmemo_find(memo, xt, h, &fs);
		if (e < 0) {
			e = memo->n++;
			memo->slot[fs] = e;
			memo->hash[e] = h;
			memcpy(memo->x + e * 256, xt, 256 * sizeof *xt);
		}
		ent[t] = e;
	}
	int64_t nnew = memo->n - first;
	if (count)
		*count += nnew;
	double tv = x3_now();
	rc = x3_viterbi_encode(K, cb, memo->x + first * 256, nnew, memo->s + first * 256,
	                       memo->v + first * 256, threads);
	x3q_vit_seconds += x3_now() - tv;
	if (rc) {
		/* the error names a tile of the batch as given */
		free(ent);
		return x3_viterbi_encode(K, cb, x, nt, states, values, threads);
	}
	for (int64_t t = 0; t < nt; t++) {
		if (states)
			memcpy(states + t * 256, memo->s + ent[t] * 256, 256 * sizeof *states);
		if (values)
			memcpy(values + t * 256, memo->v + ent[t] * 256, 256 * sizeof *values);
	}
	free(ent);
	return X3_OK;
}
