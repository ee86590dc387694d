/* exl3-info: what an EXL3 model directory holds, read as a person would
 * before downloading or serving it: every quantized linear (K, codebook,
 * shape, stored bytes), every tensor left unquantized, the average bits as
 * ExLlamaV3 reports them, averages by role, a histogram of K, the size of the
 * files and the quantization_config; checked as it is read. A table, or
 * JSON with --json; --plot draws bits per layer and role (and per-tensor
 * errors) with gnuplot. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <jansson.h>
#include "util.h"
#include "util-check.h"
#include "codec.h"
#include "exl3.h"
#include "frame.h"
#include "pack.h"
#include "reader.h"
#include "safetensors.h"

extern char **environ;

static const char usage[] =
	"usage: exl3-info [--json] [--plot FILE.svg] [--errors FILE] [-q] SOURCE\n"
	"       exl3-info --check READER [--json] DIR\n"
	"  SOURCE          an EXL3 model directory (ours or ExLlamaV3's; sharded or\n"
	"                  not), a .safetensors file, or a frame stream ('-': stdin)\n"
	"  --json          one JSON object instead of the table\n"
	"  --plot FILE.svg draw bits per layer and role, and per-tensor errors where\n"
	"                  known, with gnuplot\n"
	"  --errors FILE   JSON lines {\"tensor\": KEY, \"rel_fro_err\" or \"proxy_err\": X}\n"
	"                  (exl3-matmul --check, trellis-encode) for the plot and JSON\n"
	"  --check READER  check DIR against what READER requires to load it\n"
	"                  (exllamav3, gptqmodel, strict; auto: exllamav3 where it\n"
	"                  loads the architecture, else none): each violation with\n"
	"                  its tensor and rule, exit 1 when there is any\n"
	"  -q              no warnings on standard error\n"
	"  -h              this help\n";

/* one quantized linear (or a head stored as an unquantized .weight) */
struct lin {
	char key[512];
	x3_exl3_info q;              /* q.K == 0: unquantized head weight */
	int role, layer;
	long mod, rank;              /* model order */
	double err;                  /* --errors or proxy_err, else NAN */
	const char *err_kind;
	int unq_bits;                /* head as .weight: its dtype's bits */
	char tie[X3_KEY_MAX + 16];   /* its tied group (arch.h), "" if none */
};
/* one tensor left unquantized */
struct unq {
	const x3_tensor *t;
	int role, layer;
	long mod, rank;
};

static struct lin *lins;
static int nlin;
static struct unq *unqs;
static int nunq;
static char **problems;
static int nproblems;
static char **warns;
static int nwarns;

/* append a formatted message to a list (the problems, the warnings) */
static void add_msg(char ***list, int *n, const char *fmt, va_list ap)
{
	char buf[2048];
	vsnprintf(buf, sizeof buf, fmt, ap);
	*list = realloc(*list, (size_t)(*n + 1) * sizeof **list);
	if (!*list || !((*list)[(*n)++] = strdup(buf)))
		die("out of memory");
}

static void problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void problem(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	add_msg(&problems, &nproblems, fmt, ap);
	va_end(ap);
}

static void warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warning(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	add_msg(&warns, &nwarns, fmt, ap);
	va_end(ap);
}

/* the module key of a tensor name: all but the last component */
static size_t prefix_len(const char *name)
{
	const char *d = strrchr(name, '.');
	return d ? (size_t)(d - name) : 0;
}

