/* model_load.c: a layer's weights for the forward (model_impl.h): the
 * sources of a tensor (the model, an overlay of EXL3 layers, a patch of
 * EXL3 linears), the dense or EXL3 linears of each slot, the vectors
 * (norms, biases), the matrices kept in the source precision (router,
 * shared-expert gate, the indexer's, the Gated DeltaNet's), the experts
 * opened one at a time, the head; and x3_model_open, which checks every
 * layer's tensors against the config before a forward runs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model_impl.h"

const x3_model_config *x3_model_cfg(const x3_model *m) { return &m->cfg; }

/* Source of the linears of a layer: the overlay for overlay layers. */
static x3_st *layer_src(const x3_model *m, int layer)
{
	if (m->ov && layer >= m->ov_first && layer <= m->ov_last)
		return m->ov;
	return m->st;
}

/* Source of the linear KEY of layer l: the patch when it holds the
 * linear's trellis, else the layer's source. */
static x3_st *lin_src(const x3_model *m, int layer, const char *key)
{
	char k[X3_KEY_MAX + 16];
	snprintf(k, sizeof k, "%s.trellis", key);
	if (m->patch && x3_st_find(m->patch, k))
		return m->patch;
	return layer_src(m, layer);
}

/* Source of a norm vector of a layer: the overlay when it has it (an EXL3
 * directory does; a directory of quantized linears alone may not). */
static x3_st *norm_src(const x3_model *m, int layer, const char *name)
{
	x3_st *st = layer_src(m, layer);
	return st == m->ov && !x3_st_find(st, name) ? m->st : st;
}

/* ---- per-layer weights ------------------------------------------------ */
/* the linears and the norm vectors of a layer, by slot */
static const int lin_slots[] = { X3_SLOT_Q, X3_SLOT_K, X3_SLOT_V, X3_SLOT_O,
	X3_SLOT_GATE, X3_SLOT_UP, X3_SLOT_DOWN, X3_SLOT_SHX_GATE, X3_SLOT_SHX_UP, X3_SLOT_SHX_DOWN,
	X3_SLOT_Q_A, X3_SLOT_Q_B, X3_SLOT_KV_A, X3_SLOT_KV_B, X3_SLOT_IDX_QB,
	X3_SLOT_GDN_QKVZ, X3_SLOT_GDN_QKV, X3_SLOT_GDN_Z, X3_SLOT_GDN_OUT };
static const int vec_slots[] = { X3_SLOT_IN_NORM, X3_SLOT_POST_NORM, X3_SLOT_Q_NORM, X3_SLOT_K_NORM,
	X3_SLOT_Q_A_NORM, X3_SLOT_KV_A_NORM, X3_SLOT_ROUTER_BIAS, X3_SLOT_ATTN_OUT_NORM, X3_SLOT_MLP_OUT_NORM,
	X3_SLOT_SINKS, X3_SLOT_ROUTER_LOGIT_BIAS, X3_SLOT_GDN_ALOG, X3_SLOT_GDN_DT, X3_SLOT_GDN_NORM,
	X3_SLOT_IDX_K_NORM, X3_SLOT_IDX_K_BIAS };
#define N_LIN (int)(sizeof lin_slots / sizeof *lin_slots)
#define N_VEC (int)(sizeof vec_slots / sizeof *vec_slots)

/* Gemma's RMSNorm scales by 1 + w (in F32, as Hugging Face's
 * Gemma2RMSNorm/Gemma3RMSNorm): the stored w becomes 1 + w on load. */
void x3m_gemma_norm(float *w, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		w[i] += 1.0f;
}

