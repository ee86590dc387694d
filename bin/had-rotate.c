/* had-rotate: Hessian finalization and regularization of linear weights
 * (exl3(5) §9.2, §9.1): random signs, Hadamard rotation, scales, padding to
 * 128, block LDL. Reads weight (+ bias, + Hessian) frames, writes the
 * frames trellis-encode reads. */
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "frame.h"
#include "device.h"
#include "quant.h"
#include "util.h"
#include "util-device.h"
#include "util-quant.h"

static const char usage[] =
	"usage: had-rotate [--seed N] [--hessian FILE] [--out-scales always|never|auto]\n"
	"                  [--device cpu|cuda|auto] [-t THREADS] [-q] [--zstd[=LEVEL]]\n"
	"                  < frames > frames\n";

static const char help[] =
	"Rotate and regularize linear weights for trellis-encode (EXL3 spec 5.2, 8.2).\n"
	"\n"
	"  --seed N          seed of the random signs (default 0)\n"
	"  --hessian FILE    Hessian frame (F32/F64, in x in, metadata count);\n"
	"                    default: Hessian frames on standard input\n"
	"  --out-scales P    output-channel scales: always (default), never, auto\n"
	"  --device D        cpu (default), cuda or auto: where the Hadamard rotations\n"
	"                    and the block LDL run (equal to the CPU up to F32 rounding,\n"
	"                    so the trellis encoded from it may differ in some words)\n"
	"  -t THREADS        threads (default: all)\n"
	"  -q                no warnings about unusable Hessians\n"
	"  --zstd[=LEVEL]    compress the output stream (level 1..22, default 3)\n"
	"  -h                this help\n";

static uint64_t seed;
static int policy = X3_OUT_SCALES_ALWAYS;
static x3_writer *out;
static int zlevel;

static hess_cache hc = { .k0 = -1 };   /* the current Hessian */


static void rotate(x3_tensor *W, x3_tensor *B)
{
	char key[1024];
	x3_qframe_key(W, key, sizeof key);
	char shp[64];
	if (W->rank != 2)
		die("weight '%s': must be rank 2 (out x in), got shape %s", W->name,
		    x3_shape_str(W, shp, sizeof shp));
	int64_t n0 = W->shape[0], k0 = W->shape[1];
	int64_t k = x3_pad128(k0), n = x3_pad128(n0);
	x3_qhess *own;
	x3_qhess *h = hess_cache_for(&hc, W, key, seed, &own);
	x3_qweight *q;
	if (x3_qweight_from_frame(W, key, h, seed, policy, &q))
		die_x3("weight '%s'", W->name);
	float *bias = NULL;
	if (B && x3_bias_from_frame(B, n0, n, &bias))
		die_x3("bias '%s'", B->name);

	x3_tensor *m = x3_tensor_new1("meta", X3_F32, 0);
	if (!m)
		die_x3("metadata");
	int e = 0;
	e |= x3_meta_setf(m, "in_features", "%lld", (long long)k0);
	e |= x3_meta_setf(m, "out_features", "%lld", (long long)n0);
	e |= x3_meta_setf(m, "shape", "%lldx%lld", (long long)n0, (long long)k0);
	e |= x3_meta_setf(m, "k", "%lld", (long long)k);
	e |= x3_meta_setf(m, "n", "%lld", (long long)n);
	e |= x3_meta_set(m, "dtype", x3_dtype_name(W->dtype));
	e |= x3_meta_setf(m, "seed", "%llu", (unsigned long long)seed);
	e |= x3_meta_set(m, "out_scales", x3_out_scales_name(policy));
	e |= x3_meta_setf(m, "out_scales_applied", "%d", q->out_scales);
	e |= x3_meta_setf(m, "zeros", "%d", q->zeros);
	e |= x3_meta_setf(m, "fallback", "%d", h->fallback);
	if (h->fallback)
		e |= x3_meta_set(m, "fallback_reason", h->why);
	e |= x3_meta_set(m, "hessian", hc.raw ? hc.raw->name : "");
	e |= x3_meta_setf(m, "count", "%.17g", h->count);
	e |= x3_meta_setf(m, "damp_retries", "%d", h->retries);
	e |= x3_meta_setf(m, "has_bias", "%d", bias != NULL);
	if (e)
		die_x3("metadata");
	int64_t s2[2] = { k, n }, sk[1] = { k }, sn[1] = { n }, skk[2] = { k, k };
	put_frame(out, key, "w_reg", X3_F32, 2, s2, q->W, m);
	put_frame(out, key, "su_reg", X3_F32, 1, sk, q->su, NULL);
	put_frame(out, key, "sv_reg", X3_F32, 1, sn, q->sv, NULL);
	if (!h->fallback) {
		put_frame(out, key, "h_rot", X3_F32, 2, skk, h->H, NULL);
		put_frame(out, key, "h_ldl", X3_F32, 2, skk, h->L, NULL);
	}
	if (bias)
		put_frame(out, key, "bias", X3_F32, 1, sn, bias, NULL);
	if (x3_writer_flush(out))
		die_x3("writing standard output");
	x3_tensor_free(m);
	free(bias);
	x3_qweight_free(q);
	x3_qhess_free(own);
}


