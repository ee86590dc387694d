/* plan_graph.c: the graph of the steps before the plan (targets, what each
 * is made from, their files' times), from which the recapture set is
 * decided as make would decide it (plan_impl.h); also a plain set of names. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "x3.h"
#include "plan_impl.h"

static uint64_t hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	while (*s)
		h = (h ^ (unsigned char)*s++) * 1099511628211ull;
	return h;
}

int x3_graph_find(graph *g, const char *path, int add)
{
	if ((size_t)(g->nn + 1) * 2 > g->htcap) {
		size_t nc = g->htcap ? g->htcap * 2 : 1024;
		int *nt = malloc(nc * sizeof *nt);
		if (!nt)
			return -1;
		for (size_t i = 0; i < nc; i++)
			nt[i] = -1;
		for (int i = 0; i < g->nn; i++) {
			size_t j = hash(g->n[i].path) & (nc - 1);
			while (nt[j] >= 0)
				j = (j + 1) & (nc - 1);
			nt[j] = i;
		}
		free(g->ht);
		g->ht = nt;
		g->htcap = nc;
	}
	size_t j = hash(path) & (g->htcap - 1);
	while (g->ht[j] >= 0) {
		if (!strcmp(g->n[g->ht[j]].path, path))
			return g->ht[j];
		j = (j + 1) & (g->htcap - 1);
	}
	if (!add)
		return -2;
	if (g->nn == g->cap) {
		int nc = g->cap ? g->cap * 2 : 1024;
		gnode *nn = realloc(g->n, nc * sizeof *nn);
		if (!nn)
			return -1;
		g->n = nn;
		g->cap = nc;
	}
	gnode *n = &g->n[g->nn];
	memset(n, 0, sizeof *n);
	if (!(n->path = strdup(path)))
		return -1;
	g->ht[j] = g->nn;
	return g->nn++;
}

/* rule TARGET: DEPS (a space-separated list of names); its node, or -1 */
int x3_graph_rule(graph *g, const char *target, const char *deps)
{
	int t = x3_graph_find(g, target, 1);
	if (t < 0)
		return -1;
	g->n[t].target = 1;
	char name[1024];
	const char *s = deps;
	while (*s) {
		while (*s == ' ')
			s++;
		size_t k = strcspn(s, " ");
		if (!k)
			break;
		if (k >= sizeof name)
			return -1;
		memcpy(name, s, k);
		name[k] = 0;
		s += k;
		int d = x3_graph_find(g, name, 1);
		if (d < 0)
			return -1;
		gnode *n = &g->n[t];
		if (n->ndep == n->cap) {
			int nc = n->cap ? n->cap * 2 : 4;
			int *nd = realloc(n->dep, nc * sizeof *nd);
			if (!nd)
				return -1;
			n->dep = nd;
			n->cap = nc;
		}
		n->dep[n->ndep++] = d;
	}
	return t;
}

void x3_graph_free(graph *g)
{
	for (int i = 0; i < g->nn; i++) {
		free(g->n[i].path);
		free(g->n[i].dep);
	}
	free(g->n);
	free(g->ht);
}

static int ts_after(struct timespec a, struct timespec b)
{
	return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec);
}

static void g_stat(graph *g, gnode *n)
{
	if (n->stat_done)
		return;
	n->stat_done = 1;
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", g->work, n->path);
	struct stat st;
	n->exists = stat(path, &st) == 0;
	if (n->exists)
		n->mt = st.st_mtim;
}

/* the newest time among a target's own (where it exists) and, through its
 * rules, what it is made from: make's check of a secondary prerequisite,
 * which it does not remake unless its dependent is remade, looks through
 * it at its prerequisites against the dependent's time */
static void g_maxm(graph *g, int i)
{
	gnode *n = &g->n[i];
	if (n->maxm_done)
		return;
	n->maxm_done = 1;
	g_stat(g, n);
	if (n->exists) {
		n->maxm = n->mt;
		n->maxm_valid = 1;
	}
	if (!n->target)
		return;
	for (int d = 0; d < n->ndep; d++) {
		g_maxm(g, n->dep[d]);
		gnode *m = &g->n[n->dep[d]];
		n = &g->n[i];
		if (m->maxm_valid && (!n->maxm_valid || ts_after(m->maxm, n->maxm))) {
			n->maxm = m->maxm;
			n->maxm_valid = 1;
		}
	}
}

/* make asked to update target I: remade when missing or when anything it
 * is made from is newer than it; then its prerequisites are updated too */
int x3_graph_made(graph *g, int i)
{
	gnode *n = &g->n[i];
	if (n->made_state)
		return n->made;
	n->made_state = 1;
	g_stat(g, n);
	int must = !n->exists;
	for (int d = 0; d < n->ndep && !must; d++) {
		int j = g->n[i].dep[d];
		g_maxm(g, j);
		gnode *m = &g->n[j];
		if (m->maxm_valid && ts_after(m->maxm, g->n[i].mt))
			must = 1;
	}
	if (must)
		for (int d = 0; d < g->n[i].ndep; d++) {
			int j = g->n[i].dep[d];
			if (g->n[j].target)
				x3_graph_made(g, j);
		}
	n = &g->n[i];
	n->made = must;
	n->made_state = 2;
	return must;
}
