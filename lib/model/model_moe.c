/* model_moe.c: the mixture-of-experts layers of the forward (model_impl.h):
 * the routing parameters of a layer, the experts' linears with their
 * capture (the rows routed to each, or every token), the shared expert
 * and its gate, a layer chunk-major (every expert's weights for the
 * layer) or expert-major (one expert's weights at a time, model.h
 * x3_forward_opts.expert_done). The routing and the experts' batches are
 * lib/model/moe.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "model_impl.h"

/* An expert's linear for the MoE block: its input is the rows routed to
 * it, which the capture hook sees (the expert's own Hessian group), with
 * their routing weights. */
struct moe_ctx { struct fwd *f; const struct layer_w *w; int l; const float *rw; };
static int moe_weights(void *ctx, int64_t e, const float *w, int64_t n)
{
	(void)e, (void)n;
	((struct moe_ctx *)ctx)->rw = w;
	return X3_OK;
}
static int moe_apply(void *ctx, int64_t e, int j, const float *x, int64_t n, float *y)
{
	struct moe_ctx *c = ctx;
	const x3_module *d = c->w->exm[e * 3 + j];
	int rc;
	if (j != 1 && (rc = x3m_hook_ex(c->f, c->l, d, x, n, d->in, 0, c->rw)))
		return rc;
	return x3m_lin_apply(c->f, c->w->ex[e * 3 + j], x, n, 0, y);
}

static struct x3_moe moe_params(const x3_model_config *c, const struct layer_w *w);

/* The all-token capture of every expert of layer l over xn (nt, hidden)
 * (x3_forward_opts.moe_all_tokens): the hook only, no output. */
static int moe_all_tokens(struct fwd *f, int l, const struct layer_w *w, int64_t nt)
{
	const x3_model_config *c = &f->m->cfg;
	int64_t I = c->moe_inter;
	const struct x3_forward_opts *o = f->o;
	if (!o->hook || l < o->hook_first || l > o->hook_last || f->tok0 >= o->moe_all_tokens)
		return X3_OK;
	struct x3_moe p = moe_params(c, w);
	float *g = malloc((size_t)(nt * I) * sizeof *g), *u = malloc((size_t)(nt * I) * sizeof *u);
	int rc = g && u ? X3_OK : x3_err(X3_ENOMEM, "moe: out of memory for %lld tokens", (long long)nt);
	for (int64_t e = 0; e < w->nex && !rc; e++) {
		const x3_module *dg = w->exm[e * 3], *dd = w->exm[e * 3 + 2];
		if ((rc = x3m_hook_ex(f, l, dg, f->xn, nt, dg->in, 2, NULL)) ||
		    (rc = x3m_lin_apply(f, w->ex[e * 3], f->xn, nt, f->cols, g)) ||
		    (rc = x3m_lin_apply(f, w->ex[e * 3 + 1], f->xn, nt, f->cols, u)))
			break;
		x3_moe_act(&p, g, u, nt * I);
		rc = x3m_hook_ex(f, l, dd, g, nt, dd->in, 1, NULL);
	}
	free(g), free(u);
	return rc;
}

/* The routing parameters of a mixture-of-experts layer (moe.h). */
static struct x3_moe moe_params(const x3_model_config *c, const struct layer_w *w)
{
	return (struct x3_moe){ .n_experts = c->n_experts, .top_k = c->n_experts_tok, .hidden = c->hidden,
	                        .inter = c->moe_inter, .renorm = c->norm_topk,
	                        .router = w->vec[X3_SLOT_ROUTER], .sigmoid = c->sigmoid_route,
	                        .score_bias = w->vec[X3_SLOT_ROUTER_BIAS], .n_group = c->n_group,
	                        .topk_group = c->topk_group, .scale = c->routed_scale,
	                        .router_bias = w->vec[X3_SLOT_ROUTER_LOGIT_BIAS], .topk_softmax = c->topk_softmax,
	                        .act_limit = c->swiglu_limit, .act_alpha = c->swiglu_alpha };
}

static int shared_chunk(struct fwd *f, int l, const struct layer_w *w, int64_t nt, float *mo);

/* The MLP of a mixture-of-experts layer on xn (nt, hidden), chunk-major
 * (x3_forward_opts.moe_chunk_major): into f->mo. */
int x3m_moe_chunk(struct fwd *f, int l, const struct layer_w *w, int64_t nt)
{
	struct moe_ctx mc = { f, w, l, NULL };
	struct x3_moe p = moe_params(&f->m->cfg, w);
	p.apply = moe_apply, p.ctx = &mc, p.weights = moe_weights;
	int rc;
	if ((rc = moe_all_tokens(f, l, w, nt)) || (rc = x3_moe_forward(&p, f->xn, nt, f->cols, f->mo)))
		return rc;
	return shared_chunk(f, l, w, nt, f->mo);
}

