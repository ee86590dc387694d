/* arch.c: the engine over the architecture tables (arch_tables.c): the
 * families by name, the dimensions, the keys of a model expanded from the
 * rows and matched back to them, the fused and renamed sources, the
 * modules skipped, model order (see arch.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "arch.h"
#include "arch_impl.h"
#include "config.h"
#include "safetensors.h"

int x3_arch_count(void) { return x3_narchs; }
const x3_arch_desc *x3_arch_get(int i) { return i >= 0 && i < x3_narchs ? &x3_archs[i] : NULL; }

const x3_arch_desc *x3_arch_lookup(const char *name, const char *model_type)
{
	for (int i = 0; i < x3_narchs; i++)
		if (name ? !strcmp(name, x3_archs[i].name) : model_type && !strcmp(model_type, x3_archs[i].model_type))
			return &x3_archs[i];
	return NULL;
}

const char *x3_arch_families(void)
{
	static char buf[256];
	if (!buf[0])
		for (int i = 0; i < x3_narchs; i++)
			snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? ", " : "",
			         x3_archs[i].family);
	return buf;
}

const char *x3_role_name(int role)
{
	static const char *const n[X3_ROLE_COUNT] = {
		"attention", "mlp", "expert", "shared_expert", "router", "head", "embedding", "norm", "other", "mtp", "vision",
	};
	return role >= 0 && role < X3_ROLE_COUNT ? n[role] : "other";
}

int64_t x3_arch_dim(const x3_model_config *c, int dim)
{
	switch (dim) {
	case X3_DIM_HIDDEN: return c->hidden;
	case X3_DIM_INTER: return c->intermediate;
	case X3_DIM_Q: return c->n_heads * c->head_dim;
	case X3_DIM_KV: return c->n_kv_heads * c->head_dim;
	case X3_DIM_HEAD_DIM: return c->head_dim;
	case X3_DIM_VOCAB: return c->vocab;
	case X3_DIM_EXPERTS: return c->n_experts;
	case X3_DIM_MOE_INTER: return c->moe_inter;
	case X3_DIM_SHARED_INTER: return c->shared_inter;
	case X3_DIM_ONE: return 1;
	case X3_DIM_Q_LORA: return c->q_lora;
	case X3_DIM_KV_LORA: return c->kv_lora;
	case X3_DIM_KV_A: return c->kv_lora + c->qk_rope;
	case X3_DIM_KV_B: return c->n_heads * (c->qk_nope + c->v_dim);
	case X3_DIM_V_ALL: return c->mla ? c->n_heads * c->v_dim : c->n_heads * c->head_dim;
	case X3_DIM_HEADS: return c->n_heads;
	case X3_DIM_Q2: return 2 * c->n_heads * c->head_dim;
	case X3_DIM_GDN_QKVZ: return 2 * c->lin_nk * c->lin_dk + 2 * c->lin_nv * c->lin_dv;
	case X3_DIM_GDN_CONV: return 2 * c->lin_nk * c->lin_dk + c->lin_nv * c->lin_dv;
	case X3_DIM_GDN_V: return c->lin_nv * c->lin_dv;
	case X3_DIM_GDN_NV: return c->lin_nv;
	case X3_DIM_GDN_BA: return 2 * c->lin_nv;
	case X3_DIM_GDN_DV: return c->lin_dv;
	case X3_DIM_GDN_KCONV: return c->lin_kconv;
	case X3_DIM_IDX_Q: return c->index_heads * c->index_hd;
	case X3_DIM_IDX_HD: return c->index_hd;
	case X3_DIM_IDX_HEADS: return c->index_heads;
	case X3_DIM_HIDDEN2: return 2 * c->hidden;
	case X3_DIM_V_HIDDEN: return c->v_hidden;
	case X3_DIM_V_INTER: return c->v_inter;
	case X3_DIM_V_MERGE: return c->v_merge;
	case X3_DIM_V_OUT: return c->v_out;
	default: return 0;
	}
}

/* PATTERN with {L} replaced by layer and {E} by expert. */
static int expand(const char *pat, int layer, int expert, char *buf, size_t n)
{
	size_t k = 0;
	for (const char *p = pat; *p; ) {
		int v = !strncmp(p, "{L}", 3) ? layer : !strncmp(p, "{E}", 3) ? expert : -1;
		int w = v >= 0 ? snprintf(buf + k, n - k, "%d", v) : snprintf(buf + k, n - k, "%c", *p);
		if (w < 0 || (size_t)w >= n - k)
			return x3_err(X3_EINVAL, "module key '%s' of layer %d is too long", pat, layer);
		k += (size_t)w;
		p += v >= 0 ? 3 : 1;
	}
	return X3_OK;
}

