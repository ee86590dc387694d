/* arch.h: the description of every architecture exl3kit knows, as data.
 *
 * One table per architecture (lib/arch/arch_tables.c) names every module of the
 * checkpoint by its key pattern ("model.layers.{L}.self_attn.q_proj",
 * {L} = the layer), and says of each:
 *   - its kind: a linear (quantized), a vector (a norm: passed through) or
 *     an embedding table (passed through);
 *   - its shape, as dimensions the config defines (X3_DIM_*);
 *   - for a linear, the Hessian group it reads: the linears that share
 *     one input (q/k/v read the same normed hidden state) share a group;
 *   - its role for the bit allocation and its --hq promotion in bits;
 *   - the config flag that gives it a bias, and when it is present at all
 *     (Qwen3's q/k norms);
 *   - the slot the forward pass (lib/model/) uses it as.
 * Instantiated with a parsed config.json (x3_arch_modules) it is the list
 * of every module of one model in model order: what the conversion
 * encodes (tensor-ls --linears), what pack-write expects, the groups
 * hessian-capture writes, and the layout model-eval reads. Programs and
 * pipelines ask this table; none of them knows module names.
 *
 * Mixture-of-experts layers (Mixtral, Qwen2-MoE, Qwen3-MoE) are rows too:
 * a key with {E} is one module per expert ({E} = 0..num_experts-1, the
 * rows of one expert consecutive in the table), each expert's linears
 * reading their own Hessian groups (the tokens routed to that expert); the
 * router is a matrix passed through unquantized, as ExLlamaV3 keeps it.
 * Rows present only in the dense or only in the sparse layers of a model
 * (decoder_sparse_step, mlp_only_layers) say so in their "when". Experts
 * that Transformers v5 fuses in 3-D tensors are rows of them
 * (x3_fused_expert); a module v5 renames as well (Mixtral's router,
 * block_sparse_moe.gate, is its mlp.gate) names its v5 key in the row
 * (fused_key): read from there, written under KEY.
 * Checkpoints that fuse linears (Phi3's self_attn.qkv_proj holds q, k and
 * v one below the other, mlp.gate_up_proj gate and up) are described by
 * the linears ExLlamaV3 loads and the EXL3 directory holds (q_proj,
 * k_proj, v_proj; gate_proj, up_proj), each a row slice of the fused
 * source tensor (x3_row_slice): every program reads the slice where it
 * would read KEY.weight, and the fused tensor itself is no module.
 * DeepSeek V3's latent attention is rows too (q_a_proj, q_a_layernorm,
 * q_b_proj or q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj,
 * o_proj) with the Hessian groups of their inputs; its multi-token
 * prediction layer (layer num_hidden_layers) is the MTP rows
 * (x3_arch_desc.mtp_pre) when the checkpoint holds it and the config
 * names it, else pack-write leaves it out with a note (x3_arch_skipped).
 * Gemma 2/3 are the Llama
 * rows plus pre/post feed-forward norms and the norm of the attention's
 * output (ATTN_OUT_NORM, MLP_OUT_NORM); Gemma3ForConditionalGeneration
 * the same rows under language_model.model. (its vision tower and
 * projector are no modules: pack-write passes them through). GLM-4 MoE
 * (Glm4MoeForCausalLM) is the Llama attention rows (q/k/v biases by
 * attention_bias, q/k norms by use_qk_norm) over DeepSeek V3's MLP rows
 * (dense layers, router and correction bias, routed and shared experts);
 * its multi-token prediction layer is DeepSeek's.
 * GLM-4.7-Flash (Glm4MoeLiteForCausalLM) is DeepSeek V3's rows under other
 * config rules: the dense layers by mlp_layer_types (X3_AF_MLP_TYPES),
 * GLM's defaults (one expert group, routed_scaling_factor 1.8).
 * GPT-OSS (GptOssForCausalLM) is the Llama attention rows with biases and
 * self_attn.sinks (a vector per layer, kept), mlp.router (kept, with its
 * bias a vector) and per-expert gate/up/down linears with biases, the
 * layout ExLlamaV3's gpt_oss.py loads (mlp.experts.E.*_proj).
 * The Qwen3-Next / Qwen3.5 hybrids (X3_AF_HYBRID) have two kinds of
 * layer, by layer_types or full_attention_interval (X3_WHEN_FULL_ATTN,
 * X3_WHEN_LINEAR_ATTN): gated attention, whose q_proj holds each head's
 * query and gate (X3_DIM_Q2), and the Gated DeltaNet (lib/model/gdn.h),
 * whose in_proj_qkvz (or in_proj_qkv and in_proj_z) and out_proj are
 * linears, in_proj_ba (or in_proj_b, in_proj_a) kept matrices, conv1d a
 * kept depthwise conv (X3_KIND_CONV), A_log and dt_bias bare vectors.
 * GLM-5 (GlmMoeDsaForCausalLM) and DeepSeek V3.2 (DeepseekV32ForCausalLM)
 * are DeepSeek V3's rows plus the indexer of their sparse attention
 * (X3_AF_DSA): self_attn.indexer.wq_b, a linear reading q_b_proj's input
 * (one Hessian group), and wk, k_norm (weight and bias) and weights_proj
 * kept in the source precision; GLM-5's "shared" layers have none. */
