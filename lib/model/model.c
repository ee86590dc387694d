/* model.c: Llama-family causal LM forward in F32 on CPU (see model.h).
 * Which tensors a layer has, their shapes and the Hessian groups come
 * from the architecture's description (arch.h); this file is the forward
 * pass over its slots. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "arch.h"
#include "attention.h"
#include "indexer.h"
#include "device.h"
#include "model.h"
#include "safetensors.h"
#include "linear.h"
#include "moe.h"
#include "gdn.h"
#include "blas.h"

struct x3_model {
	x3_model_config cfg;
	x3_st *st;              /* the model */
	x3_st *ov;              /* overlay (layers ov_first..ov_last) or NULL */
	int ov_first, ov_last;
	x3_st *patch;           /* linears replaced one by one (patch_dir) or NULL */
	const x3_tensor *embed; /* borrowed (vocab, hidden) */
	x3_module *mods;        /* every module, model order (arch.h) */
	int nmods;
	int *slot;              /* (n_layers + 1, X3_SLOT_COUNT): index into
	                           mods, -1 if absent; row n_layers: the modules
	                           before and after the layers */
	int on_use;             /* x3_model_opts.weights_on_use */
};

/* The module of a slot in layer l (l = n_layers: outside the layers). */
static const x3_module *mod(const x3_model *m, int l, int s)
{
	int i = m->slot[(size_t)l * X3_SLOT_COUNT + s];
	return i < 0 ? NULL : &m->mods[i];
}

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

struct layer_w {
	x3_linear *lin[X3_SLOT_COUNT];
	float *vec[X3_SLOT_COUNT];      /* norms: (hidden) or (head_dim); the
	                                   router and the shared-expert gate */
	int sparse, nex;                /* a mixture-of-experts layer; experts */
	x3_linear **ex;                 /* (nex, 3): gate, up, down */
	const x3_module **exm;          /* their modules */
	x3_wbuf wb;                     /* the on-use F32 weights (x3_linear_on_use) */
};

/* Gemma's RMSNorm scales by 1 + w (in F32, as Hugging Face's
 * Gemma2RMSNorm/Gemma3RMSNorm): the stored w becomes 1 + w on load. */
static void gemma_norm(float *w, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		w[i] += 1.0f;
}

/* A 1-D vector tensor of length n as F32 (check only when out == NULL). */
static int load_vec(x3_st *st, const char *name, int64_t n, float **out)
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

static void layer_free(struct layer_w *w)
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
 * experts' linears too with all_ex, else their modules only (expert_open
 * opens them one expert at a time). */
static int layer_load(const x3_model *m, int l, int check, int all_ex, struct layer_w *w)
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
		if (d && (rc = load_vec(norm_src(m, l, d->weight), d->weight, d->out,
		                        check ? NULL : &w->vec[d->d->slot])))
			goto fail;
		/* (1 + w) norms: Gemma's, the hybrids' (not the DeltaNet's gated one) */
		if (d && !check && d->d->role == X3_ROLE_NORM &&
		    (m->cfg.gemma || (m->cfg.norm_offset && d->d->slot != X3_SLOT_GDN_NORM)))
			gemma_norm(w->vec[d->d->slot], d->out);
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
	layer_free(w);
	return rc;
}

static void expert_free(struct layer_w *w, int e)
{
	for (int j = 0; j < 3; j++) {
		x3_linear_free(w->ex[e * 3 + j]);
		w->ex[e * 3 + j] = NULL;
	}
}

/* Open the three linears of expert e of layer l (gate, up, down: F32
 * copies of a dense checkpoint's weights, or EXL3). */
static int expert_open(const x3_model *m, int l, struct layer_w *w, int e)
{
	for (int j = 0; j < 3; j++) {
		const x3_module *d = w->exm[e * 3 + j];
		int rc = d ? open_mod(m, l, d, 0, &w->ex[e * 3 + j])
		           : x3_err(X3_EINVAL, "layer %d: expert %d has no linear %d", l, e, j);
		if (rc) {
			expert_free(w, e);
			return rc;
		}
	}
	return X3_OK;
}

/* The head: its own weight (dense or EXL3: an EXL3 conversion of a tied
 * model stores its quantized head there), else the embedding when tied. */
