/* vision-eval: the output error of a pack's quantized vision tower: the
 * SigLIP encoder of a Gemma3ForConditionalGeneration (lib/model/siglip.h)
 * run in double on seeded patch embeddings, with the source's linears and
 * with the pack's decoded ones; the relative RMS error of the encoder's
 * output (post_layernorm) per seed, their mean and spread. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "config.h"
#include "safetensors.h"
#include "siglip.h"
#include "util.h"

static const char usage[] =
	"usage: vision-eval --model SRC [--seeds N] [--tokens T] PACK\n";

static void help(void)
{
	printf("%s", usage);
	printf("Runs the SigLIP vision encoder of SRC (Gemma3ForConditionalGeneration)\n"
	       "in double precision on T seeded N(0, 1) patch embeddings, once with\n"
	       "SRC's linears and once with the EXL3 linears of PACK decoded (its\n"
	       "exl3-convert --vision-bits tower), and prints one JSON line: pack,\n"
	       "vision_bits, decoded (linears read from PACK), output\n"
	       "(\"post_layernorm\": the encoder's output, before Gemma3's pooling and\n"
	       "projector), tokens, per seed its relative RMS error\n"
	       "||y_pack - y_src|| / ||y_src||, their mean and spread (max - min).\n"
	       "  --model SRC   the source model directory\n"
	       "  --seeds N     seeds 1..N of the inputs (default 3)\n"
	       "  --tokens T    tokens per input (default 64)\n");
}

/* N(0, 1) from a splitmix64 stream (Box-Muller) */
static uint64_t sm_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static double gauss(uint64_t *s)
{
	double u = ((double)(sm_next(s) >> 11) + 0.5) / 9007199254740992.0;
	double v = ((double)(sm_next(s) >> 11) + 0.5) / 9007199254740992.0;
	return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	enum { O_MODEL = 256, O_SEEDS, O_TOKENS };
	static const struct option lo[] = {{"model", required_argument, 0, O_MODEL},
		{"seeds", required_argument, 0, O_SEEDS}, {"tokens", required_argument, 0, O_TOKENS},
		{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	const char *src = NULL;
	long seeds = 3, ntok = 64;
	int c;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case O_MODEL: src = optarg; break;
		case O_SEEDS: seeds = parse_long(usage, "--seeds", optarg, 1, 1000); break;
		case O_TOKENS: ntok = parse_long(usage, "--tokens", optarg, 1, 4096); break;
		case 'h': help(); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (!src || optind + 1 != argc)
		usage_error(usage, "--model SRC and one PACK");
	const char *pack = argv[optind];
	x3_model_config cfg;
	if (x3_config_load_as(src, X3_CONFIG_LAYOUT, &cfg))
		die("%s", x3_errmsg());
	x3_model_config pcfg;
	if (x3_config_load_as(pack, X3_CONFIG_LAYOUT, &pcfg))
		die("%s", x3_errmsg());
	if (!pcfg.vision_bits)
		die("%s: no quantization_config.vision_bits: its vision tower is not EXL3", pack);
	x3_st *sst, *pst;
	if (x3_st_open(src, &sst))
		die_x3("%s", src);
	if (x3_st_open(pack, &pst))
		die_x3("%s", pack);
	x3_siglip *ref, *q;
	int nref, nq;
	if (x3_siglip_load(&cfg, sst, NULL, &ref, &nref))
		die_x3("%s", src);
	if (x3_siglip_load(&cfg, sst, pst, &q, &nq))
		die_x3("%s", pack);
	if (nq != 6 * (int)cfg.v_layers)
		die("%s: %d of the %d vision linears are EXL3", pack, nq, 6 * (int)cfg.v_layers);
	int64_t H = x3_siglip_hidden(ref), n = ntok * H;
	double *x = malloc((size_t)n * sizeof *x), *ys = malloc((size_t)n * sizeof *ys),
	       *yq = malloc((size_t)n * sizeof *yq), *err = malloc((size_t)seeds * sizeof *err);
	if (!x || !ys || !yq || !err)
		die("out of memory");
	json_t *per = json_array();
	double sum = 0, emin = INFINITY, emax = -INFINITY;
	for (long s = 1; s <= seeds; s++) {
		uint64_t st = (uint64_t)s;
		for (int64_t i = 0; i < n; i++)
			x[i] = gauss(&st);
		if (x3_siglip_forward(ref, ntok, x, ys) || x3_siglip_forward(q, ntok, x, yq))
			die("%s", x3_errmsg());
		double d = 0, r = 0;
		for (int64_t i = 0; i < n; i++) {
			d += (yq[i] - ys[i]) * (yq[i] - ys[i]);
			r += ys[i] * ys[i];
		}
		double e = sqrt(d / r);
		if (!isfinite(e))
			die("seed %ld: the error is not finite (%g)", s, e);
		err[s - 1] = e;
		sum += e;
		emin = e < emin ? e : emin;
		emax = e > emax ? e : emax;
		json_t *o = json_object();
		json_object_set_new(o, "seed", json_integer(s));
		json_object_set_new(o, "rel_rms", json_real(e));
		json_array_append_new(per, o);
	}
	json_t *o = json_object();
	json_object_set_new(o, "pack", json_string(pack));
	json_object_set_new(o, "vision_bits", json_integer(pcfg.vision_bits));
	json_object_set_new(o, "decoded", json_integer(nq));
	json_object_set_new(o, "output", json_string("post_layernorm"));
	json_object_set_new(o, "tokens", json_integer(ntok));
	json_object_set_new(o, "seeds", per);
	json_object_set_new(o, "rel_rms_mean", json_real(sum / (double)seeds));
	json_object_set_new(o, "rel_rms_spread", json_real(emax - emin));
	char *t = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
	if (!t)
		die("out of memory");
	puts(t);
	free(t);
	json_decref(o);
	free(x), free(ys), free(yq), free(err);
	x3_siglip_free(ref);
	x3_siglip_free(q);
	x3_st_close(sst);
	x3_st_close(pst);
	check_stdout();
	return 0;
}
