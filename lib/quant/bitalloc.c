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
#include "bitalloc_impl.h"
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
const x3_module_desc *x3_ba_classify(const x3_ba *ba, const char *key, int *layer)
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
	const x3_module_desc *d = x3_ba_classify(ba, key, &layer);
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
	const x3_module_desc *d = x3_ba_classify(ba, key, &layer);
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
int x3_ba_cost_range(const x3_ba *ba, int64_t *need, int64_t *have)
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
	if ((rc = x3_ba_cost_range(ba, &need, &have)))
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
		return x3_ba_solve_exl3(ba, bits, hq);
	}
	if (hq)
		x3_ba_apply_hq(ba, bits);
	int rc = x3_ba_prepare(ba, bits);
	if (rc)
		return rc;
	return x3_ba_solve_budget(ba, method);
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
		rc = x3_ba_cost_range(ba, &need, &have);
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
		if ((rc = x3_ba_solve_budget(ba, method)))
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
