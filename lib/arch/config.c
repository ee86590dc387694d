/* config.c: HF config.json -> x3_model_config: the one parser of
 * config.json in the toolkit (the model forward, the description of the
 * modules in lib/arch/arch_tables.c, pack-write, exl3-matmul, tensor-ls --config). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>
#include "arch.h"
#include "config.h"
#include "config_impl.h"
#include "safetensors.h"
#include "io.h"

/* Positive integer key. required: absent is an error; else *v untouched. */
int x3_cfg_int(json_t *o, const char *key, int required, int64_t lo, int64_t *v)
{
	json_t *j = json_object_get(o, key);
	if (!j || json_is_null(j)) {
		if (required)
			return x3_err(X3_EFORMAT, "config.json: missing \"%s\"", key);
		return X3_OK;
	}
	double d;
	if (json_is_integer(j))
		d = (double)json_integer_value(j);
	else if (json_is_real(j))
		d = json_real_value(j);
	else
		return x3_err(X3_EFORMAT, "config.json: '%s' is not a number", key);
	if (d != floor(d) || d < (double)lo || d > 9.0e15)
		return x3_err(X3_EFORMAT, "config.json: '%s' = %g is not an integer >= %lld",
		              key, d, (long long)lo);
	*v = (int64_t)d;
	return X3_OK;
}

int x3_cfg_num(json_t *o, const char *key, double *v)
{
	json_t *j = json_object_get(o, key);
	if (!j || json_is_null(j))
		return X3_OK;
	if (!json_is_number(j))
		return x3_err(X3_EFORMAT, "config.json: '%s' is not a number", key);
	*v = json_number_value(j);
	if (!isfinite(*v))
		return x3_err(X3_EFORMAT, "config.json: '%s' is not finite", key);
	return X3_OK;
}

int x3_cfg_bool(json_t *o, const char *key, int *v)
{
	json_t *j = json_object_get(o, key);
	if (!j || json_is_null(j))
		return X3_OK;
	if (!json_is_boolean(j))
		return x3_err(X3_EFORMAT, "config.json: '%s' is not a boolean", key);
	*v = json_is_true(j);
	return X3_OK;
}

/* The architecture (root "architectures", else "model_type"), the text
 * model's object and the refusals that apply to every use. */
static int parse_arch(json_t *root, json_t **cp, x3_model_config *c)
{
	const char *arch = NULL;
	json_t *a = json_object_get(root, "architectures");
	if (a && json_is_array(a) && json_array_size(a) > 0) {
		if (json_array_size(a) > 1)
			return x3_err(X3_EUNSUP, "config.json: several architectures");
		if (!json_is_string(json_array_get(a, 0)))
			return x3_err(X3_EFORMAT, "config.json: 'architectures' holds a non-string");
		arch = json_string_value(json_array_get(a, 0));
	}
	json_t *mt = json_object_get(root, "model_type");
	const char *model_type = mt && json_is_string(mt) ? json_string_value(mt) : NULL;
	if (!arch && !model_type)
		return x3_err(X3_EFORMAT, "config.json: neither 'architectures' nor 'model_type'");
	/* multimodal configs keep the language model under text_config: its
	 * fields are read there when the root has no num_hidden_layers */
	json_t *tc = json_object_get(root, "text_config");
	*cp = json_is_object(tc) && !json_object_get(root, "num_hidden_layers") ? tc : root;
	c->desc = x3_arch_lookup(arch, model_type);
	if (!c->desc)
		return x3_err(X3_EUNSUP, "config.json: architecture '%s' is not supported "
		              "(%s causal LMs are)", arch ? arch : model_type, x3_arch_families());
	/* expert counts in the config of an architecture without experts */
	static const char *const moe[] = {"num_experts", "num_local_experts", "n_routed_experts"};
	for (size_t i = 0; i < sizeof moe / sizeof *moe; i++) {
		json_t *e = json_object_get(*cp, moe[i]);
		if (json_is_integer(e) && json_integer_value(e) > 0 &&
		    (!(c->desc->flags & X3_AF_MOE) || strcmp(moe[i], c->desc->experts_key)))
			return x3_err(X3_EUNSUP, "config.json: \"%s\": mixture-of-experts models are not "
			              "supported as %s (the architectures with experts read \"%s\")", moe[i],
			              c->desc->name, c->desc->flags & X3_AF_MOE ? c->desc->experts_key :
			              "num_local_experts or num_experts");
	}
	c->arch = c->desc->id;
	snprintf(c->arch_name, sizeof c->arch_name, "%s", c->desc->name);
	return X3_OK;
}

/* A string key that must be VALUE when present. */
static int want_str(json_t *o, const char *key, const char *value)
{
	json_t *j = json_object_get(o, key);
	if (!j || json_is_null(j))
		return X3_OK;
	if (!json_is_string(j))
		return x3_err(X3_EFORMAT, "config.json: '%s' is not a string", key);
	if (strcmp(json_string_value(j), value))
		return x3_err(X3_EUNSUP, "config.json: %s '%s' is not supported (%s is)", key,
		              json_string_value(j), value);
	return X3_OK;
}

/* GLM-4.7-Flash's dense layers (X3_AF_MLP_TYPES): mlp_layer_types, one
 * "dense" or "sparse" a layer, as Hugging Face's Glm4MoeLiteConfig reads
 * it; absent, layer 0 dense and the others sparse (its default, whatever
 * first_k_dense_replace says: the model does not read that key). */
static int parse_mlp_types(json_t *cj, x3_model_config *c)
{
	json_t *t = json_object_get(cj, "mlp_layer_types");
	c->first_dense = 0;
	memset(c->mlp_only, 0, sizeof c->mlp_only);
	if (!t || json_is_null(t)) {
		c->first_dense = 1;
		return X3_OK;
	}
	if (!json_is_array(t) || (int64_t)json_array_size(t) != c->n_layers)
		return x3_err(X3_EFORMAT, "config.json: 'mlp_layer_types' is not a list of num_hidden_layers = "
		              "%lld entries", (long long)c->n_layers);
	for (size_t l = 0; l < json_array_size(t); l++) {
		json_t *v = json_array_get(t, l);
		const char *s = json_is_string(v) ? json_string_value(v) : "";
		if (!strcmp(s, "sparse"))
			continue;
		if (strcmp(s, "dense"))
			return x3_err(X3_EFORMAT, "config.json: 'mlp_layer_types' entry %zu is not \"dense\" or "
			              "\"sparse\"", l);
		if (l >= 1024)
			return x3_err(X3_EUNSUP, "config.json: 'mlp_layer_types': layer %zu: only layers below "
			              "1024 can be dense", l);
		c->mlp_only[l / 64] |= 1ull << (l % 64);
	}
	return X3_OK;
}