static int head_open(const x3_model *m, int check, x3_linear **out)
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
	if (!(m->slot = malloc((size_t)(c->n_layers + 1) * X3_SLOT_COUNT * sizeof *m->slot))) {
		rc = x3_err(X3_ENOMEM, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < (size_t)(c->n_layers + 1) * X3_SLOT_COUNT; i++)
		m->slot[i] = -1;
	for (int i = 0; i < m->nmods; i++) {
		int l = m->mods[i].layer < 0 ? (int)c->n_layers : m->mods[i].layer;
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
		if ((rc = layer_load(m, l, 1, 1, &w))) {
			x3_errprefix(rc, "%s", layer_src(m, l) == m->ov ? opts->overlay_dir : dir);
			goto fail;
		}
	}
	const x3_module *fn = mod(m, (int)c->n_layers, X3_SLOT_FINAL_NORM);
	if ((rc = load_vec(m->st, fn->weight, fn->out, NULL)) ||
	    (rc = head_open(m, 1, NULL))) {
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

void x3_forward_opts_init(struct x3_forward_opts *o, const x3_model *m)
{
	memset(o, 0, sizeof *o);
	o->hook_first = 0;
	o->hook_last = (int)m->cfg.n_layers;
	o->last_layer = (int)m->cfg.n_layers;
	o->logits_mode = X3_LOGITS_NONE;
}

/* ---- kernels ---------------------------------------------------------- */
/* y = rmsnorm(x) * w over rows of n (HF: x * rsqrt(mean(x^2) + eps) * w) */
static void rmsnorm(float *y, const float *x, const float *w, int64_t rows, int64_t n, double eps)
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

/* The dimensions RoPE rotates: the head's first rot_dim
 * (partial_rotary_factor; all of it by default), or MLA's rope part. */
static int64_t rope_dim(const x3_model_config *c)
{
	return c->mla ? c->qk_rope : c->rot_dim > 0 ? c->rot_dim : c->head_dim;
}

/* YaRN (Hugging Face's _compute_yarn_parameters): the dimension where a
 * wavelength makes ROT turns in the original context */
static double yarn_dim(double rot, double dim, double base, double orig)
{
	return dim * log(orig / (rot * 2 * M_PI)) / (2 * log(base));
}

/* RoPE inverse frequencies (rope_dim/2), with rope_scaling applied, for
 * rows of cols tokens (longrope's factors depend on the row length). */
static void rope_freqs(const x3_model_config *c, int64_t cols, double *f)
{
	int64_t rd = rope_dim(c), half = rd / 2;
	double lo = 0, hi = 0;
	if (c->rope_type == 3) {
		/* the ramp between extrapolated (fast) and interpolated (slow)
		 * frequencies, its ends truncated to whole dimensions unless
		 * rope_scaling says truncate false */
		double orig = (double)c->rope_orig_max_pos;
		lo = yarn_dim(c->rope_beta_fast, (double)rd, c->rope_theta, orig);
		hi = yarn_dim(c->rope_beta_slow, (double)rd, c->rope_theta, orig);
		if (c->rope_truncate)   /* rope_scaling's truncate (GPT-OSS: false) */
			lo = floor(lo), hi = ceil(hi);
		lo = fmax(lo, 0);
		hi = fmin(hi, (double)rd - 1);
		if (lo == hi)
			hi += 0.001;
	}
	for (int64_t i = 0; i < half; i++) {
		double inv = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)rd);
		if (c->rope_type == 3) {
			double ramp = fmin(fmax(((double)i - lo) / (hi - lo), 0), 1);
			double ex = 1 - ramp;   /* the extrapolation's share */
			inv = inv / c->rope_factor * (1 - ex) + inv * ex;
		}
		if (c->rope_type == 4) {
			/* longrope: as Hugging Face's dynamic update, the long
			 * factors once a row passes the original context */
			inv /= cols > c->rope_orig_max_pos ? c->rope_long[i] : c->rope_short[i];
		} else if (c->rope_type == 1) {
			inv /= c->rope_factor;
		} else if (c->rope_type == 2) {
			/* Llama 3.1: long wavelengths slowed by factor, short ones
			 * kept, a linear blend in between. */
			double old = (double)c->rope_orig_max_pos;
			double lo_wl = old / c->rope_low_freq, hi_wl = old / c->rope_high_freq;
			double wl = 2.0 * M_PI / inv;
			if (wl > lo_wl) {
				inv /= c->rope_factor;
			} else if (wl >= hi_wl) {
				double s = (old / wl - c->rope_low_freq) /
				           (c->rope_high_freq - c->rope_low_freq);
				inv = (1 - s) * inv / c->rope_factor + s * inv;
			}
		}
		f[i] = inv;
	}
}

/* RoPE in place on the rd dimensions at offset off of (ntok, nh, stride)
 * vectors; position of token t is t % cols. cosv, sinv: (cols, rd/2).
 * Rotate-half pairs (i, i + rd/2), or with interleave the pairs (2i, 2i+1)
 * (DeepSeek's rope_interleave: Hugging Face de-interleaves q and k alike
 * before its rotate-half, the same scores). */
static void rope_part(float *x, int64_t ntok, int64_t nh, int64_t stride, int64_t off, int64_t rd,
                      int interleave, int64_t cols, const float *cosv, const float *sinv)
{
	int64_t half = rd / 2, ia = interleave ? 2 : 1, ib = interleave ? 1 : half;
	#pragma omp parallel for if(ntok * nh * rd > (1 << 16)) schedule(static)
	for (int64_t t = 0; t < ntok; t++) {
		const float *cp = cosv + (t % cols) * half, *sp = sinv + (t % cols) * half;
		for (int64_t h = 0; h < nh; h++) {
			float *v = x + (t * nh + h) * stride + off;
			for (int64_t i = 0; i < half; i++) {
				float a = v[i * ia], b = v[i * ia + ib];
				v[i * ia] = a * cp[i] - b * sp[i];
				v[i * ia + ib] = b * cp[i] + a * sp[i];
			}
		}
	}
}

