/* model_impl.h: what the forward's files share and nothing outside
 * lib/model/ sees: the open model, a layer's weights, the forward's state
 * over a chunk of rows, and the entry points between the files:
 *   model_load.c  a layer's weights (dense, EXL3, kept matrices, experts
 *                 on use), the head, x3_model_open's checks;
 *   rope.c        RoPE frequencies, cos/sin tables and the rotation;
 *   model_attn.c  attention (plain, sliding, sinks, the hybrids' gated
 *                 attention and Gated DeltaNet layers) and its residual;
 *   model_mla.c   multi-head latent attention and the sparse attention's
 *                 key selection;
 *   model_moe.c   the mixture-of-experts layers (chunk-major and
 *                 expert-major) and the shared expert;
 *   model.c       the driver: chunks, the capture hook, timing, the dense
 *                 MLP, the final norm, the head and the logits. */
#ifndef X3_MODEL_IMPL_H
#define X3_MODEL_IMPL_H

#include "arch.h"
#include "attention.h"
#include "indexer.h"
#include "device.h"
#include "model.h"
#include "safetensors.h"
#include "linear.h"
#include "moe.h"
#include "gdn.h"
#include "blas.h"

struct x3_model {
	x3_model_config cfg;
	x3_st *st;              /* the model */
	x3_st *ov;              /* overlay (layers ov_first..ov_last) or NULL */
	int ov_first, ov_last;
	x3_st *patch;           /* linears replaced one by one (patch_dir) or NULL */
	const x3_tensor *embed; /* borrowed (vocab, hidden) */
	x3_module *mods;        /* every module, model order (arch.h) */
	int nmods;
	int *slot;              /* (n_layers + 1 + n_mtp, X3_SLOT_COUNT): index into
	                           mods, -1 if absent; row n_layers: the modules
	                           before and after the layers; row n_layers + 1:
	                           the multi-token prediction layer's */
	int on_use;             /* x3_model_opts.weights_on_use */
};

/* The module of a slot in layer l (l = n_layers: outside the layers). */
static inline const x3_module *mod(const x3_model *m, int l, int s)
{
	int i = m->slot[(size_t)l * X3_SLOT_COUNT + s];
	return i < 0 ? NULL : &m->mods[i];
}

/* ---- a layer's weights (model_load.c) ----------------------------------- */
struct layer_w {
	x3_linear *lin[X3_SLOT_COUNT];
	float *vec[X3_SLOT_COUNT];      /* norms: (hidden) or (head_dim); the
	                                   router and the shared-expert gate */
	int sparse, nex;                /* a mixture-of-experts layer; experts */
	x3_linear **ex;                 /* (nex, 3): gate, up, down */
	const x3_module **exm;          /* their modules */
	x3_wbuf wb;                     /* the on-use F32 weights (x3_linear_on_use) */
};

/* Gemma's RMSNorm scales by 1 + w (in F32, as Hugging Face's
 * Gemma2RMSNorm/Gemma3RMSNorm): the stored w becomes 1 + w on load. */
void x3m_gemma_norm(float *w, int64_t n);
/* A 1-D vector tensor of length n as F32 (check only when out == NULL). */
int x3m_load_vec(x3_st *st, const char *name, int64_t n, float **out);
/* Load (or with check set, only validate) the weights of layer l; the
 * experts' linears too with all_ex, else their modules only (x3m_expert_open
 * opens them one expert at a time). */
int x3m_layer_load(const x3_model *m, int l, int check, int all_ex, struct layer_w *w);
void x3m_layer_free(struct layer_w *w);
/* The layer's dense linears to device (x3_linear_set_device). */
int x3m_layer_to_device(struct layer_w *w, int device);
/* Open the three linears of expert e of layer l (gate, up, down: F32
 * copies of a dense checkpoint's weights, or EXL3); free them. */
int x3m_expert_open(const x3_model *m, int l, struct layer_w *w, int e);
void x3m_expert_free(struct layer_w *w, int e);
/* The multi-token prediction layer's projection (fc / eh_proj) and its
 * three norms, vec[0] the embedding's, vec[1] the hidden state's, vec[2]
 * its final norm (F32, (1 + w) for the hybrids); its decoder layer is
 * layer n_layers + 1 (x3m_layer_load). X3_EUNSUP without one. */
int x3m_mtp_load(const x3_model *m, x3_linear **fc, float **vec);
/* The head: its own weight (dense or EXL3), else the embedding when tied. */
int x3m_head_open(const x3_model *m, int check, x3_linear **out);

/* ---- RoPE (rope.c) ------------------------------------------------------ */
/* The dimensions RoPE rotates: the head's first rot_dim
 * (partial_rotary_factor; all of it by default), or MLA's rope part. */
int64_t x3m_rope_dim(const x3_model_config *c);
/* The cos and sin tables (cols, rope_dim/2) of positions 0..cols-1 with
 * c's frequencies and rope_scaling (yarn and longrope scale them by their
 * attention factor); fr: rope_dim/2 doubles of scratch. */
