/* synth.h: helpers shared by the unit tests (tests/unit/synth.c, linked
 * into every tests/unit/t* binary by the Makefile):
 *   - a scratch directory and paths in it, shell commands, a tensor
 *     written as a one-frame file (the tests that run programs);
 *   - seeded random weights and correlated activations with their Gram
 *     matrix (the quantizer tests' inputs);
 *   - a synthetic checkpoint kept as doubles (the table the model tests
 *     fill with seeded tensors and their plain references read), written
 *     as a safetensors model directory with its config.json, the reference
 *     forward's basic steps (RMS norm, matrix-vector product, causal GQA
 *     attention) and the comparison of the model library's logits with a
 *     reference;
 *   - the reference of DeepSeek's latent-attention model (t1555 DeepSeek-V3,
 *     t1575 GLM-4.7-Flash). */
#ifndef X3_TEST_SYNTH_H
#define X3_TEST_SYNTH_H
#include <stddef.h>
#include <stdint.h>
#include "x3.h"
#include "config.h"

/* ---- scratch files and commands -------------------------------------- */
/* mkdtemp $TMPDIR/NAME.XXXXXX (TMPDIR default /tmp); X3_OK or X3_EIO. */
int test_tmpdir(const char *name);
/* The scratch directory, and FILE in it (the last 8 results stay valid). */
const char *test_tmp(void);
const char *test_path(const char *file);
/* rm -rf the scratch directory; 0 when it is gone. */
int test_tmpdir_remove(void);
/* system() of the formatted command: its exit status, -1 if it did not exit. */
int test_run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* t as the only frame of a new file at path. */
int test_write_frame(const char *path, const x3_tensor *t);

/* ---- seeded weights and activations ---------------------------------- */
/* n values scale * N(0, 1) drawn from g (malloc'd). */
float *test_randn(x3_rng *g, int64_t n, double scale);
/* Correlated activations X = Z (I + c A) (rows, k), Z and A N(0, 1) from g
 * (A scaled by 1/sqrt(k)); malloc'd. */
float *test_corr_acts(x3_rng *g, int64_t rows, int64_t k, double c);
/* H = XᵀX (k, k) of X (rows, k), one SGEMM (calloc'd). */
float *test_gram(const float *X, int64_t rows, int64_t k);

/* The proxy error tr(Eᵀ H E) / max(tr(Aᵀ H A), 1e-8), E = A - B (k x n),
 * in plain double: the reference for x3_proxy_error. */
double test_proxy_ref(const float *A, const float *B, const float *H, int64_t k, int64_t n);
/* max |a - b| over n values; the same over max |b| (1 where b is all 0). */
double test_max_diff(const float *a, const float *b, size_t n);
double test_max_rel(const float *a, const float *b, size_t n);
/* x3_config_parse of a NUL-terminated config.json text. */
int test_config_parse(const char *json, x3_model_config *c);

/* ---- a synthetic checkpoint ------------------------------------------ */
#define SYNTH_MAX 512
struct synth_tens {
	char name[128];
	int r, c;        /* (r, c), or a vector of r when c == 0 */
	double *v;
	int mid;         /* > 0: written as (r / mid, mid, c) (a conv1d's
	                    (channels, 1, kernel), fused experts' 3-D tensors) */
	int omit;        /* kept for synth_get, not written */
};
extern struct synth_tens synth_t[SYNTH_MAX];
extern int synth_n;

