/* trellis-encode: EXL3-quantize linear weights (exl3(5) §9.3-§9.5, §2.2):
 * global scale search, LDLQ with the tail-biting Viterbi, packing. Reads
 * had-rotate's frames (or plain weight frames, doing had-rotate's step
 * itself), writes the EXL3 tensors of each linear, or with --measure one
 * JSON line of error and size per K. */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
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
	"usage: trellis-encode -K N [--codebook mul1|mcg|3inst] [-t THREADS] [--json]\n"
	"                      [--seed N] [--hessian FILE] [--out-scales always|never|auto]\n"
	"                      [--refit-scales proxy|output] [--device cpu|cuda|auto]\n"
	"                      [--g-scale G | --g-refine G] [--ldlq-passes N] [--gpu-ldlq]\n"
	"                      [-q] [--zstd[=LEVEL]] < frames > frames\n"
	"       trellis-encode --measure 2,3,4,5 [--sample F] [options] < frames > json-lines\n";

static const char help[] =
	"Quantize rotated linear weights to EXL3 trellis tensors (EXL3 spec 8).\n"
	"\n"
	"  -K N              bits per weight, 1..8\n"
	"  --codebook CB     mul1 (default), mcg or 3inst\n"
	"  --measure LIST    quantize at each K of LIST, print one JSON line per K\n"
	"                    (tensor, K, proxy_err, numel, bytes, seconds, g_scale, the\n"
	"                    Viterbi tiles of the search and of LDLQ, timing: seconds\n"
	"                    by phase), no frames\n"
	"  --sample F        with --measure: measure on a seeded F (0 < F <= 1) of the\n"
	"                    16-column output strips (about F of the work; proxy_err\n"
	"                    is the sample's estimate), its scale by the fine grid\n"
	"                    from one predicted from the tiles' RMS (no coarse grid)\n"
	"  --g-scale G       with -K: quantize at the global scale G (> 0), no scale\n"
	"                    search (e.g. the g_scale of a --measure line at that K)\n"
	"  --g-refine G      with -K: only the scale search's fine grid (5 scales 0.075\n"
	"                    apart, parabola through the best), centred on G instead of\n"
	"                    the coarse grid's best, sliding while its best is an end:\n"
	"                    under half the search's work\n"
	"  --ldlq-passes N   after LDLQ, N passes (0..8, default 0) that re-encode each\n"
	"                    16-row block with every other block's error known (LDLQ\n"
	"                    knows the ones below it), kept where the proxy error\n"
	"                    falls: each costs one more Viterbi of every tile\n"
	"  --refit-scales M  after the trellis is chosen, refit each output channel's\n"
	"                    scale (svh) by least squares under the Hessian: proxy (the\n"
	"                    rotated Hessian) or output (seen through the input scales);\n"
	"                    proxy_err is then the refit one (proxy_err_before the old)\n"
	"  -t THREADS        threads (default: all); results do not depend on it\n"
	"  --device D        cpu (default), cuda or auto: where the Viterbi encoder runs;\n"
	"                    the output is byte-identical either way\n"
	"  --gpu-ldlq        with --device cuda (or auto on a GPU): the whole LDLQ on the\n"
	"                    device, its feedback products on cuBLAS; equal to the CPU's\n"
	"                    up to F32 rounding, so the codes are not byte-identical\n"
	"  --json            also print each tensor's summary as a JSON line on stderr\n"
	"  -q                no warnings\n"
	"  --zstd[=LEVEL]    compress the output stream (level 1..22, default 3)\n"
	"Plain weight frames (not from had-rotate) are rotated first, with:\n"
	"  --seed N          seed of the random signs (default 0)\n"
	"  --hessian FILE    Hessian frame; default: Hessian frames on standard input\n"
	"  --out-scales P    always (default), never or auto\n"
	"  -h                this help\n";

