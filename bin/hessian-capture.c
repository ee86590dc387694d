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

/* ---- accumulators by name (first-seen order) -------------------------- */
struct hset {
	x3_hess **h;
	int n, cap;
};

static x3_hess *hset_find(struct hset *s, const char *name)
{
	for (int i = 0; i < s->n; i++)
		if (!strcmp(x3_hess_name(s->h[i]), name))
			return s->h[i];
	return NULL;
}

static const char *spill_dir;   /* --spill DIR, or NULL */

/* --timing: wall seconds from main's start (t_main), in get_rows (t_tokens),
 * in the forward (ft: load, linears, hook, callbacks = chunk and layer
 * ends and hidden states, total), from t_fwd0 to t_fwd1 */
static double t_main, t_tokens, t_fwd0, t_fwd1;
static struct x3_forward_timing ft;
static struct { int la, lb; long rows, cols; } tm;   /* what ran, for the report */

static x3_hess *hset_add(struct hset *s, const char *name, int64_t n, int f64,
                         const char *members, int layer)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 16;
		s->h = realloc(s->h, (size_t)s->cap * sizeof *s->h);
		if (!s->h)
			die("out of memory");
	}
	x3_hess *h;
	if (x3_hess_new(name, n, f64, members, layer, &h))
		die_x3("hessian '%s'", name);
	if (spill_dir && x3_hess_spill(h, spill_dir))
		die_x3("hessian '%s'", name);
	/* F64 sums stay on the CPU (the device accumulates in fp32) */
	if (device == X3_DEVICE_CUDA && !f64 && x3_hess_set_device(h, device))
		die("%s", x3_errmsg());
	s->h[s->n++] = h;
	return h;
}

/* Where a --part output comes from: its chunk of which calibration. The
 * frames of a part carry these as metadata, and --merge checks them. */
static const char *const prov_keys[] = { "chunk", "chunks", "chunk_rows", "calib_rows",
                                         "calib_xxh3", "products" };
enum { N_PROV = sizeof prov_keys / sizeof *prov_keys };
struct prov {
	char val[N_PROV][32];
};

static int is_prov_key(const char *key)
{
	for (int i = 0; i < N_PROV; i++)
		if (!strcmp(key, prov_keys[i]))
			return 1;
	return 0;
}

/* The metadata a --part output carries for the fallback at --merge, not
 * in a whole capture's frames: an expert group's Σ w² (C99 hex, exact),
 * the threshold m, top k and its all-token Hessian's frame; an all-token
 * frame (part 0's, of the layer's first forward chunk) is marked. */
static const char *const part_keys[] = { "routed_w2", "min_tokens", "top_k", "all_tokens",
                                         "part_role" };
enum { N_PART_KEYS = sizeof part_keys / sizeof *part_keys };

/* Write every accumulator (and free them), checking the dropped rows (of
 * the whole: not in a part, pv non-NULL, whose frames get its metadata). */
static void hset_flush(struct hset *s, x3_writer *w, x3_dtype dt, const struct prov *pv)
{
	for (int i = 0; i < s->n; i++) {
		x3_hess *h = s->h[i];
		long long d = x3_hess_dropped(h), c = x3_hess_count(h);
		if (!pv && x3_hess_too_many_dropped(h))
			die("'%s': %lld of %lld rows dropped for non-finite values (more than 10%%)",
			    x3_hess_name(h), d, c + d);
		if (!pv && d)
			warnx("'%s': %lld of %lld rows dropped for non-finite values",
			      x3_hess_name(h), d, c + d);
		x3_tensor *t = x3_hess_frame(h, dt);
		if (!t)
			die_x3("'%s'", x3_hess_name(h));
		for (int j = 0; pv && j < N_PROV; j++)
			if (x3_meta_set(t, prov_keys[j], pv->val[j]))
				die_x3("'%s'", x3_hess_name(h));
		for (int j = 0; !pv && j < N_PART_KEYS; j++)   /* a merge's output: a whole capture's */
			(void)x3_meta_del(t, part_keys[j]);
		if (x3_writer_put(w, t))
			die_x3("writing '%s'", x3_hess_name(h));
		x3_tensor_free(t);
		x3_hess_free(h);
	}
	s->n = 0;
}