/* Rotate-half RoPE in place on the first rd dimensions of (ntok, nh, hd)
 * vectors (rd < hd: partial_rotary_factor, the rest unrotated). */
static void rope_apply(float *x, int64_t ntok, int64_t nh, int64_t hd, int64_t rd, int64_t cols,
                       const float *cosv, const float *sinv)
{
	rope_part(x, ntok, nh, hd, 0, rd, 0, cols, cosv, sinv);
}

/* ---- forward ---------------------------------------------------------- */
struct fwd {
	x3_model *m;
	const struct x3_forward_opts *o;
	int64_t cols;
	float *xn, *q, *k, *v, *a, *g, *u, *mo;
	float *cosv, *sinv;
	float *cosl, *sinl;     /* the sliding layers' RoPE (rope_local_theta) or NULL */
	int64_t tok0;           /* the chunk's first token in the layer */
	float *qa, *kva, *ckv, *kvb;   /* MLA: q_a, kv_a, normed latent, kv_b outputs */
	float *qg;                     /* hybrids: q_proj's [query | gate] per head,
	                                  then the gates (nt, heads * head_dim) */
	float *gp, *gmix, *gz, *gb, *ga;   /* ... the DeltaNet's projections:
	                                      qkvz, [q | k | v], z, b, a */
	/* sparse attention (rows longer than index_topk): the indexer's
	 * queries, keys and head weights of a chunk, and the selections of
	 * every token (x3_sel_stride(cols) bytes each) made by the last layer
	 * run with an indexer (sel_layer, -1: none yet) */
	float *iq, *ik, *iw;
	uint8_t *sel;
	int sel_layer;
};

