/* bitalloc: per-tensor bit widths from trellis-encode --measure lines. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"
#include "arch.h"
#include "bitalloc.h"
#include "safetensors.h"

static const char usage[] =
	"usage: bitalloc --bits B [--head-bits N] [--hq] [--set REGEX=K]...\n"
	"                [--importance FILE] [--strategy optimal|exllamav3]\n"
	"                [--method auto|dp|lagrangian] [-o PLAN] [-q] [FILE...]\n";

static void help(void)
{
	printf("%s", usage);
	printf("Reads JSON lines {tensor, K, proxy_err, numel} (trellis-encode --measure)\n"
	       "from FILEs or stdin and prints a plan (JSON): a bit width K for every\n"
	       "linear so that the numel-weighted average K is <= B, minimizing\n"
	       "sum(proxy_err * importance).\n"
	       "  --bits B          target average bits of the decoder linears (1..8)\n"
	       "  --head-bits N     lm_head bits, 1..8 or 16 (unquantized); default 6\n"
	       "  --hq              floor each linear at min(floor(B)+hq, 8), hq its\n"
	       "                    architecture's promotion (tensor-ls --modules: attention\n"
	       "                    +2, shared experts +1)\n"
	       "  --set REGEX=K     fix K for linears matching REGEX (PCRE2, repeatable)\n"
	       "  --importance FILE JSON lines {tensor, importance}; default numel\n"
	       "  --strategy S      optimal (default) or exllamav3 (its greedy, for comparison)\n"
	       "  --method M        auto (default: exact DP when small enough), dp, lagrangian\n"
	       "  -o PLAN           write the plan to PLAN (atomically) instead of stdout\n"
	       "  -q                no summary on stderr\n");
}

static void read_file(x3_ba *ba, const char *path, int importance)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
	if (!f)
		die("%s: %s", path, strerror(errno));
	const char *label = strcmp(path, "-") ? path : "stdin";
	int rc = importance ? x3_ba_read_importance(ba, f, label) : x3_ba_read(ba, f, label);
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

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	enum { O_BITS = 256, O_HEAD, O_HQ, O_SET, O_IMP, O_STRAT, O_METHOD };
	static const struct option lo[] = {
		{"bits", required_argument, 0, O_BITS},
		{"head-bits", required_argument, 0, O_HEAD},
		{"hq", no_argument, 0, O_HQ},
		{"set", required_argument, 0, O_SET},
		{"importance", required_argument, 0, O_IMP},
		{"strategy", required_argument, 0, O_STRAT},
		{"method", required_argument, 0, O_METHOD},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	double bits = NAN;
	long head_bits = 6;
	int hq = 0, exl3 = 0, method = X3_BA_AUTO, nset = 0;
	const char *imp = NULL, *out = NULL;
	char **sets = calloc((size_t)argc, sizeof *sets);
	if (!sets)
		die("out of memory");
	int c;
	while ((c = getopt_long(argc, argv, "ho:q", lo, NULL)) != -1) {
		switch (c) {
		case 'h': help(); return 0;
		case 'o': out = optarg; break;
		case 'q': quiet = 1; break;
		case O_BITS: bits = parse_double(usage, "--bits", optarg, 1, 8); break;
		case O_HEAD:
			head_bits = parse_long(usage, "--head-bits", optarg, 1, 16);
			if (head_bits > 8 && head_bits != 16)
				usage_error(usage, "--head-bits: %ld is not 1..8 or 16", head_bits);
			break;
		case O_HQ: hq = 1; break;
		case O_SET: sets[nset++] = optarg; break;
		case O_IMP: imp = optarg; break;
		case O_STRAT:
			if (!strcmp(optarg, "exllamav3")) exl3 = 1;
			else if (!strcmp(optarg, "optimal")) exl3 = 0;
			else usage_error(usage, "--strategy: '%s' is not optimal or exllamav3", optarg);
			break;
		case O_METHOD:
			if (!strcmp(optarg, "auto")) method = X3_BA_AUTO;
			else if (!strcmp(optarg, "dp")) method = X3_BA_DP;
			else if (!strcmp(optarg, "lagrangian")) method = X3_BA_LAGRANGE;
			else usage_error(usage, "--method: '%s' is not auto, dp or lagrangian", optarg);
			break;
		default: usage_error(usage, "bad option");
		}
	}
	if (isnan(bits))
		usage_error(usage, "--bits is required");
	struct { char *re; long K; } *set = calloc((size_t)(nset ? nset : 1), sizeof *set);
	if (!set)
		die("out of memory");
	for (int i = 0; i < nset; i++) {
		char *eq = strrchr(sets[i], '=');
		if (!eq || eq == sets[i])
			usage_error(usage, "--set: '%s' is not REGEX=K", sets[i]);
		*eq = 0;
		set[i].re = sets[i];
		set[i].K = parse_long(usage, "--set", eq + 1, 1, 8);
		/* a bad REGEX is a usage error, found before any input is read */
		int ec;
		PCRE2_SIZE eo;
		pcre2_code *re = pcre2_compile((PCRE2_SPTR)set[i].re, PCRE2_ZERO_TERMINATED, 0, &ec, &eo, NULL);
		if (!re) {
			PCRE2_UCHAR msg[256];
			pcre2_get_error_message(ec, msg, sizeof msg);
			usage_error(usage, "--set: regex '%s': %s at offset %zu", set[i].re, (char *)msg, (size_t)eo);
		}
		pcre2_code_free(re);
	}

	x3_ba *ba = x3_ba_create();
	if (!ba)
		die_x3("init");
	ba->head_bits = (int)head_bits;
	if (optind == argc)
		read_file(ba, "-", 0);
	for (int i = optind; i < argc; i++)
		read_file(ba, argv[i], 0);
	if (imp)
		read_file(ba, imp, 1);

	/* the --set fixes apply to both strategies */
