/* tensor-gen: seeded test tensors as frames, the same on every machine. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <sys/stat.h>
#include <cblas.h>
#include "frame.h"
#include "util.h"

static const char usage[] =
	"usage: tensor-gen [-d DIST] [-t DTYPE] [-s SEED] [--scale S] [--mean M] [--df N]\n"
	"                  [--value V] [--meta KEY=VAL]... [-o FILE] [--zstd[=LEVEL]] NAME=SHAPE...\n";

static const char help[] =
	"Seeded test tensors, identical on every machine, as frames; SHAPE is\n"
	"DxDx... (or D,D,...; empty for a scalar).\n"
	"\n"
	"  -d DIST        normal (default), uniform, student-t, constant, arange, spd\n"
	"                 (a symmetric positive definite NxN stand-in Hessian)\n"
	"  -t DTYPE       element type (default F32)\n"
	"  -s SEED        seed (default 0), stored as metadata 'seed'\n"
	"  --scale S      scale of the distribution (default 1)\n"
	"  --mean M       offset added to every element (default 0)\n"
	"  --df N         degrees of freedom of student-t (default 5)\n"
	"  --value V      the value of constant (default 0; nan, inf allowed)\n"
	"  --meta KEY=VAL add metadata to every frame (repeatable; UTF-8)\n"
	"  -o FILE        write FILE atomically instead of stdout\n"
	"  --zstd[=LEVEL] compress the output (level 1..22, default 3)\n"
	"  -h             this help\n";

enum dist { D_NORMAL, D_UNIFORM, D_T, D_CONST, D_ARANGE, D_SPD };

static int parse_shape(const char *s, int64_t *shape, int *rank)
{
	*rank = 0;
	if (!strcmp(s, "") || !strcmp(s, "scalar"))
		return 0;
	while (*s) {
		char *end;
		errno = 0;
		if (*s < '0' || *s > '9')   /* strtoll would skip spaces and take signs */
			return -1;
		long long v = strtoll(s, &end, 10);
		if (errno || end == s || v < 0 || *rank == X3_MAX_RANK)
			return -1;
		shape[(*rank)++] = v;
		if ((*end == 'x' || *end == ',') && end[1])   /* "256x" is a typo, not a 1-D shape */
			end++;
		else if (*end)
			return -1;
		s = end;
	}
	return 0;
}