/* DeepSeek V3's routing (X3_AF_GROUPED), with Hugging Face's
 * DeepseekV3Config defaults: n_group 8, topk_group 4, routed_scaling_factor
 * 2.5, n_shared_experts 1, first_k_dense_replace 3 (GLM-4 MoE's own
 * defaults come from its description: arch_tables.c). */
static int parse_grouped(json_t *cj, x3_model_config *c)
{
	int rc;
	int64_t freq = 1;
	c->sigmoid_route = 1;
	c->n_group = 8, c->topk_group = 4, c->n_shared = 1, c->first_dense = 3;
	c->routed_scale = 2.5;
	if ((rc = x3_cfg_int(cj, "n_group", 0, 1, &c->n_group)) ||
	    (rc = x3_cfg_int(cj, "topk_group", 0, 1, &c->topk_group)) ||
	    (rc = x3_cfg_int(cj, "n_shared_experts", 0, 0, &c->n_shared)) ||
	    (!(c->desc->flags & X3_AF_MLP_TYPES) &&
	     (rc = x3_cfg_int(cj, "first_k_dense_replace", 0, 0, &c->first_dense))) ||
	    (rc = x3_cfg_int(cj, "moe_layer_freq", 0, 1, &freq)) ||
	    (rc = x3_cfg_num(cj, "routed_scaling_factor", &c->routed_scale)) ||
	    (rc = want_str(cj, "scoring_func", "sigmoid")) || (rc = want_str(cj, "topk_method", "noaux_tc")))
		return rc;
	if (freq != 1)
		return x3_err(X3_EUNSUP, "config.json: moe_layer_freq %lld is not supported (1 is)", (long long)freq);
	if (c->n_experts % c->n_group || c->n_experts / c->n_group < 2)
		return x3_err(X3_EFORMAT, "config.json: 'n_routed_experts' = %lld is not n_group = %lld groups "
		              "of at least 2 experts", (long long)c->n_experts, (long long)c->n_group);
	if (c->topk_group > c->n_group)
		return x3_err(X3_EFORMAT, "config.json: 'topk_group' = %lld is more than 'n_group' = %lld",
		              (long long)c->topk_group, (long long)c->n_group);
	if (c->n_experts_tok > c->topk_group * (c->n_experts / c->n_group))
		return x3_err(X3_EFORMAT, "config.json: 'num_experts_per_tok' = %lld is more than the experts "
		              "of 'topk_group' = %lld groups", (long long)c->n_experts_tok, (long long)c->topk_group);
	if (c->n_shared > 64 || !(c->routed_scale > 0))
		return x3_err(X3_EFORMAT, "config.json: 'n_shared_experts' or 'routed_scaling_factor' out of range");
	c->shared_inter = c->n_shared * c->moe_inter;
	/* the sparse-attention families: mlp_layer_types when given, else
	 * first_k_dense_replace (Hugging Face derives the one from the other) */
	json_t *mt = json_object_get(cj, "mlp_layer_types");
	if ((c->desc->flags & X3_AF_DSA) && mt && !json_is_null(mt))
		return parse_mlp_types(cj, c);
	return (c->desc->flags & X3_AF_MLP_TYPES) ? parse_mlp_types(cj, c) : X3_OK;
}

/* Multi-head latent attention (X3_AF_MLA): the ranks and the head dims;
 * head_dim is the query/key head (nope + rope), one key and value head per
 * query head; the softmax scale (the yarn correction: config_rope.c). */
static int parse_mla(json_t *cj, x3_model_config *c)
{
	int rc;
	if ((rc = x3_cfg_int(cj, "q_lora_rank", 0, 1, &c->q_lora)) ||
	    (rc = x3_cfg_int(cj, "kv_lora_rank", 1, 1, &c->kv_lora)) ||
	    (rc = x3_cfg_int(cj, "qk_nope_head_dim", 1, 0, &c->qk_nope)) ||
	    (rc = x3_cfg_int(cj, "qk_rope_head_dim", 1, 1, &c->qk_rope)) ||
	    (rc = x3_cfg_int(cj, "v_head_dim", 1, 1, &c->v_dim)))
		return rc;
	if (c->q_lora > (1 << 20) || c->kv_lora > (1 << 20) || c->qk_nope > 65536 || c->qk_rope > 65536 ||
	    c->v_dim > 65536)
		return x3_err(X3_EFORMAT, "config.json: implausibly large attention dimensions");
	if (c->qk_rope % 2)
		return x3_err(X3_EFORMAT, "config.json: qk_rope_head_dim %lld is odd", (long long)c->qk_rope);
	c->mla = 1;
	c->head_dim = c->qk_nope + c->qk_rope;
	c->n_kv_heads = c->n_heads;
	c->attn_scale = 1.0 / sqrt((double)c->head_dim);
	c->rope_interleave = 1;
	return x3_cfg_bool(cj, "rope_interleave", &c->rope_interleave);
}

/* DeepSeek sparse attention (X3_AF_DSA): the indexer's sizes and top k,
 * and GLM-5's layers without an indexer, as Hugging Face's GlmMoeDsaConfig
 * reads them: indexer_types ("full" / "shared" a layer), else
 * index_topk_pattern ("FSS..." or such a list), else layer l full when
 * max(l - index_skip_topk_offset + 1, 0) % index_topk_freq == 0 (1 and 2
 * by default: every layer full). Layer 0 cannot reuse a selection. */
