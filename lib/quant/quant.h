/* quant.h: the EXL3 quantizer on CPU (exl3(5) §9): Hessian finalization
 * and block LDL, regularization, global scale search, LDLQ with the
 * tail-biting Viterbi of codec.h, fallback quantization, proxy error, and
 * the frame glue shared by had-rotate and trellis-encode.
 *
 * Orientation: EXL3 works on W = W_hf^T, shape (k, n) = (in, out), rows are
 * input channels. Both dimensions are zero-padded to multiples of 128; every
 * array below uses the padded sizes unless it says otherwise. All matrices
 * are row-major float.
 *
 * Determinism: the random signs come from x3_rng (integer only, portable);
 * every reduction has a fixed order independent of the thread count. Dense
 * algebra goes through BLAS/LAPACK, so bit-identical results across
 * machines additionally need the same BLAS kernels. */
#ifndef X3_QUANT_H
#define X3_QUANT_H

#include "x3.h"

#define X3_QPAD 128                    /* pad_to of ExLlamaV3's Linear (exl3(5) §1.1) */
#define X3_QBLOCK 16                   /* LDL block = tile edge (exl3(5) §9.1 step 7) */
#define X3_QSPAN 128                   /* buf_size_k of ldlq (exl3(5) §9.4) */
#define X3_SIGMA_REG 0.025             /* damping, sigma_reg (exl3(5) §9.1 step 4) */
#define X3_LDL_RETRIES 10              /* extra-damping retries (exl3(5) §9.1 step 7) */

static inline int64_t x3_pad128(int64_t d) { return (d + X3_QPAD - 1) / X3_QPAD * X3_QPAD; }

/* out_scales policy (exl3(5) §9.2, --out-scales). */
enum { X3_OUT_SCALES_ALWAYS = 0, X3_OUT_SCALES_NEVER = 1, X3_OUT_SCALES_AUTO = 2 };
int x3_out_scales_parse(const char *s, int *policy);
const char *x3_out_scales_name(int policy);

/* Sign vector in {-1,+1}^n from (seed, name): x3_rng stream
 * x3_rng_stream_of(name), one bit per element. Tensors that share a
 * Hessian derive their input signs from the Hessian's name, so they agree. */
void x3_quant_signs(uint64_t seed, const char *name, int64_t n, float *sign);

/* The signs of sign draw `draw` (for the sign search): draw 0
 * is x3_quant_signs(seed, name), draw d > 0 the stream of "name#d". */
void x3_quant_signs_draw(uint64_t seed, int draw, const char *name, int64_t n, float *sign);

/* ---- Hessian (exl3(5) §9.1) ------------------------------------------ */
typedef struct x3_qhess {
	int64_t k;         /* padded size */
	float *sign;       /* (k) sigma_u */
	float *diag;       /* (k) damped diagonal before rotation; NULL without H */
	float *H;          /* (k, k) rotated, damped Hessian; NULL in fallback */
	float *L;          /* (k, k) block-normalized LDL factor, strictly
	                      block-lower (L[r][c] != 0 only if r/16 > c/16);
	                      NULL in fallback */
	double count;      /* rows accumulated (0 without H) */
	double diag_mean;  /* mean diagonal after normalization, before damping */
	int fallback;      /* no usable Hessian: quantize without error feedback */
	int retries;       /* extra damping rounds the Cholesky needed */
	char why[200];     /* reason for fallback, "" if none */
} x3_qhess;

/* Finalize a captured Hessian H (kh x kh, the sum of x^T x over count rows;
 * kh = the unpadded or the padded input size) into k x k (k = pad128(kh)
 * or kh when already padded): normalize, damp 0.025*mean diag, rotate with
 * sign (k values), block LDL with up to 10 retries at +0.05*mean diag.
 * A count <= 0, a non-finite H, a mean diagonal < 1e-20 or a Cholesky that
 * still fails give a fallback result (X3_OK, ->fallback = 1, ->why set).
 * H is not modified. Errors: bad sizes, allocation. */
int x3_qhess_finalize(const float *H, int64_t kh, int64_t k, double count,
                      const float *sign, x3_qhess **out);
/* The damping of x3_qhess_finalize, sigma_reg (default X3_SIGMA_REG, for
 * every caller of this process): the mean diagonal times s is added before
 * the rotation, and 2 s times it per CPU retry (the GPU backend's retries
 * keep 2 X3_SIGMA_REG). X3_EINVAL outside (0, 1]. */
