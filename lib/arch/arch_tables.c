/* arch_tables.c: the architecture tables: the rows of the modules of each
 * family and the list of the families, in the fields of x3_module_desc and
 * x3_arch_desc (arch.h). The engine that reads them is arch.c. */
#include "arch.h"
#include "arch_impl.h"
#include "reader.h"

#define L_(s) "model.layers.{L}." s
#define LIN(key, slot, role, in, out, bias, hq, group, alloc) \
	{ L_(key), X3_SCOPE_LAYER, X3_KIND_LINEAR, slot, role, in, out, bias, X3_WHEN_ALWAYS, hq, -1, \
	  L_(group), alloc, 0, NULL, NULL, NULL, X3_TIE_NONE }
#define NORM(scope, key, slot, dim, when) \
	{ key, scope, X3_KIND_VECTOR, slot, X3_ROLE_NORM, X3_DIM_NONE, dim, X3_BIAS_NONE, when, 0, -1, \
	  NULL, NULL, 0, NULL, NULL, NULL, X3_TIE_NONE }

/* The Llama decoder, shared by Llama 2/3, Mistral, Qwen2/2.5 and Qwen3
 * (they differ in config rules: biases, q/k norms, sliding window). Model
 * order: the order of the rows. No --hq promotion: ExLlamaV3 promotes only
 * in its mixture-of-experts families (attention +2 there: ATTN_ROWS). */
static const x3_module_desc llama_mods[] = {
	{ "model.embed_tokens", X3_SCOPE_PRE, X3_KIND_EMBEDDING, X3_SLOT_EMBED, X3_ROLE_EMBEDDING,
	  X3_DIM_HIDDEN, X3_DIM_VOCAB, X3_BIAS_NONE, X3_WHEN_ALWAYS, 0, -1, NULL, NULL, 0, NULL, NULL, NULL, X3_TIE_NONE },
	NORM(X3_SCOPE_LAYER, L_("input_layernorm"), X3_SLOT_IN_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS),
	LIN("self_attn.q_proj", X3_SLOT_Q, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_Q, X3_BIAS_QKV, 0,
	    "self_attn.input", "qkv"),
	LIN("self_attn.k_proj", X3_SLOT_K, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_KV, X3_BIAS_QKV, 0,
	    "self_attn.input", "qkv"),
	LIN("self_attn.v_proj", X3_SLOT_V, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_KV, X3_BIAS_QKV, 0,
	    "self_attn.input", "qkv"),
	NORM(X3_SCOPE_LAYER, L_("self_attn.q_norm"), X3_SLOT_Q_NORM, X3_DIM_HEAD_DIM, X3_WHEN_QK_NORM),
	NORM(X3_SCOPE_LAYER, L_("self_attn.k_norm"), X3_SLOT_K_NORM, X3_DIM_HEAD_DIM, X3_WHEN_QK_NORM),
	LIN("self_attn.o_proj", X3_SLOT_O, X3_ROLE_ATTENTION, X3_DIM_Q, X3_DIM_HIDDEN, X3_BIAS_O, 0,
	    "self_attn.o_proj.input", "o"),
	NORM(X3_SCOPE_LAYER, L_("post_attention_layernorm"), X3_SLOT_POST_NORM, X3_DIM_HIDDEN,
	     X3_WHEN_ALWAYS),
	LIN("mlp.gate_proj", X3_SLOT_GATE, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, X3_BIAS_MLP, 0,
	    "mlp.input", "gu"),
	LIN("mlp.up_proj", X3_SLOT_UP, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, X3_BIAS_MLP, 0,
	    "mlp.input", "gu"),
	LIN("mlp.down_proj", X3_SLOT_DOWN, X3_ROLE_MLP, X3_DIM_INTER, X3_DIM_HIDDEN, X3_BIAS_MLP, 0,
	    "mlp.down_proj.input", "d"),
	NORM(X3_SCOPE_POST, "model.norm", X3_SLOT_FINAL_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS),
	{ "lm_head", X3_SCOPE_POST, X3_KIND_LINEAR, X3_SLOT_HEAD, X3_ROLE_HEAD,
	  X3_DIM_HIDDEN, X3_DIM_VOCAB, X3_BIAS_NONE, X3_WHEN_ALWAYS, 0, X3_SLOT_EMBED, "lm_head.input", NULL, 0, NULL, NULL, NULL, X3_TIE_NONE },
};
#define N_(a) (int)(sizeof a / sizeof *a)

/* Rows of a module present only in some layers (WHEN) */
#define LINW(key, slot, role, in, out, bias, hq, group, alloc, when) \
	{ L_(key), X3_SCOPE_LAYER, X3_KIND_LINEAR, slot, role, in, out, bias, when, hq, -1, \
	  L_(group), alloc, 0, NULL, NULL, NULL, X3_TIE_NONE }
/* an expert's linear that a fused checkpoint holds in a 3-D tensor */
#define LINE(key, slot, role, in, out, hq, group, alloc, fused) \
	{ L_(key), X3_SCOPE_LAYER, X3_KIND_LINEAR, slot, role, in, out, X3_BIAS_NONE, X3_WHEN_SPARSE, hq, -1, \
	  L_(group), alloc, 0, NULL, &fused, NULL, X3_TIE_EXPERTS }
/* Transformers v5 (its "MoE kernels" checkpoint conversion) and the
 * checkpoints it writes hold a layer's experts as two 3-D tensors:
 * mlp.experts.gate_up_proj (experts, 2 * moe_inter, hidden), each expert's
 * gate_proj rows then its up_proj rows (torch.cat of the two on dim 1),
 * and mlp.experts.down_proj (experts, hidden, moe_inter): (out, in) per
 * expert, as nn.functional.linear reads them (x3_fused_expert). */
static const x3_fused_expert fx_gate = { L_("mlp.experts.gate_up_proj"), 1 };
static const x3_fused_expert fx_up = { L_("mlp.experts.gate_up_proj"), 2 };
static const x3_fused_expert fx_down = { L_("mlp.experts.down_proj"), 0 };
#define MAT(key, slot, role, in, out, when) \
	{ L_(key), X3_SCOPE_LAYER, X3_KIND_MATRIX, slot, role, in, out, X3_BIAS_NONE, when, 0, -1, \
	  NULL, NULL, 0, NULL, NULL, NULL, X3_TIE_NONE }
/* ... named FKEY in a checkpoint with fused experts (x3_module_desc.fused_key) */
#define MATF(key, slot, role, in, out, when, fkey) \
	{ L_(key), X3_SCOPE_LAYER, X3_KIND_MATRIX, slot, role, in, out, X3_BIAS_NONE, when, 0, -1, \
	  NULL, NULL, 0, NULL, NULL, L_(fkey), X3_TIE_NONE }
/* The attention block and the norms around it, shared by the decoders. */
#define ATTN_ROWS \
	{ "model.embed_tokens", X3_SCOPE_PRE, X3_KIND_EMBEDDING, X3_SLOT_EMBED, X3_ROLE_EMBEDDING, \
	  X3_DIM_HIDDEN, X3_DIM_VOCAB, X3_BIAS_NONE, X3_WHEN_ALWAYS, 0, -1, NULL, NULL, 0, NULL, NULL, NULL, X3_TIE_NONE }, \
	NORM(X3_SCOPE_LAYER, L_("input_layernorm"), X3_SLOT_IN_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS), \
	LIN("self_attn.q_proj", X3_SLOT_Q, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_Q, X3_BIAS_QKV, 2, \
	    "self_attn.input", "qkv"), \
	LIN("self_attn.k_proj", X3_SLOT_K, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_KV, X3_BIAS_QKV, 2, \
	    "self_attn.input", "qkv"), \
	LIN("self_attn.v_proj", X3_SLOT_V, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_KV, X3_BIAS_QKV, 2, \
	    "self_attn.input", "qkv"), \
	NORM(X3_SCOPE_LAYER, L_("self_attn.q_norm"), X3_SLOT_Q_NORM, X3_DIM_HEAD_DIM, X3_WHEN_QK_NORM), \
	NORM(X3_SCOPE_LAYER, L_("self_attn.k_norm"), X3_SLOT_K_NORM, X3_DIM_HEAD_DIM, X3_WHEN_QK_NORM), \
	LIN("self_attn.o_proj", X3_SLOT_O, X3_ROLE_ATTENTION, X3_DIM_Q, X3_DIM_HIDDEN, X3_BIAS_O, 2, \
	    "self_attn.o_proj.input", "o"), \
	NORM(X3_SCOPE_LAYER, L_("post_attention_layernorm"), X3_SLOT_POST_NORM, X3_DIM_HIDDEN, \
	     X3_WHEN_ALWAYS)
#define POST_ROWS \
	NORM(X3_SCOPE_POST, "model.norm", X3_SLOT_FINAL_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS), \
	{ "lm_head", X3_SCOPE_POST, X3_KIND_LINEAR, X3_SLOT_HEAD, X3_ROLE_HEAD, \
	  X3_DIM_HIDDEN, X3_DIM_VOCAB, X3_BIAS_NONE, X3_WHEN_ALWAYS, 0, X3_SLOT_EMBED, "lm_head.input", NULL, 0, NULL, NULL, NULL, X3_TIE_NONE }

