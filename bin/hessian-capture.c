/* hessian-capture: input Hessians H = Σ xᵀx of every linear of a model over
 * calibration text (exl3(5) §10), or merged from Hessian streams, or from
 * activation frames. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include "util.h"
#include "util-device.h"
#include "calib.h"
#include "frame.h"
#include "io.h"
#include "jsonw.h"
#include "device.h"
#include "hessian.h"
#include "hessian_merge.h"
#include "moe_fallback.h"
#include "model.h"
#include "safetensors.h"
#include "tokenizer.h"

static const char usage[] =
	"usage: hessian-capture --model DIR (--text FILE... | --tokens FRAMES) [--rows R]\n"
	"                       [--cols C] [--layers A-B] [--quantized DIR] [--split MODE]\n"
	"                       [--hidden-in FILE] [--hidden-out FILE] [--hidden-next FILE]\n"
	"                       [--stream] [--even-odd] [--strict] [--chunk N] [--f64]\n"
	"                       [--moe-capture routed|weighted|all] [--min-tokens N]\n"
	"                       [--report FILE] [--timing FILE]\n"
	"                       [--chunk-rows R] [--spill DIR] [--part I | --list-parts]\n"
	"                       [--device cpu|cuda|auto] [-o FILE] [--zstd[=LEVEL]] [-q]\n"
	"       hessian-capture --merge [--f64] [-o FILE] [--zstd[=LEVEL]] [FILE...]\n"
	"       hessian-capture --activations [--name NAME] [--members LIST] [--f64]\n"
	"                       [--device cpu|cuda|auto] [-o FILE] [--zstd[=LEVEL]] [FILE...]\n"
	"  --model DIR      Hugging Face model directory (an architecture that\n"
	"                   tensor-ls --architectures lists)\n"
	"  --text FILE      calibration text, plain or zstd ('-': stdin); repeatable\n"
	"  --tokens FRAMES  token-id frames instead of text ('-': stdin)\n"
	"  --rows R         calibration rows (default 250 of text, all of --tokens)\n"
	"  --cols C         tokens per row (default min(2048, max_position_embeddings);\n"
	"                   longer rows run, with a warning)\n"
	"  --split MODE     documents of a text: lines (default), blank, whole\n"
	"  --stream         cut the text into consecutive windows instead of packing\n"
	"                   one document per row\n"
	"  --even-odd       BOS/EOS around the documents of even rows only (ExLlamaV3)\n"
	"  --strict         fail when the input gives fewer than R rows\n"
	"  --layers A-B     capture layers A..B only (layer N = num_hidden_layers is the\n"
	"                   head); layers after B are not run\n"
	"  --quantized DIR  take layers < A from this EXL3 directory (sequential mode)\n"
	"  --hidden-out FILE\n"
	"                   save the hidden states entering layer A (one frame)\n"
	"  --hidden-next FILE\n"
	"                   save those entering layer B+1 (the output of B): the\n"
	"                   next capture of the same layers starts there\n"
	"  --hidden-in FILE start from hidden states saved by --hidden-out (of the\n"
	"                   same tokens, a layer <= A) instead of the embedding\n"
	"  --chunk N        tokens per forward chunk (default 4096, fewer where a\n"
	"                   chunk's activations would pass 256 MiB: whole rows, at\n"
	"                   least one)\n"
	"  --moe-capture M  experts' Hessians (mixture-of-experts models): routed\n"
	"                   (default: the rows the router sends to each), weighted\n"
	"                   (those scaled by the routing weight) or all (every token\n"
	"                   through every expert, as ExLlamaV3)\n"
	"  --min-tokens N   an expert routed fewer than N tokens gets its Hessian\n"
	"                   blended with the all-token one of the layer's first chunk\n"
	"                   (default: the hidden size)\n"
	"  --report FILE    one JSON line per expert: routed tokens, fallback used\n"
	"  --timing FILE    where the wall time went, as one JSON object: start-up,\n"
	"                   tokens, load, linears, sums, other (attention, norms,\n"
	"                   ...), write (hessian-capture(1))\n"
	"  --chunk-rows R   the calibration in chunks of R rows (default: one chunk of\n"
	"                   all): H is the sum of the chunks' sums in chunk order, the\n"
	"                   same bits however many processes captured the chunks\n"
	"  --spill DIR      with several chunks, keep each Hessian's total of the\n"
	"                   ended chunks in a file in DIR (unlinked) while the next\n"
	"                   chunk runs: one set of sums in memory, not two. Same bits\n"
	"  --part I         capture chunk I (0, 1, ...) only and write its partial\n"
	"                   sums (F64, with the chunk's metadata) for --merge\n"
	"  --list-parts     print the chunks' numbers (one a line) and exit\n"
	"  --f64            accumulate in and write F64 (on the CPU, also with --device)\n"
	"  --device D       cpu (default), cuda or auto: where the linears of the forward\n"
	"                   and the accumulation run (cuBLAS; equal up to F32 rounding)\n"
	"  --merge          sum Hessian streams (stdin and/or files) by name; --part\n"
	"                   outputs: every chunk once, summed in chunk order\n"
	"  --activations    accumulate the Hessian of activation frames (rows x k)\n"
	"  --name NAME      Hessian name for --activations (default: the frame's\n"
	"                   'group' metadata, else its name)\n"
	"  --members LIST   members metadata for --activations\n"
	"  -o FILE          write to FILE (atomically) instead of stdout\n"
	"  --zstd[=LEVEL]   zstd-compress the output (level 1..22, default 3)\n"
	"  -q               no progress\n"
	"  -h               this help\n";


static int device = X3_DEVICE_CPU;   /* resolved --device */