int x3_quant_set_sigma_reg(double s);
double x3_quant_sigma_reg(void);
/* Refinement passes after LDLQ (default 0), for every x3_quantize* of this
 * process: each re-encodes every 16-row block with the error of all the
 * others known (LDLQ knows the ones below it only) and keeps the new codes
 * where they lower the proxy error, so it never rises; each costs one more
 * Viterbi of every tile. X3_EINVAL outside 0..X3_LDLQ_PASSES_MAX. */
#define X3_LDLQ_PASSES_MAX 8
int x3_quant_set_ldlq_passes(int p);
int x3_quant_ldlq_passes(void);
/* Where x3_qhess_finalize and x3_regularize compute (for all callers; the
 * default is the CPU, the reference): X3_DEVICE_CUDA runs their Hadamard
 * rotations (device.h had128_rows/cols) and the block LDL with its damping
 * retries (block_ldl_retry) on the GPU backend; sign and scale
 * multiplies, normalization and damping stay on the CPU. Results are equal
 * to the CPU's up to F32 rounding, not bit for bit, so trellis words
 * encoded from them can differ. X3_EUNSUP without a usable device. */
int x3_quant_set_device(int dev);
/* Where the LDLQ of x3_quantize* runs (default the CPU, whose Viterbi
 * x3_viterbi_set_backend may move to the GPU, bit for bit): X3_DEVICE_CUDA
 * runs the whole LDLQ on the GPU backend (device.h ldlq: the feedback
 * products on cuBLAS, the Viterbi on the device, nothing back on the host
 * between blocks). Its feedback equals the CPU's up to F32 rounding, so
 * the codes and proxy errors differ (t1740: proxy error within 2%); the
 * refinement passes, the scale search and the proxy error stay where they
 * were. X3_EUNSUP without a usable device. */
int x3_quant_set_ldlq_device(int dev);
/* No Hessian at all (uncalibrated): fallback with signs only. */
int x3_qhess_none(int64_t k, const float *sign, x3_qhess **out);
void x3_qhess_free(x3_qhess *h);

/* Block LDL of a symmetric positive definite A (k x k, k % 16 == 0),
 * in place: on X3_OK, A holds L' (unit block-lower triangular with the
 * diagonal blocks zeroed, i.e. A = (L'+I) D (L'+I)^T for block diagonal D).
 * X3_ENUM if the Cholesky fails (A is then garbage). */
int x3_block_ldl(float *A, int64_t k);

/* out_scales "auto" decision from the damped diagonal d (k values):
 * skew = sum of the top floor(k/50) sqrt(d) / sum of all; *apply = 1 iff
 * skew < 0.15. X3_OK, or X3_ENOMEM (*apply = 0, *skew = 0). */
int x3_out_scales_auto(const float *d, int64_t k, double *skew, int *apply);

/* ---- regularization (exl3(5) §9.2) ----------------------------------- */
typedef struct x3_qweight {
	int64_t k0, n0;    /* original in and out features */
	int64_t k, n;      /* padded */
	float *W;          /* (k, n) regularized weight, before the global scale */
	float *su;         /* (k) input scales, before the global scale */
	float *sv;         /* (n) output scales */
	int out_scales;    /* 1 if output scales were applied */
	int zeros;         /* 1 if the source was all zero */
} x3_qweight;

/* Regularize W_hf (n0 x k0, HF orientation out x in, any float values):
 * round to fp16 as ExLlamaV3's loader does, transpose, pad, then exl3(5) §9.2 steps
 * 1-9. h->sign is sigma_u, sign_v (n = pad128(n0) values) is sigma_v.
 * policy: X3_OUT_SCALES_*; auto uses h->diag and means "never" when h is a
 * fallback. X3_ENUM (naming row and column) on NaN/Inf or fp16 overflow;
 * X3_EINVAL if h->k != pad128(k0). */
int x3_regularize(const float *W_hf, int64_t n0, int64_t k0, const x3_qhess *h,
                  const float *sign_v, int policy, x3_qweight **out);
/* Wrap existing arrays (taken over, freed by x3_qweight_free). */
x3_qweight *x3_qweight_wrap(int64_t k0, int64_t n0, int64_t k, int64_t n,
                            float *W, float *su, float *sv);
void x3_qweight_free(x3_qweight *w);

/* ---- quantization (exl3(5) §9.3-§9.5) -------------------------------- */
/* Sample tiles for the scale search (exl3(5) §9.3) from W (k x n): writes up to
 * x3_scale_sample_max(k, n) tiles of 256 values in trellis order into
 * tiles, returns the count, or -1 when out of memory (x3_errmsg says so). */
