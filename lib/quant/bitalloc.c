/* bitalloc.c: per-tensor bit widths under an average-bits budget
 * (see bitalloc.h). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <jansson.h>
#include <pcre2.h>
#include "x3.h"
#include "arch.h"
#include "bitalloc.h"
#include "jsonw.h"

int64_t x3_ba_dp_max_cells = 64 * 1000 * 1000;

x3_ba *x3_ba_create(void)
{
	x3_ba *ba = calloc(1, sizeof *ba);
	if (!ba) {
		x3_err(X3_ENOMEM, "out of memory");
		return NULL;
	}
	ba->head_bits = 6;
	ba->method = "none";
	return ba;
}

void x3_ba_free(x3_ba *ba)
{
	if (!ba)
		return;
	for (int i = 0; i < ba->n; i++)
		free(ba->t[i].name);
	free(ba->t);
	x3_strix_free(&ba->names);
	x3_modix_free(ba->mix);
	free(ba->head.name);
	free(ba);
}

/* The role of a key, from the architecture tables (arch.h): the
 * measurements name only the module. */
static const x3_module_desc *classify(const x3_ba *ba, const char *key, int *layer)
{
	const x3_module *m = ba->mix ? x3_modix_find(ba->mix, key) :
	                     ba->mods ? x3_modules_find(ba->mods, ba->nmods, key) : NULL;
	if (m) {
		*layer = m->layer;
		return m->d;
	}
	return x3_arch_classify(key, layer);
}

void x3_ba_set_modules(x3_ba *ba, const x3_module *m, int n)
{
	ba->mods = m, ba->nmods = n;
	x3_modix_free(ba->mix);
	ba->mix = NULL;
	/* out of memory: the list is scanned instead (the same answers) */
	if (m && x3_modix_build(m, n, &ba->mix))
		ba->mix = NULL;
}

static int role_of(const x3_ba *ba, const char *key)
{
	int layer;
	const x3_module_desc *d = classify(ba, key, &layer);
	return d ? d->role : X3_ROLE_OTHER;
}

static int is_head(const x3_ba *ba, const char *key) { return role_of(ba, key) == X3_ROLE_HEAD; }
static int is_embedding(const x3_ba *ba, const char *key) { return role_of(ba, key) == X3_ROLE_EMBEDDING; }

static x3_ba_tensor *find(x3_ba *ba, const char *name)
{
	int i = x3_strix_get(&ba->names, name);
	return i < 0 ? NULL : &ba->t[i];
}

static void init_tensor(x3_ba_tensor *t)
{
	t->lo = 1;
	t->hi = X3_BA_KMAX;
	t->importance = NAN;
}

