/* model_mla.c: multi-head latent attention of the forward (model_impl.h):
 * DeepSeek V3's and GLM-4.7-Flash's latent projections and their rope
 * parts, and for the sparse attention (GLM-5, DeepSeek V3.2) the keys the
 * indexer (indexer.h) picks for each query. */
#include <math.h>
#include <string.h>
#include "model_impl.h"

/* The epsilon of the latent attention's q_a_layernorm and kv_a_layernorm:
 * Hugging Face builds them with its RMSNorm's default, 1e-6, whatever
 * rms_norm_eps says (DeepseekV3RMSNorm(q_lora_rank),
 * Glm4MoeLiteRMSNorm(kv_lora_rank)); GLM-4.7-Flash's rms_norm_eps is 1e-5. */
#define MLA_NORM_EPS 1e-6

/* The keys each query of a chunk of nrows rows (its first token f->tok0)
 * sees, into f->sel (indexer.h): layer l's indexer over the query latent
 * f->qa and the normed hidden f->xn, or, in a layer without one (GLM-5's
 * "shared"), the selection of the last layer before it, kept. Run only
 * for rows longer than index_topk (else every query sees all its keys). */
static int dsa_select(struct fwd *f, int l, const struct layer_w *w, int64_t nrows)
{
	const x3_model_config *c = &f->m->cfg;
	int64_t cols = f->cols, nt = nrows * cols, H = c->hidden, ih = c->index_heads, hd = c->index_hd;
	int rc;
	if (x3_arch_idx_shared(c, l)) {
		/* a forward resumed at this layer (hessian-capture's layer by
		 * layer calibration) has not run the layer that picked them */
		if (f->sel_layer < 0)
			return x3_err(X3_EUNSUP, "layer %d reuses the keys an earlier layer's indexer picked (indexer_types "
			              "\"shared\"), and this forward starts after that layer: rows of %lld tokens are "
			              "longer than index_topk %lld (rows of at most index_topk tokens attend to every "
			              "key)", l, (long long)cols, (long long)c->index_topk);
		return X3_OK;
	}
	if ((rc = x3m_lin_apply(f, w->lin[X3_SLOT_IDX_QB], f->qa, nt, cols, f->iq)) ||
	    (rc = x3_gemm_xwt(f->xn, nt, cols, H, w->vec[X3_SLOT_IDX_K], hd, f->ik)) ||
	    (rc = x3_gemm_xwt(f->xn, nt, cols, H, w->vec[X3_SLOT_IDX_W], ih, f->iw)))
		return rc;
	/* the key: a LayerNorm (Hugging Face's nn.LayerNorm(eps 1e-6)); the
	 * first qk_rope dimensions of keys and queries rotated (GLM-5: on
	 * interleaved pairs; DeepSeek V3.2: as halves) */
	x3_layernorm(f->ik, w->vec[X3_SLOT_IDX_K_NORM], w->vec[X3_SLOT_IDX_K_BIAS], nt, hd, 1e-6);
	x3m_rope_part(f->ik, nt, 1, hd, 0, c->qk_rope, c->idx_interleave, cols, f->cosv, f->sinv);
	x3m_rope_part(f->iq, nt, ih, hd, 0, c->qk_rope, c->idx_interleave, cols, f->cosv, f->sinv);
	float hs = (float)(1.0 / sqrt((double)ih));
	for (int64_t i = 0; i < nt * ih; i++)
		f->iw[i] *= hs;
	f->sel_layer = l;
	return x3_indexer_select(f->iq, f->ik, f->iw, nrows, cols, ih, hd, c->index_topk, 1.0 / sqrt((double)hd),
	                         f->sel + f->tok0 * x3_sel_stride(cols));
}

