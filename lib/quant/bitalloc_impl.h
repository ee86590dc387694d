/* bitalloc_impl.h: what bitalloc.c (measurements, the budget, the plan),
 * bitalloc_solve.c (the exact DP, the Lagrangian, tied widths) and
 * bitalloc_exl3.c (ExLlamaV3's greedy) share (not for other files). */
#ifndef X3_BITALLOC_IMPL_H
#define X3_BITALLOC_IMPL_H
#include <stdio.h>
#include "x3.h"
#include "arch.h"
#include "bitalloc.h"

static inline int allowed(const x3_ba_tensor *t, int K)
{
	return K >= t->lo && K <= t->hi && (t->measured & (1u << K));
}

static inline int min_allowed(const x3_ba_tensor *t)
{
	for (int K = 1; K <= X3_BA_KMAX; K++)
		if (allowed(t, K))
			return K;
	return 0;
}

static inline int max_allowed(const x3_ba_tensor *t)
{
	for (int K = X3_BA_KMAX; K >= 1; K--)
		if (allowed(t, K))
			return K;
	return 0;
}

static inline double value(const x3_ba_tensor *t, int K)
{
	return t->err[K] * t->importance;
}

static inline void list_measured(const x3_ba_tensor *t, char *buf, size_t len)
{
	size_t o = 0;
	buf[0] = 0;
	for (int K = 1; K <= X3_BA_KMAX && o + 4 < len; K++)
		if (t->measured & (1u << K))
			o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? "," : "", K);
}

/* The description of a linear's key (the model's modules when set, else
 * the architecture tables), its layer in *layer. */
const x3_module_desc *x3_ba_classify(const x3_ba *ba, const char *key, int *layer);
/* Every tensor at its lowest / highest allowed K: *need / *have budget
 * units; an empty range is an error naming the tensor. */
int x3_ba_cost_range(const x3_ba *ba, int64_t *need, int64_t *have);
/* The tied group of a key, "" when its width is its own. */
void x3_ba_tie_of(const x3_ba *ba, const char *key, char *buf, size_t n);
/* The prepared budget solved by METHOD (X3_BA_DP, X3_BA_LAGRANGE or
 * X3_BA_AUTO), tied groups as one item. */
int x3_ba_solve_budget(x3_ba *ba, int method);
/* ExLlamaV3's greedy at BITS with the --hq promotions HQ. */
int x3_ba_solve_exl3(x3_ba *ba, double bits, int hq);

#endif
