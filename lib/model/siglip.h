/* siglip.h: the forward of Gemma3's SigLIP vision encoder in plain double
 * loops (the reference the quantized tower is measured against; no BLAS,
 * no thread), as Hugging Face's SiglipEncoderLayer and
 * SiglipVisionTransformer compute it after the patch embedding: per layer
 *   x += out_proj(attention(layer_norm1(x)))   (q/k/v/out_proj with biases,
 *                                               heads of hidden/heads, no
 *                                               mask, scale 1/sqrt(hd))
 *   x += fc2(gelu_tanh(fc1(layer_norm2(x))))   (biases)
 * then post_layernorm. The linears are read from the source checkpoint
 * (KEY.weight) or, where a pack is given and holds KEY.trellis, decoded
 * from it (x3_exl3_dequant); norms and biases always from the source. */
#ifndef X3_SIGLIP_H
#define X3_SIGLIP_H

#include <stdint.h>
#include "config.h"
#include "safetensors.h"

typedef struct x3_siglip x3_siglip;

/* The encoder of the model whose config is C (Gemma3ForConditionalGeneration
 * with a vision_config) from SRC, its linears from PACK where it holds them
 * (PACK NULL: all from SRC). *decoded: how many linears came from PACK.
 * X3_OK, or an error naming the tensor. */
int x3_siglip_load(const x3_model_config *c, const x3_st *src, const x3_st *pack, x3_siglip **out,
                   int *decoded);
void x3_siglip_free(x3_siglip *s);
int64_t x3_siglip_hidden(const x3_siglip *s);

/* y = the encoder's output (post_layernorm) for the tokens x (ntok,
 * hidden); y may be x. X3_OK or X3_ENOMEM. */
int x3_siglip_forward(const x3_siglip *s, int64_t ntok, const double *x, double *y);

#endif
