/* x3.c: status messages, dtypes, tensors and metadata, RNG, hashing. */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <xxhash.h>
#include "x3.h"
#include "utf8.h"

/* ---- errors ------------------------------------------------------------ */
static _Thread_local char errbuf[2048];

const char *x3_errmsg(void) { return errbuf; }

int x3_err(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof errbuf, fmt, ap);
	va_end(ap);
	return code;
}

int x3_errprefix(int code, const char *fmt, ...)
{
	char pre[512], tmp[sizeof errbuf + sizeof pre + 2];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(pre, sizeof pre, fmt, ap);
	va_end(ap);
	if (errbuf[0])
		snprintf(tmp, sizeof tmp, "%s: %s", pre, errbuf);
	else
		snprintf(tmp, sizeof tmp, "%s", pre);
	memcpy(errbuf, tmp, sizeof errbuf - 1);
	errbuf[sizeof errbuf - 1] = 0;
	return code;
}

/* ---- dtypes ------------------------------------------------------------ */
static const struct x3_dtype_info dtypes[X3_DTYPE_COUNT] = {
	[X3_F64] = {"F64", 8, 1},   [X3_F32] = {"F32", 4, 1},
	[X3_F16] = {"F16", 2, 1},   [X3_BF16] = {"BF16", 2, 1},
	[X3_I64] = {"I64", 8, 0},   [X3_I32] = {"I32", 4, 0},
	[X3_I16] = {"I16", 2, 0},   [X3_I8] = {"I8", 1, 0},
	[X3_U64] = {"U64", 8, 0},   [X3_U32] = {"U32", 4, 0},
	[X3_U16] = {"U16", 2, 0},   [X3_U8] = {"U8", 1, 0},
	[X3_BOOL] = {"BOOL", 1, 0}, [X3_F8_E4M3] = {"F8_E4M3", 1, 1},
	[X3_F8_E5M2] = {"F8_E5M2", 1, 1}, [X3_F8_E8M0] = {"F8_E8M0", 1, 1},
};

const struct x3_dtype_info *x3_dtype_info(x3_dtype t)
{
	return (unsigned)t < X3_DTYPE_COUNT ? &dtypes[t] : NULL;
}
const char *x3_dtype_name(x3_dtype t) { return (unsigned)t < X3_DTYPE_COUNT ? dtypes[t].name : "?"; }
size_t x3_dtype_size(x3_dtype t) { return (unsigned)t < X3_DTYPE_COUNT ? dtypes[t].size : 0; }

int x3_dtype_parse(const char *s, x3_dtype *out)
{
	static const struct { const char *alias; x3_dtype t; } aliases[] = {
		{"float64", X3_F64}, {"double", X3_F64}, {"float32", X3_F32},
		{"float", X3_F32}, {"float16", X3_F16}, {"half", X3_F16},
		{"fp16", X3_F16}, {"fp32", X3_F32}, {"bfloat16", X3_BF16},
		{"int64", X3_I64}, {"int32", X3_I32}, {"int16", X3_I16},
		{"int8", X3_I8}, {"uint8", X3_U8}, {"bool", X3_BOOL},
	};
	for (int i = 0; i < X3_DTYPE_COUNT; i++)
		if (!strcasecmp(s, dtypes[i].name)) { *out = (x3_dtype)i; return X3_OK; }
	for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
		if (!strcasecmp(s, aliases[i].alias)) { *out = aliases[i].t; return X3_OK; }
	return x3_err(X3_EFORMAT, "unknown dtype '%s'", s);
}

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float x3_f16_to_f32(uint16_t h)
{
	uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	if (e == 0) {
		float v = (float)m * 0x1p-24f;   /* exact: subnormal or zero */
		return s ? -v : v;
	}
	if (e == 31)
		return u2f(s | 0x7f800000u | (m << 13));
	return u2f(s | ((e + 112) << 23) | (m << 13));
}