static int parse_dsa(json_t *cj, x3_model_config *c)
{
	int rc;
	if ((rc = x3_cfg_int(cj, "index_topk", 1, 1, &c->index_topk)) ||
	    (rc = x3_cfg_int(cj, "index_n_heads", 1, 1, &c->index_heads)) ||
	    (rc = x3_cfg_int(cj, "index_head_dim", 1, 1, &c->index_hd)))
		return rc;
	if (c->q_lora <= 0)
		return x3_err(X3_EFORMAT, "config.json: q_lora_rank is null: %s's indexer reads the query latent",
		              c->desc->family);
	if (c->index_heads > 4096 || c->index_hd > 65536)
		return x3_err(X3_EFORMAT, "config.json: implausibly large indexer dimensions");
	if (c->index_hd < c->qk_rope)
		return x3_err(X3_EFORMAT, "config.json: index_head_dim %lld is less than qk_rope_head_dim %lld "
		              "(the indexer rotates its first qk_rope_head_dim dimensions)",
		              (long long)c->index_hd, (long long)c->qk_rope);
	c->dsa = 1;
	memset(c->idx_shared, 0, sizeof c->idx_shared);
	json_t *t = json_object_get(cj, "indexer_types");
	const char *key = "indexer_types";
	if (!t || json_is_null(t))
		t = json_object_get(cj, key = "index_topk_pattern");
	if (t && json_is_string(t)) {
		const char *p = json_string_value(t);
		if ((int64_t)strlen(p) != c->n_layers)
			return x3_err(X3_EFORMAT, "config.json: 'index_topk_pattern' is not one letter F or S for each "
			              "of num_hidden_layers = %lld layers", (long long)c->n_layers);
		for (int64_t l = 0; l < c->n_layers; l++) {
			if (p[l] != 'F' && p[l] != 'S')
				return x3_err(X3_EFORMAT, "config.json: 'index_topk_pattern' letter %lld is not F or S",
				              (long long)l);
			if (p[l] == 'S' && l >= 1024)
				return x3_err(X3_EUNSUP, "config.json: 'index_topk_pattern': layer %lld: only layers below "
				              "1024 can share", (long long)l);
			if (p[l] == 'S')
				c->idx_shared[l / 64] |= 1ull << (l % 64);
		}
	} else if (t && !json_is_null(t)) {
		if (!json_is_array(t) || (int64_t)json_array_size(t) != c->n_layers)
			return x3_err(X3_EFORMAT, "config.json: '%s' is not a list of num_hidden_layers = %lld entries",
			              key, (long long)c->n_layers);
		for (size_t l = 0; l < json_array_size(t); l++) {
			json_t *v = json_array_get(t, l);
			const char *e = json_is_string(v) ? json_string_value(v) : "";
			int sh = !strcmp(e, "shared") || !strcmp(e, "S");
			if (!sh && strcmp(e, "full") && strcmp(e, "F"))
				return x3_err(X3_EFORMAT, "config.json: '%s' entry %zu is not \"full\" or \"shared\"", key, l);
			if (sh && l >= 1024)
				return x3_err(X3_EUNSUP, "config.json: '%s': layer %zu: only layers below 1024 can share",
				              key, l);
			if (sh)
				c->idx_shared[l / 64] |= 1ull << (l % 64);
		}
	} else {
		int64_t freq = 1, off = 2;
		if ((rc = x3_cfg_int(cj, "index_topk_freq", 0, 0, &freq)) ||
		    (rc = x3_cfg_int(cj, "index_skip_topk_offset", 0, 0, &off)))
			return rc;
		if (freq < 1)
			freq = 1;
		for (int64_t l = 0; l < c->n_layers && freq > 1; l++) {
			int64_t d = l - off + 1 > 0 ? l - off + 1 : 0;
			if (d % freq && l >= 1024)
				return x3_err(X3_EUNSUP, "config.json: index_topk_freq: layer %lld: only layers below "
				              "1024 can share", (long long)l);
			if (d % freq)
				c->idx_shared[l / 64] |= 1ull << (l % 64);
		}
	}
	if (c->idx_shared[0] & 1)
		return x3_err(X3_EFORMAT, "config.json: '%s': layer 0 is \"shared\", but no layer before it picks "
		              "the keys", key);
	return X3_OK;
}

/* The experts of a mixture-of-experts architecture (X3_AF_MOE): their
 * count, the top k, their width, the shared expert and which layers are
 * sparse. Counts that contradict each other are refused naming the key. */
static int parse_moe(json_t *cj, x3_model_config *c)
{
	unsigned f = c->desc->flags;
	int rc;
	if (!(f & X3_AF_MOE))
		return X3_OK;
	const char *ek = c->desc->experts_key;
	if ((rc = x3_cfg_int(cj, ek, 1, 1, &c->n_experts)) ||
	    (rc = x3_cfg_int(cj, "num_experts_per_tok", 1, 1, &c->n_experts_tok)))
		return rc;
	if (c->n_experts > 65536)
		return x3_err(X3_EFORMAT, "config.json: '%s' = %lld is implausibly large", ek,
		              (long long)c->n_experts);
	if (c->n_experts_tok > c->n_experts)
		return x3_err(X3_EFORMAT, "config.json: 'num_experts_per_tok' = %lld is more than '%s' = %lld",
		              (long long)c->n_experts_tok, ek, (long long)c->n_experts);
	c->moe_inter = c->intermediate;
	if ((f & X3_AF_MOE_OWN_INTER) && (rc = x3_cfg_int(cj, "moe_intermediate_size", 1, 1, &c->moe_inter)))
		return rc;
	if ((f & X3_AF_GROUPED) && (rc = parse_grouped(cj, c)))
		return rc;
	if ((f & X3_AF_SHARED) && !(f & X3_AF_GROUPED) &&
	    (rc = x3_cfg_int(cj, "shared_expert_intermediate_size", 0, 0, &c->shared_inter)))
		return rc;
	if (c->moe_inter > (1 << 22) || c->shared_inter > (1 << 22))
		return x3_err(X3_EFORMAT, "config.json: implausibly large expert dimensions");
	c->norm_topk = 1;
	if (!(f & X3_AF_MOE_RENORM)) {
		/* the Hugging Face defaults: false in the Qwen MoE configs, true in
		 * DeepSeek V3's */
		c->norm_topk = !!(f & X3_AF_GROUPED);
		if ((rc = x3_cfg_bool(cj, "norm_topk_prob", &c->norm_topk)))
			return rc;
	}
	c->sparse_step = 1;
	if (!(f & X3_AF_MOE_STEP))
		return X3_OK;
	if ((rc = x3_cfg_int(cj, "decoder_sparse_step", 0, 1, &c->sparse_step)))
		return rc;
	json_t *mo = json_object_get(cj, "mlp_only_layers");
	if (mo && !json_is_null(mo)) {
		if (!json_is_array(mo))
			return x3_err(X3_EFORMAT, "config.json: 'mlp_only_layers' is not a list");
		for (size_t i = 0; i < json_array_size(mo); i++) {
			json_t *v = json_array_get(mo, i);
			if (!json_is_integer(v) || json_integer_value(v) < 0 ||
			    json_integer_value(v) >= c->n_layers)
				return x3_err(X3_EFORMAT, "config.json: 'mlp_only_layers' entry %zu is not a "
				              "layer (0..%lld)", i, (long long)c->n_layers - 1);
			json_int_t l = json_integer_value(v);
			if (l >= 1024)
				return x3_err(X3_EUNSUP, "config.json: 'mlp_only_layers': layer %lld: only "
				              "layers below 1024 can be dense", (long long)l);
			c->mlp_only[l / 64] |= 1ull << (l % 64);
		}
	}
	return X3_OK;
}