/* Mixtral: every layer a block_sparse_moe of num_local_experts experts
 * (w1 gate, w3 up, w2 down), softmax top-k routing renormalized; the
 * router block_sparse_moe.gate is kept unquantized. Transformers v5 names
 * the block mlp and fuses the experts (fx_gate, fx_up, fx_down: w1, w3,
 * w2); the output keeps the block_sparse_moe keys ExLlamaV3 loads. */
static const x3_module_desc mixtral_mods[] = {
	ATTN_ROWS,
	MATF("block_sparse_moe.gate", X3_SLOT_ROUTER, X3_ROLE_ROUTER, X3_DIM_HIDDEN, X3_DIM_EXPERTS,
	     X3_WHEN_SPARSE, "mlp.gate"),
	LINE("block_sparse_moe.experts.{E}.w1", X3_SLOT_EXP_GATE, X3_ROLE_EXPERT, X3_DIM_HIDDEN,
	     X3_DIM_MOE_INTER, 0, "block_sparse_moe.experts.{E}.input", "gu", fx_gate),
	LINE("block_sparse_moe.experts.{E}.w3", X3_SLOT_EXP_UP, X3_ROLE_EXPERT, X3_DIM_HIDDEN,
	     X3_DIM_MOE_INTER, 0, "block_sparse_moe.experts.{E}.input", "gu", fx_up),
	LINE("block_sparse_moe.experts.{E}.w2", X3_SLOT_EXP_DOWN, X3_ROLE_EXPERT, X3_DIM_MOE_INTER,
	     X3_DIM_HIDDEN, 0, "block_sparse_moe.experts.{E}.w2.input", "d", fx_down),
	POST_ROWS,
};

/* Qwen2-MoE / Qwen3-MoE: mlp.gate the router (unquantized), experts
 * mlp.experts.E.{gate,up,down}_proj of moe_intermediate_size; Qwen2-MoE
 * adds mlp.shared_expert (all tokens) scaled by sigmoid(shared_expert_gate
 * · x). Layers in mlp_only_layers or off decoder_sparse_step are dense.
 * --hq as ExLlamaV3's qwen3_moe (attention +2) and, for Qwen2-MoE's shared
 * expert, as its other Qwen families' (qwen3_next, qwen3_5: +2). */
static const x3_module_desc qwen_moe_mods[] = {
	ATTN_ROWS,
	LINW("mlp.gate_proj", X3_SLOT_GATE, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, X3_BIAS_NONE, 0,
	     "mlp.input", "gu", X3_WHEN_DENSE),
	LINW("mlp.up_proj", X3_SLOT_UP, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, X3_BIAS_NONE, 0,
	     "mlp.input", "gu", X3_WHEN_DENSE),
	LINW("mlp.down_proj", X3_SLOT_DOWN, X3_ROLE_MLP, X3_DIM_INTER, X3_DIM_HIDDEN, X3_BIAS_NONE, 0,
	     "mlp.down_proj.input", "d", X3_WHEN_DENSE),
	MAT("mlp.gate", X3_SLOT_ROUTER, X3_ROLE_ROUTER, X3_DIM_HIDDEN, X3_DIM_EXPERTS, X3_WHEN_SPARSE),
	LINE("mlp.experts.{E}.gate_proj", X3_SLOT_EXP_GATE, X3_ROLE_EXPERT, X3_DIM_HIDDEN, X3_DIM_MOE_INTER,
	     0, "mlp.experts.{E}.input", "gu", fx_gate),
	LINE("mlp.experts.{E}.up_proj", X3_SLOT_EXP_UP, X3_ROLE_EXPERT, X3_DIM_HIDDEN, X3_DIM_MOE_INTER,
	     0, "mlp.experts.{E}.input", "gu", fx_up),
	LINE("mlp.experts.{E}.down_proj", X3_SLOT_EXP_DOWN, X3_ROLE_EXPERT, X3_DIM_MOE_INTER, X3_DIM_HIDDEN,
	     0, "mlp.experts.{E}.down_proj.input", "d", fx_down),
	LINW("mlp.shared_expert.gate_proj", X3_SLOT_SHX_GATE, X3_ROLE_SHARED_EXPERT, X3_DIM_HIDDEN,
	     X3_DIM_SHARED_INTER, X3_BIAS_NONE, 2, "mlp.shared_expert.input", "gu", X3_WHEN_SHARED),
	LINW("mlp.shared_expert.up_proj", X3_SLOT_SHX_UP, X3_ROLE_SHARED_EXPERT, X3_DIM_HIDDEN,
	     X3_DIM_SHARED_INTER, X3_BIAS_NONE, 2, "mlp.shared_expert.input", "gu", X3_WHEN_SHARED),
	LINW("mlp.shared_expert.down_proj", X3_SLOT_SHX_DOWN, X3_ROLE_SHARED_EXPERT, X3_DIM_SHARED_INTER,
	     X3_DIM_HIDDEN, X3_BIAS_NONE, 2, "mlp.shared_expert.down_proj.input", "d", X3_WHEN_SHARED),
	MAT("mlp.shared_expert_gate", X3_SLOT_SHX_SCALE, X3_ROLE_ROUTER, X3_DIM_HIDDEN, X3_DIM_ONE,
	    X3_WHEN_SHARED),
	POST_ROWS,
};

/* DeepSeek V3 (and the models of its architecture: Kimi K2, ...):
 * multi-head latent attention, the first first_k_dense_replace layers a
 * dense MLP, the others n_routed_experts experts of moe_intermediate_size
 * plus mlp.shared_experts (n_shared_experts of them, one MLP
 * moe_intermediate_size * n_shared_experts wide). q_a_proj and
 * kv_a_proj_with_mqa read the normed hidden state (one Hessian); q_b_proj
 * reads q_a_layernorm's output. kv_b_proj (applied to kv_a_layernorm's
 * output, the first kv_lora_rank columns of kv_a) is kept in the source
 * precision: ExLlamaV3 reads it as a plain tensor and splits it into the
 * absorbed k and v parts at load (modules/mla_attn.py). The router mlp.gate
 * and its e_score_correction_bias are kept unquantized. attention_bias gives
 * q_a, kv_a and o a bias (X3_BIAS_O). --hq as ExLlamaV3's deepseek_v3:
 * attention +2, dense MLP +1, shared experts +2. */
#define VECW(key, slot, role, dim, when, bare) \
	{ L_(key), X3_SCOPE_LAYER, X3_KIND_VECTOR, slot, role, X3_DIM_NONE, dim, X3_BIAS_NONE, when, 0, -1, \
	  NULL, NULL, bare, NULL, NULL, NULL, X3_TIE_NONE }
/* DeepSeek V3's MLP rows, shared by GLM-4 MoE: the first
 * first_k_dense_replace layers a dense mlp.*_proj (--hq +1), the others the
 * router mlp.gate and its e_score_correction_bias (unquantized), the
 * routed experts and mlp.shared_experts (--hq +2). */
#define DSV3_MLP_ROWS \
	LINW("mlp.gate_proj", X3_SLOT_GATE, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, X3_BIAS_NONE, 1, \
	     "mlp.input", "gu", X3_WHEN_DENSE), \
	LINW("mlp.up_proj", X3_SLOT_UP, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, X3_BIAS_NONE, 1, \
	     "mlp.input", "gu", X3_WHEN_DENSE), \
	LINW("mlp.down_proj", X3_SLOT_DOWN, X3_ROLE_MLP, X3_DIM_INTER, X3_DIM_HIDDEN, X3_BIAS_NONE, 1, \
	     "mlp.down_proj.input", "d", X3_WHEN_DENSE), \
	MAT("mlp.gate", X3_SLOT_ROUTER, X3_ROLE_ROUTER, X3_DIM_HIDDEN, X3_DIM_EXPERTS, X3_WHEN_SPARSE), \
	VECW("mlp.gate.e_score_correction_bias", X3_SLOT_ROUTER_BIAS, X3_ROLE_ROUTER, X3_DIM_EXPERTS, \
	     X3_WHEN_SPARSE, 1), \
	LINE("mlp.experts.{E}.gate_proj", X3_SLOT_EXP_GATE, X3_ROLE_EXPERT, X3_DIM_HIDDEN, X3_DIM_MOE_INTER, \
	     0, "mlp.experts.{E}.input", "gu", fx_gate), \
	LINE("mlp.experts.{E}.up_proj", X3_SLOT_EXP_UP, X3_ROLE_EXPERT, X3_DIM_HIDDEN, X3_DIM_MOE_INTER, \
	     0, "mlp.experts.{E}.input", "gu", fx_up), \
	LINE("mlp.experts.{E}.down_proj", X3_SLOT_EXP_DOWN, X3_ROLE_EXPERT, X3_DIM_MOE_INTER, X3_DIM_HIDDEN, \
	     0, "mlp.experts.{E}.down_proj.input", "d", fx_down), \
	LINW("mlp.shared_experts.gate_proj", X3_SLOT_SHX_GATE, X3_ROLE_SHARED_EXPERT, X3_DIM_HIDDEN, \
	     X3_DIM_SHARED_INTER, X3_BIAS_NONE, 2, "mlp.shared_experts.input", "gu", X3_WHEN_SHARED), \
	LINW("mlp.shared_experts.up_proj", X3_SLOT_SHX_UP, X3_ROLE_SHARED_EXPERT, X3_DIM_HIDDEN, \
	     X3_DIM_SHARED_INTER, X3_BIAS_NONE, 2, "mlp.shared_experts.input", "gu", X3_WHEN_SHARED), \
	LINW("mlp.shared_experts.down_proj", X3_SLOT_SHX_DOWN, X3_ROLE_SHARED_EXPERT, X3_DIM_SHARED_INTER, \
	     X3_DIM_HIDDEN, X3_BIAS_NONE, 2, "mlp.shared_experts.down_proj.input", "d", X3_WHEN_SHARED)
