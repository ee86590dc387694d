/* model.h: the Llama-family causal LM on CPU (F32, OpenBLAS GEMMs, OpenMP
 * attention), for calibration (Hessian capture) and evaluation.
 *
 * Architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
 * (q/k/v biases), Qwen3ForCausalLM (per-head q/k RMSNorm). GQA, RoPE in the
 * rotate_half convention with rope_theta and the "default", "linear" and
 * "llama3" rope_scaling types, tied or separate lm_head, SiLU-gated MLP.
 *
 * The forward runs layer by layer over all token rows: the hidden states of
 * every token are kept (rows*cols*hidden floats), one layer's weights are
 * converted to F32 from the mmap'd safetensors when the layer runs and freed
 * after it. Any linear may come from an EXL3 model directory instead (a
 * quantized checkpoint read through lib/exl3.h), either the whole model
 * (open the EXL3 directory itself) or, for sequential calibration, a range of
 * layers of an otherwise original model (x3_model_opts.overlay_dir), or
 * linear by linear (x3_model_opts.patch_dir). */
#ifndef X3_MODEL_H
#define X3_MODEL_H

#include "x3.h"

enum { X3_ARCH_LLAMA, X3_ARCH_MISTRAL, X3_ARCH_QWEN2, X3_ARCH_QWEN3, X3_ARCH_MIXTRAL,
       X3_ARCH_QWEN2_MOE, X3_ARCH_QWEN3_MOE };

struct x3_arch_desc;
typedef struct x3_model_config {
	char arch_name[64];     /* "LlamaForCausalLM", ... */
	int arch;               /* X3_ARCH_* */
	const struct x3_arch_desc *desc;  /* its modules (arch.h) */
	int64_t hidden, intermediate, n_layers, n_heads, n_kv_heads, head_dim;
	int64_t vocab, max_pos;
	double rope_theta, rms_eps;
	/* rope_scaling: 0 none/default, 1 linear, 2 llama3 */
	int rope_type;
	double rope_factor, rope_low_freq, rope_high_freq;
	int64_t rope_orig_max_pos;
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
	int64_t sparse_step;     /* decoder_sparse_step: layer l is sparse when
	                            (l + 1) % sparse_step == 0 ... */
	uint64_t mlp_only[16];   /* ... and it is not in mlp_only_layers (bits) */
	int quantized;           /* config has an exl3 quantization_config */
	int foreign_quant;       /* ... one of another quant_method */
} x3_model_config;

/* Parse config.json text (lib/config.c, the toolkit's one parser). The
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
/* Read DIR/config.json. */
int x3_config_load_as(const char *dir, unsigned what, x3_model_config *cfg);
int x3_config_load(const char *dir, x3_model_config *cfg);

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
	 * A trellis that is no linear of the model is an error. (A model with
	 * one tensor or group quantized: convert --sensitivity.) */
	const char *patch_dir;
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
	 * before it runs (layer n_layers: the final norm and head); may be
	 * NULL. A non-zero return aborts the forward. */
	int (*layer_input)(void *ctx, int layer, const float *x, int64_t ntok, int64_t hidden);
	void *layer_input_ctx;
	/* Where the linears multiply: X3_DEVICE_CPU (default) or
	 * X3_DEVICE_CUDA (resolved; device.h), see x3_linear_set_device. Each
	 * layer's weights go to the device when the layer runs; embedding,
	 * norms, RoPE, attention and the activation stay on the CPU. */
	int device;
};
/* Set defaults: no hook, all layers, no logits. */
void x3_forward_opts_init(struct x3_forward_opts *o, const x3_model *m);

/* Causal forward of rows x cols token ids (each row from position 0). */
int x3_model_forward(x3_model *m, const int32_t *tokens, int64_t rows,
                     int64_t cols, const struct x3_forward_opts *o);

#endif