/* The Qwen3-Next / Qwen3.5 hybrids (X3_AF_HYBRID): the Gated DeltaNet's
 * heads and conv kernel (every linear_* key required: a model without
 * them is not one of these), and which layers are linear attention:
 * layer_types ("linear_attention" / "full_attention"), else every
 * full_attention_interval-th layer full (Hugging Face's default 4). */
static int parse_hybrid(json_t *cj, x3_model_config *c)
{
	int rc;
	c->hybrid = c->norm_offset = c->qk_norm = 1;
	if ((rc = x3_cfg_int(cj, "linear_num_key_heads", 1, 1, &c->lin_nk)) ||
	    (rc = x3_cfg_int(cj, "linear_num_value_heads", 1, 1, &c->lin_nv)) ||
	    (rc = x3_cfg_int(cj, "linear_key_head_dim", 1, 1, &c->lin_dk)) ||
	    (rc = x3_cfg_int(cj, "linear_value_head_dim", 1, 1, &c->lin_dv)) ||
	    (rc = x3_cfg_int(cj, "linear_conv_kernel_dim", 1, 1, &c->lin_kconv)))
		return rc;
	if (c->lin_nk > 4096 || c->lin_nv > 4096 || c->lin_dk > 65536 || c->lin_dv > 65536 || c->lin_kconv > 64)
		return x3_err(X3_EFORMAT, "config.json: implausibly large linear attention dimensions");
	if (c->lin_nv % c->lin_nk)
		return x3_err(X3_EFORMAT, "config.json: 'linear_num_value_heads' %lld is not a multiple of "
		              "'linear_num_key_heads' %lld", (long long)c->lin_nv, (long long)c->lin_nk);
	if (c->n_layers > 1024)
		return x3_err(X3_EUNSUP, "config.json: %lld layers: a hybrid of more than 1024 is not supported",
		              (long long)c->n_layers);
	c->full_interval = 4;
	if ((rc = x3_cfg_int(cj, "full_attention_interval", 0, 1, &c->full_interval)))
		return rc;
	json_t *lt = json_object_get(cj, "layer_types");
	if (lt && !json_is_null(lt)) {
		if (!json_is_array(lt) || (int64_t)json_array_size(lt) != c->n_layers)
			return x3_err(X3_EFORMAT, "config.json: 'layer_types' is not a list of num_hidden_layers = "
			              "%lld entries", (long long)c->n_layers);
		for (size_t i = 0; i < json_array_size(lt); i++) {
			json_t *v = json_array_get(lt, i);
			const char *t = json_is_string(v) ? json_string_value(v) : "";
			if (!strcmp(t, "linear_attention"))
				c->lin_layers[i / 64] |= 1ull << (i % 64);
			else if (strcmp(t, "full_attention"))
				return x3_err(X3_EFORMAT, "config.json: 'layer_types' entry %zu is not "
				              "\"linear_attention\" or \"full_attention\"", i);
		}
		return X3_OK;
	}
	for (int64_t l = 0; l < c->n_layers; l++)
		if ((l + 1) % c->full_interval)
			c->lin_layers[l / 64] |= 1ull << (l % 64);
	return X3_OK;
}

/* The sizes, the tied head and the biases: what the description of the
 * modules needs (lib/arch/arch_tables.c). */