/* DeepSeek V3's latent attention in two parts, the query rows (with the
 * embedding and the layer's input norm before them) and the key/value rows
 * (with the attention's output and the MLP's norm), between which the
 * sparse-attention families put their indexer (dsa_mods) */
#define DSV3_Q_ROWS \
	{ "model.embed_tokens", X3_SCOPE_PRE, X3_KIND_EMBEDDING, X3_SLOT_EMBED, X3_ROLE_EMBEDDING, \
	  X3_DIM_HIDDEN, X3_DIM_VOCAB, X3_BIAS_NONE, X3_WHEN_ALWAYS, 0, -1, NULL, NULL, 0, NULL, NULL, NULL, X3_TIE_NONE }, \
	NORM(X3_SCOPE_LAYER, L_("input_layernorm"), X3_SLOT_IN_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS), \
	LINW("self_attn.q_proj", X3_SLOT_Q, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_Q, X3_BIAS_NONE, 2, \
	     "self_attn.input", "qkv", X3_WHEN_NO_Q_LORA), \
	LINW("self_attn.q_a_proj", X3_SLOT_Q_A, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_Q_LORA, X3_BIAS_O, 2, \
	     "self_attn.input", "qkv", X3_WHEN_Q_LORA), \
	VECW("self_attn.q_a_layernorm", X3_SLOT_Q_A_NORM, X3_ROLE_NORM, X3_DIM_Q_LORA, X3_WHEN_Q_LORA, 0), \
	LINW("self_attn.q_b_proj", X3_SLOT_Q_B, X3_ROLE_ATTENTION, X3_DIM_Q_LORA, X3_DIM_Q, X3_BIAS_NONE, 2, \
	     "self_attn.q_b_proj.input", "qb", X3_WHEN_Q_LORA)
#define DSV3_KV_ROWS \
	LIN("self_attn.kv_a_proj_with_mqa", X3_SLOT_KV_A, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_KV_A, \
	    X3_BIAS_O, 2, "self_attn.input", "qkv"), \
	VECW("self_attn.kv_a_layernorm", X3_SLOT_KV_A_NORM, X3_ROLE_NORM, X3_DIM_KV_LORA, X3_WHEN_ALWAYS, 0), \
	MAT("self_attn.kv_b_proj", X3_SLOT_KV_B, X3_ROLE_ATTENTION, X3_DIM_KV_LORA, X3_DIM_KV_B, X3_WHEN_ALWAYS), \
	LIN("self_attn.o_proj", X3_SLOT_O, X3_ROLE_ATTENTION, X3_DIM_V_ALL, X3_DIM_HIDDEN, X3_BIAS_O, 2, \
	    "self_attn.o_proj.input", "o"), \
	NORM(X3_SCOPE_LAYER, L_("post_attention_layernorm"), X3_SLOT_POST_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS)
static const x3_module_desc deepseek_v3_mods[] = {
	DSV3_Q_ROWS,
	DSV3_KV_ROWS,
	DSV3_MLP_ROWS,
	POST_ROWS,
};

/* GLM-4 MoE (Glm4MoeForCausalLM: GLM-4.5, 4.5-Air, 4.6): the Llama
 * attention (q/k/v biases by attention_bias, o_proj never; q/k norms by
 * use_qk_norm; RoPE on the first half of each head by
 * partial_rotary_factor, rotate-half) over DeepSeek V3's MLP rows and
 * routing. --hq as ExLlamaV3's glm4_moe: attention +2, dense MLP +1,
 * shared experts +2. */
static const x3_module_desc glm4_moe_mods[] = {
	ATTN_ROWS,
	DSV3_MLP_ROWS,
	POST_ROWS,
};
/* Hugging Face's Glm4MoeConfig defaults */
static const char glm4_moe_defaults[] =
	"{\"partial_rotary_factor\": 0.5, \"n_routed_experts\": 128, \"num_experts_per_tok\": 8, "
	"\"moe_intermediate_size\": 1408, \"n_shared_experts\": 1, \"routed_scaling_factor\": 1.0, "
	"\"n_group\": 1, \"topk_group\": 1, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true, "
	"\"use_qk_norm\": false, \"attention_bias\": false, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0}";

/* GLM-4.7-Flash (Glm4MoeLiteForCausalLM) is DeepSeek V3's rows: the same
 * latent attention (kv_b_proj kept as a plain matrix, the layout
 * ExLlamaV3's mla_attn.py reads) and the same MLP rows, routing and --hq.
 * Its config differs: mlp_layer_types says which layers are dense
 * (X3_AF_MLP_TYPES), and Hugging Face's Glm4MoeLiteConfig defaults below
 * (q_lora_rank 768 when the key is absent, one expert group). */
static const char glm4_moe_lite_defaults[] =
	"{\"n_routed_experts\": 64, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 1536, "
	"\"n_shared_experts\": 1, \"routed_scaling_factor\": 1.8, \"n_group\": 1, \"topk_group\": 1, "
	"\"norm_topk_prob\": true, \"q_lora_rank\": 768, \"rope_interleave\": true, "
	"\"attention_bias\": false, \"rms_norm_eps\": 1e-5}";

/* Gemma 2 / Gemma 3 under the key prefix P ("model." or, for
 * Gemma3ForConditionalGeneration, "language_model.model."), head key HEAD.
 * The Llama rows plus Gemma's norms: post_attention_layernorm on the
 * attention's output (ATTN_OUT_NORM), pre_feedforward_layernorm before
 * the MLP (POST_NORM: the MLP's Hessian group reads its output),
 * post_feedforward_layernorm on the MLP's output (MLP_OUT_NORM); q/k
 * norms in Gemma3 (X3_AF_QK_NORM). Every norm is passed through
 * unquantized, as ExLlamaV3's gemma2/gemma3 keep them. */
#define GL_(P, s) P "layers.{L}." s
#define GLIN(P, key, slot, role, in, out, bias, hq, group, alloc) \
	{ GL_(P, key), X3_SCOPE_LAYER, X3_KIND_LINEAR, slot, role, in, out, bias, X3_WHEN_ALWAYS, hq, -1, \
	  GL_(P, group), alloc, 0, NULL, NULL, NULL, X3_TIE_NONE }
#define GEMMA_ROWS(P, HEAD) \
	{ P "embed_tokens", X3_SCOPE_PRE, X3_KIND_EMBEDDING, X3_SLOT_EMBED, X3_ROLE_EMBEDDING, \
	  X3_DIM_HIDDEN, X3_DIM_VOCAB, X3_BIAS_NONE, X3_WHEN_ALWAYS, 0, -1, NULL, NULL, 0, NULL, NULL, NULL, X3_TIE_NONE }, \
	NORM(X3_SCOPE_LAYER, GL_(P, "input_layernorm"), X3_SLOT_IN_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS), \
	GLIN(P, "self_attn.q_proj", X3_SLOT_Q, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_Q, X3_BIAS_QKV, 0, \
	     "self_attn.input", "qkv"), \
	GLIN(P, "self_attn.k_proj", X3_SLOT_K, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_KV, X3_BIAS_QKV, 0, \
	     "self_attn.input", "qkv"), \
	GLIN(P, "self_attn.v_proj", X3_SLOT_V, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_KV, X3_BIAS_QKV, 0, \
	     "self_attn.input", "qkv"), \
	NORM(X3_SCOPE_LAYER, GL_(P, "self_attn.q_norm"), X3_SLOT_Q_NORM, X3_DIM_HEAD_DIM, X3_WHEN_QK_NORM), \
	NORM(X3_SCOPE_LAYER, GL_(P, "self_attn.k_norm"), X3_SLOT_K_NORM, X3_DIM_HEAD_DIM, X3_WHEN_QK_NORM), \
	GLIN(P, "self_attn.o_proj", X3_SLOT_O, X3_ROLE_ATTENTION, X3_DIM_Q, X3_DIM_HIDDEN, X3_BIAS_O, 0, \
	     "self_attn.o_proj.input", "o"), \
	NORM(X3_SCOPE_LAYER, GL_(P, "post_attention_layernorm"), X3_SLOT_ATTN_OUT_NORM, X3_DIM_HIDDEN, \
	     X3_WHEN_ALWAYS), \
	NORM(X3_SCOPE_LAYER, GL_(P, "pre_feedforward_layernorm"), X3_SLOT_POST_NORM, X3_DIM_HIDDEN, \
	     X3_WHEN_ALWAYS), \
	GLIN(P, "mlp.gate_proj", X3_SLOT_GATE, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, X3_BIAS_NONE, 0, \
	     "mlp.input", "gu"), \
	GLIN(P, "mlp.up_proj", X3_SLOT_UP, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, X3_BIAS_NONE, 0, \
	     "mlp.input", "gu"), \
	GLIN(P, "mlp.down_proj", X3_SLOT_DOWN, X3_ROLE_MLP, X3_DIM_INTER, X3_DIM_HIDDEN, X3_BIAS_NONE, 0, \
	     "mlp.down_proj.input", "d"), \
	NORM(X3_SCOPE_LAYER, GL_(P, "post_feedforward_layernorm"), X3_SLOT_MLP_OUT_NORM, X3_DIM_HIDDEN, \
	     X3_WHEN_ALWAYS), \
	NORM(X3_SCOPE_POST, P "norm", X3_SLOT_FINAL_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS), \
	{ HEAD, X3_SCOPE_POST, X3_KIND_LINEAR, X3_SLOT_HEAD, X3_ROLE_HEAD, \
	  X3_DIM_HIDDEN, X3_DIM_VOCAB, X3_BIAS_NONE, X3_WHEN_ALWAYS, 0, X3_SLOT_EMBED, HEAD ".input", NULL, 0, NULL, NULL, NULL, X3_TIE_NONE }