static const char *spill_dir;   /* --spill DIR, or NULL */

/* --timing: wall seconds from main's start (t_main), in get_rows (t_tokens),
 * in the forward (ft: load, linears, hook, callbacks = chunk and layer
 * ends and hidden states, total), from t_fwd0 to t_fwd1 */
static double t_main, t_tokens, t_fwd0, t_fwd1;
static struct x3_forward_timing ft;
static struct { int la, lb; long rows, cols; } tm;   /* what ran, for the report */

/* A new accumulator in s: on --device, its total in --spill's DIR. */
static x3_hess *hset_add(x3_hset *s, const char *name, int64_t n, int f64, const char *members,
                         int layer)
{
	x3_hess *h;
	s->spill_dir = spill_dir;
	s->device = device;
	if (x3_hset_add(s, name, n, f64, members, layer, &h))
		die("%s", x3_errmsg());
	return h;
}

static void warn_dropped(void *ctx, const char *name, int64_t dropped, int64_t rows)
{
	(void)ctx;
	warnx("'%s': %lld of %lld rows dropped for non-finite values", name, (long long)dropped,
	      (long long)rows);
}

static void warn_starved(void *ctx, int64_t layer, int64_t min_tokens, const char *experts)
{
	(void)ctx;
	warnx("layer %lld: experts below %lld routed tokens, blended with the all-token Hessian "
	      "(expert (tokens)): %s", (long long)layer, (long long)min_tokens, experts);
}

/* Write every accumulator (and free them): a part's (pv non-NULL) with its
 * metadata, else a whole capture's, its dropped rows checked. */
static void hset_flush(x3_hset *s, x3_writer *w, x3_dtype dt, const struct x3_part_prov *pv)
{
	if (x3_hset_write(s, w, dt, pv, warn_dropped, NULL))
		die("%s", x3_errmsg());
}

/* ---- capture mode ----------------------------------------------------- */
/* --moe-capture and --min-tokens: moe_fallback.h */
/* an expert's Hessian group of the layer being captured */
struct exg {
	x3_hess *h;        /* its accumulator in the output set */
	x3_hess *shadow;   /* the all-token Hessian (not owned) */
	int expert;
	long long routed;  /* rows the router sent to it */
	double w2;         /* Σ w² over them (weighted capture): the ended
	                    * calibration chunks' sums, added in chunk order */
	double w2c;        /* ... the open chunk's */
};

struct cap {
	x3_hset set;
	x3_writer *w;
	const struct x3_part_prov *pv;   /* --part, else NULL */
	int f64, n_layers;
	double t0;
	long long ntok;
	int moe;            /* X3_MOE_* */
	int64_t top_k;      /* num_experts_per_tok */
	long min_tokens;    /* the fallback's threshold */
	struct exg *ex;     /* the expert groups open (the expert being run) */
	int nex, capex;
	x3_hset exset;      /* ... their accumulators, in first-seen order */
	x3_hset shadow;     /* the all-token accumulators open */
	x3_hess *shared_in; /* ... the one of the experts' gate/up input (the
	                     * layer's: from expert 0's rows, read by all) */
	int shared_put;     /* ... written (a part's) */
	FILE *report;       /* --report: JSON lines, or NULL */
	int nstarved;
	char starved[1024]; /* this layer's experts that used the fallback */
	size_t so;
};

static struct exg *exg_get(struct cap *k, const struct x3_capture *c)
{
	for (int i = 0; i < k->nex; i++)
		if (!strcmp(x3_hess_name(k->ex[i].h), c->name))
			return &k->ex[i];
	if (k->nex == k->capex) {
		k->capex = k->capex ? 2 * k->capex : 16;
		k->ex = realloc(k->ex, (size_t)k->capex * sizeof *k->ex);
		if (!k->ex)
			die("out of memory");
	}
	struct exg *g = &k->ex[k->nex++];
	/* the output accumulator now, so that an expert no token reaches
	 * still gets one (from its all-token rows) */
	x3_hess *h = x3_hset_find(&k->exset, c->name);
	*g = (struct exg){ h ? h : hset_add(&k->exset, c->name, c->in, k->f64, c->members, c->layer),
	                   NULL, c->expert, 0, 0, 0 };
	return g;
}

/* the rows of an expert's group (x3_capture.expert >= 0) */
static int cap_expert(struct cap *k, const struct x3_capture *c)
{
	struct exg *g = exg_get(k, c);
	if (!c->all_tokens) {
		g->routed += c->ntok;
		if (k->moe == X3_MOE_ALL)
			return X3_OK;
		if (k->moe == X3_MOE_ROUTED || !c->row_w)
			return x3_hess_add_rows(g->h, c->x, c->ntok, c->in);
		return x3_moe_add_weighted(g->h, c->x, c->row_w, c->ntok, c->in, &g->w2c);
	}
	/* every token: the block's input once for all experts' gate/up (from
	 * expert 0's rows), the down_proj input per expert */
	x3_hess *s;
	if (c->all_tokens == 2) {
		if (!k->shared_in)
			k->shared_in = hset_add(&k->shadow, c->name, c->in, k->f64, NULL, c->layer);
		g->shadow = k->shared_in;
		if (c->expert != 0)
			return X3_OK;
		s = k->shared_in;
	} else {
		if (!(s = x3_hset_find(&k->shadow, c->name)))
			s = hset_add(&k->shadow, c->name, c->in, k->f64, NULL, c->layer);
		g->shadow = s;
	}
	return x3_hess_add_rows(s, c->x, c->ntok, c->in);
}

