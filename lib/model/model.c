/* model.c: Llama-family causal LM forward in F32 on CPU (see model.h).
 * Which tensors a layer has, their shapes and the Hessian groups come
 * from the architecture's description (arch.h); this file drives the
 * forward pass over its slots: the batch cut into chunks of rows, the
 * embedding, each layer's weights loaded (model_load.c) and run chunk by
 * chunk (attention: model_attn.c, model_mla.c; the mixture of experts:
 * model_moe.c; the dense MLP here), the capture hook and the callbacks
 * with their timing, the final norm, the head and the logits. The files
 * share model_impl.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model_impl.h"

void x3_forward_opts_init(struct x3_forward_opts *o, const x3_model *m)
{
	memset(o, 0, sizeof *o);
	o->hook_first = 0;
	o->hook_last = (int)m->cfg.n_layers;
	o->last_layer = (int)m->cfg.n_layers;
	o->logits_mode = X3_LOGITS_NONE;
}

/* ---- kernels, hooks and timing ------------------------------------------ */
/* y = rmsnorm(x) * w over rows of n (HF: x * rsqrt(mean(x^2) + eps) * w) */
void x3m_rmsnorm(float *y, const float *x, const float *w, int64_t rows, int64_t n, double eps)
{
	#pragma omp parallel for if(rows * n > (1 << 16)) schedule(static)
	for (int64_t r = 0; r < rows; r++) {
		const float *xr = x + r * n;
		float *yr = y + r * n;
		double ss = 0;
		for (int64_t i = 0; i < n; i++)
			ss += (double)xr[i] * xr[i];
		float s = (float)(1.0 / sqrt(ss / (double)n + eps));
		for (int64_t i = 0; i < n; i++)
			yr[i] = w[i] * (xr[i] * s);
	}
}

/* x3_linear_apply, its time in the forward's timing */
int x3m_lin_apply(const struct fwd *f, x3_linear *l, const float *x, int64_t rows, int64_t seg,
                  float *y)
{
	struct x3_forward_timing *t = f->o->timing;
	double t0 = t ? x3_now() : 0;
	int rc = x3_linear_apply(l, x, rows, seg, y);
	if (t)
		t->linears += x3_now() - t0;
	return rc;
}

static int hook_mod(struct fwd *f, int layer, const x3_module *d, const float *x, int64_t ntok, int64_t in);
/* The capture hook for the Hessian group that the module of slot s of
 * layer l reads. */
int x3m_hook(struct fwd *f, int layer, int s, const float *x, int64_t ntok, int64_t in)
{
	const struct x3_forward_opts *o = f->o;
	if (!o->hook || layer < o->hook_first || layer > o->hook_last)
		return X3_OK;
	const x3_module *d = mod(f->m, layer, s);
	/* a matrix kept in the source precision (DeepSeek's kv_b_proj) is
	 * no linear to quantize: no Hessian */
	if (!d || d->d->kind != X3_KIND_LINEAR)
		return X3_OK;
	return hook_mod(f, layer, d, x, ntok, in);
}

/* ... of an expert's group (x3_capture's expert, all_tokens, row_w) */
int x3m_hook_ex(struct fwd *f, int layer, const x3_module *d, const float *x, int64_t ntok,
                int64_t in, int all, const float *row_w)
{
	const struct x3_forward_opts *o = f->o;
	if (!o->hook || layer < o->hook_first || layer > o->hook_last)
		return X3_OK;
	char mb[1024];
	int rc = x3_modules_members(f->m->mods, f->m->nmods, d->group, mb, sizeof mb);
	if (rc)
		return rc;
	struct x3_capture c = { layer, d->group, mb, d->tied ? d->weight : NULL, x, ntok, in,
	                        d->expert, all, row_w };
	double t0 = o->timing ? x3_now() : 0;
	rc = o->hook(o->hook_ctx, &c);
	if (o->timing)
		o->timing->hook += x3_now() - t0;
	return rc;
}