/* The shared expert (if the layer has one) over the chunk's every token
 * f->xn (nt, hidden), scaled by sigmoid(gate · x) (Qwen2-MoE's
 * shared_expert_gate), added to the experts' sum mo (nt, hidden). */
static int shared_chunk(struct fwd *f, int l, const struct layer_w *w, int64_t nt, float *mo)
{
	const x3_model_config *c = &f->m->cfg;
	int64_t H = c->hidden, si = c->shared_inter;
	int rc;
	if (!w->lin[X3_SLOT_SHX_GATE])
		return X3_OK;
	if ((rc = x3m_hook(f, l, X3_SLOT_SHX_GATE, f->xn, nt, H)) ||
	    (rc = x3m_lin_apply(f, w->lin[X3_SLOT_SHX_GATE], f->xn, nt, f->cols, f->g)) ||
	    (rc = x3m_lin_apply(f, w->lin[X3_SLOT_SHX_UP], f->xn, nt, f->cols, f->u)))
		return rc;
	for (int64_t i = 0; i < nt * si; i++)
		f->g[i] = f->g[i] / (1.0f + expf(-f->g[i])) * f->u[i];
	float *sc = f->u;   /* free now: the gate's (nt) scalars */
	if ((rc = x3m_hook(f, l, X3_SLOT_SHX_DOWN, f->g, nt, si)) ||
	    (rc = x3m_lin_apply(f, w->lin[X3_SLOT_SHX_DOWN], f->g, nt, f->cols, f->a)) ||
	    (w->vec[X3_SLOT_SHX_SCALE] && (rc = x3_gemm_xwt(f->xn, nt, f->cols, H, w->vec[X3_SLOT_SHX_SCALE], 1, sc))))
		return rc;
	for (int64_t t = 0; t < nt; t++) {
		float s = w->vec[X3_SLOT_SHX_SCALE] ? 1.0f / (1.0f + expf(-sc[t])) : 1.0f;
		for (int64_t i = 0; i < H; i++)
			mo[t * H + i] += s * f->a[t * H + i];
	}
	return X3_OK;
}

/* A mixture-of-experts layer l over all rows x (rows * cols, hidden),
 * expert-major (model.h x3_forward_opts.expert_done): A, the attention
 * and the routing of every chunk; B, each expert over every chunk into
 * the sum mo; C, the shared expert and the residual. The chunks are those
 * of the chunk-major order, and within a chunk an expert multiplies the
 * same batch (x3_moe_rows) on the same rows: the MLP's input of a row is
 * its RMSNorm, recomputed from the residual x kept unchanged until C (a
 * row's norm does not depend on the rows beside it). */
