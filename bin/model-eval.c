/* model-eval: perplexity of a model on a text, and how far a second
 * (quantized) model drifts from it: teacher-forced KL divergence, top-1
 * agreement, perplexity of both, as one JSON object. Also greedy text
 * generation. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "util.h"
#include "calib.h"
#include "device.h"
#include "model.h"
#include "tokenizer.h"

static const char usage[] =
	"usage: model-eval --model DIR [--quantized DIR] (--text FILE... | --tokens FRAMES)\n"
	"                  [--rows R] [--cols C] [--split MODE] [--batch B] [--strict]\n"
	"                  [--device cpu|cuda|auto] [-q]\n"
	"       model-eval --model DIR --generate N [--prompt TEXT] [--ids]\n"
	"                  [--device cpu|cuda|auto]\n"
	"  --model DIR      the (original) Hugging Face model directory\n"
	"  --quantized DIR  a second model to compare with the first (an EXL3 directory\n"
	"                   or another HF model): KL(model || quantized), top-1 agreement\n"
	"  --text FILE      evaluation text, plain or zstd ('-': stdin); repeatable\n"
	"  --tokens FRAMES  token-id frames instead of text ('-': stdin)\n"
	"  --rows R         evaluate at most R rows (default: all the input gives)\n"
	"  --cols C         tokens per row (default 2048, at most max_position_embeddings)\n"
	"  --split MODE     documents of a text, each starting with BOS: whole (default),\n"
	"                   lines, blank; documents are concatenated into windows\n"
	"  --batch B        rows per forward pass (default: about 256 MiB of logits)\n"
	"  --strict         fail when the input gives fewer than R rows\n"
	"  --generate N     print N greedily generated tokens after BOS and the prompt\n"
	"  --prompt TEXT    prompt for --generate (default: none)\n"
	"  --ids            with --generate, print token ids instead of text\n"
	"  --device D       cpu (default), cuda or auto: where the linears of the forward\n"
	"                   run (cuBLAS; equal to the CPU up to F32 rounding)\n"
	"  -q               no progress\n"
	"  -h               this help\n";

static int device = X3_DEVICE_CPU;   /* resolved --device */

static int32_t *get_rows(const char *model, char **texts, int ntexts, const char *tokens,
                         int split, long *rows, long *cols, int strict)
{
	int32_t *ids = NULL;
	size_t n = 0;
	if (tokens) {
		int64_t last = 0;
		if (x3_tokens_read(tokens, &ids, &n, &last))
			die_x3("%s", tokens);
		if (*cols <= 0)
			*cols = last > 0 ? (long)last : 2048;
	} else {
		x3_tok *tok;
		if (x3_tok_load(model, &tok))
			die_x3("%s: tokenizer", model);
		struct x3_tok_pack_opts po;
		x3_tok_pack_defaults(tok, &po);
		po.mode = X3_PACK_STREAM;
		/* at most the rows asked for, else all the text gives */
		size_t got = 0;
		if (x3_text_rows(tok, texts, ntexts, split, &po, *rows > 0 ? (size_t)*rows : 0,
		                 (size_t)*cols, &ids, &got))
			die_x3("evaluation text");
		n = got * (size_t)*cols;
		x3_tok_free(tok);
	}
	long have = (long)(n / (size_t)*cols);
	/* name the input: the token file, or the text (one file or several) */
	char what[512];
	if (tokens)
		snprintf(what, sizeof what, "%s", strcmp(tokens, "-") ? tokens : "stdin");
	else if (ntexts == 1)
		snprintf(what, sizeof what, "%s", strcmp(texts[0], "-") ? texts[0] : "stdin");
	else
		snprintf(what, sizeof what, "the %d evaluation texts", ntexts);
	if (have < 1)
		die("%s: %zu tokens, fewer than one row of %ld", what, n, *cols);
	if (*rows > have) {
		if (strict)
			die("%s: %ld rows of %ld tokens, fewer than the %ld requested",
			    what, have, *cols, *rows);
		warnx("%s: only %ld rows of %ld tokens (of %ld requested); using them",
		      what, have, *cols, *rows);
	}
	if (*rows <= 0 || *rows > have)
		*rows = have;
	return ids;
}