int x3_ba_add(x3_ba *ba, const char *name, int K, double err, int64_t numel)
{
	if (!name || !*name)
		return x3_err(X3_EFORMAT, "empty tensor name");
	/* keys are module keys: accept "KEY.weight" too */
	char tensor[512];
	size_t len = strlen(name);
	if (len >= sizeof tensor)
		return x3_err(X3_EFORMAT, "tensor name of %zu bytes is too long", len);
	memcpy(tensor, name, len + 1);
	if (len > 7 && !strcmp(tensor + len - 7, ".weight"))
		tensor[len - 7] = 0;
	if (K < 1 || K > X3_BA_KMAX)
		return x3_err(X3_EFORMAT, "tensor '%s': K=%d is not in 1..%d", tensor, K, X3_BA_KMAX);
	if (isnan(err))
		return x3_err(X3_EFORMAT, "tensor '%s': K=%d: proxy_err is NaN", tensor, K);
	if (err == -1.0)
		return x3_err(X3_EFORMAT, "tensor '%s': K=%d: proxy_err is -1 (the measurement failed)", tensor, K);
	if (!isfinite(err) || err < 0)
		return x3_err(X3_EFORMAT, "tensor '%s': K=%d: proxy_err %g is not a finite number >= 0",
		              tensor, K, err);
	if (numel <= 0)
		return x3_err(X3_EFORMAT, "tensor '%s': numel %lld is not positive", tensor, (long long)numel);
	if (is_embedding(ba, tensor))
		return x3_err(X3_EFORMAT, "tensor '%s': embeddings are never quantized", tensor);
	x3_ba_tensor *t;
	if (is_head(ba, tensor)) {
		t = &ba->head;
		if (!ba->has_head) {
			init_tensor(t);
			if (!(t->name = strdup(tensor)))
				return x3_err(X3_ENOMEM, "out of memory");
			t->numel = numel;
			ba->has_head = 1;
		} else if (strcmp(t->name, tensor) != 0) {
			return x3_err(X3_EFORMAT, "two heads: '%s' and '%s'", t->name, tensor);
		}
	} else if (!(t = find(ba, tensor))) {
		if (ba->n == ba->cap) {
			int cap = ba->cap ? 2 * ba->cap : 64;
			x3_ba_tensor *nt = realloc(ba->t, (size_t)cap * sizeof *nt);
			if (!nt)
				return x3_err(X3_ENOMEM, "out of memory");
			ba->t = nt;
			ba->cap = cap;
		}
		t = &ba->t[ba->n];
		memset(t, 0, sizeof *t);
		init_tensor(t);
		if (!(t->name = strdup(tensor)))
			return x3_err(X3_ENOMEM, "out of memory");
		t->numel = numel;
		int rc = x3_strix_put(&ba->names, t->name, ba->n);
		if (rc) {
			free(t->name);
			return rc;
		}
		ba->n++;
	}
	if (t->numel != numel)
		return x3_err(X3_EFORMAT, "tensor '%s': numel %lld disagrees with an earlier line (%lld)",
		              tensor, (long long)numel, (long long)t->numel);
	if (t->measured & (1u << K)) {
		if (t->err[K] != err)
			return x3_err(X3_EFORMAT, "tensor '%s': K=%d measured twice with different "
			              "errors (%g, %g)", tensor, K, t->err[K], err);
		return X3_OK;
	}
	t->measured |= 1u << K;
	t->err[K] = err;
	return X3_OK;
}