int64_t x3_scale_sample_max(int64_t k, int64_t n);
int64_t x3_scale_sample(const float *W, int64_t k, int64_t n, float *tiles);
/* Global scale search over the sampled tiles: coarse grid, fine grid,
 * parabolic refinement. x3_scale_search_cap uses at most cap of the sampled
 * tiles (evenly spaced in sample order; cap <= 0: all of them, ExLlamaV3's
 * search); x3_scale_search caps at x3_scale_sample_cap(k, n), which keeps
 * the search's Viterbi work within 1/8 of the encode's (at least
 * X3_SCALE_MIN_TILES tiles): equal to the full sample from about 4096x4096
 * on, a bounded share of the encode below. */
#define X3_SCALE_MIN_TILES 16
/* the fine grid around a given centre (x3_quantize_g's refine) slides at
 * most this many 0.075 steps while its best scale is an end of the grid */
#define X3_SCALE_WALK 8
int64_t x3_scale_sample_cap(int64_t k, int64_t n);
int x3_scale_search(const float *W, int64_t k, int64_t n, int K, int cb,
                    int threads, double *g);
int x3_scale_search_cap(const float *W, int64_t k, int64_t n, int K, int cb,
                        int threads, int64_t cap, double *g);

/* LDLQ (exl3(5) §9.4): quantize W (k x n) bottom-up in 16-row blocks with error
 * feedback through L (k x k strictly block-lower), or without feedback when
 * L is NULL (fallback, exl3(5) §9.5). Writes the states (k/16, n/16, 256 in trellis
 * order) and the decoded values Q (k x n, fp16-exact). */
int x3_ldlq(const float *W, int64_t k, int64_t n, const float *L, int K,
            int cb, int threads, uint16_t *states, float *Q);

/* Proxy error tr(E^T H E) / max(tr(W^T H W), 1e-8), E = W - Q, H (k x k)
 * symmetric (read at and right of its diagonal blocks of 256 rows); with H
 * NULL, the plain mean squared error of E. */
int x3_proxy_error(const float *W, const float *Q, const float *H, int64_t k,
                   int64_t n, double *err);
/* Which form of its products x3_proxy_error runs: "avx512", "avx2" (with
 * FMA) or "ref" (fmaf, the plain C reference), the widest the processor
 * has unless X3_PROXY_PATH (ref or avx2) narrows it. All give the same
 * bits (one fused multiply-add per step, in the same order). */
const char *x3_proxy_path(void);
/* Choose that form (for tests and benchmarks): X3_EUNSUP where the
 * processor lacks it, X3_EINVAL for another name. */
int x3_proxy_set_path(const char *name);

typedef struct x3_qresult {
	int K, cb;
	int64_t k, n;
	uint16_t *trellis; /* (k/16, n/16, 16K) packed words (exl3(5) §3.2) */
	uint16_t *suh;     /* (k) fp16 bits of su/g */
	uint16_t *svh;     /* (n) fp16 bits of sv */
	float *Q;          /* (k, n) decoded W~, only with X3_QKEEP_Q */
	float *Wg;         /* (k, n) g * W_reg (what was quantized), X3_QKEEP_W */
	double g;          /* global scale */
	double proxy_err;  /* exl3(5) §9.5; 0 for an all-zero source (output is exact) */
	double proxy_err_before; /* before x3_refit_out_scales (set by it; else 0) */
	double seconds;
	/* where seconds went (wall): the scale search, LDLQ, the refinement
	 * passes, the proxy error, and the Viterbi calls within all of them
	 * (on whatever backend x3_viterbi_set_backend chose) */
	double t_search, t_ldlq, t_refine, t_proxy, t_viterbi;
	int fallback;
	int64_t search_tiles;  /* tiles the Viterbi encoded in the scale search */
	int64_t ldlq_tiles;    /* ... and in LDLQ (each distinct tile of a batch once),
	                          its refinement passes included */
	int64_t refine_kept;   /* 16-row blocks whose re-encoding a refinement
	                          pass kept (x3_quant_set_ldlq_passes) */
	int64_t nstrips;       /* 16-column output strips quantized (n / 16) */
	int64_t strips_total;  /* of the weight's (its padded n / 16) */
	int64_t *strip;        /* (nstrips) their indices, x3_quantize_sample only */
} x3_qresult;

#define X3_QKEEP_Q 1
#define X3_QKEEP_W 2

/* The whole per-K step: scale search, LDLQ (or fallback), proxy error,
 * packing, suh/svh. h may be a fallback. keep: X3_QKEEP_* flags. */
