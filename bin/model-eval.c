/* model-eval: perplexity of a model on a text, and how far a second
 * (quantized) model drifts from it: teacher-forced KL divergence, top-1
 * agreement, perplexity of both, as one JSON object. Also greedy text
 * generation. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/stat.h>
#include <jansson.h>
#include "util.h"
#include "util-device.h"
#include "calib.h"
#include "device.h"
#include "frame.h"
#include "klstats.h"
#include "model.h"
#include "safetensors.h"
#include "tokenizer.h"

static const char usage[] =
	"usage: model-eval --model DIR [--quantized DIR [--patch DIR]] (--text FILE... | --tokens FRAMES)\n"
	"                  [--rows R] [--cols C] [--split MODE] [--batch B] [--strict]\n"
	"                  [--save-base FILE] [--table] [--mtp] [--device cpu|cuda|auto] [-q]\n"
	"       model-eval --base FILE --quantized DIR [--patch DIR] [--table]\n"
	"                  [--device cpu|cuda|auto] [-q]\n"
	"       model-eval --model DIR --generate N [--prompt TEXT] [--ids]\n"
	"                  [--device cpu|cuda|auto]\n"
	"  --model DIR      the (original) Hugging Face model directory\n"
	"                   (or an EXL3 pack, to compare two packs with each other)\n"
	"  --quantized DIR  a second model to compare with the first (an EXL3 directory\n"
	"                   or another HF model): KL(model || quantized) with its median,\n"
	"                   p90, p99, p99.9, max; ln(PPL(Q)/PPL(base)); delta-p; same top p\n"
	"  --patch DIR      EXL3 linears (a directory, a .safetensors file, or frames as\n"
	"                   trellis-encode writes them) that replace those of\n"
	"                   --quantized one by one: e.g. the original with one group\n"
	"                   of linears quantized; one that replaces nothing is an error\n"
	"  --save-base FILE save --model's logits and the tokens (zstd frames) for --base\n"
	"  --base FILE      the original's logits from --save-base instead of --model\n"
	"                   and the text: one forward of the original for any number of packs\n"
	"  --table          a short table instead of JSON\n"
	"  --mtp            the multi-token prediction layer's logits instead of the\n"
	"                   model's: at position t, from the last hidden state at t and\n"
	"                   token t + 1, those of token t + 2 (with --patch of the MTP\n"
	"                   layer's linears alone: that layer's own error); not with\n"
	"                   --base or --save-base\n"
	"  --text FILE      evaluation text, plain or zstd ('-': stdin); repeatable\n"
	"  --tokens FRAMES  token-id frames instead of text ('-': stdin)\n"
	"  --rows R         evaluate at most R rows (default: all the input gives)\n"
	"  --cols C         tokens per row (default min(2048, max_position_embeddings))\n"
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
static int mtp;                      /* --mtp */
static const char *patch;            /* --patch, as given */
static const char *patch_st;         /* what the model opens: patch, or its frames as safetensors */

/* --patch FILE of frames (what trellis-encode writes): its tensors into a
 * temporary .safetensors file (removed at exit) for the model to open; a
 * directory or a .safetensors file is opened as it is. */
static char patch_tmpdir[4096], patch_tmp[4200];
static void patch_tmp_remove(void)
{
	if (*patch_tmp)
		unlink(patch_tmp);
	if (*patch_tmpdir)
		rmdir(patch_tmpdir);
}

static const char *patch_source(const char *p)
{
	struct stat sb;
	size_t n = strlen(p);
	if ((stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) || (n >= 12 && !strcmp(p + n - 12, ".safetensors")))
		return p;
	x3_reader *r;
	if (x3_reader_open(p, &r))
		die_x3("--patch %s", p);
	const char *td = getenv("TMPDIR");
	snprintf(patch_tmpdir, sizeof patch_tmpdir, "%s/model-eval.XXXXXX", td && *td ? td : "/tmp");
	if (!mkdtemp(patch_tmpdir)) {
		int e = errno;
		*patch_tmpdir = 0;
		die("--patch %s: a temporary directory: %s", p, strerror(e));
	}
	atexit(patch_tmp_remove);
	snprintf(patch_tmp, sizeof patch_tmp, "%s/patch.safetensors", patch_tmpdir);
	x3_stw *w;
	if (x3_stw_create(patch_tmp, 0, &w))
		die_x3("--patch %s", p);
	x3_tensor *t;
	int rc, nf = 0;
	while ((rc = x3_reader_next(r, &t)) == X3_OK) {
		if (x3_stw_add(w, t))
			die_x3("--patch %s: frame '%s'", p, t->name);
		x3_tensor_free(t);
		nf++;
	}
	if (rc != X3_EOF)
		die_x3("--patch %s", p);
	x3_reader_close(r);
	if (!nf)
		die("--patch %s: no frames: the patch would replace nothing", p);
	if (x3_stw_commit(w))
		die_x3("--patch %s", p);
	return patch_tmp;
}