/* Read lines of f, call fn(ba, obj, label, lineno) for each JSON object. */
static int read_jsonl(x3_ba *ba, FILE *f, const char *label,
                      int (*fn)(x3_ba *, json_t *, const char *, long))
{
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	long lineno = 0;
	int rc = X3_OK;
	while ((len = getline(&line, &cap, f)) >= 0) {
		lineno++;
		size_t i = 0;
		while (i < (size_t)len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\n' || line[i] == '\r'))
			i++;
		if (i == (size_t)len)
			continue;
		json_error_t je;
		json_t *o = json_loadb(line, (size_t)len, 0, &je);
		if (!o) {
			rc = x3_err(X3_EFORMAT, "%s:%ld: invalid JSON: %s", label, lineno, je.text);
			break;
		}
		if (!json_is_object(o)) {
			json_decref(o);
			rc = x3_err(X3_EFORMAT, "%s:%ld: not a JSON object", label, lineno);
			break;
		}
		rc = fn(ba, o, label, lineno);
		json_decref(o);
		if (rc)
			break;
	}
	if (!rc && ferror(f))
		rc = x3_err(X3_EIO, "%s: read error: %s", label, strerror(errno));
	free(line);
	return rc;
}

static const char *get_name(json_t *o)
{
	json_t *v = json_object_get(o, "tensor");
	return json_is_string(v) ? json_string_value(v) : NULL;
}

static int measure_line(x3_ba *ba, json_t *o, const char *label, long lineno)
{
	const char *name = get_name(o);
	if (!name || !*name)
		return x3_err(X3_EFORMAT, "%s:%ld: missing or non-string field \"tensor\"", label, lineno);
	json_t *k = json_object_get(o, "K"), *e = json_object_get(o, "proxy_err"),
	       *n = json_object_get(o, "numel");
	if (!k)
		return x3_err(X3_EFORMAT, "%s:%ld: tensor '%s': missing field \"K\"", label, lineno, name);
	if (!json_is_integer(k))
		return x3_err(X3_EFORMAT, "%s:%ld: tensor '%s': \"K\" is not an integer", label, lineno, name);
	if (!e)
		return x3_err(X3_EFORMAT, "%s:%ld: tensor '%s': missing field \"proxy_err\"", label, lineno, name);
	if (!json_is_number(e))
		return x3_err(X3_EFORMAT, "%s:%ld: tensor '%s': \"proxy_err\" is not a number", label, lineno, name);
	if (!n)
		return x3_err(X3_EFORMAT, "%s:%ld: tensor '%s': missing field \"numel\"", label, lineno, name);
	if (!json_is_integer(n))
		return x3_err(X3_EFORMAT, "%s:%ld: tensor '%s': \"numel\" is not an integer", label, lineno, name);
	json_int_t K = json_integer_value(k);
	if (K < 1 || K > X3_BA_KMAX)
		return x3_err(X3_EFORMAT, "%s:%ld: tensor '%s': K=%lld is not in 1..%d", label, lineno,
		              name, (long long)K, X3_BA_KMAX);
	int rc = x3_ba_add(ba, name, (int)K, json_number_value(e), json_integer_value(n));
	if (rc)
		return x3_errprefix(rc, "%s:%ld", label, lineno);
	return X3_OK;
}

int x3_ba_read(x3_ba *ba, FILE *f, const char *label)
{
	return read_jsonl(ba, f, label, measure_line);
}

static int importance_line(x3_ba *ba, json_t *o, const char *label, long lineno)
{
	const char *name = get_name(o);
	if (!name || !*name)
		return x3_err(X3_EFORMAT, "%s:%ld: missing or non-string field \"tensor\"", label, lineno);
	json_t *v = json_object_get(o, "importance");
	if (!json_is_number(v))
		return x3_err(X3_EFORMAT, "%s:%ld: tensor '%s': missing or non-numeric field \"importance\"",
		              label, lineno, name);
	double x = json_number_value(v);
	if (!isfinite(x) || x < 0)
		return x3_err(X3_EFORMAT, "%s:%ld: tensor '%s': importance %g is not a finite number >= 0",
		              label, lineno, name, x);
	char key[512];
	snprintf(key, sizeof key, "%s", name);
	size_t len = strlen(key);
	if (len > 7 && !strcmp(key + len - 7, ".weight"))
		key[len - 7] = 0;
	x3_ba_tensor *t = is_head(ba, key) && ba->has_head ? &ba->head : find(ba, key);
	if (!t)
		return x3_err(X3_EFORMAT, "%s:%ld: tensor '%s': importance given for a tensor without "
		              "measurements", label, lineno, name);
	t->importance = x;
	ba->has_importance = 1;
	return X3_OK;
}

int x3_ba_read_importance(x3_ba *ba, FILE *f, const char *label)
{
	return read_jsonl(ba, f, label, importance_line);
}

void x3_ba_reset_limits(x3_ba *ba)
{
	for (int i = 0; i < ba->n; i++) {
		ba->t[i].lo = 1;
		ba->t[i].hi = X3_BA_KMAX;
		ba->t[i].fixed = 0;
	}
}

int x3_ba_set_fixed(x3_ba *ba, const char *regex, int K, int *nmatch)
{
	int errcode;
	PCRE2_SIZE erroff;
	*nmatch = 0;
	if (K < 1 || K > X3_BA_KMAX)
		return x3_err(X3_EINVAL, "'%s=%d': K is not in 1..%d", regex, K, X3_BA_KMAX);
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED, 0, &errcode, &erroff, NULL);
	if (!re) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(errcode, msg, sizeof msg);
		return x3_err(X3_EINVAL, "regex '%s': %s at offset %zu", regex, (char *)msg, (size_t)erroff);
	}
	pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
	if (!md) {
		pcre2_code_free(re);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	int rc = X3_OK;
	for (int i = 0; i < ba->n && !rc; i++) {
		x3_ba_tensor *t = &ba->t[i];
		int m = pcre2_match(re, (PCRE2_SPTR)t->name, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL);
		if (m < 0 && m != PCRE2_ERROR_NOMATCH) {
			rc = x3_err(X3_EINVAL, "regex '%s': match error %d on '%s'", regex, m, t->name);
			break;
		}
		if (m < 0)
			continue;
		if (!(t->measured & (1u << K)))
			rc = x3_err(X3_EINVAL, "tensor '%s': '%s=%d' asks for K=%d, which was not measured",
			            t->name, regex, K, K);
		t->lo = t->hi = K;
		t->fixed = 1;
		(*nmatch)++;
	}
	pcre2_match_data_free(md);
	pcre2_code_free(re);
	if (!rc && *nmatch == 0)
		return x3_err(X3_EINVAL, "'%s=%d': the regex matches no measured tensor%s", regex, K,
		              ba->has_head ? " (the head is set with --head-bits)" : "");
	return rc;
}