static int hook_mod(struct fwd *f, int layer, const x3_module *d, const float *x, int64_t ntok, int64_t in)
{
	return x3m_hook_ex(f, layer, d, x, ntok, in, 0, NULL);
}

/* One layer on a chunk of nrows rows: x (ntok, hidden) updated in place
 * (a mixture-of-experts layer: chunk-major, x3_forward_opts.moe_chunk_major). */
static int layer_chunk(struct fwd *f, int l, const struct layer_w *w, float *x, int64_t nrows)
{
	const x3_model_config *c = &f->m->cfg;
	int64_t cols = f->cols, nt = nrows * cols, H = c->hidden, inter = c->intermediate;
	int rc;

	if ((rc = x3m_attn_chunk(f, l, w, x, nrows)))
		return rc;
	x3m_rmsnorm(f->xn, x, w->vec[X3_SLOT_POST_NORM], nt, H, c->rms_eps);
	if (w->sparse) {
		if ((rc = x3m_moe_chunk(f, l, w, nt)))
			return rc;
		#pragma omp parallel for if(nt * H > (1 << 16)) schedule(static)
		for (int64_t i = 0; i < nt * H; i++)
			x[i] += f->mo[i];
		return X3_OK;
	}
	if ((rc = x3m_hook(f, l, X3_SLOT_GATE, f->xn, nt, H)))
		return rc;
	if ((rc = x3m_lin_apply(f, w->lin[X3_SLOT_GATE], f->xn, nt, cols, f->g)) ||
	    (rc = x3m_lin_apply(f, w->lin[X3_SLOT_UP], f->xn, nt, cols, f->u)))
		return rc;
	if (c->act_gelu_tanh) {
		/* gelu_pytorch_tanh: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) */
		#pragma omp parallel for if(nt * inter > (1 << 16)) schedule(static)
		for (int64_t i = 0; i < nt * inter; i++) {
			float gv = f->g[i];
			f->g[i] = 0.5f * gv * (1.0f + tanhf(0.7978845608028654f * (gv + 0.044715f * gv * gv * gv))) *
			          f->u[i];
		}
	} else {
		#pragma omp parallel for if(nt * inter > (1 << 16)) schedule(static)
		for (int64_t i = 0; i < nt * inter; i++) {
			float gv = f->g[i];
			f->g[i] = gv / (1.0f + expf(-gv)) * f->u[i];
		}
	}
	if ((rc = x3m_hook(f, l, X3_SLOT_DOWN, f->g, nt, inter)))
		return rc;
	if ((rc = x3m_lin_apply(f, w->lin[X3_SLOT_DOWN], f->g, nt, cols, f->xn)))
		return rc;
	if (w->vec[X3_SLOT_MLP_OUT_NORM])    /* Gemma's post_feedforward_layernorm */
		x3m_rmsnorm(f->xn, f->xn, w->vec[X3_SLOT_MLP_OUT_NORM], nt, H, c->rms_eps);
	#pragma omp parallel for if(nt * H > (1 << 16)) schedule(static)
	for (int64_t i = 0; i < nt * H; i++)
		x[i] += f->xn[i];
	return X3_OK;
}

static int64_t i64max(int64_t a, int64_t b) { return a > b ? a : b; }

/* Rows of the chunk that starts at row r0: chunk_rows, cut at the end of
 * r0's segment of seg rows (x3_forward_opts.seg_rows). */
int64_t x3m_chunk_len(int64_t r0, int64_t chunk_rows, int64_t seg, int64_t rows)
{
	int64_t end = (r0 / seg + 1) * seg;
	if (end > rows)
		end = rows;
	return end - r0 < chunk_rows ? end - r0 : chunk_rows;
}

/* a callback's time in the forward's timing: t0 = x3m_cb_start(o) before
 * it, rc = x3m_cb_end(o, t0, rc) after */
double x3m_cb_start(const struct x3_forward_opts *o) { return o->timing ? x3_now() : 0; }

int x3m_cb_end(const struct x3_forward_opts *o, double t0, int rc)
{
	if (o->timing)
		o->timing->callbacks += x3_now() - t0;
	return rc;
}

