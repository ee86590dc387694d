/* model.h: the Llama-family causal LM on CPU (F32, OpenBLAS GEMMs, OpenMP
 * attention), for calibration (Hessian capture) and evaluation.
 *
 * Architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
 * (q/k/v biases), Qwen3ForCausalLM (per-head q/k RMSNorm). GQA, RoPE in the
 * rotate_half convention with rope_theta and the "default", "linear" and
 * "llama3" rope_scaling types, tied or separate lm_head, SiLU-gated MLP;
 * the mixture-of-experts Mixtral, Qwen2-MoE, Qwen3-MoE (moe.h) and
 * DeepseekV3ForCausalLM (multi-head latent attention, "yarn" rope_scaling,
 * grouped sigmoid routing, shared experts), Glm4MoeForCausalLM (its
 * routing under GQA with q/k/v biases, optional q/k RMSNorms and RoPE on the
 * first partial_rotary_factor of each head); GptOssForCausalLM (q/k/v/o
 * biases, one learned sink logit per head, sliding and full layers by
 * layer_types, yarn RoPE without truncation, the router's bias and the
 * softmax over the top k logits, experts with biases and the clamped
 * SwiGLU); GlmMoeDsaForCausalLM and
 * DeepseekV32ForCausalLM (DeepSeek V3's with the sparse attention of
 * indexer.h: rows longer than index_topk attend to the keys the indexer
 * picks); Phi3ForCausalLM;
 * Gemma2ForCausalLM,
 * Gemma3ForCausalLM and Gemma3ForConditionalGeneration's language model
 * ((1 + w) RMSNorms, norms after the attention and the MLP, the embedding
 * scaled by sqrt(hidden) in its dtype, query_pre_attn_scalar, attention and
 * final soft-capping, sliding-window layers masked per layer with Gemma3's
 * local RoPE base, GELU (tanh) MLP); the hybrids Qwen3NextForCausalLM,
 * Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM and their
 * ...ForConditionalGeneration language models (Gated DeltaNet layers,
 * lib/model/gdn.h, between gated full-attention layers; (1 + w) RMSNorms;
 * a shared expert with its sigmoid gate).
 *
 * The forward runs layer by layer over all token rows: the hidden states of
 * every token are kept (rows*cols*hidden floats), one layer's weights are
 * converted to F32 from the mmap'd safetensors when the layer runs and freed
 * after it. Any linear may come from an EXL3 model directory instead (a
 * quantized checkpoint read through lib/codec/exl3.h), either the whole model
 * (open the EXL3 directory itself) or, for sequential calibration, a range of
 * layers of an otherwise original model (x3_model_opts.overlay_dir), or
 * linear by linear (x3_model_opts.patch_dir).
 *
 * The forward's files (loading, RoPE, attention, latent attention, the
 * mixture of experts, the driver) are listed in model_impl.h. */
#ifndef X3_MODEL_H
#define X3_MODEL_H

#include "x3.h"
#include "config.h"

typedef struct x3_model x3_model;

struct x3_model_opts {
	/* Optional second model directory (typically EXL3-quantized) whose
	 * tensors replace those of layers overlay_first..overlay_last
	 * (inclusive); the embedding, final norm and head stay original. */
	const char *overlay_dir;
	int overlay_first, overlay_last;
	/* Optional directory (or .safetensors file) of EXL3 linears: every
	 * linear it holds (KEY.trellis ...) is taken from it, one by one,
	 * instead of from the model or the overlay; everything else stays.
	 * A trellis that is no linear of the model, a tensor of no linear the
	 * patch holds, and a patch with no linear at all are errors. (A model with
	 * one tensor or group quantized: convert --sensitivity.) */
	const char *patch_dir;
	/* the name errors give the patch (default patch_dir): a program that
	 * made patch_dir from the user's file names that file */
	const char *patch_name;
	/* The dense linears of a layer and the head (not the experts) are
	 * converted to F32 for each product, into one buffer per layer (and
	 * one for the head) kept until the layer is done (x3_linear_on_use):
	 * the forward holds one linear's F32 weight at a time instead of a
	 * whole layer's, for a conversion per product; the same bits.
	 * hessian-capture sets it (its peak memory). */
	int weights_on_use;
};

