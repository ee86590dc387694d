/* bitalloc: per-tensor bit widths from trellis-encode --measure lines. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"
#include "arch.h"
#include "bitalloc.h"
#include "jsonw.h"
#include "frame.h"
#include "pack.h"
#include "safetensors.h"

static const char usage[] =
	"usage: bitalloc --bits B [--head-bits N] [--hq [N]] [--set REGEX=K]...\n"
	"                [--importance FILE] [--strategy optimal|exllamav3]\n"
	"                [--method auto|dp|lagrangian] [-o PLAN] [-q] [FILE...]\n"
	"       bitalloc --size BYTES --model SRC [--codebook C] [--cal-rows R] [--cal-cols C]\n"
	"                [--head-bits N] [--set REGEX=K]... [--importance FILE]\n"
	"                [--method M] [-o PLAN] [-q] [FILE...]\n"
	"       bitalloc --predict --model SRC (--bits B | --size BYTES) [--head-bits N]\n"
	"                [--mtp-bits N]\n"
	"                [--codebook C] [--cal-rows R] [--cal-cols C] [--set REGEX=K]...\n"
	"       (with --model: [--shard-size SIZE] [--mtp-bits N] [--vision-bits N])\n"
	"       bitalloc --lines FILE...\n"
	"       (any of them: [--measurement JSON])\n";

static void help(void)
{
	printf("%s", usage);
	printf("Reads JSON lines {tensor, K, proxy_err, numel} (trellis-encode --measure)\n"
	       "from FILEs or stdin and prints a plan (JSON): a bit width K for every\n"
	       "linear so that the numel-weighted average K is <= B, minimizing\n"
	       "sum(proxy_err * importance).\n"
	       "  --bits B          target average bits of the decoder linears (1..8)\n"
	       "  --head-bits N     lm_head bits, 1..8 or 16 (unquantized); default 6\n"
	       "  --mtp-bits N      with --model: the multi-token prediction layer's\n"
	       "                    linears' bits, 1..8, default 4; outside the budget, as\n"
	       "                    the head (the bytes count them)\n"
	       "  --vision-bits N   with --model: the vision tower's linears' bits, 1..8\n"
	       "                    (outside the budget, as the MTP layer's), or 16, the\n"
	       "                    default: the tower passed through\n"
	       "  --hq [N]          floor each linear at min(floor(B)+hq, 8), hq its\n"
	       "                    architecture's promotion (tensor-ls --modules: attention\n"
	       "                    +2, shared experts +1); with N (1..8, the next argument\n"
	       "                    when it is a number, or --hq=N): the linears with an hq\n"
	       "                    floored at min(floor(B)+N, 8) instead\n"
	       "  --set REGEX=K     fix K for linears matching REGEX (PCRE2, repeatable)\n"
	       "  --importance FILE JSON lines {tensor, importance}; default numel\n"
	       "  --strategy S      optimal (default) or exllamav3 (its greedy, for comparison)\n"
	       "  --method M        auto (default: exact DP when small enough), dp, lagrangian\n"
	       "  -o PLAN           write the plan to PLAN (atomically) instead of stdout\n"
	       "  -q                no summary on stderr\n"
	       "  --size BYTES      plan for the whole pack of SRC to be at most BYTES (with a\n"
	       "                    unit: K M G T = 1000^n, KiB MiB GiB TiB = 1024^n), by the\n"
	       "                    trellis bytes of each K instead of a bits average\n"
	       "  --model SRC       the source model: its description and tensors give the\n"
	       "                    bytes of every file pack-write will write\n"
	       "  --codebook C      mul1 (default), mcg or 3inst, as given to pack-write\n"
	       "  --cal-rows R, --cal-cols C  as given to pack-write (default 250, 2048)\n"
	       "  --shard-size SIZE the largest tensor file of the pack, as given to pack-write\n"
	       "                    (--size's units; default 8 GiB): its shards' headers and\n"
	       "                    index are counted\n"
	       "  --predict         no measurements: print the byte model of SRC for --bits B\n"
	       "                    or --size BYTES (one JSON object): the smallest and largest\n"
	       "                    pack, the predicted size, the widths to measure\n"
	       "  --measurement J   a JSON object saying how the widths were measured (e.g.\n"
	       "                    {\"method\":\"sample\",\"sample\":0.125}): the plan's\n"
	       "                    \"measurement\", which pack-write copies into\n"
	       "                    quantization_config.json (and the byte model counts);\n"
	       "                    the plan gets the sampled measurements' work summed\n"
	       "                    (\"measurement_work\": strips, Viterbi tiles)\n"
	       "  --lines           print the measurement line of each FILE: a trellis-encode\n"
	       "                    frame stream (its trellis frame's metadata) or its\n"
	       "                    --measure JSON lines (with how they were sampled)\n");
}

/* ---- --lines: the measurements as bitalloc reads them -------------------- */
/* a JSON line on stdout: O's members in order, a real as the shortest
 * text that reads back as the same double */
