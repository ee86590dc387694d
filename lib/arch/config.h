/* config.h: a model's config.json as the toolkit reads it (lib/arch/config.c,
 * the one parser): the architecture, the sizes, and the options of the
 * forward pass (model.h). The modules these describe are arch.h's. */
#ifndef X3_CONFIG_H
#define X3_CONFIG_H

#include "x3.h"

enum { X3_ARCH_LLAMA, X3_ARCH_MISTRAL, X3_ARCH_QWEN2, X3_ARCH_QWEN3, X3_ARCH_MIXTRAL,
       X3_ARCH_QWEN2_MOE, X3_ARCH_QWEN3_MOE, X3_ARCH_DEEPSEEK_V3,
       X3_ARCH_GEMMA2, X3_ARCH_GEMMA3, X3_ARCH_GEMMA3_MM, X3_ARCH_PHI3, X3_ARCH_GLM4_MOE,
       X3_ARCH_GLM4_MOE_LITE,
       X3_ARCH_GPT_OSS,
       X3_ARCH_QWEN3_NEXT, X3_ARCH_QWEN3_5, X3_ARCH_QWEN3_5_MM, X3_ARCH_QWEN3_5_MOE,
       X3_ARCH_QWEN3_5_MOE_MM,
       X3_ARCH_GLM_MOE_DSA, X3_ARCH_DEEPSEEK_V32 };

/* the most frequencies of a longrope factor list (rot_dim / 2) */
#define X3_ROPE_MAX_FACTORS 512

struct x3_arch_desc;
typedef struct x3_model_config {
	char arch_name[64];     /* "LlamaForCausalLM", ... */
	int arch;               /* X3_ARCH_* */
	const struct x3_arch_desc *desc;  /* its modules (arch.h) */
	int64_t hidden, intermediate, n_layers, n_heads, n_kv_heads, head_dim;
	int64_t vocab, max_pos;
	double rope_theta, rms_eps;
	/* rope_scaling: 0 none/default, 1 linear, 2 llama3, 3 yarn, 4 longrope */
	int rope_type;
	double rope_factor, rope_low_freq, rope_high_freq;
	int64_t rope_orig_max_pos;
	int64_t rot_dim;         /* the dimensions of a head RoPE rotates (the
	                            first ones): head_dim * partial_rotary_factor */
	int64_t sliding_window;  /* 0: none; else attention window (refused
	                            when a row is longer) */
	int tied;                /* lm_head shares model.embed_tokens.weight */
	int qkv_bias, o_bias, mlp_bias, qk_norm;
	int64_t bos_id, eos_id;  /* -1 when absent */
	/* mixture of experts (0 experts: a dense model) */
	int64_t n_experts;       /* num_local_experts / num_experts */
	int64_t n_experts_tok;   /* num_experts_per_tok: the top k */
	int64_t moe_inter;       /* an expert's intermediate size */
	int64_t shared_inter;    /* shared_expert_intermediate_size (0: none) */
	int norm_topk;           /* the top-k routing weights renormalized to 1 */
	int fused_experts;       /* the checkpoint holds the experts in fused
	                            3-D tensors (arch.h's x3_fused_expert) */
	int64_t sparse_step;     /* decoder_sparse_step: layer l is sparse when
	                            (l + 1) % sparse_step == 0 ... */
	uint64_t mlp_only[16];   /* ... and it is not in mlp_only_layers (bits) */
	/* DeepSeek V3: multi-head latent attention (mla; head_dim is
	 * qk_nope + qk_rope, one key/value head per query head) ... */
	int mla;
	int64_t q_lora, kv_lora;     /* q_lora_rank (0: null, a plain q_proj), kv_lora_rank */
	int64_t qk_nope, qk_rope, v_dim;   /* qk_nope_head_dim, qk_rope_head_dim, v_head_dim */
	int rope_interleave;         /* RoPE on pairs (2i, 2i+1) (rope_interleave,
	                                the default) instead of the halves */
	double attn_scale;           /* softmax scale: qk_head_dim^-0.5 with the yarn
	                                mscale_all_dim correction; Gemma's
	                                query_pre_attn_scalar^-0.5 (0: 1/sqrt(head_dim)) */
	/* ... yarn rope_scaling (rope_type 3): beta_fast/slow, the cos/sin factor */
	double rope_beta_fast, rope_beta_slow, rope_attn_factor;
	/* ... longrope (rope_type 4, Phi-3 128k): ext factors per frequency,
	 * long_factor for rows longer than rope_orig_max_pos, else
	 * short_factor; cos/sin times rope_attn_factor, as yarn's */
	double rope_long[X3_ROPE_MAX_FACTORS], rope_short[X3_ROPE_MAX_FACTORS];
	int rope_nfactors;
	/* ... and its routing: sigmoid scores, e_score_correction_bias for the
	 * choice only, the top topk_group of n_group groups (by the sum of
	 * each group's best two), weights times routed_scaling_factor;
	 * n_shared_experts shared experts (shared_inter = n_shared *
	 * moe_inter); layers below first_k_dense_replace dense (GLM-4.7-Flash:
	 * those mlp_layer_types says are "dense", in mlp_only) */
	int sigmoid_route;
	int64_t n_group, topk_group, n_shared, first_dense;
	double routed_scale;
	/* Gemma 2/3 (gemma): (1 + w) RMSNorms, the embedding times
	 * sqrt(hidden_size) (rounded to the embedding's dtype), the GELU (tanh)
	 * MLP; softmax scale query_pre_attn_scalar^-0.5 (attn_scale); scores
	 * soft-capped cap * tanh(s / cap) (attn_softcap, 0: none) and the
	 * logits alike (final_softcap); the layers of swa_layers (bit l) attend
	 * to the last sliding_window keys only (the forward masks them, where
	 * other families refuse longer rows), with RoPE base rope_local_theta
	 * and no rope_scaling when that is set (Gemma3's local layers) */
	int gemma;
	int act_gelu_tanh;       /* hidden_activation gelu_pytorch_tanh (else SiLU) */
	double attn_softcap, final_softcap, rope_local_theta;
	uint64_t swa_layers[16];
	int swa_masked;          /* the window is masked per layer (swa_layers) */
	/* GPT-OSS (gpt_oss): one sink logit per head in every softmax, the
	 * router's bias on its logits and the softmax over the top k of them
	 * (topk_softmax), experts' SwiGLU clamped at swiglu_limit (gate at
	 * most the limit, up within +-limit, (up + 1) * gate * sigmoid(alpha
	 * gate), swiglu_alpha 1.702 by default); yarn's ramp ends truncated to whole dimensions unless
	 * rope_scaling says truncate false (rope_truncate 0) */
	int sinks, topk_softmax, rope_truncate;
	double swiglu_limit, swiglu_alpha;
	/* Qwen3-Next / Qwen3.5 hybrids (hybrid): the layers of lin_layers
	 * (bit l) are Gated DeltaNet linear attention (gdn.h: lin_nk key and
	 * lin_nv value heads of lin_dk and lin_dv, conv kernel lin_kconv), the
	 * others gated full attention (q_proj's rows per head [query | gate],
	 * the output times sigmoid(gate)); every RMSNorm but the DeltaNet's
	 * gated one scales by 1 + w (norm_offset) */
	int hybrid, norm_offset;
	int64_t lin_nk, lin_nv, lin_dk, lin_dv, lin_kconv;
	int64_t full_interval;   /* full_attention_interval (default 4), read
	                            beside layer_types (ExLlamaV3's Qwen3-Next
	                            follows it alone) */
	uint64_t lin_layers[16];
	/* DeepSeek sparse attention (dsa: GLM-5, DeepSeek V3.2): an indexer of
	 * index_heads heads of index_hd (its first qk_rope dimensions rotated:
	 * on interleaved pairs with idx_interleave, GLM-5's, else as halves,
	 * DeepSeek V3.2's) picks each query's index_topk keys; the layers whose
	 * bit is set in idx_shared have no indexer and attend to the keys the
	 * last layer before them with one picked (GLM-5's "shared") */
	int dsa, idx_interleave;
	int64_t index_topk, index_heads, index_hd;
	uint64_t idx_shared[16];
	int quantized;           /* config has an exl3 quantization_config */
	int foreign_quant;       /* ... one of another quant_method */
	/* the multi-token prediction layers: mtp_cfg as the config names them
	 * (mtp_num_hidden_layers, num_nextn_predict_layers), n_mtp those the
	 * model has: 1 when the checkpoint holds the layer (x3_config_load_as
	 * looks; x3_config_parse alone leaves 0), its modules then part of the
	 * model (arch.h x3_arch_desc.mtp_pre) */
	int64_t mtp_cfg;
	int n_mtp;
	/* the vision tower (vision_config of the multimodal architectures,
	 * arch.h x3_arch_desc.vis): v_layers blocks (num_hidden_layers, Qwen3.5
	 * depth) of v_hidden, MLP v_inter, v_heads heads; Qwen3.5's merger
	 * from v_merge (spatial_merge_size^2 * v_hidden) to v_out
	 * (out_hidden_size). vision_bits: its linears' width when they are
	 * modules (1..8: a pack's quantization_config.vision_bits, or
	 * x3_config_vision for a conversion's --vision-bits), 0 when the
	 * tower is passed through */
	int64_t v_layers, v_hidden, v_inter, v_heads, v_merge, v_out;
	double v_eps;            /* its LayerNorms' epsilon (layer_norm_eps,
	                            default 1e-6) */
	int vision_bits;
} x3_model_config;