/* seg_done when the chunk that ended at row e closed a segment */
int x3m_seg_after(const struct x3_forward_opts *o, int l, int64_t e, int64_t seg, int64_t rows)
{
	if (!o->seg_done || (e % seg && e != rows))
		return X3_OK;
	double t0 = x3m_cb_start(o);
	return x3m_cb_end(o, t0, o->seg_done(o->seg_done_ctx, l, (e - 1) / seg));
}

/* The forward's batch, options and token ids checked against the model */
static int check_args(const x3_model *m, const int32_t *tokens, int64_t rows, int64_t cols,
                      const struct x3_forward_opts *o)
{
	const x3_model_config *c = &m->cfg;
	int n = (int)c->n_layers;
	if (rows < 1 || cols < 1 || rows > INT64_MAX / cols)
		return x3_err(X3_EINVAL, "forward: bad batch %lldx%lld", (long long)rows, (long long)cols);
	int64_t T = rows * cols;
	if (c->sliding_window && !c->swa_masked && cols > c->sliding_window)
		return x3_err(X3_EUNSUP, "forward: rows of %lld tokens exceed the sliding window "
		              "(%lld), which is not supported", (long long)cols, (long long)c->sliding_window);
	if (o->logits_mode != X3_LOGITS_NONE && (!o->logits || o->last_layer < n))
		return x3_err(X3_EINVAL, "forward: logits need a buffer and all layers");
	int first = o->hidden ? o->first_layer : 0;
	if (first < 0 || first > n)
		return x3_err(X3_EINVAL, "forward: first layer %d is not 0..%d", first, n);
	for (int64_t i = 0; i < T; i++)
		if (tokens[i] < 0 || tokens[i] >= c->vocab)
			return x3_err(X3_EINVAL, "forward: token id %ld at row %lld, column %lld is "
			              "outside the vocabulary (0..%lld)", (long)tokens[i],
			              (long long)(i / cols), (long long)(i % cols), (long long)c->vocab - 1);
	return X3_OK;
}

/* The embedding rows of tokens (T of them) into x (T, hidden): converted
 * from the mmap'd table, checked finite, Gemma's scaled by sqrt(hidden). */
static int embed_rows(const x3_model *m, const int32_t *tokens, int64_t T, float *x)
{
	const x3_model_config *c = &m->cfg;
	int64_t H = c->hidden;
	size_t es = x3_dtype_size(m->embed->dtype);
	for (int64_t t = 0; t < T; t++)
		x3_convert(x + t * H, X3_F32, (const char *)m->embed->data + (size_t)tokens[t] * H * es,
		           m->embed->dtype, (size_t)H);
	/* the rows read are in x now */
	x3_st_drop(m->embed, m->embed->data, m->embed->nbytes);
	for (int64_t i = 0; i < T * H; i++)
		if (!isfinite(x[i]))
			return x3_err(X3_ENUM, "tensor '%s': non-finite value %g at [%d][%lld] (token %lld of the input)",
			              m->embed->name, (double)x[i], tokens[i / H], (long long)(i % H),
			              (long long)(i / H));
	if (c->gemma) {
		/* Gemma: times sqrt(hidden_size) rounded to the embedding's dtype
		 * (Hugging Face's normalizer is a tensor of the model's dtype:
		 * sqrt(2304) = 48 exactly, sqrt(2560) = 50.596... -> 50.5 in BF16) */
		float nf = (float)sqrt((double)H), nr;
		char tmp[8];
		x3_convert(tmp, m->embed->dtype, &nf, X3_F32, 1);
		x3_convert(&nr, X3_F32, tmp, m->embed->dtype, 1);
		#pragma omp parallel for if(T * H > (1 << 16)) schedule(static)
		for (int64_t i = 0; i < T * H; i++)
			x[i] *= nr;
	}
	return X3_OK;
}

/* The final norm and the head over all rows x (rows * cols, hidden): the
 * head's capture hook, the logits (x3_forward_opts.logits_mode). */
