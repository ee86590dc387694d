/* convert-plan: the plan of a conversion as make rules (plan.h): what
 * pipelines/convert's work directory gets, and which layers a run
 * captures. See man/convert-plan.1. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util.h"
#include "plan.h"
#include "config.h"

static const char usage[] =
	"usage: convert-plan [--recap] OPTS MODEL WORK\n"
	"       convert-plan --finals PLAN OPTS MODEL\n"
	"       convert-plan --list meas|draws|sens-groups OPTS MODEL\n"
	"       convert-plan --sources [--vision-bits N] MODEL < DIGESTS\n"
	"   OPTS: --measure LIST [--head-bits N] [--mtp-bits N] [--vision-bits N] [--mode onepass|sequential] [--sample F|full]\n"
	"         [--draws N] [--sensitivity off|measure|file] [--sensitivity-by tensor|group|layer]\n"
	"         [--sensitivity-k K] [--sens-file NAME]\n";

static void help(void)
{
	fputs(usage, stdout);
	puts("\nThe plan of a conversion from MODEL's description and the options of\n"
	     "pipelines/convert that decide which files a work directory gets: explicit\n"
	     "make rules for exactly the encodes, draws, sampled measurements and\n"
	     "sensitivity steps those options need (recipes: pipelines/convert.mk), the\n"
	     "fan-out lists, and after bitalloc the final encodes (--finals). The\n"
	     "recapture set is the layers whose h1 Hessians make would capture on its\n"
	     "way to the plan, decided from the work directory's file times as make\n"
	     "decides, without running make.\n"
	     "\n"
	     "  --recap           print the recapture set only, write nothing\n"
	     "  --sources         what each step reads of MODEL: one KEY<tab>IDS line per\n"
	     "                    linear, layer.L, other, config, tokenizer and files, from\n"
	     "                    the lines of tensor-ls --digest MODEL on stdin\n"
	     "  --finals PLAN     plan.mk on stdout from bitalloc's PLAN: K.<key>, FINAL, FINAL_L<l>\n"
	     "  --list L          meas (the measurement encodes), draws (the draws' encodes)\n"
	     "                    or sens-groups, one a line\n"
	     "  --measure LIST    the measured widths, e.g. 2,3,4\n"
	     "  --head-bits N     the head's width (default 6; 16: not encoded)\n"
	     "  --mtp-bits N      the multi-token prediction layer's linears' width, 1..8\n"
	     "                    (default 4), encoded without a Hessian\n"
	     "  --vision-bits N   the vision tower's linears' width, 1..8, encoded without\n"
	     "                    a Hessian (16, the default: the tower passed through)\n"
	     "  --mode M          onepass (default) or sequential\n"
	     "  --sample F|full   convert's --sample (default full)\n"
	     "  --draws N         with --sign-metric kl: the draws per decoder linear\n"
	     "  --sensitivity S   off (default), measure or file\n"
	     "  --sensitivity-by U  tensor (default), group or layer\n"
	     "  --sensitivity-k K the K of the measurement and of the draws\n"
	     "  --sens-file NAME  the sensitivity file in the work directory");
}

static int parse_int(const char *opt, const char *s, int lo, int hi)
{
	char *e;
	errno = 0;
	long v = strtol(s, &e, 10);
	if (errno || e == s || *e || v < lo || v > hi)
		usage_error(usage, "%s: '%s' is not an integer from %d to %d", opt, s, lo, hi);
	return (int)v;
}

/* write NAME atomically (NAME.tmp, then renamed) with WRITE */
static void write_file(const char *name, int (*wr)(const x3_plan *, const unsigned char *, FILE *),
                       const x3_plan *p, const unsigned char *recap)
{
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp", name);
	FILE *f = fopen(tmp, "w");
	if (!f)
		die("%s: %s", tmp, strerror(errno));
	if (wr(p, recap, f) || fflush(f) || ferror(f)) {
		fclose(f);
		unlink(tmp);
		die("%s: %s", name, x3_errmsg()[0] ? x3_errmsg() : "write error");
	}
	if (fclose(f) || rename(tmp, name)) {
		unlink(tmp);
		die("%s: %s", name, strerror(errno));
	}
}