int x3_ba_hq_bits(const x3_ba *ba, const char *key)
{
	int layer;
	const x3_module_desc *d = classify(ba, key, &layer);
	int h = d ? d->hq : 0;
	return h > 0 && ba->hq_bits > 0 ? ba->hq_bits : h;
}

void x3_ba_apply_hq(x3_ba *ba, double bits)
{
	int base = (int)floor(bits);
	for (int i = 0; i < ba->n; i++) {
		x3_ba_tensor *t = &ba->t[i];
		int h = x3_ba_hq_bits(ba, t->name);
		if (t->fixed || !h)
			continue;
		int fl = base + h < X3_BA_KMAX ? base + h : X3_BA_KMAX;
		if (t->lo < fl)
			t->lo = fl;
	}
}

static int allowed(const x3_ba_tensor *t, int K)
{
	return K >= t->lo && K <= t->hi && (t->measured & (1u << K));
}

static int min_allowed(const x3_ba_tensor *t)
{
	for (int K = 1; K <= X3_BA_KMAX; K++)
		if (allowed(t, K))
			return K;
	return 0;
}

static int max_allowed(const x3_ba_tensor *t)
{
	for (int K = X3_BA_KMAX; K >= 1; K--)
		if (allowed(t, K))
			return K;
	return 0;
}

static double value(const x3_ba_tensor *t, int K)
{
	return t->err[K] * t->importance;
}

static void list_measured(const x3_ba_tensor *t, char *buf, size_t len)
{
	size_t o = 0;
	buf[0] = 0;
	for (int K = 1; K <= X3_BA_KMAX && o + 4 < len; K++)
		if (t->measured & (1u << K))
			o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? "," : "", K);
}

/* Importance and cost of every tensor, the total numel; X3_OK or a
 * message. */
static int prepare_tensors(x3_ba *ba)
{
	if (ba->n == 0)
		return x3_err(X3_EFORMAT, "no measurements of decoder linears");
	ba->total_numel = 0;
	for (int i = 0; i < ba->n; i++) {
		x3_ba_tensor *t = &ba->t[i];
		if (ba->has_importance) {
			if (isnan(t->importance))
				return x3_err(X3_EFORMAT, "tensor '%s': no importance given", t->name);
		} else {
			t->importance = (double)t->numel;
		}
		if (!ba->size_mode)
			t->cost = t->numel;
		else if (t->cost <= 0)
			return x3_err(X3_EINVAL, "tensor '%s': no byte cost for a size target", t->name);
		if (t->numel > INT64_MAX / 16 - ba->total_numel)
			return x3_err(X3_EFORMAT, "total numel overflows");
		ba->total_numel += t->numel;
	}
	return X3_OK;
}

/* Every tensor at its lowest / highest allowed K: *need / *have budget
 * units; an empty range is an error naming the tensor. */
static int cost_range(const x3_ba *ba, int64_t *need, int64_t *have)
{
	*need = *have = 0;
	for (int i = 0; i < ba->n; i++) {
		const x3_ba_tensor *t = &ba->t[i];
		int k = min_allowed(t);
		if (!k) {
			char m[64];
			list_measured(t, m, sizeof m);
			return x3_err(X3_EINVAL, "tensor '%s': no measured K in the allowed range %d..%d "
			              "(measured: %s)", t->name, t->lo, t->hi, m);
		}
		*need += t->cost * k;
		*have += t->cost * max_allowed(t);
	}
	return X3_OK;
}