#ifndef X3_ARCH_H
#define X3_ARCH_H

#include <stdint.h>
#include "x3.h"

/* Roles of a module for the allocation and the reports. */
enum {
	X3_ROLE_ATTENTION, X3_ROLE_MLP, X3_ROLE_EXPERT, X3_ROLE_SHARED_EXPERT,
	X3_ROLE_ROUTER, X3_ROLE_HEAD, X3_ROLE_EMBEDDING, X3_ROLE_NORM, X3_ROLE_OTHER,
	X3_ROLE_MTP,            /* a linear of the multi-token prediction layer:
	                           encoded at --mtp-bits, outside the budget */
	X3_ROLE_VISION,         /* a linear of the vision tower: encoded at
	                           --vision-bits, outside the budget */
	X3_ROLE_COUNT
};
/* "attention", "mlp", "expert", "shared_expert", "router", "head",
 * "embedding", "norm", "other", "mtp", "vision" */
const char *x3_role_name(int role);

/* What a module is stored as. */
enum {
	X3_KIND_LINEAR,         /* weight (out, in): encoded to EXL3 */
	X3_KIND_VECTOR,         /* weight (out): a norm, passed through */
	X3_KIND_EMBEDDING,      /* weight (out = vocab, in = hidden), passed through */
	X3_KIND_MATRIX,         /* weight (out, in) passed through unquantized (a
	                           router, a shared-expert gate) */
	X3_KIND_CONV,           /* weight (out, 1, in): a depthwise conv1d of
	                           kernel in, passed through (the Gated
	                           DeltaNet's) */
};

/* Where a module sits: before the layers, in every layer, after them, in
 * the multi-token prediction layer (x3_arch_desc.mtp), in a block of the
 * vision tower ({L} its block) or after its blocks (x3_arch_desc.vis). */
enum { X3_SCOPE_PRE, X3_SCOPE_LAYER, X3_SCOPE_POST, X3_SCOPE_MTP, X3_SCOPE_VISION, X3_SCOPE_VISION_POST };

