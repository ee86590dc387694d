/* exl3-matmul: Y = X·Wᵀ (+bias) straight from an EXL3-quantized linear
 * (packed trellis, suh, svh), its dense reconstruction (--dequant), or its
 * error against a dense reference weight (--check). See
 * man/exl3-matmul.1. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "arch.h"
#include "codec.h"
#include "exl3.h"
#include "device.h"
#include "frame.h"
#include "model.h"
#include "safetensors.h"
#include "util.h"
#include "util-device.h"

static const char usage[] =
	"usage: exl3-matmul [--model SRC] [--tensor KEY] [-x FILE] [--in N] [--out N]\n"
	"                   [--dequant | --check REF] [--reference] [-t THREADS]\n"
	"                   [--device cpu|cuda|auto] [--out-dtype F32|F16|BF16]\n"
	"                   [--zstd[=LEVEL]] [-q]\n";

static const char help[] =
	"Multiply input frames X (rows x in_features) with an EXL3 linear layer.\n"
	"The layer's tensors (KEY.trellis, KEY.suh, KEY.svh, optional KEY.bias,\n"
	"KEY.mcg or KEY.mul1) come first on stdin as frames, or from --model.\n"
	"  --model SRC       EXL3 model directory, .safetensors file or frame file\n"
	"  --tensor KEY      the layer (default: the first EXL3 group on stdin)\n"
	"  -x FILE           input frames X (default: the frames on stdin after the group)\n"
	"  --in N, --out N   original in/out features (zero-extend X, trim Y)\n"
	"  --dequant         write the dense weight KEY.weight (out x in) instead\n"
	"  --check REF       print JSON error of the dense weight against REF\n"
	"  --reference       plain C reference path (decode W~, then sgemm)\n"
	"  -t THREADS        threads of the fast path (default: all)\n"
	"  --device D        cpu (default), cuda or auto: where the product runs (CUDA:\n"
	"                    fused decode GEMV up to 16 rows, else fp16 GEMM; x rounded\n"
	"                    to fp16, results differ from the CPU's in rounding)\n"
	"  --out-dtype T     dtype of written frames (default F32)\n"
	"  --zstd[=LEVEL]    compress the output stream (default level 3)\n"
	"  -q                quiet\n";

static const char *opt_model, *opt_key, *opt_x, *opt_check;
static long opt_in, opt_out, opt_threads, opt_zstd;
static int opt_dequant, opt_ref, opt_device = X3_DEVICE_CPU;
static const x3_gpu *backend;   /* the GPU backend (--device cuda) */
static x3_gpu_linear *gpu;      /* the layer on the device */
static x3_dtype opt_dtype = X3_F32;

/* Read frames from r until the whole group of one EXL3 key has been read.
 * Frames before the group are skipped; the first frame after it (if any)
 * is returned in *next (NULL at the end of the stream). */
static x3_exl3 *read_group(x3_reader *r, const char *want, x3_tensor **next)
{
	x3_tensor **g = NULL;
	int ng = 0;
	char key[1024] = "", k2[1024];
	*next = NULL;
	for (;;) {
		x3_tensor *t;
		int rc = x3_reader_next_header(r, &t);
		if (rc == X3_EOF)
			break;
		if (rc)
			die("%s", x3_errmsg());
		int part = x3_exl3_is_part(t->name, k2, sizeof k2);
		if (!ng && (!part || (want && strcmp(k2, want)))) {
			/* before the group: skip the payload unread */
			if (x3_reader_skip(r))
				die("%s", x3_errmsg());
			x3_tensor_free(t);
			continue;
		}
		if (x3_reader_load(r, t))
			die("%s", x3_errmsg());
		if (!ng) {
			strcpy(key, k2);
		} else if (!part || strcmp(k2, key)) {
			*next = t;
			break;
		}
		g = realloc(g, (size_t)(ng + 1) * sizeof *g);
		if (!g)
			die("out of memory");
		g[ng++] = t;
	}
	if (!ng) {
		if (want)
			die("%s: no EXL3 tensor '%s' (KEY.trellis, KEY.suh, KEY.svh)",
			    x3_reader_label(r), want);
		die("%s: no EXL3 tensor group (KEY.trellis, KEY.suh, KEY.svh)",
		    x3_reader_label(r));
	}
	x3_exl3 *e;
	if (x3_exl3_from_tensors(key, (const x3_tensor *const *)g, ng, &e))
		die("%s", x3_errmsg());
	x3_tensors_free(g, ng);
	return e;
}