int x3_ba_prepare(x3_ba *ba, double bits)
{
	if (!(bits >= 1 && bits <= X3_BA_KMAX))
		return x3_err(X3_EINVAL, "target %g bits is not in 1..%d", bits, X3_BA_KMAX);
	ba->size_mode = 0;
	int rc = prepare_tensors(ba);
	if (rc)
		return rc;
	ba->target = bits;
	/* as ExLlamaV3: max_bits = int(bits * sum numel) */
	ba->budget = (int64_t)floor(bits * (double)ba->total_numel);
	int64_t need, have;   /* every tensor at its lowest, its highest K */
	if ((rc = cost_range(ba, &need, &have)))
		return rc;
	double lo = (double)need / (double)ba->total_numel, hi = (double)have / (double)ba->total_numel;
	/* above the most the measurements allow, the plan would silently stop
	 * short of the target (5.0 bpw for --bits 5.5 with K=2..5 measured) */
	if (need > ba->budget || have < ba->budget)
		return x3_err(X3_EINVAL, "target %g bits is %s the %s %.4f: the measured/allowed widths "
		              "reach %.4f..%.4f bits", bits, need > ba->budget ? "below" : "above",
		              need > ba->budget ? "minimum" : "maximum", need > ba->budget ? lo : hi, lo, hi);
	return X3_OK;
}

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

static int solve_budget(x3_ba *ba, int method);

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
static void tie_of(const x3_ba *ba, const char *key, char *buf, size_t n)
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
		tie_of(ba, ba->t[i].name, keys + (size_t)i * kl, kl);
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
static int solve_budget(x3_ba *ba, int method)
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
	if (!(rc = cost_range(&sub, &need, &have)) && need > ba->budget)
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
 * q/k/v, o, gate/up, down) are promoted together; priority attention 2,
 * MLP and shared experts 1, others 0, plus the --hq bits. A key no table
 * knows is a group of its own at priority 0 (its layer: the first ".N."
 * in it). */