/* Dimensions the config defines (x3_arch_dim). */
enum {
	X3_DIM_NONE,
	X3_DIM_HIDDEN,          /* hidden_size */
	X3_DIM_INTER,           /* intermediate_size */
	X3_DIM_Q,               /* num_attention_heads * head_dim */
	X3_DIM_KV,              /* num_key_value_heads * head_dim */
	X3_DIM_HEAD_DIM,        /* head_dim (default hidden_size / heads) */
	X3_DIM_VOCAB,           /* vocab_size */
	X3_DIM_EXPERTS,         /* num_local_experts / num_experts */
	X3_DIM_MOE_INTER,       /* an expert's intermediate size (Mixtral:
	                           intermediate_size; Qwen: moe_intermediate_size) */
	X3_DIM_SHARED_INTER,    /* shared_expert_intermediate_size */
	X3_DIM_ONE,             /* 1 (the shared expert's scalar gate) */
	/* multi-head latent attention (DeepSeek V3) */
	X3_DIM_Q_LORA,          /* q_lora_rank */
	X3_DIM_KV_LORA,         /* kv_lora_rank */
	X3_DIM_KV_A,            /* kv_lora_rank + qk_rope_head_dim */
	X3_DIM_KV_B,            /* heads * (qk_nope_head_dim + v_head_dim) */
	X3_DIM_V_ALL,           /* heads * v_head_dim */
	X3_DIM_HEADS,           /* num_attention_heads (GPT-OSS's sinks) */
	/* the hybrids (Qwen3-Next, Qwen3.5): the gated attention's q_proj
	 * (query and gate per head), the Gated DeltaNet's widths (gdn.h) */
	X3_DIM_Q2,              /* 2 * heads * head_dim */
	X3_DIM_GDN_QKVZ,        /* 2 key_dim + 2 value_dim (in_proj_qkvz) */
	X3_DIM_GDN_CONV,        /* 2 key_dim + value_dim (in_proj_qkv, conv1d) */
	X3_DIM_GDN_V,           /* value_dim = value heads * their width */
	X3_DIM_GDN_NV,          /* value heads (in_proj_b, in_proj_a, A_log) */
	X3_DIM_GDN_BA,          /* 2 * value heads (in_proj_ba) */
	X3_DIM_GDN_DV,          /* a value head's width (the gated norm) */
	X3_DIM_GDN_KCONV,       /* linear_conv_kernel_dim */
	/* the sparse-attention indexer (GLM-5, DeepSeek V3.2) */
	X3_DIM_IDX_Q,           /* index_n_heads * index_head_dim */
	X3_DIM_IDX_HD,          /* index_head_dim */
	X3_DIM_IDX_HEADS,       /* index_n_heads */
	X3_DIM_HIDDEN2,         /* 2 * hidden_size (the MTP layer's fc / eh_proj) */
	/* the vision tower (vision_config) */
	X3_DIM_V_HIDDEN,        /* hidden_size */
	X3_DIM_V_INTER,         /* intermediate_size */
	X3_DIM_V_MERGE,         /* spatial_merge_size^2 * hidden_size (Qwen3.5's
	                           patch merger) */
	X3_DIM_V_OUT,           /* out_hidden_size (the merger's output) */
	X3_DIM_COUNT
};

/* The config flag that gives a module a bias. */
enum { X3_BIAS_NONE, X3_BIAS_QKV, X3_BIAS_O, X3_BIAS_MLP,
       X3_BIAS_ALWAYS /* always a bias (GPT-OSS's experts) */ };
/* When a module is present. */
enum {
	X3_WHEN_ALWAYS, X3_WHEN_QK_NORM,
	X3_WHEN_DENSE,          /* in the dense (not mixture-of-experts) layers */
	X3_WHEN_SPARSE,         /* in the mixture-of-experts layers */
	X3_WHEN_SHARED,         /* ... that have a shared expert */
	X3_WHEN_Q_LORA,         /* q_lora_rank is set (DeepSeek's q_a/q_b) */
	X3_WHEN_NO_Q_LORA,      /* ... is null (a plain q_proj) */
	X3_WHEN_FULL_ATTN,      /* a hybrid's full-attention layers */
	X3_WHEN_LINEAR_ATTN,    /* ... its Gated DeltaNet layers */
	X3_WHEN_INDEXER,        /* in the layers that run their own indexer
	                           (not GLM-5's "shared" indexer_types) */
};