static int parse_layout(json_t *root, json_t *cj, x3_model_config *c)
{
	int rc;
	if ((rc = x3_cfg_int(cj, "hidden_size", 1, 1, &c->hidden)) ||
	    (rc = x3_cfg_int(cj, "intermediate_size", 1, 1, &c->intermediate)) ||
	    (rc = x3_cfg_int(cj, "num_hidden_layers", 1, 1, &c->n_layers)) ||
	    (rc = x3_cfg_int(cj, "num_attention_heads", 1, 1, &c->n_heads)) ||
	    (rc = x3_cfg_int(cj, "vocab_size", 1, 1, &c->vocab)))
		return rc;
	c->n_kv_heads = c->n_heads;
	c->head_dim = 0;
	c->max_pos = 2048;
	if ((rc = x3_cfg_int(cj, "num_key_value_heads", 0, 1, &c->n_kv_heads)) ||
	    (rc = x3_cfg_int(cj, "head_dim", 0, 1, &c->head_dim)) ||
	    (rc = x3_cfg_int(cj, "max_position_embeddings", 0, 1, &c->max_pos)))
		return rc;
	if (c->hidden > (1 << 20) || c->intermediate > (1 << 22) || c->n_layers > 100000 ||
	    c->n_heads > 4096 || c->vocab > (1 << 24) || c->head_dim > 65536)
		return x3_err(X3_EFORMAT, "config.json: implausibly large dimensions");
	if ((c->desc->flags & X3_AF_MLA) && (rc = parse_mla(cj, c)))
		return rc;
	/* GLM-5's and DeepSeek V3.2's latent attention rotates interleaved
	 * pairs, whatever a rope_interleave key says (Hugging Face's models
	 * read none); GLM-5's indexer too, DeepSeek V3.2's as halves */
	if (c->desc->flags & X3_AF_DSA) {
		c->rope_interleave = 1;
		c->idx_interleave = c->desc->id == X3_ARCH_GLM_MOE_DSA;
	}
	if ((c->desc->flags & X3_AF_DSA) && (rc = parse_dsa(cj, c)))
		return rc;
	if (!c->head_dim) {
		if (c->hidden % c->n_heads)
			return x3_err(X3_EFORMAT, "config.json: hidden_size %lld is not a multiple of "
			              "num_attention_heads %lld and there is no head_dim",
			              (long long)c->hidden, (long long)c->n_heads);
		c->head_dim = c->hidden / c->n_heads;
	}
	if (c->head_dim % 2)
		return x3_err(X3_EFORMAT, "config.json: head_dim %lld is odd", (long long)c->head_dim);
	if (c->n_heads % c->n_kv_heads)
		return x3_err(X3_EFORMAT, "config.json: num_attention_heads %lld is not a multiple "
		              "of num_key_value_heads %lld", (long long)c->n_heads, (long long)c->n_kv_heads);

	c->mtp_cfg = 0;
	c->n_mtp = 0;
	if (c->desc->mtp_fc_key &&
	    (rc = x3_cfg_int(cj, (c->desc->flags & X3_AF_HYBRID) ? "mtp_num_hidden_layers" : "num_nextn_predict_layers", 0, 0,
	                     &c->mtp_cfg)))
		return rc;

	c->tied = 0;
	json_t *t = json_object_get(cj, "tie_word_embeddings");
	if ((rc = x3_cfg_bool(t || cj == root ? cj : root, "tie_word_embeddings", &c->tied)))
		return rc;

	int attn_bias = 0, mlp_bias = 0;
	if ((rc = x3_cfg_bool(cj, "attention_bias", &attn_bias)) ||
	    (rc = x3_cfg_bool(cj, "mlp_bias", &mlp_bias)))
		return rc;
	unsigned f = c->desc->flags;
	c->qkv_bias = (f & X3_AF_QKV_BIAS) || ((f & (X3_AF_ATTN_BIAS | X3_AF_QKV_ATTN_BIAS)) && attn_bias);
	c->o_bias = (f & X3_AF_ATTN_BIAS) && attn_bias;
	c->mlp_bias = (f & X3_AF_MLP_BIAS) && mlp_bias;
	c->qk_norm = !!(f & X3_AF_QK_NORM);
	if ((f & X3_AF_USE_QK_NORM) && (rc = x3_cfg_bool(cj, "use_qk_norm", &c->qk_norm)))
		return rc;

	if ((rc = parse_moe(cj, c)))
		return rc;
	if ((f & X3_AF_HYBRID) && (rc = parse_hybrid(cj, c)))
		return rc;

	json_t *q = json_object_get(root, "quantization_config");
	if (q && !json_is_null(q)) {
		json_t *qm = json_object_get(q, "quant_method");
		c->quantized = qm && json_is_string(qm) && !strcmp(json_string_value(qm), "exl3");
		c->foreign_quant = !c->quantized;
		/* block-scaled FP8 (DeepSeek V3's checkpoints): the safetensors
		 * reader dequantizes its 128x128 blocks on read */
		if (qm && json_is_string(qm) && !strcmp(json_string_value(qm), "fp8")) {
			json_t *bs = json_object_get(q, "weight_block_size");
			if (bs && !json_is_null(bs) &&
			    !(json_is_array(bs) && json_array_size(bs) == 2 &&
			      json_integer_value(json_array_get(bs, 0)) == 128 &&
			      json_integer_value(json_array_get(bs, 1)) == 128))
				return x3_err(X3_EUNSUP, "config.json: quantization_config fp8: weight_block_size "
				              "other than [128, 128] is not supported");
			c->foreign_quant = 0;
		}
		/* GPT-OSS's MXFP4 experts (the hub's checkpoints): the safetensors
		 * reader decodes them on read (safetensors.h) */
		if ((c->desc->flags & X3_AF_GPT_OSS) && qm && json_is_string(qm) && !strcmp(json_string_value(qm), "mxfp4"))
			c->foreign_quant = 0;
	}
	return x3_config_vision_parse(root, c);
}

/* Gemma 2/3 (X3_AF_GEMMA; the defaults are the architecture's, filled in
 * by with_defaults): the activation, the softmax scale, the soft-caps and
 * which layers slide. Gemma2 alternates (layer l slides when l is even),
 * Gemma3 follows layer_types, else sliding_window_pattern (layer l global
 * when (l + 1) % pattern == 0), and its sliding layers take RoPE base
 * rope_local_base_freq without rope_scaling (Hugging Face's
 * Gemma3RotaryEmbedding for local layers). */
