/* bitalloc_solve.c: the budget solvers of bitalloc (bitalloc.h): the
 * exact multiple-choice knapsack, the Lagrangian for budgets too large for
 * it, and tied widths (a group of linears that must share one K solved as
 * one item). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bitalloc_impl.h"

static int64_t gcd64(int64_t a, int64_t b)
{
	while (b) {
		int64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* Exact multiple-choice knapsack over the budget in units of gcd(numel). */
static int solve_dp(x3_ba *ba)
{
	int T = ba->n;
	int64_t g = 0, base = 0;
	for (int i = 0; i < T; i++)
		g = gcd64(ba->t[i].cost, g);
	int *kmin = malloc((size_t)T * sizeof *kmin);
	if (!kmin)
		return x3_err(X3_ENOMEM, "out of memory");
	for (int i = 0; i < T; i++) {
		kmin[i] = min_allowed(&ba->t[i]);
		base += ba->t[i].cost / g * kmin[i];
	}
	int64_t R = ba->budget / g - base;   /* spare units above every tensor at kmin */
	if (R < 0) {
		free(kmin);
		return x3_err(X3_EINVAL, "target below the minimum");
	}
	if ((double)T * (double)(R + 1) > (double)x3_ba_dp_max_cells) {
		free(kmin);
		return x3_err(X3_ENOMEM, "exact allocation needs %lld x %lld cells (limit %lld)",
		              (long long)T, (long long)(R + 1), (long long)x3_ba_dp_max_cells);
	}
	size_t W = (size_t)R + 1;
	double *cur = malloc(W * sizeof *cur), *nxt = malloc(W * sizeof *nxt);
	unsigned char *ch = malloc((size_t)T * W);
	if (!cur || !nxt || !ch) {
		free(kmin); free(cur); free(nxt); free(ch);
		return x3_err(X3_ENOMEM, "out of memory for %lld x %lld DP cells", (long long)T, (long long)W);
	}
	for (size_t b = 0; b < W; b++)
		cur[b] = INFINITY;
	cur[0] = 0;
	for (int i = 0; i < T; i++) {
		const x3_ba_tensor *t = &ba->t[i];
		int64_t w = t->cost / g;
		unsigned char *c = ch + (size_t)i * W;
		for (size_t b = 0; b < W; b++) {
			nxt[b] = INFINITY;
			c[b] = 0;
		}
		for (int K = kmin[i]; K <= X3_BA_KMAX; K++) {
			if (!allowed(t, K))
				continue;
			int64_t e = w * (K - kmin[i]);
			if (e > R)
				break;
			double v = value(t, K);
			for (size_t b = 0; b + (size_t)e < W; b++) {
				if (cur[b] == INFINITY)
					continue;
				double s = cur[b] + v;
				if (s < nxt[b + (size_t)e]) {
					nxt[b + (size_t)e] = s;
					c[b + (size_t)e] = (unsigned char)K;
				}
			}
		}
		double *tmp = cur; cur = nxt; nxt = tmp;
	}
	/* least error; among equal errors the most bits */
	size_t best = 0;
	for (size_t b = 0; b < W; b++)
		if (cur[b] <= cur[best])
			best = b;
	int rc = X3_OK;
	if (cur[best] == INFINITY) {
		rc = x3_err(X3_EINVAL, "no feasible allocation");
	} else {
		for (int i = T - 1; i >= 0; i--) {
			int K = ch[(size_t)i * W + best];
			ba->t[i].K = K;
			best -= (size_t)((ba->t[i].cost / g) * (K - kmin[i]));
		}
	}
	free(kmin); free(cur); free(nxt); free(ch);
	ba->method = "dp";
	return rc;
}

struct seg { int i, from, to; double slope; };

static int seg_cmp(const void *a, const void *b)
{
	const struct seg *x = a, *y = b;
	if (x->slope != y->slope)
		return x->slope > y->slope ? -1 : 1;
	if (x->i != y->i)
		return x->i < y->i ? -1 : 1;
	return x->from - y->from;
}