/* A 1-D vector tensor of length n as F32 (check only when out == NULL). */
int x3m_load_vec(x3_st *st, const char *name, int64_t n, float **out)
{
	const x3_tensor *t = x3_st_find(st, name);
	if (!t)
		return x3_err(X3_EFORMAT, "tensor '%s' is missing", name);
	if (t->rank != 1 || t->shape[0] != n) {
		char b[64];
		return x3_err(X3_EFORMAT, "tensor '%s': shape %s, config says %lld", name,
		              x3_shape_str(t, b, sizeof b), (long long)n);
	}
	if (t->dtype != X3_F32 && t->dtype != X3_F16 && t->dtype != X3_BF16)
		return x3_err(X3_EFORMAT, "tensor '%s': dtype %s (F32, F16 or BF16 expected)", name,
		              x3_dtype_name(t->dtype));
	if (!out)
		return X3_OK;
	*out = x3_tensor_f32(t);
	if (!*out)
		return x3_errprefix(X3_ENOMEM, "tensor '%s'", name);
	x3_st_drop(t, t->data, t->nbytes);
	/* a NaN in a norm makes every output non-finite: named here */
	for (int64_t i = 0; i < n; i++)
		if (!isfinite((*out)[i])) {
			int rc = x3_err(X3_ENUM, "tensor '%s': non-finite value %g at [%lld]", name,
			                (double)(*out)[i], (long long)i);
			free(*out);
			*out = NULL;
			return rc;
		}
	return X3_OK;
}

void x3m_layer_free(struct layer_w *w)
{
	for (int i = 0; i < X3_SLOT_COUNT; i++) {
		x3_linear_free(w->lin[i]);
		free(w->vec[i]);
	}
	for (int i = 0; i < 3 * w->nex && w->ex; i++)
		x3_linear_free(w->ex[i]);
	free(w->ex);
	free(w->exm);
	x3_wbuf_free(&w->wb);
	memset(w, 0, sizeof *w);
}

/* Does the forward need a linear of slot s in a layer (sparse: a
 * mixture-of-experts layer)? The others are used when the description has
 * them (the shared expert). */
static int lin_needed(const x3_model_config *c, int s, int sparse)
{
	int mlp = s == X3_SLOT_GATE || s == X3_SLOT_UP || s == X3_SLOT_DOWN;
	if (mlp)
		return !sparse;
	/* a hybrid's layer has the attention's or the DeltaNet's linears,
	 * as the description says (opened where present) */
	if (c->hybrid)
		return 0;
	if (c->mla)
		return s == X3_SLOT_O || s == X3_SLOT_KV_A || s == X3_SLOT_KV_B ||
		       (c->q_lora > 0 ? s == X3_SLOT_Q_A || s == X3_SLOT_Q_B : s == X3_SLOT_Q);
	return s == X3_SLOT_Q || s == X3_SLOT_K || s == X3_SLOT_V || s == X3_SLOT_O;
}

/* Open the linear of module d of layer l (a row slice of a fused source
 * tensor where the source has no KEY of its own: arch.h). */
static int open_mod(const x3_model *m, int l, const x3_module *d, int check, x3_linear **lin)
{
	return x3_linear_open_rows(lin_src(m, l, d->key), d->key, d->sliced ? d->src : NULL, d->row0,
	                           d->src_rows, d->in, d->out, d->bias, check, lin);
}

/* A Gated DeltaNet layer's kept matrices (in_proj_ba, or in_proj_b and
 * in_proj_a) and its conv1d (conv_dim, 1, kernel), as F32 in w->vec (or
 * only checked). */