static int has_expert(const char *pat) { return strstr(pat, "{E}") != NULL; }

int x3_arch_tie_key(const x3_module_desc *d, int layer, char *buf, size_t n)
{
	buf[0] = 0;
	if (d->tie == X3_TIE_NONE)
		return X3_OK;
	size_t k = 0;
	for (const char *p = d->key; *p; ) {
		int w = !strncmp(p, "{L}", 3) ? snprintf(buf + k, n - k, "%d", layer) :
		        !strncmp(p, "{E}", 3) ? snprintf(buf + k, n - k, "*") : snprintf(buf + k, n - k, "%c", *p);
		if (w < 0 || (size_t)w >= n - k)
			return x3_err(X3_EINVAL, "module key '%s' of layer %d is too long", d->key, layer);
		k += (size_t)w;
		p += *p == '{' && (p[1] == 'L' || p[1] == 'E') && p[2] == '}' ? 3 : 1;
	}
	return X3_OK;
}

/* Match PATTERN against the first len bytes of name: {L} and {E} match a
 * decimal number without leading zeros (the layer in *layer, the expert
 * in *expert). */
static int match_e(const char *pat, const char *name, size_t len, int *layer, int *expert)
{
	size_t i = 0;
	for (const char *p = pat; *p; ) {
		if (!strncmp(p, "{L}", 3) || !strncmp(p, "{E}", 3)) {
			size_t d = i;
			long v = 0;
			while (i < len && name[i] >= '0' && name[i] <= '9' && i - d < 7)
				v = v * 10 + (name[i++] - '0');
			if (i == d || (name[d] == '0' && i - d > 1) || (i < len && name[i] >= '0' && name[i] <= '9'))
				return 0;
			int *o = p[1] == 'L' ? layer : expert;
			if (o)
				*o = (int)v;
			p += 3;
			continue;
		}
		if (i >= len || name[i] != *p)
			return 0;
		i++, p++;
	}
	return i == len;
}

static int match_n(const char *pat, const char *name, size_t len, int *layer)
{
	return match_e(pat, name, len, layer, NULL);
}

int x3_arch_match(const char *pattern, const char *name, int *layer)
{
	return match_n(pattern, name, strlen(name), layer);
}

int x3_arch_sparse_layer(const x3_model_config *c, int l)
{
	if (c->n_mtp && l == c->n_layers + 1)   /* the MTP layer: the sparse layers' MLP */
		return c->n_experts > 0;
	if (c->n_experts <= 0 || l < 0 || l >= c->n_layers || l < c->first_dense)
		return 0;
	if (l < 1024 && (c->mlp_only[l / 64] >> (l % 64) & 1))
		return 0;
	return c->sparse_step <= 1 || (l + 1) % c->sparse_step == 0;
}

int x3_arch_linear_layer(const x3_model_config *c, int l)
{
	return c->hybrid && l >= 0 && l < c->n_layers && l < 1024 && (c->lin_layers[l / 64] >> (l % 64) & 1);
}

int x3_arch_idx_shared(const x3_model_config *c, int l)
{
	return c->dsa && l >= 0 && l < 1024 && (c->idx_shared[l / 64] >> (l % 64) & 1);
}

int x3_arch_skipped(const x3_model_config *c, const char *name)
{
	const x3_arch_desc *a = c->desc;
	if (!a)
		return 0;
	if ((a->flags & X3_AF_HYBRID) && !strncmp(name, "mtp.", 4))
		return 1;
	for (const char *p = name; (p = strchr(p, '.')); p++) {
		int l;
		if (match_n(a->layer_prefix, name, (size_t)(p - name), &l))
			return l >= c->n_layers;
	}
	return 0;
}

static int present(const x3_model_config *c, const x3_module_desc *d, int layer)
{
	switch (d->when) {
	case X3_WHEN_QK_NORM: return c->qk_norm;
	case X3_WHEN_DENSE: return !x3_arch_sparse_layer(c, layer);
	case X3_WHEN_SPARSE: return x3_arch_sparse_layer(c, layer);
	case X3_WHEN_SHARED: return x3_arch_sparse_layer(c, layer) && c->shared_inter > 0;
	case X3_WHEN_Q_LORA: return c->q_lora > 0;
	case X3_WHEN_NO_Q_LORA: return c->q_lora <= 0;
	case X3_WHEN_FULL_ATTN: return !x3_arch_linear_layer(c, layer);
	case X3_WHEN_LINEAR_ATTN: return x3_arch_linear_layer(c, layer);
	case X3_WHEN_INDEXER: return c->dsa && !x3_arch_idx_shared(c, layer);
	default: return 1;
	}
}

