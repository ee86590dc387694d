/* plan_impl.h: what plan.c and plan_graph.c share (not for other files). */
#ifndef X3_PLAN_IMPL_H
#define X3_PLAN_IMPL_H
#include <time.h>
#include "strix.h"

typedef struct {
	char *path;
	int *dep, ndep, cap;
	int target;          /* has a rule */
	int secondary;       /* .SECONDARY: not remade for a dependent that is
	                      * up to date with what it is made from */
	int stat_done, exists;
	struct timespec mt;
	int maxm_done;       /* newest time of what it is made from, itself included */
	int maxm_valid;
	int maxm_inf;        /* newer than any file: a prerequisite make remakes */
	struct timespec maxm;
	int layer1;          /* an h1 Hessian group: its layer + 1 */
	int made_state;      /* 0 not visited, 1 visiting, 2 done */
	int made;
} gnode;

typedef struct {
	gnode *n;
	int nn, cap;
	x3_strix byname;     /* n by path */
	const char *work;
} graph;

/* The next word of the space-separated list at *S: its start (its length
 * in *N, *S moved past it), or NULL at the end. */
const char *x3_word(const char **s, size_t *n);
/* The node of PATH (add: made when missing); -2 when missing and not add,
 * -1 out of memory. */
int x3_graph_find(graph *g, const char *path, int add);
/* TARGET made from the space-separated DEPS: its node, or -1. */
int x3_graph_rule(graph *g, const char *target, const char *deps);
void x3_graph_free(graph *g);
/* Would make remake target I (missing, or older than what it is made from)?
 * Its prerequisites are visited as make visits them. */
int x3_graph_made(graph *g, int i);
#endif