int main(int argc, char **argv)
{
	prog_init(argc, argv);
	static const struct option lo[] = {
		{ "seed", required_argument, 0, 's' },
		{ "hessian", required_argument, 0, 'H' },
		{ "out-scales", required_argument, 0, 'o' },
		{ "zstd", optional_argument, 0, 'z' },
		{ "device", required_argument, 0, 'D' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	const char *hfile = NULL;
	int c, want_device = X3_DEVICE_CPU;
	while ((c = getopt_long(argc, argv, "t:qh", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			seed = (uint64_t)parse_long(usage, "--seed", optarg, 0, INT64_MAX);
			break;
		case 'H':
			hfile = optarg;
			break;
		case 'o':
			if (x3_out_scales_parse(optarg, &policy))
				usage_error(usage, "--out-scales: '%s' is not always, never or auto", optarg);
			break;
		case 't':
			omp_set_num_threads((int)parse_long(usage, "-t", optarg, 1, 4096));
			break;
		case 'q':
			quiet = 1;
			break;
		case 'D':
			want_device = device_parse(usage, optarg);
			break;
		case 'z':
			zlevel = optarg ? (int)parse_long(usage, "--zstd", optarg, 1, 22) : 3;
			break;
		case 'h':
			printf("%s\n%s", usage, help);
			return 0;
		default:
			usage_error(usage, "bad option");
		}
	}
	if (optind != argc)
		usage_error(usage, "unexpected argument '%s'", argv[optind]);
	refuse_tty_stdout();
	if (x3_quant_set_device(device_resolve(want_device)))
		die("--device cuda: %s", x3_errmsg());

	if (hfile)
		hess_cache_load(&hc, hfile);
	x3_reader *in;
	if (x3_reader_open_fd(STDIN_FILENO, "stdin", 0, &in))
		die_x3("stdin");
	if (x3_writer_open_fd(STDOUT_FILENO, zlevel, &out))
		die_x3("stdout");
	x3_tensor *pw = NULL, *pb = NULL, *t;
	int nweights = 0, rc;
	while ((rc = x3_reader_next(in, &t)) == X3_OK) {
		const char *role = x3_qframe_role(t);
		if (!strcmp(role, "hessian")) {
			if (hc.from_file)
				die("frame '%s': a hessian on standard input and --hessian %s", t->name, hfile);
			hess_cache_set(&hc, t);
		} else if (!strcmp(role, "bias")) {
			char kb[1024], kw[1024];
			if (!pw || strcmp(x3_qframe_key(t, kb, sizeof kb), x3_qframe_key(pw, kw, sizeof kw)))
				die("frame '%s': a bias without its weight (expected after '%s.weight')",
				    t->name, x3_qframe_key(t, kb, sizeof kb));
			if (pb)
				die("frame '%s': a second bias for the same weight", t->name);
			pb = t;
		} else if (!strcmp(role, "weight")) {
			if (pw) {
				rotate(pw, pb);
				x3_tensor_free(pw), x3_tensor_free(pb);
				pb = NULL;
			}
			pw = t;
			nweights++;
		} else {
			die("frame '%s': role '%s' is not an input of had-rotate (weight, bias or hessian frames)",
			    t->name, role);
		}
	}
	if (rc != X3_EOF)
		die_x3("%s", x3_reader_label(in));   /* the message names it */
	if (pw) {
		rotate(pw, pb);
		x3_tensor_free(pw), x3_tensor_free(pb);
	}
	if (!nweights)
		die("no weight frame on standard input");
	x3_reader_close(in);
	hess_cache_free(&hc);
	if (x3_writer_close(out))
		die_x3("writing standard output");
	check_stdout();
	return 0;
}