static char *group_of(const x3_ba *ba, const char *key, int *prio, int *layer)
{
	const x3_module_desc *d = classify(ba, key, layer);
	*prio = 0;
	if (!d) {
		*layer = layer_of(key);
		return strdup(key);
	}
	*prio = d->hq + (d->role == X3_ROLE_ATTENTION ? 2 :
	                 d->role == X3_ROLE_MLP || d->role == X3_ROLE_SHARED_EXPERT ? 1 : 0);
	if (!d->alloc)
		return strdup(key);
	/* a tied linear's group spans its tied group (every expert of the
	 * layer: ExLlamaV3 promotes a layer's experts' gates and ups together) */
	char tie[X3_KEY_MAX + 16];
	tie_of(ba, key, tie, sizeof tie);
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

static int solve_exl3(x3_ba *ba, double bits, int hq)
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

int x3_ba_solve(x3_ba *ba, double bits, int method, int hq)
{
	if (method == X3_BA_EXL3) {
		/* ExLlamaV3 applies floors after the greedy: no --hq limits here */
		for (int i = 0; i < ba->n; i++)
			if (!ba->t[i].fixed) {
				ba->t[i].lo = 1;
				ba->t[i].hi = X3_BA_KMAX;
			}
		if (!(bits >= 1 && bits <= X3_BA_KMAX))
			return x3_err(X3_EINVAL, "target %g bits is not in 1..%d", bits, X3_BA_KMAX);
		ba->target = bits;
		ba->total_numel = 0;
		for (int i = 0; i < ba->n; i++) {
			if (!ba->has_importance)
				ba->t[i].importance = (double)ba->t[i].numel;
			else if (isnan(ba->t[i].importance))
				return x3_err(X3_EFORMAT, "tensor '%s': no importance given", ba->t[i].name);
			ba->total_numel += ba->t[i].numel;
		}
		if (ba->n == 0)
			return x3_err(X3_EFORMAT, "no measurements of decoder linears");
		ba->budget = (int64_t)floor(bits * (double)ba->total_numel);
		return solve_exl3(ba, bits, hq);
	}
	if (hq)
		x3_ba_apply_hq(ba, bits);
	int rc = x3_ba_prepare(ba, bits);
	if (rc)
		return rc;
	return solve_budget(ba, method);
}

/* Every tensor at its lowest (hi 0) or highest (hi 1) allowed K. */
static void set_extreme(x3_ba *ba, int hi)
{
	for (int i = 0; i < ba->n; i++)
		ba->t[i].K = hi ? max_allowed(&ba->t[i]) : min_allowed(&ba->t[i]);
}

int x3_ba_solve_size(x3_ba *ba, uint64_t size, int method, x3_ba_size_fn fn, void *ctx)
{
	if (method == X3_BA_EXL3)
		return x3_err(X3_EINVAL, "the exllamav3 strategy plans a bits target, not a size");
	ba->size_mode = 1;
	ba->size_target = size;
	int rc = prepare_tensors(ba);
	int64_t need, have;
	if (!rc)
		rc = cost_range(ba, &need, &have);
	if (rc)
		return rc;
	set_extreme(ba, 1);
	if ((rc = fn(ctx, ba, &ba->size_max)))
		return rc;
	set_extreme(ba, 0);
	if ((rc = fn(ctx, ba, &ba->size_min)))
		return rc;
	if (size < ba->size_min || size > ba->size_max)
		return x3_err(X3_EINVAL, "size %llu bytes is %s the %s plan: the measured/allowed widths "
		              "give %llu..%llu bytes", (unsigned long long)size,
		              size < ba->size_min ? "below" : "above",
		              size < ba->size_min ? "smallest" : "largest",
		              (unsigned long long)ba->size_min, (unsigned long long)ba->size_max);
	/* what does not follow the plan: the output less the trellises */
	int64_t fixed = (int64_t)ba->size_min - need;
	ba->budget = (int64_t)size - fixed;
	ba->target = NAN;
	for (int iter = 0; iter < 16; iter++) {
		if ((rc = solve_budget(ba, method)))
			return rc;
		if ((rc = fn(ctx, ba, &ba->size_bytes)))
			return rc;
		ba->target = x3_ba_bits(ba);
		if (ba->size_bytes <= size)
			return X3_OK;
		/* header digits grew with the offsets: take the overshoot off */
		ba->budget -= (int64_t)(ba->size_bytes - size);
		if (ba->budget < need) {
			ba->budget = need;
		}
	}
	return x3_err(X3_EINVAL, "no plan of at most %llu bytes found", (unsigned long long)size);
}

double x3_ba_bits(const x3_ba *ba)
{
	double s = 0, n = 0;
	for (int i = 0; i < ba->n; i++) {
		s += (double)ba->t[i].numel * ba->t[i].K;
		n += (double)ba->t[i].numel;
	}
	return n > 0 ? s / n : NAN;
}

double x3_ba_error(const x3_ba *ba)
{
	double s = 0;
	for (int i = 0; i < ba->n; i++) {
		const x3_ba_tensor *t = &ba->t[i];
		if (t->K < 1 || t->K > X3_BA_KMAX || !(t->measured & (1u << t->K)))
			return NAN;
		s += value(t, t->K);
	}
	return s;
}

double x3_ba_uniform_error(const x3_ba *ba, int K)
{
	double s = 0;
	for (int i = 0; i < ba->n; i++) {
		const x3_ba_tensor *t = &ba->t[i];
		int k = K < t->lo ? t->lo : K > t->hi ? t->hi : K;
		if (!(t->measured & (1u << k)))
			return NAN;
		s += value(t, k);
	}
	return s;
}

static json_t *num_or_null(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

void x3_ba_role_bits(const x3_ba *ba, int nroles, int *linears, int64_t *numel, double *bits)
{
	for (int r = 0; r < nroles; r++)
		linears[r] = 0, numel[r] = 0, bits[r] = 0;
	for (int i = 0; i <= ba->n; i++) {
		const x3_ba_tensor *t = i < ba->n ? &ba->t[i] : ba->has_head ? &ba->head : NULL;
		if (!t)
			break;
		int r = role_of(ba, t->name);
		if (r < 0 || r >= nroles)
			continue;
		linears[r]++;
		numel[r] += t->numel;
		bits[r] += (double)t->numel * (i < ba->n ? t->K : ba->head_bits);
	}
	for (int r = 0; r < nroles; r++)
		if (numel[r])
			bits[r] /= (double)numel[r];
}

char *x3_ba_plan_json(const x3_ba *ba)
{
	x3_jw w = X3_JW_INIT;
	json_t *o = json_object(), *tens = json_object(), *hist = json_object(),
	       *histn = json_object(), *roles = json_object();
	int64_t cnt[X3_BA_KMAX + 1] = {0}, num[X3_BA_KMAX + 1] = {0};
	for (int i = 0; i < ba->n; i++) {
		const x3_ba_tensor *t = &ba->t[i];
		x3_jw_set(&w, tens, t->name, json_integer(t->K));
		if (t->K >= 1 && t->K <= X3_BA_KMAX) {
			cnt[t->K]++;
			num[t->K] += t->numel;
		}
	}
	if (ba->has_head)
		x3_jw_set(&w, tens, ba->head.name, json_integer(ba->head_bits));
	for (int K = 1; K <= X3_BA_KMAX; K++) {
		if (!cnt[K])
			continue;
		char k[4];
		snprintf(k, sizeof k, "%d", K);
		x3_jw_set(&w, hist, k, json_integer(cnt[K]));
		x3_jw_set(&w, histn, k, json_integer(num[K]));
	}
	int ku = (int)floor(ba->target);
	double ub = 0, un = 0;
	for (int i = 0; i < ba->n; i++) {
		const x3_ba_tensor *t = &ba->t[i];
		int k = ku < t->lo ? t->lo : ku > t->hi ? t->hi : ku;
		ub += (double)t->numel * k;
		un += (double)t->numel;
	}
	x3_jw_set(&w, o, "tensors", tens);
	x3_jw_set(&w, o, "bits", json_real(x3_ba_bits(ba)));
	x3_jw_set(&w, o, "target", json_real(ba->target));
	x3_jw_set(&w, o, "head_bits", json_integer(ba->head_bits));
	int rl[X3_ROLE_COUNT];
	int64_t rn[X3_ROLE_COUNT];
	double rb[X3_ROLE_COUNT];
	x3_ba_role_bits(ba, X3_ROLE_COUNT, rl, rn, rb);
	for (int r = 0; r < X3_ROLE_COUNT; r++)
		if (rl[r])
			x3_jw_set(&w, roles, x3_role_name(r), json_pack("{s:i, s:I, s:f}", "linears", rl[r],
			          "numel", (json_int_t)rn[r], "bits", rb[r]));
	x3_jw_set(&w, o, "roles", roles);
	int tg = x3_ba_tied_groups(ba);
	if (tg > 0)   /* linears that share one K (x3_ba_tied_groups) */
		x3_jw_set(&w, o, "tied_groups", json_integer(tg));
	x3_jw_set(&w, o, "histogram", hist);
	x3_jw_set(&w, o, "histogram_numel", histn);
	x3_jw_set(&w, o, "expected_error", num_or_null(x3_ba_error(ba)));
	x3_jw_set(&w, o, "uniform_error", num_or_null(x3_ba_uniform_error(ba, ku)));
	x3_jw_set(&w, o, "uniform_bits", json_real(un > 0 ? ub / un : 0));
	if (ba->has_exl3) {
		x3_jw_set(&w, o, "exllamav3_error", num_or_null(ba->exl3_error));
		x3_jw_set(&w, o, "exllamav3_bits", json_real(ba->exl3_bits));
	}
	x3_jw_set_str(&w, o, "strategy", strcmp(ba->method, "exllamav3") ? "optimal" : "exllamav3");
	x3_jw_set_str(&w, o, "method", ba->method);
	x3_jw_set_str(&w, o, "importance", ba->has_importance ? "measured" : "numel");
	x3_jw_set(&w, o, "numel", json_integer(ba->total_numel));
	if (ba->size_mode) {
		/* the budget is bytes of trellis; the sizes are the whole output */
		x3_jw_set(&w, o, "budget_bytes", json_integer(ba->budget));
		x3_jw_set(&w, o, "size", json_integer((json_int_t)ba->size_target));
		x3_jw_set(&w, o, "bytes", json_integer((json_int_t)ba->size_bytes));
		x3_jw_set(&w, o, "size_min", json_integer((json_int_t)ba->size_min));
		x3_jw_set(&w, o, "size_max", json_integer((json_int_t)ba->size_max));
	} else {
		x3_jw_set(&w, o, "budget_bits", json_integer(ba->budget));
		if (ba->size_bytes)   /* the caller's prediction of the output */
			x3_jw_set(&w, o, "bytes", json_integer((json_int_t)ba->size_bytes));
	}
	char *s = x3_jw_dump(&w, o, JSON_INDENT(1) | JSON_REAL_PRECISION(10), "plan", NULL);
	json_decref(o);
	return s;
}