static int head_pass(struct fwd *f, float *x, int64_t rows, int64_t chunk_rows, int64_t seg)
{
	x3_model *m = f->m;
	const struct x3_forward_opts *o = f->o;
	const x3_model_config *c = &m->cfg;
	int64_t H = c->hidden, cols = f->cols;
	int n = (int)c->n_layers, rc = X3_OK;
	float *norm = NULL;
	x3_linear *head = NULL;
	x3_wbuf hwb = { 0 };
	const x3_module *fn = mod(m, n, X3_SLOT_FINAL_NORM);
	double t0 = x3_now();
	if ((rc = x3m_load_vec(m->st, fn->weight, fn->out, &norm)) || (rc = x3m_head_open(m, 0, &head)) ||
	    (m->on_use && (rc = x3_linear_on_use(head, &hwb))) ||
	    (o->device != X3_DEVICE_CPU && (rc = x3_linear_set_device(head, o->device)))) {
		free(norm);
		x3_linear_free(head);
		x3_wbuf_free(&hwb);
		return rc;
	}
	if (o->timing)
		o->timing->load += x3_now() - t0;
	if (c->gemma || c->norm_offset)
		x3m_gemma_norm(norm, fn->out);
	for (int64_t r0 = 0, nr; r0 < rows && !rc; r0 += nr) {
		nr = x3m_chunk_len(r0, chunk_rows, seg, rows);
		int64_t nt = nr * cols;
		float *xr = x + r0 * cols * H;
		x3m_rmsnorm(f->xn, xr, norm, nt, H, c->rms_eps);
		if ((rc = x3m_hook(f, n, X3_SLOT_HEAD, f->xn, nt, H)))
			break;
		float *lg = NULL;
		int64_t nlg = 0;
		if (o->logits_mode == X3_LOGITS_ALL) {
			lg = o->logits + r0 * cols * c->vocab, nlg = nt * c->vocab;
			rc = x3m_lin_apply(f, head, f->xn, nt, cols, lg);
		} else if (o->logits_mode == X3_LOGITS_LAST) {
			for (int64_t r = 0; r < nr; r++)
				memmove(f->xn + r * H, f->xn + ((r + 1) * cols - 1) * H, (size_t)H * sizeof(float));
			lg = o->logits + r0 * c->vocab, nlg = nr * c->vocab;
			rc = x3m_lin_apply(f, head, f->xn, nr, 0, lg);
		}
		if (!rc && lg && c->final_softcap > 0) {
			/* Gemma2's final_logit_softcapping: cap * tanh(logit / cap) */
			float cap = (float)c->final_softcap;
			#pragma omp parallel for if(nlg > (1 << 16)) schedule(static)
			for (int64_t i = 0; i < nlg; i++)
				lg[i] = cap * tanhf(lg[i] / cap);
		}
		if (!rc)
			rc = x3m_seg_after(o, n, r0 + nr, seg, rows);
	}
	free(norm);
	x3_linear_free(head);
	x3_wbuf_free(&hwb);
	if (!rc && o->layer_done) {
		double tc = x3m_cb_start(o);
		rc = x3m_cb_end(o, tc, o->layer_done(o->layer_done_ctx, n, n));
	}
	return rc;
}

/* The multi-token prediction layer (x3_forward_opts.mtp_logits) over the
 * main model's last hidden states x (rows * cols, hidden; the residual
 * stream after its last layer). */