/* Original sizes of a linear from DIR/config.json through the model's
 * description (arch.h; ExLlamaV3 likewise takes them from the config, exl3(5) §1.1):
 * kept only where they round up to the padded sizes. A config the
 * toolkit cannot describe leaves the padded sizes. */
static void sizes_from_config(const char *dir, x3_exl3 *e)
{
	x3_model_config c;
	x3_module *m;
	int n;
	if (x3_config_load_as(dir, X3_CONFIG_LAYOUT, &c) || x3_arch_modules(&c, &m, &n))
		return;
	const x3_module *d = x3_modules_find(m, n, x3_exl3_key(e));
	if (d && d->d->kind == X3_KIND_LINEAR) {
		int64_t k = x3_exl3_k(e), np = x3_exl3_n(e);
		if (d->in > k - 128 && d->in <= k && x3_exl3_in(e) == k)
			x3_exl3_set_orig(e, d->in, 0);
		if (d->out > np - 128 && d->out <= np && x3_exl3_out(e) == np)
			x3_exl3_set_orig(e, 0, d->out);
	}
	free(m);
}

static x3_exl3 *load_model(const char *src, const char *key)
{
	int kind;
	if (x3_source_kind(src, &kind))
		die("%s", x3_errmsg());
	if (kind == X3_SRC_FRAMES) {
		x3_reader *r;
		x3_tensor *next;
		if (x3_reader_open(src, &r))
			die("%s", x3_errmsg());
		x3_exl3 *e = read_group(r, key, &next);
		x3_tensor_free(next);
		x3_reader_close(r);
		return e;
	}
	x3_st *st;
	if (x3_st_open(src, &st))
		die("%s", x3_errmsg());
	x3_exl3 *e;
	if (x3_exl3_from_st(st, key, &e))
		die("%s: %s", src, x3_errmsg());
	x3_st_close(st);
	if (kind == X3_SRC_DIR)
		sizes_from_config(src, e);
	return e;
}

static void put_f32(x3_writer *w, x3_tensor *t, const float *v)
{
	if (x3_convert(t->data, t->dtype, v, X3_F32, (size_t)x3_tensor_numel(t)))
		die_x3("frame '%s'", t->name);
	if (x3_writer_put(w, t))
		die_x3("writing frame '%s'", t->name);
}

static void do_dequant(const x3_exl3 *e, x3_writer *w)
{
	int64_t o = x3_exl3_out(e), i = x3_exl3_in(e);
	char name[1100];
	snprintf(name, sizeof name, "%s.weight", x3_exl3_key(e));
	float *v = malloc((size_t)(o * i) * sizeof *v);
	x3_tensor *t = x3_tensor_new2(name, opt_dtype, o, i);
	if (!v || !t)
		die("'%s': out of memory", name);
	if (x3_exl3_dequant(e, v))
		die("%s", x3_errmsg());
	x3_meta_set(t, "exl3_tensor", x3_exl3_key(e));
	x3_meta_setf(t, "K", "%d", x3_exl3_bits(e));
	x3_meta_set(t, "codebook", x3_codebook_name(x3_exl3_codebook(e)));
	put_f32(w, t, v);
	x3_tensor_free(t);
	free(v);
}

