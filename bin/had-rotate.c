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
#include "codec.h"
#include "frame.h"
#include "device.h"
#include "quant.h"
#include "util.h"
#include "util-device.h"
#include "util-quant.h"

static const char usage[] =
	"usage: had-rotate [--seed N] [--hessian FILE] [--out-scales always|never|auto]\n"
	"                  [--sign-draws N -K K [--codebook CB] [--sign-strips S]\n"
	"                  [--sign-metric proxy|output]] [--sign-draw D]\n"
	"                  [--sigma-reg S] [--device cpu|cuda|auto] [-t THREADS] [-q]\n"
	"                  [--zstd[=LEVEL]]\n"
	"                  < frames > frames\n";

static const char help[] =
	"Rotate and regularize linear weights for trellis-encode (EXL3 spec 5.2, 8.2).\n"
	"\n"
	"  --seed N          seed of the random signs (default 0)\n"
	"  --hessian FILE    Hessian frame (F32/F64, in x in, metadata count);\n"
	"                    default: Hessian frames on standard input\n"
	"  --out-scales P    output-channel scales: always (default), never, auto\n"
	"  --sign-draws N    sign search: try N draws of the random signs per weight\n"
	"                    (draw 0 is the plain --seed one) and keep the one with the\n"
	"                    lowest proxy error estimated at -K K (default 1: no search)\n"
	"  -K K              the bit width of the estimate, 1..8\n"
	"  --codebook CB     the codebook of the estimate: mul1 (default), mcg, 3inst\n"
	"  --sign-strips S   16-column output strips the estimate encodes (default a\n"
	"                    eighth of them, at least 8; 0: all)\n"
	"  --sign-metric M   proxy (default): the proxy error; output: the error\n"
	"                    weighed through the input scales (the output's)\n"
	"  --sign-draw D     use sign draw D (0..63; 0: the plain --seed one) without a\n"
	"                    search: the draw another measure chose (convert\n"
	"                    --sign-metric kl); needs a Hessian\n"
	"  --sigma-reg S     the Hessian's damping: S times its mean diagonal\n"
	"                    (default 0.025, exl3(5) 9.1)\n"
	"  --device D        cpu (default), cuda or auto: where the Hadamard rotations\n"
	"                    and the block LDL run (equal to the CPU up to F32 rounding,\n"
	"                    so the trellis encoded from it may differ in some words)\n"
	"  -t THREADS        threads (default: all)\n"
	"  -q                no warnings about unusable Hessians\n"
	"  --zstd[=LEVEL]    compress the output stream (level 1..22, default 3)\n"
	"  -h                this help\n";

static uint64_t seed;
static int draws = 1, pick = -1, est_K, est_cb = X3_CB_MUL1;
static int64_t est_strips = -1;
static int est_metric = X3_EST_PROXY;
static int policy = X3_OUT_SCALES_ALWAYS;
static x3_writer *out;
static int zlevel;

static hess_cache hc = { .k0 = -1 };   /* the current Hessian */