/* Is row d (of the layers) in the multi-token prediction layer? It is a
 * full-attention layer with its own indexer, and its MLP is that of the
 * sparse layers when the model has experts. */
static int present_mtp(const x3_model_config *c, const x3_module_desc *d)
{
	int sparse = c->n_experts > 0;
	switch (d->when) {
	case X3_WHEN_QK_NORM: return c->qk_norm;
	case X3_WHEN_DENSE: return !sparse;
	case X3_WHEN_SPARSE: return sparse;
	case X3_WHEN_SHARED: return sparse && c->shared_inter > 0;
	case X3_WHEN_Q_LORA: return c->q_lora > 0;
	case X3_WHEN_NO_Q_LORA: return c->q_lora <= 0;
	case X3_WHEN_FULL_ATTN: return 1;
	case X3_WHEN_LINEAR_ATTN: return 0;
	case X3_WHEN_INDEXER: return c->dsa;
	default: return 1;
	}
}

/* ---- the rows of the multi-token prediction layer ------------------------ */
/* (built once per architecture from its layer rows: x3_arch_mtp_rows) */
static struct mtp_rows {
	x3_module_desc *d;
	x3_fused_expert *fx;
	int n;
} *mtp_tab;
static pthread_once_t mtp_once = PTHREAD_ONCE_INIT;

/* PAT with the prefix FROM replaced by TO (a malloc'd copy), or PAT itself
 * when it does not start with FROM */
static const char *reprefix(const char *pat, const char *from, const char *to)
{
	size_t lf = strlen(from);
	if (!pat || !to || strncmp(pat, from, lf))
		return pat;
	size_t n = strlen(to) + strlen(pat + lf) + 1;
	char *s = malloc(n);
	if (!s)
		abort();
	snprintf(s, n, "%s%s", to, pat + lf);
	return s;
}

static void mtp_build(void)
{
	mtp_tab = calloc((size_t)x3_narchs, sizeof *mtp_tab);
	if (!mtp_tab)
		abort();
	for (int a = 0; a < x3_narchs; a++) {
		const x3_arch_desc *A = &x3_archs[a];
		if (!A->mtp_fc_key)
			continue;
		struct mtp_rows *t = &mtp_tab[a];
		t->d = calloc((size_t)A->nmods, sizeof *t->d);
		t->fx = calloc((size_t)A->nmods, sizeof *t->fx);
		if (!t->d || !t->fx)
			abort();
		for (int i = 0; i < A->nmods; i++) {
			const x3_module_desc *d = &A->mods[i];
			if (d->scope != X3_SCOPE_LAYER)
				continue;
			x3_module_desc *o = &t->d[t->n];
			*o = *d;
			o->scope = X3_SCOPE_MTP;
			o->key = reprefix(d->key, A->layer_prefix, A->mtp_prefix);
			o->fused_key = reprefix(d->fused_key, A->layer_prefix, A->mtp_prefix);
			if (d->fused) {
				t->fx[t->n] = *d->fused;
				t->fx[t->n].src = reprefix(d->fused->src, A->layer_prefix, A->mtp_prefix);
				o->fused = &t->fx[t->n];
			}
			if (d->kind == X3_KIND_LINEAR) {
				o->role = X3_ROLE_MTP;
				o->group = NULL;
				o->hq = 0;
			}
			t->n++;
		}
	}
}

const x3_module_desc *x3_arch_mtp_rows(const x3_arch_desc *a, int *n)
{
	*n = 0;
	if (!a || !a->mtp_fc_key || a < x3_archs || a >= x3_archs + x3_narchs)
		return NULL;
	pthread_once(&mtp_once, mtp_build);
	*n = mtp_tab[a - x3_archs].n;
	return mtp_tab[a - x3_archs].d;
}

/* the {L} of the MTP layer's keys */
static int mtp_key_layer(const x3_model_config *c)
{
	return c->desc->mtp_prefix ? 0 : (int)c->n_layers;
}