static int gdn_load(const x3_model *m, int l, int check, struct layer_w *w)
{
	static const int mats[] = { X3_SLOT_GDN_BA, X3_SLOT_GDN_B, X3_SLOT_GDN_A, X3_SLOT_GDN_CONV };
	int rc;
	for (int i = 0; i < 4; i++) {
		const x3_module *d = mod(m, l, mats[i]);
		if (!d)
			continue;
		x3_st *st = norm_src(m, l, d->weight);
		const x3_tensor *t = x3_st_find(st, d->weight);
		if (mats[i] == X3_SLOT_GDN_CONV) {
			char b[64];
			if (!t)
				return x3_err(X3_EFORMAT, "tensor '%s' is missing", d->weight);
			if (t->rank != 3 || t->shape[0] != d->out || t->shape[1] != 1 || t->shape[2] != d->in)
				return x3_err(X3_EFORMAT, "tensor '%s': shape %s, config says %lldx1x%lld (a depthwise "
				              "conv1d: channels x 1 x linear_conv_kernel_dim)", d->weight,
				              x3_shape_str(t, b, sizeof b), (long long)d->out, (long long)d->in);
			if (t->dtype != X3_F32 && t->dtype != X3_F16 && t->dtype != X3_BF16)
				return x3_err(X3_EFORMAT, "tensor '%s': dtype %s (F32, F16 or BF16 expected)", d->weight,
				              x3_dtype_name(t->dtype));
		} else if ((rc = x3_linear_open(st, d->src, d->in, d->out, 0, 1, NULL))) {
			return rc;
		}
		if (check)
			continue;
		if (!(w->vec[mats[i]] = x3_tensor_f32(t)))
			return x3_errprefix(X3_ENOMEM, "tensor '%s'", d->weight);
		x3_st_drop(t, t->data, t->nbytes);
	}
	if (!mod(m, l, X3_SLOT_GDN_CONV) || !mod(m, l, X3_SLOT_GDN_OUT) || !mod(m, l, X3_SLOT_GDN_NORM) ||
	    !mod(m, l, X3_SLOT_GDN_ALOG) || !mod(m, l, X3_SLOT_GDN_DT) ||
	    !(mod(m, l, X3_SLOT_GDN_QKVZ) ? mod(m, l, X3_SLOT_GDN_BA) != NULL :
	      mod(m, l, X3_SLOT_GDN_QKV) && mod(m, l, X3_SLOT_GDN_Z) && mod(m, l, X3_SLOT_GDN_B) &&
	      mod(m, l, X3_SLOT_GDN_A)))
		return x3_err(X3_EINVAL, "layer %d: the description lacks a module of the Gated DeltaNet", l);
	return X3_OK;
}

/* Load (or with check set, only validate) the weights of layer l; the
 * experts' linears too with all_ex, else their modules only (x3m_expert_open
 * opens them one expert at a time). */
int x3m_layer_load(const x3_model *m, int l, int check, int all_ex, struct layer_w *w)
{
	int rc;
	memset(w, 0, sizeof *w);
	w->sparse = x3_arch_sparse_layer(&m->cfg, l);
	for (int i = 0; i < N_LIN; i++) {
		const x3_module *d = mod(m, l, lin_slots[i]);
		int s = lin_slots[i];
		if (!lin_needed(&m->cfg, s, w->sparse)) {
			/* the shared expert when there is one; no dense MLP in a sparse layer */
			if (d && (rc = open_mod(m, l, d, check, &w->lin[s])))
				goto fail;
			continue;
		}
		if (!d) {
			rc = x3_err(X3_EINVAL, "layer %d: the description has no linear of slot %d", l,
			            lin_slots[i]);
			goto fail;
		}
		if ((rc = open_mod(m, l, d, check, &w->lin[d->d->slot])))
			goto fail;
	}
	/* the layer's dense linears (not the experts) made F32 on each use */
	for (int i = 0; i < X3_SLOT_COUNT && m->on_use && !check; i++)
		if (w->lin[i] && (rc = x3_linear_on_use(w->lin[i], &w->wb)))
			goto fail;
	for (int i = 0; i < N_VEC; i++) {
		const x3_module *d = mod(m, l, vec_slots[i]);
		if (d && (rc = x3m_load_vec(norm_src(m, l, d->weight), d->weight, d->out,
		                        check ? NULL : &w->vec[d->d->slot])))
			goto fail;
		/* (1 + w) norms: Gemma's, the hybrids' (not the DeltaNet's gated one) */
		if (d && !check && d->d->role == X3_ROLE_NORM &&
		    (m->cfg.gemma || (m->cfg.norm_offset && d->d->slot != X3_SLOT_GDN_NORM)))
			x3m_gemma_norm(w->vec[d->d->slot], d->out);
	}
	if (x3_arch_linear_layer(&m->cfg, l) && (rc = gdn_load(m, l, check, w)))
		goto fail;
	/* the matrices kept in the source precision: the sparse-attention
	 * indexer's wk and weights_proj; in a mixture-of-experts layer the
	 * router and the shared-expert gate */
	static const int mats[] = { X3_SLOT_IDX_K, X3_SLOT_IDX_W, X3_SLOT_ROUTER, X3_SLOT_SHX_SCALE };
	for (int i = 0; i < 4; i++) {
		const x3_module *d = mod(m, l, mats[i]);
		if (!d || (i >= 2 && !w->sparse))
			continue;
		/* checked as a dense (out, in) weight, under the source's name
		 * of it (src: Mixtral v5's mlp.gate) */
		if ((rc = x3_linear_open(norm_src(m, l, d->weight), d->src, d->in, d->out, 0, 1, NULL)))
			goto fail;
		const x3_tensor *t = x3_st_find(norm_src(m, l, d->weight), d->weight);
		if (!check && !(w->vec[mats[i]] = x3_tensor_f32(t))) {
			rc = x3_errprefix(X3_ENOMEM, "tensor '%s'", d->weight);
			goto fail;
		}
		if (!check)
			x3_st_drop(t, t->data, t->nbytes);
	}
	if (!w->sparse)
		return X3_OK;
	if (!mod(m, l, X3_SLOT_ROUTER)) {
		rc = x3_err(X3_EINVAL, "layer %d: a mixture-of-experts layer without a router", l);
		goto fail;
	}
	w->nex = (int)m->cfg.n_experts;
	w->ex = calloc((size_t)w->nex * 3, sizeof *w->ex);
	w->exm = calloc((size_t)w->nex * 3, sizeof *w->exm);
	if (!w->ex || !w->exm) {
		rc = x3_err(X3_ENOMEM, "out of memory");
		goto fail;
	}
	for (int i = 0; i < m->nmods; i++) {
		const x3_module *d = &m->mods[i];
		if (d->layer != l || d->expert < 0)
			continue;
		int j = d->d->slot - X3_SLOT_EXP_GATE;
		w->exm[d->expert * 3 + j] = d;
		if ((check || all_ex) && (rc = open_mod(m, l, d, check, &w->ex[d->expert * 3 + j])))
			goto fail;
	}
	return X3_OK;
fail:
	x3m_layer_free(w);
	return rc;
}