static int Ks[8], nK, measure, json_summary, threads, cb = X3_CB_MUL1;
static double sample = 0;   /* --sample: 0 = the whole weight */
static double gscale = 0;   /* --g-scale, --g-refine: 0 = search */
static int grefine;         /* --g-refine: the fine grid around gscale */
static uint64_t seed;
static int policy = X3_OUT_SCALES_ALWAYS;
static int refit = -1;      /* --refit-scales: X3_EST_*, -1 = off */
static x3_writer *out;
static int zlevel;

/* plain-weight mode: the current Hessian */
static hess_cache hc = { .k0 = -1 };

enum { R_WREG, R_SU, R_SV, R_HROT, R_HLDL, R_BIAS, R_WEIGHT, R_N };
static const char *role_names[R_N] = { "w_reg", "su_reg", "sv_reg", "h_rot", "h_ldl", "bias", "weight" };

struct group {
	char key[1024];
	x3_tensor *f[R_N];
};

static void group_clear(struct group *g)
{
	for (int i = 0; i < R_N; i++)
		x3_tensor_free(g->f[i]);
	memset(g, 0, sizeof *g);
}


/* Payload as float, taking it over from the frame when it is F32. */
static float *take_f32(x3_tensor *t)
{
	if (t->dtype == X3_F32 && t->owns_data && t->data) {
		float *p = t->data;
		t->data = NULL;
		t->owns_data = 0;
		return p;
	}
	float *p = x3_tensor_f32(t);
	if (!p)
		die_x3("frame '%s'", t->name);
	return p;
}

static void check_frame(const struct group *g, int role, int rank, int64_t d0, int64_t d1)
{
	const x3_tensor *t = g->f[role];
	char shp[64];
	if (!t)
		die("'%s': missing frame '%s.%s' (from had-rotate)", g->key, g->key, role_names[role]);
	int okshape = t->rank == rank && t->shape[0] == d0 && (rank == 1 || t->shape[1] == d1);
	if (!okshape) {
		if (rank == 1)
			die("frame '%s': shape %s, expected %lld", t->name, x3_shape_str(t, shp, sizeof shp),
			    (long long)d0);
		die("frame '%s': shape %s, expected %lldx%lld", t->name, x3_shape_str(t, shp, sizeof shp),
		    (long long)d0, (long long)d1);
	}
	if (!x3_dtype_info(t->dtype)->is_float)
		die("frame '%s': dtype %s is not a float type", t->name, x3_dtype_name(t->dtype));
}

static void check_finite(const char *name, const float *p, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		if (!isfinite(p[i]))
			die("frame '%s': non-finite value %g at element %lld", name, p[i], (long long)i);
}

/* Prepared input of one linear: the regularized weight and its Hessian. */
struct prep {
	x3_qweight *w;
	x3_qhess *h, *own;
	float *bias;           /* (n) or NULL */
	const x3_tensor *meta; /* metadata source for seed etc., may be NULL */
	uint64_t seed;
	int has_seed;
};

static void prep_plain(struct group *g, struct prep *p)
{
	x3_tensor *W = g->f[R_WEIGHT];
	char shp[64];
	if (W->rank != 2)
		die("weight '%s': must be rank 2 (out x in), got shape %s", W->name,
		    x3_shape_str(W, shp, sizeof shp));
	int64_t n0 = W->shape[0], n = x3_pad128(n0);
	p->h = hess_cache_for(&hc, W, g->key, seed, &p->own);
	if (x3_qweight_from_frame(W, g->key, p->h, seed, policy, &p->w))
		die_x3("weight '%s'", W->name);
	if (g->f[R_BIAS] && x3_bias_from_frame(g->f[R_BIAS], n0, n, &p->bias))
		die_x3("bias '%s'", g->f[R_BIAS]->name);
	p->seed = seed;
	p->has_seed = 1;
}