void x3m_rope_table(const x3_model_config *c, int64_t cols, double *fr, float *cosv, float *sinv);
/* RoPE in place on the rd dimensions at offset off of (ntok, nh, stride)
 * vectors; position of token t is t % cols. cosv, sinv: (cols, rd/2).
 * Rotate-half pairs (i, i + rd/2), or with interleave the pairs (2i, 2i+1). */
void x3m_rope_part(float *x, int64_t ntok, int64_t nh, int64_t stride, int64_t off, int64_t rd,
                   int interleave, int64_t cols, const float *cosv, const float *sinv);
/* Rotate-half RoPE in place on the first rd dimensions of (ntok, nh, hd)
 * vectors (rd < hd: partial_rotary_factor, the rest unrotated). */
void x3m_rope_apply(float *x, int64_t ntok, int64_t nh, int64_t hd, int64_t rd, int64_t cols,
                    const float *cosv, const float *sinv);

/* ---- the forward's state and helpers (model.c) -------------------------- */
struct fwd {
	x3_model *m;
	const struct x3_forward_opts *o;
	int64_t cols;
	float *xn, *q, *k, *v, *a, *g, *u, *mo;
	float *cosv, *sinv;
	float *cosl, *sinl;     /* the sliding layers' RoPE (rope_local_theta) or NULL */
	int64_t tok0;           /* the chunk's first token in the layer */
	float *qa, *kva, *ckv, *kvb;   /* MLA: q_a, kv_a, normed latent, kv_b outputs */
	float *qg;                     /* hybrids: q_proj's [query | gate] per head,
	                                  then the gates (nt, heads * head_dim) */
	float *gp, *gmix, *gz, *gb, *ga;   /* ... the DeltaNet's projections:
	                                      qkvz, [q | k | v], z, b, a */
	/* sparse attention (rows longer than index_topk): the indexer's
	 * queries, keys and head weights of a chunk, and the selections of
	 * every token (x3_sel_stride(cols) bytes each) made by the last layer
	 * run with an indexer (sel_layer, -1: none yet) */
	float *iq, *ik, *iw;
	uint8_t *sel;
	int sel_layer;
};

/* y = rmsnorm(x) * w over rows of n (HF: x * rsqrt(mean(x^2) + eps) * w) */
void x3m_rmsnorm(float *y, const float *x, const float *w, int64_t rows, int64_t n, double eps);
/* x3_linear_apply, its time in the forward's timing */
int x3m_lin_apply(const struct fwd *f, x3_linear *l, const float *x, int64_t rows, int64_t seg,
                  float *y);
/* The capture hook for the Hessian group that the module of slot s of
 * layer l reads. */
int x3m_hook(struct fwd *f, int layer, int s, const float *x, int64_t ntok, int64_t in);
/* ... of an expert's group (x3_capture's expert, all_tokens, row_w) */
int x3m_hook_ex(struct fwd *f, int layer, const x3_module *d, const float *x, int64_t ntok,
                int64_t in, int all, const float *row_w);
/* Rows of the chunk that starts at row r0: chunk_rows, cut at the end of
 * r0's segment of seg rows (x3_forward_opts.seg_rows). */
int64_t x3m_chunk_len(int64_t r0, int64_t chunk_rows, int64_t seg, int64_t rows);
/* a callback's time in the forward's timing: t0 = x3m_cb_start(o) before
 * it, rc = x3m_cb_end(o, t0, rc) after */
double x3m_cb_start(const struct x3_forward_opts *o);
int x3m_cb_end(const struct x3_forward_opts *o, double t0, int rc);
/* seg_done when the chunk that ended at row e closed a segment */
int x3m_seg_after(const struct x3_forward_opts *o, int l, int64_t e, int64_t seg, int64_t rows);

/* ---- attention (model_attn.c, model_mla.c) ------------------------------ */
/* The attention of a layer on a chunk of nrows rows and its residual: x
 * (ntok, hidden) updated in place. */
int x3m_attn_chunk(struct fwd *f, int l, const struct layer_w *w, float *x, int64_t nrows);
/* Multi-head latent attention of a chunk of nrows rows from the normed
 * hidden f->xn into f->a (nt, heads * v_head_dim). */
int x3m_mla_chunk(struct fwd *f, int l, const struct layer_w *w, int64_t nrows);

/* ---- mixture of experts (model_moe.c) ----------------------------------- */
/* The MLP of a mixture-of-experts layer on xn (nt, hidden), chunk-major
 * (x3_forward_opts.moe_chunk_major): into f->mo. */
int x3m_moe_chunk(struct fwd *f, int l, const struct layer_w *w, int64_t nt);
/* A mixture-of-experts layer l over all rows x (rows * cols, hidden),
 * expert-major (x3_forward_opts.expert_done). */
int x3m_moe_layer(struct fwd *f, int l, struct layer_w *w, float *x, int64_t rows,
                  int64_t chunk_rows, int64_t seg);

#endif