static int cmp_prefix(const void *a, const void *b)
{
	const x3_tensor *x = *(const x3_tensor *const *)a, *y = *(const x3_tensor *const *)b;
	size_t lx = prefix_len(x->name), ly = prefix_len(y->name);
	size_t l = lx < ly ? lx : ly;
	int c = memcmp(x->name, y->name, l);
	if (c)
		return c;
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* model order (x3_pack_cmp) */
static int cmp_lin(const void *a, const void *b)
{
	const struct lin *x = a, *y = b;
	return x3_pack_cmp(x->mod, x->rank, x->key, y->mod, y->rank, y->key);
}
static int cmp_unq(const void *a, const void *b)
{
	const struct unq *x = a, *y = b;
	return x3_pack_cmp(x->mod, x->rank, x->t->name, y->mod, y->rank, y->t->name);
}

static int is_scale_part(const char *suffix)
{
	static const char *const q[] = {"trellis", "suh", "svh", "su", "sv", "mcg", "mul1"};
	for (size_t i = 0; i < sizeof q / sizeof *q; i++)
		if (!strcmp(suffix, q[i]))
			return 1;
	return 0;
}

static char *read_text(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, n = 0;
	char *b = malloc(cap);
	for (size_t got; b && (got = fread(b + n, 1, cap - n - 1, f)) > 0;) {
		n += got;
		if (n + 1 == cap)
			b = realloc(b, cap *= 2);
	}
	if (ferror(f) || !b)
		die("%s: %s", path, b ? strerror(errno) : "out of memory");
	fclose(f);
	b[n] = 0;
	return b;
}

/* ---- the files --------------------------------------------------------- */
static uint64_t files_bytes, st_bytes;
static int nfiles;

static void count_files(const char *src, int kind)
{
	struct stat sb;
	if (kind != X3_SRC_DIR) {
		if (strcmp(src, "-") && !stat(src, &sb) && S_ISREG(sb.st_mode)) {
			files_bytes = st_bytes = (uint64_t)sb.st_size;
			nfiles = 1;
		}
		return;
	}
	DIR *d = opendir(src);
	if (!d)
		die("%s: %s", src, strerror(errno));
	for (struct dirent *e; (e = readdir(d));) {
		char p[4096];
		if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
			continue;
		snprintf(p, sizeof p, "%s/%s", src, e->d_name);
		if (stat(p, &sb) || !S_ISREG(sb.st_mode))
			continue;
		files_bytes += (uint64_t)sb.st_size;
		nfiles++;
		size_t l = strlen(e->d_name);
		if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors"))
			st_bytes += (uint64_t)sb.st_size;
	}
	closedir(d);
}

/* ---- --errors ---------------------------------------------------------- */
static void read_errors(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		die("%s: %s", path, strerror(errno));
	char *line = NULL;
	size_t cap = 0;
	long ln = 0;
	while (getline(&line, &cap, f) > 0) {
		ln++;
		if (line[strspn(line, " \t\r\n")] == 0)
			continue;
		json_error_t je;
		json_t *o = json_loads(line, 0, &je);
		const char *key = o ? json_string_value(json_object_get(o, "tensor")) : NULL;
		const char *kind = "rel_fro_err";
		json_t *v = o ? json_object_get(o, kind) : NULL;
		if (!v) {
			kind = "proxy_err";
			v = o ? json_object_get(o, kind) : NULL;
		}
		if (!key || !json_is_number(v))
			die("%s: line %ld: not {\"tensor\": KEY, \"rel_fro_err\" or \"proxy_err\": number}",
			    path, ln);
		int found = 0;
		for (int i = 0; i < nlin; i++)
			if (!strcmp(lins[i].key, key)) {
				lins[i].err = json_number_value(v);
				lins[i].err_kind = kind;
				found = 1;
			}
		if (!found)
			die("%s: line %ld: no quantized linear '%s' in the source", path, ln, key);
		json_decref(o);
	}
	free(line);
	fclose(f);
}

/* ---- the summary ------------------------------------------------------- */
struct acc {
	int linears, tensors;
	double params, bytes, kparams;   /* kparams: Σ numel·K over the linears */
};
static struct acc roles[X3_ROLE_COUNT], dec, head, mtp, vis, all;
/* the parts outside the bits with one K each, and their quantization_config key */
static const struct { const char *key, *what; struct acc *a; } side[2] = {
	{"mtp_bits", "the multi-token prediction layer", &mtp}, {"vision_bits", "the vision tower", &vis}};
static struct acc hist[9];           /* decoder linears by K */
static int ncb[X3_CB_COUNT], nlegacy;

static double lin_params(const struct lin *L) { return (double)L->q.in * (double)L->q.out; }
static int lin_bits(const struct lin *L) { return L->q.K ? L->q.K : L->unq_bits; }

static void summarize(void)
{
	for (int i = 0; i < nlin; i++) {
		const struct lin *L = &lins[i];
		double p = lin_params(L);
		struct acc *r = &roles[L->role];
		r->linears++, r->params += p, r->bytes += (double)L->q.bytes, r->kparams += p * lin_bits(L);
		all.params += p, all.bytes += (double)L->q.bytes;
		if (L->role == X3_ROLE_HEAD || L->role == X3_ROLE_MTP || L->role == X3_ROLE_VISION) {   /* outside */
			struct acc *a = L->role == X3_ROLE_HEAD ? &head : L->role == X3_ROLE_MTP ? &mtp : &vis;
			a->linears++, a->params += p, a->bytes += (double)L->q.bytes, a->kparams += p * lin_bits(L);
			continue;
		}
		dec.linears++, dec.params += p, dec.bytes += (double)L->q.bytes, dec.kparams += p * L->q.K;
		hist[L->q.K].linears++, hist[L->q.K].params += p;
		ncb[L->q.cb]++;
		nlegacy += L->q.legacy;
	}
	for (int i = 0; i < nunq; i++) {
		const x3_tensor *t = unqs[i].t;
		struct acc *r = &roles[unqs[i].role];
		double p = (double)x3_tensor_numel(t);
		r->tensors++, r->params += p, r->bytes += (double)t->nbytes;
		all.params += p, all.bytes += (double)t->nbytes;
	}
}

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }
static double ratio(double a, double b) { return b > 0 ? a / b : NAN; }

/* ---- JSON -------------------------------------------------------------- */
static json_t *shape_json(const x3_tensor *t)
{
	json_t *a = json_array();
	for (int d = 0; d < t->rank; d++)
		json_array_append_new(a, json_integer(t->shape[d]));
	return a;
}

/* ---- tied groups: linears a reader loads as one, one K each ----------- */
struct tg { const char *key; int members, K, cb, mixed; };
static struct tg *tgs;
static int ntg;

static void tied_groups(void)
{
	for (int i = 0; i < nlin; i++) {
		const struct lin *L = &lins[i];
		if (!L->tie[0])
			continue;
		int j;
		for (j = 0; j < ntg && strcmp(tgs[j].key, L->tie); j++)
			;
		if (j == ntg) {
			if (!(tgs = realloc(tgs, (size_t)(ntg + 1) * sizeof *tgs)))
				die("out of memory");
			tgs[ntg++] = (struct tg){ L->tie, 0, lin_bits(L), L->q.cb, 0 };
		}
		tgs[j].members++;
		tgs[j].mixed |= lin_bits(L) != tgs[j].K || L->q.cb != tgs[j].cb;
	}
}