uint16_t x3_f32_to_f16(float f)
{
	uint32_t x = f2u(f);
	uint16_t sign = (x >> 16) & 0x8000;
	x &= 0x7fffffffu;
	if (x >= 0x7f800000u)   /* inf, or NaN kept quiet with its top payload */
		return sign | 0x7c00 | (x > 0x7f800000u ? 0x200 | ((x >> 13) & 0x3ff) : 0);
	if (x >= 0x477ff000u)   /* >= 65520 rounds to inf */
		return sign | 0x7c00;
	if (x < 0x38800000u) {  /* result is subnormal (or zero) */
		uint32_t e = x >> 23;
		if (e < 102)
			return sign;
		uint32_t m = (x & 0x7fffff) | 0x800000, sh = 126 - e;
		uint32_t r = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
		if (rem > half || (rem == half && (r & 1)))
			r++;
		return sign | (uint16_t)r;
	}
	uint32_t r = x - 0x38000000u;   /* rebias exponent 127 -> 15 */
	r += 0xfff + ((r >> 13) & 1);  /* round to nearest even */
	return sign | (uint16_t)(r >> 13);
}

float x3_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t x3_f32_to_bf16(float f)
{
	uint32_t x = f2u(f);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40);   /* quiet NaN */
	x += 0x7fff + ((x >> 16) & 1);
	return (uint16_t)(x >> 16);
}

static float f8e4m3_to_f32(uint8_t v)
{
	/* OCP E4M3 "fn": bias 7, no infinities, S.1111.111 is NaN */
	int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
	float r;
	if (e == 15 && m == 7)
		r = NAN;
	else if (e == 0)
		r = ldexpf((float)m, -9);
	else
		r = ldexpf((float)(8 + m), e - 10);
	return s ? -r : r;
}

static float f8e5m2_to_f32(uint8_t v)
{
	/* E5M2 is the top byte of an fp16 */
	return x3_f16_to_f32((uint16_t)v << 8);
}

static float f8e8m0_to_f32(uint8_t v)
{
	/* exponent only, bias 127: 2^-127 (an F32 subnormal) to 2^127 */
	return v == 0xff ? NAN : ldexpf(1.0f, (int)v - 127);
}

static int is_fbh(x3_dtype t) { return t == X3_F32 || t == X3_F16 || t == X3_BF16; }

static float load_f32(const void *src, x3_dtype st, size_t i)
{
	const unsigned char *p = (const unsigned char *)src + i * dtypes[st].size;
	union { float f; double d; int64_t i64; int32_t i32; int16_t i16; int8_t i8;
		uint64_t u64; uint32_t u32; uint16_t u16; uint8_t u8; } u;
	memcpy(&u, p, dtypes[st].size);
	switch (st) {
	case X3_F64: return (float)u.d;
	case X3_F32: return u.f;
	case X3_F16: return x3_f16_to_f32(u.u16);
	case X3_BF16: return x3_bf16_to_f32(u.u16);
	case X3_I64: return (float)u.i64;
	case X3_I32: return (float)u.i32;
	case X3_I16: return (float)u.i16;
	case X3_I8: return (float)u.i8;
	case X3_U64: return (float)u.u64;
	case X3_U32: return (float)u.u32;
	case X3_U16: return (float)u.u16;
	case X3_U8: return (float)u.u8;
	case X3_BOOL: return u.u8 ? 1.0f : 0.0f;
	case X3_F8_E4M3: return f8e4m3_to_f32(u.u8);
	case X3_F8_E5M2: return f8e5m2_to_f32(u.u8);
	case X3_F8_E8M0: return f8e8m0_to_f32(u.u8);
	default: return NAN;
	}
}

