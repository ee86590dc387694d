/* config_rope.c: config.json's rope_scaling (or GPT-OSS's rope_parameters):
 * linear, llama3, yarn and longrope, as Hugging Face computes their
 * parameters; config.c calls it. */
#include <math.h>
#include <string.h>
#include <jansson.h>
#include "arch.h"
#include "config.h"
#include "config_impl.h"

/* 0.1 * m * ln(s) + 1 (1 for s <= 1): YaRN's magnitude correction */
static double yarn_mscale(double s, double m)
{
	return s <= 1 ? 1.0 : 0.1 * m * log(s) + 1.0;
}

/* rope_scaling type yarn (as Hugging Face's _compute_yarn_parameters):
 * factor, beta_fast (32), beta_slow (1), original_max_position_embeddings
 * (else max_position_embeddings), the cos/sin factor attention_factor, else
 * mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are
 * set, else mscale(factor, 1). DeepSeek's softmax scale takes
 * mscale(factor, mscale_all_dim)^2 (parse_mla). */
static int parse_yarn(json_t *rs, x3_model_config *c)
{
	int rc;
	double ms = 0, msa = 0, af = 0;
	c->rope_type = 3;
	c->rope_beta_fast = 32, c->rope_beta_slow = 1;
	c->rope_orig_max_pos = c->max_pos;
	if ((rc = x3_cfg_num(rs, "beta_fast", &c->rope_beta_fast)) ||
	    (rc = x3_cfg_num(rs, "beta_slow", &c->rope_beta_slow)) ||
	    (rc = x3_cfg_num(rs, "mscale", &ms)) || (rc = x3_cfg_num(rs, "mscale_all_dim", &msa)) ||
	    (rc = x3_cfg_num(rs, "attention_factor", &af)) ||
	    (rc = x3_cfg_int(rs, "original_max_position_embeddings", 0, 1, &c->rope_orig_max_pos)))
		return rc;
	if (!(c->rope_beta_fast > 0) || !(c->rope_beta_slow > 0))
		return x3_err(X3_EFORMAT, "config.json: rope_scaling yarn needs positive beta_fast and beta_slow");
	/* truncate (Transformers' default true): the ramp's ends floored and
	 * ceiled to whole dimensions; GPT-OSS's false keeps them fractional */
	c->rope_truncate = 1;
	if ((rc = x3_cfg_bool(rs, "truncate", &c->rope_truncate)))
		return rc;
	if (af > 0)
		c->rope_attn_factor = af;
	else if (ms != 0 && msa != 0)
		c->rope_attn_factor = yarn_mscale(c->rope_factor, ms) / yarn_mscale(c->rope_factor, msa);
	else
		c->rope_attn_factor = yarn_mscale(c->rope_factor, 1);
	if (c->mla && msa != 0) {
		double m = yarn_mscale(c->rope_factor, msa);
		c->attn_scale *= m * m;
	}
	return X3_OK;
}

/* one of longrope's per-frequency factor lists: positive numbers, at most
 * X3_ROPE_MAX_FACTORS (their count is checked against the rotated
 * dimensions once those are known) */
static int get_factors(json_t *rs, const char *key, double *f, int *n)
{
	json_t *a = json_object_get(rs, key);
	if (!a || !json_is_array(a))
		return x3_err(X3_EFORMAT, "config.json: rope_scaling longrope needs a '%s' array", key);
	size_t k = json_array_size(a);
	if (k < 1 || k > X3_ROPE_MAX_FACTORS)
		return x3_err(X3_EFORMAT, "config.json: rope_scaling '%s' has %zu factors (1..%d expected)",
		              key, k, X3_ROPE_MAX_FACTORS);
	for (size_t i = 0; i < k; i++) {
		json_t *v = json_array_get(a, i);
		if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
			return x3_err(X3_EFORMAT, "config.json: rope_scaling '%s'[%zu] is not a positive number",
			              key, i);
		f[i] = json_number_value(v);
	}
	*n = (int)k;
	return X3_OK;
}

/* rope_scaling longrope (su, its older name: Phi-3's 128k-context models),
 * as Hugging Face's _compute_longrope_parameters with its dynamic update:
 * inverse frequencies 1 / (ext_i * theta^(2i/rot_dim)), ext the
 * long_factor list for rows longer than original_max_position_embeddings
 * (top level, else in rope_scaling, else max_position_embeddings) and the
 * short_factor list otherwise; cos and sin times attention_factor, else
 * sqrt(1 + ln(s) / ln(orig)) with s = max_position_embeddings / orig
 * when orig is given (else rope_scaling's factor), 1 for s <= 1. */