/* log-softmax of v (n) in place; returns nothing */
static void log_softmax(float *v, int64_t n)
{
	float mx = -INFINITY;
	for (int64_t i = 0; i < n; i++)
		if (v[i] > mx)
			mx = v[i];
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += exp((double)v[i] - mx);
	float lse = mx + (float)log(s);
	for (int64_t i = 0; i < n; i++)
		v[i] -= lse;
}

static int64_t argmax(const float *v, int64_t n)
{
	int64_t b = 0;
	for (int64_t i = 1; i < n; i++)
		if (v[i] > v[b])
			b = i;
	return b;
}

static void forward_logits(x3_model *m, const char *dir, const int32_t *ids, long nr, long cols,
                           float *lg, int mode)
{
	struct x3_forward_opts fo;
	x3_forward_opts_init(&fo, m);
	fo.logits_mode = mode;
	fo.logits = lg;
	fo.device = device;
	if (x3_model_forward(m, ids, nr, cols, &fo))
		die_x3("%s: forward", dir);
}

/* a JSON number, or null when not finite (a diverging model) */
static json_t *num(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

static void evaluate(const char *model, const char *qdir, const int32_t *ids, long rows,
                     long cols, long batch)
{
	x3_model *m, *q = NULL;
	if (x3_model_open(model, NULL, &m))
		die("%s", x3_errmsg());
	if (qdir && x3_model_open(qdir, NULL, &q))
		die("%s", x3_errmsg());
	int64_t V = x3_model_cfg(m)->vocab;
	if (q && x3_model_cfg(q)->vocab != V)
		die("%s: vocabulary of %lld, %s has %lld", qdir, (long long)x3_model_cfg(q)->vocab,
		    model, (long long)V);
	if (batch <= 0) {
		batch = (long)((256L << 20) / ((int64_t)cols * V * 4 * (q ? 2 : 1)));
		if (batch < 1)
			batch = 1;
	}
	if (batch > rows)
		batch = rows;
	float *lm = malloc((size_t)batch * cols * V * sizeof *lm);
	float *lq = q ? malloc((size_t)batch * cols * V * sizeof *lq) : NULL;
	if (!lm || (q && !lq))
		die("out of memory for logits of %ld rows of %ld tokens", batch, cols);
	double nll = 0, nllq = 0, kl = 0;
	long long npos = 0, agree = 0;
	double t0 = now_seconds();
	for (long r0 = 0; r0 < rows; r0 += batch) {
		long nr = rows - r0 < batch ? rows - r0 : batch;
		const int32_t *rid = ids + (size_t)r0 * cols;
		forward_logits(m, model, rid, nr, cols, lm, X3_LOGITS_ALL);
		if (q)
			forward_logits(q, qdir, rid, nr, cols, lq, X3_LOGITS_ALL);
		double s_nll = 0, s_nllq = 0, s_kl = 0;
		long long s_agree = 0;
		#pragma omp parallel for if(nr * cols * V > (1 << 16)) schedule(static) reduction(+:s_nll, s_nllq, s_kl, s_agree)
		for (long p = 0; p < nr * cols; p++) {
			if (p % cols == cols - 1)
				continue;       /* no next token in this row */
			int32_t next = rid[p + 1];
			float *a = lm + (size_t)p * V;
			if (q) {
				float *b = lq + (size_t)p * V;
				s_agree += argmax(a, V) == argmax(b, V);
				log_softmax(b, V);
				log_softmax(a, V);
				double k = 0;
				for (int64_t i = 0; i < V; i++)
					k += exp((double)a[i]) * ((double)a[i] - b[i]);
				s_kl += k;
				s_nllq -= b[next];
			} else {
				log_softmax(a, V);
			}
			s_nll -= a[next];
		}
		nll += s_nll, nllq += s_nllq, kl += s_kl, agree += s_agree;
		npos += (long long)nr * (cols - 1);
		double dt = now_seconds() - t0;
		progress("%ld/%ld rows, %.0f tokens/s", r0 + nr, rows,
		         dt > 0 ? (double)(r0 + nr) * cols / dt : 0.0);
	}
	progress_done();
	if (!npos)
		die("rows of one token predict nothing: use --cols 2 or more");
	json_t *o = json_object();
	json_object_set_new(o, "model", json_string(model));
	if (q)
		json_object_set_new(o, "quantized", json_string(qdir));
	json_object_set_new(o, "rows", json_integer(rows));
	json_object_set_new(o, "cols", json_integer(cols));
	json_object_set_new(o, "positions", json_integer(npos));
	json_object_set_new(o, "nll", num(nll / npos));
	json_object_set_new(o, "perplexity", num(exp(nll / npos)));
	if (q) {
		json_object_set_new(o, "nll_quantized", num(nllq / npos));
		json_object_set_new(o, "perplexity_quantized", num(exp(nllq / npos)));
		json_object_set_new(o, "kl_divergence", num(kl / npos));
		json_object_set_new(o, "top1_agreement", json_real((double)agree / npos));
	}
	json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
	printf("\n");
	json_decref(o);
	free(lm), free(lq);
	x3_model_close(m);
	if (q)
		x3_model_close(q);
}

static void generate(const char *model, long ntok, const char *prompt, int print_ids)
{
	x3_model *m;
	x3_tok *tok = NULL;
	if (x3_model_open(model, NULL, &m))
		die("%s", x3_errmsg());
	/* ids from BOS need no tokenizer */
	if ((prompt || !print_ids) && x3_tok_load(model, &tok))
		die_x3("%s: tokenizer", model);
	int32_t *p = NULL;
	size_t np = 0;
	if (tok && x3_tok_encode(tok, prompt ? prompt : "", prompt ? strlen(prompt) : 0, 1, &p, &np))
		die_x3("tokenizing the prompt");
	if (!np) {
		int32_t bos = tok && x3_tok_bos(tok) >= 0 ? x3_tok_bos(tok)
		                                          : (int32_t)x3_model_cfg(m)->bos_id;
		if (bos < 0)
			die("--generate needs a prompt: no BOS id in the tokenizer or config");
		free(p);
		p = malloc(sizeof *p);
		p[0] = bos;
		np = 1;
	}
	int64_t V = x3_model_cfg(m)->vocab, maxpos = x3_model_cfg(m)->max_pos;
	int64_t eos = tok ? x3_tok_eos(tok) : x3_model_cfg(m)->eos_id;
	/* positions past max_position_embeddings are not what the model was
	 * trained on (--cols refuses them too) */
	if (maxpos > 0 && (int64_t)np >= maxpos)
		die("--prompt: %zu tokens, the model's max_position_embeddings %lld leaves no room to generate",
		    np, (long long)maxpos);
	if (maxpos > 0 && (int64_t)np + ntok > maxpos) {
		warnx("--generate %ld: stopping at max_position_embeddings %lld (%lld tokens after the prompt)",
		      ntok, (long long)maxpos, (long long)(maxpos - (int64_t)np));
		ntok = (long)(maxpos - (int64_t)np);
	}
	int32_t *ids = malloc((np + (size_t)ntok) * sizeof *ids);
	float *lg = malloc((size_t)V * sizeof *lg);
	if (!ids || !lg)
		die("out of memory");
	memcpy(ids, p, np * sizeof *ids);
	size_t n = np;
	/* no KV cache: each step reruns the whole sequence (a test helper) */
	for (long i = 0; i < ntok; i++) {
		forward_logits(m, model, ids, 1, (long)n, lg, X3_LOGITS_LAST);
		int32_t next = (int32_t)argmax(lg, V);
		ids[n++] = next;
		progress("%ld/%ld tokens", i + 1, ntok);
		if (next == eos)
			break;
	}
	progress_done();
	if (print_ids) {
		for (size_t i = 0; i < n; i++)
			printf("%s%d", i ? " " : "", ids[i]);
		printf("\n");
	} else {
		char *text;
		size_t len;
		if (x3_tok_decode(tok, ids, n, 1, &text, &len))
			die_x3("decoding");
		fwrite(text, 1, len, stdout);
		printf("\n");
		free(text);
	}
	free(ids), free(lg), free(p);
	if (tok)
		x3_tok_free(tok);
	x3_model_close(m);
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	enum { O_MODEL = 256, O_QUANT, O_TEXT, O_TOKENS, O_ROWS, O_COLS, O_SPLIT, O_BATCH,
	       O_STRICT, O_GEN, O_PROMPT, O_IDS, O_DEV };
	static const struct option lo[] = {
		{ "model", required_argument, 0, O_MODEL }, { "quantized", required_argument, 0, O_QUANT },
		{ "text", required_argument, 0, O_TEXT }, { "tokens", required_argument, 0, O_TOKENS },
		{ "rows", required_argument, 0, O_ROWS }, { "cols", required_argument, 0, O_COLS },
		{ "split", required_argument, 0, O_SPLIT }, { "batch", required_argument, 0, O_BATCH },
		{ "strict", no_argument, 0, O_STRICT }, { "generate", required_argument, 0, O_GEN },
		{ "prompt", required_argument, 0, O_PROMPT }, { "ids", no_argument, 0, O_IDS },
		{ "device", required_argument, 0, O_DEV }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	const char *model = NULL, *qdir = NULL, *tokens = NULL, *prompt = NULL;
	char **texts = calloc((size_t)argc + 1, sizeof *texts);
	int ntexts = 0, split = X3_SPLIT_WHOLE, strict = 0, ids = 0, want_device = X3_DEVICE_CPU;
	long rows = 0, cols = 0, batch = 0, gen = -1;
	int c;
	while ((c = getopt_long(argc, argv, "hq", lo, NULL)) != -1) {
		switch (c) {
		case 'h': fputs(usage, stdout); return 0;
		case 'q': quiet = 1; break;
		case O_MODEL: model = optarg; break;
		case O_QUANT: qdir = optarg; break;
		case O_TEXT: texts[ntexts++] = optarg; break;
		case O_TOKENS: tokens = optarg; break;
		case O_ROWS: rows = parse_long(usage, "--rows", optarg, 1, 100000000); break;
		case O_COLS: cols = parse_long(usage, "--cols", optarg, 2, 10000000); break;
		case O_BATCH: batch = parse_long(usage, "--batch", optarg, 1, 1000000); break;
		case O_SPLIT:
			if (!strcmp(optarg, "lines")) split = X3_SPLIT_LINES;
			else if (!strcmp(optarg, "blank")) split = X3_SPLIT_BLANK;
			else if (!strcmp(optarg, "whole")) split = X3_SPLIT_WHOLE;
			else usage_error(usage, "--split: '%s' is not lines, blank or whole", optarg);
			break;
		case O_STRICT: strict = 1; break;
		case O_GEN: gen = parse_long(usage, "--generate", optarg, 0, 1000000); break;
		case O_PROMPT: prompt = optarg; break;
		case O_IDS: ids = 1; break;
		case O_DEV: want_device = device_parse(usage, optarg); break;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (!model)
		usage_error(usage, "--model is required");
	for (int i = optind; i < argc; i++)
		texts[ntexts++] = argv[i];
	if (gen >= 0 && (ntexts || tokens || qdir))
		usage_error(usage, "--generate takes no --text, --tokens or --quantized");
	if (gen < 0 && (prompt || ids))
		usage_error(usage, "--prompt and --ids go with --generate");
	if (gen < 0 && !ntexts == !tokens)
		usage_error(usage, "give either --text or --tokens");
	device = device_resolve(want_device);
	if (gen >= 0) {
		if (ntexts || tokens || qdir)
			usage_error(usage, "--generate takes no --text, --tokens or --quantized");
		generate(model, gen, prompt, ids);
	} else {
		if (prompt || ids)
			usage_error(usage, "--prompt and --ids go with --generate");
		if (!ntexts == !tokens)
			usage_error(usage, "give either --text or --tokens");
		x3_model_config cfg;
		if (x3_config_load(model, &cfg))
			die("%s", x3_errmsg());
		if (cols <= 0 && !tokens)
			cols = cfg.max_pos < 2048 ? (long)cfg.max_pos : 2048;
		int32_t *tk = get_rows(model, texts, ntexts, tokens, split, &rows, &cols, strict);
		evaluate(model, qdir, tk, rows, cols, batch);
		free(tk);
	}
	free(texts);
	check_stdout();
	return 0;
}