/* What the forward pass uses a module as. */
enum {
	X3_SLOT_EMBED, X3_SLOT_IN_NORM, X3_SLOT_Q, X3_SLOT_K, X3_SLOT_V,
	X3_SLOT_Q_NORM, X3_SLOT_K_NORM, X3_SLOT_O, X3_SLOT_POST_NORM,
	X3_SLOT_GATE, X3_SLOT_UP, X3_SLOT_DOWN, X3_SLOT_FINAL_NORM, X3_SLOT_HEAD,
	X3_SLOT_ROUTER,                                   /* (experts, hidden) */
	X3_SLOT_EXP_GATE, X3_SLOT_EXP_UP, X3_SLOT_EXP_DOWN, /* per expert */
	X3_SLOT_SHX_GATE, X3_SLOT_SHX_UP, X3_SLOT_SHX_DOWN, /* the shared expert */
	X3_SLOT_SHX_SCALE,                                /* (1, hidden): its sigmoid gate */
	/* multi-head latent attention: q_a, its norm, q_b (or Q); kv_a, its
	 * norm (over the first kv_lora_rank columns), kv_b */
	X3_SLOT_Q_A, X3_SLOT_Q_A_NORM, X3_SLOT_Q_B, X3_SLOT_KV_A, X3_SLOT_KV_A_NORM, X3_SLOT_KV_B,
	X3_SLOT_ROUTER_BIAS,                              /* (experts): e_score_correction_bias */
	/* Gemma's norms of the attention's and the MLP's outputs (before the
	 * residual adds them); its pre_feedforward_layernorm is POST_NORM */
	X3_SLOT_ATTN_OUT_NORM, X3_SLOT_MLP_OUT_NORM,
	/* GPT-OSS: one learned sink logit per query head (heads), the
	 * router's bias added to its logits (experts) */
	X3_SLOT_SINKS, X3_SLOT_ROUTER_LOGIT_BIAS,
	/* the Gated DeltaNet (gdn.h): Qwen3-Next's fused in_proj_qkvz and
	 * in_proj_ba, or Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b,
	 * in_proj_a; conv1d, A_log, dt_bias, the gated norm, out_proj */
	X3_SLOT_GDN_QKVZ, X3_SLOT_GDN_BA, X3_SLOT_GDN_QKV, X3_SLOT_GDN_Z, X3_SLOT_GDN_B, X3_SLOT_GDN_A,
	X3_SLOT_GDN_CONV, X3_SLOT_GDN_ALOG, X3_SLOT_GDN_DT, X3_SLOT_GDN_NORM, X3_SLOT_GDN_OUT,
	/* the sparse-attention indexer: wq_b (its queries from the MLA query
	 * latent), wk (one key per token), k_norm's weight and bias (a
	 * LayerNorm), weights_proj (a weight per head) */
	X3_SLOT_IDX_QB, X3_SLOT_IDX_K, X3_SLOT_IDX_K_NORM, X3_SLOT_IDX_K_BIAS, X3_SLOT_IDX_W,
	/* the multi-token prediction layer's input: the norms of the next
	 * token's embedding and of the main model's hidden state, the
	 * projection of their concatenation (2 hidden -> hidden); its final
	 * norm is FINAL_NORM of its layer */
	X3_SLOT_MTP_ENORM, X3_SLOT_MTP_HNORM, X3_SLOT_MTP_FC,
	/* a linear of the vision tower (the text forward uses none): of its
	 * attention (ExLlamaV3 pads it to 128 as the pack does), of its MLP or
	 * patch merger (ExLlamaV3 loads them unpadded: pad_to 1) */
	X3_SLOT_VISION, X3_SLOT_VISION_UNPADDED,
	X3_SLOT_COUNT
};

/* A linear whose weight in the source checkpoint is rows [first, first +
 * out) of another tensor, SRC.weight (rows, in) (and its bias, rows of
 * SRC.bias). first and rows are sums of config dimensions (X3_DIM_*,
 * X3_DIM_NONE adds 0): Phi3's v_proj is rows Q + KV .. Q + 2 KV of
 * qkv_proj, which has Q + 2 KV rows. */
typedef struct x3_row_slice {
	const char *src;        /* pattern of the source module's key */
	unsigned char first[2]; /* X3_DIM_*: the first row is their sum */
	unsigned char rows[3];  /* X3_DIM_*: the source's rows are their sum */
} x3_row_slice;

/* An expert's linear where the checkpoint holds all experts of a layer in
 * one 3-D tensor SRC (experts, rows, in) instead of per-expert keys
 * (Transformers v5's mlp.experts.gate_up_proj (experts, 2 * moe_inter,
 * hidden) and mlp.experts.down_proj (experts, hidden, moe_inter)): part 1
 * is the first half of an expert's rows (gate_proj), 2 the second
 * (up_proj), 0 all of them (down_proj). Used only when the checkpoint has
 * them (x3_model_config.fused_experts, set by x3_arch_fused_scan). */
typedef struct x3_fused_expert {
	const char *src;        /* pattern of the fused tensor's name ({L}) */
	unsigned char part;     /* 0 all rows, 1 the first half, 2 the second */
} x3_fused_expert;