static void put_line(json_t *o, const char *what)
{
	const char *k;
	json_t *v;
	int first = 1;
	putchar('{');
	json_object_foreach(o, k, v) {
		json_t *ks = json_string(k);
		char *kt = json_dumps(ks, JSON_ENCODE_ANY);
		json_decref(ks);
		if (!kt)
			die("%s: cannot encode its measurement", what);
		printf("%s%s:", first ? "" : ",", kt);
		free(kt);
		first = 0;
		if (json_is_real(v)) {
			double d = json_real_value(v);
			char b[64];
			for (int p = 1; p <= 17; p++) {
				snprintf(b, sizeof b, "%.*g", p, d);
				if (strtod(b, NULL) == d)
					break;
			}
			if (!strpbrk(b, ".eEn"))
				strcat(b, ".0");
			fputs(b, stdout);
		} else {
			char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
			if (!t)
				die("%s: cannot encode its measurement", what);
			fputs(t, stdout);
			free(t);
		}
	}
	puts("}");
	json_decref(o);
}

static double meta_num(const x3_tensor *t, const char *key, const char *path)
{
	const char *v = x3_meta_get(t, key);
	char *e;
	double d = v ? strtod(v, &e) : NAN;
	if (!v || e == v || *e)
		die("%s: frame '%s': metadata '%s' is not a number", path, t->name, key);
	return d;
}

/* FILE: JSON lines (its first byte '{'), else a frame stream */
static void lines_of(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		die("%s: %s", path, strerror(errno));
	int c = fgetc(f);
	if (c == '{') {
		ungetc(c, f);
		static const char *const keys[] = {"tensor", "K", "proxy_err", "numel", "sample", "strips",
		                                   "strips_total", "search_tiles", "ldlq_tiles"};
		char *line = NULL;
		size_t cap = 0;
		long no = 0;
		while (getline(&line, &cap, f) > 0) {
			no++;
			json_error_t je;
			json_t *in = json_loads(line, 0, &je);
			if (!json_is_object(in))
				die("%s:%ld: not a JSON object", path, no);
			json_t *o = json_object();
			for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
				json_t *v = json_object_get(in, keys[i]);
				json_object_set_new(o, keys[i], v ? json_incref(v) : json_null());
			}
			json_decref(in);
			put_line(o, path);
		}
		free(line);
		if (ferror(f))
			die("%s: read error: %s", path, strerror(errno));
		fclose(f);
		return;
	}
	fclose(f);
	x3_reader *r;
	if (x3_reader_open(path, &r))
		die("%s", x3_errmsg());
	x3_tensor *t;
	int rc;
	while ((rc = x3_reader_next_header(r, &t)) == 0) {
		const char *role = x3_meta_get(t, "role"), *key = x3_meta_get(t, "key");
		if (role && !strcmp(role, "trellis")) {
			if (!key)
				die("%s: trellis frame '%s' has no key", path, t->name);
			json_t *o = json_object();
			json_object_set_new(o, "tensor", json_string(key));
			json_object_set_new(o, "K", json_integer((json_int_t)meta_num(t, "K", path)));
			json_object_set_new(o, "proxy_err", json_real(meta_num(t, "proxy_err", path)));
			json_object_set_new(o, "numel", json_integer((json_int_t)meta_num(t, "in_features", path) *
			                                             (json_int_t)meta_num(t, "out_features", path)));
			put_line(o, path);
		}
		x3_tensor_free(t);
		if (x3_reader_skip(r))
			die("%s", x3_errmsg());
	}
	if (rc != X3_EOF)
		die("%s", x3_errmsg());
	x3_reader_close(r);
}


/* the work of the sampled measurements read (a plan's measurement_work):
 * strips over the lines that say how they were sampled, Viterbi tiles over
 * all */
static struct { json_int_t strips, total, search, ldlq; int any; } work;

static void add_work(const char *text, size_t n)
{
	const char *s = text, *end = text + n;
	while (s < end) {
		const char *e = memchr(s, '\n', (size_t)(end - s));
		if (!e)
			e = end;
		json_t *o = json_loadb(s, (size_t)(e - s), 0, NULL);
		json_t *st = json_object_get(o, "strips");
		if (json_is_integer(st)) {
			work.any = 1;
			work.strips += json_integer_value(st);
			work.total += json_integer_value(json_object_get(o, "strips_total"));
		}
		work.search += json_integer_value(json_object_get(o, "search_tiles"));
		work.ldlq += json_integer_value(json_object_get(o, "ldlq_tiles"));
		json_decref(o);
		s = e + 1;
	}
}