/* Forget every tensor. */
void synth_reset(void);
/* Append NAME (r, c) with values mean + scale * N(0, 1) drawn from g. */
struct synth_tens *synth_add(const char *name, int r, int c, double scale, double mean, x3_rng *g);
/* The values of the tensor whose name is the formatted string, or NULL. */
const double *synth_get(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Round every value to what dtype dt stores (F32, F16 or BF16), so a
 * reference reads the values the checkpoint holds. */
void synth_round(x3_dtype dt);
/* Write the table in dt as a safetensors model directory dir (created if
 * missing; one module per tensor, shards of shard_bytes, 0: one file). */
int synth_write(const char *dir, x3_dtype dt, uint64_t shard_bytes);
/* The same with each tensor's dtype dt_of(name, dt) (dt_of NULL: dt). */
int synth_write_as(const char *dir, x3_dtype dt, x3_dtype (*dt_of)(const char *name, x3_dtype dt),
                   uint64_t shard_bytes);
/* The formatted text as dir/config.json (written atomically); X3_OK or the
 * error. */
int synth_write_config(const char *dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* synth_write(dir, dt, shard_bytes), then the formatted config.json. */
int synth_write_model(const char *dir, x3_dtype dt, uint64_t shard_bytes, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* y = x / sqrt(mean(x^2) + eps) * w, n values (y may be x). */
void synth_rms(double *y, const double *x, const double *w, int n, double eps);
/* y (out) = W (out, in) x (in) + b (out, or NULL). */
void synth_mv(double *y, const double *W, const double *b, const double *x, int out, int in);
/* Causal softmax attention of the query row q (nh heads of hd values) at
 * position n - 1 over rows 0 .. n - 1 of k and v (nkv heads of hd values a
 * row; query head h reads kv head h / (nh / nkv)), scores scaled by
 * 1 / sqrt(hd): a (nh * hd). sc: scratch of n values. */
void synth_attn(double *a, const double *q, const double *k, const double *v, int n, int nh, int nkv, int hd,
                double *sc);
/* The same, general: keys lo..n-1, values of hdv, scores times scale,
 * soft-capped to softcap * tanh(s / softcap) when softcap > 0; a (nh * hdv). */
void synth_attn_ex(double *a, const double *q, const double *k, const double *v, int n, int lo,
                   int nh, int nkv, int hd, int hdv, double scale, double softcap, double *sc);

/* The model library's forward of the checkpoint in dir against a reference:
 * rows x cols tokens (i * 7 + 3) mod vocab, every position's logits,
 * ref(ctx, tokens of one row, cols, logits (cols, vocab)) per row. Returns
 * max |ref - model| / max |ref| (1e9 when the model does not open or run);
 * the model's logits (rows * cols, vocab) in *lgo (malloc'd) when lgo is set. */
typedef void synth_ref_fn(const void *ctx, const int32_t *tok, int n, double *logits);
double synth_compare(const char *dir, int rows, int cols, int vocab, synth_ref_fn *ref, const void *ctx,
                     float **lgo);
/* The same over the caller's tokens tok (rows x cols). */
double synth_compare_tok(const char *dir, const int32_t *tok, int rows, int cols, int vocab, synth_ref_fn *ref,
                         const void *ctx, float **lgo);

/* ---- DeepSeek's multi-head latent attention model (the reference) ----- */
/* A DeepSeek-V3-style model (modeling_deepseek_v3.py; GLM-4.7-Flash's
 * modeling_glm4_moe_lite.py is the same model) as the table of synth_add
 * holds it, tensors under Hugging Face's names (biases read where present). */
struct synth_mla {
	int hidden, inter, layers, heads, vocab;
	int q_lora, kv_lora, nope, rope, vd;    /* q_lora 0: a plain q_proj */
	int E, K, moe_inter, shared_inter;      /* experts, top k, their widths */
	int n_group, topk_group, norm_topk;     /* the routing's groups */
	double routed_scale;                    /* routed_scaling_factor */
	unsigned dense;                         /* bit l: layer l is dense */
	double eps, lat_eps;                    /* the norms' epsilon; q_a's and kv_a's */
	double softmax_scale;
	int interleave;                         /* rope_interleave */
	double inv_freq[32];                    /* the rope part's inverse frequencies (rope / 2) */
	double rope_factor;                     /* cos and sin times this (yarn's attention factor) */
};
/* Its logits (n, vocab) for the tokens tok (n), in double, position by
 * position: naive attention over the decompressed keys and values of every
 * position (kv_b applied per position, every head its own key: nope part |
 * the shared rope key), the rope part rotated the Hugging Face way (with
 * interleave de-interleaved first, then rotate-half); the routing per
 * token by sorting: sigmoid scores, the choice on score +
 * e_score_correction_bias, the best topk_group of n_group groups (each by
 * the sum of its two best), top k, weights from the plain scores
 * (renormalized with norm_topk), times routed_scale; the shared experts
 * added. A synth_ref_fn with ctx the struct synth_mla. */
void synth_mla_forward(const void *ctx, const int32_t *tok, int n, double *logits);

#endif