/* ---- capture mode ----------------------------------------------------- */
/* --moe-capture: an expert's Hessian from the rows routed to it (routed),
 * the same weighted by the routing weight (weighted: rows scaled by w, so
 * H = Σ w² xᵀx, the weight the expert's error has in the block's output),
 * or from every token as ExLlamaV3 captures experts (all) */
enum { MOE_ROUTED, MOE_WEIGHTED, MOE_ALL };
static const char *const moe_names[] = { "routed", "weighted", "all" };

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
	struct hset set;
	x3_writer *w;
	const struct prov *pv;   /* --part, else NULL */
	int f64, n_layers;
	double t0;
	long long ntok;
	int moe;            /* MOE_* */
	int64_t top_k;      /* num_experts_per_tok */
	long min_tokens;    /* the fallback's threshold */
	struct exg *ex;     /* the expert groups open (the expert being run) */
	int nex, capex;
	struct hset exset;  /* ... their accumulators, in first-seen order */
	struct hset shadow; /* the all-token accumulators open */
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
	x3_hess *h = hset_find(&k->exset, c->name);
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
		if (k->moe == MOE_ALL)
			return X3_OK;
		if (k->moe == MOE_ROUTED || !c->row_w)
			return x3_hess_add_rows(g->h, c->x, c->ntok, c->in);
		float *xw = malloc((size_t)(c->ntok * c->in) * sizeof *xw);
		if (!xw)
			return x3_err(X3_ENOMEM, "'%s': out of memory", c->name);
		for (int64_t r = 0; r < c->ntok; r++)
			g->w2c += (double)c->row_w[r] * c->row_w[r];
		for (int64_t r = 0; r < c->ntok; r++)
			for (int64_t i = 0; i < c->in; i++)
				xw[r * c->in + i] = c->row_w[r] * c->x[r * c->in + i];
		int rc = x3_hess_add_rows(g->h, xw, c->ntok, c->in);
		free(xw);
		return rc;
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
		if (!(s = hset_find(&k->shadow, c->name)))
			s = hset_add(&k->shadow, c->name, c->in, k->f64, NULL, c->layer);
		g->shadow = s;
	}
	return x3_hess_add_rows(s, c->x, c->ntok, c->in);
}

/* The fallback of an expert group h routed n < m tokens (weighted: Σ w²
 * w2 over them): H += s (m - n)/T · H_all, count m, with the all-token
 * Hessian sh of T rows taken at the output's precision (F32 unless f64);
 * s = 1, or weighted the expert's mean w² (1/k² without rows). The same
 * for one process and for --merge of parts, whose sums are the same.
 * Returns the fallback rows m - n, 0 without an all-token Hessian. */