static json_t *tied_json(void)
{
	json_t *a = json_array();
	for (int j = 0; j < ntg; j++)
		json_array_append_new(a, json_pack("{s:s, s:i, s:o, s:b}", "group", tgs[j].key, "members",
		                      tgs[j].members, "K", tgs[j].mixed ? json_null() : json_integer(tgs[j].K),
		                      "one_k", !tgs[j].mixed));
	return a;
}

static json_t *build_json(const char *src, json_t *qcfg)
{
	json_t *o = json_object();
	json_object_set_new(o, "source", json_string(src));
	json_t *f = json_object();
	json_object_set_new(f, "count", json_integer(nfiles));
	json_object_set_new(f, "bytes", json_integer((json_int_t)files_bytes));
	json_object_set_new(f, "safetensors_bytes", json_integer((json_int_t)st_bytes));
	json_object_set_new(o, "files", f);
	json_object_set(o, "quantization_config", qcfg ? qcfg : json_null());
	json_t *la = json_array();
	for (int i = 0; i < nlin; i++) {
		const struct lin *L = &lins[i];
		json_t *l = json_object();
		json_object_set_new(l, "key", json_string(L->key));
		json_object_set_new(l, "role", json_string(x3_role_name(L->role)));
		json_object_set_new(l, "layer", L->layer >= 0 ? json_integer(L->layer) : json_null());
		json_object_set_new(l, "K", json_integer(lin_bits(L)));
		json_object_set_new(l, "codebook", L->q.K ? json_string(x3_codebook_name(L->q.cb)) : json_null());
		json_object_set_new(l, "in", json_integer(L->q.in));
		json_object_set_new(l, "out", json_integer(L->q.out));
		json_object_set_new(l, "padded_in", json_integer(L->q.k));
		json_object_set_new(l, "padded_out", json_integer(L->q.n));
		json_object_set_new(l, "sizes_known", json_boolean(L->q.known == (X3_EXL3_IN_KNOWN | X3_EXL3_OUT_KNOWN)));
		json_object_set_new(l, "legacy_signs", json_boolean(L->q.legacy));
		json_object_set_new(l, "bias", json_boolean(L->q.has_bias));
		json_object_set_new(l, "bytes", json_integer((json_int_t)L->q.bytes));
		json_object_set_new(l, "bpw", num(8.0 * (double)L->q.bytes / lin_params(L)));
		if (isfinite(L->err))
			json_object_set_new(l, L->err_kind, json_real(L->err));
		json_array_append_new(la, l);
	}
	json_object_set_new(o, "linears", la);
	json_object_set_new(o, "tied_groups", tied_json());
	json_t *ua = json_array();
	for (int i = 0; i < nunq; i++) {
		json_t *u = json_object();
		json_object_set_new(u, "name", json_string(unqs[i].t->name));
		json_object_set_new(u, "role", json_string(x3_role_name(unqs[i].role)));
		json_object_set_new(u, "dtype", json_string(x3_dtype_name(unqs[i].t->dtype)));
		json_object_set_new(u, "shape", shape_json(unqs[i].t));
		json_object_set_new(u, "bytes", json_integer((json_int_t)unqs[i].t->nbytes));
		json_array_append_new(ua, u);
	}
	json_object_set_new(o, "unquantized", ua);

	json_t *s = json_object();
	json_object_set_new(s, "linears", json_integer(dec.linears));
	json_object_set_new(s, "bits", num(ratio(dec.kparams, dec.params)));
	json_object_set_new(s, "storage_bpw", num(ratio(8 * dec.bytes, dec.params)));
	json_object_set_new(s, "head_bits", head.linears ? json_integer((json_int_t)lround(ratio(head.kparams, head.params))) : json_null());
	json_object_set_new(s, "head_bpw", num(ratio(8 * head.bytes, head.params)));
	for (int k = 0; k < 2; k++)
		if (side[k].a->linears)
			json_object_set_new(s, side[k].key, num(ratio(side[k].a->kparams, side[k].a->params)));
	json_object_set_new(s, "params", json_real(all.params));
	json_object_set_new(s, "tensor_bytes", json_real(all.bytes));
	json_object_set_new(s, "stored_bits_per_param", num(ratio(8 * all.bytes, all.params)));
	json_t *r = json_object();
	for (int k = 0; k < X3_ROLE_COUNT; k++) {
		const struct acc *a = &roles[k];
		if (!a->linears && !a->tensors)
			continue;
		json_t *e = json_object();
		json_object_set_new(e, "linears", json_integer(a->linears));
		json_object_set_new(e, "tensors", json_integer(a->tensors));
		json_object_set_new(e, "params", json_real(a->params));
		json_object_set_new(e, "bytes", json_real(a->bytes));
		json_object_set_new(e, "bits", a->linears && !a->tensors ? num(ratio(a->kparams, a->params)) : json_null());
		json_object_set_new(e, "bpw", num(ratio(8 * a->bytes, a->params)));
		json_object_set_new(r, x3_role_name(k), e);
	}
	json_object_set_new(s, "roles", r);
	json_t *h = json_object();
	for (int k = 1; k <= 8; k++) {
		if (!hist[k].linears)
			continue;
		char b[4];
		snprintf(b, sizeof b, "%d", k);
		json_t *e = json_object();
		json_object_set_new(e, "linears", json_integer(hist[k].linears));
		json_object_set_new(e, "params", json_real(hist[k].params));
		json_object_set_new(h, b, e);
	}
	json_object_set_new(s, "histogram", h);
	json_t *c = json_object();
	for (int k = 0; k < X3_CB_COUNT; k++)
		if (ncb[k])
			json_object_set_new(c, x3_codebook_name(k), json_integer(ncb[k]));
	json_object_set_new(s, "codebooks", c);
	json_object_set_new(s, "legacy_signs", json_integer(nlegacy));
	json_object_set_new(o, "summary", s);
	json_t *w = json_array();
	for (int i = 0; i < nwarns; i++)
		json_array_append_new(w, json_string(warns[i]));
	json_object_set_new(o, "warnings", w);
	return o;
}