/* x3_linear_apply, its time in the forward's timing */
static int lin_apply(const struct fwd *f, x3_linear *l, const float *x, int64_t rows, int64_t seg,
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
static int hook(struct fwd *f, int layer, int s, const float *x, int64_t ntok, int64_t in)
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
static int hook_ex(struct fwd *f, int layer, const x3_module *d, const float *x, int64_t ntok,
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
	return hook_ex(f, layer, d, x, ntok, in, 0, NULL);
}

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
	if (j != 1 && (rc = hook_ex(c->f, c->l, d, x, n, d->in, 0, c->rw)))
		return rc;
	return lin_apply(c->f, c->w->ex[e * 3 + j], x, n, 0, y);
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
		if ((rc = hook_ex(f, l, dg, f->xn, nt, dg->in, 2, NULL)) ||
		    (rc = lin_apply(f, w->ex[e * 3], f->xn, nt, f->cols, g)) ||
		    (rc = lin_apply(f, w->ex[e * 3 + 1], f->xn, nt, f->cols, u)))
			break;
		x3_moe_act(&p, g, u, nt * I);
		rc = hook_ex(f, l, dd, g, nt, dd->in, 1, NULL);
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
static int moe_chunk(struct fwd *f, int l, const struct layer_w *w, int64_t nt)
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
	if ((rc = hook(f, l, X3_SLOT_SHX_GATE, f->xn, nt, H)) ||
	    (rc = lin_apply(f, w->lin[X3_SLOT_SHX_GATE], f->xn, nt, f->cols, f->g)) ||
	    (rc = lin_apply(f, w->lin[X3_SLOT_SHX_UP], f->xn, nt, f->cols, f->u)))
		return rc;
	for (int64_t i = 0; i < nt * si; i++)
		f->g[i] = f->g[i] / (1.0f + expf(-f->g[i])) * f->u[i];
	float *sc = f->u;   /* free now: the gate's (nt) scalars */
	if ((rc = hook(f, l, X3_SLOT_SHX_DOWN, f->g, nt, si)) ||
	    (rc = lin_apply(f, w->lin[X3_SLOT_SHX_DOWN], f->g, nt, f->cols, f->a)) ||
	    (w->vec[X3_SLOT_SHX_SCALE] && (rc = x3_gemm_xwt(f->xn, nt, f->cols, H, w->vec[X3_SLOT_SHX_SCALE], 1, sc))))
		return rc;
	for (int64_t t = 0; t < nt; t++) {
		float s = w->vec[X3_SLOT_SHX_SCALE] ? 1.0f / (1.0f + expf(-sc[t])) : 1.0f;
		for (int64_t i = 0; i < H; i++)
			mo[t * H + i] += s * f->a[t * H + i];
	}
	return X3_OK;
}

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
	if ((rc = lin_apply(f, w->lin[X3_SLOT_IDX_QB], f->qa, nt, cols, f->iq)) ||
	    (rc = x3_gemm_xwt(f->xn, nt, cols, H, w->vec[X3_SLOT_IDX_K], hd, f->ik)) ||
	    (rc = x3_gemm_xwt(f->xn, nt, cols, H, w->vec[X3_SLOT_IDX_W], ih, f->iw)))
		return rc;
	/* the key: a LayerNorm (Hugging Face's nn.LayerNorm(eps 1e-6)); the
	 * first qk_rope dimensions of keys and queries rotated (GLM-5: on
	 * interleaved pairs; DeepSeek V3.2: as halves) */
	x3_layernorm(f->ik, w->vec[X3_SLOT_IDX_K_NORM], w->vec[X3_SLOT_IDX_K_BIAS], nt, hd, 1e-6);
	rope_part(f->ik, nt, 1, hd, 0, c->qk_rope, c->idx_interleave, cols, f->cosv, f->sinv);
	rope_part(f->iq, nt, ih, hd, 0, c->qk_rope, c->idx_interleave, cols, f->cosv, f->sinv);
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
static int mla_chunk(struct fwd *f, int l, const struct layer_w *w, int64_t nrows)
{
	const x3_model_config *c = &f->m->cfg;
	int64_t cols = f->cols, nt = nrows * cols, H = c->hidden, nh = c->n_heads;
	int64_t np = c->qk_nope, rp = c->qk_rope, vd = c->v_dim, qkd = np + rp, kl = c->kv_lora;
	int64_t kva = kl + rp, kvb = np + vd;
	int rc;
	if ((rc = hook(f, l, c->q_lora > 0 ? X3_SLOT_Q_A : X3_SLOT_Q, f->xn, nt, H)))
		return rc;
	if (c->q_lora > 0) {
		if ((rc = lin_apply(f, w->lin[X3_SLOT_Q_A], f->xn, nt, cols, f->qa)))
			return rc;
		rmsnorm(f->qa, f->qa, w->vec[X3_SLOT_Q_A_NORM], nt, c->q_lora, MLA_NORM_EPS);
		if ((rc = hook(f, l, X3_SLOT_Q_B, f->qa, nt, c->q_lora)) ||
		    (rc = lin_apply(f, w->lin[X3_SLOT_Q_B], f->qa, nt, cols, f->q)))
			return rc;
	} else if ((rc = lin_apply(f, w->lin[X3_SLOT_Q], f->xn, nt, cols, f->q))) {
		return rc;
	}
	if ((rc = lin_apply(f, w->lin[X3_SLOT_KV_A], f->xn, nt, cols, f->kva)))
		return rc;
	for (int64_t t = 0; t < nt; t++)
		memcpy(f->ckv + t * kl, f->kva + t * kva, (size_t)kl * sizeof(float));
	rmsnorm(f->ckv, f->ckv, w->vec[X3_SLOT_KV_A_NORM], nt, kl, MLA_NORM_EPS);
	if ((rc = hook(f, l, X3_SLOT_KV_B, f->ckv, nt, kl)) ||
	    (rc = lin_apply(f, w->lin[X3_SLOT_KV_B], f->ckv, nt, cols, f->kvb)))
		return rc;
	/* the rope key (one per token) rotated once, then every head's key */
	rope_part(f->kva, nt, 1, kva, kl, rp, c->rope_interleave, cols, f->cosv, f->sinv);
	rope_part(f->q, nt, nh, qkd, np, rp, c->rope_interleave, cols, f->cosv, f->sinv);
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
		if ((rc = hook(f, l, X3_SLOT_GDN_QKVZ, f->xn, nt, H)) ||
		    (rc = lin_apply(f, w->lin[X3_SLOT_GDN_QKVZ], f->xn, nt, cols, f->gp)) ||
		    (rc = x3_gemm_xwt(f->xn, nt, cols, H, w->vec[X3_SLOT_GDN_BA], 2 * nv, f->ga)))
			return rc;
		/* in_proj_ba's outputs (nt, 2 nv) in ga, a's regrouped after them */
		x3_gdn_unfuse(&s, f->gp, f->ga, nt, f->gmix, f->gz, f->gb, f->ga + nt * 2 * nv);
		memmove(f->ga, f->ga + nt * 2 * nv, (size_t)(nt * nv) * sizeof(float));
	} else {
		if ((rc = hook(f, l, X3_SLOT_GDN_QKV, f->xn, nt, H)) ||
		    (rc = lin_apply(f, w->lin[X3_SLOT_GDN_QKV], f->xn, nt, cols, f->gmix)) ||
		    (rc = lin_apply(f, w->lin[X3_SLOT_GDN_Z], f->xn, nt, cols, f->gz)) ||
		    (rc = x3_gemm_xwt(f->xn, nt, cols, H, w->vec[X3_SLOT_GDN_B], nv, f->gb)) ||
		    (rc = x3_gemm_xwt(f->xn, nt, cols, H, w->vec[X3_SLOT_GDN_A], nv, f->ga)))
			return rc;
	}
	return x3_gdn_forward(&s, &gw, f->gmix, f->gz, f->gb, f->ga, nrows, cols, f->a);
}