int x3_arch_mtp_scan(x3_model_config *c, const x3_st *st)
{
	const x3_arch_desc *a = c->desc;
	c->n_mtp = 0;
	if (!a || !a->mtp_fc_key || c->mtp_cfg <= 0)
		return X3_OK;
	char key[X3_KEY_MAX], w[X3_KEY_MAX + 16], q[X3_KEY_MAX + 16];
	int rc = expand(a->mtp_fc_key, mtp_key_layer(c), -1, key, sizeof key);
	if (rc)
		return rc;
	snprintf(w, sizeof w, "%s.weight", key);
	snprintf(q, sizeof q, "%s.trellis", key);
	if (!x3_st_find(st, w) && !x3_st_find(st, q))
		return X3_OK;
	if (c->mtp_cfg > 1)
		return x3_err(X3_EUNSUP, "config.json: %lld multi-token prediction layers (%s): only one is "
		              "supported", (long long)c->mtp_cfg,
		              (a->flags & X3_AF_HYBRID) ? "mtp_num_hidden_layers" : "num_nextn_predict_layers");
	c->n_mtp = 1;
	return X3_OK;
}

static int has_bias(const x3_model_config *c, int b)
{
	return b == X3_BIAS_QKV ? c->qkv_bias : b == X3_BIAS_O ? c->o_bias : b == X3_BIAS_MLP ? c->mlp_bias :
	       b == X3_BIAS_ALWAYS;
}

static int instantiate(const x3_model_config *c, const x3_module_desc *d, int layer, int expert,
                       x3_module *m)
{
	int rc;
	memset(m, 0, sizeof *m);
	m->d = d;
	m->layer = d->scope == X3_SCOPE_PRE ? -1 : d->scope == X3_SCOPE_POST ? (int)c->n_layers :
	           d->scope == X3_SCOPE_MTP ? (int)c->n_layers + 1 :
	           d->scope == X3_SCOPE_VISION || d->scope == X3_SCOPE_VISION_POST ? (int)c->n_layers + 2 : layer;
	m->expert = expert;
	if ((rc = expand(d->key, layer, expert, m->key, sizeof m->key)))
		return rc;
	snprintf(m->weight, sizeof m->weight, d->bare ? "%s" : "%s.weight", m->key);
	snprintf(m->src, sizeof m->src, "%s", m->key);
	if (d->group && (rc = expand(d->group, layer, expert, m->group, sizeof m->group)))
		return rc;
	if ((rc = x3_arch_tie_key(d, layer, m->tie, sizeof m->tie)))
		return rc;
	m->in = x3_arch_dim(c, d->in);
	m->out = x3_arch_dim(c, d->out);
	m->bias = has_bias(c, d->bias);
	m->src_rows = m->out;
	if (d->fused && c->fused_experts && expert >= 0) {
		/* expert e's rows of the (experts * per, in) view of the 3-D
		 * (experts, per, in) tensor: per = 2 * out for gate_up */
		int64_t per = d->fused->part ? 2 * m->out : m->out;
		if ((rc = expand(d->fused->src, layer, expert, m->src, sizeof m->src)))
			return rc;
		snprintf(m->weight, sizeof m->weight, "%s", m->src);
		m->sliced = m->fused = 1;
		m->row0 = expert * per + (d->fused->part == 2 ? m->out : 0);
		m->src_rows = c->n_experts * per;
	} else if (d->slice) {
		const x3_row_slice *s = d->slice;
		if ((rc = expand(s->src, layer, expert, m->src, sizeof m->src)))
			return rc;
		snprintf(m->weight, sizeof m->weight, "%s.weight", m->src);
		m->sliced = 1;
		m->src_rows = 0;
		for (int i = 0; i < 2; i++)
			m->row0 += x3_arch_dim(c, s->first[i]);
		for (int i = 0; i < 3; i++)
			m->src_rows += x3_arch_dim(c, s->rows[i]);
		if (m->row0 + m->out > m->src_rows)
			return x3_err(X3_EINVAL, "module '%s': rows %lld..%lld past the %lld rows of '%s'", m->key,
			              (long long)m->row0, (long long)(m->row0 + m->out), (long long)m->src_rows,
			              m->weight);
	}
	if (d->fused_key && c->fused_experts) {
		/* the source's name of it; the output keeps KEY */
		if ((rc = expand(d->fused_key, layer, expert, m->src, sizeof m->src)))
			return rc;
		snprintf(m->weight, sizeof m->weight, d->bare ? "%s" : "%s.weight", m->src);
	}
	return X3_OK;
}

