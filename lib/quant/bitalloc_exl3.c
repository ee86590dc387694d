/* bitalloc_exl3.c: ExLlamaV3's greedy allocation (exl3(5) §11), as its
 * converter allocates: groups promoted by priority and distance from the
 * middle layer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bitalloc_impl.h"

/* ---- ExLlamaV3's greedy (exl3(5) §11) ------------------------------ */

struct grp {
	char *key;
	int prio, layer, order;
	int K;
	int64_t numel;
};

/* Layer index from the first ".N." in key, or -1. */
static int layer_of(const char *key)
{
	for (const char *p = key; *p; p++) {
		if (*p != '.' || p[1] < '0' || p[1] > '9')
			continue;
		char *end;
		long v = strtol(p + 1, &end, 10);
		if (*end == '.' && v >= 0 && v < 1000000)
			return (int)v;
	}
	return -1;
}

/* Group key and priority of a linear (exl3(5) §11.2), from the architecture
 * tables: the linears of one allocation group (the table's alloc suffix:
 * q/k/v, o, gate/up, down) are promoted together, by x3_module_priority
 * (ExLlamaV3's q_priority: the module's kind plus its --hq bits). A key no table
 * knows is a group of its own at priority 0 (its layer: the first ".N."
 * in it). */
static char *group_of(const x3_ba *ba, const char *key, int *prio, int *layer)
{
	const x3_module_desc *d = x3_ba_classify(ba, key, layer);
	*prio = 0;
	if (!d) {
		*layer = layer_of(key);
		return strdup(key);
	}
	*prio = x3_module_priority(d);
	if (!d->alloc)
		return strdup(key);
	/* a tied linear's group spans its tied group (every expert of the
	 * layer: ExLlamaV3 promotes a layer's experts' gates and ups together) */
	char tie[X3_KEY_MAX + 16];
	x3_ba_tie_of(ba, key, tie, sizeof tie);
	const char *k = tie[0] ? tie : key;
	const char *dot = strrchr(k, '.');
	char buf[1024];
	snprintf(buf, sizeof buf, "%.*s.%s", dot ? (int)(dot - k) : 0, k, d->alloc);
	return strdup(buf);
}

static int grp_cmp(const void *a, const void *b, void *ctx)
{
	const struct grp *x = a, *y = b;
	int last = *(int *)ctx;
	if (x->prio != y->prio)
		return x->prio > y->prio ? -1 : 1;
	int dx = x->layer < 0 ? 0 : (x->layer < last - x->layer ? x->layer : last - x->layer);
	int dy = y->layer < 0 ? 0 : (y->layer < last - y->layer ? y->layer : last - y->layer);
	if (dx != dy)
		return dx < dy ? -1 : 1;
	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	return x->order - y->order;
}

int x3_ba_solve_exl3(x3_ba *ba, double bits, int hq)
{
	int T = ba->n, ng = 0, rc = X3_OK;
	if (x3_ba_tied_groups(ba) < 0)   /* --set splits a tied group */
		return X3_EINVAL;
	int base = (int)floor(bits);
	struct grp *g = calloc((size_t)T, sizeof *g);
	int *gi = malloc((size_t)T * sizeof *gi);
	if (!g || !gi) {
		free(g); free(gi);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	int64_t sum = 0;
	for (int i = 0; i < T && !rc; i++) {
		x3_ba_tensor *t = &ba->t[i];
		gi[i] = -1;
		if (t->fixed) {
			/* --set: fixed from the start, cost counted */
			t->K = t->lo;
			sum += t->numel * t->K;
			continue;
		}
		int prio, layer;
		char *key = group_of(ba, t->name, &prio, &layer);
		if (!key) {
			rc = x3_err(X3_ENOMEM, "out of memory");
			break;
		}
		int j;
		for (j = 0; j < ng; j++)
			if (!strcmp(g[j].key, key))
				break;
		if (j == ng) {
			g[j].key = key;
			g[j].prio = prio;
			g[j].layer = layer;
			g[j].order = j;
			g[j].K = base;
			ng++;
		} else {
			free(key);
			if (prio > g[j].prio)
				g[j].prio = prio;
		}
		g[j].numel += t->numel;
		gi[i] = j;
		sum += t->numel * base;
	}
	int last = 0;
	for (int j = 0; j < ng; j++)
		if (g[j].layer > last)
			last = g[j].layer;
	/* sort a permutation so gi[] stays valid */
	struct grp *sorted = malloc((size_t)(ng ? ng : 1) * sizeof *sorted);
	if (!rc && !sorted)
		rc = x3_err(X3_ENOMEM, "out of memory");
	if (!rc) {
		memcpy(sorted, g, (size_t)ng * sizeof *g);
		qsort_r(sorted, (size_t)ng, sizeof *sorted, grp_cmp, &last);
		int promoted = 1;
		while (promoted) {
			promoted = 0;
			for (int s = 0; s < ng; s++) {
				if (sorted[s].K >= X3_BA_KMAX)
					continue;
				int64_t cost = sorted[s].numel;   /* numel * (K+1 - K) */
				if (sum + cost <= ba->budget) {
					sorted[s].K++;
					sum += cost;
					promoted = 1;
				}
			}
		}
		for (int s = 0; s < ng; s++)
			g[sorted[s].order].K = sorted[s].K;
		for (int i = 0; i < T; i++) {
			x3_ba_tensor *t = &ba->t[i];
			if (gi[i] < 0)
				continue;
			t->K = g[gi[i]].K;
			if (hq) {
				int h = x3_ba_hq_bits(ba, t->name);
				int fl = base + h < X3_BA_KMAX ? base + h : X3_BA_KMAX;
				if (t->K < fl)
					t->K = fl;
			}
		}
	}
	for (int j = 0; j < ng; j++)
		free(g[j].key);
	free(g); free(gi); free(sorted);
	ba->method = "exllamav3";
	return rc;
}