static void read_file(x3_ba *ba, const char *path, int importance)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
	if (!f)
		die("%s: %s", path, strerror(errno));
	const char *label = strcmp(path, "-") ? path : "stdin";
	int rc;
	if (importance)
		rc = x3_ba_read_importance(ba, f, label);
	else {
		/* read whole (a pipe is read once), its work summed, then parsed */
		char *buf = NULL;
		size_t n = 0, cap = 0, k;
		do {
			if (n + 65536 > cap) {
				cap = (n + 65536) * 2;
				char *nb = realloc(buf, cap);
				if (!nb)
					die("out of memory");
				buf = nb;
			}
			k = fread(buf + n, 1, cap - n, f);
			n += k;
		} while (k > 0);
		if (ferror(f))
			die("%s: read error: %s", label, strerror(errno));
		add_work(buf, n);
		FILE *m = fmemopen(buf, n ? n : 1, "r");
		if (!m)
			die("out of memory");
		if (!n)
			fgetc(m);
		rc = x3_ba_read(ba, m, label);
		fclose(m);
		free(buf);
	}
	if (f != stdin)
		fclose(f);
	if (rc)
		die("%s", x3_errmsg());
}

/* an expected error for the summary; NaN where a width was not measured */
static const char *fmt_error(char *buf, size_t n, double e)
{
	if (isnan(e))
		snprintf(buf, n, "unknown (widths not measured)");
	else
		snprintf(buf, n, "%.6g", e);
	return buf;
}


/* ---- the bytes of the pack (--model): pack.h x3_pack_size ------------- */

struct szctx {
	x3_pack_sizer *sz;
	const x3_module *mods;
	int nmods;
	int *idx;                /* module of each ba tensor */
	int *K;                  /* per module */
};

/* x3_ba_size_fn: the whole pack's bytes for the plan in ba */
static int size_fn(void *c, const x3_ba *ba, uint64_t *bytes)
{
	struct szctx *x = c;
	for (int j = 0; j < x->nmods; j++)
		x->K[j] = 0;
	for (int i = 0; i < ba->n; i++)
		x->K[x->idx[i]] = ba->t[i].K;
	x3_pack_size_info info;
	int rc = x3_pack_size(x->sz, x->K, &info);
	if (!rc)
		*bytes = info.total;
	return rc;
}

static int is_decoder_linear(const x3_module *m)
{
	return m->d->kind == X3_KIND_LINEAR && m->d->role != X3_ROLE_HEAD && m->d->role != X3_ROLE_MTP &&
	       m->d->role != X3_ROLE_VISION;
}

/* Tie the measured tensors to SRC's modules: each must be one of its
 * decoder linears, and every decoder linear must be measured; sets each
 * tensor's cost to its trellis bytes per bit. */
static void bind_model(x3_ba *ba, struct szctx *x, const char *model)
{
	x->mods = x3_pack_sizer_modules(x->sz, &x->nmods);
	x->idx = calloc((size_t)ba->n + 1, sizeof *x->idx);
	x->K = calloc((size_t)x->nmods + 1, sizeof *x->K);
	char *measured = calloc((size_t)x->nmods + 1, 1);
	x3_modix *ix = NULL;
	if (!x->idx || !x->K || !measured || x3_modix_build(x->mods, x->nmods, &ix))
		die("out of memory");
	for (int i = 0; i < ba->n; i++) {
		const x3_module *m = x3_modix_find(ix, ba->t[i].name);
		if (m && m->d->role == X3_ROLE_MTP)
			die("tensor '%s': a linear of %s's multi-token prediction layer (at --mtp-bits, outside "
			    "the allocation)", ba->t[i].name, model);
		if (m && m->d->role == X3_ROLE_VISION)
			die("tensor '%s': a linear of %s's vision tower (at --vision-bits, outside the allocation)",
			    ba->t[i].name, model);
		if (!m || !is_decoder_linear(m))
			die("tensor '%s': not a decoder linear of %s", ba->t[i].name, model);
		if (m->in * m->out != ba->t[i].numel)
			die("tensor '%s': numel %lld, but %s says %lldx%lld", ba->t[i].name,
			    (long long)ba->t[i].numel, model, (long long)m->out, (long long)m->in);
		x->idx[i] = (int)(m - x->mods);
		measured[x->idx[i]] = 1;
		ba->t[i].cost = x3_pack_trellis_bytes_per_bit(m);
	}
	for (int j = 0; j < x->nmods; j++)
		if (is_decoder_linear(&x->mods[j]) && !measured[j])
			die("linear '%s' of %s has no measurement", x->mods[j].key, model);
	x3_modix_free(ix);
	free(measured);
}

/* a byte count for people: "12.0 GiB", "640 KiB" */
static const char *human(char *buf, size_t n, uint64_t b)
{
	static const char *const u[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)b;
	int i = 0;
	while (v >= 1024 && i < 4) {
		v /= 1024;
		i++;
	}
	snprintf(buf, n, i ? "%.4g %s" : "%.0f %s", v, u[i]);
	return buf;
}

/* Free tensors (not --set) of ba at K, the set ones at theirs: bytes. */
static uint64_t bytes_at(x3_ba *ba, struct szctx *x, int K)
{
	for (int i = 0; i < ba->n; i++)
		ba->t[i].K = ba->t[i].fixed ? ba->t[i].lo : K;
	uint64_t b;
	if (size_fn(x, ba, &b))
		die("%s", x3_errmsg());
	return b;
}

struct ratio { double r; int64_t n, c; };
static int ratio_cmp(const void *a, const void *b)
{
	const struct ratio *x = a, *y = b;
	return x->r < y->r ? -1 : x->r > y->r;
}