/* The reference weight: KEY.weight if present, else the only tensor. */
static x3_tensor *load_ref(const char *path, const char *key)
{
	int kind;
	char name[1100];
	snprintf(name, sizeof name, "%s.weight", key);
	if (x3_source_kind(path, &kind))
		die("%s", x3_errmsg());
	x3_tensor *ref = NULL;
	if (kind == X3_SRC_FRAMES) {
		x3_tensor **v;
		int n;
		if (x3_read_all(path, &v, &n))
			die("%s", x3_errmsg());
		for (int i = 0; i < n && !ref; i++)
			if (strcmp(v[i]->name, name) == 0 || n == 1)
				ref = x3_tensor_copy(v[i], X3_F32);
		x3_tensors_free(v, n);
	} else {
		x3_st *st;
		if (x3_st_open(path, &st))
			die("%s", x3_errmsg());
		const x3_tensor *t = x3_st_find(st, name);
		if (!t && x3_st_count(st) == 1)
			t = x3_st_get(st, 0);
		if (t)
			ref = x3_tensor_copy(t, X3_F32);
		x3_st_close(st);
	}
	if (!ref)
		die("%s: no tensor '%s' (nor a single tensor)", path, name);
	if (ref->rank != 2)
		die("%s: '%s': reference must be 2-D (out x in)", path, ref->name);
	return ref;
}

static void do_check(x3_exl3 *e, const char *path)
{
	x3_tensor *ref = load_ref(path, x3_exl3_key(e));
	int64_t o = ref->shape[0], i = ref->shape[1];
	if ((opt_out && opt_out != o) || (opt_in && opt_in != i))
		die("%s: '%s': shape %lldx%lld differs from --out/--in", path, ref->name,
		    (long long)o, (long long)i);
	/* a tensor that states its sizes (trellis metadata, the model's
	 * config.json) is not compared with a weight of another shape that
	 * happens to pad to the same size (k_proj against q_proj) */
	int kn = x3_exl3_known(e);
	if (((kn & X3_EXL3_OUT_KNOWN) && o != x3_exl3_out(e)) || ((kn & X3_EXL3_IN_KNOWN) && i != x3_exl3_in(e)))
		die("%s: '%s': shape %lldx%lld, but tensor '%s' is %lldx%lld (out x in)", path, ref->name,
		    (long long)o, (long long)i, x3_exl3_key(e), (long long)x3_exl3_out(e),
		    (long long)x3_exl3_in(e));
	if (x3_exl3_set_orig(e, i, o))
		die("%s: '%s': %s", path, ref->name, x3_errmsg());
	float *w = malloc((size_t)(o * i) * sizeof *w);
	if (!w)
		die("out of memory");
	if (x3_exl3_dequant(e, w))
		die("%s", x3_errmsg());
	const float *r = ref->data;
	double se = 0, sr = 0, mx = 0;
	for (int64_t j = 0; j < o * i; j++) {
		/* a non-finite weight on either side has no error to report */
		if (!isfinite(r[j]))
			die("%s: '%s': non-finite value %g at [%lld][%lld]", path, ref->name, (double)r[j],
			    (long long)(j / i), (long long)(j % i));
		if (!isfinite(w[j]))
			die("tensor '%s': decodes to a non-finite value %g at [%lld][%lld]", x3_exl3_key(e),
			    (double)w[j], (long long)(j / i), (long long)(j % i));
		double d = (double)w[j] - r[j];
		se += d * d;
		sr += (double)r[j] * r[j];
		if (fabs(d) > mx)
			mx = fabs(d);
	}
	double n = (double)(o * i);
	printf("{\"tensor\":\"%s\",\"K\":%d,\"codebook\":\"%s\",\"shape\":[%lld,%lld],"
	       "\"padded\":[%lld,%lld],\"rel_fro_err\":%.9g,\"max_abs_err\":%.9g,"
	       "\"rms_err\":%.9g,\"rms_ref\":%.9g}\n",
	       x3_exl3_key(e), x3_exl3_bits(e), x3_codebook_name(x3_exl3_codebook(e)),
	       (long long)o, (long long)i, (long long)x3_exl3_n(e), (long long)x3_exl3_k(e),
	       sr > 0 ? sqrt(se / sr) : sqrt(se), mx, sqrt(se / n), sqrt(sr / n));
	free(w);
	x3_tensor_free(ref);
}