static int parse_gemma(json_t *cj, x3_model_config *c)
{
	int rc;
	json_t *act = json_object_get(cj, "hidden_activation");
	if (!act || json_is_null(act))
		act = json_object_get(cj, "hidden_act");
	if (act && !json_is_null(act) && !json_is_string(act))
		return x3_err(X3_EFORMAT, "config.json: 'hidden_activation' is not a string");
	if (act && !json_is_null(act) && strcmp(json_string_value(act), "gelu_pytorch_tanh"))
		return x3_err(X3_EUNSUP, "config.json: hidden_activation '%s' is not supported (gelu_pytorch_tanh is)",
		              json_string_value(act));
	c->gemma = 1;
	c->act_gelu_tanh = 1;
	double qs = 0;
	if ((rc = x3_cfg_num(cj, "query_pre_attn_scalar", &qs)) ||
	    (rc = x3_cfg_num(cj, "attn_logit_softcapping", &c->attn_softcap)) ||
	    (rc = x3_cfg_num(cj, "final_logit_softcapping", &c->final_softcap)) ||
	    (rc = x3_cfg_int(cj, "sliding_window", 1, 1, &c->sliding_window)))
		return rc;
	if (!(qs > 0))
		return x3_err(X3_EFORMAT, "config.json: 'query_pre_attn_scalar' must be positive");
	if (c->attn_softcap < 0 || c->final_softcap < 0)
		return x3_err(X3_EFORMAT, "config.json: a negative logit soft-cap");
	c->attn_scale = 1.0 / sqrt(qs);
	c->swa_masked = 1;
	if (c->n_layers > 1024)
		return x3_err(X3_EUNSUP, "config.json: %lld layers: only 1024 are supported", (long long)c->n_layers);
	json_t *lt = json_object_get(cj, "layer_types");
	if (lt && !json_is_null(lt)) {
		if (!json_is_array(lt) || (int64_t)json_array_size(lt) != c->n_layers)
			return x3_err(X3_EFORMAT, "config.json: 'layer_types' is not a list of num_hidden_layers = %lld "
			              "entries", (long long)c->n_layers);
		for (size_t i = 0; i < json_array_size(lt); i++) {
			const char *t = json_string_value(json_array_get(lt, i));
			if (t && !strcmp(t, "sliding_attention"))
				c->swa_layers[i / 64] |= 1ull << (i % 64);
			else if (!t || strcmp(t, "full_attention"))
				return x3_err(X3_EUNSUP, "config.json: 'layer_types' entry %zu: '%s' is not "
				              "sliding_attention or full_attention", i, t ? t : "(not a string)");
		}
	} else {
		int64_t pat = 2;
		if ((c->desc->flags & X3_AF_GEMMA3) && (rc = x3_cfg_int(cj, "sliding_window_pattern", 0, 1, &pat)))
			return rc;
		for (int64_t l = 0; l < c->n_layers; l++)
			if ((l + 1) % pat)
				c->swa_layers[l / 64] |= 1ull << (l % 64);
	}
	if ((c->desc->flags & X3_AF_GEMMA3) && (rc = x3_cfg_num(cj, "rope_local_base_freq", &c->rope_local_theta)))
		return rc;
	if (c->rope_local_theta < 0)
		return x3_err(X3_EFORMAT, "config.json: 'rope_local_base_freq' out of range");
	return X3_OK;
}

/* layer_types (num_hidden_layers entries, sliding_attention or
 * full_attention) into swa_layers; absent: every layer whose number plus
 * one is odd slides (Gemma2's and GPT-OSS's alternation) */
static int parse_layer_types(json_t *cj, x3_model_config *c)
{
	if (c->n_layers > 1024)
		return x3_err(X3_EUNSUP, "config.json: %lld layers: only 1024 are supported", (long long)c->n_layers);
	json_t *lt = json_object_get(cj, "layer_types");
	if (!lt || json_is_null(lt)) {
		for (int64_t l = 0; l < c->n_layers; l++)
			if ((l + 1) % 2)
				c->swa_layers[l / 64] |= 1ull << (l % 64);
		return X3_OK;
	}
	if (!json_is_array(lt) || (int64_t)json_array_size(lt) != c->n_layers)
		return x3_err(X3_EFORMAT, "config.json: 'layer_types' is not a list of num_hidden_layers = %lld "
		              "entries", (long long)c->n_layers);
	for (size_t i = 0; i < json_array_size(lt); i++) {
		const char *t = json_string_value(json_array_get(lt, i));
		if (t && !strcmp(t, "sliding_attention"))
			c->swa_layers[i / 64] |= 1ull << (i % 64);
		else if (!t || strcmp(t, "full_attention"))
			return x3_err(X3_EUNSUP, "config.json: 'layer_types' entry %zu: '%s' is not "
			              "sliding_attention or full_attention", i, t ? t : "(not a string)");
	}
	return X3_OK;
}

/* GPT-OSS (X3_AF_GPT_OSS; GptOssConfig's defaults filled in): the
 * sliding layers (layer_types) and their window, the sinks, the routing,
 * the experts' clamped SwiGLU. The hub's configs give the top k twice
 * (num_experts_per_tok, experts_per_token): they must agree. */
static int parse_gpt_oss(json_t *cj, x3_model_config *c)
{
	int rc;
	int64_t ept = c->n_experts_tok;
	c->swiglu_alpha = 1.702;
	if ((rc = x3_cfg_int(cj, "sliding_window", 1, 1, &c->sliding_window)) ||
	    (rc = x3_cfg_int(cj, "experts_per_token", 0, 1, &ept)) ||
	    (rc = x3_cfg_num(cj, "swiglu_limit", &c->swiglu_limit)) ||
	    (rc = x3_cfg_num(cj, "swiglu_alpha", &c->swiglu_alpha)))
		return rc;
	if (ept != c->n_experts_tok)
		return x3_err(X3_EFORMAT, "config.json: 'experts_per_token' = %lld and 'num_experts_per_tok' = %lld "
		              "disagree", (long long)ept, (long long)c->n_experts_tok);
	if (!(c->swiglu_limit > 0))
		return x3_err(X3_EFORMAT, "config.json: 'swiglu_limit' = %g is not positive", c->swiglu_limit);
	if (!isfinite(c->swiglu_alpha))
		return x3_err(X3_EFORMAT, "config.json: 'swiglu_alpha' is not finite");
	c->sinks = 1;
	c->topk_softmax = 1;
	c->swa_masked = 1;
	return parse_layer_types(cj, c);
}

/* What only the forward pass needs: RoPE, activation, attention window,
 * token ids; options it cannot run are refused here. */