/* The attention of a layer on a chunk of nrows rows and its residual: x
 * (ntok, hidden) updated in place. */
static int attn_chunk(struct fwd *f, int l, const struct layer_w *w, float *x, int64_t nrows)
{
	const x3_model_config *c = &f->m->cfg;
	int64_t cols = f->cols, nt = nrows * cols, H = c->hidden, hd = c->head_dim;
	int64_t nq = c->n_heads, nkv = c->n_kv_heads;
	int rc;

	rmsnorm(f->xn, x, w->vec[X3_SLOT_IN_NORM], nt, H, c->rms_eps);
	int lin = x3_arch_linear_layer(c, l);
	if (lin) {
		if ((rc = gdn_chunk(f, l, w, nrows)))
			return rc;
	} else if (c->mla) {
		if ((rc = mla_chunk(f, l, w, nrows)))
			return rc;
	} else {
		if ((rc = hook(f, l, X3_SLOT_Q, f->xn, nt, H)))
			return rc;
		if ((rc = lin_apply(f, w->lin[X3_SLOT_Q], f->xn, nt, cols, c->hybrid ? f->qg : f->q)) ||
		    (rc = lin_apply(f, w->lin[X3_SLOT_K], f->xn, nt, cols, f->k)) ||
		    (rc = lin_apply(f, w->lin[X3_SLOT_V], f->xn, nt, cols, f->v)))
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
			rmsnorm(f->q, f->q, w->vec[X3_SLOT_Q_NORM], nt * nq, hd, c->rms_eps);
			rmsnorm(f->k, f->k, w->vec[X3_SLOT_K_NORM], nt * nkv, hd, c->rms_eps);
		}
		/* Gemma: a sliding layer's window and RoPE */
		int swa = c->swa_masked && l < 1024 && (c->swa_layers[l / 64] >> (l % 64) & 1);
		const float *cs = swa && f->cosl ? f->cosl : f->cosv, *sn = swa && f->cosl ? f->sinl : f->sinv;
		rope_apply(f->q, nt, nq, hd, rope_dim(c), cols, cs, sn);
		rope_apply(f->k, nt, nkv, hd, rope_dim(c), cols, cs, sn);
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
	if ((rc = hook(f, l, os, f->a, nt, lin ? x3_arch_dim(c, X3_DIM_GDN_V) : x3_arch_dim(c, X3_DIM_V_ALL))))
		return rc;
	/* o_proj output into xn (free now), then the residual */
	if ((rc = lin_apply(f, w->lin[os], f->a, nt, cols, f->xn)))
		return rc;
	if (w->vec[X3_SLOT_ATTN_OUT_NORM])   /* Gemma's post_attention_layernorm */
		rmsnorm(f->xn, f->xn, w->vec[X3_SLOT_ATTN_OUT_NORM], nt, H, c->rms_eps);
	#pragma omp parallel for if(nt * H > (1 << 16)) schedule(static)
	for (int64_t i = 0; i < nt * H; i++)
		x[i] += f->xn[i];
	return X3_OK;
}

/* One layer on a chunk of nrows rows: x (ntok, hidden) updated in place
 * (a mixture-of-experts layer: chunk-major, x3_forward_opts.moe_chunk_major). */
static int layer_chunk(struct fwd *f, int l, const struct layer_w *w, float *x, int64_t nrows)
{
	const x3_model_config *c = &f->m->cfg;
	int64_t cols = f->cols, nt = nrows * cols, H = c->hidden, inter = c->intermediate;
	int rc;

	if ((rc = attn_chunk(f, l, w, x, nrows)))
		return rc;
	rmsnorm(f->xn, x, w->vec[X3_SLOT_POST_NORM], nt, H, c->rms_eps);
	if (w->sparse) {
		if ((rc = moe_chunk(f, l, w, nt)))
			return rc;
		#pragma omp parallel for if(nt * H > (1 << 16)) schedule(static)
		for (int64_t i = 0; i < nt * H; i++)
			x[i] += f->mo[i];
		return X3_OK;
	}
	if ((rc = hook(f, l, X3_SLOT_GATE, f->xn, nt, H)))
		return rc;
	if ((rc = lin_apply(f, w->lin[X3_SLOT_GATE], f->xn, nt, cols, f->g)) ||
	    (rc = lin_apply(f, w->lin[X3_SLOT_UP], f->xn, nt, cols, f->u)))
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
	if ((rc = hook(f, l, X3_SLOT_DOWN, f->g, nt, inter)))
		return rc;
	if ((rc = lin_apply(f, w->lin[X3_SLOT_DOWN], f->g, nt, cols, f->xn)))
		return rc;
	if (w->vec[X3_SLOT_MLP_OUT_NORM])    /* Gemma's post_feedforward_layernorm */
		rmsnorm(f->xn, f->xn, w->vec[X3_SLOT_MLP_OUT_NORM], nt, H, c->rms_eps);
	#pragma omp parallel for if(nt * H > (1 << 16)) schedule(static)
	for (int64_t i = 0; i < nt * H; i++)
		x[i] += f->xn[i];
	return X3_OK;
}