typedef struct x3_module_desc {
	const char *key;        /* pattern; {L}: the layer number */
	unsigned char scope;    /* X3_SCOPE_* */
	unsigned char kind;     /* X3_KIND_* */
	unsigned char slot;     /* X3_SLOT_* */
	unsigned char role;     /* X3_ROLE_* */
	unsigned char in, out;  /* X3_DIM_*; a vector has out only */
	unsigned char bias;     /* X3_BIAS_* */
	unsigned char when;     /* X3_WHEN_* */
	signed char hq;         /* --hq: floor at floor(bits) + hq (0: none) */
	signed char tied_to;    /* slot whose weight it reads when the config
	                           ties the embeddings (-1: none) */
	const char *group;      /* Hessian group pattern (linears) */
	const char *alloc;      /* allocation group suffix (ExLlamaV3's qkv,
	                           o, gu, d: linears promoted together) */
	int bare;               /* the tensor is KEY itself, not KEY.weight
	                           (DeepSeek's mlp.gate.e_score_correction_bias) */
	const x3_row_slice *slice; /* a linear read as rows of a fused source
	                              tensor (NULL: KEY.weight itself) */
	const x3_fused_expert *fused; /* an expert's linear a fused checkpoint
	                                 holds in a 3-D tensor (NULL: none) */
	const char *fused_key;  /* pattern of the module's key in a checkpoint
	                           with fused experts, where it has another name
	                           (Mixtral's router: Transformers v5 stores
	                           block_sparse_moe.gate as mlp.gate); it is read
	                           from there and written under KEY. NULL: KEY */
	unsigned char tie;      /* X3_TIE_*: the linears a reader loads as one
	                           unit, which must share one K and codebook */
} x3_module_desc;

/* Tied widths: linears that a reader fuses into one module at load and
 * so requires to share one K and one codebook (exl3(5) §8.3). A tied
 * group is one item of the bit allocation. */
enum {
	X3_TIE_NONE,
	X3_TIE_EXPERTS,         /* this row over every expert of its layer:
	                           ExLlamaV3 loads a layer's experts' gate, up
	                           and down projections as one MultiLinear each */
};

/* Config rules of an architecture (x3_arch_desc.flags). */
enum {
	X3_AF_ATTN_BIAS = 1,    /* attention_bias gives q/k/v/o a bias */
	X3_AF_MLP_BIAS = 2,     /* mlp_bias gives gate/up/down a bias */
	X3_AF_QKV_BIAS = 4,     /* q/k/v always have a bias */
	X3_AF_QK_NORM = 8,      /* per-head RMSNorm of q and k */
	X3_AF_SLIDING = 16,     /* sliding_window is the attention window */
	X3_AF_USE_SLIDING = 32, /* ... when use_sliding_window is true */
	X3_AF_MOE = 64,         /* mixture-of-experts layers (experts_key) */
	X3_AF_MOE_RENORM = 128, /* the top-k weights always sum to 1 (Mixtral);
	                           else norm_topk_prob says */
	X3_AF_MOE_STEP = 256,   /* decoder_sparse_step / mlp_only_layers make
	                           some layers dense (Qwen MoE) */
	X3_AF_MOE_OWN_INTER = 512, /* experts are moe_intermediate_size wide
	                              (else intermediate_size) */
	X3_AF_SHARED = 1024,    /* a shared expert (shared_expert_intermediate_size) */
	X3_AF_MLA = 2048,       /* multi-head latent attention (q_lora_rank,
	                           kv_lora_rank, nope/rope/v head dims) */
	X3_AF_GROUPED = 4096,   /* DeepSeek routing: sigmoid scores with
	                           e_score_correction_bias, n_group/topk_group,
	                           routed_scaling_factor, n_shared_experts shared
	                           experts, first_k_dense_replace dense layers */
	X3_AF_QKV_ATTN_BIAS = 1 << 13, /* attention_bias gives q/k/v a bias,
	                                  o_proj none (GLM-4 MoE) */
	X3_AF_USE_QK_NORM = 1 << 14,   /* per-head q/k RMSNorms when
	                                  use_qk_norm is true (GLM-4 MoE) */
	X3_AF_GEMMA = 1 << 16,  /* Gemma 2/3: (1 + w) norms, norms after the
	                           attention and the MLP, embedding scale,
	                           GELU (tanh), query_pre_attn_scalar,
	                           soft-capping, sliding/global layers
	                           (config.h's gemma fields) */
	X3_AF_GEMMA3 = 1 << 17, /* ... Gemma3's: q/k norms, layer_types or
	                           sliding_window_pattern, rope_local_base_freq */
	X3_AF_HYBRID = 1 << 19, /* Qwen3-Next / Qwen3.5: Gated DeltaNet and gated
	                           full-attention layers (layer_types or
	                           full_attention_interval, linear_* keys),
	                           (1 + w) norms, config.h's hybrid fields;
	                           the multi-token prediction layer mtp.*
	                           (x3_arch_desc.mtp_pre) */
	X3_AF_MLP_TYPES = 1 << 18, /* mlp_layer_types ("dense" / "sparse" per
	                              layer; absent: layer 0 dense) decides the
	                              dense layers, first_k_dense_replace is not
	                              read (GLM-4.7-Flash) */
	X3_AF_GPT_OSS = 1u << 24, /* GPT-OSS: attention sinks, sliding and full
	                             layers by layer_types, router bias with a
	                             softmax over the top k logits, experts with
	                             biases and the clamped SwiGLU (swiglu_limit) */
	X3_AF_DSA = 1 << 26,    /* DeepSeek sparse attention: MLA whose keys an
	                           indexer selects (index_topk, index_n_heads,
	                           index_head_dim; GLM-5's indexer_types) */
};

