/* t1571-moe-expert-major: the forward runs a mixture-of-experts layer
 * expert by expert (model.h x3_forward_opts.expert_done: one expert's
 * weights held at a time) and gives what the chunk-major order
 * (x3_forward_opts.moe_chunk_major: every chunk through every expert)
 * gives, bit for bit, on the seeded tiny checkpoints of
 * examples/make-tiny-llama: Mixtral (both layouts: experts of their own and
 * Transformers v5's fused 3-D tensors), Qwen3-MoE with a dense layer,
 * Qwen2-MoE (shared expert and its sigmoid gate), DeepSeek V3 (grouped
 * sigmoid routing, shared expert, multi-head latent attention) and GLM-4
 * MoE. Compared, over 6 rows in calibration segments of 3 rows and forward
 * chunks of 2 (a chunk cut at each segment's end), with the all-token
 * capture on the first two chunks (then on none, then on all):
 *   - the logits, byte for byte;
 *   - what a Hessian consumer gets of every group: the hook's rows (x,
 *     their routing weights row_w, expert, all_tokens) in the order each
 *     group gets them, batch by batch, with the segment ends (seg_done)
 *     that fall between them: hashed group by group (XXH3), so that equal
 *     hashes mean every accumulator, x3_hess_add_rows call by call and
 *     chunk end by chunk end, sums the same bits in both orders;
 *   - expert-major: an expert's groups come between expert_done(e - 1) and
 *     expert_done(e), after expert_done(-1); the layer's other groups before
 *     expert_done(-1) or after the last expert (the shared expert). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "test.h"
#include "model.h"
#include "synth.h"

enum { R = 6, C = 16, SEG = 3, GMAX = 256 };

/* the rows a consumer gets, group by group (name and all_tokens) */
struct grp {
	char key[200];
	XXH3_state_t *st;
	int open;      /* rows since the last segment end */
	unsigned long long dig;
};
struct rec {
	struct grp g[GMAX];
	int n;
	int layer, done;   /* expert_done calls in the layer: -2 none, -1, e */
	int bad;           /* events out of the expert-major order */
	int major;
	long events;
};

static int rec_hook(void *ctx, const struct x3_capture *c)
{
	struct rec *r = ctx;
	char key[200];
	snprintf(key, sizeof key, "%s#%d", c->name, c->all_tokens);
	struct grp *g = NULL;
	for (int i = 0; i < r->n && !g; i++)
		if (!strcmp(r->g[i].key, key))
			g = &r->g[i];
	if (!g) {
		if (r->n == GMAX)
			return X3_ENOMEM;
		g = &r->g[r->n++];
		snprintf(g->key, sizeof g->key, "%s", key);
		g->st = XXH3_createState();
		XXH3_64bits_reset(g->st);
	}
	int64_t hdr[4] = { c->ntok, c->in, c->expert, c->all_tokens };
	XXH3_64bits_update(g->st, hdr, sizeof hdr);
	XXH3_64bits_update(g->st, c->x, (size_t)(c->ntok * c->in) * sizeof *c->x);
	if (c->row_w)
		XXH3_64bits_update(g->st, c->row_w, (size_t)c->ntok * sizeof *c->row_w);
	g->open = 1;
	r->events++;
	if (r->major && c->layer == r->layer) {
		/* an expert's rows only in its own pass; the others' outside B */
		if (c->expert >= 0 ? r->done != c->expert - 1 || r->done < -1
		                   : r->done >= -1 && r->done < 0)
			r->bad++;
	}
	return X3_OK;
}

static int rec_seg(void *ctx, int layer, int64_t seg)
{
	struct rec *r = ctx;
	(void)layer;
	for (int i = 0; i < r->n; i++)
		if (r->g[i].open) {
			int64_t mark[2] = { -1, seg };
			XXH3_64bits_update(r->g[i].st, mark, sizeof mark);
			r->g[i].open = 0;
		}
	return X3_OK;
}

static int rec_layer(void *ctx, int layer, int n)
{
	struct rec *r = ctx;
	(void)n;
	r->layer = layer + 1, r->done = -2;
	return X3_OK;
}

static int rec_expert(void *ctx, int layer, int e)
{
	struct rec *r = ctx;
	if (layer != r->layer || e != r->done + 1)
		r->bad++;
	r->done = e;
	return X3_OK;
}

static const struct grp *rec_find(const struct rec *r, const char *key)
{
	for (int i = 0; i < r->n; i++)
		if (!strcmp(r->g[i].key, key))
			return &r->g[i];
	return NULL;
}