static const x3_module_desc gemma_mods[] = { GEMMA_ROWS("model.", "lm_head") };
static const x3_module_desc gemma3_mm_mods[] = { GEMMA_ROWS("language_model.model.", "language_model.lm_head") };
/* Hugging Face's Gemma2Config / Gemma3TextConfig defaults: real Gemma3
 * configs leave most of text_config out (gemma-3-4b-it's has 6 keys) */
#define GEMMA_DEFAULTS \
	"\"hidden_size\": 2304, \"intermediate_size\": 9216, \"num_attention_heads\": 8, " \
	"\"num_key_value_heads\": 4, \"head_dim\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\", " \
	"\"rms_norm_eps\": 1e-6, \"query_pre_attn_scalar\": 256, \"sliding_window\": 4096, " \
	"\"tie_word_embeddings\": true"
static const char gemma2_defaults[] = "{" GEMMA_DEFAULTS ", \"vocab_size\": 256000, "
	"\"max_position_embeddings\": 8192, \"rope_theta\": 10000.0, \"final_logit_softcapping\": 30.0, "
	"\"attn_logit_softcapping\": 50.0}";
static const char gemma3_defaults[] = "{" GEMMA_DEFAULTS ", \"vocab_size\": 262208, "
	"\"max_position_embeddings\": 131072, \"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, "
	"\"sliding_window_pattern\": 6}";

/* Phi3: the Llama decoder with fused checkpoint tensors. ExLlamaV3 reads
 * self_attn.qkv_proj as q_proj, k_proj, v_proj (rows 0..Q, Q..Q+KV,
 * Q+KV..Q+2KV) and mlp.gate_up_proj as gate_proj, up_proj (rows 0..I,
 * I..2I), and stores and loads the EXL3 linears under those split keys:
 * the rows below are those linears, each a row slice of its fused tensor. */
static const x3_row_slice phi3_q = { L_("self_attn.qkv_proj"), { X3_DIM_NONE, X3_DIM_NONE },
	{ X3_DIM_Q, X3_DIM_KV, X3_DIM_KV } };
static const x3_row_slice phi3_k = { L_("self_attn.qkv_proj"), { X3_DIM_Q, X3_DIM_NONE },
	{ X3_DIM_Q, X3_DIM_KV, X3_DIM_KV } };
static const x3_row_slice phi3_v = { L_("self_attn.qkv_proj"), { X3_DIM_Q, X3_DIM_KV },
	{ X3_DIM_Q, X3_DIM_KV, X3_DIM_KV } };
static const x3_row_slice phi3_gate = { L_("mlp.gate_up_proj"), { X3_DIM_NONE, X3_DIM_NONE },
	{ X3_DIM_INTER, X3_DIM_INTER, X3_DIM_NONE } };
static const x3_row_slice phi3_up = { L_("mlp.gate_up_proj"), { X3_DIM_INTER, X3_DIM_NONE },
	{ X3_DIM_INTER, X3_DIM_INTER, X3_DIM_NONE } };
/* a linear sliced from a fused source tensor */
#define LINS(key, slot, role, in, out, bias, hq, group, alloc, slice) \
	{ L_(key), X3_SCOPE_LAYER, X3_KIND_LINEAR, slot, role, in, out, bias, X3_WHEN_ALWAYS, hq, -1, \
	  L_(group), alloc, 0, &slice, NULL, NULL, X3_TIE_NONE }
static const x3_module_desc phi3_mods[] = {
	{ "model.embed_tokens", X3_SCOPE_PRE, X3_KIND_EMBEDDING, X3_SLOT_EMBED, X3_ROLE_EMBEDDING,
	  X3_DIM_HIDDEN, X3_DIM_VOCAB, X3_BIAS_NONE, X3_WHEN_ALWAYS, 0, -1, NULL, NULL, 0, NULL, NULL, NULL, X3_TIE_NONE },
	NORM(X3_SCOPE_LAYER, L_("input_layernorm"), X3_SLOT_IN_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS),
	LINS("self_attn.q_proj", X3_SLOT_Q, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_Q, X3_BIAS_QKV, 0,
	     "self_attn.input", "qkv", phi3_q),
	LINS("self_attn.k_proj", X3_SLOT_K, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_KV, X3_BIAS_QKV, 0,
	     "self_attn.input", "qkv", phi3_k),
	LINS("self_attn.v_proj", X3_SLOT_V, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_KV, X3_BIAS_QKV, 0,
	     "self_attn.input", "qkv", phi3_v),
	LIN("self_attn.o_proj", X3_SLOT_O, X3_ROLE_ATTENTION, X3_DIM_Q, X3_DIM_HIDDEN, X3_BIAS_O, 0,
	    "self_attn.o_proj.input", "o"),
	NORM(X3_SCOPE_LAYER, L_("post_attention_layernorm"), X3_SLOT_POST_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS),
	LINS("mlp.gate_proj", X3_SLOT_GATE, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, X3_BIAS_MLP, 0,
	     "mlp.input", "gu", phi3_gate),
	LINS("mlp.up_proj", X3_SLOT_UP, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, X3_BIAS_MLP, 0,
	     "mlp.input", "gu", phi3_up),
	LIN("mlp.down_proj", X3_SLOT_DOWN, X3_ROLE_MLP, X3_DIM_INTER, X3_DIM_HIDDEN, X3_BIAS_MLP, 0,
	    "mlp.down_proj.input", "d"),
	POST_ROWS,
};

/* GPT-OSS (GptOssForCausalLM): the Llama attention (q/k/v/o biases by
 * attention_bias, Hugging Face's default true) and its learned sinks,
 * self_attn.sinks (heads), kept in the source precision; every layer a
 * mixture of experts: mlp.router (experts, hidden) and its bias
 * mlp.router.bias (experts) kept, the experts' gate, up and down linears
 * with biases under the per-expert keys ExLlamaV3's gpt_oss.py loads
 * (one K per projection across a layer's experts). --hq as ExLlamaV3's
 * gpt_oss: attention +2. */
#define GPTOSS_EXPERT(key, slot, in, out, group, alloc) \
	{ L_(key), X3_SCOPE_LAYER, X3_KIND_LINEAR, slot, X3_ROLE_EXPERT, in, out, X3_BIAS_ALWAYS, X3_WHEN_SPARSE, 0, \
	  -1, L_(group), alloc, 0, NULL, NULL, NULL, X3_TIE_EXPERTS }
static const x3_module_desc gpt_oss_mods[] = {
	ATTN_ROWS,
	VECW("self_attn.sinks", X3_SLOT_SINKS, X3_ROLE_ATTENTION, X3_DIM_HEADS, X3_WHEN_ALWAYS, 1),
	MAT("mlp.router", X3_SLOT_ROUTER, X3_ROLE_ROUTER, X3_DIM_HIDDEN, X3_DIM_EXPERTS, X3_WHEN_SPARSE),
	VECW("mlp.router.bias", X3_SLOT_ROUTER_LOGIT_BIAS, X3_ROLE_ROUTER, X3_DIM_EXPERTS, X3_WHEN_SPARSE, 1),
	GPTOSS_EXPERT("mlp.experts.{E}.gate_proj", X3_SLOT_EXP_GATE, X3_DIM_HIDDEN, X3_DIM_MOE_INTER,
	              "mlp.experts.{E}.input", "gu"),
	GPTOSS_EXPERT("mlp.experts.{E}.up_proj", X3_SLOT_EXP_UP, X3_DIM_HIDDEN, X3_DIM_MOE_INTER,
	              "mlp.experts.{E}.input", "gu"),
	GPTOSS_EXPERT("mlp.experts.{E}.down_proj", X3_SLOT_EXP_DOWN, X3_DIM_MOE_INTER, X3_DIM_HIDDEN,
	              "mlp.experts.{E}.down_proj.input", "d"),
	POST_ROWS,
};
/* Hugging Face's GptOssConfig defaults (its rope_parameters: the yarn
 * scaling a config without rope_scaling gets) */