static void prep_rotated(struct group *g, struct prep *p)
{
	x3_tensor *Wt = g->f[R_WREG];
	char shp[64];
	if (Wt->rank != 2 || Wt->shape[0] <= 0 || Wt->shape[1] <= 0 || Wt->shape[0] % 128 ||
	    Wt->shape[1] % 128)
		die("frame '%s': shape %s is not (k, n) with multiples of 128", Wt->name,
		    x3_shape_str(Wt, shp, sizeof shp));
	int64_t k = Wt->shape[0], n = Wt->shape[1], k0 = k, n0 = n, fb = -1;
	if (x3_meta_get_i64(Wt, "in_features", &k0) == X3_EFORMAT ||
	    x3_meta_get_i64(Wt, "out_features", &n0) == X3_EFORMAT ||
	    x3_meta_get_i64(Wt, "fallback", &fb) == X3_EFORMAT)
		die("frame '%s': malformed metadata", Wt->name);
	if (k0 <= 0 || k0 > k || x3_pad128(k0) != k || n0 <= 0 || n0 > n || x3_pad128(n0) != n)
		die("frame '%s': in_features/out_features %lld/%lld do not pad to %lldx%lld", Wt->name,
		    (long long)k0, (long long)n0, (long long)k, (long long)n);
	if (fb < 0)
		fb = g->f[R_HROT] == NULL;
	check_frame(g, R_WREG, 2, k, n);
	check_frame(g, R_SU, 1, k, 0);
	check_frame(g, R_SV, 1, n, 0);
	if (!fb) {
		check_frame(g, R_HROT, 2, k, k);
		check_frame(g, R_HLDL, 2, k, k);
	}
	if (g->f[R_BIAS])
		check_frame(g, R_BIAS, 1, n, 0);
	float *W = take_f32(Wt), *su = take_f32(g->f[R_SU]), *sv = take_f32(g->f[R_SV]);
	check_finite(Wt->name, W, k * n);
	check_finite(g->f[R_SU]->name, su, k);
	check_finite(g->f[R_SV]->name, sv, n);
	p->w = x3_qweight_wrap(k0, n0, k, n, W, su, sv);
	p->own = calloc(1, sizeof *p->own);
	if (!p->w || !p->own)
		die("out of memory");
	int64_t v;
	if (x3_meta_get_i64(Wt, "zeros", &v) == X3_OK)
		p->w->zeros = v != 0;
	if (x3_meta_get_i64(Wt, "out_scales_applied", &v) == X3_OK)
		p->w->out_scales = v != 0;
	p->own->k = k;
	p->own->fallback = (int)fb;
	if (!fb) {
		p->own->H = take_f32(g->f[R_HROT]);
		p->own->L = take_f32(g->f[R_HLDL]);
		check_finite(g->f[R_HROT]->name, p->own->H, k * k);
		check_finite(g->f[R_HLDL]->name, p->own->L, k * k);
	}
	p->h = p->own;
	if (g->f[R_BIAS]) {
		p->bias = take_f32(g->f[R_BIAS]);
		check_finite(g->f[R_BIAS]->name, p->bias, n);
	}
	p->meta = Wt;
	if (x3_meta_get_i64(Wt, "seed", &v) == X3_OK)
		p->seed = (uint64_t)v, p->has_seed = 1;
}


/* wall seconds outside x3_quantize, for the timing report: from main's
 * start to the first read (device start-up), and waiting for and reading
 * a weight's frames (an upstream had-rotate's work included) */
static double t_main, t_mark, t_start, t_input, t_prep;

static json_t *timing_json(const x3_qresult *r)
{
	return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "start", t_start, "input",
	                 t_input, "prep", t_prep, "search", r->t_search, "ldlq", r->t_ldlq, "refine",
	                 r->t_refine, "proxy", r->t_proxy, "viterbi", r->t_viterbi);
}