/* ---- the table --------------------------------------------------------- */

static void print_table(const char *src, json_t *qcfg)
{
	char b1[32], b2[32], sh[64];
	int w = 6;
	for (int i = 0; i < nlin; i++)
		if ((int)strlen(lins[i].key) > w)
			w = (int)strlen(lins[i].key);
	for (int i = 0; i < nunq; i++)
		if ((int)strlen(unqs[i].t->name) > w)
			w = (int)strlen(unqs[i].t->name);
	printf("%s: %d files, %s (%s of safetensors)\n\n", src, nfiles, human_bytes((double)files_bytes, b1, sizeof b1),
	       human_bytes((double)st_bytes, b2, sizeof b2));
	printf("%-*s  %2s  %-8s  %-11s  %-11s  %12s  %6s\n", w, "linear", "K", "codebook", "out x in",
	       "padded", "bytes", "bpw");
	for (int i = 0; i < nlin; i++) {
		const struct lin *L = &lins[i];
		char s1[32], s2[32];
		snprintf(s1, sizeof s1, "%lldx%lld", (long long)L->q.out, (long long)L->q.in);
		snprintf(s2, sizeof s2, "%lldx%lld", (long long)L->q.n, (long long)L->q.k);
		printf("%-*s  %2d  %-8s  %-11s  %-11s  %12llu  %6.3f%s\n", w, L->key, lin_bits(L),
		       L->q.K ? x3_codebook_name(L->q.cb) : x3_dtype_name(L->unq_bits == 32 ? X3_F32 : X3_F16),
		       s1, L->q.K ? s2 : "-", (unsigned long long)L->q.bytes,
		       8.0 * (double)L->q.bytes / lin_params(L), L->q.legacy ? "  (su/sv signs)" : "");
	}
	printf("\n%-*s  %-6s  %-15s  %12s  %s\n", w, "unquantized", "dtype", "shape", "bytes", "role");
	for (int i = 0; i < nunq; i++) {
		const x3_tensor *t = unqs[i].t;
		printf("%-*s  %-6s  %-15s  %12zu  %s\n", w, t->name, x3_dtype_name(t->dtype),
		       t->rank ? x3_shape_str(t, sh, sizeof sh) : "scalar", t->nbytes,
		       x3_role_name(unqs[i].role));
	}
	printf("\nsummary\n");
	printf("  bits (decoder linears, as quantization_config.bits)  %.4f\n", ratio(dec.kparams, dec.params));
	printf("  storage bpw of the decoder linears (scales included) %.4f\n", ratio(8 * dec.bytes, dec.params));
	if (head.linears)
		printf("  head                                                 %ld bits, %.4f bpw stored\n",
		       lround(ratio(head.kparams, head.params)), ratio(8 * head.bytes, head.params));
	for (int k = 0; k < 2; k++)   /* (all one K) */
		if (side[k].a->linears)
			printf("  %-28s (%3d linears)         %.4g bits, %.4f bpw stored\n", side[k].what + 4, side[k].a->linears,
			       ratio(side[k].a->kparams, side[k].a->params), ratio(8 * side[k].a->bytes, side[k].a->params));
	printf("  stored bits per parameter, whole pack                %.4f (%.0f parameters, %s)\n",
	       ratio(8 * all.bytes, all.params), all.params, human_bytes(all.bytes, b1, sizeof b1));
	printf("\n  %-15s %7s %7s %14s %12s %8s %8s\n", "role", "linears", "tensors", "params", "bytes", "bits", "bpw");
	for (int k = 0; k < X3_ROLE_COUNT; k++) {
		const struct acc *a = &roles[k];
		if (!a->linears && !a->tensors)
			continue;
		char bits[16] = "-";
		if (a->linears && !a->tensors)
			snprintf(bits, sizeof bits, "%.3f", ratio(a->kparams, a->params));
		printf("  %-15s %7d %7d %14.0f %12.0f %8s %8.3f\n", x3_role_name(k), a->linears, a->tensors,
		       a->params, a->bytes, bits, ratio(8 * a->bytes, a->params));
	}
	printf("\n  K histogram (decoder linears)\n");
	for (int k = 1; k <= 8; k++)
		if (hist[k].linears)
			printf("  K=%d %5d linears %14.0f params %6.2f%%\n", k, hist[k].linears, hist[k].params,
			       100 * hist[k].params / dec.params);
	if (ntg) {
		int mixed = 0;
		for (int j = 0; j < ntg; j++)
			mixed += tgs[j].mixed;
		printf("\n  tied groups (a reader loads each as one: one K): %d, %s\n", ntg,
		       mixed ? "some of mixed K or codebook:" : "each of one K");
		for (int j = 0; j < ntg; j++)
			if (tgs[j].mixed)
				printf("    %s: %d linears of mixed K or codebook\n", tgs[j].key, tgs[j].members);
	}
	printf("\n  codebooks:");
	for (int k = 0; k < X3_CB_COUNT; k++)
		if (ncb[k])
			printf(" %s %d", x3_codebook_name(k), ncb[k]);
	if (nlegacy)
		printf("; %d with legacy su/sv signs", nlegacy);
	printf("\n\nquantization_config\n");
	if (!qcfg) {
		printf("  (none)\n");
		return;
	}
	const char *k;
	json_t *v;
	json_object_foreach(qcfg, k, v) {
		char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
		printf("  %-14s %s\n", k, s ? s : "?");
		free(s);
	}
}