/* Write the all-token accumulators of the shadow set (a part's, for the
 * merge's fallback: exact, F64) and free them: every one with all set,
 * else all but the layer's shared gate/up one (the experts' still to come
 * read it). Called before the expert's groups are written, so that part 0
 * carries each all-token frame before the groups that use it and the
 * merge, reading the parts in lockstep, holds it only as long as needed:
 * the shared one (complete once expert 0, whose rows it sums, is done) is
 * written once, with the first expert's, and marked all_tokens_scope=layer
 * (read by every expert's gate/up group), an expert's own ones
 * all_tokens_scope=group (read by its group of the same name alone). */
static void shadow_flush(struct cap *k, int all)
{
	int keep = 0;
	for (int i = 0; i < k->shadow.n; i++) {
		x3_hess *h = k->shadow.h[i];
		int shared = h == k->shared_in;
		if (k->pv && k->moe != X3_MOE_ALL && !(shared && k->shared_put)) {
			if (x3_part_put_all_tokens(k->w, h, shared, k->pv))
				die("%s", x3_errmsg());
			k->shared_put |= shared;
		}
		if (!all && shared) {
			k->shadow.h[keep++] = h;
			continue;
		}
		x3_hess_free(h);
	}
	k->shadow.n = keep;
	if (all) {
		k->shared_in = NULL;
		k->shared_put = 0;
	}
}

/* The Hessians of the expert just run (the forward runs the experts one
 * at a time, model.h x3_forward_opts.expert_done; chunk-major: every
 * expert of the layer), each group finished (moe_fallback.h: the
 * all-token Hessian, or the routed one with the fallback below
 * --min-tokens) and named in the summary and --report; written and freed,
 * with the expert's own all-token sums: one expert's sums are held at a
 * time. */
static void cap_experts_finish(struct cap *k, int layer)
{
	for (int i = 0; i < k->nex; i++) {
		struct exg *g = &k->ex[i];
		long long n = g->routed;
		struct x3_moe_group mg = { g->expert, g->routed, g->w2 };
		int64_t fb;
		if (x3_moe_group_finish(g->h, g->shadow, &mg, k->moe, k->min_tokens, k->top_k, k->f64,
		                        k->pv != NULL, &fb))
			die("%s", x3_errmsg());
		/* a part (routed, weighted) writes its raw sums: the blend is the
		 * merge's, after the parts' sums are added */
		if (k->pv && k->moe != X3_MOE_ALL)
			continue;
		/* one line per expert (its first group): the summary and --report */
		int first = 1;
		for (int j = 0; j < i && first; j++)
			first = k->ex[j].expert != g->expert;
		if (!first)
			continue;
		if (fb) {
			k->nstarved++;
			if (k->so < sizeof k->starved - 32)
				k->so += (size_t)snprintf(k->starved + k->so, sizeof k->starved - k->so, "%s%d (%lld)",
				                          k->so ? ", " : "", g->expert, n);
		}
		if (k->report)
			fprintf(k->report, "{\"layer\":%d,\"expert\":%d,\"capture\":\"%s\",\"routed_tokens\":%lld,"
			        "\"fallback\":%s,\"fallback_tokens\":%lld}\n", layer, g->expert,
			        x3_moe_capture_name(k->moe), n, fb ? "true" : "false", (long long)fb);
	}
	k->nex = 0;
	/* a part with the layer's all-token Hessians (part 0) passes them on,
	 * exact, for the merge's fallback, before the groups that use them */
	shadow_flush(k, 0);
	/* a part's sums are written exactly (F64) for the merge */
	hset_flush(&k->exset, k->w, k->f64 || k->pv ? X3_F64 : X3_F32, k->pv);
}

/* The forward's expert_done: expert -1, the groups before the experts are
 * complete (written now, before the experts'); else expert e is done. */
static int cap_expert_done(void *ctx, int layer, int expert)
{
	struct cap *k = ctx;
	if (expert < 0)
		hset_flush(&k->set, k->w, k->f64 || k->pv ? X3_F64 : X3_F32, k->pv);
	else
		cap_experts_finish(k, layer);
	return X3_OK;
}

static int cap_hook(void *ctx, const struct x3_capture *c)
{
	struct cap *k = ctx;
	if (c->expert >= 0)
		return cap_expert(k, c);
	x3_hess *h = x3_hset_find(&k->set, c->name);
	if (!h) {
		h = hset_add(&k->set, c->name, c->in, k->f64, c->members, c->layer);
		/* the head of a tied model reads the embedding matrix */
		if (c->tied && x3_hess_set_meta(h, "tied", c->tied))
			return X3_ENOMEM;
	}
	return x3_hess_add_rows(h, c->x, c->ntok, c->in);
}

/* --hidden-out: the hidden states entering the first captured layer, as
 * one frame "hidden" (rows, cols, hidden) with the layer and a hash of the
 * token ids, for a later --hidden-in; --hidden-next: those entering the
 * layer after the last captured one (the forward's output there) */
struct hid {
	const char *out, *next;
	int layer, next_layer;
	int64_t rows, cols;
	char tokens[17];
};

static const char *hid_next;   /* --hidden-next FILE, or NULL */

static void tokens_hash(const int32_t *ids, int64_t n, char hex[17])
{
	snprintf(hex, 17, "%016llx", (unsigned long long)XXH3_64bits(ids, (size_t)n * sizeof *ids));
}