static const char gpt_oss_defaults[] =
	"{\"num_local_experts\": 128, \"num_experts_per_tok\": 4, \"sliding_window\": 128, "
	"\"rms_norm_eps\": 1e-5, \"attention_bias\": true, \"swiglu_limit\": 7.0, \"swiglu_alpha\": 1.702, "
	"\"head_dim\": 64, \"tie_word_embeddings\": false, \"max_position_embeddings\": 131072, "
	"\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 150000.0, \"factor\": 32.0, "
	"\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"truncate\": false, \"original_max_position_embeddings\": 4096}}";
/* The Qwen3-Next / Qwen3.5 hybrids under the key prefix P ("model." or,
 * for the multimodal checkpoints, "model.language_model."): every layer an
 * input_layernorm, then either gated full attention (q_proj (2 Q, hidden):
 * each head's query then its gate; q/k norms) or the Gated DeltaNet
 * (linear_attn.*, gdn.h), then post_attention_layernorm and the MLP (dense,
 * or Qwen2-MoE's experts with a shared expert and its sigmoid gate). As
 * ExLlamaV3 (architecture/qwen3_next.py, qwen3_5.py,
 * modules/gated_delta_net.py) quantizes and keeps them: in_proj_qkvz, or
 * in_proj_qkv and in_proj_z, read one Hessian (the normed hidden state),
 * out_proj its own (the gated norm's output); in_proj_ba, or in_proj_b and
 * in_proj_a, conv1d, A_log, dt_bias and the norms are kept in the source
 * precision, as are the router and shared_expert_gate. --hq as ExLlamaV3:
 * attention and DeltaNet +2 in the MoE models (HQ), none in dense Qwen3.5,
 * shared expert +2. Their multi-token
 * prediction layer (mtp.*) is the MTP rows below (HYBRID_MTP) and the
 * vision tower (model.visual.*) passed through, or its linears encoded at
 * --vision-bits (qwen3_5_vis). */
#define HL_(P, s) P "layers.{L}." s
#define HLIN(P, key, slot, role, in, out, hq, group, alloc, when) \
	{ HL_(P, key), X3_SCOPE_LAYER, X3_KIND_LINEAR, slot, role, in, out, X3_BIAS_NONE, when, hq, -1, \
	  HL_(P, group), alloc, 0, NULL, NULL, NULL, X3_TIE_NONE }
#define HKEPT(P, key, kind, slot, role, in, out, when, bare) \
	{ HL_(P, key), X3_SCOPE_LAYER, kind, slot, role, in, out, X3_BIAS_NONE, when, 0, -1, \
	  NULL, NULL, bare, NULL, NULL, NULL, X3_TIE_NONE }
#define HEXP(P, key, slot, in, out, group, alloc, fused) \
	{ HL_(P, key), X3_SCOPE_LAYER, X3_KIND_LINEAR, slot, X3_ROLE_EXPERT, in, out, X3_BIAS_NONE, X3_WHEN_SPARSE, 0, -1, \
	  HL_(P, group), alloc, 0, NULL, &fused, NULL, X3_TIE_EXPERTS }
#define HYBRID_HEAD_ROWS(P, HQ) \
	{ P "embed_tokens", X3_SCOPE_PRE, X3_KIND_EMBEDDING, X3_SLOT_EMBED, X3_ROLE_EMBEDDING, \
	  X3_DIM_HIDDEN, X3_DIM_VOCAB, X3_BIAS_NONE, X3_WHEN_ALWAYS, 0, -1, NULL, NULL, 0, NULL, NULL, NULL, X3_TIE_NONE }, \
	NORM(X3_SCOPE_LAYER, HL_(P, "input_layernorm"), X3_SLOT_IN_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS), \
	HLIN(P, "self_attn.q_proj", X3_SLOT_Q, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_Q2, HQ, \
	     "self_attn.input", "qkv", X3_WHEN_FULL_ATTN), \
	HLIN(P, "self_attn.k_proj", X3_SLOT_K, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_KV, HQ, \
	     "self_attn.input", "qkv", X3_WHEN_FULL_ATTN), \
	HLIN(P, "self_attn.v_proj", X3_SLOT_V, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_KV, HQ, \
	     "self_attn.input", "qkv", X3_WHEN_FULL_ATTN), \
	NORM(X3_SCOPE_LAYER, HL_(P, "self_attn.q_norm"), X3_SLOT_Q_NORM, X3_DIM_HEAD_DIM, X3_WHEN_FULL_ATTN), \
	NORM(X3_SCOPE_LAYER, HL_(P, "self_attn.k_norm"), X3_SLOT_K_NORM, X3_DIM_HEAD_DIM, X3_WHEN_FULL_ATTN), \
	HLIN(P, "self_attn.o_proj", X3_SLOT_O, X3_ROLE_ATTENTION, X3_DIM_Q, X3_DIM_HIDDEN, HQ, \
	     "self_attn.o_proj.input", "o", X3_WHEN_FULL_ATTN)
#define HYBRID_GDN_TAIL_ROWS(P, HQ) \
	HKEPT(P, "linear_attn.conv1d", X3_KIND_CONV, X3_SLOT_GDN_CONV, X3_ROLE_ATTENTION, X3_DIM_GDN_KCONV, \
	      X3_DIM_GDN_CONV, X3_WHEN_LINEAR_ATTN, 0), \
	HKEPT(P, "linear_attn.A_log", X3_KIND_VECTOR, X3_SLOT_GDN_ALOG, X3_ROLE_ATTENTION, X3_DIM_NONE, \
	      X3_DIM_GDN_NV, X3_WHEN_LINEAR_ATTN, 1), \
	HKEPT(P, "linear_attn.dt_bias", X3_KIND_VECTOR, X3_SLOT_GDN_DT, X3_ROLE_ATTENTION, X3_DIM_NONE, \
	      X3_DIM_GDN_NV, X3_WHEN_LINEAR_ATTN, 1), \
	HKEPT(P, "linear_attn.norm", X3_KIND_VECTOR, X3_SLOT_GDN_NORM, X3_ROLE_NORM, X3_DIM_NONE, \
	      X3_DIM_GDN_DV, X3_WHEN_LINEAR_ATTN, 0), \
	HLIN(P, "linear_attn.out_proj", X3_SLOT_GDN_OUT, X3_ROLE_ATTENTION, X3_DIM_GDN_V, X3_DIM_HIDDEN, HQ, \
	     "linear_attn.out_proj.input", "o", X3_WHEN_LINEAR_ATTN), \
	NORM(X3_SCOPE_LAYER, HL_(P, "post_attention_layernorm"), X3_SLOT_POST_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS)
/* Qwen3-Next's fused projections, grouped per key head (gdn.h) */
#define HYBRID_GDN_FUSED_ROWS(P, HQ) \
	HLIN(P, "linear_attn.in_proj_qkvz", X3_SLOT_GDN_QKVZ, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_GDN_QKVZ, HQ, \
	     "linear_attn.input", "qkv", X3_WHEN_LINEAR_ATTN), \
	HKEPT(P, "linear_attn.in_proj_ba", X3_KIND_MATRIX, X3_SLOT_GDN_BA, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, \
	      X3_DIM_GDN_BA, X3_WHEN_LINEAR_ATTN, 0), \
	HYBRID_GDN_TAIL_ROWS(P, HQ)
/* Qwen3.5's split projections */
#define HYBRID_GDN_SPLIT_ROWS(P, HQ) \
	HLIN(P, "linear_attn.in_proj_qkv", X3_SLOT_GDN_QKV, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_GDN_CONV, HQ, \
	     "linear_attn.input", "qkv", X3_WHEN_LINEAR_ATTN), \
	HLIN(P, "linear_attn.in_proj_z", X3_SLOT_GDN_Z, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_GDN_V, HQ, \
	     "linear_attn.input", "qkv", X3_WHEN_LINEAR_ATTN), \
	HKEPT(P, "linear_attn.in_proj_b", X3_KIND_MATRIX, X3_SLOT_GDN_B, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, \
	      X3_DIM_GDN_NV, X3_WHEN_LINEAR_ATTN, 0), \
	HKEPT(P, "linear_attn.in_proj_a", X3_KIND_MATRIX, X3_SLOT_GDN_A, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, \
	      X3_DIM_GDN_NV, X3_WHEN_LINEAR_ATTN, 0), \
	HYBRID_GDN_TAIL_ROWS(P, HQ)
/* the MLP: dense layers' (Qwen3.5), or the experts with a shared expert
 * (Qwen3-Next per expert, Qwen3.5-MoE fused 3-D) */