int x3_mxfp4_decode(const uint8_t *blocks, const uint8_t *scales, size_t ngroups, float *out,
                    size_t *bad_group)
{
	static const float e2m1[16] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
	                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f };
	for (size_t g = 0; g < ngroups; g++) {
		const uint8_t *b = blocks + 16 * g;
		float *o = out + 32 * g;
		if (scales[g] == 0xFF) {
			*bad_group = g;
			return x3_err(X3_EFORMAT, "MXFP4 scale 0xFF (NaN in E8M0)");
		}
		int e = (int)scales[g] - 127;
		for (int i = 0; i < 16; i++) {
			/* ldexpf of a value with at most 2 significant bits: exact
			 * unless it leaves F32's range */
			o[2 * i] = ldexpf(e2m1[b[i] & 15], e);
			o[2 * i + 1] = ldexpf(e2m1[b[i] >> 4], e);
			if (isinf(o[2 * i]) || isinf(o[2 * i + 1])) {
				*bad_group = g;
				return x3_err(X3_EFORMAT, "MXFP4 value %g x 2^%d is beyond F32",
				              (double)e2m1[isinf(o[2 * i]) ? b[i] & 15 : b[i] >> 4], e);
			}
		}
	}
	return X3_OK;
}

int x3_convert(void *dst, x3_dtype dt, const void *src, x3_dtype st, size_t n)
{
	if ((unsigned)dt >= X3_DTYPE_COUNT || (unsigned)st >= X3_DTYPE_COUNT)
		return x3_err(X3_EINVAL, "bad dtype id");
	if (dt == st) {
		memmove(dst, src, n * dtypes[dt].size);
		return X3_OK;
	}
	if (dt == X3_F32) {
		float *d = dst;
		if (st == X3_F16) {
			const uint16_t *s = src;
			for (size_t i = 0; i < n; i++) d[i] = x3_f16_to_f32(s[i]);
		} else if (st == X3_BF16) {
			const uint16_t *s = src;
			for (size_t i = 0; i < n; i++) d[i] = x3_bf16_to_f32(s[i]);
		} else {
			for (size_t i = 0; i < n; i++) d[i] = load_f32(src, st, i);
		}
		return X3_OK;
	}
	if (!is_fbh(dt) || !is_fbh(st))
		return x3_err(X3_EUNSUP, "conversion %s -> %s is not supported",
		              dtypes[st].name, dtypes[dt].name);
	uint16_t *d = dst;
	for (size_t i = 0; i < n; i++) {
		float v = load_f32(src, st, i);
		d[i] = dt == X3_F16 ? x3_f32_to_f16(v) : x3_f32_to_bf16(v);
	}
	return X3_OK;
}

/* ---- tensors ----------------------------------------------------------- */
int x3_shape_nbytes(x3_dtype t, int rank, const int64_t *shape, size_t *out)
{
	if ((unsigned)t >= X3_DTYPE_COUNT)
		return x3_err(X3_EINVAL, "bad dtype id %d", (int)t);
	if (rank < 0 || rank > X3_MAX_RANK)
		return x3_err(X3_EFORMAT, "rank %d exceeds the limit of %d", rank, X3_MAX_RANK);
	uint64_t n = dtypes[t].size;
	for (int i = 0; i < rank; i++) {
		if (shape[i] < 0)
			return x3_err(X3_EFORMAT, "negative dimension %lld", (long long)shape[i]);
		if (shape[i] && n > UINT64_MAX / (uint64_t)shape[i])
			return x3_err(X3_ENOMEM, "tensor size overflows 64 bits");
		n *= (uint64_t)shape[i];
	}
	if (n > (uint64_t)SIZE_MAX / 2)
		return x3_err(X3_ENOMEM, "tensor size %llu bytes is too large", (unsigned long long)n);
	*out = (size_t)n;
	return X3_OK;
}

x3_tensor *x3_tensor_new(const char *name, x3_dtype t, int rank,
                         const int64_t *shape, int alloc_data)
{
	size_t nb;
	if (x3_shape_nbytes(t, rank, shape, &nb) != X3_OK)
		return NULL;
	x3_tensor *x = calloc(1, sizeof *x);
	if (!x || !(x->name = strdup(name ? name : ""))) {
		free(x);
		x3_err(X3_ENOMEM, "out of memory");
		return NULL;
	}
	x->dtype = t;
	x->rank = rank;
	for (int i = 0; i < rank; i++)
		x->shape[i] = shape[i];
	x->nbytes = nb;
	if (alloc_data) {
		x->data = calloc(1, nb ? nb : 1);
		if (!x->data) {
			x3_err(X3_ENOMEM, "out of memory allocating %zu bytes for '%s'", nb, x->name);
			x3_tensor_free(x);
			return NULL;
		}
		x->owns_data = 1;
	}
	return x;
}