static void hid_write(const struct hid *h, const char *path, int layer, const float *x, int64_t hidden)
{
	int64_t shape[3] = { h->rows, h->cols, hidden };
	x3_tensor *t = x3_tensor_new("hidden", X3_F32, 3, shape, 0);
	if (!t || x3_meta_setf(t, "role", "hidden") || x3_meta_setf(t, "layer", "%d", layer) ||
	    x3_meta_set(t, "tokens_xxh3", h->tokens))
		die_x3("%s", path);
	t->data = (void *)x;
	struct outfile of;
	x3_writer *w;
	if (x3_writer_open_fd(outfile_open(&of, path), 0, &w) || x3_writer_put(w, t) ||
	    x3_writer_close(w))
		die_x3("%s", path);
	outfile_commit(&of);
	t->data = NULL;
	x3_tensor_free(t);
}

static int hid_save(void *ctx, int layer, const float *x, int64_t ntok, int64_t hidden)
{
	struct hid *h = ctx;
	(void)ntok;
	if (layer == h->layer && h->out)
		hid_write(h, h->out, layer, x, hidden);
	if (layer == h->next_layer && h->next)
		hid_write(h, h->next, layer, x, hidden);
	return X3_OK;
}

/* --hidden-in: the saved hidden states (the forward runs in their buffer) */
static float *hid_load(const char *path, const struct hid *want, int64_t hidden, int la, int *layer)
{
	x3_reader *r;
	x3_tensor *t;
	if (x3_reader_open(path, &r))
		die_x3("%s", path);
	if (x3_reader_next(r, &t))
		die_x3("%s", path);
	const char *tok = x3_meta_get(t, "tokens_xxh3");
	int64_t l = -1;
	x3_meta_get_i64(t, "layer", &l);
	if (strcmp(t->name, "hidden") || t->dtype != X3_F32 || l < 0)
		die("%s: not a --hidden-out frame (F32 'hidden' with a layer)", path);
	if (t->rank != 3 || t->shape[0] != want->rows || t->shape[1] != want->cols || t->shape[2] != hidden)
		die("%s: hidden states are not %lldx%lldx%lld (rows x cols x hidden)", path,
		    (long long)want->rows, (long long)want->cols, (long long)hidden);
	if (!tok || strcmp(tok, want->tokens))
		die("%s: the hidden states are of other tokens", path);
	if (l > la)
		die("%s: the hidden states enter layer %lld, after the first captured layer %d",
		    path, (long long)l, la);
	float *x = t->data;
	t->data = NULL;
	t->owns_data = 0;
	x3_tensor_free(t);
	x3_reader_close(r);
	*layer = (int)l;
	return x;
}

/* a calibration chunk has run through the layer: its sums join the totals */
static int cap_seg_done(void *ctx, int layer, int64_t seg)
{
	struct cap *k = ctx;
	(void)layer, (void)seg;
	for (int i = 0; i < k->nex; i++) {   /* Σ w², chunk by chunk like H */
		k->ex[i].w2 += k->ex[i].w2c;
		k->ex[i].w2c = 0;
	}
	/* (an expert-major layer calls this once per pass over the rows:
	 * ending the chunk of a sum that got no rows since does nothing) */
	for (int i = 0; i < k->set.n; i++) {
		int rc = x3_hess_end_chunk(k->set.h[i]);
		if (rc)
			return rc;
	}
	for (int i = 0; i < k->exset.n; i++) {
		int rc = x3_hess_end_chunk(k->exset.h[i]);
		if (rc)
			return rc;
	}
	/* the all-token sums too, so that --moe-capture all sums them chunk
	 * by chunk, ((P0 + P1) + P2) ..., as the merge of parts does */
	for (int i = 0; i < k->shadow.n; i++) {
		int rc = x3_hess_end_chunk(k->shadow.h[i]);
		if (rc)
			return rc;
	}
	return X3_OK;
}

static int cap_layer_done(void *ctx, int layer, int n)
{
	struct cap *k = ctx;
	cap_experts_finish(k, layer);   /* none left but in chunk-major order */
	if (k->so)
		warn_starved(NULL, layer, k->min_tokens, k->starved);
	k->so = 0;
	k->starved[0] = 0;
	shadow_flush(k, 1);
	/* the groups after the experts (the shared expert's), or all of a
	 * dense layer's; a part's sums are written exactly (F64) for the merge */
	hset_flush(&k->set, k->w, k->f64 || k->pv ? X3_F64 : X3_F32, k->pv);
	double dt = x3_now() - k->t0;
	progress("layer %d/%d done, %.0f tokens/s", layer, n,
	         dt > 0 ? (double)k->ntok * (layer + 1) / dt : 0.0);
	return X3_OK;
}

static void parse_layers(const char *s, int *a, int *b)
{
	char *end;
	long x = strtol(s, &end, 10), y = x;
	if (end == s || x < 0)
		usage_error(usage, "--layers: '%s' is not A-B", s);
	if (*end == '-') {
		const char *p = end + 1;
		y = *p ? strtol(p, &end, 10) : -1;   /* "A-": to the head */
		if ((*p && (end == p || y < x)))
			usage_error(usage, "--layers: '%s' is not A-B", s);
		if (!*p)
			end = (char *)p;
	}
	if (*end)
		usage_error(usage, "--layers: '%s' is not A-B", s);
	*a = (int)x, *b = (int)(y > 1000000 ? 1000000 : y);
}