int x3_arch_modules(const x3_model_config *c, x3_module **out, int *n)
{
	const x3_arch_desc *a = c->desc;
	*out = NULL;
	*n = 0;
	if (!a)
		return x3_err(X3_EINVAL, "config has no architecture description");
	size_t cnt = 0;
	for (int i = 0; i < a->nmods; i++) {
		const x3_module_desc *d = &a->mods[i];
		size_t ne = has_expert(d->key) ? (size_t)c->n_experts : 1;
		if (d->scope != X3_SCOPE_LAYER)
			cnt += present(c, d, -1);
		else
			for (int l = 0; l < c->n_layers; l++)
				cnt += present(c, d, l) ? ne : 0;
	}
	/* the multi-token prediction layer: its input rows, the layer rows
	 * as its layer has them, its final norm (an upper bound here) */
	int nmr = 0;
	const x3_module_desc *mr = c->n_mtp > 0 ? x3_arch_mtp_rows(a, &nmr) : NULL;
	if (mr)
		cnt += (size_t)a->nmtp_pre + (size_t)a->nmtp_post +
		       (size_t)nmr * (c->n_experts > 0 ? (size_t)c->n_experts : 1);
	/* the vision tower's linears, when they are encoded */
	if (c->vision_bits)
		for (int i = 0; i < a->nvis; i++)
			cnt += a->vis[i].scope == X3_SCOPE_VISION ? (size_t)c->v_layers : 1;
	x3_module *m = calloc(cnt ? cnt : 1, sizeof *m);
	if (!m)
		return x3_err(X3_ENOMEM, "out of memory for %zu modules", cnt);
	size_t k = 0;
	int rc = X3_OK;
	for (int pass = 0; pass < 3 && !rc; pass++) {
		int scope = pass == 0 ? X3_SCOPE_PRE : pass == 1 ? X3_SCOPE_LAYER : X3_SCOPE_POST;
		int nl = scope == X3_SCOPE_LAYER ? (int)c->n_layers : 1;
		for (int l = 0; l < nl && !rc; l++)
			for (int i = 0; i < a->nmods && !rc; i++) {
				const x3_module_desc *d = &a->mods[i];
				if (d->scope != scope || !present(c, d, scope == X3_SCOPE_LAYER ? l : -1))
					continue;
				if (!has_expert(d->key)) {
					rc = instantiate(c, d, l, -1, &m[k++]);
					continue;
				}
				/* the consecutive rows of one expert, expert by expert */
				int j = i;
				while (j < a->nmods && a->mods[j].scope == scope && has_expert(a->mods[j].key))
					j++;
				for (int e = 0; e < c->n_experts && !rc; e++)
					for (int r = i; r < j && !rc; r++)
						if (present(c, &a->mods[r], l))
							rc = instantiate(c, &a->mods[r], l, e, &m[k++]);
				i = j - 1;
			}
	}
	if (mr && !rc) {
		int ml = mtp_key_layer(c);
		for (int i = 0; i < a->nmtp_pre && !rc; i++)
			rc = instantiate(c, &a->mtp_pre[i], ml, -1, &m[k++]);
		for (int i = 0; i < nmr && !rc; i++) {
			if (!present_mtp(c, &mr[i]))
				continue;
			if (!has_expert(mr[i].key)) {
				rc = instantiate(c, &mr[i], ml, -1, &m[k++]);
				continue;
			}
			int j = i;
			while (j < nmr && has_expert(mr[j].key))
				j++;
			for (int e = 0; e < c->n_experts && !rc; e++)
				for (int r = i; r < j && !rc; r++)
					if (present_mtp(c, &mr[r]))
						rc = instantiate(c, &mr[r], ml, e, &m[k++]);
			i = j - 1;
		}
		for (int i = 0; i < a->nmtp_post && !rc; i++)
			rc = instantiate(c, &a->mtp_post[i], ml, -1, &m[k++]);
	}
	for (int l = 0; c->vision_bits && l < c->v_layers && !rc; l++)
		for (int i = 0; i < a->nvis && !rc; i++)
			if (a->vis[i].scope == X3_SCOPE_VISION)
				rc = instantiate(c, &a->vis[i], l, -1, &m[k++]);
	for (int i = 0; c->vision_bits && i < a->nvis && !rc; i++)
		if (a->vis[i].scope == X3_SCOPE_VISION_POST)
			rc = instantiate(c, &a->vis[i], 0, -1, &m[k++]);
	/* a tied module reads the weight of the module of its tied_to slot */
	for (size_t i = 0; i < k && !rc && c->tied; i++) {
		if (m[i].d->tied_to < 0)
			continue;
		for (size_t j = 0; j < k; j++)
			if (m[j].d->slot == m[i].d->tied_to && m[j].layer == -1) {
				snprintf(m[i].weight, sizeof m[i].weight, "%s", m[j].weight);
				m[i].tied = 1;
			}
	}
	if (rc) {
		free(m);
		return rc;
	}
	*out = m;
	*n = (int)k;
	return X3_OK;
}