/* --predict: the byte model of SRC for a bits or size target, before any
 * measurement. ba holds every decoder linear (all K allowed, --set fixes
 * applied). */
static void predict_main(x3_ba *ba, struct szctx *x, const char *model, double bits, uint64_t size,
                         int head_bits, const char *codebook, uint64_t shard_bytes)
{
	char h1[32], h2[32];
	int64_t N = 0, nf = 0, cf = 0, nset = 0;   /* numel; free numel, cost; set numel-bits */
	for (int i = 0; i < ba->n; i++) {
		x3_ba_tensor *t = &ba->t[i];
		N += t->numel;
		if (t->fixed) {
			nset += t->numel * t->lo;
		} else {
			nf += t->numel;
			cf += t->cost;
		}
	}
	uint64_t lo = bytes_at(ba, x, 1), hi = bytes_at(ba, x, X3_BA_KMAX);
	/* the pack less the free tensors' trellises: what no plan changes */
	int64_t fixed = (int64_t)lo - cf;
	double k, pbits;
	uint64_t pred, plo, phi;
	if (size) {
		if (size < lo)
			usage_error(usage, "--size %llu bytes (%s) is below the smallest plan: %llu bytes (%s), "
			            "every decoder linear at 1 bit, the head at %d", (unsigned long long)size,
			            human(h1, sizeof h1, size), (unsigned long long)lo, human(h2, sizeof h2, lo), head_bits);
		if (size > hi)
			usage_error(usage, "--size %llu bytes (%s) is above the largest plan: %llu bytes (%s), "
			            "every decoder linear at 8 bits (use --bits 8)", (unsigned long long)size,
			            human(h1, sizeof h1, size), (unsigned long long)hi, human(h2, sizeof h2, hi));
		k = cf ? (double)((int64_t)size - fixed) / (double)cf : X3_BA_KMAX;
		if (k > X3_BA_KMAX)
			k = X3_BA_KMAX;
		pbits = ((double)nset + k * (double)nf) / (double)N;
		plo = bytes_at(ba, x, (int)floor(k));
		pred = phi = size;
	} else {
		/* a bits target: the free tensors at floor(B), and the numel-bits
		 * left promote some to ceil(B); which ones the measurements decide,
		 * so the size lies between the promotions of the tensors with the
		 * fewest and the most stored bytes per weight */
		int kf = (int)floor(bits), kc = (int)ceil(bits);
		int64_t extra = (int64_t)floor(bits * (double)N) - nset - nf * kf;
		if (extra < 0 || kc == kf)
			extra = 0;
		if (extra > nf)
			extra = nf;
		uint64_t base = bytes_at(ba, x, kf);
		struct ratio *r = calloc((size_t)ba->n + 1, sizeof *r);
		int nr = 0;
		if (!r)
			die("out of memory");
		for (int i = 0; i < ba->n; i++)
			if (!ba->t[i].fixed)
				r[nr++] = (struct ratio){ (double)ba->t[i].cost / (double)ba->t[i].numel,
				                          ba->t[i].numel, ba->t[i].cost };
		qsort(r, (size_t)nr, sizeof *r, ratio_cmp);
		double blo = 0, bhi = 0, left = (double)extra;
		for (int i = 0; i < nr && left > 0; i++) {
			double take = left < (double)r[i].n ? left : (double)r[i].n;
			blo += take * r[i].r;
			left -= take;
		}
		left = (double)extra;
		for (int i = nr - 1; i >= 0 && left > 0; i--) {
			double take = left < (double)r[i].n ? left : (double)r[i].n;
			bhi += take * r[i].r;
			left -= take;
		}
		free(r);
		plo = base + (uint64_t)floor(blo);
		phi = base + (uint64_t)ceil(bhi);
		pred = base + (uint64_t)llround(nf ? (double)extra * (double)cf / (double)nf : 0);
		k = bits;
		pbits = bits;
	}
	/* the encodes: every decoder linear at each K (the stored tensors of
	 * one linear: trellis, suh, svh, marker, bias; frame headers not
	 * counted), and the head at head_bits */
	x3_jw w = X3_JW_INIT;
	json_t *o = json_object(), *eb = json_object(), *meas = json_array(), *tgt = json_object();
	for (int K = 1; K <= X3_BA_KMAX; K++) {
		int64_t b = 0;
		for (int i = 0; i < ba->n; i++) {
			const x3_module *m = &x->mods[x->idx[i]];
			b += ba->t[i].cost * K + 2 * (x3_pack_pad128(m->in) + x3_pack_pad128(m->out)) + 4 +
			     (m->bias ? 2 * x3_pack_pad128(m->out) : 0);
		}
		char key[4];
		snprintf(key, sizeof key, "%d", K);
		x3_jw_set(&w, eb, key, json_integer(b));
	}
	int64_t head_enc = 0;
	for (int j = 0; j < x->nmods; j++) {
		const x3_module *m = &x->mods[j];
		if (m->d->kind == X3_KIND_LINEAR && m->d->role == X3_ROLE_HEAD && head_bits != 16)
			head_enc = x3_pack_trellis_bytes_per_bit(m) * head_bits +
			           2 * (x3_pack_pad128(m->in) + x3_pack_pad128(m->out)) + 4;
	}
	int kl = (int)floor(k), kh = (int)ceil(k);
	if (kl < 1)
		kl = 1;
	x3_jw_append(&w, meas, "measure", json_integer(kl));
	if (kh > kl)
		x3_jw_append(&w, meas, "measure", json_integer(kh));
	if (size)
		x3_jw_set(&w, tgt, "size", json_integer((json_int_t)size));
	else
		x3_jw_set(&w, tgt, "bits", json_real(bits));
	x3_jw_set_str(&w, o, "model", model);
	x3_jw_set(&w, o, "target", tgt);
	x3_jw_set(&w, o, "head_bits", json_integer(head_bits));
	x3_jw_set_str(&w, o, "codebook", codebook);
	x3_jw_set(&w, o, "decoder_linears", json_integer(ba->n));
	x3_jw_set(&w, o, "numel", json_integer(N));
	x3_jw_set(&w, o, "size_min", json_integer((json_int_t)lo));
	x3_jw_set(&w, o, "size_max", json_integer((json_int_t)hi));
	x3_jw_set(&w, o, "fixed_bytes", json_integer(fixed));
	x3_jw_set(&w, o, "trellis_bytes_per_bit", json_integer(cf));
	x3_jw_set(&w, o, "k", json_real(k));
	x3_jw_set(&w, o, "bits", json_real(pbits));
	x3_jw_set(&w, o, "measure", meas);
	x3_jw_set(&w, o, "bytes", json_integer((json_int_t)pred));
	x3_jw_set(&w, o, "bytes_lo", json_integer((json_int_t)plo));
	x3_jw_set(&w, o, "bytes_hi", json_integer((json_int_t)phi));
	x3_jw_set(&w, o, "encode_bytes", eb);
	x3_jw_set(&w, o, "head_encode_bytes", json_integer(head_enc));
	x3_jw_set(&w, o, "shard_bytes", json_integer((json_int_t)shard_bytes));
	char *js = x3_jw_dump(&w, o, JSON_COMPACT | JSON_REAL_PRECISION(10), "--predict", NULL);
	json_decref(o);
	if (!js)
		die_x3("--predict");
	puts(js);
	free(js);
	check_stdout();
}

