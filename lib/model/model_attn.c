/* model_attn.c: the token mixing of a layer and its residual
 * (model_impl.h): grouped-query attention with its q/k norms, RoPE
 * (Gemma's sliding layers with their own), sliding windows, soft-capping
 * and GPT-OSS's sinks, the hybrids' gated attention, and their Gated
 * DeltaNet layers (gdn.h); multi-head latent attention is model_mla.c's. */
#include <math.h>
#include <string.h>
#include "model_impl.h"

/* A Gated DeltaNet layer's token mixing (gdn.h) on a chunk of nrows rows,
 * from the normed hidden f->xn (nt, hidden) into f->a (nt, value_dim), the
 * input of out_proj: Qwen3-Next's fused projections regrouped into
 * Qwen3.5's split ones (in_proj_qkvz and in_proj_qkv, in_proj_z read one
 * Hessian); in_proj_ba / in_proj_b, in_proj_a are kept matrices. */
static int gdn_chunk(struct fwd *f, int l, const struct layer_w *w, int64_t nrows)
{
	const x3_model_config *c = &f->m->cfg;
	const x3_gdn_shape s = { c->lin_nk, c->lin_nv, c->lin_dk, c->lin_dv, c->lin_kconv, c->rms_eps };
	const x3_gdn_weights gw = { w->vec[X3_SLOT_GDN_CONV], w->vec[X3_SLOT_GDN_ALOG], w->vec[X3_SLOT_GDN_DT],
	                            w->vec[X3_SLOT_GDN_NORM] };
	int64_t cols = f->cols, nt = nrows * cols, H = c->hidden, nv = c->lin_nv;
	int rc;
	if (w->lin[X3_SLOT_GDN_QKVZ]) {
		if ((rc = x3m_hook(f, l, X3_SLOT_GDN_QKVZ, f->xn, nt, H)) ||
		    (rc = x3m_lin_apply(f, w->lin[X3_SLOT_GDN_QKVZ], f->xn, nt, cols, f->gp)) ||
		    (rc = x3_gemm_xwt(f->xn, nt, cols, H, w->vec[X3_SLOT_GDN_BA], 2 * nv, f->ga)))
			return rc;
		/* in_proj_ba's outputs (nt, 2 nv) in ga, a's regrouped after them */
		x3_gdn_unfuse(&s, f->gp, f->ga, nt, f->gmix, f->gz, f->gb, f->ga + nt * 2 * nv);
		memmove(f->ga, f->ga + nt * 2 * nv, (size_t)(nt * nv) * sizeof(float));
	} else {
		if ((rc = x3m_hook(f, l, X3_SLOT_GDN_QKV, f->xn, nt, H)) ||
		    (rc = x3m_lin_apply(f, w->lin[X3_SLOT_GDN_QKV], f->xn, nt, cols, f->gmix)) ||
		    (rc = x3m_lin_apply(f, w->lin[X3_SLOT_GDN_Z], f->xn, nt, cols, f->gz)) ||
		    (rc = x3_gemm_xwt(f->xn, nt, cols, H, w->vec[X3_SLOT_GDN_B], nv, f->gb)) ||
		    (rc = x3_gemm_xwt(f->xn, nt, cols, H, w->vec[X3_SLOT_GDN_A], nv, f->ga)))
			return rc;
	}
	return x3_gdn_forward(&s, &gw, f->gmix, f->gz, f->gb, f->ga, nrows, cols, f->a);
}

/* The attention of a layer on a chunk of nrows rows and its residual: x
 * (ntok, hidden) updated in place. */