static int mtp_pass(struct fwd *f, const int32_t *tokens, const float *x, int64_t rows, int64_t chunk_rows)
{
	x3_model *m = f->m;
	const struct x3_forward_opts *o = f->o;
	const x3_model_config *c = &m->cfg;
	int64_t H = c->hidden, cols = f->cols, cm = cols - 1, Tm = rows * cm;
	int n = (int)c->n_layers, L = n + 1, rc;
	if (cm < 1)
		return x3_err(X3_EINVAL, "the multi-token prediction layer needs rows of 2 tokens or more");
	x3_linear *fc = NULL, *head = NULL;
	float *vec[3] = { NULL, NULL, NULL }, *fnorm = NULL;
	float *cat = malloc((size_t)Tm * 2 * H * sizeof *cat), *xm = malloc((size_t)Tm * H * sizeof *xm);
	int32_t *tok = calloc((size_t)(Tm ? Tm : 1), sizeof *tok);
	struct layer_w w;
	int have_w = 0;
	if (!cat || !xm || !tok) {
		rc = x3_err(X3_ENOMEM, "forward: out of memory for the multi-token prediction layer");
		goto out;
	}
	if ((rc = x3m_mtp_load(m, &fc, vec)) || (rc = x3m_head_open(m, 0, &head)))
		goto out;
	if (c->hybrid) {   /* the hybrids' MTP layer reads the main model's normed state */
		const x3_module *fn = mod(m, n, X3_SLOT_FINAL_NORM);
		if ((rc = x3m_load_vec(m->st, fn->weight, fn->out, &fnorm)))
			goto out;
		x3m_gemma_norm(fnorm, fn->out);
	}
	/* [enorm(embed(token t + 1)) | hnorm(h_t)] per row and position t < cols - 1 */
	for (int64_t r = 0; r < rows; r++)
		for (int64_t t = 0; t < cm; t++)
			tok[r * cm + t] = tokens[r * cols + t + 1];
	if ((rc = embed_rows(m, tok, Tm, xm)))
		goto out;
	for (int64_t r = 0; r < rows; r++)
		for (int64_t t = 0; t < cm; t++) {
			int64_t i = r * cm + t;
			const float *h = x + (r * cols + t) * H;
			if (fnorm) {
				x3m_rmsnorm(f->xn, h, fnorm, 1, H, c->rms_eps);
				h = f->xn;
			}
			x3m_rmsnorm(cat + i * 2 * H + H, h, vec[1], 1, H, c->rms_eps);
			x3m_rmsnorm(cat + i * 2 * H, xm + i * H, vec[0], 1, H, c->rms_eps);
		}
	if ((rc = x3m_lin_apply(f, fc, cat, Tm, cm, xm)))
		goto out;
	/* its decoder layer over positions 0..cols-2 */
	if ((rc = x3m_layer_load(m, L, 0, 1, &w))) {
		x3_errprefix(rc, "the multi-token prediction layer");
		goto out;
	}
	have_w = 1;
	f->cols = cm;
	if (w.sparse)
		rc = x3m_moe_layer(f, L, &w, xm, rows, chunk_rows, rows);
	for (int64_t r0 = 0, nr; r0 < rows && !rc && !w.sparse; r0 += nr) {
		nr = r0 + chunk_rows < rows ? chunk_rows : rows - r0;
		f->tok0 = r0 * cm;
		rc = layer_chunk(f, L, &w, xm + r0 * cm * H, nr);
	}
	f->cols = cols;
	if (rc)
		goto out;
	/* its final norm, the model's head */
	x3m_rmsnorm(xm, xm, vec[2], Tm, H, c->rms_eps);
	rc = x3m_lin_apply(f, head, xm, Tm, cm, o->mtp_logits);
	if (!rc && c->final_softcap > 0) {
		float cap = (float)c->final_softcap;
		for (int64_t i = 0; i < Tm * c->vocab; i++)
			o->mtp_logits[i] = cap * tanhf(o->mtp_logits[i] / cap);
	}
out:
	if (have_w)
		x3m_layer_free(&w);
	x3_linear_free(fc);
	x3_linear_free(head);
	for (int i = 0; i < 3; i++)
		free(vec[i]);
	free(fnorm), free(cat), free(xm), free(tok);
	return rc;
}