#define HYBRID_MLP_ROWS(P, FG, FU, FD) \
	HLIN(P, "mlp.gate_proj", X3_SLOT_GATE, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, 0, "mlp.input", "gu", \
	     X3_WHEN_DENSE), \
	HLIN(P, "mlp.up_proj", X3_SLOT_UP, X3_ROLE_MLP, X3_DIM_HIDDEN, X3_DIM_INTER, 0, "mlp.input", "gu", \
	     X3_WHEN_DENSE), \
	HLIN(P, "mlp.down_proj", X3_SLOT_DOWN, X3_ROLE_MLP, X3_DIM_INTER, X3_DIM_HIDDEN, 0, "mlp.down_proj.input", \
	     "d", X3_WHEN_DENSE), \
	HKEPT(P, "mlp.gate", X3_KIND_MATRIX, X3_SLOT_ROUTER, X3_ROLE_ROUTER, X3_DIM_HIDDEN, X3_DIM_EXPERTS, \
	      X3_WHEN_SPARSE, 0), \
	HEXP(P, "mlp.experts.{E}.gate_proj", X3_SLOT_EXP_GATE, X3_DIM_HIDDEN, X3_DIM_MOE_INTER, \
	     "mlp.experts.{E}.input", "gu", FG), \
	HEXP(P, "mlp.experts.{E}.up_proj", X3_SLOT_EXP_UP, X3_DIM_HIDDEN, X3_DIM_MOE_INTER, \
	     "mlp.experts.{E}.input", "gu", FU), \
	HEXP(P, "mlp.experts.{E}.down_proj", X3_SLOT_EXP_DOWN, X3_DIM_MOE_INTER, X3_DIM_HIDDEN, \
	     "mlp.experts.{E}.down_proj.input", "d", FD), \
	HLIN(P, "mlp.shared_expert.gate_proj", X3_SLOT_SHX_GATE, X3_ROLE_SHARED_EXPERT, X3_DIM_HIDDEN, \
	     X3_DIM_SHARED_INTER, 2, "mlp.shared_expert.input", "gu", X3_WHEN_SHARED), \
	HLIN(P, "mlp.shared_expert.up_proj", X3_SLOT_SHX_UP, X3_ROLE_SHARED_EXPERT, X3_DIM_HIDDEN, \
	     X3_DIM_SHARED_INTER, 2, "mlp.shared_expert.input", "gu", X3_WHEN_SHARED), \
	HLIN(P, "mlp.shared_expert.down_proj", X3_SLOT_SHX_DOWN, X3_ROLE_SHARED_EXPERT, X3_DIM_SHARED_INTER, \
	     X3_DIM_HIDDEN, 2, "mlp.shared_expert.down_proj.input", "d", X3_WHEN_SHARED), \
	HKEPT(P, "mlp.shared_expert_gate", X3_KIND_MATRIX, X3_SLOT_SHX_SCALE, X3_ROLE_ROUTER, X3_DIM_HIDDEN, \
	      X3_DIM_ONE, X3_WHEN_SHARED, 0), \
	NORM(X3_SCOPE_POST, P "norm", X3_SLOT_FINAL_NORM, X3_DIM_HIDDEN, X3_WHEN_ALWAYS), \
	{ "lm_head", X3_SCOPE_POST, X3_KIND_LINEAR, X3_SLOT_HEAD, X3_ROLE_HEAD, \
	  X3_DIM_HIDDEN, X3_DIM_VOCAB, X3_BIAS_NONE, X3_WHEN_ALWAYS, 0, X3_SLOT_EMBED, "lm_head.input", NULL, 0, NULL, \
	  NULL, NULL, X3_TIE_NONE }
static const x3_fused_expert hfx_gate_m = { "model.layers.{L}.mlp.experts.gate_up_proj", 1 };
static const x3_fused_expert hfx_up_m = { "model.layers.{L}.mlp.experts.gate_up_proj", 2 };
static const x3_fused_expert hfx_down_m = { "model.layers.{L}.mlp.experts.down_proj", 0 };
static const x3_fused_expert hfx_gate_lm = { "model.language_model.layers.{L}.mlp.experts.gate_up_proj", 1 };
static const x3_fused_expert hfx_up_lm = { "model.language_model.layers.{L}.mlp.experts.gate_up_proj", 2 };
static const x3_fused_expert hfx_down_lm = { "model.language_model.layers.{L}.mlp.experts.down_proj", 0 };
static const x3_module_desc qwen3_next_mods[] = {
	HYBRID_HEAD_ROWS("model.", 2), HYBRID_GDN_FUSED_ROWS("model.", 2),
	HYBRID_MLP_ROWS("model.", hfx_gate_m, hfx_up_m, hfx_down_m),
};
/* Qwen3.5 dense and MoE: the same rows, --hq promoting attention and the
 * DeltaNet only in the MoE models (ExLlamaV3's qwen3_5.py) */
static const x3_module_desc qwen3_5_mods[] = {
	HYBRID_HEAD_ROWS("model.", 0), HYBRID_GDN_SPLIT_ROWS("model.", 0),
	HYBRID_MLP_ROWS("model.", hfx_gate_m, hfx_up_m, hfx_down_m),
};
static const x3_module_desc qwen3_5_moe_mods[] = {
	HYBRID_HEAD_ROWS("model.", 2), HYBRID_GDN_SPLIT_ROWS("model.", 2),
	HYBRID_MLP_ROWS("model.", hfx_gate_m, hfx_up_m, hfx_down_m),
};
static const x3_module_desc qwen3_5_mm_mods[] = {
	HYBRID_HEAD_ROWS("model.language_model.", 0), HYBRID_GDN_SPLIT_ROWS("model.language_model.", 0),
	HYBRID_MLP_ROWS("model.language_model.", hfx_gate_lm, hfx_up_lm, hfx_down_lm),
};
static const x3_module_desc qwen3_5_moe_mm_mods[] = {
	HYBRID_HEAD_ROWS("model.language_model.", 2), HYBRID_GDN_SPLIT_ROWS("model.language_model.", 2),
	HYBRID_MLP_ROWS("model.language_model.", hfx_gate_lm, hfx_up_lm, hfx_down_lm),
};
/* Hugging Face's defaults for the keys real hybrid configs may leave out
 * (the linear_* keys are required: config.c) */
static const char qwen3_next_defaults[] =
	"{\"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"rms_norm_eps\": 1e-6, "
	"\"attention_bias\": false, \"head_dim\": 256, \"tie_word_embeddings\": false}";
static const char qwen3_5_defaults[] =
	"{\"rms_norm_eps\": 1e-6, \"attention_bias\": false, \"head_dim\": 256}";
static const char qwen3_5_moe_defaults[] =
	"{\"norm_topk_prob\": true, \"rms_norm_eps\": 1e-6, \"attention_bias\": false, \"head_dim\": 256}";
/* GLM-5 (GlmMoeDsaForCausalLM) and DeepSeek V3.2 (DeepseekV32ForCausalLM):
 * DeepSeek V3's rows and the indexer of their sparse attention (X3_AF_DSA)
 * in the layers that run one (X3_WHEN_INDEXER: GLM-5's "shared" layers
 * have none). indexer.wq_b maps the query latent (q_a_layernorm's output)
 * to the indexer's queries: it reads q_b_proj's Hessian group and is
 * quantized; indexer.wk, indexer.k_norm (a LayerNorm: weight and bias) and
 * indexer.weights_proj are small, decide which keys every later query
 * sees, and are kept in the source precision, as the published EXL3
 * packs keep them. Readers: GPTQModel (glm_moe_dsa and deepseek_v32
 * definitions); ExLlamaV3 v1.4.1 has neither. */
static const x3_module_desc dsa_mods[] = {
	DSV3_Q_ROWS,
	LINW("self_attn.indexer.wq_b", X3_SLOT_IDX_QB, X3_ROLE_ATTENTION, X3_DIM_Q_LORA, X3_DIM_IDX_Q,
	     X3_BIAS_NONE, 2, "self_attn.q_b_proj.input", "qb", X3_WHEN_INDEXER),
	MAT("self_attn.indexer.wk", X3_SLOT_IDX_K, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_IDX_HD,
	    X3_WHEN_INDEXER),
	VECW("self_attn.indexer.k_norm", X3_SLOT_IDX_K_NORM, X3_ROLE_NORM, X3_DIM_IDX_HD, X3_WHEN_INDEXER, 0),
	VECW("self_attn.indexer.k_norm.bias", X3_SLOT_IDX_K_BIAS, X3_ROLE_NORM, X3_DIM_IDX_HD, X3_WHEN_INDEXER, 1),
	MAT("self_attn.indexer.weights_proj", X3_SLOT_IDX_W, X3_ROLE_ATTENTION, X3_DIM_HIDDEN, X3_DIM_IDX_HEADS,
	    X3_WHEN_INDEXER),
	DSV3_KV_ROWS,
	DSV3_MLP_ROWS,
	POST_ROWS,
};
/* Hugging Face's GlmMoeDsaConfig and DeepseekV32Config defaults (the
 * latter's routing defaults are DeepSeek V3's: parse_grouped; the rope
 * layouts are config.c's) */
static const char glm_moe_dsa_defaults[] =
	"{\"n_routed_experts\": 256, \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 2048, "
	"\"n_shared_experts\": 1, \"routed_scaling_factor\": 2.5, \"n_group\": 1, \"topk_group\": 1, "
	"\"first_k_dense_replace\": 3, \"norm_topk_prob\": true, \"q_lora_rank\": 2048, "
	"\"attention_bias\": false, \"rms_norm_eps\": 1e-5, "
	"\"index_topk\": 2048, \"index_head_dim\": 128, \"index_n_heads\": 32}";
static const char deepseek_v32_defaults[] =
	"{\"q_lora_rank\": 1536, \"index_topk\": 2048, "
	"\"index_head_dim\": 128, \"index_n_heads\": 64}";