/* Multi-head latent attention (DeepSeek V3, GLM-4.7-Flash) of a chunk of nrows rows from
 * the normed hidden f->xn (nt, hidden) into f->a (nt, heads * v_head_dim):
 *   q = q_b(norm(q_a(x))) (or q_proj(x)), per head (nope | rope);
 *   kv_a(x) = (c | k_rope): c (kv_lora) the latent, k_rope one rope key
 *   shared by all heads; kv_b(norm(c)) per head (k_nope | v);
 *   k = (k_nope | rope(k_rope)), q's rope part rotated alike; softmax of
 *   q·k times attn_scale over the causal keys, times v. */
int x3m_mla_chunk(struct fwd *f, int l, const struct layer_w *w, int64_t nrows)
{
	const x3_model_config *c = &f->m->cfg;
	int64_t cols = f->cols, nt = nrows * cols, H = c->hidden, nh = c->n_heads;
	int64_t np = c->qk_nope, rp = c->qk_rope, vd = c->v_dim, qkd = np + rp, kl = c->kv_lora;
	int64_t kva = kl + rp, kvb = np + vd;
	int rc;
	if ((rc = x3m_hook(f, l, c->q_lora > 0 ? X3_SLOT_Q_A : X3_SLOT_Q, f->xn, nt, H)))
		return rc;
	if (c->q_lora > 0) {
		if ((rc = x3m_lin_apply(f, w->lin[X3_SLOT_Q_A], f->xn, nt, cols, f->qa)))
			return rc;
		x3m_rmsnorm(f->qa, f->qa, w->vec[X3_SLOT_Q_A_NORM], nt, c->q_lora, MLA_NORM_EPS);
		if ((rc = x3m_hook(f, l, X3_SLOT_Q_B, f->qa, nt, c->q_lora)) ||
		    (rc = x3m_lin_apply(f, w->lin[X3_SLOT_Q_B], f->qa, nt, cols, f->q)))
			return rc;
	} else if ((rc = x3m_lin_apply(f, w->lin[X3_SLOT_Q], f->xn, nt, cols, f->q))) {
		return rc;
	}
	if ((rc = x3m_lin_apply(f, w->lin[X3_SLOT_KV_A], f->xn, nt, cols, f->kva)))
		return rc;
	for (int64_t t = 0; t < nt; t++)
		memcpy(f->ckv + t * kl, f->kva + t * kva, (size_t)kl * sizeof(float));
	x3m_rmsnorm(f->ckv, f->ckv, w->vec[X3_SLOT_KV_A_NORM], nt, kl, MLA_NORM_EPS);
	if ((rc = x3m_hook(f, l, X3_SLOT_KV_B, f->ckv, nt, kl)) ||
	    (rc = x3m_lin_apply(f, w->lin[X3_SLOT_KV_B], f->ckv, nt, cols, f->kvb)))
		return rc;
	/* the rope key (one per token) rotated once, then every head's key */
	x3m_rope_part(f->kva, nt, 1, kva, kl, rp, c->rope_interleave, cols, f->cosv, f->sinv);
	x3m_rope_part(f->q, nt, nh, qkd, np, rp, c->rope_interleave, cols, f->cosv, f->sinv);
	#pragma omp parallel for if(nt * nh * qkd > (1 << 16)) schedule(static)
	for (int64_t t = 0; t < nt; t++)
		for (int64_t h = 0; h < nh; h++) {
			const float *src = f->kvb + (t * nh + h) * kvb;
			memcpy(f->k + (t * nh + h) * qkd, src, (size_t)np * sizeof(float));
			memcpy(f->k + (t * nh + h) * qkd + np, f->kva + t * kva + kl, (size_t)rp * sizeof(float));
			memcpy(f->v + (t * nh + h) * vd, src + np, (size_t)vd * sizeof(float));
		}
	if (!f->sel)   /* dense, or every query's keys are within index_topk */
		return x3_attention(f->q, f->k, f->v, f->a, nrows, cols, nh, nh, qkd, vd, (float)c->attn_scale, 0, 0);
	if ((rc = dsa_select(f, l, w, nrows)))
		return rc;
	return x3_sparse_attention(f->q, f->k, f->v, f->a, nrows, cols, nh, qkd, vd, c->attn_scale,
	                           f->sel + f->tok0 * x3_sel_stride(cols));
}