static int64_t i64max(int64_t a, int64_t b) { return a > b ? a : b; }

/* Rows of the chunk that starts at row r0: chunk_rows, cut at the end of
 * r0's segment of seg rows (x3_forward_opts.seg_rows). */
static int64_t chunk_len(int64_t r0, int64_t chunk_rows, int64_t seg, int64_t rows)
{
	int64_t end = (r0 / seg + 1) * seg;
	if (end > rows)
		end = rows;
	return end - r0 < chunk_rows ? end - r0 : chunk_rows;
}

/* a callback's time in the forward's timing: t0 = cb_start(o) before it,
 * rc = cb_end(o, t0, rc) after */
static double cb_start(const struct x3_forward_opts *o) { return o->timing ? x3_now() : 0; }

static int cb_end(const struct x3_forward_opts *o, double t0, int rc)
{
	if (o->timing)
		o->timing->callbacks += x3_now() - t0;
	return rc;
}

/* seg_done when the chunk that ended at row e closed a segment */
static int seg_after(const struct x3_forward_opts *o, int l, int64_t e, int64_t seg, int64_t rows)
{
	if (!o->seg_done || (e % seg && e != rows))
		return X3_OK;
	double t0 = cb_start(o);
	return cb_end(o, t0, o->seg_done(o->seg_done_ctx, l, (e - 1) / seg));
}

/* A mixture-of-experts layer l over all rows x (rows * cols, hidden),
 * expert-major (model.h x3_forward_opts.expert_done): A, the attention
 * and the routing of every chunk; B, each expert over every chunk into
 * the sum mo; C, the shared expert and the residual. The chunks are those
 * of the chunk-major order, and within a chunk an expert multiplies the
 * same batch (x3_moe_rows) on the same rows: the MLP's input of a row is
 * its RMSNorm, recomputed from the residual x kept unchanged until C (a
 * row's norm does not depend on the rows beside it). */
static int moe_layer(struct fwd *f, int l, struct layer_w *w, float *x, int64_t rows,
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
		nr = chunk_len(r0, chunk_rows, seg, rows);
		int64_t t0 = r0 * cols, nt = nr * cols;
		f->tok0 = t0;
		if ((rc = attn_chunk(f, l, w, x + t0 * H, nr)))
			break;
		rmsnorm(f->xn, x + t0 * H, pn, nt, H, c->rms_eps);
		if (!(rc = x3_moe_route(&p, f->xn, nt, cols, idx + t0 * K, rw + t0 * K)))
			rc = seg_after(o, l, r0 + nr, seg, rows);
	}
	if (!rc && o->expert_done) {
		double t0 = cb_start(o);
		rc = cb_end(o, t0, o->expert_done(o->expert_done_ctx, l, -1));
	}
	/* B: expert by expert, the chunks in order */
	for (int e = 0; e < w->nex && !rc; e++) {
		const x3_module *dg = w->exm[e * 3], *dd = w->exm[e * 3 + 2];
		double tl = f->o->timing ? x3_now() : 0;
		rc = expert_open(f->m, l, w, e);
		if (f->o->timing)
			f->o->timing->load += x3_now() - tl;
		if (rc)
			break;
		x3_linear *lg = w->ex[e * 3], *lu = w->ex[e * 3 + 1], *ld = w->ex[e * 3 + 2];
		for (int64_t r0 = 0; r0 < rows && !rc; r0 += nr) {
			nr = chunk_len(r0, chunk_rows, seg, rows);
			int64_t t0 = r0 * cols, nt = nr * cols;
			const float *xc = x + t0 * H;
			f->tok0 = t0;
			if (hooked && t0 < o->moe_all_tokens) {
				/* the all-token capture (moe_all_tokens): the hook only */
				rmsnorm(f->xn, xc, pn, nt, H, c->rms_eps);
				if ((rc = hook_ex(f, l, dg, f->xn, nt, dg->in, 2, NULL)) ||
				    (rc = lin_apply(f, lg, f->xn, nt, cols, g)) ||
				    (rc = lin_apply(f, lu, f->xn, nt, cols, u)))
					break;
				x3_moe_act(&p, g, u, nt * I);
				if ((rc = hook_ex(f, l, dd, g, nt, dd->in, 1, NULL)))
					break;
			}
			int64_t n = x3_moe_rows(&p, idx + t0 * K, rw + t0 * K, nt, e, er, ew);
			if (n) {
				for (int64_t r = 0; r < n; r++)
					memcpy(xe + r * H, xc + er[r] * H, (size_t)H * sizeof *xe);
				rmsnorm(xe, xe, pn, n, H, c->rms_eps);
				if ((rc = hook_ex(f, l, dg, xe, n, dg->in, 0, ew)) ||
				    (rc = lin_apply(f, lg, xe, n, 0, g)) || (rc = lin_apply(f, lu, xe, n, 0, u)))
					break;
				x3_moe_act(&p, g, u, n * I);
				if ((rc = hook_ex(f, l, dd, g, n, dd->in, 0, ew)) || (rc = lin_apply(f, ld, g, n, 0, ye)))
					break;
				float *mc = mo + t0 * H;
				for (int64_t r = 0; r < n; r++)
					for (int64_t i = 0; i < H; i++)
						mc[er[r] * H + i] += ew[r] * ye[r * H + i];
			}
			rc = seg_after(o, l, r0 + nr, seg, rows);
		}
		expert_free(w, e);
		if (!rc && o->expert_done) {
			double t0 = cb_start(o);
			rc = cb_end(o, t0, o->expert_done(o->expert_done_ctx, l, e));
		}
	}
	/* C: the shared expert, then the residual */
	for (int64_t r0 = 0; r0 < rows && !rc; r0 += nr) {
		nr = chunk_len(r0, chunk_rows, seg, rows);
		int64_t t0 = r0 * cols, nt = nr * cols;
		float *xc = x + t0 * H, *mc = mo + t0 * H;
		f->tok0 = t0;
		if (w->lin[X3_SLOT_SHX_GATE]) {
			rmsnorm(f->xn, xc, pn, nt, H, c->rms_eps);
			if ((rc = shared_chunk(f, l, w, nt, mc)))
				break;
		}
		#pragma omp parallel for if(nt * H > (1 << 16)) schedule(static)
		for (int64_t i = 0; i < nt * H; i++)
			xc[i] += mc[i];
		rc = seg_after(o, l, r0 + nr, seg, rows);
	}