/* Open a HF model directory (config.json + safetensors, sharded or not,
 * F32/F16/BF16; or an EXL3 directory). Checks every tensor's presence and
 * shape against the config; errors name the tensor. opts may be NULL. */
int x3_model_open(const char *dir, const struct x3_model_opts *opts,
                  x3_model **out);
const x3_model_config *x3_model_cfg(const x3_model *m);
void x3_model_close(x3_model *m);

/* The input activations of a linear group, as the forward computes them. */
struct x3_capture {
	int layer;              /* 0..n_layers-1; n_layers for the head */
	const char *name;       /* the Hessian group (arch.h), e.g.
	                           "model.layers.3.self_attn.input" */
	const char *members;    /* comma list of the weights that read it */
	const char *tied;       /* the tensor its one member reads when that is
	                           another module's (a tied head), else NULL */
	const float *x;         /* (ntok, in) row-major */
	int64_t ntok, in;
	/* Mixture-of-experts layers: the expert whose linears read the group
	 * (-1: not an expert's); all_tokens 0: the rows routed to the expert,
	 * with their routing weights row_w (ntok; NULL elsewhere); else every
	 * token of the chunk (x3_forward_opts.moe_all_tokens): 1 the expert's
	 * own rows (its down_proj input), 2 the block's input, the same rows
	 * for every expert's gate/up group (a consumer may accumulate them
	 * once, e.g. from expert 0's call: experts come in number order). */
	int expert, all_tokens;
	const float *row_w;
};
/* Called once or more per layer and group (the tokens of a layer are
 * processed in chunks of whole rows); a non-zero return aborts the forward
 * and is returned by it. */
typedef int (*x3_capture_fn)(void *ctx, const struct x3_capture *c);

enum { X3_LOGITS_NONE = 0, X3_LOGITS_ALL, X3_LOGITS_LAST };