/* Make the vision tower's linears modules at BITS (1..8), or not (16).
 * X3_EUNSUP naming the architecture when it has no vision rows or the
 * config no vision_config. */
int x3_config_vision(x3_model_config *c, int bits);

/* Parse config.json text (lib/arch/config.c, the toolkit's one parser). The
 * fields of the language model are read from "text_config" when the root
 * has no num_hidden_layers (multimodal wrappers); the architecture from
 * "architectures", else "model_type". Unsupported architectures and
 * options give X3_EUNSUP naming them, malformed JSON or missing keys
 * X3_EFORMAT. X3_CONFIG_LAYOUT reads only what the description of the
 * modules needs (architecture, sizes, tied head, biases; arch.h) and
 * leaves the forward's fields (RoPE, activation, window, token ids) zero
 * and unchecked; X3_CONFIG_FORWARD (x3_config_parse) reads everything. */
enum { X3_CONFIG_FORWARD, X3_CONFIG_LAYOUT };
int x3_config_parse_as(const char *json, size_t len, unsigned what, x3_model_config *cfg);
int x3_config_parse(const char *json, size_t len, x3_model_config *cfg);
/* The text of DIR/config.json (malloc'd, NUL-terminated; *len may be NULL). */
int x3_config_text(const char *dir, char **text, size_t *len);
/* Read DIR/config.json. */
int x3_config_load_as(const char *dir, unsigned what, x3_model_config *cfg);
int x3_config_load(const char *dir, x3_model_config *cfg);
/* Tokens per forward chunk by default (hessian-capture --chunk, convert's
 * memory estimate): 4096, fewer where a chunk's activations, about 4 (4
 * hidden + 3 intermediate, and a hybrid's DeltaNet and gated q_proj
 * widths) bytes a token, would pass 256 MiB (the forward runs whole rows,
 * at least one). */
int64_t x3_config_chunk_tokens(const x3_model_config *c);

#endif