/* ---- the plot ---------------------------------------------------------- */
/* a gnuplot single-quoted string: ' doubled */
static void gq(FILE *f, const char *s)
{
	fputc('\'', f);
	for (; *s; s++) {
		if (*s == '\'')
			fputc('\'', f);
		fputc(*s, f);
	}
	fputc('\'', f);
}

static const int plot_roles[] = {X3_ROLE_ATTENTION, X3_ROLE_MLP, X3_ROLE_EXPERT, X3_ROLE_SHARED_EXPERT,
                                 X3_ROLE_OTHER, X3_ROLE_HEAD};
#define NROLES (sizeof plot_roles / sizeof *plot_roles)

/* Series that coincide (every role at one K, say) stay apart: series s has a
 * point type and a dash type of its own, hollow after the first and smaller
 * than the one before (in the bits panel also shifted right a step), so a
 * point drawn over another leaves the one below it visible. */
static const int plot_pt[NROLES] = {5, 6, 8, 10, 12, 2};   /* a filled square; circle, triangles, diamond; a cross */
static void plot_style(FILE *f, int s)
{
	fprintf(f, " pointtype %d dashtype %d pointsize %.2f", plot_pt[s % NROLES], s % 5 + 1,
	        1.6 - 0.2 * (s % NROLES));
}

/* a linear's name on the x axis of the per-tensor panel: its key without
 * the leading "model." and "layers." (0.self_attn.q_proj, lm_head) */
static const char *plot_name(const char *key)
{
	key += strncmp(key, "model.", 6) ? 0 : 6;
	return key + (strncmp(key, "layers.", 7) ? 0 : 7);
}

/* the most names the per-tensor panel's x axis holds: past it, every N-th */
#define PLOT_MAX_NAMES 80

static char *plot_script(const char *src, size_t *len)
{
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len);
	if (!f)
		die("out of memory");
	int maxl = -1, anyerr = 0;
	for (int i = 0; i < nlin; i++) {
		if (lins[i].layer > maxl)
			maxl = lins[i].layer;
		anyerr |= isfinite(lins[i].err) && lins[i].err > 0;
	}
	/* the per-tensor panel names every tensor, or every N-th: rotated
	 * labels below it, about 6 pixels a character */
	int every = nlin > PLOT_MAX_NAMES ? (nlin + PLOT_MAX_NAMES - 1) / PLOT_MAX_NAMES : 1, names = 0;
	for (int i = 0; anyerr && i < nlin; i += every)
		if (6 * (int)strlen(plot_name(lins[i].key)) > names)
			names = 6 * (int)strlen(plot_name(lins[i].key));
	int top = 30 /* the multiplot's title */, h1 = 380, h2 = anyerr ? 380 + names : 0, width = 900;
	if (anyerr && nlin / every * 12 > width - 200)
		width = nlin / every * 12 + 200;
	fprintf(f, "set terminal svg size %d,%d dynamic noenhanced font 'sans,11' name 'exl3info'\n", width, top + h1 + h2);
	fprintf(f, "set output\nset multiplot title ");
	gq(f, src);
	fprintf(f, "\nset key outside right top\nset grid\nset style data linespoints\n");
	/* panel 1: numel-weighted K per layer and role; the head at x = layers */
	fprintf(f, "set origin 0,%.4f\nset size 1,%.4f\n", (double)h2 / (top + h1 + h2), (double)h1 / (top + h1 + h2));
	int has_head = 0;
	for (int i = 0; i < nlin; i++)
		has_head |= lins[i].role == X3_ROLE_HEAD;
	fprintf(f, "set title 'bits per weight by layer and role'\n"
	        "set xlabel 'layer'\nset ylabel 'bits (K)'\nset yrange [0:8.5]\nset xrange [-0.5:%d.5]\n"
	        "set xtics %d\n", maxl + has_head, maxl < 32 ? 1 : (maxl + 15) / 16);
	if (has_head)
		fprintf(f, "set xtics add ('head' %d)\n", maxl + 1);
	int nser = 0, rser[NROLES];
	for (size_t r = 0; r < NROLES; r++) {
		int role = plot_roles[r], any = 0;
		for (int i = 0; i < nlin; i++)
			any |= lins[i].role == role;
		rser[r] = -1;
		if (!any)
			continue;
		rser[r] = nser;
		fprintf(f, "$bits%d << EOD\n", nser);
		for (int l = -1; l <= maxl; l++) {
			double p = 0, kp = 0;
			for (int i = 0; i < nlin; i++)
				if (lins[i].role == role && lins[i].layer == l)
					p += lin_params(&lins[i]), kp += lin_params(&lins[i]) * lin_bits(&lins[i]);
			if (p > 0)
				fprintf(f, "%d %.6g\n", l < 0 ? maxl + 1 : l, kp / p);
		}
		fprintf(f, "EOD\n");
		nser++;
	}
	/* the shift of series s: a twentieth of a layer (at most 0.3) */
	double dx = (maxl + has_head + 1) / 20.0 > 0.3 ? 0.3 : (maxl + has_head + 1) / 20.0;
	if (dx * nser > 0.45)
		dx = 0.45 / nser;
	fprintf(f, "plot");
	for (size_t r = 0; r < NROLES; r++) {
		int s = rser[r];
		if (s < 0)
			continue;
		fprintf(f, "%s $bits%d using ($1+%.4f):2 title '%s'%s", s ? "," : "", s, s * dx,
		        x3_role_name(plot_roles[r]), plot_roles[r] == X3_ROLE_HEAD ? " with points" : "");
		plot_style(f, s);
	}
	fprintf(f, "\n");
	if (anyerr) {
		const char *kind = "error";
		for (int i = 0; i < nlin; i++)
			if (isfinite(lins[i].err))
				kind = lins[i].err_kind;
		fprintf(f, "set origin 0,0\nset size 1,%.4f\n", (double)h2 / (top + h1 + h2));
		fprintf(f, "set title 'per-tensor %s (model order)'\nset xlabel 'linear'\n"
		        "set ylabel '%s'\nset logscale y\nset yrange [*:*]\nset xrange [-0.5:%d.5]\n"
		        "set style data points\nset xtics rotate by 90 right nomirror (",
		        kind, kind, nlin - 1);
		for (int i = 0; i < nlin; i += every)
			fprintf(f, "%s", i ? ", " : ""), gq(f, plot_name(lins[i].key)), fprintf(f, " %d", i);
		fprintf(f, ")\n");
		if (every > 1)
			fprintf(f, "set xlabel 'linear (every %d%s named)'\n", every, every == 2 ? "nd" : every == 3 ? "rd" : "th");
		int ne = 0, used[NROLES] = {0};
		for (size_t r = 0; r < NROLES; r++) {
			int any = 0;
			for (int i = 0; i < nlin; i++)
				any |= lins[i].role == plot_roles[r] && isfinite(lins[i].err) && lins[i].err > 0;
			if (!any)
				continue;
			used[r] = 1;
			fprintf(f, "$err%zu << EOD\n", r);
			for (int i = 0; i < nlin; i++)
				if (lins[i].role == plot_roles[r] && isfinite(lins[i].err) && lins[i].err > 0)
					fprintf(f, "%d %.6g\n", i, lins[i].err);
			fprintf(f, "EOD\n");
		}
		fprintf(f, "plot");
		for (size_t r = 0; r < NROLES; r++)
			if (used[r]) {
				fprintf(f, "%s $err%zu using 1:2 title '%s'", ne ? "," : "", r, x3_role_name(plot_roles[r]));
				plot_style(f, ne++);
			}
		fprintf(f, "\n");
	}
	fprintf(f, "unset multiplot\n");
	if (fclose(f))
		die("out of memory");
	return buf;
}