x3_tensor *x3_tensor_new1(const char *name, x3_dtype t, int64_t n)
{
	return x3_tensor_new(name, t, 1, &n, 1);
}

x3_tensor *x3_tensor_new2(const char *name, x3_dtype t, int64_t r, int64_t c)
{
	int64_t s[2] = {r, c};
	return x3_tensor_new(name, t, 2, s, 1);
}

void x3_tensor_free(x3_tensor *t)
{
	if (!t)
		return;
	if (t->owns_data)
		free(t->data);
	for (int i = 0; i < t->nmeta; i++) {
		free(t->meta[i].key);
		free(t->meta[i].val);
	}
	free(t->meta);
	free(t->name);
	free(t);
}

int64_t x3_tensor_numel(const x3_tensor *t)
{
	int64_t n = 1;
	for (int i = 0; i < t->rank; i++)
		n *= t->shape[i];
	return n;
}

x3_tensor *x3_tensor_copy(const x3_tensor *t, x3_dtype to)
{
	if (to == X3_DTYPE_COUNT)
		to = t->dtype;
	if (t->scale_inv && t->data && to != t->dtype) {
		/* a block-scaled F8 weight: dequantized, then converted */
		float *f = x3_tensor_f32(t);
		x3_tensor *c = f ? x3_tensor_new(t->name, to, t->rank, t->shape, 1) : NULL;
		if (c && (x3_meta_copy(c, t) != X3_OK ||
		          x3_convert(c->data, to, f, X3_F32, (size_t)x3_tensor_numel(t)) != X3_OK)) {
			x3_tensor_free(c);
			c = NULL;
		}
		free(f);
		return c;
	}
	x3_tensor *c = x3_tensor_new(t->name, to, t->rank, t->shape, t->data != NULL);
	if (!c)
		return NULL;
	if (x3_meta_copy(c, t) != X3_OK ||
	    (t->data && x3_convert(c->data, to, t->data, t->dtype, (size_t)x3_tensor_numel(t)) != X3_OK)) {
		x3_tensor_free(c);
		return NULL;
	}
	c->scale_inv = to == t->dtype ? t->scale_inv : NULL;
	return c;
}

/* Multiply the (r, c) F32 matrix f by t->scale_inv per 128x128 block (F32
 * or F8_E8M0 scales, exact in F32). */
static void apply_block_scale(const x3_tensor *t, float *f)
{
	const x3_tensor *s = t->scale_inv;
	int64_t r = t->shape[0], c = t->shape[1], sc = s->shape[1];
	for (int64_t i = 0; i < r; i++)
		for (int64_t j = 0; j < c; j++)
			f[i * c + j] *= load_f32(s->data, s->dtype, (size_t)((i / 128) * sc + j / 128));
}

float *x3_tensor_f32(const x3_tensor *t)
{
	size_t n = (size_t)x3_tensor_numel(t);
	if (!t->data) {
		x3_err(X3_EINVAL, "tensor '%s' has no data", t->name);
		return NULL;
	}
	float *f = malloc((n ? n : 1) * sizeof *f);
	if (!f) {
		x3_err(X3_ENOMEM, "out of memory converting '%s'", t->name);
		return NULL;
	}
	if (x3_convert(f, X3_F32, t->data, t->dtype, n) != X3_OK) {
		free(f);
		return NULL;
	}
	if (t->scale_inv)
		apply_block_scale(t, f);
	return f;
}

int x3_tensor_rename(x3_tensor *t, const char *name)
{
	char *n = strdup(name);
	if (!n)
		return x3_err(X3_ENOMEM, "out of memory");
	free(t->name);
	t->name = n;
	return X3_OK;
}

const char *x3_shape_str(const x3_tensor *t, char *buf, size_t len)
{
	size_t o = 0;
	buf[0] = 0;
	if (t->rank == 0)
		snprintf(buf, len, "scalar");
	for (int i = 0; i < t->rank && o < len; i++)
		o += snprintf(buf + o, len - o, i ? "x%lld" : "%lld", (long long)t->shape[i]);
	return buf;
}