int x3_model_forward(x3_model *m, const int32_t *tokens, int64_t rows, int64_t cols,
                     const struct x3_forward_opts *o)
{
	const x3_model_config *c = &m->cfg;
	int64_t H = c->hidden, T;
	int n = (int)c->n_layers;
	const double t_begin = x3_now();
	int rc = check_args(m, tokens, rows, cols, o);
	if (rc)
		return rc;
	T = rows * cols;
	int first = o->hidden ? o->first_layer : 0;

	int64_t chunk_rows = (o->chunk_tokens > 0 ? o->chunk_tokens : 4096) / cols;
	if (chunk_rows < 1)
		chunk_rows = 1;
	int64_t seg = o->seg_rows > 0 && o->seg_rows < rows ? o->seg_rows : rows;
	if (chunk_rows > seg)
		chunk_rows = seg;
	int64_t ct = chunk_rows * cols, qd = c->n_heads * c->head_dim;
	int64_t kvd = c->n_kv_heads * c->head_dim, half = x3m_rope_dim(c) / 2;
	int64_t vall = x3_arch_dim(c, X3_DIM_V_ALL);
	struct fwd f = { .m = m, .o = o, .cols = cols };
	float *x = o->hidden ? o->hidden : malloc((size_t)T * H * sizeof *x);
	f.xn = malloc((size_t)ct * i64max(H, qd) * sizeof(float));
	f.q = malloc((size_t)ct * qd * sizeof(float));
	int64_t gvd = x3_arch_dim(c, X3_DIM_GDN_V);
	f.a = malloc((size_t)ct * i64max(i64max(i64max(qd, vall), H), gvd) * sizeof(float));   /* also the shared expert's output */
	f.k = malloc((size_t)ct * kvd * sizeof(float));
	f.v = malloc((size_t)ct * i64max(kvd, vall) * sizeof(float));
	if (c->mla) {
		f.qa = malloc((size_t)ct * (c->q_lora > 0 ? c->q_lora : 1) * sizeof(float));
		f.kva = malloc((size_t)ct * (c->kv_lora + c->qk_rope) * sizeof(float));
		f.ckv = malloc((size_t)ct * c->kv_lora * sizeof(float));
		f.kvb = malloc((size_t)ct * x3_arch_dim(c, X3_DIM_KV_B) * sizeof(float));
	}
	int mla_fail = c->mla && (!f.qa || !f.kva || !f.ckv || !f.kvb);
	if (c->hybrid) {
		int64_t gcd = x3_arch_dim(c, X3_DIM_GDN_CONV), gnv = c->lin_nv;
		f.qg = malloc((size_t)ct * 2 * qd * sizeof(float));
		f.gp = malloc((size_t)ct * (gcd + gvd) * sizeof(float));
		f.gmix = malloc((size_t)ct * gcd * sizeof(float));
		f.gz = malloc((size_t)ct * gvd * sizeof(float));
		f.gb = malloc((size_t)ct * 2 * gnv * sizeof(float));
		f.ga = malloc((size_t)ct * 3 * gnv * sizeof(float));
		mla_fail |= !f.qg || !f.gp || !f.gmix || !f.gz || !f.gb || !f.ga;
	}
	f.sel_layer = -1;
	if (c->dsa && cols > c->index_topk) {
		f.sel = malloc((size_t)(T * x3_sel_stride(cols)));
		f.iq = malloc((size_t)ct * x3_arch_dim(c, X3_DIM_IDX_Q) * sizeof(float));
		f.ik = malloc((size_t)ct * c->index_hd * sizeof(float));
		f.iw = malloc((size_t)ct * c->index_heads * sizeof(float));
		mla_fail |= !f.sel || !f.iq || !f.ik || !f.iw;
	}
	int64_t gi = i64max(c->intermediate, c->shared_inter);
	f.g = malloc((size_t)ct * gi * sizeof(float));
	f.u = malloc((size_t)ct * gi * sizeof(float));
	f.mo = malloc((size_t)ct * H * sizeof(float));
	f.cosv = malloc((size_t)cols * half * sizeof(float));
	f.sinv = malloc((size_t)cols * half * sizeof(float));
	double *fr = malloc((size_t)half * sizeof *fr);
	if (!x || !f.xn || !f.q || !f.a || !f.k || !f.v || !f.g || !f.u || !f.mo || !f.cosv || !f.sinv || !fr ||
	    mla_fail) {
		rc = x3_err(X3_ENOMEM, "forward: out of memory for %lld tokens", (long long)T);
		goto out;
	}
	x3m_rope_table(c, cols, fr, f.cosv, f.sinv);
	if (c->rope_local_theta > 0) {
		/* Gemma3's sliding layers: base rope_local_base_freq, no scaling */
		x3_model_config lc = *c;
		lc.rope_theta = c->rope_local_theta;
		lc.rope_type = 0;
		f.cosl = malloc((size_t)cols * half * sizeof(float));
		f.sinl = malloc((size_t)cols * half * sizeof(float));
		if (!f.cosl || !f.sinl) {
			rc = x3_err(X3_ENOMEM, "forward: out of memory for %lld tokens", (long long)T);
			goto out;
		}
		x3m_rope_table(&lc, cols, fr, f.cosl, f.sinl);
	}

	/* the embedding (unless resuming) */
	if (!o->hidden && (rc = embed_rows(m, tokens, T, x)))
		goto out;

	int last = o->last_layer < n ? o->last_layer : n - 1;
	for (int l = first; l <= last; l++) {
		struct layer_w w;
		double tc = x3m_cb_start(o);
		if (o->layer_input && (rc = x3m_cb_end(o, tc, o->layer_input(o->layer_input_ctx, l, x, T, H))))
			goto out;
		int ex_major = x3_arch_sparse_layer(c, l) && !o->moe_chunk_major;
		double t0 = x3_now();
		if ((rc = x3m_layer_load(m, l, 0, !ex_major, &w))) {
			x3_errprefix(rc, "layer %d", l);
			goto out;
		}
		if (o->device != X3_DEVICE_CPU && (rc = x3m_layer_to_device(&w, o->device))) {
			x3m_layer_free(&w);
			x3_errprefix(rc, "layer %d", l);
			goto out;
		}
		if (o->timing)
			o->timing->load += x3_now() - t0;
		if (ex_major)
			rc = x3m_moe_layer(&f, l, &w, x, rows, chunk_rows, seg);
		for (int64_t r0 = 0, nr; r0 < rows && !rc && !ex_major; r0 += nr) {
			nr = x3m_chunk_len(r0, chunk_rows, seg, rows);
			f.tok0 = r0 * cols;
			if (!(rc = layer_chunk(&f, l, &w, x + r0 * cols * H, nr)))
				rc = x3m_seg_after(o, l, r0 + nr, seg, rows);
		}
		x3m_layer_free(&w);
		if (rc)
			goto out;
		tc = x3m_cb_start(o);
		if (o->layer_done && (rc = x3m_cb_end(o, tc, o->layer_done(o->layer_done_ctx, l, n))))
			goto out;
	}
	/* the states entering the layer after the last one run (its output),
	 * also when the forward stops before that layer */
	double tc = x3m_cb_start(o);
	if (o->layer_input && (rc = x3m_cb_end(o, tc, o->layer_input(o->layer_input_ctx, last + 1, x, T, H))))
		goto out;
	if (o->last_layer < n)
		goto out;
	int want_hook = o->hook && o->hook_first <= n && o->hook_last >= n;
	if ((want_hook || o->logits_mode != X3_LOGITS_NONE) && (rc = head_pass(&f, x, rows, chunk_rows, seg)))
		goto out;
	if (o->mtp_logits)
		rc = mtp_pass(&f, tokens, x, rows, chunk_rows);
out:
	if (x != o->hidden)
		free(x);
	free(f.xn), free(f.q), free(f.a), free(f.k), free(f.v), free(f.g), free(f.u), free(f.mo);
	free(f.cosv), free(f.sinv), free(f.cosl), free(f.sinl), free(fr);
	free(f.qa), free(f.kva), free(f.ckv), free(f.kvb);
	free(f.qg), free(f.gp), free(f.gmix), free(f.gz), free(f.gb), free(f.ga);
	free(f.sel), free(f.iq), free(f.ik), free(f.iw);
	if (o->timing)
		o->timing->total += x3_now() - t_begin;
	return rc;
}
