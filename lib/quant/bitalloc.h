/* bitalloc.h: choose an integer bit width K (1..8) for every quantized
 * linear so that the numel-weighted average K meets a target, minimizing
 * the total expected damage sum(proxy_err(t, K) * importance(t)).
 *
 * Input is the JSON lines of `trellis-encode --measure`:
 *   {"tensor": KEY, "K": k, "proxy_err": e, "numel": out*in, ...}
 * The head ("lm_head") is kept out of the budget and gets head_bits, as in
 * ExLlamaV3 (exl3(5) §11.1). Two solvers:
 *   - exact: a multiple-choice knapsack DP over the budget in units of
 *     g = gcd(numel) weight-bits (exact, since every cost is a multiple);
 *   - Lagrangian: walk the lower convex hulls of every tensor's
 *     (bits, error) points by decreasing slope while the budget allows,
 *     then fill the rest greedily with any single move that still fits.
 * and ExLlamaV3's deterministic greedy (exl3(5) §11) for
 * comparison. */
#ifndef X3_BITALLOC_H
#define X3_BITALLOC_H

#include <stdint.h>
#include <stdio.h>
#include "strix.h"

#define X3_BA_KMAX 8

typedef struct {
	char *name;          /* module key, no ".weight" */
	int64_t numel;       /* out * in of the original (unpadded) weight */
	double importance;   /* multiplies proxy_err; default numel */
	unsigned measured;   /* bit K set when err[K] is known */
	double err[X3_BA_KMAX + 1];
	int lo, hi;          /* allowed K range (floors, --set) */
	int fixed;           /* set by x3_ba_set_fixed */
	int64_t cost;        /* budget units per bit of K: numel (bits target),
	                        or the trellis bytes per bit (size target) */
	int K;               /* result */
} x3_ba_tensor;

typedef struct x3_ba {
	int n, cap;
	x3_ba_tensor *t;     /* decoder linears, input order */
	int has_head;        /* "lm_head" was measured */
	x3_ba_tensor head;
	int head_bits;       /* 1..8 or 16 */
	int has_importance;
	/* filled by the solvers */
	double target;       /* bits requested */
	int64_t total_numel;
	int64_t budget;      /* floor(target * total_numel) weight-bits */
	const char *method;  /* "dp", "lagrangian", "exllamav3" */
	/* optional comparison, set by the caller, emitted by plan_json */
	int has_exl3;
	double exl3_error, exl3_bits;
	/* a size target (x3_ba_solve_size): the budget is bytes, each
	 * tensor's cost its trellis bytes per bit */
	int size_mode;
	uint64_t size_target, size_bytes;   /* asked for, predicted for the plan */
	uint64_t size_min, size_max;        /* every tensor at its lowest, highest K */
	/* the model's modules (x3_ba_set_modules), or NULL: a key's role and
	 * --hq come from its own architecture's table, not the first table
	 * whose pattern matches (DeepSeek's dense MLP keys look like Llama's) */
	const struct x3_module *mods;
	int nmods;
	struct x3_modix *mix;   /* mods' index (NULL: scanned) */
	x3_strix names;         /* t by name */
	/* --hq N: the promotion of every linear its table promotes (hq > 0),
	 * instead of the table's amount; 0: the table's */
	int hq_bits;
} x3_ba;

enum { X3_BA_AUTO = 0, X3_BA_DP = 1, X3_BA_LAGRANGE = 2, X3_BA_EXL3 = 3 };

x3_ba *x3_ba_create(void);
void x3_ba_free(x3_ba *ba);

/* Add one measurement (a trailing ".weight" of the name is dropped: plans
 * use module keys). Re-measuring the same (tensor, K) with the same
 * error is tolerated; a different error or numel is an error. */
int x3_ba_add(x3_ba *ba, const char *tensor, int K, double proxy_err, int64_t numel);
/* Parse JSON lines (one object per non-blank line) from f; label names
 * the input in messages ("stdin", a file). */
int x3_ba_read(x3_ba *ba, FILE *f, const char *label);
/* Importance column: JSON lines {"tensor": KEY, "importance": x}. Every
 * decoder linear must get one (checked by x3_ba_prepare). */
int x3_ba_read_importance(x3_ba *ba, FILE *f, const char *label);