typedef struct x3_arch_desc {
	int id;                 /* X3_ARCH_* (config.h) */
	const char *name;       /* "architectures" entry, e.g. LlamaForCausalLM */
	const char *model_type; /* "model_type", e.g. llama */
	const char *family;     /* short name for messages, e.g. Llama */
	unsigned flags;         /* X3_AF_* */
	const char *layer_prefix;  /* pattern of a layer's keys: model.layers.{L} */
	const x3_module_desc *mods;
	int nmods;
	const char *experts_key;   /* config key of the expert count (X3_AF_MOE) */
	const char *defaults;      /* JSON object: Hugging Face's config defaults
	                              for the keys its real configs leave out
	                              (Gemma3's text_config), or NULL */
	unsigned readers;          /* the readers that load it: X3_RD(X3_READER_*)
	                              (reader.h) */
	/* The multi-token prediction (MTP) layer, present when the config
	 * names one (x3_model_config.n_mtp) and the checkpoint holds it: the
	 * rows of mtp_pre (the norms of the next token's embedding and of the
	 * main model's last hidden state, the projection of their
	 * concatenation), then one decoder layer, the rows of the layers as
	 * an MTP layer has them (x3_arch_mtp_rows: full attention, the MLP of
	 * the sparse layers when the model has experts), then mtp_post (its
	 * final norm). Their keys: the layer rows' under mtp_prefix in place
	 * of layer_prefix, {L} = 0 (Qwen3.5's mtp.layers.0), or, mtp_prefix
	 * NULL, the layer rows' own with {L} = num_hidden_layers (DeepSeek V3's
	 * model.layers.61). Scope X3_SCOPE_MTP, layer n_layers + 1; every
	 * linear of it role X3_ROLE_MTP, without a Hessian group (encoded
	 * without calibration, as ExLlamaV3 encodes them). */
	const char *mtp_prefix;
	const x3_module_desc *mtp_pre, *mtp_post;
	int nmtp_pre, nmtp_post;
	const char *mtp_fc_key;    /* the pattern of the projection's key: the
	                              checkpoint holds the layer when it holds
	                              this module's weight */
	/* The vision tower's linears, modules only when the conversion
	 * encodes them (x3_model_config.vision_bits, --vision-bits 1..8;
	 * else pack-write passes the tower through): the rows of vis, scope
	 * X3_SCOPE_VISION once per block of the tower ({L} = 0..blocks-1),
	 * X3_SCOPE_VISION_POST once after them, every linear role
	 * X3_ROLE_VISION without a Hessian group (encoded without
	 * calibration, as ExLlamaV3 encodes its vision model). Their layer:
	 * n_layers + 2. What ExLlamaV3 leaves unquantized (patch embedding,
	 * position embedding, norms, Gemma3's projector) is no row. */
	const x3_module_desc *vis;
	int nvis;
} x3_arch_desc;