int x3m_moe_layer(struct fwd *f, int l, struct layer_w *w, float *x, int64_t rows,
                  int64_t chunk_rows, int64_t seg)
{
	const x3_model_config *c = &f->m->cfg;
	const struct x3_forward_opts *o = f->o;
	int64_t cols = f->cols, T = rows * cols, ct = chunk_rows * cols, H = c->hidden;
	int64_t I = c->moe_inter, K = c->n_experts_tok, nr;
	const float *pn = w->vec[X3_SLOT_POST_NORM];
	struct x3_moe p = moe_params(c, w);
	int hooked = o->hook && l >= o->hook_first && l <= o->hook_last;
	int32_t *idx = malloc((size_t)(T * K) * sizeof *idx);
	float *rw = malloc((size_t)(T * K) * sizeof *rw);
	float *mo = calloc((size_t)(T * H), sizeof *mo);
	int64_t *er = malloc((size_t)ct * sizeof *er);
	float *ew = malloc((size_t)ct * sizeof *ew);
	float *xe = malloc((size_t)(ct * H) * sizeof *xe), *ye = malloc((size_t)(ct * H) * sizeof *ye);
	float *g = malloc((size_t)(ct * I) * sizeof *g), *u = malloc((size_t)(ct * I) * sizeof *u);
	int rc = X3_OK;
	if (!idx || !rw || !mo || !er || !ew || !xe || !ye || !g || !u) {
		rc = x3_err(X3_ENOMEM, "moe: out of memory for %lld tokens", (long long)T);
		goto out;
	}
	/* A: attention, residual, the routing of every token */
	for (int64_t r0 = 0; r0 < rows && !rc; r0 += nr) {
		nr = x3m_chunk_len(r0, chunk_rows, seg, rows);
		int64_t t0 = r0 * cols, nt = nr * cols;
		f->tok0 = t0;
		if ((rc = x3m_attn_chunk(f, l, w, x + t0 * H, nr)))
			break;
		x3m_rmsnorm(f->xn, x + t0 * H, pn, nt, H, c->rms_eps);
		if (!(rc = x3_moe_route(&p, f->xn, nt, cols, idx + t0 * K, rw + t0 * K)))
			rc = x3m_seg_after(o, l, r0 + nr, seg, rows);
	}
	if (!rc && o->expert_done) {
		double t0 = x3m_cb_start(o);
		rc = x3m_cb_end(o, t0, o->expert_done(o->expert_done_ctx, l, -1));
	}
	/* B: expert by expert, the chunks in order */
	for (int e = 0; e < w->nex && !rc; e++) {
		const x3_module *dg = w->exm[e * 3], *dd = w->exm[e * 3 + 2];
		double tl = f->o->timing ? x3_now() : 0;
		rc = x3m_expert_open(f->m, l, w, e);
		if (f->o->timing)
			f->o->timing->load += x3_now() - tl;
		if (rc)
			break;
		x3_linear *lg = w->ex[e * 3], *lu = w->ex[e * 3 + 1], *ld = w->ex[e * 3 + 2];
		for (int64_t r0 = 0; r0 < rows && !rc; r0 += nr) {
			nr = x3m_chunk_len(r0, chunk_rows, seg, rows);
			int64_t t0 = r0 * cols, nt = nr * cols;
			const float *xc = x + t0 * H;
			f->tok0 = t0;
			if (hooked && t0 < o->moe_all_tokens) {
				/* the all-token capture (moe_all_tokens): the hook only */
				x3m_rmsnorm(f->xn, xc, pn, nt, H, c->rms_eps);
				if ((rc = x3m_hook_ex(f, l, dg, f->xn, nt, dg->in, 2, NULL)) ||
				    (rc = x3m_lin_apply(f, lg, f->xn, nt, cols, g)) ||
				    (rc = x3m_lin_apply(f, lu, f->xn, nt, cols, u)))
					break;
				x3_moe_act(&p, g, u, nt * I);
				if ((rc = x3m_hook_ex(f, l, dd, g, nt, dd->in, 1, NULL)))
					break;
			}
			int64_t n = x3_moe_rows(&p, idx + t0 * K, rw + t0 * K, nt, e, er, ew);
			if (n) {
				for (int64_t r = 0; r < n; r++)
					memcpy(xe + r * H, xc + er[r] * H, (size_t)H * sizeof *xe);
				x3m_rmsnorm(xe, xe, pn, n, H, c->rms_eps);
				if ((rc = x3m_hook_ex(f, l, dg, xe, n, dg->in, 0, ew)) ||
				    (rc = x3m_lin_apply(f, lg, xe, n, 0, g)) || (rc = x3m_lin_apply(f, lu, xe, n, 0, u)))
					break;
				x3_moe_act(&p, g, u, n * I);
				if ((rc = x3m_hook_ex(f, l, dd, g, n, dd->in, 0, ew)) || (rc = x3m_lin_apply(f, ld, g, n, 0, ye)))
					break;
				float *mc = mo + t0 * H;
				for (int64_t r = 0; r < n; r++)
					for (int64_t i = 0; i < H; i++)
						mc[er[r] * H + i] += ew[r] * ye[r * H + i];
			}
			rc = x3m_seg_after(o, l, r0 + nr, seg, rows);
		}
		x3m_expert_free(w, e);
		if (!rc && o->expert_done) {
			double t0 = x3m_cb_start(o);
			rc = x3m_cb_end(o, t0, o->expert_done(o->expert_done_ctx, l, e));
		}
	}
	/* C: the shared expert, then the residual */
	for (int64_t r0 = 0; r0 < rows && !rc; r0 += nr) {
		nr = x3m_chunk_len(r0, chunk_rows, seg, rows);
		int64_t t0 = r0 * cols, nt = nr * cols;
		float *xc = x + t0 * H, *mc = mo + t0 * H;
		f->tok0 = t0;
		if (w->lin[X3_SLOT_SHX_GATE]) {
			x3m_rmsnorm(f->xn, xc, pn, nt, H, c->rms_eps);
			if ((rc = shared_chunk(f, l, w, nt, mc)))
				break;
		}
		#pragma omp parallel for if(nt * H > (1 << 16)) schedule(static)
		for (int64_t i = 0; i < nt * H; i++)
			xc[i] += mc[i];
		rc = x3m_seg_after(o, l, r0 + nr, seg, rows);
	}
out:
	free(idx), free(rw), free(mo), free(er), free(ew), free(xe), free(ye), free(g), free(u);
	return rc;
}