/* The layer's dense linears (not the experts) to device */
int x3m_layer_to_device(struct layer_w *w, int device)
{
	int rc;
	for (int i = 0; i < N_LIN; i++)
		if (w->lin[lin_slots[i]] && (rc = x3_linear_set_device(w->lin[lin_slots[i]], device)))
			return rc;
	return X3_OK;
}

void x3m_expert_free(struct layer_w *w, int e)
{
	for (int j = 0; j < 3; j++) {
		x3_linear_free(w->ex[e * 3 + j]);
		w->ex[e * 3 + j] = NULL;
	}
}

/* Open the three linears of expert e of layer l (gate, up, down: F32
 * copies of a dense checkpoint's weights, or EXL3). */
int x3m_expert_open(const x3_model *m, int l, struct layer_w *w, int e)
{
	for (int j = 0; j < 3; j++) {
		const x3_module *d = w->exm[e * 3 + j];
		int rc = d ? open_mod(m, l, d, 0, &w->ex[e * 3 + j])
		           : x3_err(X3_EINVAL, "layer %d: expert %d has no linear %d", l, e, j);
		if (rc) {
			x3m_expert_free(w, e);
			return rc;
		}
	}
	return X3_OK;
}

int x3m_mtp_load(const x3_model *m, x3_linear **fc, float **vec)
{
	const x3_model_config *c = &m->cfg;
	int L = (int)c->n_layers + 1, rc;
	static const int vs[3] = { X3_SLOT_MTP_ENORM, X3_SLOT_MTP_HNORM, X3_SLOT_FINAL_NORM };
	const x3_module *d = c->n_mtp ? mod(m, L, X3_SLOT_MTP_FC) : NULL;
	*fc = NULL;
	for (int i = 0; i < 3; i++)
		vec[i] = NULL;
	if (!d)
		return x3_err(X3_EUNSUP, "%s: the model has no multi-token prediction layer", c->arch_name);
	if ((rc = open_mod(m, L, d, 0, fc)))
		return rc;
	for (int i = 0; i < 3; i++) {
		const x3_module *v = mod(m, L, vs[i]);
		if (!v) {
			rc = x3_err(X3_EINVAL, "the multi-token prediction layer has no norm of slot %d", vs[i]);
			break;
		}
		if ((rc = x3m_load_vec(norm_src(m, L, v->weight), v->weight, v->out, &vec[i])))
			break;
		if (c->norm_offset)   /* the hybrids' (1 + w) norms */
			x3m_gemma_norm(vec[i], v->out);
	}
	if (rc) {
		x3_linear_free(*fc);
		*fc = NULL;
		for (int i = 0; i < 3; i++) {
			free(vec[i]);
			vec[i] = NULL;
		}
	}
	return rc;
}