static int parse_forward(json_t *root, json_t *cj, x3_model_config *c)
{
	int rc;
	c->rope_theta = 10000.0;
	c->rms_eps = 1e-6;
	if ((rc = x3_cfg_num(cj, "rope_theta", &c->rope_theta)) ||
	    (rc = x3_cfg_num(cj, "rms_norm_eps", &c->rms_eps)))
		return rc;
	/* the hybrids' default rotates a quarter of each head */
	double prf = c->hybrid ? 0.25 : 1.0;
	if ((rc = x3_cfg_num(cj, "partial_rotary_factor", &prf)))
		return rc;
	/* Transformers v5 writes rope_parameters {rope_type, rope_theta,
	 * partial_rotary_factor, ...}: read where the top level has no key of
	 * its own; a scaled type there is refused, not run as the default */
	json_t *rpar = json_object_get(cj, "rope_parameters");
	if (rpar && !json_is_null(rpar)) {
		if (!json_is_object(rpar))
			return x3_err(X3_EFORMAT, "config.json: 'rope_parameters' is not an object");
		if ((!json_object_get(cj, "rope_theta") && (rc = x3_cfg_num(rpar, "rope_theta", &c->rope_theta))) ||
		    (!json_object_get(cj, "partial_rotary_factor") &&
		     (rc = x3_cfg_num(rpar, "partial_rotary_factor", &prf))))
			return rc;
		json_t *ty = json_object_get(rpar, "rope_type"), *rs = json_object_get(cj, "rope_scaling");
		if (ty && json_is_string(ty) && strcmp(json_string_value(ty), "default") && (!rs || json_is_null(rs)) &&
		    !(c->desc->flags & X3_AF_GPT_OSS))
			return x3_err(X3_EUNSUP, "config.json: rope_parameters rope_type '%s' is not supported "
			              "(default is; other types as rope_scaling)", json_string_value(ty));
	}
	/* a norm's epsilon of 0 divides a zero row by zero */
	if (!(c->rope_theta > 0))
		return x3_err(X3_EFORMAT, "config.json: 'rope_theta' = %g is not positive", c->rope_theta);
	if (!(c->rms_eps > 0))
		return x3_err(X3_EFORMAT, "config.json: 'rms_norm_eps' = %g is not positive", c->rms_eps);
	if ((rc = x3_config_rope(cj, c)))
		return rc;
	/* RoPE on the first head_dim * partial_rotary_factor dimensions of
	 * each head (Hugging Face truncates to an integer), the rest passed
	 * unrotated (Phi-3.5/Phi-4-mini: 0.75) */
	c->rot_dim = c->head_dim;
	if (prf != 1.0) {
		if (c->mla)
			return x3_err(X3_EUNSUP, "config.json: partial_rotary_factor %g with latent attention "
			              "is not supported", prf);
		int64_t rd = (int64_t)((double)c->head_dim * prf);
		if (!(prf > 0 && prf <= 1) || rd < 2 || rd % 2)
			return x3_err(X3_EFORMAT, "config.json: partial_rotary_factor %g gives %lld rotated "
			              "dimensions of head_dim %lld (a positive even count expected)", prf,
			              (long long)rd, (long long)c->head_dim);
		c->rot_dim = rd;
	}
	if (c->rope_type == 4 && c->rope_nfactors != c->rot_dim / 2)
		return x3_err(X3_EFORMAT, "config.json: rope_scaling longrope has %d factors per list, and %lld "
		              "rotated dimensions of a head want %lld", c->rope_nfactors, (long long)c->rot_dim,
		              (long long)(c->rot_dim / 2));

	if (c->desc->flags & X3_AF_GEMMA) {
		if ((rc = parse_gemma(cj, c)))
			return rc;
		goto ids;
	}
	if ((c->desc->flags & X3_AF_GPT_OSS) && (rc = parse_gpt_oss(cj, c)))
		return rc;
	json_t *act = json_object_get(cj, "hidden_act");
	if (act && !json_is_null(act)) {
		if (!json_is_string(act))
			return x3_err(X3_EFORMAT, "config.json: 'hidden_act' is not a string");
		if (strcmp(json_string_value(act), "silu"))
			return x3_err(X3_EUNSUP, "config.json: hidden_act '%s' is not supported (silu is)",
			              json_string_value(act));
	}

	/* Sliding-window attention: recorded; the forward refuses rows longer
	 * than the window (where it would have an effect). */
	int64_t win = 0;
	if (c->desc->flags & X3_AF_SLIDING) {
		if ((rc = x3_cfg_int(cj, "sliding_window", 0, 1, &win)))
			return rc;
	} else if (c->desc->flags & X3_AF_USE_SLIDING) {
		int use = 0;
		if ((rc = x3_cfg_bool(cj, "use_sliding_window", &use)))
			return rc;
		if (use && (rc = x3_cfg_int(cj, "sliding_window", 0, 1, &win)))
			return rc;
	}
	if (!c->swa_masked)
		c->sliding_window = win;
	if (json_object_get(cj, "layer_types") && !c->swa_masked && !c->hybrid)
		for (size_t i = 0; i < json_array_size(json_object_get(cj, "layer_types")); i++) {
			json_t *lt = json_array_get(json_object_get(cj, "layer_types"), i);
			if (json_is_string(lt) && strcmp(json_string_value(lt), "full_attention") &&
			    !c->sliding_window &&
			    !(c->dsa && !strcmp(json_string_value(lt), "deepseek_sparse_attention")))
				return x3_err(X3_EUNSUP, "config.json: layer type '%s' is not supported",
				              json_string_value(lt));
		}

ids:
	c->bos_id = c->eos_id = -1;
	json_t *b = json_object_get(cj, "bos_token_id");
	if (!b && cj != root)
		b = json_object_get(root, "bos_token_id");
	if (b && json_is_integer(b))
		c->bos_id = json_integer_value(b);
	json_t *e = json_object_get(cj, "eos_token_id");
	if (!e && cj != root)
		e = json_object_get(root, "eos_token_id");
	if (e && json_is_array(e))
		e = json_array_get(e, 0);
	if (e && json_is_integer(e))
		c->eos_id = json_integer_value(e);

	if (c->foreign_quant) {
		json_t *qm = json_object_get(json_object_get(root, "quantization_config"), "quant_method");
		return x3_err(X3_EUNSUP, "config.json: quantization_config with quant_method "
		              "'%s' is not supported (exl3 is)",
		              qm && json_is_string(qm) ? json_string_value(qm) : "?");
	}
	return X3_OK;
}

