/* config_vision.c: the vision tower's sizes (vision_config) of the
 * multimodal architectures whose tower's linears can be encoded (arch.h
 * x3_arch_desc.vis), and the choice of encoding them. */
#include <jansson.h>
#include "arch.h"
#include "config.h"
#include "config_impl.h"

int x3_config_vision_parse(json_t *root, x3_model_config *c)
{
	c->v_layers = c->v_hidden = c->v_inter = c->v_heads = c->v_merge = c->v_out = 0;
	c->vision_bits = 0;
	c->v_eps = 1e-6;
	json_t *v = json_object_get(root, "vision_config");
	if (!c->desc->nvis || !json_is_object(v))
		return X3_OK;
	/* Hugging Face's defaults for the keys a config leaves out
	 * (SiglipVisionConfig; Qwen3-VL's vision config, which Qwen3.5's
	 * follows): a tower whose sizes they get wrong fails the shape checks
	 * against the checkpoint when --vision-bits encodes it */
	int qwen = c->desc->flags & X3_AF_HYBRID;
	int64_t nl = qwen ? 27 : 12, h = qwen ? 1152 : 768, in = qwen ? 4304 : 3072, nh = qwen ? 16 : 12;
	int64_t out = 3584, merge = 2;
	double eps = 1e-6;
	/* a vision_config this reads wrong is no error of the model (its tower
	 * passed through): only x3_config_vision refuses it */
	if (x3_cfg_int(v, qwen ? "depth" : "num_hidden_layers", 0, 1, &nl) ||
	    x3_cfg_int(v, "hidden_size", 0, 1, &h) || x3_cfg_int(v, "intermediate_size", 0, 1, &in) ||
	    x3_cfg_int(v, qwen ? "num_heads" : "num_attention_heads", 0, 1, &nh) ||
	    x3_cfg_num(v, "layer_norm_eps", &eps) || x3_cfg_int(v, "out_hidden_size", 0, 1, &out) ||
	    x3_cfg_int(v, "spatial_merge_size", 0, 1, &merge) || h % nh)
		return X3_OK;
	c->v_layers = nl, c->v_hidden = h, c->v_inter = in, c->v_heads = nh, c->v_eps = eps;
	c->v_out = qwen ? out : 0;
	c->v_merge = qwen ? merge * merge * h : 0;
	/* a pack whose vision tower's linears are EXL3 says so */
	json_t *q = json_object_get(root, "quantization_config");
	json_t *vb = json_object_get(q, "vision_bits");
	if (c->quantized && json_is_integer(vb)) {
		json_int_t b = json_integer_value(vb);
		if (b < 1 || (b > 8 && b != 16))
			return x3_err(X3_EFORMAT, "config.json: quantization_config.vision_bits %lld is not "
			              "1..8 or 16", (long long)b);
		c->vision_bits = b == 16 ? 0 : (int)b;
	}
	return X3_OK;
}

int x3_config_vision(x3_model_config *c, int bits)
{
	if (bits == 16) {
		c->vision_bits = 0;
		return X3_OK;
	}
	if (bits < 1 || bits > 8)
		return x3_err(X3_EINVAL, "--vision-bits %d: not 1..8 or 16", bits);
	if (!c->desc || !c->desc->nvis)
		return x3_err(X3_EUNSUP, "--vision-bits %d: %s has no vision tower exl3kit encodes "
		              "(Gemma3ForConditionalGeneration, Qwen3_5(Moe)ForConditionalGeneration do)", bits,
		              c->desc ? c->desc->name : "the model");
	if (!c->v_layers)
		return x3_err(X3_EUNSUP, "--vision-bits %d: config.json has no vision_config (or one whose sizes "
		              "are not positive integers, hidden_size a multiple of the heads)", bits);
	c->vision_bits = bits;
	return X3_OK;
}