static json_t *summary(const char *key, const struct prep *p, const x3_qresult *r)
{
	const x3_qweight *w = p->w;
	json_t *j = json_pack("{s:s, s:i, s:s, s:f, s:I, s:I, s:f, s:f, s:b}",
	                      "tensor", key, "K", r->K, "codebook", x3_codebook_name(r->cb),
	                      "proxy_err", r->proxy_err, "numel", (json_int_t)(w->k0 * w->n0),
	                      "bytes", (json_int_t)x3_quant_bytes(w->k, w->n, r->K, r->cb, p->bias != NULL),
	                      "seconds", r->seconds, "g_scale", r->g, "fallback", r->fallback);
	if (!j)
		die("out of memory");
	json_object_set_new(j, "timing", timing_json(r));
	json_object_set_new(j, "search_tiles", json_integer(r->search_tiles));
	json_object_set_new(j, "ldlq_tiles", json_integer(r->ldlq_tiles));
	if (x3_quant_ldlq_passes() > 0 && !r->fallback) {
		json_object_set_new(j, "ldlq_passes", json_integer(x3_quant_ldlq_passes()));
		json_object_set_new(j, "refine_kept", json_integer(r->refine_kept));
	}
	if (refit >= 0)
		json_object_set_new(j, "proxy_err_before", json_real(r->proxy_err_before));
	if (sample > 0) {
		json_object_set_new(j, "sample", json_real(sample));
		json_object_set_new(j, "strips", json_integer(r->nstrips));
		json_object_set_new(j, "strips_total", json_integer(r->strips_total));
	}
	return j;
}

static void emit(const char *key, const struct prep *p, const x3_qresult *r)
{
	const x3_qweight *w = p->w;
	int64_t k = w->k, n = w->n;
	x3_tensor *m = x3_tensor_new1("meta", X3_F32, 0);
	if (!m)
		die_x3("metadata");
	int e = 0;
	e |= x3_meta_setf(m, "K", "%d", r->K);
	e |= x3_meta_set(m, "codebook", x3_codebook_name(r->cb));
	e |= x3_meta_setf(m, "proxy_err", "%.9g", r->proxy_err);
	if (refit >= 0) {
		e |= x3_meta_set(m, "refit_scales", refit == X3_EST_OUTPUT ? "output" : "proxy");
		e |= x3_meta_setf(m, "proxy_err_before", "%.9g", r->proxy_err_before);
	}
	e |= x3_meta_setf(m, "g_scale", "%.9g", r->g);
	if (x3_quant_ldlq_passes() > 0 && !r->fallback)   /* no passes without a Hessian */
		e |= x3_meta_setf(m, "ldlq_passes", "%d", x3_quant_ldlq_passes());
	e |= x3_meta_setf(m, "fallback", "%d", r->fallback);
	if (r->fallback) {   /* why, for pack-write, convert and validate to report */
		const char *why = p->h && p->h->why[0] ? p->h->why
		                : p->meta ? x3_meta_get(p->meta, "fallback_reason") : NULL;
		e |= x3_meta_set(m, "fallback_reason", why ? why : "no Hessian");
	}
	e |= x3_meta_setf(m, "seconds", "%.3f", r->seconds);
	e |= x3_meta_setf(m, "timing", "start=%.3f input=%.3f prep=%.3f search=%.3f ldlq=%.3f "
	                  "refine=%.3f proxy=%.3f viterbi=%.3f", t_start, t_input, t_prep,
	                  r->t_search, r->t_ldlq, r->t_refine, r->t_proxy, r->t_viterbi);
	e |= x3_meta_setf(m, "shape", "%lldx%lld", (long long)w->n0, (long long)w->k0);
	e |= x3_meta_setf(m, "in_features", "%lld", (long long)w->k0);
	e |= x3_meta_setf(m, "out_features", "%lld", (long long)w->n0);
	e |= x3_meta_setf(m, "out_scales_applied", "%d", w->out_scales);
	if (p->has_seed)
		e |= x3_meta_setf(m, "seed", "%llu", (unsigned long long)p->seed);
	/* had-rotate --sign-draws: the chosen draw, kept with the tensor */
	static const char *sign_keys[] = { "sign_draw", "sign_draws", "sign_k", "sign_est", "sign_metric" };
	for (int i = 0; p->meta && i < 5; i++) {
		const char *v = x3_meta_get(p->meta, sign_keys[i]);
		if (v)
			e |= x3_meta_set(m, sign_keys[i], v);
	}
	if (e)
		die_x3("metadata");
	int64_t st[3] = { k / 16, n / 16, 16 * r->K }, sk[1] = { k }, sn[1] = { n };
	put_frame(out, key, "trellis", X3_I16, 3, st, r->trellis, m);
	put_frame(out, key, "suh", X3_F16, 1, sk, r->suh, NULL);
	put_frame(out, key, "svh", X3_F16, 1, sn, r->svh, NULL);
	if (r->cb != X3_CB_3INST) {
		int32_t v = (int32_t)(r->cb == X3_CB_MUL1 ? X3_MUL1_MULT : X3_MCG_MULT);
		put_frame(out, key, x3_codebook_name(r->cb), X3_I32, 0, NULL, &v, NULL);
	}
	if (p->bias) {
		uint16_t *b = malloc((size_t)n * sizeof *b);
		if (!b)
			die("out of memory");
		for (int64_t i = 0; i < n; i++) {
			b[i] = x3_f32_to_f16(p->bias[i]);
			if (!isfinite(x3_f16_to_f32(b[i])))
				die("bias '%s.bias': value %g at [%lld] overflows fp16", key, p->bias[i], (long long)i);
		}
		put_frame(out, key, "bias", X3_F16, 1, sn, b, NULL);
		free(b);
	}
	x3_tensor_free(m);
	if (x3_writer_flush(out))
		die_x3("writing standard output");
}