int x3_arch_count(void);
const x3_arch_desc *x3_arch_get(int i);
/* By "architectures" entry, else (name NULL) by model_type; NULL if unknown. */
const x3_arch_desc *x3_arch_lookup(const char *name, const char *model_type);
/* "Llama, Mistral, Qwen2, Qwen3" (static) */
const char *x3_arch_families(void);

/* One module of a model: a table row with the config applied. */
#define X3_KEY_MAX 128
typedef struct x3_module {
	const x3_module_desc *d;
	char key[X3_KEY_MAX];        /* model.layers.3.self_attn.q_proj */
	char weight[X3_KEY_MAX + 8]; /* the tensor holding its weight: KEY.weight,
	                                the embedding's for a tied head, the
	                                fused source's for a row slice */
	char src[X3_KEY_MAX];        /* the module whose tensors hold it: KEY, or
	                                the fused source (a row slice) */
	int sliced;                  /* weight rows [row0, row0 + out) of the
	                                src_rows rows of WEIGHT (a row slice) */
	int fused;                   /* ... WEIGHT is a 3-D (experts, rows, in)
	                                tensor, its rows those of its (experts *
	                                rows, in) view (x3_fused_expert) */
	int64_t row0, src_rows;      /* 0 and out unless sliced */
	char group[X3_KEY_MAX + 16]; /* Hessian group ("" unless a linear) */
	char tie[X3_KEY_MAX + 16];   /* its tied group (x3_arch_tie_key), ""
	                                when its width is its own */
	int layer;                   /* 0..n_layers-1; -1 before the layers,
	                                n_layers after them (the head) */
	int expert;                  /* its expert ({E}), or -1 */
	int64_t in, out;             /* weight (out, in); a vector: (out), in 0 */
	int bias;                    /* KEY.bias (out) exists */
	int tied;                    /* weight is another module's */
} x3_module;

struct x3_model_config;
/* Value of a dimension in a config. */
int64_t x3_arch_dim(const struct x3_model_config *c, int dim);
/* Every module of the model in model order (before the layers, layer by
 * layer, after them). malloc'd; the caller frees *out. */
int x3_arch_modules(const struct x3_model_config *c, x3_module **out, int *n);
/* The module with this key, or NULL. */
const x3_module *x3_modules_find(const x3_module *m, int n, const char *key);
/* The module that holds the tensor NAME (KEY.<anything>), or NULL. */
const x3_module *x3_modules_owner(const x3_module *m, int n, const char *name);
/* The first row-slice module that reads tensor NAME of the source (its
 * src's .weight or .bias), or NULL: the fused tensors are consumed by the
 * linears sliced from them, never passed through. */
const x3_module *x3_modules_slice_of(const x3_module *m, int n, const char *name);
/* The module the source checkpoint holds under another name than its key
 * (x3_module_desc.fused_key) whose tensors (SRC.<part>) include NAME, or
 * NULL. */
const x3_module *x3_modules_renamed(const x3_module *m, int n, const char *name);
/* The output's name of the source tensor NAME (KEY.<part> for a renamed
 * module's SRC.<part>, else NAME), and the reverse, into buf. */
void x3_modules_out_name(const x3_module *m, int n, const char *name, char *buf, size_t len);
void x3_modules_src_name(const x3_module *m, int n, const char *name, char *buf, size_t len);
/* The comma list of the weights ("KEY.weight") that read Hessian group
 * GROUP, in model order, into buf. */
int x3_modules_members(const x3_module *m, int n, const char *group, char *buf, size_t len);
/* An index of a module list (modix.c) for the callers that look up every
 * tensor of a model: x3_modix_X answers as x3_modules_X does, in O(log n)
 * instead of a scan. The list must outlive the index, unchanged. */
typedef struct x3_modix x3_modix;
int x3_modix_build(const x3_module *m, int n, x3_modix **out);
void x3_modix_free(x3_modix *ix);
const x3_module *x3_modix_find(const x3_modix *ix, const char *key);
const x3_module *x3_modix_owner(const x3_modix *ix, const char *name);
const x3_module *x3_modix_slice_of(const x3_modix *ix, const char *name);
void x3_modix_out_name(const x3_modix *ix, const char *name, char *buf, size_t len);
void x3_modix_src_name(const x3_modix *ix, const char *name, char *buf, size_t len);