#define APPLY_SETS() do { \
	x3_ba_reset_limits(ba); \
	for (int i = 0; i < nset; i++) { \
		int nm; \
		if (x3_ba_set_fixed(ba, set[i].re, (int)set[i].K, &nm)) \
			die("--set: %s", x3_errmsg()); \
	} } while (0)

	if (!exl3) {
		/* the ExLlamaV3 plan at the same target, for comparison */
		APPLY_SETS();
		if (x3_ba_solve(ba, bits, X3_BA_EXL3, hq) == X3_OK) {
			ba->has_exl3 = 1;
			ba->exl3_error = x3_ba_error(ba);
			ba->exl3_bits = x3_ba_bits(ba);
		}
	}
	APPLY_SETS();
	if (x3_ba_solve(ba, bits, exl3 ? X3_BA_EXL3 : method, hq))
		die("%s", x3_errmsg());
	double got = x3_ba_bits(ba);
	if (exl3 && got > bits)
		warnx("warning: the exllamav3 plan (%.4f bits) exceeds the target %g (--hq floors)", got, bits);
	else if (exl3 && isnan(x3_ba_error(ba)))
		warnx("warning: the exllamav3 plan uses widths that were not measured; expected_error is null");

	char *js = x3_ba_plan_json(ba);
	if (!js)
		die_x3("plan");
	if (out) {
		size_t n = strlen(js);
		js[n] = '\n';
		if (x3_write_file_atomic(out, js, n + 1))
			die_x3("%s", out);
		js[n] = 0;
	} else {
		puts(js);
		check_stdout();
	}
	if (!quiet) {
		char h[256];
		size_t o = 0;
		int cnt[X3_BA_KMAX + 1] = {0};
		for (int i = 0; i < ba->n; i++)
			cnt[ba->t[i].K]++;
		h[0] = 0;
		for (int K = 1; K <= X3_BA_KMAX; K++)
			if (cnt[K])
				o += (size_t)snprintf(h + o, sizeof h - o, " %d:%d", K, cnt[K]);
		int ku = (int)floor(bits);
		fprintf(stderr, "%s: %s (%s): %.4f bpw (target %g) over %d tensors, head %d bits; "
		        "K histogram%s\n", progname, exl3 ? "exllamav3" : "optimal", ba->method,
		        got, bits, ba->n, ba->head_bits, h);
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
	}
	free(js);
	x3_ba_free(ba);
	free(set);
	free(sets);
	return 0;
}