int x3_tensor_check_float(const x3_tensor *t, const char *name, int rank, int64_t d0,
                          int64_t d1)
{
	char b[64];
	if (!t)
		return x3_err(X3_EFORMAT, "tensor '%s' is missing", name);
	if (t->dtype != X3_F32 && t->dtype != X3_F16 && t->dtype != X3_BF16 && !t->scale_inv)
		return x3_err(X3_EFORMAT, "tensor '%s': dtype %s (F32, F16, BF16 or block-scaled F8 expected)",
		              name, x3_dtype_name(t->dtype));
	if (t->rank != rank || t->shape[0] != d0 || (rank > 1 && t->shape[1] != d1)) {
		if (rank == 1)
			return x3_err(X3_EFORMAT, "tensor '%s': shape %s, config says %lld", name,
			              x3_shape_str(t, b, sizeof b), (long long)d0);
		return x3_err(X3_EFORMAT, "tensor '%s': shape %s, config says %lldx%lld", name,
		              x3_shape_str(t, b, sizeof b), (long long)d0, (long long)d1);
	}
	return X3_OK;
}

const char *x3_meta_get(const x3_tensor *t, const char *key)
{
	for (int i = 0; i < t->nmeta; i++)
		if (!strcmp(t->meta[i].key, key))
			return t->meta[i].val;
	return NULL;
}

int x3_meta_set(x3_tensor *t, const char *key, const char *val)
{
	for (int i = 0; i < t->nmeta; i++)
		if (!strcmp(t->meta[i].key, key)) {
			char *v = strdup(val);
			if (!v)
				return x3_err(X3_ENOMEM, "out of memory");
			free(t->meta[i].val);
			t->meta[i].val = v;
			return X3_OK;
		}
	struct x3_kv *m = realloc(t->meta, (t->nmeta + 1) * sizeof *m);
	if (!m)
		return x3_err(X3_ENOMEM, "out of memory");
	t->meta = m;
	m[t->nmeta].key = strdup(key);
	m[t->nmeta].val = strdup(val);
	if (!m[t->nmeta].key || !m[t->nmeta].val) {
		free(m[t->nmeta].key);
		free(m[t->nmeta].val);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	t->nmeta++;
	return X3_OK;
}

int x3_meta_setf(x3_tensor *t, const char *key, const char *fmt, ...)
{
	char buf[4096];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof buf)
		return x3_err(X3_EINVAL, "metadata value for '%s' too long", key);
	return x3_meta_set(t, key, buf);
}

int x3_meta_del(x3_tensor *t, const char *key)
{
	for (int i = 0; i < t->nmeta; i++)
		if (!strcmp(t->meta[i].key, key)) {
			free(t->meta[i].key);
			free(t->meta[i].val);
			memmove(&t->meta[i], &t->meta[i + 1], (t->nmeta - i - 1) * sizeof *t->meta);
			t->nmeta--;
			return X3_OK;
		}
	return X3_OK;
}

int x3_meta_copy(x3_tensor *dst, const x3_tensor *src)
{
	for (int i = 0; i < src->nmeta; i++) {
		int rc = x3_meta_set(dst, src->meta[i].key, src->meta[i].val);
		if (rc)
			return rc;
	}
	return X3_OK;
}

int x3_meta_get_i64(const x3_tensor *t, const char *key, int64_t *v)
{
	const char *s = x3_meta_get(t, key);
	if (!s)
		return X3_EINVAL;
	char *end;
	errno = 0;
	long long x = strtoll(s, &end, 10);
	if (errno || end == s || *end)
		return x3_err(X3_EFORMAT, "tensor '%s': metadata %s='%s' is not an integer", t->name, key, s);
	*v = x;
	return X3_OK;
}

int x3_meta_get_f64(const x3_tensor *t, const char *key, double *v)
{
	const char *s = x3_meta_get(t, key);
	if (!s)
		return X3_EINVAL;
	char *end;
	errno = 0;
	double x = strtod(s, &end);
	if (errno == ERANGE || end == s || *end)
		return x3_err(X3_EFORMAT, "tensor '%s': metadata %s='%s' is not a number", t->name, key, s);
	*v = x;
	return X3_OK;
}