/* The product on the device: zero-extend x to k columns, trim y to out. */
static int gpu_matmul(const x3_exl3 *e, const float *x, int64_t rows, int64_t cols, float *y)
{
	const int64_t k = x3_exl3_k(e), n = x3_exl3_n(e), out = x3_exl3_out(e);
	int rc = gpu ? X3_OK : x3_exl3_upload(e, backend, &gpu);
	if (rc)
		return rc;
	float *xk = calloc((size_t)(rows * k), sizeof *xk);
	float *yn = malloc((size_t)(rows * n) * sizeof *yn);
	if (!xk || !yn) {
		free(xk), free(yn);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	for (int64_t r = 0; r < rows; r++)
		memcpy(xk + r * k, x + r * cols, (size_t)cols * sizeof *x);
	rc = backend->linear_forward(gpu, xk, rows, yn);
	for (int64_t r = 0; !rc && r < rows; r++)
		memcpy(y + r * out, yn + r * n, (size_t)out * sizeof *y);
	free(xk), free(yn);
	return rc;
}

/* One input frame: (..., in) -> (..., out). */
static void do_matmul(const x3_exl3 *e, x3_tensor *x, x3_writer *w)
{
	char sb[128];
	if (x->rank < 1 || x->rank > X3_MAX_RANK || !x3_dtype_info(x->dtype)->is_float)
		die("input frame '%s': %s %s, expected a float tensor (rows x in_features)",
		    x->name, x3_dtype_name(x->dtype), x3_shape_str(x, sb, sizeof sb));
	int64_t cols = x->shape[x->rank - 1];
	int64_t rows = cols ? x3_tensor_numel(x) / cols : 0;
	if (cols != x3_exl3_in(e) && cols != x3_exl3_k(e))
		die("input frame '%s': width %lld does not match in_features %lld of tensor '%s'",
		    x->name, (long long)cols, (long long)x3_exl3_in(e), x3_exl3_key(e));
	int64_t shape[X3_MAX_RANK];
	memcpy(shape, x->shape, sizeof shape);
	shape[x->rank - 1] = x3_exl3_out(e);
	x3_tensor *y = x3_tensor_new(x->name, opt_dtype, x->rank, shape, 1);
	if (!y)
		die_x3("frame '%s'", x->name);
	x3_meta_copy(y, x);
	x3_meta_set(y, "exl3_tensor", x3_exl3_key(e));
	if (rows > 0) {
		float *xf = x3_tensor_f32(x);
		float *yf = malloc((size_t)(rows * x3_exl3_out(e)) * sizeof *yf);
		if (!xf || !yf)
			die("input frame '%s': out of memory", x->name);
		int rc;
		if (opt_device == X3_DEVICE_CUDA)
			rc = gpu_matmul(e, xf, rows, cols, yf);
		else
			rc = opt_ref ? x3_exl3_matmul_ref(e, xf, rows, cols, yf)
			             : x3_exl3_matmul(e, xf, rows, cols, yf, (int)opt_threads);
		if (rc)
			die("input frame '%s': %s", x->name, x3_errmsg());
		put_f32(w, y, yf);
		free(xf);
		free(yf);
	} else if (x3_writer_put(w, y)) {
		die_x3("writing frame '%s'", y->name);
	}
	x3_tensor_free(y);
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	enum { O_MODEL = 256, O_TENSOR, O_IN, O_OUT, O_DEQ, O_CHECK, O_REF, O_DT, O_ZSTD, O_DEV };
	int want_device = X3_DEVICE_CPU;
	static const struct option lo[] = {
		{ "model", 1, 0, O_MODEL }, { "tensor", 1, 0, O_TENSOR },
		{ "in", 1, 0, O_IN }, { "out", 1, 0, O_OUT },
		{ "dequant", 0, 0, O_DEQ }, { "check", 1, 0, O_CHECK },
		{ "reference", 0, 0, O_REF }, { "out-dtype", 1, 0, O_DT },
		{ "zstd", 2, 0, O_ZSTD }, { "device", 1, 0, O_DEV }, { "help", 0, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, "hqx:t:", lo, NULL)) != -1) {
		switch (c) {
		case 'h': printf("%s%s", usage, help); return 0;
		case 'q': quiet = 1; break;
		case 'x': opt_x = optarg; break;
		case 't': opt_threads = parse_long(usage, "-t", optarg, 1, 4096); break;
		case O_MODEL: opt_model = optarg; break;
		case O_TENSOR: opt_key = optarg; break;
		case O_IN: opt_in = parse_long(usage, "--in", optarg, 1, 1L << 24); break;
		case O_OUT: opt_out = parse_long(usage, "--out", optarg, 1, 1L << 24); break;
		case O_DEQ: opt_dequant = 1; break;
		case O_CHECK: opt_check = optarg; break;
		case O_REF: opt_ref = 1; break;
		case O_DEV: want_device = device_parse(usage, optarg); break;
		case O_DT:
			if (x3_dtype_parse(optarg, &opt_dtype) ||
			    (opt_dtype != X3_F32 && opt_dtype != X3_F16 && opt_dtype != X3_BF16))
				usage_error(usage, "--out-dtype: '%s' is not F32, F16 or BF16", optarg);
			break;
		case O_ZSTD:
			opt_zstd = optarg ? parse_long(usage, "--zstd", optarg, 1, 22) : 3;
			break;
		default: fprintf(stderr, "%s", usage); return 2;
		}
	}
	if (optind < argc)
		usage_error(usage, "unexpected argument '%s'", argv[optind]);
	if (opt_dequant && opt_check)
		usage_error(usage, "--dequant and --check exclude each other");
	if (opt_model && !opt_key)
		usage_error(usage, "--model needs --tensor KEY");
	if ((opt_dequant || opt_check) && opt_x)
		usage_error(usage, "-x makes no sense with --dequant or --check");
	if (opt_ref && want_device != X3_DEVICE_CPU)
		usage_error(usage, "--reference runs on the CPU: it excludes --device cuda|auto");
	opt_device = device_resolve(want_device);
	if (opt_device == X3_DEVICE_CUDA && x3_gpu_open(&backend))
		die("--device cuda: %s", x3_errmsg());

	x3_reader *in = NULL;
	x3_tensor *next = NULL;
	x3_exl3 *e;
	if (opt_model) {
		e = load_model(opt_model, opt_key);
	} else {
		if (x3_reader_open("-", &in))
			die("%s", x3_errmsg());
		e = read_group(in, opt_key, &next);
	}
	if (x3_exl3_set_orig(e, opt_in, opt_out))
		die("%s", x3_errmsg());

	if (opt_check) {
		do_check(e, opt_check);
		x3_tensor_free(next);
		x3_reader_close(in);
		x3_exl3_free(e);
		check_stdout();
		return 0;
	}
	refuse_tty_stdout();
	x3_writer *w;
	if (x3_writer_open_fd(1, (int)opt_zstd, &w))
		die_x3("stdout");
	if (opt_dequant) {
		do_dequant(e, w);
	} else {
		if (opt_x && !strcmp(opt_x, "-") && in) {
			/* X on stdin after the group: the default */
		} else if (opt_x) {
			/* the weight came from stdin: frames after its group are not read */
			x3_tensor_free(next);
			next = NULL;
			x3_reader_close(in);
			if (x3_reader_open(opt_x, &in))
				die("%s", x3_errmsg());
		} else if (!in && x3_reader_open("-", &in)) {
			die("%s", x3_errmsg());
		}
		long nf = 0;
		for (;;) {
			x3_tensor *x = next;
			next = NULL;
			if (!x) {
				int rc = x3_reader_next(in, &x);
				if (rc == X3_EOF)
					break;
				if (rc)
					die("%s", x3_errmsg());
			}
			do_matmul(e, x, w);
			x3_tensor_free(x);
			progress("%ld frames", ++nf);
		}
		progress_done();
	}
	if (x3_writer_close(w))
		die_x3("stdout");
	x3_reader_close(in);
	if (gpu)
		backend->linear_free(gpu);
	x3_exl3_free(e);
	check_stdout();
	return 0;
}