out:
	free(idx), free(rw), free(mo), free(er), free(ew), free(xe), free(ye), free(g), free(u);
	return rc;
}

int x3_model_forward(x3_model *m, const int32_t *tokens, int64_t rows, int64_t cols,
                     const struct x3_forward_opts *o)
{
	const x3_model_config *c = &m->cfg;
	int64_t H = c->hidden, T;
	int n = (int)c->n_layers;
	const double t_begin = x3_now();
	if (rows < 1 || cols < 1 || rows > INT64_MAX / cols)
		return x3_err(X3_EINVAL, "forward: bad batch %lldx%lld", (long long)rows, (long long)cols);
	T = rows * cols;
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

	int64_t chunk_rows = (o->chunk_tokens > 0 ? o->chunk_tokens : 4096) / cols;
	if (chunk_rows < 1)
		chunk_rows = 1;
	int64_t seg = o->seg_rows > 0 && o->seg_rows < rows ? o->seg_rows : rows;
	if (chunk_rows > seg)
		chunk_rows = seg;
	int64_t ct = chunk_rows * cols, qd = c->n_heads * c->head_dim;
	int64_t kvd = c->n_kv_heads * c->head_dim, half = rope_dim(c) / 2;
	int64_t vall = x3_arch_dim(c, X3_DIM_V_ALL);
	struct fwd f = { .m = m, .o = o, .cols = cols };
	int rc = X3_OK;
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
	rope_freqs(c, cols, fr);
	/* yarn and longrope scale cos and sin by their attention factor */
	double af = c->rope_type == 3 || c->rope_type == 4 ? c->rope_attn_factor : 1.0;
	for (int64_t p = 0; p < cols; p++)
		for (int64_t i = 0; i < half; i++) {
			double ang = (double)p * fr[i];
			f.cosv[p * half + i] = (float)(cos(ang) * af);
			f.sinv[p * half + i] = (float)(sin(ang) * af);
		}
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
		rope_freqs(&lc, cols, fr);
		for (int64_t p = 0; p < cols; p++)
			for (int64_t i = 0; i < half; i++) {
				f.cosl[p * half + i] = (float)cos((double)p * fr[i]);
				f.sinl[p * half + i] = (float)sin((double)p * fr[i]);
			}
	}

	/* embedding rows, converted from the mmap'd table (unless resuming) */
	size_t es = x3_dtype_size(m->embed->dtype);
	for (int64_t t = 0; t < T && !o->hidden; t++)
		x3_convert(x + t * H, X3_F32, (const char *)m->embed->data + (size_t)tokens[t] * H * es,
		           m->embed->dtype, (size_t)H);
	if (!o->hidden)   /* the rows read are in x now */
		x3_st_drop(m->embed, m->embed->data, m->embed->nbytes);
	for (int64_t i = 0; i < T * H && !o->hidden; i++)
		if (!isfinite(x[i])) {
			rc = x3_err(X3_ENUM, "tensor '%s': non-finite value %g at [%d][%lld] (token %lld of the input)",
			            m->embed->name, (double)x[i], tokens[i / H], (long long)(i % H),
			            (long long)(i / H));
			goto out;
		}
	if (c->gemma && !o->hidden) {
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

	int last = o->last_layer < n ? o->last_layer : n - 1;
	for (int l = first; l <= last; l++) {
		struct layer_w w;
		double tc = cb_start(o);
		if (o->layer_input && (rc = cb_end(o, tc, o->layer_input(o->layer_input_ctx, l, x, T, H))))
			goto out;
		int ex_major = x3_arch_sparse_layer(c, l) && !o->moe_chunk_major;
		double t0 = x3_now();
		if ((rc = layer_load(m, l, 0, !ex_major, &w))) {
			x3_errprefix(rc, "layer %d", l);
			goto out;
		}
		for (int i = 0; i < N_LIN && o->device != X3_DEVICE_CPU; i++)
			if (w.lin[lin_slots[i]] && (rc = x3_linear_set_device(w.lin[lin_slots[i]], o->device))) {
				layer_free(&w);
				x3_errprefix(rc, "layer %d", l);
				goto out;
			}
		if (o->timing)
			o->timing->load += x3_now() - t0;
		if (ex_major)
			rc = moe_layer(&f, l, &w, x, rows, chunk_rows, seg);
		for (int64_t r0 = 0, nr; r0 < rows && !rc && !ex_major; r0 += nr) {
			nr = chunk_len(r0, chunk_rows, seg, rows);
			f.tok0 = r0 * cols;
			if (!(rc = layer_chunk(&f, l, &w, x + r0 * cols * H, nr)))
				rc = seg_after(o, l, r0 + nr, seg, rows);
		}
		layer_free(&w);
		if (rc)
			goto out;
		tc = cb_start(o);
		if (o->layer_done && (rc = cb_end(o, tc, o->layer_done(o->layer_done_ctx, l, n))))
			goto out;
	}
	/* the states entering the layer after the last one run (its output),
	 * also when the forward stops before that layer */
	double tc = cb_start(o);
	if (o->layer_input && (rc = cb_end(o, tc, o->layer_input(o->layer_input_ctx, last + 1, x, T, H))))
		goto out;
	if (o->last_layer < n)
		goto out;
	int want_hook = o->hook && o->hook_first <= n && o->hook_last >= n;
	if (!want_hook && o->logits_mode == X3_LOGITS_NONE)
		goto out;

	float *norm = NULL;
	x3_linear *head = NULL;
	x3_wbuf hwb = { 0 };
	const x3_module *fn = mod(m, n, X3_SLOT_FINAL_NORM);
	double t0 = x3_now();
	if ((rc = load_vec(m->st, fn->weight, fn->out, &norm)) || (rc = head_open(m, 0, &head)) ||
	    (m->on_use && (rc = x3_linear_on_use(head, &hwb))) ||
	    (o->device != X3_DEVICE_CPU && (rc = x3_linear_set_device(head, o->device)))) {
		free(norm);
		x3_linear_free(head);
		x3_wbuf_free(&hwb);
		goto out;
	}
	if (o->timing)
		o->timing->load += x3_now() - t0;
	if (c->gemma || c->norm_offset)
		gemma_norm(norm, fn->out);
	for (int64_t r0 = 0, nr; r0 < rows && !rc; r0 += nr) {
		nr = chunk_len(r0, chunk_rows, seg, rows);
		int64_t nt = nr * cols;
		float *xr = x + r0 * cols * H;
		rmsnorm(f.xn, xr, norm, nt, H, c->rms_eps);
		if ((rc = hook(&f, n, X3_SLOT_HEAD, f.xn, nt, H)))
			break;
		float *lg = NULL;
		int64_t nlg = 0;
		if (o->logits_mode == X3_LOGITS_ALL) {
			lg = o->logits + r0 * cols * c->vocab, nlg = nt * c->vocab;
			rc = lin_apply(&f, head, f.xn, nt, cols, lg);
		} else if (o->logits_mode == X3_LOGITS_LAST) {
			for (int64_t r = 0; r < nr; r++)
				memmove(f.xn + r * H, f.xn + ((r + 1) * cols - 1) * H, (size_t)H * sizeof(float));
			lg = o->logits + r0 * c->vocab, nlg = nr * c->vocab;
			rc = lin_apply(&f, head, f.xn, nr, 0, lg);
		}
		if (!rc && lg && c->final_softcap > 0) {
			/* Gemma2's final_logit_softcapping: cap * tanh(logit / cap) */
			float cap = (float)c->final_softcap;
			#pragma omp parallel for if(nlg > (1 << 16)) schedule(static)
			for (int64_t i = 0; i < nlg; i++)
				lg[i] = cap * tanhf(lg[i] / cap);
		}
		if (!rc)
			rc = seg_after(o, n, r0 + nr, seg, rows);
	}
	free(norm);
	x3_linear_free(head);
	x3_wbuf_free(&hwb);
	if (!rc && o->layer_done) {
		tc = cb_start(o);
		rc = cb_end(o, tc, o->layer_done(o->layer_done_ctx, n, n));
	}
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
