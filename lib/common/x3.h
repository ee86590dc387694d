/* x3.h: core of libexl3kit: status codes, error messages, dtypes, tensors.
 *
 * Library functions never print and never exit. They return an int status
 * (X3_OK or one of the codes below) and leave a human-readable message in a
 * thread-local buffer that x3_errmsg() returns; a program's main turns that
 * into "prog: what: why" and an exit status. */
#ifndef X3_H
#define X3_H

#include <stddef.h>
#include <stdint.h>

/* ---- status ---------------------------------------------------------- */
enum {
	X3_OK = 0,
	X3_EOF = 1,      /* clean end of a frame stream (not an error) */
	X3_EINVAL = 2,   /* bad argument / usage from the caller */
	X3_EFORMAT = 3,  /* malformed input data */
	X3_EIO = 4,      /* read/write failure, truncated input */
	X3_ENOMEM = 5,   /* allocation failed or a size limit was hit */
	X3_ENUM = 6,     /* numerical failure: NaN/Inf, singular matrix */
	X3_EUNSUP = 7,   /* valid but unsupported (architecture, option) */
};

/* The message of the last error on this thread ("" if none). */
const char *x3_errmsg(void);
/* Set the message (printf-style) and return code, for "return x3_err(...)". */
int x3_err(int code, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Prefix the current message with "prefix: " and return code. */
int x3_errprefix(int code, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Seconds on the monotonic clock (CLOCK_MONOTONIC): for intervals. */
double x3_now(void);

/* ---- dtypes: ids are numbered once and never reused ------------------ */
typedef enum {
	X3_F64 = 0, X3_F32 = 1, X3_F16 = 2, X3_BF16 = 3,
	X3_I64 = 4, X3_I32 = 5, X3_I16 = 6, X3_I8 = 7,
	X3_U64 = 8, X3_U32 = 9, X3_U16 = 10, X3_U8 = 11,
	X3_BOOL = 12, X3_F8_E4M3 = 13, X3_F8_E5M2 = 14,
	X3_F8_E8M0 = 15,        /* a power of two: byte b is 2^(b - 127), 0xFF NaN
	                           (OCP's scale format, "ue8m0") */
	X3_DTYPE_COUNT
} x3_dtype;

struct x3_dtype_info {
	const char *name;   /* safetensors tag, e.g. "BF16" */
	size_t size;        /* bytes per element */
	int is_float;
};
const struct x3_dtype_info *x3_dtype_info(x3_dtype t);
const char *x3_dtype_name(x3_dtype t);
size_t x3_dtype_size(x3_dtype t);
/* Parse a tag ("F16", case-insensitive; also "float16", "half", "bfloat16",
 * "float32", "float"). Returns X3_OK or X3_EFORMAT. */
int x3_dtype_parse(const char *s, x3_dtype *out);

/* Exact scalar conversions (round to nearest even, NaN preserved as NaN). */
float x3_f16_to_f32(uint16_t h);
uint16_t x3_f32_to_f16(float f);
float x3_bf16_to_f32(uint16_t h);
uint16_t x3_f32_to_bf16(float f);
/* Round a float to the nearest fp16 value and back. */
static inline float x3_round_f16(float f) { return x3_f16_to_f32(x3_f32_to_f16(f)); }

/* Convert n elements. Supported: among F32/F16/BF16 (exact RNE; F16<->BF16
 * goes through F32, which is exact), any numeric dtype -> F32, and any dtype
 * to itself (copy). Others return X3_EUNSUP. */
int x3_convert(void *dst, x3_dtype dt, const void *src, x3_dtype st, size_t n);

/* MXFP4 (the OCP microscaling format of GPT-OSS's expert weights): groups
 * of 32 values, each 16 bytes of E2M1 codes, two a byte, the low nibble
 * the first value (code: sign bit 3, exponent bits 2..1, mantissa bit 0:
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, -0 included), times the
 * group's E8M0 scale byte s, 2^(s - 127). Decodes ngroups groups of
 * blocks (16 bytes each) and scales (one byte each) into out (32 floats a
 * group): exact in F32 (subnormals down to 2^-128). X3_EFORMAT with
 * *bad_group set when a scale is 0xFF (E8M0's NaN) or a value exceeds
 * F32's range (2^128: 4 or 6 under scale 253, 2 and up under 254); out is
 * then partial. */
int x3_mxfp4_decode(const uint8_t *blocks, const uint8_t *scales, size_t ngroups, float *out,
                    size_t *bad_group);

/* ---- tensors ---------------------------------------------------------- */
#define X3_MAX_RANK 8

struct x3_kv { char *key, *val; };

typedef struct x3_tensor {
	char *name;
	x3_dtype dtype;
	int rank;
	int64_t shape[X3_MAX_RANK];
	void *data;          /* nbytes of little-endian payload, or NULL */
	size_t nbytes;
	int owns_data;       /* free(data) in x3_tensor_free */
	int nmeta;           /* string metadata, insertion order */
	struct x3_kv *meta;
	/* An F8 weight of a block-quantized checkpoint (DeepSeek V3's FP8):
	 * the F32 or F8_E8M0 (DeepSeek's "ue8m0" scale format) (ceil(rows/128),
	 * ceil(cols/128)) scales NAME_scale_inv that
	 * multiply its 128x128 blocks, set by the safetensors reader (valid
	 * while it is open); x3_tensor_f32 and x3_tensor_copy dequantize with
	 * them. NULL otherwise. */
	const struct x3_tensor *scale_inv;
} x3_tensor;

/* New tensor with zeroed, owned data (data NULL if alloc_data is 0).
 * Returns NULL (with message) on overflow or allocation failure. */
x3_tensor *x3_tensor_new(const char *name, x3_dtype t, int rank,
                         const int64_t *shape, int alloc_data);
/* Convenience: 1-D and 2-D. */
x3_tensor *x3_tensor_new1(const char *name, x3_dtype t, int64_t n);
x3_tensor *x3_tensor_new2(const char *name, x3_dtype t, int64_t r, int64_t c);
void x3_tensor_free(x3_tensor *t);
int64_t x3_tensor_numel(const x3_tensor *t);
/* Bytes needed for dtype x shape; X3_ENOMEM on overflow. */
int x3_shape_nbytes(x3_dtype t, int rank, const int64_t *shape, size_t *out);
/* Deep copy, optionally converted to another dtype (X3_DTYPE_COUNT = same;
 * a block-scaled F8 weight is dequantized when converted, and copied with
 * its scale_inv link when not). */
x3_tensor *x3_tensor_copy(const x3_tensor *t, x3_dtype to);
/* Copy of the payload as a freshly malloc'd float array (numel elements);
 * an F8 weight with scale_inv dequantized: f32(w[i][j]) * scale_inv[i/128][j/128]
 * (the F8 value is exact in F32; one F32 product, as Hugging Face's
 * dequantization computes it before its cast to BF16). */
float *x3_tensor_f32(const x3_tensor *t);
int x3_tensor_rename(x3_tensor *t, const char *name);
/* "4096x11008" into buf */
const char *x3_shape_str(const x3_tensor *t, char *buf, size_t len);
/* X3_OK if t is present, a float (F32, F16, BF16, or F8 with its block
 * scales linked: scale_inv) of rank 1 with d0 elements
 * or rank 2 with shape d0 x d1; else X3_EFORMAT naming the tensor, the shape
 * found and what the config says. t NULL: "tensor 'name' is missing". */
int x3_tensor_check_float(const x3_tensor *t, const char *name, int rank, int64_t d0,
                          int64_t d1);

const char *x3_meta_get(const x3_tensor *t, const char *key);
int x3_meta_set(x3_tensor *t, const char *key, const char *val);
int x3_meta_setf(x3_tensor *t, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int x3_meta_del(x3_tensor *t, const char *key);
/* X3_OK if the name and (with_meta) every metadata key and value of t are
 * valid UTF-8 (what a JSON header can hold), else X3_EFORMAT naming the
 * name or the key (the caller names the tensor), the bad bytes as \xNN. */
int x3_tensor_check_utf8(const x3_tensor *t, int with_meta);
/* The same for one string: X3_EFORMAT "WHAT 'S' is not valid UTF-8". */
int x3_check_utf8(const char *what, const char *s);
/* s for a message: bytes that are not valid UTF-8 and control characters
 * as \xNN, cut to fit buf (n >= 8). Returns buf. */
const char *x3_str_escape(const char *s, char *buf, size_t n);
/* Copy all metadata of src into dst (overwriting equal keys). */
int x3_meta_copy(x3_tensor *dst, const x3_tensor *src);
/* Numeric getters: X3_OK, or X3_EFORMAT if present but unparsable,
 * X3_EINVAL if absent (value untouched). */
int x3_meta_get_i64(const x3_tensor *t, const char *key, int64_t *v);
int x3_meta_get_f64(const x3_tensor *t, const char *key, double *v);

/* ---- deterministic random numbers (xoshiro256** seeded by splitmix64) --
 * Same sequence on every machine for a given (seed, stream). */
typedef struct { uint64_t s[4]; } x3_rng;
void x3_rng_seed(x3_rng *r, uint64_t seed, uint64_t stream);
uint64_t x3_rng_u64(x3_rng *r);
double x3_rng_uniform(x3_rng *r);          /* [0, 1) with 53 bits */
double x3_rng_normal(x3_rng *r);           /* N(0,1), Box-Muller */
double x3_rng_student_t(x3_rng *r, double df);
/* Stream id for a string (e.g. a tensor name): XXH3 of the bytes. */
uint64_t x3_rng_stream_of(const char *s);

/* ---- misc ----------------------------------------------------------- */
/* Shell-glob match (fnmatch semantics) of a tensor name. */
int x3_glob_match(const char *pattern, const char *name);
/* XXH3-64 of a buffer. */
uint64_t x3_hash64(const void *p, size_t n);

#endif
