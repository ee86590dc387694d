/* tensor-ls: one JSON line per tensor (name, dtype, shape, bytes, metadata,
 * and with --stats min/max/mean/rms and NaN/Inf counts), for jq. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "frame.h"
#include "safetensors.h"
#include "util.h"

static const char usage[] = "usage: tensor-ls [--stats] [SOURCE...]\n";

static const char help[] =
	"One JSON line per tensor of each SOURCE (a frame stream, \"-\" for stdin, a\n"
	"safetensors file or a model directory): name, dtype, shape, bytes, metadata.\n"
	"\n"
	"  --stats      add min, max, mean, rms over the finite elements and the\n"
	"               NaN/Inf counts (one streaming pass in F32)\n"
	"  -h           this help\n";
static int stats;

struct acc { double min, max, sum, sq; int64_t n, nan, inf; };

static void acc_add(struct acc *a, const float *f, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float v = f[i];
		if (isnan(v)) { a->nan++; continue; }
		if (isinf(v)) { a->inf++; continue; }
		if (!a->n || v < a->min) a->min = v;
		if (!a->n || v > a->max) a->max = v;
		a->sum += v;
		a->sq += (double)v * v;
		a->n++;
	}
}

static void print_line(const x3_tensor *t, const char *src, const struct acc *a)
{
	json_t *o = json_object(), *sh = json_array(), *m = json_object();
	json_object_set_new(o, "name", json_string(t->name));
	json_object_set_new(o, "dtype", json_string(x3_dtype_name(t->dtype)));
	for (int i = 0; i < t->rank; i++)
		json_array_append_new(sh, json_integer(t->shape[i]));
	json_object_set_new(o, "shape", sh);
	json_object_set_new(o, "bytes", json_integer((json_int_t)t->nbytes));
	for (int i = 0; i < t->nmeta; i++)
		json_object_set_new(m, t->meta[i].key, json_string(t->meta[i].val));
	json_object_set_new(o, "meta", m);
	json_object_set_new(o, "source", json_string(src));
	if (a) {
		json_t *s = json_object();
		json_object_set_new(s, "count", json_integer(a->n + a->nan + a->inf));
		json_object_set_new(s, "min", a->n ? json_real(a->min) : json_null());
		json_object_set_new(s, "max", a->n ? json_real(a->max) : json_null());
		json_object_set_new(s, "mean", a->n ? json_real(a->sum / a->n) : json_null());
		json_object_set_new(s, "rms", a->n ? json_real(sqrt(a->sq / a->n)) : json_null());
		json_object_set_new(s, "nan", json_integer(a->nan));
		json_object_set_new(s, "inf", json_integer(a->inf));
		json_object_set_new(o, "stats", s);
	}
	char *txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
	json_decref(o);
	if (!txt)
		die("cannot encode the line for '%s'", t->name);
	puts(txt);
	free(txt);
}

#define CH (1u << 16)

static void ls_frames(const char *path)
{
	x3_reader *r;
	if (x3_reader_open(path, &r))
		die("%s", x3_errmsg());
	unsigned char *raw = malloc(CH * 8);
	float *f = malloc(CH * sizeof *f);
	for (;;) {
		x3_tensor *t;
		int rc = x3_reader_next_header(r, &t);
		if (rc == X3_EOF)
			break;
		if (rc)
			die("%s", x3_errmsg());
		struct acc a = {0};
		size_t es = x3_dtype_size(t->dtype), n = (size_t)x3_tensor_numel(t);
		for (size_t i = 0; i < n; i += CH) {
			size_t k = n - i < CH ? n - i : CH;
			if (!stats)
				break;
			if (x3_reader_data(r, raw, k * es))
				die("%s", x3_errmsg());
			x3_convert(f, X3_F32, raw, t->dtype, k);
			acc_add(&a, f, k);
		}
		if (x3_reader_skip(r))   /* verifies the checksum without --stats too */
			die("%s", x3_errmsg());
		print_line(t, path, stats ? &a : NULL);
		x3_tensor_free(t);
	}
	free(raw);
	free(f);
	x3_reader_close(r);
}

static void ls_st(const char *path)
{
	x3_st *s;
	if (x3_st_open(path, &s))
		die("%s", x3_errmsg());
	float *f = malloc(CH * sizeof *f);
	for (int i = 0; i < x3_st_count(s); i++) {
		const x3_tensor *t = x3_st_get(s, i);
		struct acc a = {0};
		size_t es = x3_dtype_size(t->dtype), n = (size_t)x3_tensor_numel(t);
		for (size_t j = 0; stats && j < n; j += CH) {
			size_t k = n - j < CH ? n - j : CH;
			x3_convert(f, X3_F32, (const char *)t->data + j * es, t->dtype, k);
			acc_add(&a, f, k);
		}
		print_line(t, x3_st_file(s, i), stats ? &a : NULL);
	}
	free(f);
	x3_st_close(s);
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	static const struct option lo[] = {{"stats", no_argument, 0, 's'},
		{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int c;
	while ((c = getopt_long(argc, argv, "sh", lo, NULL)) != -1) {
		switch (c) {
		case 's': stats = 1; break;
		case 'h': printf("%s\n%s", usage, help); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	char *dflt[] = {"-"};
	char **srcs = optind < argc ? argv + optind : dflt;
	int ns = optind < argc ? argc - optind : 1;
	for (int i = 0; i < ns; i++) {
		int kind;
		if (x3_source_kind(srcs[i], &kind))
			die("%s", x3_errmsg());
		if (kind == X3_SRC_FRAMES)
			ls_frames(srcs[i]);
		else
			ls_st(srcs[i]);
	}
	check_stdout();
	return 0;
}