/* Token rows from --text (packed with the model's tokenizer) or --tokens. */
static int32_t *get_rows(const char *model, char **texts, int ntexts, const char *tokens,
                         int split, int stream, int even_odd, long *rows, long *cols, long dflt_cols,
                         int strict)
{
	int32_t *ids = NULL;
	long want = *rows;
	if (tokens) {
		size_t n = 0;
		int64_t last = 0;
		if (x3_tokens_read(tokens, &ids, &n, &last))
			die_x3("%s", tokens);
		if (*cols <= 0)   /* the frames' row length; none (empty): as for text */
			*cols = last > 0 ? (long)last : dflt_cols;
		long have = (long)(n / (size_t)*cols);
		if (want <= 0) {
			if (!have)
				die("%s: %zu tokens, fewer than one row of %ld", tokens, n, *cols);
			*rows = have;
		} else if (have < want) {
			if (strict || have == 0)
				die("%s: %zu tokens give %ld rows of %ld, fewer than the %ld requested",
				    tokens, n, have, *cols, want);
			warnx("%s: %zu tokens give only %ld rows of %ld (of %ld requested); using them",
			      tokens, n, have, *cols, want);
			*rows = have;
		}
		return ids;
	}
	if (want <= 0)
		want = *rows = 250;
	x3_tok *tok;
	if (x3_tok_load(model, &tok))
		die_x3("%s: tokenizer", model);
	struct x3_tok_pack_opts po;
	x3_tok_pack_defaults(tok, &po);
	po.mode = stream ? X3_PACK_STREAM : X3_PACK_ARTICLES;
	po.even_odd = even_odd;
	size_t got = 0;
	if (x3_text_rows(tok, texts, ntexts, split, &po, (size_t)want, (size_t)*cols, &ids, &got))
		die_x3("calibration text");
	if ((long)got < want) {
		if (strict || got == 0)
			die("calibration text gives %zu rows of %ld tokens, fewer than the %ld requested",
			    got, *cols, want);
		warnx("calibration text gives only %zu rows of %ld tokens (of %ld requested); "
		      "using them", got, *cols, want);
		*rows = (long)got;
	}
	x3_tok_free(tok);
	return ids;
}

/* --timing FILE: one JSON object, written atomically once the output is
 * complete. The phases add up to seconds: start (main's start to the
 * forward, the tokens' reading aside), tokens, load, linears, sums (the
 * capture hook), other (the rest of the forward), write (chunk and layer
 * ends: sums merged, spilled, converted and written; hidden states saved;
 * the output closed). */
static void timing_write(const char *file)
{
	double t_end = x3_now();
	double fwd = t_fwd1 - t_fwd0;
	double other = ft.total - ft.load - ft.linears - ft.hook - ft.callbacks;
	x3_jw jw = X3_JW_INIT;
	json_t *o = json_object(), *t = json_object();
	x3_jw_set_str(&jw, o, "program", "hessian-capture");
	x3_jw_set(&jw, o, "layers", json_pack("[i, i]", tm.la, tm.lb));
	x3_jw_set(&jw, o, "rows", json_integer(tm.rows));
	x3_jw_set(&jw, o, "cols", json_integer(tm.cols));
	x3_jw_set_str(&jw, o, "device", x3_device_name(device));
	x3_jw_set(&jw, o, "seconds", json_real(t_end - t_main));
	x3_jw_set(&jw, t, "start", json_real(t_fwd0 - t_main - t_tokens));
	x3_jw_set(&jw, t, "tokens", json_real(t_tokens));
	x3_jw_set(&jw, t, "load", json_real(ft.load));
	x3_jw_set(&jw, t, "linears", json_real(ft.linears));
	x3_jw_set(&jw, t, "sums", json_real(ft.hook));
	x3_jw_set(&jw, t, "other", json_real(other > 0 ? other : 0));
	x3_jw_set(&jw, t, "write", json_real(ft.callbacks + (fwd - ft.total) + (t_end - t_fwd1)));
	x3_jw_set(&jw, o, "timing", json_incref(t));
	char *txt = x3_jw_dump(&jw, o, JSON_COMPACT | JSON_REAL_PRECISION(6), file, NULL);
	json_decref(t);
	json_decref(o);
	if (!txt)
		die_x3("--timing %s", file);
	size_t n = strlen(txt);
	txt[n] = '\n';   /* the terminator's place: the line ends, no NUL written */
	if (x3_write_file_atomic(file, txt, n + 1))
		die_x3("--timing %s", file);
	free(txt);
}