/* The multi-token prediction (MTP) layer (arch.h x3_arch_desc.mtp_pre):
 * the input rows (the norm of the next token's embedding, that of the
 * main model's last hidden state, the projection of [embedding | hidden]
 * to hidden, a linear at --mtp-bits), one decoder layer (the layer rows
 * as an MTP layer has them, x3_arch_mtp_rows) and its final norm; the
 * head and the embedding are the main model's. Qwen3.5 / Qwen3-Next: mtp.*
 * at the checkpoint's root (ExLlamaV3's qwen3_5_mtp.py: mtp.fc,
 * mtp.pre_fc_norm_embedding / _hidden, mtp.layers.0, mtp.norm). DeepSeek
 * V3 and the GLM-4-MoE / GLM-4.7-Flash / GLM-5 / DeepSeek V3.2 families:
 * layer num_hidden_layers (enorm, hnorm, eh_proj, shared_head.norm); the
 * copies of the embedding and the head some checkpoints give it
 * (embed_tokens, shared_head.head) are left out (x3_arch_skipped). */
#define MTP_VEC(key, slot) NORM(X3_SCOPE_MTP, key, slot, X3_DIM_HIDDEN, X3_WHEN_ALWAYS)
#define MTP_FC(key) \
	{ key, X3_SCOPE_MTP, X3_KIND_LINEAR, X3_SLOT_MTP_FC, X3_ROLE_MTP, X3_DIM_HIDDEN2, X3_DIM_HIDDEN, \
	  X3_BIAS_NONE, X3_WHEN_ALWAYS, 0, -1, NULL, NULL, 0, NULL, NULL, NULL, X3_TIE_NONE }
static const x3_module_desc hybrid_mtp_pre[] = {
	MTP_VEC("mtp.pre_fc_norm_embedding", X3_SLOT_MTP_ENORM),
	MTP_VEC("mtp.pre_fc_norm_hidden", X3_SLOT_MTP_HNORM),
	MTP_FC("mtp.fc"),
};
static const x3_module_desc hybrid_mtp_post[] = { MTP_VEC("mtp.norm", X3_SLOT_FINAL_NORM) };
static const x3_module_desc dsv3_mtp_pre[] = {
	MTP_VEC(L_("enorm"), X3_SLOT_MTP_ENORM),
	MTP_VEC(L_("hnorm"), X3_SLOT_MTP_HNORM),
	MTP_FC(L_("eh_proj")),
};
static const x3_module_desc dsv3_mtp_post[] = { MTP_VEC(L_("shared_head.norm"), X3_SLOT_FINAL_NORM) };
#define HYBRID_MTP "mtp.layers.{L}", hybrid_mtp_pre, hybrid_mtp_post, N_(hybrid_mtp_pre), N_(hybrid_mtp_post), "mtp.fc"
#define NO_MTP NULL, NULL, NULL, 0, 0, NULL
#define DSV3_MTP NULL, dsv3_mtp_pre, dsv3_mtp_post, N_(dsv3_mtp_pre), N_(dsv3_mtp_post), L_("eh_proj")

/* The vision towers' linears (arch.h x3_arch_desc.vis), as ExLlamaV3's
 * vision models load them when it quantizes them (its -vb): Gemma3's SigLIP
 * encoder layers (architecture/gemma3.py: self_attn q/k/v/out_proj and
 * mlp fc1/fc2, with biases; the patch and position embeddings, the layer
 * norms, post_layernorm and the multimodal projector stay as they are),
 * Qwen3.5's blocks (architecture/qwen3_vl.py: attn.qkv loaded as the row
 * slices q_proj, k_proj, v_proj, attn.proj, mlp.linear_fc1/linear_fc2,
 * with biases) and its patch merger's linear_fc1/linear_fc2 (its norm,
 * patch_embed and pos_embed kept). No Hessian group: encoded without
 * calibration. */
#define VLIN(scope, slot, key, in, out, slice) \
	{ key, scope, X3_KIND_LINEAR, slot, X3_ROLE_VISION, in, out, X3_BIAS_ALWAYS, X3_WHEN_ALWAYS, \
	  0, -1, NULL, NULL, 0, slice, NULL, NULL, X3_TIE_NONE }
#define GV_(s) "vision_tower.vision_model.encoder.layers.{L}." s
static const x3_module_desc gemma3_vis[] = {
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION, GV_("self_attn.q_proj"), X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN, NULL),
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION, GV_("self_attn.k_proj"), X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN, NULL),
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION, GV_("self_attn.v_proj"), X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN, NULL),
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION, GV_("self_attn.out_proj"), X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN, NULL),
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION_UNPADDED, GV_("mlp.fc1"), X3_DIM_V_HIDDEN, X3_DIM_V_INTER, NULL),
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION_UNPADDED, GV_("mlp.fc2"), X3_DIM_V_INTER, X3_DIM_V_HIDDEN, NULL),
};
#define QV_(s) "model.visual.blocks.{L}." s
static const x3_row_slice qwen_vq = { QV_("attn.qkv"), { X3_DIM_NONE, X3_DIM_NONE },
	{ X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN } };
static const x3_row_slice qwen_vk = { QV_("attn.qkv"), { X3_DIM_V_HIDDEN, X3_DIM_NONE },
	{ X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN } };
static const x3_row_slice qwen_vv = { QV_("attn.qkv"), { X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN },
	{ X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN } };
static const x3_module_desc qwen3_5_vis[] = {
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION, QV_("attn.q_proj"), X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN, &qwen_vq),
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION, QV_("attn.k_proj"), X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN, &qwen_vk),
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION, QV_("attn.v_proj"), X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN, &qwen_vv),
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION, QV_("attn.proj"), X3_DIM_V_HIDDEN, X3_DIM_V_HIDDEN, NULL),
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION_UNPADDED, QV_("mlp.linear_fc1"), X3_DIM_V_HIDDEN, X3_DIM_V_INTER, NULL),
	VLIN(X3_SCOPE_VISION, X3_SLOT_VISION_UNPADDED, QV_("mlp.linear_fc2"), X3_DIM_V_INTER, X3_DIM_V_HIDDEN, NULL),
	VLIN(X3_SCOPE_VISION_POST, X3_SLOT_VISION_UNPADDED, "model.visual.merger.linear_fc1", X3_DIM_V_MERGE, X3_DIM_V_MERGE, NULL),
	VLIN(X3_SCOPE_VISION_POST, X3_SLOT_VISION_UNPADDED, "model.visual.merger.linear_fc2", X3_DIM_V_MERGE, X3_DIM_V_OUT, NULL),
};
#define NO_VIS NULL, 0
#define GEMMA3_VIS gemma3_vis, N_(gemma3_vis)
#define QWEN3_5_VIS qwen3_5_vis, N_(qwen3_5_vis)

/* readers: ExLlamaV3 v1.4.1 has no Qwen2-MoE and no GLM-4.7-Flash (its
 * glm4_moe_lite.py is only in an unmerged pull request); GPT-OSS's reader is
 * ExLlamaV3's gpt_oss.py (GPTQModel's EXL3 path is not checked for it); GPTQModel loads through the
 * Hugging Face model's own modules, and Phi3's are fused (qkv_proj,
 * gate_up_proj), not the q/k/v and gate/up linears an EXL3 Phi3 holds. */