const x3_module *x3_modules_find(const x3_module *m, int n, const char *key)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(m[i].key, key))
			return &m[i];
	return NULL;
}

const x3_module *x3_modules_owner(const x3_module *m, int n, const char *name)
{
	const char *dot = strrchr(name, '.');
	if (!dot)
		return NULL;
	for (int i = 0; i < n; i++)
		if (strlen(m[i].key) == (size_t)(dot - name) && !strncmp(m[i].key, name, (size_t)(dot - name)))
			return &m[i];
	return NULL;
}

const x3_module *x3_modules_slice_of(const x3_module *m, int n, const char *name)
{
	size_t sl;
	for (int i = 0; i < n; i++)
		if (m[i].sliced && !strncmp(name, m[i].src, sl = strlen(m[i].src)) &&
		    (m[i].fused ? !name[sl] : !strcmp(name + sl, ".weight") || !strcmp(name + sl, ".bias")))
			return &m[i];
	return NULL;
}

/* Does module m read its own tensors under another name (fused_key)? */
static int renamed(const x3_module *m)
{
	return !m->sliced && strcmp(m->src, m->key);
}

const x3_module *x3_modules_renamed(const x3_module *m, int n, const char *name)
{
	size_t sl;
	for (int i = 0; i < n; i++)
		if (renamed(&m[i]) && !strncmp(name, m[i].src, sl = strlen(m[i].src)) && name[sl] == '.')
			return &m[i];
	return NULL;
}

void x3_modules_out_name(const x3_module *m, int n, const char *name, char *buf, size_t len)
{
	const x3_module *r = x3_modules_renamed(m, n, name);
	if (r)
		snprintf(buf, len, "%s%s", r->key, name + strlen(r->src));
	else
		snprintf(buf, len, "%s", name);
}

void x3_modules_src_name(const x3_module *m, int n, const char *name, char *buf, size_t len)
{
	const x3_module *o = x3_modules_owner(m, n, name);
	if (o && renamed(o))
		snprintf(buf, len, "%s%s", o->src, name + strlen(o->key));
	else
		snprintf(buf, len, "%s", name);
}

/* The fused tensor of row d in layer l (NULL: absent), its name in name. */
static const x3_tensor *fused_src(const x3_st *st, const x3_module_desc *d, int l, char *name, size_t n)
{
	return expand(d->fused->src, l, 0, name, n) ? NULL : x3_st_find(st, name);
}

/* A module of layer l the fused layout names otherwise (fused_key): the
 * checkpoint must name it as its experts are stored (Mixtral v5's mlp.gate
 * with fused experts, block_sparse_moe.gate with per-expert keys). */
static int renamed_scan(const x3_model_config *c, const x3_st *st, const x3_module_desc *d, int l)
{
	char want[X3_KEY_MAX + 8], other[X3_KEY_MAX + 8], k[X3_KEY_MAX];
	const char *sfx = d->bare ? "" : ".weight";
	if (expand(c->fused_experts ? d->fused_key : d->key, l, 0, k, sizeof k) ||
	    snprintf(want, sizeof want, "%s%s", k, sfx) < 0 ||
	    expand(c->fused_experts ? d->key : d->fused_key, l, 0, k, sizeof k) ||
	    snprintf(other, sizeof other, "%s%s", k, sfx) < 0)
		return x3_err(X3_EINVAL, "layer %d: a key pattern too long", l);
	int has = x3_st_find(st, other) != NULL;
	if (x3_st_find(st, want) && has)
		return x3_err(X3_EFORMAT, "tensors '%s' and '%s': one module under both names (the "
		              "experts say '%s')", want, other, want);
	if (x3_st_find(st, want))
		return X3_OK;
	if (c->fused_experts)
		return x3_err(X3_EFORMAT, "missing tensor '%s' (the checkpoint holds experts in fused 3-D "
		              "tensors, Transformers v5's layout%s%s%s)", want, has ? ", but has '" : "",
		              has ? other : "", has ? "', its name with per-expert keys" : "");
	if (has)
		return x3_err(X3_EFORMAT, "missing tensor '%s' (the checkpoint holds experts per expert, "
		              "but has '%s', its name with fused experts)", want, other);
	return X3_OK;   /* missing altogether: reported by its reader */
}