/* --sources: the identities of what each step reads (plan.h) */
static int print_sources(const char *dir, int vision_bits)
{
	x3_model_config c;
	x3_module *m;
	int n;
	if (x3_config_load_as(dir, X3_CONFIG_LAYOUT, &c) || x3_config_vision(&c, vision_bits) ||
	    x3_arch_modules(&c, &m, &n))
		die("%s: %s", dir, x3_errmsg());
	if (x3_plan_sources(m, n, stdin, "stdin", stdout) || fflush(stdout) || ferror(stdout))
		die("%s", x3_errmsg());
	free(m);
	return 0;
}

static int wr_rules(const x3_plan *p, const unsigned char *recap, FILE *f)
{
	return x3_plan_write_rules(p, recap, f);
}

static int wr_groups(const x3_plan *p, const unsigned char *recap, FILE *f)
{
	(void)recap;
	return x3_plan_write_sens_groups(p, f);
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	x3_plan_opts o = {0};
	o.head_bits = 6;
	o.mtp_bits = 4;
	o.vision_bits = 16;
	const char *finals = NULL, *list = NULL;
	int recap_only = 0, sources = 0;
	enum { O_HB = 256, O_MB, O_MODE, O_SAMPLE, O_MEASURE, O_DRAWS, O_SENS, O_SENSBY, O_SENSK, O_SENSF,
	       O_FINALS, O_LIST, O_RECAP, O_SOURCES, O_VB };
	static const struct option lo[] = {
		{"head-bits", required_argument, 0, O_HB}, {"mtp-bits", required_argument, 0, O_MB},
		{"vision-bits", required_argument, 0, O_VB},
		{"mode", required_argument, 0, O_MODE},
		{"sample", required_argument, 0, O_SAMPLE}, {"measure", required_argument, 0, O_MEASURE},
		{"draws", required_argument, 0, O_DRAWS}, {"sensitivity", required_argument, 0, O_SENS},
		{"sensitivity-by", required_argument, 0, O_SENSBY},
		{"sensitivity-k", required_argument, 0, O_SENSK}, {"sens-file", required_argument, 0, O_SENSF},
		{"finals", required_argument, 0, O_FINALS}, {"list", required_argument, 0, O_LIST},
		{"recap", no_argument, 0, O_RECAP}, {"sources", no_argument, 0, O_SOURCES},
		{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int c;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case O_HB:
			o.head_bits = parse_int("--head-bits", optarg, 1, 16);
			if (o.head_bits > 8 && o.head_bits != 16)
				usage_error(usage, "--head-bits: '%s' is not 1..8 or 16", optarg);
			break;
		case O_MB:
			o.mtp_bits = parse_int("--mtp-bits", optarg, 1, 8);
			break;
		case O_VB:
			if ((o.vision_bits = parse_int("--vision-bits", optarg, 1, 16)) > 8 && o.vision_bits != 16)
				usage_error(usage, "--vision-bits: '%s' is not 1..8 or 16", optarg);
			break;
		case O_MODE:
			if (!strcmp(optarg, "sequential"))
				o.sequential = 1;
			else if (strcmp(optarg, "onepass"))
				usage_error(usage, "--mode: '%s' is not onepass or sequential", optarg);
			break;
		case O_SAMPLE:
			if (!strcmp(optarg, "full") || !*optarg)
				o.sample[0] = 0;
			else if (strlen(optarg) >= sizeof o.sample || strspn(optarg, "0123456789.e-") != strlen(optarg))
				usage_error(usage, "--sample: '%s' is not full or a fraction", optarg);
			else
				snprintf(o.sample, sizeof o.sample, "%s", optarg);
			break;
		case O_MEASURE: {
			o.nmeasure = 0;
			int have[9] = {0};
			for (const char *s = optarg; *s;) {
				if (*s < '1' || *s > '8' || (s[1] && s[1] != ',' && s[1] != ' '))
					usage_error(usage, "--measure: '%s' is not a list of bit widths 1..8", optarg);
				have[*s - '0'] = 1;
				s += s[1] ? 2 : 1;
			}
			for (int k = 1; k <= 8; k++)
				if (have[k])
					o.measure[o.nmeasure++] = k;
			break;
		}
		case O_DRAWS: o.draws = parse_int("--draws", optarg, 0, 64); break;
		case O_SENS:
			o.sens = !strcmp(optarg, "off") ? X3_SENS_OFF : !strcmp(optarg, "measure") ? X3_SENS_MEASURE :
			         !strcmp(optarg, "file") ? X3_SENS_FILE : -1;
			if (o.sens < 0)
				usage_error(usage, "--sensitivity: '%s' is not off, measure or file", optarg);
			break;
		case O_SENSBY:
			o.sens_by = !strcmp(optarg, "tensor") ? X3_SENS_BY_TENSOR : !strcmp(optarg, "group") ?
			            X3_SENS_BY_GROUP : !strcmp(optarg, "layer") ? X3_SENS_BY_LAYER : -1;
			if (o.sens_by < 0)
				usage_error(usage, "--sensitivity-by: '%s' is not tensor, group or layer", optarg);
			break;
		case O_SENSK: o.sens_k = parse_int("--sensitivity-k", optarg, 1, 8); break;
		case O_SENSF:
			if (strlen(optarg) >= sizeof o.sens_file)
				usage_error(usage, "--sens-file: '%s' is too long", optarg);
			snprintf(o.sens_file, sizeof o.sens_file, "%s", optarg);
			break;
		case O_FINALS: finals = optarg; break;
		case O_LIST: list = optarg; break;
		case O_RECAP: recap_only = 1; break;
		case O_SOURCES: sources = 1; break;
		case 'h': help(); return 0;
		default: usage_error(usage, "unknown option");
		}
	}
	if (sources) {
		if (argc - optind != 1 || finals || list || recap_only)
			usage_error(usage, "--sources takes one MODEL and no --finals, --list or --recap");
		return print_sources(argv[optind], o.vision_bits);
	}
	int want = finals || list ? 1 : 2;
	if (argc - optind != want)
		usage_error(usage, want == 1 ? "one MODEL directory" : "MODEL and WORK");
	if (!o.nmeasure)
		usage_error(usage, "--measure LIST is required");
	if ((o.draws || o.sens == X3_SENS_MEASURE) && !o.sens_k)
		usage_error(usage, "--draws and --sensitivity measure need --sensitivity-k K");
	if (o.sens == X3_SENS_MEASURE && !o.sens_file[0])
		snprintf(o.sens_file, sizeof o.sens_file, "sens/measured.k%d.jsonl", o.sens_k);
	if (o.sens == X3_SENS_FILE && !o.sens_file[0])
		usage_error(usage, "--sensitivity file needs --sens-file NAME");
	x3_plan p;
	if (x3_plan_build(argv[optind], &o, &p))
		die("%s", x3_errmsg());
	if (finals) {
		if (x3_plan_write_finals(&p, finals, stdout) || fflush(stdout))
			die("%s", x3_errmsg());
	} else if (list) {
		int rc = !strcmp(list, "sens-groups") ? x3_plan_write_sens_groups(&p, stdout) :
		         x3_plan_write_list(&p, list, stdout);
		if (rc == X3_EINVAL)
			usage_error(usage, "%s", x3_errmsg());
		if (rc || fflush(stdout))
			die("%s", x3_errmsg());
	} else {
		const char *work = argv[optind + 1];
		unsigned char *recap = calloc(p.last + 2, 1);
		if (!recap)
			die("out of memory");
		if (x3_plan_recap(&p, work, recap))
			die("%s: %s", work, x3_errmsg());
		if (!recap_only) {
			char name[4096];
			snprintf(name, sizeof name, "%s/rules.mk", work);
			write_file(name, wr_rules, &p, recap);
			if (o.sens == X3_SENS_MEASURE) {
				snprintf(name, sizeof name, "%s/tmp/sens-groups", work);
				write_file(name, wr_groups, &p, NULL);
			}
		}
		int first = 1;
		for (int l = 0; l <= p.last; l++)
			if (recap[l]) {
				printf("%s%d", first ? "" : " ", l);
				first = 0;
			}
		printf("\n");
		free(recap);
		if (fflush(stdout) || ferror(stdout))
			die("stdout: write error");
	}
	x3_plan_free(&p);
	return 0;
}