/* the warnings of a Hessian finalized here (not through the cache) */
static void hess_warn(const x3_qhess *h, const char *key)
{
	if (quiet || !hc.raw)
		return;
	if (h->fallback)
		warnx("warning: hessian '%s': %s; '%s' is quantized without error feedback (fallback)",
		      hc.raw->name, h->why, key);
	else if (h->retries)
		warnx("warning: hessian '%s': not positive definite, needed %d extra damping rounds",
		      hc.raw->name, h->retries);
}

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
	x3_qhess *own, *h;
	x3_qweight *q;
	int best = 0;
	double *errs = NULL;
	if (draws == 1 && pick > 0) {
		/* --sign-draw D: draw D's signs, no search */
		if (!hc.raw)
			die("weight '%s': --sign-draw needs a Hessian (--hessian or a frame before the weight)", key);
		if (x3_qhess_from_frame_draw(hc.raw, k0, seed, pick, &own))
			die_x3("hessian '%s' (weight '%s', sign draw %d)", hc.raw->name, key, pick);
		h = own;
		hess_warn(h, key);
		if (x3_qweight_from_frame_draw(W, key, h, seed, pick, policy, &q))
			die_x3("weight '%s'", W->name);
	} else if (draws == 1) {
		h = hess_cache_for(&hc, W, key, seed, &own);
		if (x3_qweight_from_frame(W, key, h, seed, policy, &q))
			die_x3("weight '%s'", W->name);
	} else {
		/* the sign search: every draw finalizes the Hessian anew */
		if (!(errs = malloc((size_t)draws * sizeof *errs)))
			die("out of memory");
		int64_t ns = est_strips >= 0 ? est_strips : x3_estimate_strips(n);
		if (x3_sign_search(hc.raw, W, key, seed, draws, policy, est_K, est_cb, 0, ns, est_metric, &own, &q,
		                   &best, errs))
			die_x3("weight '%s'", W->name);
		h = own;
		hess_warn(h, key);
	}
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
	if (pick >= 0)   /* --sign-draw D, 0 too */
		e |= x3_meta_setf(m, "sign_draw", "%d", pick);
	if (draws > 1) {
		/* the chosen draw and every draw's estimate (at sign_k) */
		char buf[64 * 24] = "";
		size_t o = 0;
		for (int d = 0; d < draws && o + 32 < sizeof buf; d++)
			o += snprintf(buf + o, sizeof buf - o, "%s%.6g", d ? "," : "", errs[d]);
		e |= x3_meta_setf(m, "sign_draw", "%d", best);
		e |= x3_meta_setf(m, "sign_draws", "%d", draws);
		e |= x3_meta_setf(m, "sign_k", "%d", est_K);
		e |= x3_meta_set(m, "sign_est", buf);
		e |= x3_meta_set(m, "sign_metric", est_metric == X3_EST_OUTPUT ? "output" : "proxy");
	}
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
	free(errs);
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
		{ "sign-draws", required_argument, 0, 'S' },
		{ "sign-strips", required_argument, 0, 'P' },
		{ "codebook", required_argument, 0, 'c' },
		{ "sign-metric", required_argument, 0, 'M' },
		{ "sigma-reg", required_argument, 0, 'R' },
		{ "sign-draw", required_argument, 0, 'd' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	const char *hfile = NULL;
	int c, want_device = X3_DEVICE_CPU;
	int have_cb = 0, have_metric = 0;
	while ((c = getopt_long(argc, argv, "K:t:qh", lo, NULL)) != -1) {
		switch (c) {
		case 'S':
			draws = (int)parse_long(usage, "--sign-draws", optarg, 1, 64);
			break;
		case 'P':
			est_strips = parse_long(usage, "--sign-strips", optarg, 0, INT64_MAX / 16);
			break;
		case 'M':
			if (!strcmp(optarg, "proxy"))
				est_metric = X3_EST_PROXY;
			else if (!strcmp(optarg, "output"))
				est_metric = X3_EST_OUTPUT;
			else
				usage_error(usage, "--sign-metric: '%s' is not proxy or output", optarg);
			have_metric = 1;
			break;
		case 'R': {
			char *end;
			double v = strtod(optarg, &end);
			if (end == optarg || *end || x3_quant_set_sigma_reg(v))
				usage_error(usage, "--sigma-reg: '%s' is not a number in (0, 1]", optarg);
			break;
		}
		case 'd':
			pick = (int)parse_long(usage, "--sign-draw", optarg, 0, 63);
			break;
		case 'K':
			est_K = (int)parse_long(usage, "-K", optarg, 1, 8);
			break;
		case 'c':
			if (x3_codebook_parse(optarg, &est_cb))
				usage_error(usage, "--codebook: '%s' is not mul1, mcg or 3inst", optarg);
			have_cb = 1;
			break;
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
	if (draws > 1 && pick >= 0)
		usage_error(usage, "--sign-draw D uses draw D; --sign-draws N searches N draws: not both");
	if (draws > 1 && !est_K)
		usage_error(usage, "--sign-draws %d needs -K K, the bit width of the estimate", draws);
	if (draws == 1 && (est_K || have_cb || have_metric || est_strips >= 0))
		usage_error(usage, "-K, --codebook, --sign-strips and --sign-metric go with --sign-draws N (N > 1)");
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