/* the command line */
struct set_fix { char *re; long K; };   /* --set REGEX=K */
struct opts {
	double bits;              /* --bits, NaN when not given */
	long head_bits, mtp_bits, vision_bits;
	int hq, hq_n, exl3, method;
	const char *imp, *out, *model, *codebook;
	uint64_t size, shard_bytes;
	long cal_rows, cal_cols;
	int predict, lines, shard_given;
	json_t *mj;               /* --measurement */
	char *mtext;              /* its text, as pack-write writes it back */
	char **sets;              /* the --set arguments */
	int nset;
	struct set_fix *set;      /* parsed by parse_sets */
};

/* the options into o (exits on a bad one, and after --help) */
static void parse_options(int argc, char **argv, struct opts *o)
{
	enum { O_BITS = 256, O_HEAD, O_MTP, O_HQ, O_SHARD, O_SET, O_IMP, O_STRAT, O_METHOD, O_SIZE, O_MODEL, O_CB,
	       O_CR, O_CC, O_PREDICT, O_MEAS, O_LINES, O_VB };
	static const struct option lo[] = {
		{"bits", required_argument, 0, O_BITS},
		{"head-bits", required_argument, 0, O_HEAD},
		{"mtp-bits", required_argument, 0, O_MTP},
		{"vision-bits", required_argument, 0, O_VB},
		{"hq", optional_argument, 0, O_HQ},
		{"shard-size", required_argument, 0, O_SHARD},
		{"set", required_argument, 0, O_SET},
		{"importance", required_argument, 0, O_IMP},
		{"strategy", required_argument, 0, O_STRAT},
		{"method", required_argument, 0, O_METHOD},
		{"size", required_argument, 0, O_SIZE},
		{"model", required_argument, 0, O_MODEL},
		{"codebook", required_argument, 0, O_CB},
		{"cal-rows", required_argument, 0, O_CR},
		{"cal-cols", required_argument, 0, O_CC},
		{"predict", no_argument, 0, O_PREDICT},
		{"measurement", required_argument, 0, O_MEAS},
		{"lines", no_argument, 0, O_LINES},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	*o = (struct opts){
		.bits = NAN, .head_bits = 6, .mtp_bits = 4, .vision_bits = 16, .method = X3_BA_AUTO, .codebook = "mul1",
		.shard_bytes = (uint64_t)X3_PACK_SHARD_MB << 20, .cal_rows = 250, .cal_cols = 2048,
	};
	if (!(o->sets = calloc((size_t)argc, sizeof *o->sets)))
		die("out of memory");
	int c;
	while ((c = getopt_long(argc, argv, "ho:q", lo, NULL)) != -1) {
		switch (c) {
		case 'h': help(); exit(0);
		case 'o': o->out = optarg; break;
		case 'q': quiet = 1; break;
		case O_BITS: o->bits = parse_double(usage, "--bits", optarg, 1, 8); break;
		case O_MTP:
			o->mtp_bits = parse_long(usage, "--mtp-bits", optarg, 1, 8);
			break;
		case O_VB:
			o->vision_bits = parse_long(usage, "--vision-bits", optarg, 1, 16);
			if (o->vision_bits > 8 && o->vision_bits != 16)
				usage_error(usage, "--vision-bits: %ld is not 1..8 or 16", o->vision_bits);
			break;
		case O_HEAD:
			o->head_bits = parse_long(usage, "--head-bits", optarg, 1, 16);
			if (o->head_bits > 8 && o->head_bits != 16)
				usage_error(usage, "--head-bits: %ld is not 1..8 or 16", o->head_bits);
			break;
		case O_HQ:
			o->hq = 1;
			/* N: --hq=N, or the next argument when it is a number */
			if (!optarg && optind < argc && argv[optind][0] >= '0' && argv[optind][0] <= '9' &&
			    strspn(argv[optind], "0123456789") == strlen(argv[optind]))
				optarg = argv[optind++];
			if (optarg)
				o->hq_n = (int)parse_long(usage, "--hq", optarg, 1, 8);
			break;
		case O_SHARD: o->shard_bytes = parse_size(usage, "--shard-size", optarg); o->shard_given = 1; break;
		case O_SET: o->sets[o->nset++] = optarg; break;
		case O_IMP: o->imp = optarg; break;
		case O_STRAT:
			if (!strcmp(optarg, "exllamav3")) o->exl3 = 1;
			else if (!strcmp(optarg, "optimal")) o->exl3 = 0;
			else usage_error(usage, "--strategy: '%s' is not optimal or exllamav3", optarg);
			break;
		case O_METHOD:
			if (!strcmp(optarg, "auto")) o->method = X3_BA_AUTO;
			else if (!strcmp(optarg, "dp")) o->method = X3_BA_DP;
			else if (!strcmp(optarg, "lagrangian")) o->method = X3_BA_LAGRANGE;
			else usage_error(usage, "--method: '%s' is not auto, dp or lagrangian", optarg);
			break;
		case O_SIZE: o->size = parse_size(usage, "--size", optarg); break;
		case O_MODEL: o->model = optarg; break;
		case O_CB:
			if (strcmp(optarg, "mul1") && strcmp(optarg, "mcg") && strcmp(optarg, "3inst"))
				usage_error(usage, "--codebook: '%s' is not mul1, mcg or 3inst", optarg);
			o->codebook = optarg;
			break;
		case O_CR: o->cal_rows = parse_long(usage, "--cal-rows", optarg, 0, 1L << 30); break;
		case O_CC: o->cal_cols = parse_long(usage, "--cal-cols", optarg, 0, 1L << 30); break;
		case O_PREDICT: o->predict = 1; break;
		case O_MEAS:
			json_decref(o->mj);
			o->mj = json_loads(optarg, 0, NULL);
			if (!json_is_object(o->mj))
				usage_error(usage, "--measurement: '%s' is not a JSON object", optarg);
			free(o->mtext);
			/* as pack-write writes it back (x3_pack_plan_parse) */
			if (!(o->mtext = json_dumps(o->mj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15))))
				die("out of memory");
			break;
		case O_LINES: o->lines = 1; break;
		default: usage_error(usage, "bad option");
		}
	}
}