static void encode(struct group *g)
{
	struct prep p = { 0 };
	double t0 = x3_now();
	t_input = t0 - t_mark;
	if (g->f[R_WEIGHT])
		prep_plain(g, &p);
	else if (g->f[R_WREG])
		prep_rotated(g, &p);
	else
		die("'%s': frames without a weight or w_reg frame", g->key);
	t_prep = x3_now() - t0;
	for (int i = 0; i < nK; i++) {
		x3_qresult *r;
		/* the strips follow the signs' seed (had-rotate's, from the
		 * metadata) and the key */
		if (sample > 0 ? x3_quantize_sample(p.w, p.h, Ks[i], cb, threads, sample, 1,
		                                    p.has_seed ? p.seed : seed, g->key, &r)
		               : x3_quantize_g(p.w, p.h, Ks[i], cb, threads,
		                               refit >= 0 ? X3_QKEEP_Q | X3_QKEEP_W : 0, gscale, grefine, &r))
			die_x3("'%s': K=%d", g->key, Ks[i]);
		if (refit >= 0 && x3_refit_out_scales(p.w, p.h, refit, r, NULL))
			die_x3("'%s': K=%d: --refit-scales", g->key, Ks[i]);
		json_t *j = summary(g->key, &p, r);
		if (measure) {
			char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
			if (!s)
				die("out of memory");
			printf("%s\n", s);
			fflush(stdout);
			free(s);
		} else {
			emit(g->key, &p, r);
			if (json_summary) {
				char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
				fprintf(stderr, "%s\n", s ? s : "{}");
				free(s);
			}
		}
		json_decref(j);
		x3_qresult_free(r);
	}
	x3_qweight_free(p.w);
	x3_qhess_free(p.own);
	free(p.bias);
	t_mark = x3_now();
}

static void parse_measure(const char *s)
{
	char *dup = strdup(s), *save = NULL;
	if (!dup)
		die("out of memory");
	for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (nK == 8)
			usage_error(usage, "--measure: at most 8 values");
		Ks[nK++] = (int)parse_long(usage, "--measure", tok, 1, 8);
	}
	free(dup);
	if (!nK)
		usage_error(usage, "--measure: empty list");
}

/* the command line that main keeps (the rest sets the globals above) */
struct opts {
	const char *hfile;           /* --hessian */
	int K;                       /* -K, 0 with --measure */
	int want_device, gpu_ldlq;
};