int x3_arch_fused_scan(x3_model_config *c, const x3_st *st)
{
	const x3_arch_desc *a = c->desc;
	char name[X3_KEY_MAX], b[64];
	int rc;
	c->fused_experts = 0;
	if (!a || !(a->flags & X3_AF_MOE) || !st)
		return X3_OK;
	/* GPT-OSS's hub layouts (MXFP4 blocks and scales, or the BF16
	 * re-uploads' (experts, hidden, 2 * inter) interleaved gate_up_proj,
	 * each with its biases) reach here as per-expert tensors (the
	 * safetensors reader makes them); a fused tensor still here is none of
	 * them: refused naming it, not run as missing experts */
	static const char *const hub[] = { "mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj_blocks" };
	for (int l = 0; (a->flags & X3_AF_GPT_OSS) && l < c->n_layers; l++)
		for (int i = 0; i < 2; i++) {
			snprintf(name, sizeof name, "model.layers.%d.%s", l, hub[i]);
			if (x3_st_find(st, name))
				return x3_err(X3_EFORMAT, "tensor '%s': not a layout of GPT-OSS's experts that is read "
				              "(the hub's gate_up_proj (experts, hidden, 2 * inter) with gate_up_proj_bias, "
				              "down_proj and down_proj_bias; their MXFP4 _blocks with _scales; or per-expert "
				              "mlp.experts.E.{gate,up,down}_proj with biases)", name);
		}
	/* fused if any sparse layer has a fused tensor; then every one must
	 * have both, of the config's shapes (gate_up's rows read by two rows
	 * of the table: checked once, by the gate's) */
	for (int l = 0; l < c->n_layers && !c->fused_experts; l++)
		for (int i = 0; i < a->nmods; i++)
			if (a->mods[i].fused && x3_arch_sparse_layer(c, l) &&
			    fused_src(st, &a->mods[i], l, name, sizeof name))
				c->fused_experts = 1;
	for (int l = 0; l < c->n_layers; l++)
		for (int i = 0; i < a->nmods; i++)
			if (a->mods[i].fused_key && x3_arch_sparse_layer(c, l) &&
			    (rc = renamed_scan(c, st, &a->mods[i], l)))
				return rc;
	for (int l = 0; l < c->n_layers && c->fused_experts; l++)
		for (int i = 0; i < a->nmods; i++) {
			const x3_module_desc *d = &a->mods[i];
			if (!d->fused || d->fused->part == 2 || !x3_arch_sparse_layer(c, l))
				continue;
			const x3_tensor *t = fused_src(st, d, l, name, sizeof name);
			int64_t out = x3_arch_dim(c, d->out), in = x3_arch_dim(c, d->in);
			int64_t per = d->fused->part ? 2 * out : out;
			if (!t)
				return x3_err(X3_EFORMAT, "missing tensor '%s' (the checkpoint holds experts in "
				              "fused 3-D tensors)", name);
			if (t->dtype != X3_F32 && t->dtype != X3_F16 && t->dtype != X3_BF16)
				return x3_err(X3_EFORMAT, "tensor '%s': dtype %s (F32, F16 or BF16 expected)", name,
				              x3_dtype_name(t->dtype));
			if (t->rank != 3 || t->shape[0] != c->n_experts || t->shape[1] != per || t->shape[2] != in)
				return x3_err(X3_EFORMAT, "tensor '%s': shape %s, config says %lldx%lldx%lld "
				              "(experts x %s x in)", name, x3_shape_str(t, b, sizeof b),
				              (long long)c->n_experts, (long long)per, (long long)in,
				              d->fused->part ? "2 expert widths" : "out");
		}
	return X3_OK;
}

int x3_modules_members(const x3_module *m, int n, const char *group, char *buf, size_t len)
{
	size_t p = 0;
	buf[0] = 0;
	for (int i = 0; i < n; i++) {
		if (m[i].d->kind != X3_KIND_LINEAR || strcmp(m[i].group, group))
			continue;
		int k = snprintf(buf + p, len - p, "%s%s.weight", p ? "," : "", m[i].key);
		if (k < 0 || (size_t)k >= len - p)
			return x3_err(X3_EINVAL, "members of group '%s' are too long", group);
		p += (size_t)k;
	}
	return X3_OK;
}