static void store(void *data, x3_dtype t, size_t i, double v)
{
	unsigned char *p = (unsigned char *)data + i * x3_dtype_size(t);
	float f = (float)v;
	uint16_t h;
	long long q = llround(v);
	switch (t) {
	case X3_F64: memcpy(p, &v, 8); break;
	case X3_F32: memcpy(p, &f, 4); break;
	case X3_F16: h = x3_f32_to_f16(f); memcpy(p, &h, 2); break;
	case X3_BF16: h = x3_f32_to_bf16(f); memcpy(p, &h, 2); break;
#define INT(T, lo, hi) { T x = (T)(q < (lo) ? (lo) : q > (hi) ? (hi) : q); memcpy(p, &x, sizeof x); } break;
	case X3_I64: INT(int64_t, INT64_MIN, INT64_MAX)
	case X3_I32: INT(int32_t, INT32_MIN, INT32_MAX)
	case X3_I16: INT(int16_t, INT16_MIN, INT16_MAX)
	case X3_I8: INT(int8_t, INT8_MIN, INT8_MAX)
	case X3_U64: INT(uint64_t, 0, INT64_MAX)
	case X3_U32: INT(uint32_t, 0, UINT32_MAX)
	case X3_U16: INT(uint16_t, 0, UINT16_MAX)
	case X3_U8: INT(uint8_t, 0, UINT8_MAX)
	case X3_BOOL: *p = v != 0; break;
#undef INT
	default: break;
	}
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	enum dist d = D_NORMAL;
	x3_dtype dt = X3_F32;
	long long seed = 0;
	double scale = 1, mean = 0, df = 5, value = 0;
	const char *outp = NULL;
	int zlevel = 0;
	char **metas = calloc(argc, sizeof *metas);
	int nmetas = 0;
	enum { O_SCALE = 256, O_MEAN, O_DF, O_VALUE, O_META, O_ZSTD };
	static const struct option lo[] = {
		{"dist", required_argument, 0, 'd'}, {"dtype", required_argument, 0, 't'},
		{"seed", required_argument, 0, 's'}, {"scale", required_argument, 0, O_SCALE},
		{"mean", required_argument, 0, O_MEAN}, {"df", required_argument, 0, O_DF},
		{"value", required_argument, 0, O_VALUE}, {"meta", required_argument, 0, O_META},
		{"output", required_argument, 0, 'o'}, {"zstd", optional_argument, 0, O_ZSTD},
		{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int c;
	while ((c = getopt_long(argc, argv, "d:t:s:o:h", lo, NULL)) != -1) {
		switch (c) {
		case 'd':
			if (!strcmp(optarg, "normal")) d = D_NORMAL;
			else if (!strcmp(optarg, "uniform")) d = D_UNIFORM;
			else if (!strcmp(optarg, "student-t") || !strcmp(optarg, "t")) d = D_T;
			else if (!strcmp(optarg, "constant")) d = D_CONST;
			else if (!strcmp(optarg, "arange")) d = D_ARANGE;
			else if (!strcmp(optarg, "spd")) d = D_SPD;
			else usage_error(usage, "-d: unknown distribution '%s'", optarg);
			break;
		case 't':
			if (x3_dtype_parse(optarg, &dt) || dt == X3_F8_E4M3 || dt == X3_F8_E5M2)
				usage_error(usage, "-t: unsupported dtype '%s'", optarg);
			break;
		case 's': seed = parse_long(usage, "-s", optarg, 0, 0x7fffffffffffffffL); break;
		case O_SCALE: scale = parse_double(usage, "--scale", optarg, -1e30, 1e30); break;
		case O_MEAN: mean = parse_double(usage, "--mean", optarg, -1e30, 1e30); break;
		case O_DF: df = parse_double(usage, "--df", optarg, 1e-3, 1e9); break;
		case O_VALUE:
			value = !strcasecmp(optarg, "nan") ? NAN
			      : parse_double(usage, "--value", optarg, -INFINITY, INFINITY);
			break;
		case O_META:
			meta_arg_check(usage, optarg);
			metas[nmetas++] = optarg;
			break;
		case 'o': outp = optarg; break;
		case O_ZSTD: zlevel = optarg ? (int)parse_long(usage, "--zstd", optarg, 1, 22) : 3; break;
		case 'h': printf("%s\n%s", usage, help); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind >= argc)
		usage_error(usage, "missing NAME=SHAPE");
	for (int a = optind; a < argc; a++) {   /* before anything is written */
		char *eq = strrchr(argv[a], '=');
		if (eq) {
			*eq = 0;
			name_arg_check(usage, argv[a]);
			*eq = '=';
		}
	}
	int fd = output_open(outp);
	x3_writer *w;
	if (x3_writer_open_fd(fd, zlevel, &w))
		die_x3("output");
	for (int a = optind; a < argc; a++) {
		char *eq = strrchr(argv[a], '=');
		int64_t shape[X3_MAX_RANK];
		int rank;
		if (!eq || eq == argv[a] || parse_shape(eq + 1, shape, &rank))
			usage_error(usage, "'%s': expected NAME=SHAPE such as w=256x128", argv[a]);
		*eq = 0;
		if (d == D_SPD && (rank != 2 || shape[0] != shape[1]))
			usage_error(usage, "'%s': -d spd needs a square shape NxN", argv[a]);
		x3_tensor *t = x3_tensor_new(argv[a], dt, rank, shape, 1);
		if (!t)
			die_x3("'%s'", argv[a]);
		x3_rng r;
		x3_rng_seed(&r, (uint64_t)seed, x3_rng_stream_of(argv[a]));
		size_t n = (size_t)x3_tensor_numel(t);
		if (d == D_SPD) {
			/* H = X^T X / m with X (m x n) normal, m = n + 16: SPD with
			 * probability 1, the shape of a real Hessian */
			size_t nn = (size_t)shape[0], m = nn + 16;
			double *X = malloc(m * nn * sizeof *X + 8), *H = calloc(nn * nn + 1, sizeof *H);
			if (!X || !H)
				die("out of memory");
			for (size_t i = 0; i < m * nn; i++)
				X[i] = x3_rng_normal(&r);
			cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)nn, (int)m, scale / m, X, (int)nn, 0, H, (int)nn);
			for (size_t i = 0; i < nn; i++)
				for (size_t j = 0; j < i; j++)
					H[i * nn + j] = H[j * nn + i];
			for (size_t i = 0; i < n; i++)
				store(t->data, dt, i, H[i]);
			free(X);
			free(H);
		} else {
			for (size_t i = 0; i < n; i++) {
				double v;
				switch (d) {
				case D_UNIFORM: v = mean + scale * (2 * x3_rng_uniform(&r) - 1); break;
				case D_T: v = mean + scale * x3_rng_student_t(&r, df); break;
				case D_CONST: v = value; break;
				case D_ARANGE: v = mean + scale * (double)i; break;
				default: v = mean + scale * x3_rng_normal(&r); break;
				}
				store(t->data, dt, i, v);
			}
		}
		if (x3_meta_setf(t, "seed", "%lld", seed))
			die_x3("tensor '%s'", t->name);
		for (int i = 0; i < nmetas; i++) {
			char *e = strchr(metas[i], '=');
			*e = 0;
			if (x3_meta_set(t, metas[i], e + 1))
				die_x3("tensor '%s': --meta %s", t->name, metas[i]);
			*e = '=';
		}
		if (x3_writer_put(w, t))
			die_x3("writing '%s'", t->name);
		x3_tensor_free(t);
	}
	if (x3_writer_close(w))
		die_x3("%s", outp ? outp : "stdout");
	output_commit();
	return 0;
}