int x3_quantize(const x3_qweight *w, const x3_qhess *h, int K, int cb,
                int threads, int keep, x3_qresult **out);
/* x3_quantize at the global scale g when g > 0 (no scale search: its
 * search_tiles are 0; e.g. the scale a sampled measurement at this K
 * found), else x3_quantize itself. With refine and g > 0 the search's
 * fine grid only (5 scales, 0.075 apart, on the whole weight's tile
 * sample), centred on g instead of the coarse grid's best: a scale found
 * on a few tiles made good at under half the search's work. X3_EINVAL on
 * a negative or non-finite g. */
int x3_quantize_g(const x3_qweight *w, const x3_qhess *h, int K, int cb,
                  int threads, int keep, double g, int refine, x3_qresult **out);
void x3_qresult_free(x3_qresult *r);

/* ---- sign search ---------------------------------------------------- */
/* The error of x3_quantize, estimated cheaply: LDLQ of `strips` 16-column
 * strips of W only, evenly spaced over the n/16 (LDLQ feeds the error back
 * along the input, so a strip of output columns quantizes as in the whole
 * matrix; strips <= 0 or >= n/16: all of them), at the global scale *g if
 * *g > 0, else at x3_quantize's (scale search), written to *g. metric:
 * X3_EST_PROXY, the proxy error over those columns (with all strips and the
 * searched scale, x3_quantize's proxy_err exactly), or X3_EST_OUTPUT, the
 * error weighed by M = R H R, R = Hb diag(|su|) Hb: the Hessian seen through
 * the input scales, so that tr(E^T M E) / tr(W^T M W) is the relative output
 * error of the reconstruction (exl3(5) section 1.2) up to the output scales;
 * the proxy error in fallback. 0 for an all-zero source. */
enum { X3_EST_PROXY = 0, X3_EST_OUTPUT = 1 };
int x3_quantize_estimate(const x3_qweight *w, const x3_qhess *h, int K, int cb,
                         int threads, int64_t strips, int metric, double *g, double *err);
/* Default strips of the estimate: an eighth of the n/16, at least
 * X3_EST_MIN_STRIPS (all of them when fewer). */
#define X3_EST_MIN_STRIPS 8
int64_t x3_estimate_strips(int64_t n);
/* A measurement from a sample of the weight: the per-K
 * step on ceil(frac * n/16) of its 16-column output strips (at least
 * X3_SAMPLE_MIN_STRIPS, all of them when fewer),
 * chosen by x3_sample_strips(n, frac, seed, name). LDLQ works along the
 * input dimension and a tile lies within one strip, so the strips quantize
 * independently: with every strip chosen (frac = 1) the result equals
 * x3_quantize's bit for bit. The scale search samples the whole weight
 * as x3_quantize's does, with its tile cap in proportion (ceil(cap *
 * chosen / all), cap = x3_scale_sample_cap of the whole), so the
 * measurement's whole Viterbi work is about frac of x3_quantize's. With
 * predict the search skips its coarse grid (on a few tiles little better
 * than a guess) and slides the fine grid from a scale predicted from the
 * sampled tiles' RMS: about half the search's work, and on stories260K a
 * closer estimate (proxy_err vs the whole's full encode: mean log ratio
 * +0.03, rms 0.13, against +0.10, 0.29 with the coarse grid). proxy_err is
 * the sample's tr(E^T H E) / tr(W^T H W), an estimate of the weight's; r->n
 * = 16 * nstrips, trellis (k/16, nstrips, 16K) and svh (r->n) are those of
 * the chosen strips, r->strip their indices. */
int x3_quantize_sample(const x3_qweight *w, const x3_qhess *h, int K, int cb, int threads,
                       double frac, int predict, uint64_t seed, const char *name,
                       x3_qresult **out);
#define X3_SAMPLE_MIN_STRIPS 2
/* The strips a sample takes: m = ceil(frac * n/16) clamped to
 * X3_SAMPLE_MIN_STRIPS..n/16 (n/16 when fewer)
 * indices, ascending, written to strip (room for n/16): one drawn
 * uniformly from each of the m runs [j ns/m, (j+1) ns/m) of the ns = n/16
 * strips (stratified), by x3_rng (seed, stream of name + "/strips").
 * Returns m (0 when n < 16). */
int64_t x3_sample_strips(int64_t n, double frac, uint64_t seed, const char *name, int64_t *strip);