/* ---- misc ------------------------------------------------------------- */
int x3_glob_match(const char *pattern, const char *name)
{
	return fnmatch(pattern, name, 0) == 0;
}

uint64_t x3_hash64(const void *p, size_t n) { return XXH3_64bits(p, n); }

/* ---- RNG: xoshiro256** (Blackman & Vigna), seeded with splitmix64 ------ */
static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void x3_rng_seed(x3_rng *r, uint64_t seed, uint64_t stream)
{
	uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull);
	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t x3_rng_u64(x3_rng *r)
{
	uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return res;
}

double x3_rng_uniform(x3_rng *r) { return (x3_rng_u64(r) >> 11) * 0x1p-53; }

double x3_rng_normal(x3_rng *r)
{
	/* Box-Muller; one value per call keeps the sequence simple to reproduce */
	double u1 = (x3_rng_u64(r) >> 11) * 0x1p-53 + 0x1p-54;   /* (0, 1) */
	double u2 = x3_rng_uniform(r);
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double x3_rng_student_t(x3_rng *r, double df)
{
	/* t = Z / sqrt(V/df), V ~ chi2(df) = 2*Gamma(df/2); Marsaglia-Tsang gamma */
	double z = x3_rng_normal(r), a = df / 2, boost = 1;
	if (a < 1) {
		boost = pow(x3_rng_uniform(r) + 0x1p-54, 1 / a);
		a += 1;
	}
	double d = a - 1.0 / 3, c = 1 / sqrt(9 * d), g;
	for (;;) {
		double x = x3_rng_normal(r), v = 1 + c * x;
		if (v <= 0)
			continue;
		v = v * v * v;
		double u = x3_rng_uniform(r);
		if (log(u + 0x1p-54) < 0.5 * x * x + d - d * v + d * log(v)) {
			g = d * v;
			break;
		}
	}
	double chi2 = 2 * g * boost;
	return z / sqrt(chi2 / df);
}

uint64_t x3_rng_stream_of(const char *s) { return XXH3_64bits(s, strlen(s)); }

const char *x3_str_escape(const char *s, char *buf, size_t n)
{
	size_t len = strlen(s), i = 0, j = 0;
	while (i < len) {
		size_t ok = x3_utf8_valid_prefix(s + i, len - i), l = 1;
		unsigned char c = (unsigned char)s[i];
		if (ok > 0 && c >= 0x20 && c != 0x7f)
			l = c < 0x80 ? 1 : (size_t)x3_utf8_len(c);
		if (ok > 0 && c >= 0x20 && c != 0x7f) {
			if (j + l + 4 >= n)   /* room for "..." and NUL */
				break;
			memcpy(buf + j, s + i, l);
			j += l;
		} else {
			if (j + 4 + 4 >= n)
				break;
			snprintf(buf + j, 5, "\\x%02x", c);
			j += 4;
		}
		i += l;
	}
	if (i < len)
		memcpy(buf + j, "...", 3), j += 3;
	buf[j] = 0;
	return buf;
}

int x3_check_utf8(const char *what, const char *s)
{
	char a[160];
	if (x3_utf8_valid_prefix(s, strlen(s)) != strlen(s))
		return x3_err(X3_EFORMAT, "%s '%s' is not valid UTF-8", what, x3_str_escape(s, a, sizeof a));
	return X3_OK;
}

int x3_tensor_check_utf8(const x3_tensor *t, int with_meta)
{
	int rc = x3_check_utf8("tensor name", t->name);
	for (int i = 0; !rc && with_meta && i < t->nmeta; i++) {
		const char *k = t->meta[i].key;
		if ((rc = x3_check_utf8("metadata key", k)))
			return rc;
		if ((rc = x3_check_utf8("value", t->meta[i].val)))
			return x3_errprefix(rc, "metadata '%s'", k);
	}
	return rc;
}

double x3_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