static long long expert_blend(x3_hess *h, const x3_hess *sh, int expert, long long n, long long m,
                              int weighted, double w2, int64_t top_k, int f64)
{
	int64_t T = sh ? x3_hess_count(sh) : 0;
	const char *name = x3_hess_name(h);
	if (!T && !n)
		die("'%s': expert %d got no tokens and there is no all-token Hessian to fall back on",
		    name, expert);
	if (!T)
		return 0;
	x3_tensor *t = x3_hess_frame(sh, f64 ? X3_F64 : X3_F32);
	if (!t)
		die_x3("'%s'", name);
	double s = !weighted ? 1 : n ? w2 / (double)n : 1.0 / ((double)top_k * top_k);
	if (x3_hess_add_frame_w(h, t, s * (double)(m - n) / (double)T, m - n))
		die_x3("'%s'", name);
	x3_tensor_free(t);
	return m - n;
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
		if (k->pv && k->moe != MOE_ALL && !(shared && k->shared_put)) {
			x3_tensor *t = x3_hess_frame(h, X3_F64);
			int e = !t || x3_meta_set(t, "part_role", "all_tokens") ||
			        x3_meta_set(t, "all_tokens_scope", shared ? "layer" : "group");
			for (int j = 0; !e && j < N_PROV; j++)
				e = x3_meta_set(t, prov_keys[j], k->pv->val[j]) != 0;
			if (e)
				die_x3("'%s'", x3_hess_name(h));
			if (x3_writer_put(k->w, t))
				die_x3("writing '%s'", x3_hess_name(h));
			x3_tensor_free(t);
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
 * expert of the layer): the all-token Hessian (--moe-capture all), or
 * the routed one blended with it below --min-tokens m: H = H_routed +
 * (m - n)/T · H_all, count m (the mean of n routed rows and m - n rows of
 * the all-token mean); weighted, the all-token part at the expert's mean
 * w² (1/k² without rows: an even split of the top k), the scale of its
 * weighted rows. Written and freed, with the expert's own all-token sums:
 * one expert's sums are held at a time. */
static void cap_experts_finish(struct cap *k, int layer)
{
	for (int i = 0; i < k->nex; i++) {
		struct exg *g = &k->ex[i];
		const char *name = x3_hess_name(g->h);
		long long n = g->routed, m = k->min_tokens, fb = 0;
		/* a part (routed, weighted) writes its raw sums: the blend is the
		 * merge's, after the parts' sums are added */
		int defer = k->pv && k->moe != MOE_ALL;
		if (k->moe == MOE_ALL) {
			/* one process rounds the all-token sum once, at its output's
			 * precision; a part passes it on exact (F64), so that the
			 * merge adds the parts in chunk order and rounds once too */
			x3_tensor *t = g->shadow ? x3_hess_frame(g->shadow, k->f64 || k->pv ? X3_F64 : X3_F32) : NULL;
			if (g->shadow && !t)
				die_x3("'%s'", name);
			if (!t)
				die("'%s': no all-token rows (expert %d)", name, g->expert);
			if (x3_hess_add_frame(g->h, t))
				die_x3("'%s'", name);
			x3_tensor_free(t);
		} else if (n < m && !defer) {
			fb = expert_blend(g->h, g->shadow, g->expert, n, m, k->moe == MOE_WEIGHTED, g->w2,
			                  k->top_k, k->f64);
		}
		char v[64];
		int e = x3_hess_set_meta(g->h, "capture", moe_names[k->moe]);
		snprintf(v, sizeof v, "%d", g->expert);
		e |= x3_hess_set_meta(g->h, "expert", v);
		snprintf(v, sizeof v, "%lld", n);
		e |= x3_hess_set_meta(g->h, "routed_tokens", v);
		if (defer) {
			snprintf(v, sizeof v, "%a", g->w2);
			e |= x3_hess_set_meta(g->h, "routed_w2", v);
			snprintf(v, sizeof v, "%lld", m);
			e |= x3_hess_set_meta(g->h, "min_tokens", v);
			snprintf(v, sizeof v, "%lld", (long long)k->top_k);
			e |= x3_hess_set_meta(g->h, "top_k", v);
			if (g->shadow) {
				snprintf(v, sizeof v, "%s", x3_hess_name(g->shadow));
				e |= x3_hess_set_meta(g->h, "all_tokens", v);
			}
		} else {
			e |= x3_hess_set_meta(g->h, "expert_fallback", fb ? "1" : "0");
			if (fb) {
				snprintf(v, sizeof v, "%lld", fb);
				e |= x3_hess_set_meta(g->h, "fallback_tokens", v);
			}
		}
		if (e)
			die_x3("'%s'", name);
		if (defer)
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
			        moe_names[k->moe], n, fb ? "true" : "false", fb);
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
	x3_hess *h = hset_find(&k->set, c->name);
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
		warnx("layer %d: experts below %ld routed tokens, blended with the all-token Hessian "
		      "(expert (tokens)): %s", layer, k->min_tokens, k->starved);
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
	struct prov pv;
	const int32_t *pids = ids;
	if (part >= 0) {
		if (part >= nchunks)
			die("--part %ld: the calibration's %ld rows make %ld chunk%s of %ld rows (0-%ld)",
			    part, rows, nchunks, nchunks > 1 ? "s" : "", crow, nchunks - 1);
		snprintf(pv.val[0], sizeof pv.val[0], "%ld", part);
		snprintf(pv.val[1], sizeof pv.val[1], "%ld", nchunks);
		snprintf(pv.val[2], sizeof pv.val[2], "%ld", crow);
		snprintf(pv.val[3], sizeof pv.val[3], "%ld", rows);
		tokens_hash(ids, (int64_t)rows * cols, pv.val[4]);
		snprintf(pv.val[5], sizeof pv.val[5], "%s", f64 ? "f64" : "f32");
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
	fo.moe_all_tokens = cfg.n_experts <= 0 ? 0 : moe == MOE_ALL ? INT64_MAX : part > 0 ? 0 : 1;
	fo.timing = &ft;
	t_fwd0 = x3_now();
	if (x3_model_forward(m, pids, rows, cols, &fo))
		die_x3("%s: forward", model);
	t_fwd1 = x3_now();
	tm.la = la, tm.lb = lb, tm.rows = rows, tm.cols = cols;
	progress_done();
	if (cfg.n_experts > 0 && !quiet && (part < 0 || moe == MOE_ALL))
		fprintf(stderr, "%s: experts (%s capture): %d below %ld routed tokens used the fallback\n",
		        progname, moe_names[moe], k.nstarved, k.min_tokens);
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
/* An expert's metadata over merged parts: the tokens add up, the fallback
 * is used when a part used it. */
static void merge_expert_meta(x3_hess *h, const x3_tensor *t)
{
	static const char *const sum[] = { "routed_tokens", "fallback_tokens" };
	for (int i = 0; i < 2; i++) {
		const char *a = x3_hess_get_meta(h, sum[i]), *b = x3_meta_get(t, sum[i]);
		if (!b)
			continue;
		char v[32];
		snprintf(v, sizeof v, "%lld", (a ? atoll(a) : 0) + atoll(b));
		if (x3_hess_set_meta(h, sum[i], v))
			die_x3("'%s'", t->name);
	}
	const char *fb = x3_meta_get(t, "expert_fallback");
	if (fb && !strcmp(fb, "1") && x3_hess_set_meta(h, "expert_fallback", "1"))
		die_x3("'%s'", t->name);
	/* Σ w² of parts, in chunk order (exact: C99 hex) */
	const char *a = x3_hess_get_meta(h, "routed_w2"), *b = x3_meta_get(t, "routed_w2");
	if (a && b) {
		char v[64];
		snprintf(v, sizeof v, "%a", strtod(a, NULL) + strtod(b, NULL));
		if (x3_hess_set_meta(h, "routed_w2", v))
			die_x3("'%s'", t->name);
	}
}

/* A layer being merged from parts: the starved experts named on standard
 * error at its end, as one process names them. */
struct mlayer {
	int64_t layer;   /* -1: none yet */
	long long m;     /* the threshold */
	int last;        /* the expert of the group before (-1: none) */
	char starved[1024];
	size_t so;
	char **names;    /* the groups written, to refuse a name twice */
	int nnames, capnames;
};

/* After the merge of an expert group's parts (h): its fallback when it was
 * routed fewer than min_tokens tokens in all, with the all-token Hessian
 * that part 0 carried before it (in sh), as one process makes it
 * (expert_blend). */
static void merge_blend(x3_hess *h, struct hset *sh, int f64, struct mlayer *ml)
{
	const char *mt = x3_hess_get_meta(h, "min_tokens");
	if (!mt)
		return;
	const char *cap = x3_hess_get_meta(h, "capture"), *an = x3_hess_get_meta(h, "all_tokens");
	const char *w2 = x3_hess_get_meta(h, "routed_w2"), *kk = x3_hess_get_meta(h, "top_k");
	const char *ex = x3_hess_get_meta(h, "expert"), *rt = x3_hess_get_meta(h, "routed_tokens");
	long long n = rt ? atoll(rt) : 0, fb = 0, m = atoll(mt);
	int expert = ex ? atoi(ex) : -1;
	ml->m = m;
	if (n < m) {
		x3_hess *a = an ? hset_find(sh, an) : NULL;
		if (an && !a)
			die("'%s': expert %d fell short of %lld tokens, but no part carries the all-token "
			    "Hessian '%s' (part 0's, before the group: parts of an older hessian-capture "
			    "are captured again)", x3_hess_name(h), expert, m, an);
		fb = expert_blend(h, a, expert, n, m, cap && !strcmp(cap, "weighted"),
		                  w2 ? strtod(w2, NULL) : 0, kk ? atoll(kk) : 1, f64);
	}
	char v[32];
	int e = x3_hess_set_meta(h, "expert_fallback", fb ? "1" : "0");
	if (fb) {
		snprintf(v, sizeof v, "%lld", fb);
		e |= x3_hess_set_meta(h, "fallback_tokens", v);
	}
	if (e)
		die_x3("'%s'", x3_hess_name(h));
	/* named once per expert (its first group: an expert's are adjacent) */
	if (fb && expert != ml->last && ml->so < sizeof ml->starved - 32)
		ml->so += (size_t)snprintf(ml->starved + ml->so, sizeof ml->starved - ml->so, "%s%d (%lld)",
		                           ml->so ? ", " : "", expert, n);
	ml->last = expert;
}

/* The end of a merged layer: its starved experts named, the all-token
 * Hessians it kept freed. */
static void mlayer_end(struct mlayer *ml, struct hset *sh)
{
	if (ml->so)
		warnx("layer %lld: experts below %lld routed tokens, blended with the all-token Hessian "
		      "(expert (tokens)): %s", (long long)ml->layer, ml->m, ml->starved);
	for (int i = 0; i < sh->n; i++)
		x3_hess_free(sh->h[i]);
	sh->n = 0;
	for (int i = 0; i < ml->nnames; i++)
		free(ml->names[i]);
	ml->nnames = 0;
	ml->so = 0;
	ml->starved[0] = 0;
	ml->last = -1;
	ml->layer = -1;
}

/* Remember that group name of the layer is written; a name twice dies. */
static void mlayer_name(struct mlayer *ml, const char *file, const char *name)
{
	for (int i = 0; i < ml->nnames; i++)
		if (!strcmp(ml->names[i], name))
			die("%s: frame '%s' twice in layer %lld", file, name, (long long)ml->layer);
	if (ml->nnames == ml->capnames) {
		ml->capnames = ml->capnames ? 2 * ml->capnames : 64;
		ml->names = realloc(ml->names, (size_t)ml->capnames * sizeof *ml->names);
		if (!ml->names)
			die("out of memory");
	}
	if (!(ml->names[ml->nnames++] = strdup(name)))
		die("out of memory");
}

/* One input of --merge and its next frame (NULL at its end). */
struct min {
	const char *file;
	x3_reader *r;
	x3_tensor *t;
	long chunk;      /* a part's chunk */
	int64_t layer;   /* the layer of t */
};

static void min_next(struct min *f)
{
	int rc = x3_reader_next(f->r, &f->t);
	if (rc == X3_EOF)
		f->t = NULL;
	else if (rc)
		die_x3("%s", f->file);
}

/* Add frame t (of file) to the accumulator of its name in s: a chunk of
 * its own, added in double after the ones before it. */
static void merge_frame(struct hset *s, const char *file, const x3_tensor *t)
{
	if (t->rank != 2 || t->shape[0] != t->shape[1])
		die("%s: frame '%s' is not a square matrix", file, t->name);
	const char *mem = x3_meta_get(t, "members");
	x3_hess *h = hset_find(s, t->name);
	if (!h) {
		int64_t layer = -1;
		x3_meta_get_i64(t, "layer", &layer);
		h = hset_add(s, t->name, t->shape[0], 1, mem, (int)layer);
		for (int j = 0; j < t->nmeta; j++)
			if (!x3_hess_meta_is_computed(t->meta[j].key) && !is_prov_key(t->meta[j].key) &&
			    x3_hess_set_meta(h, t->meta[j].key, t->meta[j].val))
				die_x3("%s", file);
	} else if (mem && strcmp(mem, x3_hess_members(h) ? x3_hess_members(h) : "")) {
		die("%s: frame '%s': members '%s' differ from the first stream's", file, t->name, mem);
	} else {
		merge_expert_meta(h, t);
	}
	if (x3_hess_add_frame(h, t))
		die_x3("%s", file);
}

/* Whole streams: summed by name in the order given. */
static void merge_streams(struct min *in, int nin, int f64, x3_writer *w)
{
	struct hset s = { 0 };
	x3_dtype out = f64 ? X3_F64 : X3_DTYPE_COUNT;
	for (int i = 0; i < nin; i++)
		for (; in[i].t; min_next(&in[i])) {
			if (x3_meta_get(in[i].t, "chunk"))
				die("%s: frame '%s' is a chunk's partial sum (--part), not a whole "
				    "stream like the first input's", in[i].file, in[i].t->name);
			if (out == X3_DTYPE_COUNT)
				out = in[i].t->dtype == X3_F64 ? X3_F64 : X3_F32;
			merge_frame(&s, in[i].file, in[i].t);
			x3_tensor_free(in[i].t);
		}
	hset_flush(&s, w, out == X3_DTYPE_COUNT ? X3_F32 : out, NULL);
	free(s.h);
}

static int by_chunk(const void *a, const void *b)
{
	const struct min *x = *(struct min *const *)a, *y = *(struct min *const *)b;
	return (x->chunk > y->chunk) - (x->chunk < y->chunk);
}

static int64_t frame_layer(const struct min *f)
{
	int64_t l = -1;
	if (x3_meta_get_i64(f->t, "layer", &l) || l < 0)
		die("%s: frame '%s' has no 'layer' metadata (not a hessian-capture --part output)",
		    f->file, f->t->name);
	return l;
}

static int is_all_tokens(const x3_tensor *t)
{
	const char *role = x3_meta_get(t, "part_role");
	return role && !strcmp(role, "all_tokens");
}

/* A part's frame just read: of its chunk, in layer order (after layer l),
 * all-token frames in part 0 only. */
static void part_check(struct min *f, int64_t l)
{
	if (!f->t)
		return;
	const char *v = x3_meta_get(f->t, "chunk");
	if (!v || strtol(v, NULL, 10) != f->chunk)
		die("%s: frame '%s' is not of chunk %ld like the file's first frame", f->file, f->t->name,
		    f->chunk);
	if (f->chunk != 0 && is_all_tokens(f->t))
		die("%s: all-token frame '%s' not of chunk 0", f->file, f->t->name);
	int64_t nl = frame_layer(f);
	if (nl < l)
		die("%s: frame '%s' of layer %lld comes after layer %lld", f->file, f->t->name,
		    (long long)nl, (long long)l);
	f->layer = nl;
}

static void part_next(struct min *f)
{
	int64_t l = f->layer;
	x3_tensor_free(f->t);
	min_next(f);
	part_check(f, l);
}

/* Part 0 is past layer ml->layer (next: layer next): no other part may
 * have a frame of it left, one part 0 does not list in that order. */
static void merge_layer_end(struct min **c, int nin, struct mlayer *ml, struct hset *sh, int64_t next)
{
	for (int i = 1; i < nin; i++)
		if (c[i]->t && c[i]->layer < next)
			die("%s: frame '%s' of layer %lld is not in %s (chunk 0), or not in its order: "
			    "the parts of a layer list the same frames in the same order",
			    c[i]->file, c[i]->t->name, (long long)c[i]->layer, c[0]->file);
	if (ml->layer >= 0)
		mlayer_end(ml, sh);
}

/* The partial sums of --part runs: every chunk of one calibration exactly
 * once, added in chunk order (whatever the order of the files), so the
 * result is the single capture's bit for bit. The parts list a layer's
 * groups in the same order (a later part leaves out an expert routed none
 * of its rows) and are read in lockstep, one group at a time: its sums
 * added, blended, written and freed before the next is read, so that the
 * merge holds one group's Hessian (beside the all-token Hessians part 0
 * carries for the fallback: the layer's shared gate/up one for the layer,
 * an expert's own until its group is written), not a layer's. */
static void merge_chunks(struct min *in, int nin, int f64, x3_writer *w)
{
	struct min **c = malloc((size_t)nin * sizeof *c);
	if (!c)
		die("out of memory");
	for (int i = 0; i < nin; i++) {
		struct min *f = &in[i];
		if (!f->t)
			die("%s: no frames (an empty chunk output)", f->file);
		for (int k = 1; k < N_PROV; k++) {
			const char *v = x3_meta_get(f->t, prov_keys[k]), *v0 = x3_meta_get(in[0].t, prov_keys[k]);
			if (!v || !v0 || strcmp(v, v0))
				die("%s: not a chunk of the same capture as %s (metadata '%s' is '%s', not '%s')",
				    f->file, in[0].file, prov_keys[k], v ? v : "", v0 ? v0 : "");
		}
		char *end;
		const char *v = x3_meta_get(f->t, "chunk");
		f->chunk = strtol(v, &end, 10);
		if (*end || end == v || f->chunk < 0)
			die("%s: frame '%s': bad metadata 'chunk' '%s'", f->file, f->t->name, v);
		c[i] = f;
	}
	long n = strtol(x3_meta_get(in[0].t, "chunks"), NULL, 10);
	qsort(c, (size_t)nin, sizeof *c, by_chunk);
	for (int i = 0; i < nin; i++) {
		if (c[i]->chunk >= n)
			die("%s: chunk %ld of a calibration of %ld chunks (0-%ld)", c[i]->file, c[i]->chunk,
			    n, n - 1);
		if (i && c[i]->chunk == c[i - 1]->chunk)
			die("chunk %ld of %ld is given twice: %s and %s", c[i]->chunk, n, c[i - 1]->file,
			    c[i]->file);
		if (c[i]->chunk != i)
			die("chunk %d of %ld is missing (%d chunk file%s given)", i, n, nin, nin > 1 ? "s" : "");
	}
	if (nin < n)
		die("chunk %d of %ld is missing (%d chunk file%s given)", nin, n, nin, nin > 1 ? "s" : "");
	const char *pr = x3_meta_get(in[0].t, "products");
	x3_dtype out = f64 || !strcmp(pr, "f64") ? X3_F64 : X3_F32;
	for (int i = 0; i < nin; i++)
		part_check(c[i], -1);
	struct hset s = { 0 }, sh = { 0 };
	struct mlayer ml = { .layer = -1, .last = -1 };
	struct min *p0 = c[0];
	for (;;) {
		/* part 0's all-token frames, carried before the groups using them */
		for (; p0->t && is_all_tokens(p0->t); part_next(p0)) {
			if (p0->layer != ml.layer) {
				merge_layer_end(c, nin, &ml, &sh, p0->layer);
				ml.layer = p0->layer;
			}
			if (hset_find(&sh, p0->t->name))
				die("%s: all-token frame '%s' twice in layer %lld", p0->file, p0->t->name,
				    (long long)p0->layer);
			merge_frame(&sh, p0->file, p0->t);
		}
		if (!p0->t)
			break;
		const x3_tensor *t0 = p0->t;
		if (p0->layer != ml.layer) {
			merge_layer_end(c, nin, &ml, &sh, p0->layer);
			ml.layer = p0->layer;
		}
		mlayer_name(&ml, p0->file, t0->name);
		/* the group's sums, in chunk order; a later part has no frame for
		 * an expert the router sent none of its rows (it has the next) */
		int expert = x3_meta_get(t0, "expert") != NULL;
		merge_frame(&s, p0->file, t0);
		for (int i = 1; i < nin; i++) {
			struct min *f = c[i];
			if (f->t && f->layer == p0->layer && !strcmp(f->t->name, t0->name)) {
				merge_frame(&s, f->file, f->t);
				part_next(f);
			} else if (!expert && !f->t) {
				die("%s: ends where %s (chunk 0) has frame '%s' of layer %lld: the parts of a "
				    "layer list the same frames in the same order", f->file, p0->file, t0->name,
				    (long long)p0->layer);
			} else if (!expert) {
				die("%s: frame '%s' of layer %lld where %s (chunk 0) has '%s' of layer %lld: "
				    "the parts of a layer list the same frames in the same order",
				    f->file, f->t->name, (long long)f->layer, p0->file, t0->name,
				    (long long)p0->layer);
			}
		}
		part_next(p0);
		x3_hess *h = s.h[0];
		merge_blend(h, &sh, out == X3_F64, &ml);
		/* an expert's own all-token Hessian is read by its group alone */
		const char *an = x3_hess_get_meta(h, "all_tokens");
		for (int i = 0; an && i < sh.n; i++) {
			const char *sc = x3_hess_get_meta(sh.h[i], "all_tokens_scope");
			if (sc && !strcmp(sc, "group") && !strcmp(x3_hess_name(sh.h[i]), an)) {
				x3_hess_free(sh.h[i]);
				sh.h[i] = sh.h[--sh.n];
				break;
			}
		}
		hset_flush(&s, w, out, NULL);
	}
	merge_layer_end(c, nin, &ml, &sh, INT64_MAX);
	free(ml.names);
	free(s.h);
	free(sh.h);
	free(c);
}

static void do_merge(char **files, int nfiles, int f64, x3_writer *w)
{
	static char *dash[] = { "-" };
	if (!nfiles)
		files = dash, nfiles = 1;
	struct min *in = calloc((size_t)nfiles, sizeof *in);
	if (!in)
		die("out of memory");
	int parts = -1;
	for (int i = 0; i < nfiles; i++) {
		in[i].file = files[i];
		if (x3_reader_open(files[i], &in[i].r))
			die_x3("%s", files[i]);
		min_next(&in[i]);
		/* the first input with frames says what they all are */
		int p = in[i].t && x3_meta_get(in[i].t, "chunk");
		if (parts < 0 && in[i].t)
			parts = p;
		else if (in[i].t && p != parts)
			die("%s: %s, but the inputs before it are %s", files[i],
			    p ? "the partial sums of a chunk (--part)" : "a whole stream",
			    parts ? "chunks" : "whole streams");
	}
	if (parts == 1)
		merge_chunks(in, nfiles, f64, w);
	else
		merge_streams(in, nfiles, f64, w);
	for (int i = 0; i < nfiles; i++)
		x3_reader_close(in[i].r);
	free(in);
}

static void do_activations(char **files, int nfiles, const char *name, const char *members,
                           int f64, x3_writer *w)
{
	struct hset s = { 0 };
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
			x3_hess *h = hset_find(&s, g);
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
	int moe = MOE_ROUTED, have_moe = 0, lparts = 0;
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
			for (moe = 0; moe < 3 && strcmp(optarg, moe_names[moe]); moe++)
				;
			if (moe == 3)
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