/* ---- output scales refit -------------------------------------------- */
/* After the trellis is chosen, refit each output channel's scale by least
 * squares: with a_j, b_j column j of Wg Hb_n and Q Hb_n (the target and the
 * decoded trellis with the output Hadamard undone, where svh scales one
 * column each), alpha_j = (a_j^T M b_j) / (b_j^T M b_j) minimizes column j's
 * error (a_j - alpha_j b_j)^T M (a_j - alpha_j b_j); svh_j becomes
 * fp16(sv_j alpha_j). M: the rotated Hessian h->H (X3_EST_PROXY) or the
 * output metric Hb diag(|su|) Hb H Hb diag(|su|) Hb (X3_EST_OUTPUT); the
 * identity in fallback. r must come from x3_quantize with X3_QKEEP_Q |
 * X3_QKEEP_W (the whole weight). r->proxy_err becomes the proxy error of
 * the stored reconstruction (Q_eff = Q Hb_n diag(alpha) Hb_n against Wg,
 * fp16 rounding of svh aside), the old one goes to r->proxy_err_before.
 * alpha (n values) receives the factors if not NULL; 1 where the column or
 * its scale is zero. The trellis and suh are unchanged. */
int x3_refit_out_scales(const x3_qweight *w, const x3_qhess *h, int metric, x3_qresult *r,
                        double *alpha);

/* Dense reconstruction W = diag(suh) Hb_k W~ Hb_n diag(svh) (exl3(5) §1.2), in the
 * EXL3 orientation (k x n), from decoded W~ (k x n). */
int x3_reconstruct(const float *Wt, const uint16_t *suh, const uint16_t *svh,
                   int64_t k, int64_t n, float *W);

/* Storage bytes of one linear (exl3(5) §2.8): trellis + suh + svh + marker + bias. */
int64_t x3_quant_bytes(int64_t k, int64_t n, int K, int cb, int has_bias);

/* ---- frame glue (qframe.c) --------------------------------------------- */
/* Role of a frame in the had-rotate / trellis-encode stream: metadata
 * "role" if present, else inferred ("hessian" for a "count" key or a name
 * ending in ".hessian", "bias" for ".bias", "weight" otherwise). */
const char *x3_qframe_role(const x3_tensor *t);
/* Weight key: the name minus ".weight" (or minus ".<role>" of a known
 * had-rotate role), into buf. */
const char *x3_qframe_key(const x3_tensor *t, char *buf, size_t len);

/* Finalize a Hessian frame (F32/F64, square, metadata "count") for a
 * weight with k0 inputs; the input signs come from (seed, frame name). */
int x3_qhess_from_frame(const x3_tensor *Ht, int64_t k0, uint64_t seed,
                        x3_qhess **out);
/* Regularize a weight frame (F32/F16/BF16, rank 2, out x in). sigma_v comes
 * from (seed, key + "/sv"). */
int x3_qweight_from_frame(const x3_tensor *Wt, const char *key,
                          const x3_qhess *h, uint64_t seed, int policy,
                          x3_qweight **out);
/* The same with the signs of sign draw `draw` (x3_quant_signs_draw);
 * draw 0 is the two above. */
int x3_qhess_from_frame_draw(const x3_tensor *Ht, int64_t k0, uint64_t seed, int draw,
                             x3_qhess **out);
int x3_qweight_from_frame_draw(const x3_tensor *Wt, const char *key, const x3_qhess *h,
                               uint64_t seed, int draw, int policy, x3_qweight **out);
/* The sign search: for each draw d = 0 .. draws-1,
 * finalize the Hessian Ht (NULL: none, the identity with input signs from
 * (seed, key + "/su")) and regularize the weight Wt with draw d's signs,
 * and estimate its error at K (x3_quantize_estimate with strips and
 * metric, at the global scale that draw 0's scale search finds: the scale
 * hardly depends on the signs, and the final encode searches its own);
 * keep the draw with the lowest estimate (the lowest d on a tie). Returns
 * the winner's Hessian and weight (the caller frees both), its index in
 * *best and, when errs is not NULL, every draw's estimate (draws values).
 * draws = 1 gives exactly x3_qhess_from_frame and x3_qweight_from_frame
 * without estimating. */
int x3_sign_search(const x3_tensor *Ht, const x3_tensor *Wt, const char *key, uint64_t seed,
                   int draws, int policy, int K, int cb, int threads, int64_t strips,
                   int metric, x3_qhess **h, x3_qweight **w, int *best, double *errs);
/* Pad a bias frame (n0 values, any float dtype) to n floats; X3_ENUM on
 * non-finite values. */
int x3_bias_from_frame(const x3_tensor *Bt, int64_t n0, int64_t n, float **out);

#endif