static int parse_longrope(json_t *root, json_t *rs, const char *ty, x3_model_config *c)
{
	int rc, nl = 0, ns = 0;
	int64_t orig = 0;
	double s = 1, af = 0;
	c->rope_type = 4;
	if ((rc = get_factors(rs, "long_factor", c->rope_long, &nl)) ||
	    (rc = get_factors(rs, "short_factor", c->rope_short, &ns)))
		return rc;
	if (nl != ns)
		return x3_err(X3_EFORMAT, "config.json: rope_scaling %s has %d long_factor and %d short_factor "
		              "values", ty, nl, ns);
	c->rope_nfactors = nl;
	if ((rc = x3_cfg_int(root, "original_max_position_embeddings", 0, 1, &orig)) ||
	    (!orig && (rc = x3_cfg_int(rs, "original_max_position_embeddings", 0, 1, &orig))) ||
	    (rc = x3_cfg_num(rs, "attention_factor", &af)))
		return rc;
	if (orig)
		s = (double)c->max_pos / (double)orig;
	else if ((rc = x3_cfg_num(rs, "factor", &s)))
		return rc;
	c->rope_orig_max_pos = orig ? orig : c->max_pos;
	if (af < 0)
		return x3_err(X3_EFORMAT, "config.json: rope_scaling attention_factor %g is negative", af);
	if (af > 0)
		c->rope_attn_factor = af;
	else if (s <= 1 || c->rope_orig_max_pos < 2)
		c->rope_attn_factor = 1;
	else
		c->rope_attn_factor = sqrt(1 + log(s) / log((double)c->rope_orig_max_pos));
	return X3_OK;
}

int x3_config_rope(json_t *root, x3_model_config *c)
{
	json_t *rs = json_object_get(root, "rope_scaling");
	c->rope_type = 0;
	/* GPT-OSS: Transformers v5's rope_parameters carries the scaling (yarn
	 * by GptOssConfig's default) where there is no rope_scaling */
	if ((c->desc->flags & X3_AF_GPT_OSS) && (!rs || json_is_null(rs)))
		rs = json_object_get(root, "rope_parameters");
	if (!rs || json_is_null(rs))
		return X3_OK;
	if (!json_is_object(rs))
		return x3_err(X3_EFORMAT, "config.json: 'rope_scaling' is not an object");
	json_t *t = json_object_get(rs, "rope_type");
	if (!t)
		t = json_object_get(rs, "type");
	if (!t || !json_is_string(t))
		return x3_err(X3_EFORMAT, "config.json: rope_scaling has no 'rope_type'");
	const char *ty = json_string_value(t);
	if (!strcmp(ty, "default"))
		return X3_OK;
	if (!strcmp(ty, "longrope") || !strcmp(ty, "su"))
		return parse_longrope(root, rs, ty, c);
	int rc;
	c->rope_factor = 0;
	if ((rc = x3_cfg_num(rs, "factor", &c->rope_factor)))
		return rc;
	if (!(c->rope_factor > 0))
		return x3_err(X3_EFORMAT, "config.json: rope_scaling '%s' needs a positive 'factor'", ty);
	if (!strcmp(ty, "linear")) {
		c->rope_type = 1;
		return X3_OK;
	}
	if (!strcmp(ty, "yarn"))
		return parse_yarn(rs, c);
	if (strcmp(ty, "llama3"))
		return x3_err(X3_EUNSUP, "config.json: rope_scaling type '%s' is not supported "
		              "(default, linear, llama3, yarn, longrope are)", ty);
	c->rope_type = 2;
	c->rope_low_freq = 1, c->rope_high_freq = 4, c->rope_orig_max_pos = 8192;
	if ((rc = x3_cfg_num(rs, "low_freq_factor", &c->rope_low_freq)) ||
	    (rc = x3_cfg_num(rs, "high_freq_factor", &c->rope_high_freq)) ||
	    (rc = x3_cfg_int(rs, "original_max_position_embeddings", 0, 1, &c->rope_orig_max_pos)))
		return rc;
	if (!(c->rope_high_freq > c->rope_low_freq) || !(c->rope_low_freq > 0))
		return x3_err(X3_EFORMAT, "config.json: rope_scaling llama3 needs "
		              "0 < low_freq_factor < high_freq_factor");
	return X3_OK;
}