static int do_capture(const char *model, const char *quant, char **texts, int ntexts,
                      const char *tokens, long rows, long cols, int la, int lb, int split,
                      int stream, int even_odd, int strict, long chunk, int f64,
                      long chunk_rows, long part, const char *hid_in, const char *hid_out,
                      int moe, long min_tokens, const char *report, x3_writer *w)
{
	x3_model_config cfg;
	if (x3_config_load(model, &cfg))
		die("%s", x3_errmsg());
	int n = (int)cfg.n_layers;
	if (lb < 0)   /* no --layers: to the head */
		lb = n;
	if (la > n || lb > n)
		die("--layers: layer %d does not exist (the model has %d layers, 0-%d, and %d is the head)",
		    la > n ? la : lb, n, n - 1, n);
	/* one dense linear's F32 weight at a time (model.h): the capture's
	 * peak memory is the Hessians and the hidden states, not a layer's
	 * weights */
	struct x3_model_opts mo = { .weights_on_use = 1 };
	if (quant) {
		mo.overlay_dir = quant;
		mo.overlay_first = 0;
		mo.overlay_last = la - 1;
	}
	x3_model *m;
	if (x3_model_open(model, &mo, &m))
		die("%s", x3_errmsg());
	long dflt_cols = cfg.max_pos < 2048 ? (long)cfg.max_pos : 2048;
	if (cols <= 0 && !tokens)
		cols = dflt_cols;
	double tt = x3_now();
	int32_t *ids = get_rows(model, texts, ntexts, tokens, split, stream, even_odd, &rows, &cols,
	                        dflt_cols, strict);
	t_tokens = x3_now() - tt;
	if (cols > cfg.max_pos)
		warnx("rows of %ld tokens are longer than max_position_embeddings (%lld)",
		      cols, (long long)cfg.max_pos);

	/* the calibration's chunks: fixed by it, whatever runs them */
	long crow = chunk_rows > 0 && chunk_rows < rows ? chunk_rows : rows;
	long nchunks = (rows + crow - 1) / crow;
	if (part == -2) {   /* --list-parts */
		for (long i = 0; i < nchunks; i++)
			if (printf("%ld\n", i) < 0)
				die("stdout: %s", strerror(errno));
		free(ids);
		x3_model_close(m);
		return 0;
	}
	struct x3_part_prov pv;
	const int32_t *pids = ids;
	if (part >= 0) {
		if (part >= nchunks)
			die("--part %ld: the calibration's %ld rows make %ld chunk%s of %ld rows (0-%ld)",
			    part, rows, nchunks, nchunks > 1 ? "s" : "", crow, nchunks - 1);
		char hash[17];
		tokens_hash(ids, (int64_t)rows * cols, hash);
		x3_part_prov_set(&pv, part, nchunks, crow, rows, hash, f64);
		/* the part's rows alone run (their activations do not depend on
		 * the others: lib/common/blas.h, x3_forward_opts.seg_rows) */
		pids = ids + (size_t)part * crow * cols;
		rows = rows - part * crow < crow ? rows - part * crow : crow;
	}

	struct cap k = { .w = w, .pv = part >= 0 ? &pv : NULL, .f64 = f64, .n_layers = n,
	                 .t0 = x3_now(), .ntok = (long long)rows * cols,
	                 .moe = moe, .top_k = cfg.n_experts_tok, .min_tokens = min_tokens < 0 ? (long)cfg.hidden : min_tokens };
	if (k.min_tokens < 1)   /* an expert no token reaches always falls back */
		k.min_tokens = 1;
	char *rbuf = NULL;
	size_t rlen = 0;
	if (report && !(k.report = open_memstream(&rbuf, &rlen)))
		die("%s: %s", report, strerror(errno));
	struct x3_forward_opts fo;
	x3_forward_opts_init(&fo, m);
	fo.hook = cap_hook;
	fo.hook_ctx = &k;
	fo.hook_first = la;
	fo.hook_last = lb;
	fo.last_layer = lb;
	/* a forward chunk's activations within 256 MiB, so that at an 8B
	 * Llama's width they do not outgrow the Hessians */
	if (chunk <= 0)
		chunk = (long)x3_config_chunk_tokens(&cfg);
	fo.chunk_tokens = chunk;
	fo.seg_rows = crow;
	fo.seg_done = cap_seg_done;
	fo.seg_done_ctx = &k;
	fo.layer_done = cap_layer_done;
	fo.layer_done_ctx = &k;
	/* a mixture-of-experts layer's experts written one by one */
	fo.expert_done = cap_expert_done;
	fo.expert_done_ctx = &k;
	struct hid hd = { .out = hid_out, .next = hid_next, .layer = la, .next_layer = lb + 1,
	                  .rows = rows, .cols = cols };
	tokens_hash(pids, (int64_t)rows * cols, hd.tokens);
	fo.layer_input = hid_save;
	fo.layer_input_ctx = &hd;
	if (hid_in)
		fo.hidden = hid_load(hid_in, &hd, cfg.hidden, la, &fo.first_layer);
	fo.device = device;
	/* the all-token Hessians: of every chunk for --moe-capture all, else of
	 * the first chunk of each layer (the fallback's) */
	fo.moe_all_tokens = cfg.n_experts <= 0 ? 0 : moe == X3_MOE_ALL ? INT64_MAX : part > 0 ? 0 : 1;
	fo.timing = &ft;
	t_fwd0 = x3_now();
	if (x3_model_forward(m, pids, rows, cols, &fo))
		die_x3("%s: forward", model);
	t_fwd1 = x3_now();
	tm.la = la, tm.lb = lb, tm.rows = rows, tm.cols = cols;
	progress_done();
	if (cfg.n_experts > 0 && !quiet && (part < 0 || moe == X3_MOE_ALL))
		fprintf(stderr, "%s: experts (%s capture): %d below %ld routed tokens used the fallback\n",
		        progname, x3_moe_capture_name(moe), k.nstarved, k.min_tokens);
	if (k.report) {
		/* written whole (atomically) once the capture is complete */
		if (fclose(k.report) || x3_write_file_atomic(report, rbuf ? rbuf : "", rlen))
			die_x3("%s", report);
		free(rbuf);
	}
	free(k.ex);
	free(k.exset.h);
	free(k.shadow.h);
	free(fo.hidden);
	free(ids);
	free(k.set.h);
	x3_model_close(m);
	return 0;
}

/* ---- merge and activations modes -------------------------------------- */
static void do_merge(char **files, int nfiles, int f64, x3_writer *w)
{
	static const char *const dash[] = { "-" };
	struct x3_merge_opts o = { .f64 = f64, .spill_dir = spill_dir, .dropped = warn_dropped,
	                           .starved = warn_starved };
	if (x3_hess_merge(nfiles ? (const char *const *)files : dash, nfiles ? nfiles : 1, &o, w))
		die("%s", x3_errmsg());
}