const x3_module_desc *x3_arch_classify(const char *key, int *layer)
{
	*layer = -1;
	for (int a = 0; a < x3_narchs; a++)
		for (int i = 0; i < x3_archs[a].nmods; i++) {
			const x3_module_desc *d = &x3_archs[a].mods[i];
			if (x3_arch_match(d->key, key, layer))
				return d;
		}
	/* the MTP layer's rows (those under a prefix of their own; DeepSeek's
	 * MTP layer has the keys of a layer: only the model tells them) */
	for (int a = 0; a < x3_narchs; a++) {
		const x3_arch_desc *A = &x3_archs[a];
		int n;
		const x3_module_desc *r = x3_arch_mtp_rows(A, &n);
		for (int p = 0; p < 2; p++)
			for (int i = 0; i < (p ? A->nmtp_post : A->nmtp_pre); i++) {
				const x3_module_desc *d = p ? &A->mtp_post[i] : &A->mtp_pre[i];
				if (x3_arch_match(d->key, key, layer))
					return d;
			}
		for (int i = 0; A->mtp_prefix && i < n; i++)
			if (x3_arch_match(r[i].key, key, layer))
				return &r[i];
	}
	/* the vision towers' linears */
	for (int a = 0; a < x3_narchs; a++)
		for (int i = 0; i < x3_archs[a].nvis; i++)
			if (x3_arch_match(x3_archs[a].vis[i].key, key, layer))
				return &x3_archs[a].vis[i];
	return NULL;
}

int x3_module_priority(const x3_module_desc *d)
{
	int base = 0;
	switch (d->slot) {
	case X3_SLOT_GDN_QKVZ: case X3_SLOT_GDN_QKV: case X3_SLOT_GDN_Z: case X3_SLOT_GDN_OUT:
		base = 1;
		break;
	default:
		base = d->role == X3_ROLE_ATTENTION ? 2 :
		       d->role == X3_ROLE_MLP || d->role == X3_ROLE_SHARED_EXPERT ? 1 : 0;
	}
	return base + d->hq;
}

/* the parts of a stored module, in the order pack-write writes them */
static long suffix_rank(const char *name)
{
	static const char *const suffixes[] = {"trellis", "suh", "svh", "su", "sv", "mcg", "mul1", "weight", "bias"};
	const char *dot = strrchr(name, '.');
	const char *s = dot ? dot + 1 : name;
	for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++)
		if (!strcmp(s, suffixes[i]))
			return (long)i;
	return 15;
}

void x3_arch_order(const x3_model_config *c, const char *name, long *module, long *rank)
{
	const x3_arch_desc *a = c->desc;
	const char *dot = strrchr(name, '.');
	size_t mlen = dot ? (size_t)(dot - name) : strlen(name);
	*rank = suffix_rank(name);
	*module = 2000000;
	if (!a)
		return;
	/* place inside a layer: the rows before the experts, expert e's rows
	 * (nexp of them) at first + e * nexp, then the rows after them */
	long npost = 0, nlayer = 0, npre = 0, nexp = 0, first = -1;
	long ne = c->n_experts > 0 ? (long)c->n_experts : 1;
	for (int i = 0; i < a->nmods; i++)
		if (a->mods[i].scope == X3_SCOPE_LAYER && has_expert(a->mods[i].key))
			nexp++;
	for (int i = 0; i < a->nmods; i++) {
		const x3_module_desc *d = &a->mods[i];
		long *cnt = d->scope == X3_SCOPE_PRE ? &npre : d->scope == X3_SCOPE_LAYER ? &nlayer : &npost;
		int l, e = 0;
		int ex = d->scope == X3_SCOPE_LAYER && has_expert(d->key);
		if (ex && first < 0)
			first = *cnt;
		if (match_e(d->key, name, mlen, &l, &e)) {
			if (d->scope == X3_SCOPE_LAYER)
				*module = 1 + l;
			else
				*module = d->scope == X3_SCOPE_PRE ? 0 : 2000000 + *cnt;
			long pos = *cnt;
			if (ex)
				pos += (long)e * nexp;
			else if (d->scope == X3_SCOPE_LAYER && first >= 0)
				pos += (ne - 1) * nexp;
			*rank += 16 * pos;
			return;
		}
		(*cnt)++;
	}
	nlayer += (ne - 1) * nexp;
	/* another tensor of a layer: after the layer's known modules */
	size_t plen = strlen(a->layer_prefix) + 8;
	for (const char *p = name; (p = strchr(p, '.')); p++) {
		int l;
		if ((size_t)(p - name) < plen && match_n(a->layer_prefix, name, (size_t)(p - name), &l)) {
			*module = 1 + l;
			*rank += 16 * nlayer;
			return;
		}
	}
	*module = 2000000 + npost;
}