/* The head: its own weight (dense or EXL3: an EXL3 conversion of a tied
 * model stores its quantized head there), else the embedding when tied. */
int x3m_head_open(const x3_model *m, int check, x3_linear **out)
{
	const x3_module *h = mod(m, (int)m->cfg.n_layers, X3_SLOT_HEAD);
	char own[X3_KEY_MAX + 16], tr[X3_KEY_MAX + 16];
	snprintf(own, sizeof own, "%s.weight", h->key);
	snprintf(tr, sizeof tr, "%s.trellis", h->key);
	if (m->patch && x3_st_find(m->patch, tr))
		return x3_linear_open(m->patch, h->key, h->in, h->out, h->bias, check, out);
	if (h->tied && !x3_st_find(m->st, own) && !x3_st_find(m->st, tr)) {
		/* the weight of the module it is tied to, as that module's key */
		char key[X3_KEY_MAX + 8];
		snprintf(key, sizeof key, "%.*s", (int)(strlen(h->weight) - 7), h->weight);
		return x3_linear_open(m->st, key, h->in, h->out, 0, check, out);
	}
	return x3_linear_open(m->st, h->key, h->in, h->out, h->bias, check, out);
}

int x3_model_open(const char *dir, const struct x3_model_opts *opts, x3_model **out)
{
	*out = NULL;
	x3_model *m = calloc(1, sizeof *m);
	if (!m)
		return x3_err(X3_ENOMEM, "out of memory");
	int rc = x3_config_load(dir, &m->cfg);
	if (rc)
		goto fail;
	if ((rc = x3_st_open(dir, &m->st)))
		goto fail;
	m->on_use = opts && opts->weights_on_use;
	if (opts && opts->overlay_dir) {
		if ((rc = x3_st_open(opts->overlay_dir, &m->ov)))
			goto fail;
		m->ov_first = opts->overlay_first;
		m->ov_last = opts->overlay_last;
	}
	if (opts && opts->patch_dir && (rc = x3_st_open(opts->patch_dir, &m->patch)))
		goto fail;
	const x3_model_config *c = &m->cfg;
	if ((rc = x3_arch_modules(c, &m->mods, &m->nmods)))
		goto fail;
	/* every trellis of the patch must replace a linear of the model: a
	 * misspelt key would otherwise leave the original in place unseen;
	 * every other tensor of the patch belongs to one of its linears, and
	 * a patch without one would run the model unpatched */
	const char *pname = opts && opts->patch_name ? opts->patch_name : opts ? opts->patch_dir : NULL;
	int npatched = 0;
	for (int i = 0; m->patch && i < x3_st_count(m->patch); i++) {
		const char *n = x3_st_get(m->patch, i)->name;
		size_t ln = strlen(n);
		char key[X3_KEY_MAX + 16];
		if (ln < 8 || strcmp(n + ln - 8, ".trellis")) {
			const char *dot = strrchr(n, '.');
			snprintf(key, sizeof key, "%.*s.trellis", dot ? (int)(dot - n) : (int)ln, n);
			if (!dot || !x3_st_find(m->patch, key)) {
				rc = x3_err(X3_EFORMAT, "%s: tensor '%s' is part of no EXL3 linear of the patch "
				            "(no '%s')", pname, n, key);
				goto fail;
			}
			continue;
		}
		snprintf(key, sizeof key, "%.*s", (int)(ln - 8), n);
		const x3_module *d = x3_modules_find(m->mods, m->nmods, key);
		if (!d || d->d->kind != X3_KIND_LINEAR) {
			rc = x3_err(X3_EFORMAT, "%s: tensor '%s' is no linear of %s (%s)", pname, n,
			            dir, c->arch_name);
			goto fail;
		}
		npatched++;
	}
	if (m->patch && !npatched) {
		rc = x3_err(X3_EFORMAT, "%s: no EXL3 linear (KEY.trellis): the patch would replace nothing",
		            pname);
		goto fail;
	}
	if (!(m->slot = malloc((size_t)(c->n_layers + 1 + c->n_mtp) * X3_SLOT_COUNT * sizeof *m->slot))) {
		rc = x3_err(X3_ENOMEM, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < (size_t)(c->n_layers + 1 + c->n_mtp) * X3_SLOT_COUNT; i++)
		m->slot[i] = -1;
	for (int i = 0; i < m->nmods; i++) {
		int l = m->mods[i].layer < 0 ? (int)c->n_layers : m->mods[i].layer;
		if (m->mods[i].d->role == X3_ROLE_VISION)   /* no part of the text forward */
			continue;
		if (m->mods[i].expert <= 0)
			m->slot[(size_t)l * X3_SLOT_COUNT + m->mods[i].d->slot] = i;
	}
	/* an overlay without EXL3 linears (a plain HF directory) would be
	 * accepted and run as the original */
	for (int i = 0; m->ov && i < m->nmods; i++) {
		const x3_module *d = &m->mods[i];
		char k[X3_KEY_MAX + 16];
		if (d->d->kind != X3_KIND_LINEAR || d->layer < m->ov_first || d->layer > m->ov_last ||
		    d->layer >= c->n_layers)
			continue;
		snprintf(k, sizeof k, "%s.trellis", d->key);
		if (!x3_st_find(m->ov, k)) {
			rc = x3_err(X3_EFORMAT, "%s: linear '%s' is not EXL3 (no '.trellis'): not a quantized "
			            "model for layers %d-%d", opts->overlay_dir, d->key, m->ov_first, m->ov_last);
			goto fail;
		}
	}
	const x3_module *em = mod(m, (int)c->n_layers, X3_SLOT_EMBED);
	if (!em || !mod(m, (int)c->n_layers, X3_SLOT_FINAL_NORM) || !mod(m, (int)c->n_layers, X3_SLOT_HEAD)) {
		rc = x3_err(X3_EUNSUP, "%s: %s: the forward needs an embedding, a final norm and a head",
		            dir, c->arch_name);
		goto fail;
	}
	m->embed = x3_st_find(m->st, em->weight);
	if (!m->embed) {
		rc = x3_err(X3_EFORMAT, "%s: tensor '%s' is missing", dir, em->weight);
		goto fail;
	}
	if (m->embed->rank != 2 || m->embed->shape[0] != em->out || m->embed->shape[1] != em->in ||
	    !(m->embed->dtype == X3_F32 || m->embed->dtype == X3_F16 || m->embed->dtype == X3_BF16)) {
		char b[64];
		rc = x3_err(X3_EFORMAT, "%s: tensor '%s': %s %s, config says "
		            "F32/F16/BF16 %lldx%lld", dir, em->weight, x3_dtype_name(m->embed->dtype),
		            x3_shape_str(m->embed, b, sizeof b), (long long)em->out, (long long)em->in);
		goto fail;
	}
	for (int l = 0; l < c->n_layers; l++) {
		struct layer_w w;
		if ((rc = x3m_layer_load(m, l, 1, 1, &w))) {
			x3_errprefix(rc, "%s", layer_src(m, l) == m->ov ? opts->overlay_dir : dir);
			goto fail;
		}
	}
	const x3_module *fn = mod(m, (int)c->n_layers, X3_SLOT_FINAL_NORM);
	if ((rc = x3m_load_vec(m->st, fn->weight, fn->out, NULL)) ||
	    (rc = x3m_head_open(m, 1, NULL))) {
		x3_errprefix(rc, "%s", dir);
		goto fail;
	}
	*out = m;
	return X3_OK;
fail:
	x3_model_close(m);
	return rc;
}

void x3_model_close(x3_model *m)
{
	if (!m)
		return;
	if (m->st)
		x3_st_close(m->st);
	if (m->ov)
		x3_st_close(m->ov);
	if (m->patch)
		x3_st_close(m->patch);
	free(m->mods);
	free(m->slot);
	free(m);
}