/* the options that exclude or need each other (usage errors) */
static void check_options(const struct opts *o, int nfiles)
{
	if (isnan(o->bits) == !o->size)
		usage_error(usage, o->size ? "--bits and --size exclude each other" : "--bits or --size is required");
	if ((o->size || o->predict) && !o->model)
		usage_error(usage, "%s needs --model SRC", o->predict ? "--predict" : "--size");
	if (o->size && o->exl3)
		usage_error(usage, "--strategy exllamav3 plans a bits target, not a --size");
	if (o->size && o->hq)
		usage_error(usage, "--hq floors follow a bits target; with --size use --set");
	if (o->shard_given && !o->model)
		usage_error(usage, "--shard-size counts the pack of --model SRC: give --model");
	if (o->predict && (nfiles || o->imp))
		usage_error(usage, "--predict reads no measurements");
}

/* each --set REGEX=K into o->set; a bad REGEX is a usage error, found
 * before any input is read */
static void parse_sets(struct opts *o)
{
	if (!(o->set = calloc((size_t)(o->nset ? o->nset : 1), sizeof *o->set)))
		die("out of memory");
	for (int i = 0; i < o->nset; i++) {
		char *eq = strrchr(o->sets[i], '=');
		if (!eq || eq == o->sets[i])
			usage_error(usage, "--set: '%s' is not REGEX=K", o->sets[i]);
		*eq = 0;
		o->set[i].re = o->sets[i];
		o->set[i].K = parse_long(usage, "--set", eq + 1, 1, 8);
		int ec;
		PCRE2_SIZE eo;
		pcre2_code *re = pcre2_compile((PCRE2_SPTR)o->set[i].re, PCRE2_ZERO_TERMINATED, 0, &ec, &eo, NULL);
		if (!re) {
			PCRE2_UCHAR msg[256];
			pcre2_get_error_message(ec, msg, sizeof msg);
			usage_error(usage, "--set: regex '%s': %s at offset %zu", o->set[i].re, (char *)msg, (size_t)eo);
		}
		pcre2_code_free(re);
	}
}