const x3_arch_desc x3_archs[] = {
	{ X3_ARCH_LLAMA, "LlamaForCausalLM", "llama", "Llama", X3_AF_ATTN_BIAS | X3_AF_MLP_BIAS,
	  "model.layers.{L}", llama_mods, N_(llama_mods), NULL, NULL,
	  X3_RD(X3_READER_EXLLAMAV3) | X3_RD(X3_READER_GPTQMODEL) , NO_MTP, NO_VIS },
	{ X3_ARCH_MISTRAL, "MistralForCausalLM", "mistral", "Mistral", X3_AF_SLIDING,
	  "model.layers.{L}", llama_mods, N_(llama_mods), NULL, NULL,
	  X3_RD(X3_READER_EXLLAMAV3) | X3_RD(X3_READER_GPTQMODEL) , NO_MTP, NO_VIS },
	{ X3_ARCH_QWEN2, "Qwen2ForCausalLM", "qwen2", "Qwen2", X3_AF_QKV_BIAS | X3_AF_USE_SLIDING,
	  "model.layers.{L}", llama_mods, N_(llama_mods), NULL, NULL,
	  X3_RD(X3_READER_EXLLAMAV3) | X3_RD(X3_READER_GPTQMODEL) , NO_MTP, NO_VIS },
	{ X3_ARCH_QWEN3, "Qwen3ForCausalLM", "qwen3", "Qwen3",
	  X3_AF_ATTN_BIAS | X3_AF_QK_NORM | X3_AF_USE_SLIDING, "model.layers.{L}", llama_mods, N_(llama_mods), NULL, NULL,
	  X3_RD(X3_READER_EXLLAMAV3) | X3_RD(X3_READER_GPTQMODEL) , NO_MTP, NO_VIS },
	{ X3_ARCH_MIXTRAL, "MixtralForCausalLM", "mixtral", "Mixtral",
	  X3_AF_SLIDING | X3_AF_MOE | X3_AF_MOE_RENORM, "model.layers.{L}", mixtral_mods, N_(mixtral_mods),
	  "num_local_experts", NULL,
	  X3_RD(X3_READER_EXLLAMAV3) | X3_RD(X3_READER_GPTQMODEL) , NO_MTP, NO_VIS },
	{ X3_ARCH_QWEN2_MOE, "Qwen2MoeForCausalLM", "qwen2_moe", "Qwen2-MoE",
	  X3_AF_QKV_BIAS | X3_AF_USE_SLIDING | X3_AF_MOE | X3_AF_MOE_STEP | X3_AF_MOE_OWN_INTER | X3_AF_SHARED,
	  "model.layers.{L}", qwen_moe_mods, N_(qwen_moe_mods), "num_experts", NULL,
	  X3_RD(X3_READER_GPTQMODEL) , NO_MTP, NO_VIS },
	{ X3_ARCH_QWEN3_MOE, "Qwen3MoeForCausalLM", "qwen3_moe", "Qwen3-MoE",
	  X3_AF_ATTN_BIAS | X3_AF_QK_NORM | X3_AF_USE_SLIDING | X3_AF_MOE | X3_AF_MOE_STEP | X3_AF_MOE_OWN_INTER,
	  "model.layers.{L}", qwen_moe_mods, N_(qwen_moe_mods), "num_experts", NULL,
	  X3_RD(X3_READER_EXLLAMAV3) | X3_RD(X3_READER_GPTQMODEL) , NO_MTP, NO_VIS },
	{ X3_ARCH_DEEPSEEK_V3, "DeepseekV3ForCausalLM", "deepseek_v3", "DeepSeek-V3",
	  X3_AF_ATTN_BIAS | X3_AF_MLA | X3_AF_MOE | X3_AF_MOE_OWN_INTER | X3_AF_SHARED | X3_AF_GROUPED,
	  "model.layers.{L}", deepseek_v3_mods, N_(deepseek_v3_mods), "n_routed_experts", NULL,
	  X3_RD(X3_READER_EXLLAMAV3) | X3_RD(X3_READER_GPTQMODEL), DSV3_MTP, NO_VIS },
	{ X3_ARCH_GEMMA2, "Gemma2ForCausalLM", "gemma2", "Gemma2", X3_AF_ATTN_BIAS | X3_AF_GEMMA,
	  "model.layers.{L}", gemma_mods, N_(gemma_mods), NULL, gemma2_defaults,
	  X3_RD(X3_READER_EXLLAMAV3) | X3_RD(X3_READER_GPTQMODEL) , NO_MTP, NO_VIS },
	{ X3_ARCH_GEMMA3, "Gemma3ForCausalLM", "gemma3_text", "Gemma3",
	  X3_AF_ATTN_BIAS | X3_AF_QK_NORM | X3_AF_GEMMA | X3_AF_GEMMA3,
	  "model.layers.{L}", gemma_mods, N_(gemma_mods), NULL, gemma3_defaults,
	  X3_RD(X3_READER_EXLLAMAV3) | X3_RD(X3_READER_GPTQMODEL) , NO_MTP, NO_VIS },
	{ X3_ARCH_GEMMA3_MM, "Gemma3ForConditionalGeneration", "gemma3", "Gemma3 multimodal",
	  X3_AF_ATTN_BIAS | X3_AF_QK_NORM | X3_AF_GEMMA | X3_AF_GEMMA3,
	  "language_model.model.layers.{L}", gemma3_mm_mods, N_(gemma3_mm_mods), NULL, gemma3_defaults,
	  X3_RD(X3_READER_EXLLAMAV3) | X3_RD(X3_READER_GPTQMODEL) , NO_MTP, GEMMA3_VIS },
	{ X3_ARCH_PHI3, "Phi3ForCausalLM", "phi3", "Phi3", X3_AF_SLIDING,
	  "model.layers.{L}", phi3_mods, N_(phi3_mods), NULL, NULL,
	  X3_RD(X3_READER_EXLLAMAV3) , NO_MTP, NO_VIS },
	{ X3_ARCH_GLM4_MOE, "Glm4MoeForCausalLM", "glm4_moe", "GLM-4-MoE",
	  X3_AF_QKV_ATTN_BIAS | X3_AF_USE_QK_NORM | X3_AF_MOE | X3_AF_MOE_OWN_INTER | X3_AF_SHARED | X3_AF_GROUPED,
	  "model.layers.{L}", glm4_moe_mods, N_(glm4_moe_mods), "n_routed_experts", glm4_moe_defaults,
	  X3_RD(X3_READER_EXLLAMAV3) | X3_RD(X3_READER_GPTQMODEL), DSV3_MTP, NO_VIS },
	{ X3_ARCH_GLM4_MOE_LITE, "Glm4MoeLiteForCausalLM", "glm4_moe_lite", "GLM-4.7-Flash",
	  X3_AF_ATTN_BIAS | X3_AF_MLA | X3_AF_MOE | X3_AF_MOE_OWN_INTER | X3_AF_SHARED | X3_AF_GROUPED |
	  X3_AF_MLP_TYPES,
	  "model.layers.{L}", deepseek_v3_mods, N_(deepseek_v3_mods), "n_routed_experts", glm4_moe_lite_defaults,
	  X3_RD(X3_READER_GPTQMODEL), DSV3_MTP, NO_VIS },
	{ X3_ARCH_GPT_OSS, "GptOssForCausalLM", "gpt_oss", "GPT-OSS", X3_AF_ATTN_BIAS | X3_AF_MOE | X3_AF_GPT_OSS,
	  "model.layers.{L}", gpt_oss_mods, N_(gpt_oss_mods), "num_local_experts", gpt_oss_defaults,
	  X3_RD(X3_READER_EXLLAMAV3) , NO_MTP, NO_VIS },
	/* the Qwen3-Next / Qwen3.5 hybrids (Gated DeltaNet); ExLlamaV3 v1.4.1
	 * registers Qwen3.5 under its ...ForConditionalGeneration names only
	 * (architecture/qwen3_5.py), the text under model.language_model. */
	{ X3_ARCH_QWEN3_NEXT, "Qwen3NextForCausalLM", "qwen3_next", "Qwen3-Next",
	  X3_AF_HYBRID | X3_AF_MOE | X3_AF_MOE_STEP | X3_AF_MOE_OWN_INTER | X3_AF_SHARED,
	  "model.layers.{L}", qwen3_next_mods, N_(qwen3_next_mods), "num_experts", qwen3_next_defaults,
	  X3_RD(X3_READER_EXLLAMAV3), HYBRID_MTP, NO_VIS },
	{ X3_ARCH_QWEN3_5, "Qwen3_5ForCausalLM", "qwen3_5_text", "Qwen3.5", X3_AF_HYBRID,
	  "model.layers.{L}", qwen3_5_mods, N_(qwen3_5_mods), NULL, qwen3_5_defaults, 0, HYBRID_MTP, NO_VIS },
	{ X3_ARCH_QWEN3_5_MM, "Qwen3_5ForConditionalGeneration", "qwen3_5", "Qwen3.5 multimodal", X3_AF_HYBRID,
	  "model.language_model.layers.{L}", qwen3_5_mm_mods, N_(qwen3_5_mm_mods), NULL, qwen3_5_defaults,
	  X3_RD(X3_READER_EXLLAMAV3), HYBRID_MTP, QWEN3_5_VIS },
	{ X3_ARCH_QWEN3_5_MOE, "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", "Qwen3.5-MoE",
	  X3_AF_HYBRID | X3_AF_MOE | X3_AF_MOE_OWN_INTER | X3_AF_SHARED,
	  "model.layers.{L}", qwen3_5_moe_mods, N_(qwen3_5_moe_mods), "num_experts", qwen3_5_moe_defaults, 0, HYBRID_MTP,
	  NO_VIS },
	{ X3_ARCH_QWEN3_5_MOE_MM, "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", "Qwen3.5-MoE multimodal",
	  X3_AF_HYBRID | X3_AF_MOE | X3_AF_MOE_OWN_INTER | X3_AF_SHARED,
	  "model.language_model.layers.{L}", qwen3_5_moe_mm_mods, N_(qwen3_5_moe_mm_mods), "num_experts",
	  qwen3_5_moe_defaults, X3_RD(X3_READER_EXLLAMAV3), HYBRID_MTP, QWEN3_5_VIS },
	{ X3_ARCH_GLM_MOE_DSA, "GlmMoeDsaForCausalLM", "glm_moe_dsa", "GLM-5",
	  X3_AF_ATTN_BIAS | X3_AF_MLA | X3_AF_MOE | X3_AF_MOE_OWN_INTER | X3_AF_SHARED | X3_AF_GROUPED | X3_AF_DSA,
	  "model.layers.{L}", dsa_mods, N_(dsa_mods), "n_routed_experts", glm_moe_dsa_defaults,
	  X3_RD(X3_READER_GPTQMODEL), DSV3_MTP, NO_VIS },
	{ X3_ARCH_DEEPSEEK_V32, "DeepseekV32ForCausalLM", "deepseek_v32", "DeepSeek-V3.2",
	  X3_AF_ATTN_BIAS | X3_AF_MLA | X3_AF_MOE | X3_AF_MOE_OWN_INTER | X3_AF_SHARED | X3_AF_GROUPED | X3_AF_DSA,
	  "model.layers.{L}", dsa_mods, N_(dsa_mods), "n_routed_experts", deepseek_v32_defaults,
	  X3_RD(X3_READER_GPTQMODEL), DSV3_MTP, NO_VIS },
};
const int x3_narchs = N_(x3_archs);