/* the options into o and the globals (exits on a bad one, and after --help) */
static void parse_options(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "codebook", required_argument, 0, 'c' },
		{ "measure", required_argument, 0, 'm' },
		{ "sample", required_argument, 0, 'S' },
		{ "g-scale", required_argument, 0, 'g' },
		{ "g-refine", required_argument, 0, 'G' },
		{ "json", no_argument, 0, 'j' },
		{ "seed", required_argument, 0, 's' },
		{ "hessian", required_argument, 0, 'H' },
		{ "out-scales", required_argument, 0, 'o' },
		{ "zstd", optional_argument, 0, 'z' },
		{ "device", required_argument, 0, 'D' },
		{ "refit-scales", required_argument, 0, 'R' },
		{ "ldlq-passes", required_argument, 0, 'P' },
		{ "gpu-ldlq", no_argument, 0, 'L' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	*o = (struct opts){ .want_device = X3_DEVICE_CPU };
	int c;
	while ((c = getopt_long(argc, argv, "K:t:qh", lo, NULL)) != -1) {
		switch (c) {
		case 'K':
			o->K = (int)parse_long(usage, "-K", optarg, 1, 8);
			break;
		case 'c':
			if (x3_codebook_parse(optarg, &cb))
				usage_error(usage, "--codebook: '%s' is not mul1, mcg or 3inst", optarg);
			break;
		case 'm':
			parse_measure(optarg);
			measure = 1;
			break;
		case 'j':
			json_summary = 1;
			break;
		case 'S': {
			char *end;
			sample = strtod(optarg, &end);
			if (end == optarg || *end || !(sample > 0 && sample <= 1))
				usage_error(usage, "--sample: '%s' is not a fraction in (0, 1]", optarg);
			break;
		}
		case 'g':
		case 'G': {
			char *end;
			const char *opt = c == 'g' ? "--g-scale" : "--g-refine";
			if (gscale > 0)
				usage_error(usage, "%s: only one of --g-scale and --g-refine, once", opt);
			gscale = strtod(optarg, &end);
			if (end == optarg || *end || !(gscale > 0 && isfinite(gscale)))
				usage_error(usage, "%s: '%s' is not a positive number", opt, optarg);
			grefine = c == 'G';
			break;
		}
		case 'R':
			if (!strcmp(optarg, "proxy"))
				refit = X3_EST_PROXY;
			else if (!strcmp(optarg, "output"))
				refit = X3_EST_OUTPUT;
			else
				usage_error(usage, "--refit-scales: '%s' is not proxy or output", optarg);
			break;
		case 'P':
			x3_quant_set_ldlq_passes((int)parse_long(usage, "--ldlq-passes", optarg, 0,
			                                         X3_LDLQ_PASSES_MAX));
			break;
		case 'D':
			o->want_device = device_parse(usage, optarg);
			break;
		case 'L':
			o->gpu_ldlq = 1;
			break;
		case 's':
			seed = (uint64_t)parse_long(usage, "--seed", optarg, 0, INT64_MAX);
			break;
		case 'H':
			o->hfile = optarg;
			break;
		case 'o':
			if (x3_out_scales_parse(optarg, &policy))
				usage_error(usage, "--out-scales: '%s' is not always, never or auto", optarg);
			break;
		case 't':
			threads = (int)parse_long(usage, "-t", optarg, 1, 4096);
			omp_set_num_threads(threads);
			break;
		case 'q':
			quiet = 1;
			break;
		case 'z':
			zlevel = optarg ? (int)parse_long(usage, "--zstd", optarg, 1, 22) : 3;
			break;
		case 'h':
			printf("%s\n%s", usage, help);
			exit(0);
		default:
			usage_error(usage, "bad option");
		}
	}
}

/* the options that exclude or need each other (usage errors) */
static void check_options(int argc, char **argv, const struct opts *o)
{
	if (optind != argc)
		usage_error(usage, "unexpected argument '%s'", argv[optind]);
	if (measure && o->K)
		usage_error(usage, "-K and --measure exclude each other");
	if (!measure && !o->K)
		usage_error(usage, "-K N (1..8) or --measure LIST is required");
	if (gscale > 0 && measure)
		usage_error(usage, "%s goes with -K (a measurement searches its own scale)",
		            grefine ? "--g-refine" : "--g-scale");
	if (sample > 0 && !measure)
		usage_error(usage, "--sample needs --measure (a sample is a measurement, not an encode)");
	if (sample > 0 && refit >= 0)
		usage_error(usage, "--refit-scales needs the whole weight, not --sample");
	if (o->gpu_ldlq && o->want_device == X3_DEVICE_CPU)
		usage_error(usage, "--gpu-ldlq needs --device cuda or auto");
}