/* The tensors to plan into ba: with --model its sizer opened into sx
 * (roles and --hq from the model's own table), with --predict every
 * decoder linear at every K, else the measurements of the FILEs (stdin
 * without any) and --importance; then tied to the model's modules. */
static void load_tensors(x3_ba *ba, struct szctx *sx, const struct opts *o, char **files, int nfiles)
{
	if (o->model) {
		x3_pack_size_opts so = {
			.head_bits = (int)o->head_bits, .mtp_bits = (int)o->mtp_bits,
			.vision_bits = o->vision_bits == 16 ? 0 : (int)o->vision_bits, .codebook = o->codebook,
			.cal_rows = (int)o->cal_rows,
			.cal_cols = (int)o->cal_cols, .shard_bytes = o->shard_bytes,
			.measurement = o->mtext,
		};
		if (x3_pack_sizer_open(o->model, &so, &sx->sz))
			die("%s", x3_errmsg());
		int nm;
		const x3_module *mods = x3_pack_sizer_modules(sx->sz, &nm);
		x3_ba_set_modules(ba, mods, nm);
	}
	if (o->predict) {
		/* every decoder linear, every K allowed: the --set fixes apply */
		int nm;
		const x3_module *mods = x3_pack_sizer_modules(sx->sz, &nm);
		for (int j = 0; j < nm; j++)
			for (int K = 1; K <= X3_BA_KMAX && is_decoder_linear(&mods[j]); K++)
				if (x3_ba_add(ba, mods[j].key, K, 0, mods[j].in * mods[j].out))
					die("%s", x3_errmsg());
	} else {
		if (nfiles == 0)
			read_file(ba, "-", 0);
		for (int i = 0; i < nfiles; i++)
			read_file(ba, files[i], 0);
		if (o->imp)
			read_file(ba, o->imp, 1);
	}
	if (o->model)
		bind_model(ba, sx, o->model);
}

/* the --set fixes on fresh limits (they apply to both strategies) */
static void apply_sets(x3_ba *ba, const struct opts *o)
{
	x3_ba_reset_limits(ba);
	for (int i = 0; i < o->nset; i++) {
		int nm;
		if (x3_ba_set_fixed(ba, o->set[i].re, (int)o->set[i].K, &nm))
			die("--set: %s", x3_errmsg());
	}
}

/* The plan into ba: for a bits target with the optimal strategy the
 * ExLlamaV3 plan first, for comparison; then the plan of the strategy
 * asked for (with --model its bytes too). The bits target, or the one a
 * --size solve found, into *bits. */
static void solve(x3_ba *ba, struct szctx *sx, const struct opts *o, double *bits)
{
	if (!o->exl3 && !o->size) {
		apply_sets(ba, o);
		if (x3_ba_solve(ba, *bits, X3_BA_EXL3, o->hq) == X3_OK) {
			ba->has_exl3 = 1;
			ba->exl3_error = x3_ba_error(ba);
			ba->exl3_bits = x3_ba_bits(ba);
		}
	}
	apply_sets(ba, o);
	if (o->size) {
		if (x3_ba_solve_size(ba, o->size, o->method, size_fn, sx))
			die("%s", x3_errmsg());
		*bits = ba->target;
	} else {
		if (x3_ba_solve(ba, *bits, o->exl3 ? X3_BA_EXL3 : o->method, o->hq))
			die("%s", x3_errmsg());
		/* with the model, the plan's bytes too */
		if (o->model && size_fn(sx, ba, &ba->size_bytes))
			die("%s", x3_errmsg());
	}
}

/* The plan's JSON (with --measurement's object and the measurements'
 * work added) to -o PLAN, atomically, or stdout. */
static void write_plan(x3_ba *ba, const struct opts *o)
{
	char *js = x3_ba_plan_json(ba);
	if (!js)
		die_x3("plan");
	if (o->mj) {
		x3_jw w = X3_JW_INIT;
		json_t *po = json_loads(js, 0, NULL);
		x3_jw_set(&w, po, "measurement", json_incref(o->mj));
		x3_jw_set(&w, po, "measurement_work",
		          json_pack("{sosos{sIsI}}", "strips", work.any ? json_integer(work.strips) : json_null(),
		                    "strips_total", work.any ? json_integer(work.total) : json_null(),
		                    "viterbi_tiles", "search", work.search, "ldlq", work.ldlq));
		free(js);
		js = x3_jw_dump(&w, po, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10), "plan", NULL);
		json_decref(po);
		if (!js)
			die_x3("plan");
	}
	if (o->out) {
		size_t n = strlen(js);
		js[n] = '\n';
		if (x3_write_file_atomic(o->out, js, n + 1))
			die_x3("%s", o->out);
		js[n] = 0;
	} else {
		puts(js);
		check_stdout();
	}
	free(js);
}