static void do_activations(char **files, int nfiles, const char *name, const char *members,
                           int f64, x3_writer *w)
{
	x3_hset s = { 0 };
	static char *dash[] = { "-" };
	if (!nfiles)
		files = dash, nfiles = 1;
	for (int i = 0; i < nfiles; i++) {
		x3_reader *r;
		if (x3_reader_open(files[i], &r))
			die_x3("%s", files[i]);
		x3_tensor *t;
		int rc;
		while ((rc = x3_reader_next(r, &t)) == X3_OK) {
			if (t->rank < 1 || t->rank > 2 || x3_tensor_numel(t) == 0)
				die("%s: frame '%s': activations must be rows x k", files[i], t->name);
			if (t->dtype != X3_F32 && t->dtype != X3_F16 && t->dtype != X3_BF16 &&
			    t->dtype != X3_F64)
				die("%s: frame '%s': dtype %s is not a float type", files[i], t->name,
				    x3_dtype_name(t->dtype));
			int64_t k = t->shape[t->rank - 1], rows = t->rank == 2 ? t->shape[0] : 1;
			const char *g = name ? name : x3_meta_get(t, "group");
			if (!g)
				g = t->name;
			const char *mem = members ? members : x3_meta_get(t, "members");
			x3_hess *h = x3_hset_find(&s, g);
			if (!h) {
				int64_t layer = -1;
				x3_meta_get_i64(t, "layer", &layer);
				h = hset_add(&s, g, k, f64, mem, (int)layer);
			}
			float *x = x3_tensor_f32(t);
			if (!x)
				die_x3("%s: frame '%s'", files[i], t->name);
			if (x3_hess_add_rows(h, x, rows, k))
				die_x3("%s: frame '%s'", files[i], t->name);
			free(x);
			x3_tensor_free(t);
		}
		if (rc != X3_EOF)
			die_x3("%s", files[i]);
		x3_reader_close(r);
	}
	if (!s.n)
		die("no activation frames in the input");
	hset_flush(&s, w, f64 ? X3_F64 : X3_F32, NULL);
	free(s.h);
}

