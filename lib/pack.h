/* pack.h: the layout of an EXL3 model directory (spec §2): which linears
 * an architecture has and their shapes, the checks on one quantized
 * linear's tensors, model order, and the config.json /
 * quantization_config.json texts. Used by pack-write. */
#ifndef X3_PACK_H
#define X3_PACK_H

#include <stdint.h>
#include "x3.h"

/* Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) from the
 * fields of config.json. */
typedef struct {
	int layers;                  /* num_hidden_layers */
	int64_t hidden, inter;       /* hidden_size, intermediate_size */
	int64_t heads, kv_heads;     /* num_attention_heads, num_key_value_heads */
	int64_t head_dim;            /* head_dim, default hidden / heads */
	int64_t vocab;               /* vocab_size */
	int tied;                    /* tie_word_embeddings (default false) */
} x3_pack_arch;

typedef struct {
	char key[96];                /* module key, e.g. model.layers.0.mlp.up_proj */
	int64_t in, out;             /* HF weight (out, in) */
	int layer;                   /* -1 for the head */
} x3_pack_linear;

int64_t x3_pack_pad128(int64_t n);

/* Parse config.json text. Missing or non-positive required fields, or
 * shapes that do not fit, are X3_EFORMAT naming the field. */
int x3_pack_arch_parse(const char *config_text, x3_pack_arch *a);
/* Every linear in model order: per layer q, k, v, o, gate, up, down, then
 * "lm_head" (also listed when tied; the caller decides). malloc'd. */
int x3_pack_linears(const x3_pack_arch *a, x3_pack_linear **out, int *n);

/* Check the tensors of one EXL3 linear against the expected (in, out):
 * trellis I16 (k/16, n/16, 16K), suh F16 (k), svh F16 (n), at most one
 * of mcg/mul1 (I32 scalar with the locked multiplier), where k, n are
 * in, out padded to 128. Any pointer may be NULL (then reported missing
 * unless optional). bias is not checked here. Sets *K and *cb
 * (X3_CB_*). Messages name the tensor. */
int x3_pack_check_exl3(const char *key, int64_t in, int64_t out,
                       const x3_tensor *trellis, const x3_tensor *suh,
                       const x3_tensor *svh, const x3_tensor *mcg,
                       const x3_tensor *mul1, int *K, int *cb);

/* A bitalloc plan as pack-write reads it: {"tensors": {KEY: K, ...},
 * "head_bits": H, "bits": B, ...}. Every KEY must be one of lin[0..nlin)
 * and every K an integer 1..8; head_bits (optional) 1..8 or 16; bits
 * (optional) a number. Other members are ignored. */
typedef struct {
	int *K;          /* (nlin): the plan's K of lin[i], 0 where absent */
	int head_bits;   /* 0: absent */
	double bits;     /* NAN: absent */
} x3_pack_plan;
/* Parse text (label names it in messages); X3_EFORMAT names the member. */
int x3_pack_plan_parse(const char *text, const char *label, const x3_pack_linear *lin,
                       int nlin, x3_pack_plan *p);
void x3_pack_plan_free(x3_pack_plan *p);

/* Model order: embedding, layers in order, final norm, head, others.
 * *module: index of the top-level module (shards break only between
 * modules); *rank: order inside it. Compare (module, rank, name). */
void x3_pack_order(const char *name, long *module, long *rank);

/* The quantization_config block (spec §2.4). */
typedef struct {
	double bits;                 /* written as round(bits, 2) */
	int head_bits;               /* 1..8 or 16 */
	int cal_rows, cal_cols;
	const char *out_scales;      /* always | never | auto */
	const char *codebook;        /* mul1 | mcg | 3inst */
	const char *version;         /* format version written, e.g. "1.4.1" */
} x3_pack_qcfg;

/* config.json of the output: the source text plus quantization_config
 * (an existing exl3 block is kept with bits/head_bits/codebook updated; a
 * foreign one is nested as original_quantization_config;
 * tied_word_embeddings set true only where that key exists). */
int x3_pack_config_json(const char *src_text, const x3_pack_qcfg *q, char **out);
/* quantization_config.json: the block plus tensor_storage over the
 * tensors t[0..n) (headers; data not read), grouped by leaf module. */
int x3_pack_qconfig_json(const x3_pack_qcfg *q, x3_tensor *const *t, int n, char **out);
/* quantize_config.json for GPTQModel: the same block, and tensor_storage
 * over the EXL3 modules only (GPTQModel reads its quantization config from
 * quantize_config.json, else config.json, never quantization_config.json,
 * and turns every nn.Linear named in tensor_storage into an EXL3 module). */
int x3_pack_gptqmodel_json(const x3_pack_qcfg *q, x3_tensor *const *t, int n, char **out);

#endif