/* The summary on stderr: the plan's bits (got) and K histogram, its
 * expected error beside the uniform plan's and the ExLlamaV3 plan's, the
 * bits by role, the tied groups. */
static void summary(x3_ba *ba, const struct opts *o, double bits, double got)
{
	char h[256];
	size_t n = 0;
	int cnt[X3_BA_KMAX + 1] = {0};
	for (int i = 0; i < ba->n; i++)
		cnt[ba->t[i].K]++;
	h[0] = 0;
	for (int K = 1; K <= X3_BA_KMAX; K++)
		if (cnt[K])
			n += (size_t)snprintf(h + n, sizeof h - n, " %d:%d", K, cnt[K]);
	int ku = (int)floor(bits);
	if (o->size) {
		char h1[32], h2[32];
		fprintf(stderr, "%s: optimal (%s): %.4f bpw for a pack of %llu bytes (%s; size %llu, %s) "
		        "over %d tensors, head %d bits; K histogram%s\n", progname, ba->method, got,
		        (unsigned long long)ba->size_bytes, human(h1, sizeof h1, ba->size_bytes),
		        (unsigned long long)o->size, human(h2, sizeof h2, o->size), ba->n, ba->head_bits, h);
	} else {
		fprintf(stderr, "%s: %s (%s): %.4f bpw (target %g) over %d tensors, head %d bits; "
		        "K histogram%s\n", progname, o->exl3 ? "exllamav3" : "optimal", ba->method,
		        got, bits, ba->n, ba->head_bits, h);
	}
	/* NaN: the plan uses a width that was not measured */
	char e[64], eu[64], ex[64];
	fmt_error(e, sizeof e, x3_ba_error(ba));
	fmt_error(eu, sizeof eu, x3_ba_uniform_error(ba, ku));
	fprintf(stderr, "%s: expected error %s; uniform K=%d: %s", progname, e, ku, eu);
	if (ba->has_exl3)
		fprintf(stderr, "; exllamav3 strategy: %s at %.4f bpw",
		        fmt_error(ex, sizeof ex, ba->exl3_error), ba->exl3_bits);
	fprintf(stderr, "\n");
	/* the averages model cards give: attention, dense MLP, experts,
	 * shared experts, head */
	int rl[X3_ROLE_COUNT];
	int64_t rn[X3_ROLE_COUNT];
	double rb[X3_ROLE_COUNT];
	x3_ba_role_bits(ba, X3_ROLE_COUNT, rl, rn, rb);
	fprintf(stderr, "%s: bits by role:", progname);
	for (int r = 0, first = 1; r < X3_ROLE_COUNT; r++)
		if (rl[r]) {
			fprintf(stderr, "%s %s %.3f (%d linears)", first ? "" : ",", x3_role_name(r), rb[r], rl[r]);
			first = 0;
		}
	fprintf(stderr, "\n");
	int tg = x3_ba_tied_groups(ba);
	if (tg > 0)
		fprintf(stderr, "%s: %d tied groups (linears a reader loads as one: one K each)\n",
		        progname, tg);
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	struct opts o;
	parse_options(argc, argv, &o);
	if (o.lines) {
		if (optind == argc)
			usage_error(usage, "--lines needs FILEs");
		for (int i = optind; i < argc; i++)
			lines_of(argv[i]);
		check_stdout();
		return 0;
	}
	check_options(&o, argc - optind);
	parse_sets(&o);

	x3_ba *ba = x3_ba_create();
	if (!ba)
		die_x3("init");
	ba->head_bits = (int)o.head_bits;
	ba->hq_bits = o.hq_n;
	struct szctx sx = {0};
	load_tensors(ba, &sx, &o, argv + optind, argc - optind);
	if (o.predict) {
		apply_sets(ba, &o);
		predict_main(ba, &sx, o.model, o.bits, o.size, (int)o.head_bits, o.codebook, o.shard_bytes);
		x3_pack_sizer_close(sx.sz);
		x3_ba_free(ba);
		return 0;
	}
	double bits = o.bits;
	solve(ba, &sx, &o, &bits);
	double got = x3_ba_bits(ba);
	if (o.exl3 && got > bits)
		warnx("warning: the exllamav3 plan (%.4f bits) exceeds the target %g (--hq floors)", got, bits);
	else if (o.exl3 && isnan(x3_ba_error(ba)))
		warnx("warning: the exllamav3 plan uses widths that were not measured; expected_error is null");
	write_plan(ba, &o);
	if (!quiet)
		summary(ba, &o, bits, got);
	x3_ba_free(ba);
	x3_pack_sizer_close(sx.sz);
	free(sx.idx);
	free(sx.K);
	free(o.set);
	free(o.sets);
	return 0;
}