static void rec_free(struct rec *r)
{
	for (int i = 0; i < r->n; i++)
		XXH3_freeState(r->g[i].st);
	r->n = 0;
}

/* the forward of model dir in one order: logits (R*C, vocab) and r */
static int run(x3_model *m, const int32_t *tok, int major, int64_t all_tok, float *lg, struct rec *r)
{
	memset(r, 0, sizeof *r);
	r->major = major, r->layer = 0, r->done = -2;
	struct x3_forward_opts o;
	x3_forward_opts_init(&o, m);
	o.hook = rec_hook, o.hook_ctx = r;
	o.seg_rows = SEG, o.seg_done = rec_seg, o.seg_done_ctx = r;
	o.layer_done = rec_layer, o.layer_done_ctx = r;
	o.expert_done = rec_expert, o.expert_done_ctx = r;
	o.chunk_tokens = 2 * C;
	o.moe_all_tokens = all_tok;
	o.moe_chunk_major = !major;
	o.logits_mode = X3_LOGITS_ALL, o.logits = lg;
	int rc = x3_model_forward(m, tok, R, C, &o);
	for (int i = 0; i < r->n; i++)
		r->g[i].dig = XXH3_64bits_digest(r->g[i].st);
	return rc;
}

static void compare(const char *label, const char *dir)
{
	x3_model *m;
	if (x3_model_open(dir, NULL, &m)) {
		CHECK(0, "%s: open: %s", label, x3_errmsg());
		return;
	}
	const x3_model_config *c = x3_model_cfg(m);
	int32_t tok[R * C];
	for (int i = 0; i < R * C; i++)
		tok[i] = (int32_t)((i * 7919 + 13) % c->vocab);
	size_t nl = (size_t)(R * C * c->vocab);
	float *l0 = malloc(nl * sizeof *l0), *l1 = malloc(nl * sizeof *l1);
	static struct rec a, b;
	static const int64_t alls[] = { 3 * C, 0, INT64_MAX };
	for (int k = 0; k < 3; k++) {
		int rc0 = run(m, tok, 0, alls[k], l0, &a), rc1 = run(m, tok, 1, alls[k], l1, &b);
		CHECK(!rc0 && !rc1, "%s, all-token rows %s: both orders run", label,
		      k == 0 ? "of the first 2 chunks" : k == 1 ? "none" : "of all chunks");
		CHECK(!memcmp(l0, l1, nl * sizeof *l0), "%s: the logits are the same bytes", label);
		int same = a.n == b.n && a.events == b.events, experts = 0;
		for (int i = 0; i < a.n && same; i++) {
			const struct grp *g = rec_find(&b, a.g[i].key);
			same = g && g->dig == a.g[i].dig;
			experts += strstr(a.g[i].key, "experts.") != NULL;
		}
		CHECK(same && experts > 0, "%s: every group gets the same rows in the same batches and "
		      "segments (%d groups, %d of experts, %ld hook calls)", label, a.n, experts, a.events);
		CHECK(b.bad == 0, "%s: expert-major: each expert's groups within its own pass (%d out of order)",
		      label, b.bad);
		rec_free(&a), rec_free(&b);
	}
	free(l0), free(l1);
	x3_model_close(m);
}

int main(void)
{
	if (test_tmpdir("t1571")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	static const struct { const char *label, *args; } ms[] = {
		{ "Mixtral", "--arch mixtral --experts 4 --top-k 2" },
		{ "Mixtral v5 (fused experts)", "--arch mixtral --experts 4 --top-k 2 --fused-experts" },
		{ "Qwen3-MoE", "--arch qwen3-moe --experts 6 --top-k 2 --moe-inter 24 --dense-layers 0" },
		{ "Qwen2-MoE", "--arch qwen2-moe --experts 4 --top-k 1 --moe-inter 20 --shared-inter 40" },
		{ "DeepSeek V3", "--arch deepseek_v3 --experts 8 --top-k 2 --moe-inter 24" },
		{ "GLM-4 MoE", "--arch glm4_moe --experts 4 --top-k 2 --moe-inter 24" },
	};
	for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) {
		char name[16];
		snprintf(name, sizeof name, "m%zu", i);
		const char *dir = test_path(name);
		if (test_run("examples/make-tiny-llama %s %s 2 64 96 >/dev/null", ms[i].args, dir)) {
			CHECK(0, "%s: make-tiny-llama %s", ms[i].label, ms[i].args);
			continue;
		}
		compare(ms[i].label, dir);
	}
	test_tmpdir_remove();
	TEST_DONE();
}
