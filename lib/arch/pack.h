/* pack.h: the layout of an EXL3 model directory (exl3(5) §2): the checks on
 * one quantized linear's tensors, which tensors the directory holds
 * (classification and completeness against the model's description,
 * arch.h), model order, and the config.json / quantization_config.json
 * texts. Used by pack-write. */
#ifndef X3_PACK_H
#define X3_PACK_H

#include <stdint.h>
#include "x3.h"
#include "arch.h"
#include "codec.h"
#include "config.h"
#include "safetensors.h"

int64_t x3_pack_pad128(int64_t n);

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

/* Model order of a tensor name: x3_arch_order (arch.h). */
void x3_pack_order(const x3_model_config *c, const char *name, long *module, long *rank);

/* A bitalloc plan as pack-write reads it: {"tensors": {KEY: K, ...},
 * "head_bits": H, "bits": B, ...}. Every KEY must be a linear of mods[0..nmods)
 * and every K an integer 1..8; head_bits (optional) 1..8 or 16; bits
 * (optional) a number. Other members are ignored. */
typedef struct {
	int *K;          /* (nmods): the plan's K of mods[i], 0 where absent */
	int head_bits;   /* 0: absent */
	double bits;     /* NAN: absent */
	char *measurement; /* the plan's "measurement" object as compact JSON
	                      (how the widths were measured), NULL: absent */
} x3_pack_plan;
/* Parse text (label names it in messages); X3_EFORMAT names the member. */
int x3_pack_plan_parse(const char *text, const char *label, const x3_module *mods,
                       int nmods, x3_pack_plan *p);
void x3_pack_plan_free(x3_pack_plan *p);

/* ---- classification and the completeness check ----------------------
 * Which tensors the output directory holds and where each one's bytes
 * come from, from the description of the source model's modules (arch.h),
 * the tensors of the stream and the source model:
 *   - a linear's EXL3 tensors from the stream (trellis, suh, svh, at most
 *     one of mcg/mul1, checked against its shape and the plan), or, for the
 *     head only, an unquantized F16 .weight (from the stream, a tied
 *     model's embedding, or SRC with head_bits 16 and passthrough);
 *   - its bias from the stream or SRC (present in SRC: required);
 *   - every other tensor of the stream under its own name (it must be in
 *     SRC with the same shape), and with passthrough every tensor of SRC
 *     that is not a linear's and not in the stream.
 * Every problem found is collected (messages name the tensor). */
typedef struct {
	x3_tensor *t;                /* output header (name, dtype, shape); owned */
	const x3_tensor *src;        /* SRC tensor (pass-through), or NULL */
	int in;                      /* index of the stream tensor, or -1 */
} x3_pack_ent;

typedef struct {
	const x3_model_config *cfg;  /* the source's config (its description) */
	const x3_module *mods;       /* x3_arch_modules of cfg */
	int nmods;
	x3_tensor *const *in;        /* the stream's headers; the payload of
	                                scalars (markers) in ->data */
	int nin;
	x3_st *src;                  /* the source model */
	const char *src_name;        /* its name in messages */
	int passthrough;
	int head_bits;               /* 0 (from the stream), 1..8 or 16 */
	const x3_pack_plan *plan;    /* every K must match it (may be NULL) */
} x3_pack_in;

typedef struct {
	x3_pack_ent *ent;
	int nent, cap;
	char **prob;                 /* the first 200 problems */
	int nprob;                   /* all of them */
	double sum_k, sum_n;         /* sum numel * K, sum numel (decoder linears) */
	int cb_count[X3_CB_COUNT];   /* quantized decoder linears per X3_CB_* */
	int head_bits;               /* of the head stored; 0: none */
	int mtp_bits;                /* of the MTP layer's linears (all one K,
	                                outside sum_k/sum_n); 0: none */
	int vision_bits;             /* of the vision tower's linears (all one
	                                K, outside sum_k/sum_n); 0: none */
	int skipped;                 /* SRC tensors left out: those of a
	                                multi-token prediction layer that are
	                                no module (x3_arch_skipped) */
	/* linears quantized without error feedback (their trellis frame says
	 * fallback=1), with the reason (the frame's, or the stream's payload
	 * lifetime: why points into its metadata) */
	int nfallback;
	char **fallback_key;
	const char **fallback_why;
} x3_pack_layout;

/* X3_OK with the problems in out->prob; other codes (out of memory) are
 * fatal. Free with x3_pack_layout_free. */
int x3_pack_classify(const x3_pack_in *in, x3_pack_layout *out);
void x3_pack_layout_free(x3_pack_layout *l);

/* The fallback reason of a linear encoded without a Hessian (trellis-encode
 * without one: the multi-token prediction layer's linears always), as
 * quantization_config.json's "fallback" gives it. */
#define X3_FALLBACK_NO_HESSIAN "no hessian"

/* The quantization_config block (exl3(5) §2.5). */
typedef struct {
	double bits;                 /* written as round(bits, 2) */
	int head_bits;               /* 1..8 or 16 */
	int mtp_bits;                /* the MTP layer's linears' K; 0: written
	                                only when the pack has an MTP layer */
	int vision_bits;             /* the vision tower's linears' K; 0: not
	                                written (the tower passed through) */
	int cal_rows, cal_cols;
	const char *out_scales;      /* always | never | auto */
	const char *codebook;        /* mul1 | mcg | 3inst */
	const char *version;         /* format version written, e.g. "1.4.1" */
	/* linears quantized without error feedback (no usable Hessian), with
	 * the reason of each: quantization_config.json "fallback" */
	int nfallback;
	const char *const *fallback_key, *const *fallback_why;
	/* how the plan's widths were measured (a JSON object's text, from the
	 * plan): quantization_config.json "measurement"; NULL: none */
	const char *measurement;
} x3_pack_qcfg;