struct x3_st;
/* Set c->fused_experts when the checkpoint ST holds the experts of its
 * mixture-of-experts layers in fused 3-D tensors (x3_fused_expert) rather
 * than per-expert keys, after checking every sparse layer's fused tensors
 * against the config: present, float, (experts, 2 * moe_inter, hidden)
 * and (experts, hidden, moe_inter). X3_EFORMAT naming the tensor if not.
 * A checkpoint without them (per-expert keys, an EXL3 directory) leaves
 * fused_experts 0. A module that the fused layout names otherwise
 * (fused_key) must be under the name of the layout found: X3_EFORMAT
 * naming the missing tensor if the checkpoint has it under the other, and
 * naming both if it has it under both. x3_config_load calls it on the model directory. */
int x3_arch_fused_scan(struct x3_model_config *c, const struct x3_st *st);

/* Set c->n_mtp to 1 when the checkpoint ST holds the multi-token
 * prediction layer the config names (c->mtp_cfg > 0): the weight of its
 * projection (x3_arch_desc.mtp_fc_key), or its EXL3 trellis. A config
 * naming more than one such layer whose checkpoint holds them: X3_EUNSUP.
 * x3_config_load calls it on the model directory. */
int x3_arch_mtp_scan(struct x3_model_config *c, const struct x3_st *st);

/* Does NAME match PATTERN ({L}: a decimal layer number, set in *layer;
 * {E}: an expert number, not returned)? */
int x3_arch_match(const char *pattern, const char *name, int *layer);
/* Is layer l of the model a mixture-of-experts layer? (l = n_layers + 1,
 * the multi-token prediction layer: when the model has experts) */
int x3_arch_sparse_layer(const struct x3_model_config *c, int l);
/* Is layer l of a hybrid (config.h hybrid) a Gated DeltaNet layer? */
int x3_arch_linear_layer(const struct x3_model_config *c, int l);
/* Is layer l one without an indexer of its own, which attends to the keys
 * the indexer of the last layer before it picked (GLM-5's "shared")? */
int x3_arch_idx_shared(const struct x3_model_config *c, int l);
/* The rows of the MTP layer of A derived from its layer rows (keys under
 * mtp_prefix, linears role X3_ROLE_MTP without a Hessian group, scope
 * X3_SCOPE_MTP), in the order of the layer rows; NULL with *n 0 for an
 * architecture without one. Built once, shared, never freed. */
const x3_module_desc *x3_arch_mtp_rows(const x3_arch_desc *a, int *n);
/* Is tensor NAME under the multi-token prediction layer of the checkpoint:
 * a layer at or past num_hidden_layers (DeepSeek V3's, model.layers.61.*
 * in the real checkpoints), or the hybrids' mtp.*? pack-write leaves out
 * those that are no module of the model (the whole layer when the model
 * has none; else the copies of the embedding and the head DeepSeek's
 * layer carries). */
int x3_arch_skipped(const struct x3_model_config *c, const char *name);

/* The tied group of row d in layer: its key with the expert number as
 * '*' ("model.layers.3.mlp.experts.*.gate_proj"), or "" for a row not
 * tied (X3_TIE_NONE). */
int x3_arch_tie_key(const x3_module_desc *d, int layer, char *buf, size_t n);

/* The table row of a linear key without a model: the first architecture
 * whose linear pattern matches KEY (bitalloc's measurements carry only the
 * key). *layer: its layer or -1. NULL when no table knows the key. */
const x3_module_desc *x3_arch_classify(const char *key, int *layer);

/* ExLlamaV3's allocation priority of a linear (its modules' q_priority,
 * exl3(5) §11.2): attention 2, the Gated DeltaNet, the dense MLP and the
 * shared experts 1, the routed experts and the rest 0, each plus the row's
 * --hq promotion (ExLlamaV3's select_hq_bits). */
int x3_module_priority(const x3_module_desc *d);

/* Model order of a tensor name (pack-write's output): *module: embedding
 * 0, layer l 1 + l, then the modules after the layers, then anything
 * else; *rank: order inside the module (the table's order of its
 * modules, then the stored part: trellis, suh, svh, su, sv, mcg, mul1,
 * weight, bias). Compare (module, rank, name). */
void x3_arch_order(const struct x3_model_config *c, const char *name, long *module, long *rank);

#endif