/* Reset every tensor's allowed range to 1..8 and clear fixes. */
void x3_ba_reset_limits(x3_ba *ba);
/* Fix K for every decoder linear whose key matches the PCRE2 pattern
 * (unanchored search). Zero matches, or a K that was not measured for a
 * matched tensor, is an error. *nmatch gets the count. */
int x3_ba_set_fixed(x3_ba *ba, const char *regex, int K, int *nmatch);
/* Classify keys by these modules of the model (x3_arch_modules; kept, not
 * copied): set before x3_ba_add. */
void x3_ba_set_modules(x3_ba *ba, const struct x3_module *m, int n);
/* The --hq bits of a key, from its architecture's table (e.g. 2 for
 * attention, 1 for shared experts), or hq_bits where set and the table
 * promotes the key (exl3(5) §11.2, §11.4). */
int x3_ba_hq_bits(const x3_ba *ba, const char *key);
/* --hq: floor every non-fixed tensor at min(floor(bits) + hq_bits, 8). */
void x3_ba_apply_hq(x3_ba *ba, double bits);

/* Check the set (importance present, candidates non-empty) and the target
 * (>= the cheapest allowed plan). */
int x3_ba_prepare(x3_ba *ba, double bits);
/* Solve; sets t[i].K, ba->method. X3_BA_EXL3 ignores measurements (its
 * K range is floor(bits)..8) and applies floors afterwards (hq), so its
 * plan may exceed the target exactly as ExLlamaV3's does. */
int x3_ba_solve(x3_ba *ba, double bits, int method, int hq);
/* Size target: the exact bytes of the whole output for the current
 * plan (t[i].K, the head at head_bits), from the caller's model of the
 * output (pack.h x3_pack_size). */
typedef int (*x3_ba_size_fn)(void *ctx, const x3_ba *ba, uint64_t *bytes);
/* Solve for a total output size instead of a bits target: every tensor's
 * cost must be set (its trellis bytes per bit, x3_pack_trellis_bytes_per_bit).
 * The budget is size minus what does not depend on the plan (the output
 * with every tensor at its lowest allowed K, less their trellis bytes);
 * the plan is the least error whose exact size (fn) is at most size,
 * re-solved with a budget lowered by any overshoot of the parts that only
 * nearly follow the plan (header digits). Sets size_min/size_max/
 * size_bytes. A size below the smallest or above the largest plan is
 * X3_EINVAL naming both. */
int x3_ba_solve_size(x3_ba *ba, uint64_t size, int method, x3_ba_size_fn fn, void *ctx);

/* Cells limit of the DP (tensors x budget units); above it AUTO uses the
 * Lagrangian solver and DP fails. */
extern int64_t x3_ba_dp_max_cells;

/* Tied widths: the linears a reader loads as one module (arch.h X3_TIE_*,
 * from the model's modules or else the tables) are one item of every
 * solver, with the sums of their costs and errors, and get one K. The
 * number of tied groups among the measured tensors (-1: an error, e.g.
 * a group that --set fixes only in part). */
int x3_ba_tied_groups(const x3_ba *ba);

/* Results. Error sums are NAN when a tensor's K was not measured. */
double x3_ba_bits(const x3_ba *ba);         /* sum numel K / sum numel */
double x3_ba_error(const x3_ba *ba);        /* sum err[K] * importance */
/* Every tensor at K (clamped into its allowed range); NAN if unmeasured. */
double x3_ba_uniform_error(const x3_ba *ba, int K);

/* Averages by role (arch.h's X3_ROLE_*, from x3_arch_classify; keys no
 * table knows: X3_ROLE_OTHER): for each of nroles roles the linears, their
 * numel and the numel-weighted K of the plan, the head at head_bits. */
void x3_ba_role_bits(const x3_ba *ba, int nroles, int *linears, int64_t *numel, double *bits);

/* The plan as a JSON text (malloc'd): {"tensors": {...}, "bits", "target",
 * "head_bits", "roles" ({ROLE: {linears, numel, bits}} of the roles
 * present), "histogram", "histogram_numel", "expected_error",
 * "uniform_error", "uniform_bits", "strategy", "method", ...;
 * "exllamav3_error", "exllamav3_bits" when has_exl3}. NULL with the error
 * naming what could not be written (a tensor name that is not UTF-8, no
 * memory): a plan never lacks a key silently. */
char *x3_ba_plan_json(const x3_ba *ba);

#endif