/* config.json of the output: the source text plus quantization_config
 * (an existing exl3 block is kept with bits/head_bits/codebook updated; a
 * foreign one is nested as original_quantization_config;
 * tied_word_embeddings set true only where that key exists). */
int x3_pack_config_json(const char *src_text, const x3_pack_qcfg *q, char **out);
/* quantization_config.json: the block plus tensor_storage over the
 * tensors t[0..n) (headers; data not read), grouped by leaf module, and
 * "fallback" (key -> reason) when q has any. */
int x3_pack_qconfig_json(const x3_pack_qcfg *q, x3_tensor *const *t, int n, char **out);
/* quantize_config.json for GPTQModel: the same block, and tensor_storage
 * over the EXL3 modules only (GPTQModel reads its quantization config from
 * quantize_config.json, else config.json, never quantization_config.json,
 * and turns every nn.Linear named in tensor_storage into an EXL3 module). */
int x3_pack_gptqmodel_json(const x3_pack_qcfg *q, x3_tensor *const *t, int n, char **out);

/* The role (arch.h X3_ROLE_*) of a tensor or linear of any pack: the
 * model description's when a table knows the key (x3_arch_classify), else
 * from the usual names of other architectures: attention (self_attn, attn,
 * attention, linear_attn), dense MLP (mlp, feed_forward, ffn), routed
 * experts (an "experts" component: mlp.experts.N., block_sparse_moe.
 * experts.N.w1), shared experts (shared_expert(s), shared_mlp), head
 * (lm_head), embedding (embed_tokens, wte, ...), norm, router (mlp.gate,
 * block_sparse_moe.gate), other. *layer (may be NULL): N of the first
 * "layers.N." ("h.N.", "blocks.N."), else -1. Names: x3_role_name. */
int x3_pack_role(const char *name, int *layer);
/* ... of linear KEY of a model whose modules are mods[0..n) (may be NULL):
 * x3_pack_role's, but X3_ROLE_MTP for a linear of its multi-token
 * prediction layer. */
int x3_pack_role_of(const x3_module *mods, int n, const char *key, int *layer);

/* Does pack-write copy the file NAME of the source directory into the
 * pack? 0 with *why NULL: a file it writes itself (weights, config.json,
 * the index); 0 with a reason: one it leaves out and warns about. */
int x3_pack_copies(const char *name, const char **why);
/* Model order of pack-write's tensors: by (module, rank) of x3_pack_order,
 * then name. */
int x3_pack_cmp(long m1, long r1, const char *n1, long m2, long r2, const char *n2);

/* ---- the size of a pack before any encode -----------------------------
 * The bytes pack-write would write for a conversion of SRC with K[j] the
 * bit width of module j (a linear; the head gets head_bits): the stream's
 * headers of every quantized linear at its K as trellis-encode writes them
 * (trellis, suh, svh, the codebook's marker), classified as pack-write
 * classifies them (with --passthrough: the embedding, norms, biases, a
 * 16-bit head, at their stored dtypes), the shards and index sized by the
 * safetensors writer's own code (x3_stw_size), config.json,
 * quantization_config.json and quantize_config.json as pack-write makes
 * them, and the files it copies from SRC. Exact except for what only the
 * encodes know: the "fallback" reasons of linears whose Hessian was
 * unusable (quantization_config.json). */
#define X3_PACK_SHARD_MB 8192   /* pack-write's default --shard-size */
typedef struct {
	int head_bits;               /* 1..8 or 16 */
	int mtp_bits;                /* the MTP layer's linears: 1..8 (0: 4) */
	int vision_bits;             /* the vision tower's linears: 1..8, or 0
	                                or 16 (passed through) */
	const char *codebook;        /* mul1 (NULL), mcg, 3inst */
	int cal_rows, cal_cols;      /* as pack-write's --cal-rows/--cal-cols */
	const char *out_scales;      /* NULL: always */
	uint64_t shard_bytes;        /* pack-write's --shard-size in bytes */
	const char *measurement;     /* the plan's "measurement" (JSON object
	                                text) quantization_config.json gets; NULL */
} x3_pack_size_opts;
typedef struct x3_pack_sizer x3_pack_sizer;

typedef struct {
	uint64_t total;              /* every file of the pack */
	uint64_t safetensors_bytes;  /* shards (headers included) and index */
	uint64_t tensor_bytes;       /* payloads alone */
	uint64_t json_bytes;         /* the three JSON files written */
	uint64_t copied_bytes;       /* files copied from SRC */
	int ntensors, nshards, ncopied;
	double bits;                 /* the config's bits: numel-weighted K */
} x3_pack_size_info;

/* Open SRC (config.json, its description, the safetensors headers). */
int x3_pack_sizer_open(const char *src, const x3_pack_size_opts *o, x3_pack_sizer **out);
void x3_pack_sizer_close(x3_pack_sizer *s);
/* The modules of SRC's description (K[] is indexed like them). */
const x3_module *x3_pack_sizer_modules(const x3_pack_sizer *s, int *n);
int x3_pack_size(const x3_pack_sizer *s, const int *K, x3_pack_size_info *out);
/* Trellis bytes of a linear per bit of K: pad128(in) * pad128(out) / 8. */
int64_t x3_pack_trellis_bytes_per_bit(const x3_module *m);

#endif