int x3m_attn_chunk(struct fwd *f, int l, const struct layer_w *w, float *x, int64_t nrows)
{
	const x3_model_config *c = &f->m->cfg;
	int64_t cols = f->cols, nt = nrows * cols, H = c->hidden, hd = c->head_dim;
	int64_t nq = c->n_heads, nkv = c->n_kv_heads;
	int rc;

	x3m_rmsnorm(f->xn, x, w->vec[X3_SLOT_IN_NORM], nt, H, c->rms_eps);
	int lin = x3_arch_linear_layer(c, l);
	if (lin) {
		if ((rc = gdn_chunk(f, l, w, nrows)))
			return rc;
	} else if (c->mla) {
		if ((rc = x3m_mla_chunk(f, l, w, nrows)))
			return rc;
	} else {
		if ((rc = x3m_hook(f, l, X3_SLOT_Q, f->xn, nt, H)))
			return rc;
		if ((rc = x3m_lin_apply(f, w->lin[X3_SLOT_Q], f->xn, nt, cols, c->hybrid ? f->qg : f->q)) ||
		    (rc = x3m_lin_apply(f, w->lin[X3_SLOT_K], f->xn, nt, cols, f->k)) ||
		    (rc = x3m_lin_apply(f, w->lin[X3_SLOT_V], f->xn, nt, cols, f->v)))
			return rc;
		if (c->hybrid) {
			/* gated attention: each head's [query | gate]; the gates
			 * packed to the front of qg (nt, heads * head_dim) */
			for (int64_t t = 0; t < nt; t++)
				for (int64_t h = 0; h < nq; h++)
					memcpy(f->q + (t * nq + h) * hd, f->qg + (t * nq + h) * 2 * hd, (size_t)hd * sizeof(float));
			for (int64_t t = 0; t < nt; t++)
				for (int64_t h = 0; h < nq; h++)
					memmove(f->qg + (t * nq + h) * hd, f->qg + (t * nq + h) * 2 * hd + hd,
					        (size_t)hd * sizeof(float));
		}
		if (c->qk_norm) {
			x3m_rmsnorm(f->q, f->q, w->vec[X3_SLOT_Q_NORM], nt * nq, hd, c->rms_eps);
			x3m_rmsnorm(f->k, f->k, w->vec[X3_SLOT_K_NORM], nt * nkv, hd, c->rms_eps);
		}
		/* Gemma: a sliding layer's window and RoPE */
		int swa = c->swa_masked && l < 1024 && (c->swa_layers[l / 64] >> (l % 64) & 1);
		const float *cs = swa && f->cosl ? f->cosl : f->cosv, *sn = swa && f->cosl ? f->sinl : f->sinv;
		x3m_rope_apply(f->q, nt, nq, hd, x3m_rope_dim(c), cols, cs, sn);
		x3m_rope_apply(f->k, nt, nkv, hd, x3m_rope_dim(c), cols, cs, sn);
		double sc = c->attn_scale > 0 ? c->attn_scale : 1.0 / sqrt((double)hd);
		/* GPT-OSS's sinks (NULL elsewhere) */
		if ((rc = x3_attention_sinks(f->q, f->k, f->v, f->a, nrows, cols, nq, nkv, hd, hd, (float)sc,
		                             swa ? c->sliding_window : 0, (float)c->attn_softcap,
		                             w->vec[X3_SLOT_SINKS])))
			return rc;
		if (c->hybrid) {
			#pragma omp parallel for if(nt * nq * hd > (1 << 16)) schedule(static)
			for (int64_t i = 0; i < nt * nq * hd; i++)
				f->a[i] *= 1.0f / (1.0f + expf(-f->qg[i]));
		}
	}
	const int os = lin ? X3_SLOT_GDN_OUT : X3_SLOT_O;
	if ((rc = x3m_hook(f, l, os, f->a, nt, lin ? x3_arch_dim(c, X3_DIM_GDN_V) : x3_arch_dim(c, X3_DIM_V_ALL))))
		return rc;
	/* o_proj output into xn (free now), then the residual */
	if ((rc = x3m_lin_apply(f, w->lin[os], f->a, nt, cols, f->xn)))
		return rc;
	if (w->vec[X3_SLOT_ATTN_OUT_NORM])   /* Gemma's post_attention_layernorm */
		x3m_rmsnorm(f->xn, f->xn, w->vec[X3_SLOT_ATTN_OUT_NORM], nt, H, c->rms_eps);
	#pragma omp parallel for if(nt * H > (1 << 16)) schedule(static)
	for (int64_t i = 0; i < nt * H; i++)
		x[i] += f->xn[i];
	return X3_OK;
}