/* The architecture's defaults (x3_arch_desc.defaults: Hugging Face's, for
 * the keys real configs leave out) under the text model's keys: *cj
 * becomes a filled copy (*filled, the caller's reference). A
 * tie_word_embeddings of the root counts as given. */
static int with_defaults(json_t *root, json_t **cj, x3_model_config *c, json_t **filled)
{
	*filled = NULL;
	if (!c->desc->defaults)
		return X3_OK;
	json_error_t je;
	json_t *d = json_loads(c->desc->defaults, 0, &je);
	json_t *f = json_deep_copy(*cj);
	if (!d || !f) {
		json_decref(d), json_decref(f);
		return x3_err(X3_ENOMEM, "config.json: cannot apply the %s defaults", c->desc->family);
	}
	json_t *rt = json_object_get(root, "tie_word_embeddings");
	if (*cj != root && rt && !json_object_get(f, "tie_word_embeddings"))
		json_object_set(f, "tie_word_embeddings", rt);
	json_object_update_missing(f, d);
	json_decref(d);
	*cj = *filled = f;
	return X3_OK;
}

static int parse_root(json_t *root, unsigned what, x3_model_config *c)
{
	int rc;
	memset(c, 0, sizeof *c);
	if (!json_is_object(root))
		return x3_err(X3_EFORMAT, "config.json: not a JSON object");
	json_t *cj = root, *filled = NULL;
	if ((rc = parse_arch(root, &cj, c)))
		return rc;
	int at_root = cj == root;
	if ((rc = with_defaults(root, &cj, c, &filled)))
		return rc;
	json_t *r = at_root ? cj : root;   /* the filled copy is the root too */
	if (!(rc = parse_layout(r, cj, c)) && what != X3_CONFIG_LAYOUT)
		rc = parse_forward(r, cj, c);
	json_decref(filled);
	return rc;
}

int x3_config_parse_as(const char *text, size_t len, unsigned what, x3_model_config *cfg)
{
	json_error_t jerr;
	json_t *root = json_loadb(text, len, 0, &jerr);
	if (!root)
		return x3_err(X3_EFORMAT, "config.json: line %d: %s", jerr.line, jerr.text);
	int rc = parse_root(root, what, cfg);
	json_decref(root);
	return rc;
}

int x3_config_parse(const char *text, size_t len, x3_model_config *cfg)
{
	return x3_config_parse_as(text, len, X3_CONFIG_FORWARD, cfg);
}

int x3_config_text(const char *dir, char **text, size_t *textlen)
{
	char path[4096];
	*text = NULL;
	snprintf(path, sizeof path, "%s/config.json", dir);
	int fd, rc = x3_open_regular(path, &fd);
	if (rc)
		return rc;
	FILE *f = fdopen(fd, "rb");
	if (!f) {
		close(fd);
		return x3_err(X3_EIO, "%s: %s", path, strerror(errno));
	}
	char *buf = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (len + 65536 > cap) {
			cap = cap ? 2 * cap : 65536;
			if (cap > (64u << 20)) {
				free(buf);
				fclose(f);
				return x3_err(X3_EFORMAT, "%s: larger than 64 MiB", path);
			}
			char *nb = realloc(buf, cap);
			if (!nb) {
				free(buf);
				fclose(f);
				return x3_err(X3_ENOMEM, "%s: out of memory", path);
			}
			buf = nb;
		}
		size_t n = fread(buf + len, 1, cap - len, f);
		len += n;
		if (n == 0)
			break;
	}
	int bad = ferror(f) ? errno : 0;
	fclose(f);
	if (bad) {
		free(buf);
		return x3_err(X3_EIO, "%s: read error: %s", path, strerror(bad));
	}
	if (len == cap) {   /* room for the terminating NUL */
		char *nb = realloc(buf, cap + 1);
		if (!nb) {
			free(buf);
			return x3_err(X3_ENOMEM, "%s: out of memory", path);
		}
		buf = nb;
	}
	buf[len] = 0;
	*text = buf;
	if (textlen)
		*textlen = len;
	return X3_OK;
}

int x3_config_load_as(const char *dir, unsigned what, x3_model_config *cfg)
{
	char *buf;
	size_t len;
	int rc = x3_config_text(dir, &buf, &len);
	if (rc)
		return rc;
	rc = x3_config_parse_as(buf, len, what, cfg);
	free(buf);
	/* a mixture of experts: are its experts in fused 3-D tensors? (a
	 * directory without safetensors has none) */
	x3_st *st = NULL;
	if (!rc && cfg->desc && (cfg->desc->flags & X3_AF_MOE) && !x3_st_open(dir, &st)) {
		rc = x3_arch_fused_scan(cfg, st);
		x3_st_close(st);
		st = NULL;
	}
	/* the multi-token prediction layer: part of the model when the
	 * checkpoint (or pack) holds its projection */
	if (!rc && cfg->mtp_cfg > 0 && !x3_st_open(dir, &st)) {
		rc = x3_arch_mtp_scan(cfg, st);
		x3_st_close(st);
	}
	if (rc)
		x3_errprefix(rc, "%s", dir);
	return rc;
}

int x3_config_load(const char *dir, x3_model_config *cfg)
{
	return x3_config_load_as(dir, X3_CONFIG_FORWARD, cfg);
}

int64_t x3_config_chunk_tokens(const x3_model_config *c)
{
	int64_t inter = c->intermediate > c->moe_inter ? c->intermediate : c->moe_inter;
	int64_t per = 4 * (4 * c->hidden + 3 * inter);
	if (c->hybrid) {
		/* the DeltaNet's projections, their conv, the gated q_proj */
		int64_t cd = 2 * c->lin_nk * c->lin_dk + c->lin_nv * c->lin_dv, vd = c->lin_nv * c->lin_dv;
		per += 4 * (3 * cd + 3 * vd + 2 * c->n_heads * c->head_dim);
	}
	int64_t fit = per > 0 ? (256LL << 20) / per : 4096;
	return fit < 4096 ? fit : 4096;
}