int main(int argc, char **argv)
{
	t_main = x3_now();
	prog_init(argc, argv);
	enum { O_MODEL = 256, O_TEXT, O_TOKENS, O_ROWS, O_COLS, O_LAYERS, O_QUANT, O_F64,
	       O_MERGE, O_ACT, O_NAME, O_MEMBERS, O_SPLIT, O_STREAM, O_STRICT, O_CHUNK, O_ZSTD, O_EVEN,
	       O_HIN, O_HOUT, O_HNEXT, O_DEV, O_MOE, O_MINTOK, O_REPORT, O_CROWS, O_PART, O_LPARTS, O_SPILL,
	       O_TIMING };
	static const struct option lo[] = {
		{ "model", required_argument, 0, O_MODEL }, { "text", required_argument, 0, O_TEXT },
		{ "tokens", required_argument, 0, O_TOKENS }, { "rows", required_argument, 0, O_ROWS },
		{ "cols", required_argument, 0, O_COLS }, { "layers", required_argument, 0, O_LAYERS },
		{ "quantized", required_argument, 0, O_QUANT }, { "f64", no_argument, 0, O_F64 },
		{ "merge", no_argument, 0, O_MERGE }, { "activations", no_argument, 0, O_ACT },
		{ "name", required_argument, 0, O_NAME }, { "members", required_argument, 0, O_MEMBERS },
		{ "split", required_argument, 0, O_SPLIT }, { "stream", no_argument, 0, O_STREAM },
		{ "strict", no_argument, 0, O_STRICT }, { "chunk", required_argument, 0, O_CHUNK },
		{ "zstd", optional_argument, 0, O_ZSTD }, { "even-odd", no_argument, 0, O_EVEN },
		{ "hidden-in", required_argument, 0, O_HIN }, { "hidden-out", required_argument, 0, O_HOUT },
		{ "hidden-next", required_argument, 0, O_HNEXT },
		{ "device", required_argument, 0, O_DEV }, { "help", no_argument, 0, 'h' },
		{ "moe-capture", required_argument, 0, O_MOE }, { "min-tokens", required_argument, 0, O_MINTOK },
		{ "report", required_argument, 0, O_REPORT },
		{ "chunk-rows", required_argument, 0, O_CROWS }, { "part", required_argument, 0, O_PART },
		{ "list-parts", no_argument, 0, O_LPARTS }, { "spill", required_argument, 0, O_SPILL },
		{ "timing", required_argument, 0, O_TIMING },
		{ 0, 0, 0, 0 },
	};
	const char *outfile = NULL, *model = NULL, *tokens = NULL, *quant = NULL, *name = NULL, *members = NULL;
	const char *hid_in = NULL, *hid_out = NULL;
	char **texts = calloc((size_t)argc + 1, sizeof *texts);
	int ntexts = 0, f64 = 0, merge = 0, act = 0, la = 0, lb = -1, have_layers = 0;
	int split = X3_SPLIT_LINES, stream = 0, even_odd = 0, strict = 0, zlevel = 0;
	int want_device = X3_DEVICE_CPU, have_device = 0;
	long rows = 0, cols = 0, chunk = 0, min_tokens = -1, chunk_rows = 0, part = -1;
	int moe = X3_MOE_ROUTED, have_moe = 0, lparts = 0;
	const char *report = NULL, *timing = NULL;
	int c;
	while ((c = getopt_long(argc, argv, "hqo:", lo, NULL)) != -1) {
		switch (c) {
		case 'h': fputs(usage, stdout); return 0;
		case 'q': quiet = 1; break;
		case 'o': outfile = optarg; break;
		case O_ZSTD: zlevel = optarg ? (int)parse_long(usage, "--zstd", optarg, 1, 22) : 3; break;
		case O_MODEL: model = optarg; break;
		case O_TEXT: texts[ntexts++] = optarg; break;
		case O_TOKENS: tokens = optarg; break;
		case O_ROWS: rows = parse_long(usage, "--rows", optarg, 1, 100000000); break;
		case O_COLS: cols = parse_long(usage, "--cols", optarg, 1, 10000000); break;
		case O_LAYERS: parse_layers(optarg, &la, &lb); have_layers = 1; break;
		case O_QUANT: quant = optarg; break;
		case O_F64: f64 = 1; break;
		case O_MERGE: merge = 1; break;
		case O_ACT: act = 1; break;
		case O_NAME: name = optarg; break;
		case O_MEMBERS: members = optarg; break;
		case O_SPLIT:
			if (!strcmp(optarg, "lines")) split = X3_SPLIT_LINES;
			else if (!strcmp(optarg, "blank")) split = X3_SPLIT_BLANK;
			else if (!strcmp(optarg, "whole")) split = X3_SPLIT_WHOLE;
			else usage_error(usage, "--split: '%s' is not lines, blank or whole", optarg);
			break;
		case O_STREAM: stream = 1; break;
		case O_EVEN: even_odd = 1; break;
		case O_STRICT: strict = 1; break;
		case O_CHUNK: chunk = parse_long(usage, "--chunk", optarg, 1, 1L << 30); break;
		case O_CROWS: chunk_rows = parse_long(usage, "--chunk-rows", optarg, 1, 100000000); break;
		case O_PART: part = parse_long(usage, "--part", optarg, 0, 100000000); break;
		case O_LPARTS: lparts = 1; break;
		case O_HIN: hid_in = optarg; break;
		case O_HOUT: hid_out = optarg; break;
		case O_HNEXT: hid_next = optarg; break;
		case O_SPILL: spill_dir = optarg; break;
		case O_TIMING: timing = optarg; break;
		case O_DEV: want_device = device_parse(usage, optarg); have_device = 1; break;
		case O_MOE:
			if ((moe = x3_moe_capture_parse(optarg)) < 0)
				usage_error(usage, "--moe-capture: '%s' is not routed, weighted or all", optarg);
			have_moe = 1;
			break;
		case O_MINTOK: min_tokens = parse_long(usage, "--min-tokens", optarg, 0, 1L << 40); have_moe = 1; break;
		case O_REPORT: report = optarg; have_moe = 1; break;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (merge + act > 1)
		usage_error(usage, "--merge and --activations exclude each other");
	if (merge || act) {
		if (model || tokens || ntexts || quant || have_layers || hid_in || hid_out || hid_next ||
		    chunk_rows || part >= 0 || lparts)
			usage_error(usage, "--%s takes frames, not a model or text",
			            merge ? "merge" : "activations");
		if (merge && (name || members))
			usage_error(usage, "--name and --members go with --activations");
		if (have_moe)
			usage_error(usage, "--moe-capture, --min-tokens and --report go with --model");
		if (timing)
			usage_error(usage, "--timing reports a capture: it goes with --model");
		if (merge && have_device)
			usage_error(usage, "--merge only adds frames: --device goes with a model or --activations");
	} else {
		if (!model)
			usage_error(usage, "--model is required");
		/* further operands are more text files */
		for (int i = optind; i < argc; i++)
			texts[ntexts++] = argv[i];
		if (!ntexts == !tokens)
			usage_error(usage, "give either --text or --tokens");
		if (name || members)
			usage_error(usage, "--name and --members go with --activations");
		if (quant && la == 0)
			usage_error(usage, "--quantized needs --layers A-B with A > 0");
	}
	if (lparts) {   /* text on stdout, no frames */
		if (part >= 0 || outfile || hid_out || hid_next || timing)
			usage_error(usage, "--list-parts prints the chunks: not with --part, -o, --hidden-out, "
			            "--hidden-next or --timing");
		do_capture(model, quant, texts, ntexts, tokens, rows, cols, la, lb, split, stream,
		           even_odd, strict, chunk, f64, chunk_rows, -2, hid_in, hid_out, moe,
		           min_tokens, NULL, NULL);
		if (fflush(stdout) || ferror(stdout))
			die("stdout: %s", strerror(errno));
		return 0;
	}
	device = device_resolve(want_device);
	/* -o: a temporary name beside FILE, renamed when complete */
	int fd = output_open(outfile);
	x3_writer *w;
	if (x3_writer_open_fd(fd, zlevel, &w))
		die_x3("%s", outfile ? outfile : "stdout");
	if (merge)
		do_merge(argv + optind, argc - optind, f64, w);
	else if (act)
		do_activations(argv + optind, argc - optind, name, members, f64, w);
	else
		do_capture(model, quant, texts, ntexts, tokens, rows, cols, la, lb, split, stream,
		           even_odd, strict, chunk, f64, chunk_rows, part, hid_in, hid_out, moe,
		           min_tokens, report, w);
	if (x3_writer_close(w))
		die_x3("%s", outfile ? outfile : "stdout");
	output_commit();
	if (timing)
		timing_write(timing);
	free(texts);
	return 0;
}