/* Run gnuplot with script on its stdin and its stdout on fd. */
static void run_gnuplot(const char *script, size_t len, int fd, const char *what)
{
	int p[2];
	if (pipe(p))
		die("pipe: %s", strerror(errno));
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p[0], 0);
	posix_spawn_file_actions_adddup2(&fa, fd, 1);
	posix_spawn_file_actions_addclose(&fa, p[1]);
	char *argv[] = {"gnuplot", NULL};
	pid_t pid;
	int rc = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(p[0]);
	if (rc)
		die("%s: cannot run gnuplot: %s (install gnuplot-nox)", what, strerror(rc));
	size_t off = 0;
	while (off < len) {
		ssize_t w = write(p[1], script + off, len - off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		off += (size_t)w;
	}
	close(p[1]);
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			die("%s: waitpid: %s", what, strerror(errno));
	if (off < len || !WIFEXITED(st) || WEXITSTATUS(st))
		die("%s: gnuplot failed (exit status %d)", what, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* ---- reading ------------------------------------------------------------ */

/* SOURCE (kind X3_SRC_*): its nt tensors ts, a frame stream's (own) or a
 * pack's (in st) */
struct source { int kind, nt; x3_st *st; x3_tensor **own; const x3_tensor **ts; };

static void open_source(const char *src, struct source *s)
{
	memset(s, 0, sizeof *s);
	if (x3_source_kind(src, &s->kind))
		die_x3("%s", src);
	if (s->kind == X3_SRC_FRAMES) {
		if (x3_read_all(src, &s->own, &s->nt))
			die_x3("%s", src);
		s->ts = (const x3_tensor **)s->own;
		return;
	}
	if (x3_st_open(src, &s->st))
		die_x3("%s", src);
	s->nt = x3_st_count(s->st);
	if (!(s->ts = malloc((size_t)(s->nt ? s->nt : 1) * sizeof *s->ts)))
		die("out of memory");
	for (int i = 0; i < s->nt; i++)
		s->ts[i] = x3_st_get(s->st, i);
}

/* a directory's config.json: its quantization_config (checked), and the
 * model description's n linears lin when the toolkit knows the architecture
 * (their original sizes; a pack stores only padded ones; else acfg's desc
 * is NULL: model order by name) */
struct desc { json_t *cfg, *qcfg; x3_model_config acfg; x3_module *lin; int n; };

static void read_config(const char *src, int kind, struct desc *d)
{
	memset(d, 0, sizeof *d);
	if (kind != X3_SRC_DIR)
		return;
	char p[4096];
	snprintf(p, sizeof p, "%s/config.json", src);
	char *text = read_text(p);
	if (!text) {
		warning("%s: no config.json", src);
		return;
	}
	json_error_t je;
	if (!(d->cfg = json_loads(text, 0, &je)) || !json_is_object(d->cfg))
		die("%s: %s", p, d->cfg ? "not a JSON object" : je.text);
	d->qcfg = json_object_get(d->cfg, "quantization_config");
	if (!json_is_object(d->qcfg)) {
		warning("%s: no quantization_config", p);
		d->qcfg = NULL;
	} else {
		const char *qm = json_string_value(json_object_get(d->qcfg, "quant_method"));
		if (!qm || strcmp(qm, "exl3"))
			problem("%s: quantization_config.quant_method is %s, not \"exl3\"", p,
			        qm ? qm : "missing");
		json_t *cb = json_object_get(d->qcfg, "codebook");
		int cbv;
		if (cb && (!json_is_string(cb) || x3_codebook_parse(json_string_value(cb), &cbv)))
			problem("%s: quantization_config.codebook %s is an unknown codebook "
			        "(mul1, mcg or 3inst)", p, json_is_string(cb) ? json_string_value(cb) : "(not a string)");
	}
	if (x3_config_load_as(src, X3_CONFIG_LAYOUT, &d->acfg) || x3_arch_modules(&d->acfg, &d->lin, &d->n)) {
		memset(&d->acfg, 0, sizeof d->acfg);
		d->lin = NULL, d->n = 0;
	}
	free(text);
}

/* The quantized linear of key (pl characters of part[0]'s name) with its
 * n tensors part, checked, appended to lins, its sizes and tied group
 * from the description's linear of that key */
static void add_linear(const x3_tensor **part, int n, size_t pl, const struct desc *d)
{
	struct lin *L = &lins[nlin];
	if (pl >= sizeof L->key)
		die("tensor '%s': name too long", part[0]->name);
	memcpy(L->key, part[0]->name, pl);
	L->key[pl] = 0;
	if (x3_exl3_inspect(L->key, part, n, &L->q)) {
		problem("%s", x3_errmsg());
		return;
	}
	L->role = x3_pack_role_of(d->lin, d->n, L->key, &L->layer);
	char tn[600];
	snprintf(tn, sizeof tn, "%s.trellis", L->key);
	x3_pack_order(&d->acfg, tn, &L->mod, &L->rank);
	L->err = L->q.proxy_err;
	L->err_kind = "proxy_err";
	for (int a = 0; a < d->n; a++) {
		const x3_module *m = &d->lin[a];
		if (m->d->kind != X3_KIND_LINEAR || strcmp(m->key, L->key))
			continue;
		if (x3_pack_pad128(m->in) != L->q.k || x3_pack_pad128(m->out) != L->q.n) {
			problem("tensor '%s.trellis': a %lldx%lld (in x out) weight, config.json "
			        "gives %lldx%lld", L->key, (long long)L->q.k, (long long)L->q.n,
			        (long long)m->in, (long long)m->out);
			break;
		}
		if (!(L->q.known & X3_EXL3_IN_KNOWN))
			L->q.in = m->in;
		if (!(L->q.known & X3_EXL3_OUT_KNOWN))
			L->q.out = m->out;
		L->q.known = X3_EXL3_IN_KNOWN | X3_EXL3_OUT_KNOWN;
		snprintf(L->tie, sizeof L->tie, "%s", m->tie);
	}
	nlin++;
}

/* the tensors grouped by module key: a group with an EXL3 part is a
 * linear (lins), each tensor of any other one is unquantized (unqs) */
static void group_tensors(const struct source *s, const struct desc *d)
{
	int nt = s->nt;
	const x3_tensor **sorted = malloc((size_t)(nt ? nt : 1) * sizeof *sorted);
	lins = calloc((size_t)(nt ? nt : 1), sizeof *lins);
	unqs = calloc((size_t)(nt ? nt : 1), sizeof *unqs);
	if (!sorted || !lins || !unqs)
		die("out of memory");
	memcpy(sorted, s->ts, (size_t)nt * sizeof *s->ts);
	qsort(sorted, (size_t)nt, sizeof *sorted, cmp_prefix);
	for (int i = 0, j; i < nt; i = j) {
		size_t pl = prefix_len(sorted[i]->name);
		int quant = 0;
		for (j = i; j < nt && prefix_len(sorted[j]->name) == pl &&
		            !memcmp(sorted[j]->name, sorted[i]->name, pl); j++)
			quant |= pl && is_scale_part(sorted[j]->name + pl + 1);
		if (quant) {
			add_linear(sorted + i, j - i, pl, d);
			continue;
		}
		for (int m = i; m < j; m++) {
			struct unq *u = &unqs[nunq++];
			u->t = sorted[m];
			u->role = x3_pack_role(u->t->name, &u->layer);
			x3_pack_order(&d->acfg, u->t->name, &u->mod, &u->rank);
		}
	}
	free(sorted);
}

/* a head kept unquantized (--head-bits 16): lm_head.weight, to lins */
static void head_unquantized(void)
{
	for (int i = 0; i < nunq; i++) {
		const x3_tensor *t = unqs[i].t;
		if (unqs[i].role != X3_ROLE_HEAD || t->rank != 2 || !x3_dtype_info(t->dtype)->is_float ||
		    strcmp(t->name + prefix_len(t->name), ".weight"))
			continue;
		struct lin *L = &lins[nlin++];
		memcpy(L->key, t->name, prefix_len(t->name));
		L->key[prefix_len(t->name)] = 0;
		L->q.in = L->q.k = t->shape[1];
		L->q.out = L->q.n = t->shape[0];
		L->q.bytes = t->nbytes;
		L->q.known = X3_EXL3_IN_KNOWN | X3_EXL3_OUT_KNOWN;
		L->unq_bits = (int)(8 * x3_dtype_size(t->dtype));
		L->role = X3_ROLE_HEAD;
		L->layer = -1;
		L->mod = unqs[i].mod, L->rank = unqs[i].rank;
		L->err = NAN;
		memmove(&unqs[i], &unqs[i + 1], (size_t)(nunq - i - 1) * sizeof *unqs);
		nunq--, i--;
	}
}

/* warnings: the linears of unknown original size, the tied groups of
 * mixed widths, a quantization_config whose bits disagree with the pack */
static void check_pack(json_t *qcfg)
{
	int unknown = 0, first = -1;
	for (int i = 0; i < nlin; i++)
		if (lins[i].q.K && lins[i].q.known != (X3_EXL3_IN_KNOWN | X3_EXL3_OUT_KNOWN) && unknown++ == 0)
			first = i;
	if (unknown)
		warning("original sizes unknown for %d linear(s) (no metadata, not in config.json's "
		        "architecture), padded sizes used, e.g. '%s'", unknown, lins[first].key);
	for (int j = 0; j < ntg; j++)
		if (tgs[j].mixed)
			warning("tied group %s: its %d linears have mixed K or codebook (ExLlamaV3 cannot "
			        "load it: exl3-info --check exllamav3 names them)", tgs[j].key, tgs[j].members);
	if (!qcfg)
		return;
	json_t *b = json_object_get(qcfg, "bits");
	double have = ratio(dec.kparams, dec.params);
	if (json_is_number(b) && fabs(json_number_value(b) - have) > 0.0051)
		warning("quantization_config.bits %g, but the trellis widths give %.4f",
		        json_number_value(b), have);
	json_t *hb = json_object_get(qcfg, "head_bits");
	if (json_is_integer(hb) && head.linears &&
	    json_integer_value(hb) != lround(ratio(head.kparams, head.params)))
		warning("quantization_config.head_bits %lld, but the head has %ld bits",
		        (long long)json_integer_value(hb), lround(ratio(head.kparams, head.params)));
	for (int k = 0; k < 2; k++) {
		json_t *b = json_object_get(qcfg, side[k].key);
		double have = ratio(side[k].a->kparams, side[k].a->params);
		if (json_is_integer(b) && side[k].a->linears && json_integer_value(b) != have)
			warning("quantization_config.%s %lld, but %s has %.4f bits", side[k].key,
			        (long long)json_integer_value(b), side[k].what, have);
	}
}

/* --plot FILE: gnuplot's picture of the pack into FILE */
static void write_plot(const char *src, const char *plot)
{
	struct outfile of;
	size_t len;
	char *script = plot_script(src, &len);
	int fd = outfile_open(&of, plot);
	run_gnuplot(script, len, fd, plot);
	struct stat sb;
	if (fstat(fd, &sb) || sb.st_size == 0)
		die("%s: gnuplot wrote nothing", plot);
	outfile_commit(&of);
	free(script);
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	enum { O_JSON = 256, O_PLOT, O_ERRORS, O_CHECK };
	static const struct option lo[] = {
		{ "json", no_argument, 0, O_JSON }, { "plot", required_argument, 0, O_PLOT },
		{ "check", required_argument, 0, O_CHECK },
		{ "errors", required_argument, 0, O_ERRORS }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	int as_json = 0, c;
	const char *plot = NULL, *errfile = NULL, *check = NULL;
	while ((c = getopt_long(argc, argv, "hq", lo, NULL)) != -1) {
		switch (c) {
		case 'h': fputs(usage, stdout); return 0;
		case 'q': quiet = 1; break;
		case O_JSON: as_json = 1; break;
		case O_PLOT: plot = optarg; break;
		case O_ERRORS: errfile = optarg; break;
		case O_CHECK: check = optarg; break;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind + 1 != argc)
		usage_error(usage, optind == argc ? "a SOURCE is required" : "one SOURCE only");
	const char *src = argv[optind];
	if (check)
		return check_reader(usage, check, src, as_json);

	struct source s;
	struct desc d;
	open_source(src, &s);
	count_files(src, s.kind);
	read_config(src, s.kind, &d);
	group_tensors(&s, &d);
	head_unquantized();
	int nq = 0;
	for (int i = 0; i < nlin; i++)
		nq += lins[i].q.K > 0;
	if (!nq && !nproblems)
		problem("%s: no EXL3 linears (no '<key>.trellis' tensors)", src);
	if (nproblems) {
		for (int i = 0; i < nproblems; i++)
			warnx("%s", problems[i]);
		return 1;
	}
	qsort(lins, (size_t)nlin, sizeof *lins, cmp_lin);
	qsort(unqs, (size_t)nunq, sizeof *unqs, cmp_unq);
	if (errfile)
		read_errors(errfile);
	summarize();
	tied_groups();
	check_pack(d.qcfg);
	if (!quiet)
		for (int i = 0; i < nwarns; i++)
			warnx("warning: %s", warns[i]);

	if (plot)
		write_plot(src, plot);
	if (as_json) {
		json_t *o = build_json(src, d.qcfg);
		json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
		printf("\n");
		json_decref(o);
	} else {
		print_table(src, d.qcfg);
	}
	check_stdout();
	json_decref(d.cfg);
	free(d.lin);
	free(s.ts != (const x3_tensor **)s.own ? (void *)s.ts : NULL);
	if (s.own)
		x3_tensors_free(s.own, s.nt);
	if (s.st)
		x3_st_close(s.st);
	return 0;
}