static int32_t *get_rows(const char *model, char **texts, int ntexts, const char *tokens,
                         int split, long *rows, long *cols, long dflt_cols, int strict)
{
	int32_t *ids = NULL;
	size_t n = 0;
	if (tokens) {
		int64_t last = 0;
		if (x3_tokens_read(tokens, &ids, &n, &last))
			die_x3("%s", tokens);
		if (*cols <= 0)   /* the frames' row length; none (empty): as for text */
			*cols = last > 0 ? (long)last : dflt_cols;
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
	fo.logits_mode = mtp ? X3_LOGITS_NONE : mode;
	fo.logits = mtp ? NULL : lg;
	fo.mtp_logits = mtp ? lg : NULL;   /* (nr * (cols - 1), V) */
	fo.device = device;
	if (x3_model_forward(m, ids, nr, cols, &fo))
		die_x3("%s: forward", dir);
}

/* Every logit of a batch is finite: a NaN or Inf would turn the position's
 * KL and NLL into NaN; the model (or --base file) is named, with the
 * place of the first one. */
static void check_logits(const float *lg, long nr, long cols, int64_t V, long r0, const char *what)
{
	size_t n = (size_t)nr * (size_t)cols * (size_t)V, bad = n;
	#pragma omp parallel for if(n > (1 << 20)) schedule(static) reduction(min:bad)
	for (size_t i = 0; i < n; i++)
		if (!isfinite(lg[i]) && i < bad)
			bad = i;
	if (bad < n)
		die("%s: logit %g is not finite (row %ld, position %ld, token %lld of the vocabulary)", what,
		    (double)lg[bad], r0 + (long)(bad / ((size_t)cols * V)), (long)(bad / V % cols),
		    (long long)(bad % V));
}

/* a JSON number, or null when not finite (a perplexity past the double
 * range; the logits and the KL are finite, checked) */
static json_t *num(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

static json_t *pm(double v, double e)
{
	json_t *o = json_object();
	json_object_set_new(o, "value", num(v));
	json_object_set_new(o, "uncertainty", num(e));
	return o;
}

static const char *const dp_names[X3_DP_NPCT] = {"min", "p0.1", "p1", "p5", "p10", "p25", "median",
                                                 "p75", "p90", "p95", "p99", "p99.9", "max"};

static void print_table(const x3_klstats *s, int have_q)
{
	printf("%-26s %lld\n", "positions", (long long)s->n);
	printf("%-26s %.4f\n", "PPL(base)", exp(s->nll_base));
	if (!have_q)
		return;
	printf("%-26s %.4f\n", "PPL(Q)", exp(s->nll_q));
	printf("%-26s %.6f ± %.6f\n", "ln(PPL(Q)/PPL(base))", s->ln_ppl_ratio, s->ln_ppl_ratio_err);
	printf("%-26s %.6f\n", "KL mean", s->kl_mean);
	printf("%-26s %.6f\n", "KL median", s->kl_median);
	printf("%-26s %.6f\n", "KL p90", s->kl_p90);
	printf("%-26s %.6f\n", "KL p99", s->kl_p99);
	printf("%-26s %.6f\n", "KL p99.9", s->kl_p999);
	printf("%-26s %.6f\n", "KL max", s->kl_max);
	printf("%-26s %.4f%% ± %.4f%%\n", "mean delta-p", 100 * s->dp_mean, 100 * s->dp_err);
	printf("%-26s %.4f%%\n", "RMS delta-p", 100 * s->dp_rms);
	for (int k = X3_DP_NPCT - 1; k >= 0; k--) {
		char b[32];
		snprintf(b, sizeof b, "delta-p %s", dp_names[k]);
		printf("%-26s %.4f%%\n", b, 100 * s->dp_pct[k]);
	}
	printf("%-26s %.4f%% ± %.4f%%\n", "same top p", 100 * s->same_top, 100 * s->same_top_err);
}

/* The logits of the original model: computed by its forward, or read back
 * from a --save-base file (frames: "tokens" (rows, cols) I32, then
 * "logits.R0" (rows·cols, V) F32 per batch of rows from row R0). */
struct base {
	x3_model *m;
	const char *dir;        /* --model */
	x3_reader *r;           /* --base */
	const char *file;
	int64_t V;
};

/* One evaluation: the base model's logits (B) against the quantized
 * model's (q, from qdir; none: the base model's perplexity only) over the
 * rows of ids, batch rows at a time. */
struct eval {
	struct base *B;
	x3_model *q;
	const char *qdir;
	char qname[1024];       /* qdir and its patch, in messages */
	const int32_t *ids;
	long rows, cols, batch;
	long lc;                /* positions of a row with logits checked */
	int64_t V, npos;        /* vocabulary; positions with a target */
	float *lm, *lq;         /* a batch's logits, base and quantized */
	x3_klpos *pos;          /* each position's statistics */
	const char *save;       /* --save-base FILE, and its writer */
	struct outfile of;
	x3_writer *w;
};

/* the quantized model opened, the batch size (<= 0: what fits 256 MiB of
 * logits), the buffers */
static void eval_open(struct eval *e)
{
	struct x3_model_opts mo = {0};
	mo.patch_dir = patch_st;
	mo.patch_name = patch;
	if (e->qdir && x3_model_open(e->qdir, &mo, &e->q))
		die("%s", x3_errmsg());
	int64_t V = e->V;
	if (e->q && x3_model_cfg(e->q)->vocab != V)
		die("%s: vocabulary of %lld, %s has %lld", e->qdir, (long long)x3_model_cfg(e->q)->vocab,
		    e->B->dir, (long long)V);
	if (e->batch <= 0) {
		e->batch = (long)((256L << 20) / ((int64_t)e->cols * V * 4 * (e->q ? 2 : 1)));
		if (e->batch < 1)
			e->batch = 1;
	}
	if (e->batch > e->rows)
		e->batch = e->rows;
	e->lm = e->B->m ? malloc((size_t)e->batch * e->cols * V * sizeof *e->lm) : NULL;
	e->lq = e->q ? malloc((size_t)e->batch * e->cols * V * sizeof *e->lq) : NULL;
	/* positions with a target: t + 1 < cols (with --mtp, logits at
	 * t < cols - 1 of the token at t + 2) */
	e->lc = mtp ? e->cols - 1 : e->cols;
	e->npos = (int64_t)e->rows * (e->lc - 1);
	e->pos = malloc((size_t)(e->npos > 0 ? e->npos : 1) * sizeof *e->pos);
	if ((e->B->m && !e->lm) || (e->q && !e->lq) || !e->pos)
		die("out of memory for logits of %ld rows of %ld tokens", e->batch, e->cols);
	snprintf(e->qname, sizeof e->qname, "%s%s%s", e->qdir ? e->qdir : "", patch ? " patched with " : "",
	         patch ? patch : "");
}

/* --save-base FILE: its writer, and the tokens frame (with the model's
 * name and vocabulary) */
static void save_open(struct eval *e)
{
	if (x3_writer_open_fd(outfile_open(&e->of, e->save), 3, &e->w))
		die_x3("%s", e->save);
	x3_tensor t = {0};
	t.name = "tokens";
	t.dtype = X3_I32;
	t.rank = 2;
	t.shape[0] = e->rows, t.shape[1] = e->cols;
	t.data = (void *)e->ids;
	t.nbytes = (size_t)e->rows * e->cols * sizeof *e->ids;
	char vs[32];
	snprintf(vs, sizeof vs, "%lld", (long long)e->V);
	struct x3_kv kv[2] = {{"model", (char *)e->B->dir}, {"vocab", vs}};
	t.meta = kv;
	t.nmeta = 2;
	if (x3_writer_put(e->w, &t))
		die_x3("%s", e->save);
}

/* --base: the next logits frame, of the batch from row r0 (*nr rows of
 * it, at most rows - r0), checked */
static x3_tensor *base_next(const struct eval *e, long r0, long *nr)
{
	const struct base *B = e->B;
	x3_tensor *bt;
	int rc = x3_reader_next(B->r, &bt);
	char want[32];
	snprintf(want, sizeof want, "logits.%ld", r0);
	if (rc == X3_EOF)
		die("%s: ends before row %ld of %ld", B->file, r0, e->rows);
	if (rc)
		die_x3("%s", B->file);
	if (strcmp(bt->name, want) || bt->dtype != X3_F32 || bt->rank != 2 ||
	    bt->shape[1] != e->V || bt->shape[0] % e->cols || bt->shape[0] < e->cols ||
	    bt->shape[0] / e->cols > e->rows - r0)
		die("%s: frame '%s': expected '%s', F32 (a multiple of %ld rows, %lld)",
		    B->file, bt->name, want, e->cols, (long long)e->V);
	*nr = (long)(bt->shape[0] / e->cols);
	return bt;
}

/* --save-base: the base logits a of the nr rows from r0 */
static void save_logits(struct eval *e, long r0, long nr, const float *a)
{
	x3_tensor t = {0};
	char nm[32];
	snprintf(nm, sizeof nm, "logits.%ld", r0);
	t.name = nm;
	t.dtype = X3_F32;
	t.rank = 2;
	t.shape[0] = (int64_t)nr * e->cols, t.shape[1] = e->V;
	t.data = (void *)a;
	t.nbytes = (size_t)nr * e->cols * e->V * sizeof *a;
	if (x3_writer_put(e->w, &t))
		die_x3("%s", e->save);
}

/* The statistics of the nr rows rid (base logits a, quantized e->lq) into
 * pp: each position into its own slot, no reduction, so that the sums of
 * x3_kl_summarize do not depend on the threads. */
static void kl_batch(const struct eval *e, const float *a, const int32_t *rid, long nr, x3_klpos *pp)
{
	long lc = e->lc, cols = e->cols;
	int64_t V = e->V;
	const float *lq = e->q ? e->lq : NULL;
	int sh = mtp ? 2 : 1;   /* the target: the token sh after the position */
	#pragma omp parallel for if(nr * lc * V > (1 << 16)) schedule(static)
	for (long p = 0; p < nr * lc; p++) {
		if (p % lc == lc - 1)
			continue;       /* no target in this row */
		x3_kl_position(a + (size_t)p * V, lq ? lq + (size_t)p * V : NULL, V,
		               rid[p / lc * cols + p % lc + sh], &pp[p / lc * (lc - 1) + p % lc]);
	}
}

/* the result as one JSON object on stdout */
static void print_json(const struct eval *e, const x3_klstats *st)
{
	json_t *o = json_object();
	json_object_set_new(o, "model", json_string(e->B->dir));
	if (e->B->r)
		json_object_set_new(o, "base", json_string(e->B->file));
	if (e->q)
		json_object_set_new(o, "quantized", json_string(e->qdir));
	if (e->q && patch)
		json_object_set_new(o, "patch", json_string(patch));
	json_object_set_new(o, "rows", json_integer(e->rows));
	json_object_set_new(o, "cols", json_integer(e->cols));
	if (mtp)
		json_object_set_new(o, "mtp", json_true());
	json_object_set_new(o, "positions", json_integer(e->npos));
	json_object_set_new(o, "nll", num(st->nll_base));
	json_object_set_new(o, "perplexity", num(exp(st->nll_base)));
	if (e->q) {
		json_object_set_new(o, "nll_quantized", num(st->nll_q));
		json_object_set_new(o, "perplexity_quantized", num(exp(st->nll_q)));
		json_object_set_new(o, "kl_divergence", num(st->kl_mean));
		json_object_set_new(o, "top1_agreement", num(st->same_top));
		json_t *k = json_object();
		json_object_set_new(k, "mean", num(st->kl_mean));
		json_object_set_new(k, "median", num(st->kl_median));
		json_object_set_new(k, "p90", num(st->kl_p90));
		json_object_set_new(k, "p99", num(st->kl_p99));
		json_object_set_new(k, "p99.9", num(st->kl_p999));
		json_object_set_new(k, "max", num(st->kl_max));
		json_object_set_new(o, "kl", k);
		json_object_set_new(o, "ln_ppl_ratio", pm(st->ln_ppl_ratio, st->ln_ppl_ratio_err));
		json_t *d = json_object(), *pc = json_object();
		json_object_set_new(d, "mean", num(st->dp_mean));
		json_object_set_new(d, "uncertainty", num(st->dp_err));
		json_object_set_new(d, "rms", num(st->dp_rms));
		for (int i = 0; i < X3_DP_NPCT; i++)
			json_object_set_new(pc, dp_names[i], num(st->dp_pct[i]));
		json_object_set_new(d, "percentiles", pc);
		json_object_set_new(o, "delta_p", d);
		json_object_set_new(o, "same_top_p", pm(st->same_top, st->same_top_err));
	}
	json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
	printf("\n");
	json_decref(o);
}

static void evaluate(struct base *B, const char *qdir, const int32_t *ids, long rows,
                     long cols, long batch, const char *save, int table)
{
	struct eval e = {
		.B = B, .qdir = qdir, .ids = ids, .rows = rows, .cols = cols, .batch = batch, .V = B->V,
		.save = save,
	};
	eval_open(&e);
	if (save)
		save_open(&e);
	double t0 = x3_now();
	int64_t done = 0;
	for (long r0 = 0; r0 < rows;) {
		long nr = rows - r0 < e.batch ? rows - r0 : e.batch;
		x3_tensor *bt = B->r ? base_next(&e, r0, &nr) : NULL;
		float *a = bt ? bt->data : e.lm;
		const int32_t *rid = ids + (size_t)r0 * cols;
		if (B->m)
			forward_logits(B->m, B->dir, rid, nr, cols, e.lm, X3_LOGITS_ALL);
		if (e.w)
			save_logits(&e, r0, nr, a);
		check_logits(a, nr, e.lc, e.V, r0, B->r ? B->file : B->dir);
		if (e.q) {
			forward_logits(e.q, qdir, rid, nr, cols, e.lq, X3_LOGITS_ALL);
			check_logits(e.lq, nr, e.lc, e.V, r0, e.qname);
		}
		kl_batch(&e, a, rid, nr, e.pos + done);
		done += (int64_t)nr * (e.lc - 1);
		x3_tensor_free(bt);
		r0 += nr;
		double dt = x3_now() - t0;
		progress("%ld/%ld rows, %.0f tokens/s", r0, rows, dt > 0 ? (double)r0 * cols / dt : 0.0);
	}
	progress_done();
	if (!e.npos)
		die(mtp ? "--mtp: rows of two tokens predict nothing: use --cols 3 or more"
		        : "rows of one token predict nothing: use --cols 2 or more");
	x3_klstats st;
	if (x3_kl_summarize(e.pos, e.npos, &st))
		die_x3("statistics");
	if (e.w) {
		if (x3_writer_close(e.w))
			die_x3("%s", save);
		outfile_commit(&e.of);
	}
	if (table)
		print_table(&st, e.q != NULL);
	else
		print_json(&e, &st);
	free(e.lm), free(e.lq), free(e.pos);
	if (e.q)
		x3_model_close(e.q);
}

/* --base FILE: the tokens frame; the reader is left at the first logits */
static int32_t *base_open(struct base *B, const char *file, long *rows, long *cols)
{
	B->file = file;
	if (x3_reader_open(file, &B->r))
		die_x3("%s", file);
	x3_tensor *t;
	int rc = x3_reader_next(B->r, &t);
	if (rc == X3_EOF)
		die("%s: empty (not a --save-base file)", file);
	if (rc)
		die_x3("%s", file);
	int64_t V;
	if (strcmp(t->name, "tokens") || t->dtype != X3_I32 || t->rank != 2 || t->shape[1] < 2 ||
	    x3_meta_get_i64(t, "vocab", &V) || V < 1)
		die("%s: the first frame is not model-eval --save-base's 'tokens' (I32 rows x cols, vocab)", file);
	B->V = V;
	const char *m = x3_meta_get(t, "model");
	B->dir = m ? strdup(m) : file;
	*cols = (long)t->shape[1];
	*rows = (long)t->shape[0];
	int32_t *ids = malloc(t->nbytes);
	if (!ids)
		die("out of memory");
	memcpy(ids, t->data, t->nbytes);
	x3_tensor_free(t);
	return ids;
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
	       O_STRICT, O_GEN, O_PROMPT, O_IDS, O_DEV, O_SAVE, O_BASE, O_TABLE, O_PATCH, O_MTP };
	static const struct option lo[] = {
		{ "model", required_argument, 0, O_MODEL }, { "quantized", required_argument, 0, O_QUANT },
		{ "text", required_argument, 0, O_TEXT }, { "tokens", required_argument, 0, O_TOKENS },
		{ "rows", required_argument, 0, O_ROWS }, { "cols", required_argument, 0, O_COLS },
		{ "split", required_argument, 0, O_SPLIT }, { "batch", required_argument, 0, O_BATCH },
		{ "strict", no_argument, 0, O_STRICT }, { "generate", required_argument, 0, O_GEN },
		{ "prompt", required_argument, 0, O_PROMPT }, { "ids", no_argument, 0, O_IDS },
		{ "device", required_argument, 0, O_DEV }, { "help", no_argument, 0, 'h' },
		{ "save-base", required_argument, 0, O_SAVE }, { "base", required_argument, 0, O_BASE },
		{ "table", no_argument, 0, O_TABLE }, { "patch", required_argument, 0, O_PATCH },
		{ "mtp", no_argument, 0, O_MTP }, { 0, 0, 0, 0 },
	};
	const char *model = NULL, *qdir = NULL, *tokens = NULL, *prompt = NULL, *save = NULL, *basef = NULL;
	int table = 0, set_rc = 0;
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
		case O_ROWS: set_rc = 1; rows = parse_long(usage, "--rows", optarg, 1, 100000000); break;
		case O_COLS: set_rc = 1; cols = parse_long(usage, "--cols", optarg, 2, 10000000); break;
		case O_BATCH: set_rc = 1; batch = parse_long(usage, "--batch", optarg, 1, 1000000); break;
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
		case O_SAVE: save = optarg; break;
		case O_BASE: basef = optarg; break;
		case O_TABLE: table = 1; break;
		case O_PATCH: patch = optarg; break;
		case O_MTP: mtp = 1; break;
		default: fputs(usage, stderr); return 2;
		}
	}
	for (int i = optind; i < argc; i++)
		texts[ntexts++] = argv[i];
	if (patch && !qdir)
		usage_error(usage, "--patch needs --quantized DIR (the model it patches)");
	if (patch)
		patch_st = patch_source(patch);
	if (mtp && (basef || save || gen >= 0))
		usage_error(usage, "--mtp does not go with --base, --save-base or --generate");
	if (basef) {
		if (model || ntexts || tokens || gen >= 0 || save || set_rc || split != X3_SPLIT_WHOLE || strict)
			usage_error(usage, "--base FILE replaces --model and the text: it takes only "
			            "--quantized, --patch, --table, --device and -q");
		if (!qdir)
			usage_error(usage, "--base needs --quantized DIR");
		device = device_resolve(want_device);
		struct base B = {0};
		int32_t *tk = base_open(&B, basef, &rows, &cols);
		evaluate(&B, qdir, tk, rows, cols, 0, NULL, table);
		x3_reader_close(B.r);
		free(tk);
		free(texts);
		check_stdout();
		return 0;
	}
	if (!model)
		usage_error(usage, "--model is required");
	if (gen >= 0 && (save || table))
		usage_error(usage, "--save-base and --table do not go with --generate");
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
		long dflt_cols = cfg.max_pos < 2048 ? (long)cfg.max_pos : 2048;
		if (cols <= 0 && !tokens)
			cols = dflt_cols;
		int32_t *tk = get_rows(model, texts, ntexts, tokens, split, &rows, &cols, dflt_cols, strict);
		struct base B = {0};
		B.dir = model;
		if (x3_model_open(model, NULL, &B.m))
			die("%s", x3_errmsg());
		B.V = x3_model_cfg(B.m)->vocab;
		evaluate(&B, qdir, tk, rows, cols, batch, save, table);
		x3_model_close(B.m);
		free(tk);
	}
	free(texts);
	check_stdout();
	return 0;
}
