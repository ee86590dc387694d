/* exl3.h: one EXL3-quantized linear layer on the CPU
 * (exl3(5) §1.2, §2, §6.2, §7).
 *
 * An x3_exl3 holds the packed trellis of W~ (k x n, tiles of 16x16 at K
 * bits per weight), the scale vectors suh (k) and svh (n), an optional bias
 * (n) and the codebook. It computes, without materializing the weight,
 *
 *     Y = X · Wᵀ_hf (+ bias),   W = diag(suh) · Hb_k · W~ · Hb_n · diag(svh)
 *
 * via x' = had128(x ⊙ suh), y' = x'·W~ (tiles decoded inside the loop),
 * y = had128(y') ⊙ svh + bias. k and n are the padded sizes (multiples of
 * 128); in_features <= k and out_features <= n are the original sizes:
 * inputs may be in_features wide (zero-extended), outputs are trimmed to
 * out_features. */
#ifndef X3_EXL3_H
#define X3_EXL3_H

#include "x3.h"
#include "safetensors.h"

typedef struct x3_exl3 x3_exl3;

enum { X3_EXL3_IN_KNOWN = 1, X3_EXL3_OUT_KNOWN = 2 };

/* Tensor name suffixes of one EXL3 linear "<key>.<suffix>" (exl3(5) §2.2). */
int x3_exl3_is_part(const char *name, char *key, size_t keylen);

/* Build from the tensors of one key among ts[0..nt) (frames or safetensors
 * records; other names are ignored). Validates shapes, dtypes and markers
 * (exl3(5) §2.2, §7 step 1) and copies what it needs. Original sizes are taken
 * from metadata "orig_in"/"orig_out" (or "in_features"/"out_features") of
 * the trellis tensor when present, else the padded sizes.
 * Errors name the tensor. */
int x3_exl3_from_tensors(const char *key, const x3_tensor *const *ts, int nt,
                         x3_exl3 **out);
/* What the tensors of one key say, checked as x3_exl3_from_tensors checks
 * them (parts present, dtypes, shapes, payload sizes, markers, codebook, K
 * and size metadata) but without copying or decoding: for listing a pack.
 * A tensor "<key>.<x>" among ts whose x is no EXL3 part is an error (an
 * unknown codebook's marker, or a stray tensor). Errors name the tensor. */
typedef struct {
	int K, cb;                   /* 1..8, X3_CB_* */
	int64_t k, n;                /* padded in, out (multiples of 128) */
	int64_t in, out;             /* original sizes where known, else k, n */
	int known;                   /* X3_EXL3_*_KNOWN */
	int legacy;                  /* su/sv packed signs instead of suh/svh */
	int has_bias;
	uint64_t bytes;              /* payload bytes of all its tensors */
	double proxy_err;            /* trellis metadata "proxy_err", else NAN */
} x3_exl3_info;
int x3_exl3_inspect(const char *key, const x3_tensor *const *ts, int nt,
                    x3_exl3_info *info);
/* From an open safetensors file / model directory. */
int x3_exl3_from_st(const x3_st *st, const char *key, x3_exl3 **out);
void x3_exl3_free(x3_exl3 *e);

/* Set the original (unpadded) sizes; 0 keeps the current value.
 * X3_EINVAL unless 1 <= in <= k and 1 <= out <= n. */
int x3_exl3_set_orig(x3_exl3 *e, int64_t in_features, int64_t out_features);

const char *x3_exl3_key(const x3_exl3 *e);
int x3_exl3_bits(const x3_exl3 *e);          /* K, 1..8 */
int x3_exl3_codebook(const x3_exl3 *e);      /* X3_CB_* */
int64_t x3_exl3_k(const x3_exl3 *e);         /* padded in_features */
int64_t x3_exl3_n(const x3_exl3 *e);         /* padded out_features */
int64_t x3_exl3_in(const x3_exl3 *e);        /* original in_features */
int64_t x3_exl3_out(const x3_exl3 *e);       /* original out_features */
/* Which original sizes are known (from the trellis metadata or
 * x3_exl3_set_orig) rather than assumed equal to the padded ones. */
int x3_exl3_known(const x3_exl3 *e);
int x3_exl3_has_bias(const x3_exl3 *e);

/* W~ (k x n row-major, fp16-exact values), decoded from the trellis. */
int x3_exl3_inner(const x3_exl3 *e, float *wt /* (k, n) */);
/* Dense weight in HF orientation, trimmed: (out_features, in_features)
 * row-major, W_hf[o][i] = suh[i]·svh[o]·(Hb_k W~ Hb_n)[i][o]. */
int x3_exl3_dequant(const x3_exl3 *e, float *w /* (out, in) */);

/* Y = X·Wᵀ (+bias). x is (rows, x_cols) row-major with x_cols equal to
 * in_features or k (zero-extended to k); y is (rows, out_features).
 * threads <= 0: OpenMP default. The fast path decodes tiles inside the
 * loop (SIMD where the CPU has it); x3_exl3_matmul_ref is the plain C
 * reference (decode W~ whole, then cblas_sgemm). Both accumulate in fp32. */
int x3_exl3_matmul(const x3_exl3 *e, const float *x, int64_t rows,
                   int64_t x_cols, float *y, int threads);
int x3_exl3_matmul_ref(const x3_exl3 *e, const float *x, int64_t rows,
                       int64_t x_cols, float *y);

/* Instruction-set level of the fast path: "scalar", "avx2", "avx512".
 * x3_exl3_simd() returns the one in use (auto-detected, or the environment
 * variable X3_SIMD). x3_exl3_simd_set forces one (X3_EUNSUP if the CPU or
 * the build lacks it); NULL or "auto" restores detection. Not thread-safe
 * against concurrent matmuls: call it between them. */
const char *x3_exl3_simd(void);
int x3_exl3_simd_set(const char *name);

/* Upload the layer to the GPU backend g (device.h linear_create_f32):
 * the device keeps the stored (k/16, n/16) tile order, this layer the
 * column-major one, so the tiles are put back on the way. The forward
 * functions then take k-wide inputs (zero-extend in_features) and give
 * n-wide outputs (trim to out_features). Errors name the key. */
struct x3_gpu;
struct x3_gpu_linear;
int x3_exl3_upload(const x3_exl3 *e, const struct x3_gpu *g, struct x3_gpu_linear **out);

#endif
