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

const char *x3_word(const char **s, size_t *n)
{
	const char *w = *s + strspn(*s, " ");
	*n = strcspn(w, " ");
	*s = w + *n;
	return *n ? w : NULL;
}

int x3_graph_find(graph *g, const char *path, int add)
{
	int i = x3_strix_get(&g->byname, path);
	if (i >= 0)
		return i;
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
	if (x3_strix_put(&g->byname, n->path, g->nn)) {
		free(n->path);
		return -1;
	}
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
	const char *s = deps, *w;
	size_t k;
	while ((w = x3_word(&s, &k))) {
		if (k >= sizeof name)
			return -1;
		memcpy(name, w, k);
		name[k] = 0;
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
	x3_strix_free(&g->byname);
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

/* the time a dependent compares with prerequisite I (maxm, or maxm_inf:
 * newer than any file): for a prerequisite that is not secondary, its own
 * time, or newer than any when make remakes it (make -n counts a remade
 * prerequisite as changed); for a secondary one, the newest among its own
 * (where it exists) and, through its rule, that of each of what it is made
 * from: make does not remake a secondary prerequisite unless its dependent
 * is remade, and looks through it at its prerequisites against the
 * dependent's time */
static void g_maxm(graph *g, int i)
{
	gnode *n = &g->n[i];
	if (n->maxm_done)
		return;
	n->maxm_done = 1;
	g_stat(g, n);
	if (n->target && !n->secondary && x3_graph_made(g, i)) {
		g->n[i].maxm_inf = 1;
		return;
	}
	n = &g->n[i];
	if (n->exists) {
		n->maxm = n->mt;
		n->maxm_valid = 1;
	}
	if (!n->target || !n->secondary)
		return;
	for (int d = 0; d < n->ndep; d++) {
		g_maxm(g, n->dep[d]);
		gnode *m = &g->n[n->dep[d]];
		n = &g->n[i];
		if (m->maxm_inf)
			n->maxm_inf = 1;
		else if (m->maxm_valid && (!n->maxm_valid || ts_after(m->maxm, n->maxm))) {
			n->maxm = m->maxm;
			n->maxm_valid = 1;
		}
	}
}

/* make asked to update target I: remade when missing or when a
 * prerequisite is newer than it (g_maxm; every prerequisite that is not
 * secondary is updated first, as make does); when remade, its secondary
 * prerequisites are updated too */
int x3_graph_made(graph *g, int i)
{
	gnode *n = &g->n[i];
	if (n->made_state)
		return n->made;
	n->made_state = 1;
	g_stat(g, n);
	int must = !n->exists;
	for (int d = 0; d < g->n[i].ndep; d++) {
		int j = g->n[i].dep[d];
		if (must && g->n[j].secondary)
			continue;
		g_maxm(g, j);
		gnode *m = &g->n[j];
		if (m->maxm_inf || (m->maxm_valid && ts_after(m->maxm, g->n[i].mt)))
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