struct x3_forward_opts {
	x3_capture_fn hook;     /* may be NULL */
	void *hook_ctx;
	/* Only layers hook_first..hook_last (inclusive; n_layers = the head)
	 * call the hook. Layers after last_layer are not run at all (and
	 * there are no logits) when last_layer < n_layers. */
	int hook_first, hook_last, last_layer;
	int logits_mode;        /* X3_LOGITS_* */
	/* ALL: (rows*cols, vocab); LAST: (rows, vocab); caller-allocated */
	float *logits;
	int64_t chunk_tokens;   /* tokens per chunk within a layer; 0: 4096 */
	/* The rows in segments of seg_rows (0: one segment of all rows; the
	 * calibration chunks of hessian-capture): a chunk of chunk_tokens never
	 * spans two segments, and each segment's chunks start at its first row,
	 * so the batches a segment's rows run in (the MoE experts' batches
	 * among them) do not depend on the rows around it. seg_done (may be
	 * NULL) is called when a layer (n_layers: the head) has run over
	 * segment seg (0, 1, ...); a non-zero return aborts the forward. A
	 * mixture-of-experts layer runs in passes over its rows (below) and
	 * calls it in each pass, so more than once per segment: each call
	 * closes the segment for the groups the hook saw since the call
	 * before (a consumer that ends the open chunk of every sum it holds,
	 * as x3_hess_end_chunk does nothing for a sum without rows since,
	 * gets each group's chunks exactly at the segment boundaries). */
	int64_t seg_rows;
	int (*seg_done)(void *ctx, int layer, int64_t seg);
	void *seg_done_ctx;
	/* Called after each layer has run over all rows (layer n_layers: the
	 * head); may be NULL. A non-zero return aborts the forward. */
	int (*layer_done)(void *ctx, int layer, int n_layers);
	void *layer_done_ctx;
	/* Resume: start at layer first_layer from hidden, the hidden states
	 * entering that layer ((rows*cols, hidden) floats, e.g. saved through
	 * layer_input by an earlier forward over the same tokens and layers),
	 * instead of the embedding. The forward runs in this buffer (it is
	 * overwritten). NULL: from the embedding, first_layer is ignored. */
	float *hidden;
	int first_layer;
	/* Called with the hidden states (ntok, hidden) entering each layer
	 * before it runs (layer n_layers: the final norm and head), and with
	 * those entering layer last_layer + 1 when the forward stops before
	 * it (the output of the last layer run); may be NULL. A non-zero
	 * return aborts the forward. */
	int (*layer_input)(void *ctx, int layer, const float *x, int64_t ntok, int64_t hidden);
	void *layer_input_ctx;
	/* Where the linears multiply: X3_DEVICE_CPU (default) or
	 * X3_DEVICE_CUDA (resolved; device.h), see x3_linear_set_device. Each
	 * layer's weights go to the device when the layer runs; embedding,
	 * norms, RoPE, attention and the activation stay on the CPU. */
	int device;
	/* Mixture-of-experts capture: the hook always sees each expert's groups
	 * over the rows routed to it; for the chunks of a layer that start
	 * before token moe_all_tokens (0: none, INT64_MAX: every chunk) it also
	 * sees every expert's groups over all the chunk's tokens (all_tokens
	 * 1): gate/up over the block's input (the same rows for every expert:
	 * a consumer may accumulate them once), down_proj over that expert's
	 * activations of every token, as ExLlamaV3 captures experts. The
	 * forward's output does not change. */
	int64_t moe_all_tokens;
	/* Mixture-of-experts layers run expert-major: (A) for every chunk,
	 * the attention, the residual, the MLP's norm and the routing (kept
	 * for every token: top_k indices and weights); then (B) for each
	 * expert in number order: its weights made F32 (or read from EXL3),
	 * the chunks in order, each over the rows routed to the expert in that
	 * chunk (the batches of the chunk-major order, x3_moe_rows: the same
	 * products), its output weighted into an (ntok, hidden) sum kept for
	 * the layer, its weights freed; then (C) for every chunk, the shared
	 * expert (if any) added to that sum, and the sum to the residual: each
	 * token's output summed in expert order, then the shared expert, as
	 * the chunk-major order sums it: the same bits. The forward holds one
	 * expert's weights at a time (not every expert's), plus the sum (one
	 * more hidden-states-sized buffer, rows*cols*hidden floats) and the
	 * routing (rows*cols*top_k*8 bytes). The hook sees an expert's
	 * groups over every chunk before the next expert's, and the shared
	 * expert's after the last expert's. expert_done (may be NULL) is called
	 * with expert -1 once pass A is over every row (the groups before the
	 * experts are complete), and with e after expert e's pass (its groups
	 * are complete); a non-zero return aborts the forward.
	 * moe_chunk_major: the chunk-major order instead (each chunk through the
	 * whole layer, every expert's weights in F32 for the layer, expert_done
	 * not called): the same output and hook rows in another order; kept as
	 * the reference the expert-major order is tested against. */
	int (*expert_done)(void *ctx, int layer, int expert);
	void *expert_done_ctx;
	int moe_chunk_major;
	/* The multi-token prediction (MTP) layer (x3_model_config.n_mtp), run
	 * after the layers when set (last_layer n_layers): (rows * (cols - 1),
	 * vocab) caller-allocated, at row r, position t < cols - 1 the logits
	 * the MTP layer gives for the token at t + 2: its input
	 * fc([enorm(embed(token t + 1)) | hnorm(h_t)]), the embedding first as
	 * vLLM's and ExLlamaV3's MTP modules concatenate them, h_t the main
	 * model's last hidden state at t (the hybrids': after the final norm,
	 * as ExLlamaV3's Qwen3.5 MTP reads it; DeepSeek V3's and the GLMs':
	 * the residual stream before it), then its decoder layer (layer
	 * n_layers + 1 over positions 0..cols-2), its final norm and the
	 * model's head. */
	float *mtp_logits;
	/* Where the forward's wall time went, added to *timing (may be NULL) */
	struct x3_forward_timing *timing;
};
/* Wall seconds, added to by each forward (x3_now). On a device the queued
 * work counts where the host waits for it: mostly in linears. */
struct x3_forward_timing {
	double load;      /* layers' and experts' weights: opened, read, to the device */
	double linears;   /* the products, dense weights made F32 for each */
	double hook;      /* the capture hook */
	double callbacks; /* seg_done, layer_done, expert_done, layer_input */
	double total;     /* the whole forward, hook and callbacks included */
};
/* Set defaults: no hook, all layers, no logits. */
void x3_forward_opts_init(struct x3_forward_opts *o, const x3_model *m);

/* Causal forward of rows x cols token ids (each row from position 0). */
int x3_model_forward(x3_model *m, const int32_t *tokens, int64_t rows,
                     int64_t cols, const struct x3_forward_opts *o);

#endif