/* The device: the GPU encoder is bit-identical, only the Viterbi moves
 * (and with --gpu-ldlq the whole LDLQ, which is not). */
static void open_device(const struct opts *o)
{
	if (device_resolve(o->want_device) != X3_DEVICE_CUDA)
		return;
	const x3_gpu *g;
	if (x3_gpu_open(&g))
		die("--device cuda: %s", x3_errmsg());
	x3_viterbi_set_backend(g->viterbi_encode);
	if (o->gpu_ldlq && x3_quant_set_ldlq_device(X3_DEVICE_CUDA))
		die("--gpu-ldlq: %s", x3_errmsg());
	/* the CUDA context now (the runtime makes it at the first
	 * allocation), so that the timing's start holds it, not search */
	void *p1;
	if (g->alloc(&p1, 1))
		die("--device cuda: %s", x3_errmsg());
	g->free(p1);
}

/* Each group of frames of one key from in (its weight, and what goes
 * with it) encoded as it completes; the Hessians on the stream into the
 * cache (hfile: --hessian's file, which excludes them). Returns the
 * number of groups. */
static int encode_stream(x3_reader *in, const char *hfile)
{
	struct group g = { 0 };
	int have = 0, ngroups = 0, rc;
	x3_tensor *t;
	while ((rc = x3_reader_next(in, &t)) == X3_OK) {
		const char *role = x3_qframe_role(t);
		char key[1024];
		x3_qframe_key(t, key, sizeof key);
		if (!strcmp(role, "hessian")) {
			if (hc.from_file)
				die("frame '%s': a hessian on standard input and --hessian %s", t->name, hfile);
			hess_cache_set(&hc, t);
			continue;
		}
		int ri = -1;
		for (int i = 0; i < R_N; i++)
			if (!strcmp(role, role_names[i]))
				ri = i;
		if (ri < 0)
			die("frame '%s': role '%s' is not an input of trellis-encode", t->name, role);
		int starts = ri == R_WEIGHT || !have || strcmp(key, g.key) || (ri == R_WREG && g.f[R_WEIGHT]);
		if (ri == R_BIAS && (!have || strcmp(key, g.key)))
			die("frame '%s': a bias without its weight", t->name);
		if (starts) {
			if (have) {
				encode(&g);
				ngroups++;
			}
			group_clear(&g);
			snprintf(g.key, sizeof g.key, "%s", key);
			have = 1;
		}
		if (g.f[ri])
			die("frame '%s': a second '%s' frame for '%s'", t->name, role, key);
		g.f[ri] = t;
	}
	if (rc != X3_EOF)
		die_x3("%s", x3_reader_label(in));   /* the message names it */
	if (have) {
		encode(&g);
		ngroups++;
	}
	group_clear(&g);
	return ngroups;
}

int main(int argc, char **argv)
{
	t_main = x3_now();
	prog_init(argc, argv);
	struct opts o;
	parse_options(argc, argv, &o);
	check_options(argc, argv, &o);
	open_device(&o);
	if (!measure) {
		Ks[0] = o.K;
		nK = 1;
		refuse_tty_stdout();
		if (x3_writer_open_fd(STDOUT_FILENO, zlevel, &out))
			die_x3("stdout");
	}
	if (o.hfile)
		hess_cache_load(&hc, o.hfile);
	x3_reader *in;
	t_mark = x3_now();   /* the reader waits for the first frame */
	t_start = t_mark - t_main;
	if (x3_reader_open_fd(STDIN_FILENO, "stdin", 0, &in))
		die_x3("stdin");
	if (!encode_stream(in, o.hfile))
		die("no weight frames on standard input");
	x3_reader_close(in);
	hess_cache_free(&hc);
	if (out && x3_writer_close(out))
		die_x3("writing standard output");
	check_stdout();
	return 0;
}