/* Lagrangian relaxation over the lower convex hulls, then a greedy fill. */
static int solve_lagrange(x3_ba *ba)
{
	int T = ba->n;
	struct seg *seg = malloc((size_t)T * X3_BA_KMAX * sizeof *seg);
	if (!seg)
		return x3_err(X3_ENOMEM, "out of memory");
	int ns = 0;
	int64_t used = 0;
	for (int i = 0; i < T; i++) {
		x3_ba_tensor *t = &ba->t[i];
		int hull[X3_BA_KMAX + 1], h = 0;
		for (int K = 1; K <= X3_BA_KMAX; K++) {
			if (!allowed(t, K))
				continue;
			/* lower convex hull in (K, value); cost is numel*K, so
			 * the hull in K is the hull in cost */
			while (h >= 2) {
				int a = hull[h - 2], b = hull[h - 1];
				double cross = (value(t, b) - value(t, a)) * (K - a) -
				               (value(t, K) - value(t, a)) * (b - a);
				if (cross >= 0)
					h--;
				else
					break;
			}
			hull[h++] = K;
		}
		t->K = hull[0];
		used += t->cost * t->K;
		for (int j = 1; j < h; j++) {
			double dv = value(t, hull[j - 1]) - value(t, hull[j]);
			if (dv <= 0)
				break;   /* the rest of the hull goes up */
			seg[ns].i = i;
			seg[ns].from = hull[j - 1];
			seg[ns].to = hull[j];
			seg[ns].slope = dv / ((double)t->cost * (hull[j] - hull[j - 1]));
			ns++;
		}
	}
	qsort(seg, (size_t)ns, sizeof *seg, seg_cmp);
	for (int s = 0; s < ns; s++) {
		x3_ba_tensor *t = &ba->t[seg[s].i];
		if (t->K != seg[s].from)
			continue;
		int64_t dc = t->cost * (seg[s].to - seg[s].from);
		if (used + dc <= ba->budget) {
			t->K = seg[s].to;
			used += dc;
		}
	}
	free(seg);
	/* fill: best single move (any allowed K) that fits and lowers the error */
	for (long iter = 0; iter < 1000000; iter++) {
		int bi = -1, bk = 0;
		double bdv = 0;
		for (int i = 0; i < T; i++) {
			x3_ba_tensor *t = &ba->t[i];
			for (int K = 1; K <= X3_BA_KMAX; K++) {
				if (K == t->K || !allowed(t, K))
					continue;
				if (used + t->cost * (K - t->K) > ba->budget)
					continue;
				double dv = value(t, K) - value(t, t->K);
				if (dv < bdv) {
					bdv = dv;
					bi = i;
					bk = K;
				}
			}
		}
		if (bi < 0)
			break;
		used += ba->t[bi].cost * (bk - ba->t[bi].K);
		ba->t[bi].K = bk;
	}
	ba->method = "lagrangian";
	return X3_OK;
}

/* ---- tied widths ----------------------------------------------------
 * Linears that a reader loads as one module (arch.h X3_TIE_*: a
 * projection over every expert of a layer) get one K: the solvers see
 * each tied group as one item whose cost, numel and error are the sums of
 * its members', whose widths are those every member allows. */

/* The tied group of a key, "" when its width is its own. */
void x3_ba_tie_of(const x3_ba *ba, const char *key, char *buf, size_t n)
{
	buf[0] = 0;
	const x3_module *m = ba->mix ? x3_modix_find(ba->mix, key) :
	                     ba->mods ? x3_modules_find(ba->mods, ba->nmods, key) : NULL;
	if (m) {
		snprintf(buf, n, "%s", m->tie);
		return;
	}
	int layer;
	const x3_module_desc *d = x3_arch_classify(key, &layer);
	if (d && x3_arch_tie_key(d, layer, buf, n))
		buf[0] = 0;
}

struct tie_ord { int i; const char *key; };
static int tie_ord_cmp(const void *a, const void *b)
{
	const struct tie_ord *x = a, *y = b;
	int c = strcmp(x->key, y->key);
	return c ? c : x->i - y->i;
}

/* The items of the allocation: one per untied tensor, one per tied
 * group. *item gets each tensor's item; items[j].name is the tied
 * group's key (owned by *keys) or the tensor's own name (shared). A tied
 * group whose members --set fixes differently is an error naming both. */
static int make_items(const x3_ba *ba, x3_ba_tensor **items_out, int *nitems, int **item_out,
                      char **keys_out)
{
	int T = ba->n, rc = X3_OK;
	size_t kl = X3_KEY_MAX + 16;
	char *keys = calloc((size_t)(T ? T : 1), kl);
	struct tie_ord *ord = malloc((size_t)(T ? T : 1) * sizeof *ord);
	x3_ba_tensor *items = calloc((size_t)(T ? T : 1), sizeof *items);
	int *item = malloc((size_t)(T ? T : 1) * sizeof *item);
	if (!keys || !ord || !items || !item) {
		free(keys); free(ord); free(items); free(item);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	for (int i = 0; i < T; i++) {
		x3_ba_tie_of(ba, ba->t[i].name, keys + (size_t)i * kl, kl);
		ord[i].i = i;
		ord[i].key = keys + (size_t)i * kl;
	}
	qsort(ord, (size_t)T, sizeof *ord, tie_ord_cmp);
	int n = 0;
	for (int s = 0; s < T && !rc; s++) {
		const x3_ba_tensor *t = &ba->t[ord[s].i];
		if (!ord[s].key[0] || s == 0 || strcmp(ord[s].key, ord[s - 1].key)) {
			x3_ba_tensor *g = &items[n++];
			*g = *t;
			if (ord[s].key[0]) {
				g->name = (char *)ord[s].key;
				g->numel = g->cost = 0;
				g->importance = 1;
				g->measured = ~0u;
				for (int K = 0; K <= X3_BA_KMAX; K++)
					g->err[K] = 0;
			}
		}
		x3_ba_tensor *g = &items[n - 1];
		item[ord[s].i] = n - 1;
		if (!ord[s].key[0])
			continue;
		if (t->fixed != g->fixed || (t->fixed && t->lo != g->lo)) {
			const x3_ba_tensor *f = t->fixed ? t : NULL;
			for (int r = s - 1; !f && r >= 0 && !strcmp(ord[r].key, ord[s].key); r--)
				if (ba->t[ord[r].i].fixed)
					f = &ba->t[ord[r].i];
			const x3_ba_tensor *o = f == t ? &ba->t[ord[s - 1].i] : t;
			rc = x3_err(X3_EINVAL, "tensor '%s' is fixed at K=%d but '%s' %s: they are one tied "
			            "group '%s' (a reader loads them as one module, with one K): --set all of "
			            "them or none", f ? f->name : t->name, f ? f->lo : t->lo, o->name,
			            o->fixed ? "at another K" : "is not", ord[s].key);
			break;
		}
		g->numel += t->numel;
		g->cost += t->cost;
		g->measured &= t->measured;
		if (t->lo > g->lo)
			g->lo = t->lo;
		if (t->hi < g->hi)
			g->hi = t->hi;
		for (int K = 1; K <= X3_BA_KMAX; K++)
			if (t->measured & (1u << K))
				g->err[K] += t->err[K] * t->importance;
	}
	free(ord);
	if (rc) {
		free(keys); free(items); free(item);
		return rc;
	}
	*items_out = items;
	*nitems = n;
	*item_out = item;
	*keys_out = keys;
	return X3_OK;
}

int x3_ba_tied_groups(const x3_ba *ba)
{
	x3_ba_tensor *items;
	int n, *item, groups = 0;
	char *keys;
	if (make_items(ba, &items, &n, &item, &keys))
		return -1;
	/* a tied group's item is named by its key, in keys */
	for (int j = 0; j < n; j++)
		groups += items[j].name >= keys && items[j].name < keys + (size_t)ba->n * (X3_KEY_MAX + 16);
	free(items); free(item); free(keys);
	return groups;
}

static int solve_items(x3_ba *ba, int method)
{
	if (method == X3_BA_LAGRANGE)
		return solve_lagrange(ba);
	int rc = solve_dp(ba);
	if (rc == X3_ENOMEM && method == X3_BA_AUTO)
		return solve_lagrange(ba);
	return rc;
}

/* The exact DP, else (auto, too large) the Lagrangian, on ba->budget,
 * over the items (tied groups as one). */
int x3_ba_solve_budget(x3_ba *ba, int method)
{
	x3_ba_tensor *items;
	int n, *item;
	char *keys;
	int rc = make_items(ba, &items, &n, &item, &keys);
	if (rc)
		return rc;
	x3_ba sub = *ba;
	sub.t = items;
	sub.n = n;
	int64_t need, have;
	if (!(rc = x3_ba_cost_range(&sub, &need, &have)) && need > ba->budget)
		rc = ba->size_mode ? x3_err(X3_EINVAL, "the tied groups' widths (one K per group) do not fit "
		                            "the size") :
		     x3_err(X3_EINVAL, "the tied groups' widths (one K per group) need %.4f bits at least",
		            (double)need / (double)ba->total_numel);
	if (!rc)
		rc = solve_items(&sub, method);
	if (!rc)
		for (int i = 0; i < ba->n; i++)
			ba->t[i].K = items[item[i]].K;
	ba->method = sub.method;
	free(items); free(item); free(keys);
	return rc;
}
