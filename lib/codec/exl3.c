/* exl3.c: an EXL3 linear layer: loading and validation (exl3(5) §2.2, §7),
 * dense reconstruction (exl3(5) §1.2) and the plain C reference matmul
 * (exl3(5) §6.2).
 * The fast decode-in-the-loop kernels are in exl3mm.c. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <omp.h>
#include "codec.h"
#include "device.h"
#include "exl3_impl.h"

static const char *const parts[] = {
	"trellis", "suh", "svh", "su", "sv", "bias", "mcg", "mul1",
};

int x3_exl3_is_part(const char *name, char *key, size_t keylen)
{
	const char *dot = strrchr(name, '.');
	if (!dot || dot == name)
		return 0;
	for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
		if (strcmp(dot + 1, parts[i]) == 0) {
			size_t l = (size_t)(dot - name);
			if (key) {
				if (l + 1 > keylen)
					return 0;
				memcpy(key, name, l);
				key[l] = 0;
			}
			return 1;
		}
	}
	return 0;
}

static const x3_tensor *find(const char *key, const char *suffix,
                             const x3_tensor *const *ts, int nt)
{
	size_t kl = strlen(key), sl = strlen(suffix);
	for (int i = 0; i < nt; i++) {
		const char *nm = ts[i]->name;
		if (nm && strlen(nm) == kl + 1 + sl && memcmp(nm, key, kl) == 0 &&
		    nm[kl] == '.' && strcmp(nm + kl + 1, suffix) == 0)
			return ts[i];
	}
	return NULL;
}

static int check_payload(const x3_tensor *t)
{
	size_t need;
	if (x3_shape_nbytes(t->dtype, t->rank, t->shape, &need) != X3_OK)
		return x3_err(X3_EFORMAT, "'%s': shape too large", t->name);
	if (!t->data || t->nbytes != need)
		return x3_err(X3_EFORMAT, "'%s': payload has %zu bytes, shape needs %zu",
		              t->name, t->nbytes, need);
	return X3_OK;
}

/* A 1-D float vector of length len (F16/F32/BF16) into a fresh float array. */
static int load_vec(const x3_tensor *t, int64_t len, float **out)
{
	char sb[128];
	if (t->rank != 1 || t->shape[0] != len)
		return x3_err(X3_EFORMAT, "'%s': shape %s, expected %lld", t->name,
		              x3_shape_str(t, sb, sizeof sb), (long long)len);
	if (t->dtype != X3_F16 && t->dtype != X3_F32 && t->dtype != X3_BF16)
		return x3_err(X3_EFORMAT, "'%s': dtype %s, expected F16 (or F32/BF16)",
		              t->name, x3_dtype_name(t->dtype));
	int rc = check_payload(t);
	if (rc)
		return rc;
	float *v = malloc((size_t)len * sizeof *v);
	if (!v)
		return x3_err(X3_ENOMEM, "'%s': out of memory", t->name);
	rc = x3_convert(v, X3_F32, t->data, t->dtype, (size_t)len);
	if (rc) {
		free(v);
		return x3_errprefix(rc, "'%s'", t->name);
	}
	for (int64_t i = 0; i < len; i++)
		if (!isfinite(v[i])) {
			free(v);
			return x3_err(X3_ENUM, "'%s': element %lld is not finite",
			              t->name, (long long)i);
		}
	*out = v;
	return X3_OK;
}

/* Legacy packed sign bits (exl3(5) §2.2): int16 (len/16,), bit j of word w (LSB
 * first) is element 16w+j, set means -1. */
static int load_signs(const x3_tensor *t, int64_t len, float **out)
{
	char sb[128];
	if (t->rank != 1 || t->shape[0] * 16 != len ||
	    (t->dtype != X3_I16 && t->dtype != X3_U16))
		return x3_err(X3_EFORMAT, "'%s': %s %s, expected I16 (%lld)", t->name,
		              x3_dtype_name(t->dtype), x3_shape_str(t, sb, sizeof sb),
		              (long long)(len / 16));
	int rc = check_payload(t);
	if (rc)
		return rc;
	float *v = malloc((size_t)len * sizeof *v);
	if (!v)
		return x3_err(X3_ENOMEM, "'%s': out of memory", t->name);
	const uint8_t *p = t->data;
	for (int64_t i = 0; i < len; i++) {
		uint16_t w = (uint16_t)(p[2 * (i / 16)] | p[2 * (i / 16) + 1] << 8);
		v[i] = (w >> (i % 16)) & 1 ? -1.0f : 1.0f;
	}
	*out = v;
	return X3_OK;
}

static int check_marker(const x3_tensor *t, uint32_t want)
{
	if (t->dtype != X3_I32 || x3_tensor_numel(t) != 1 || t->rank > 1)
		return x3_err(X3_EFORMAT, "'%s': expected an I32 scalar marker", t->name);
	int rc = check_payload(t);
	if (rc)
		return rc;
	const uint8_t *p = t->data;
	uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	             (uint32_t)p[3] << 24;
	/* The value is not read by ExLlamaV3; a different one comes from a
	 * pre-lock experimental checkpoint that would mis-decode (exl3(5) §2.2). */
	if (v != want)
		return x3_err(X3_EUNSUP, "'%s': multiplier 0x%08X is not the locked "
		              "0x%08X (experimental checkpoint)", t->name, v, want);
	return X3_OK;
}

static int meta_size(const x3_tensor *t, const char *k1, const char *k2,
                     int64_t *v)
{
	int rc = x3_meta_get_i64(t, k1, v);
	if (rc == X3_EINVAL)
		rc = x3_meta_get_i64(t, k2, v);
	if (rc == X3_EFORMAT)
		return x3_err(X3_EFORMAT, "'%s': metadata '%s' is not an integer",
		              t->name, k1);
	return rc;
}

/* The checks of one linear's tensors (exl3(5) §2.2, §7 step 1) that need no copy:
 * parts present, dtypes, shapes, payload sizes, markers, codebook and size
 * metadata. ts may hold other tensors; tensors named "<key>.<x>" with an x
 * that is no EXL3 part are an error (a marker of an unknown codebook, or a
 * stray tensor under a quantized module's key). */
int x3_exl3_inspect(const char *key, const x3_tensor *const *ts, int nt,
                    x3_exl3_info *info)
{
	char sb[128];
	memset(info, 0, sizeof *info);
	info->proxy_err = NAN;
	const x3_tensor *tr = find(key, "trellis", ts, nt);
	const x3_tensor *suh = find(key, "suh", ts, nt), *su = find(key, "su", ts, nt);
	const x3_tensor *svh = find(key, "svh", ts, nt), *sv = find(key, "sv", ts, nt);
	const x3_tensor *bias = find(key, "bias", ts, nt);
	const x3_tensor *mcg = find(key, "mcg", ts, nt), *mul1 = find(key, "mul1", ts, nt);

	if (!tr)
		return x3_err(X3_EFORMAT, "tensor '%s': missing '%s.trellis'", key, key);
	if (!suh && !su)
		return x3_err(X3_EFORMAT, "tensor '%s': missing '%s.suh'", key, key);
	if (!svh && !sv)
		return x3_err(X3_EFORMAT, "tensor '%s': missing '%s.svh'", key, key);
	if (suh && su)
		return x3_err(X3_EFORMAT, "tensor '%s': both '%s.suh' and the legacy '%s.su'",
		              key, key, key);
	if (svh && sv)
		return x3_err(X3_EFORMAT, "tensor '%s': both '%s.svh' and the legacy '%s.sv'",
		              key, key, key);
	if (mcg && mul1)
		return x3_err(X3_EFORMAT, "tensor '%s': both '%s.mcg' and '%s.mul1' "
		              "markers present", key, key, key);
	size_t kl = strlen(key);
	for (int i = 0; i < nt; i++) {
		const char *nm = ts[i]->name;
		if (!nm || strncmp(nm, key, kl) || nm[kl] != '.' ||
		    (x3_exl3_is_part(nm, NULL, 0) && !strchr(nm + kl + 1, '.')))
			continue;
		if (!strchr(nm + kl + 1, '.') && ts[i]->dtype == X3_I32 && x3_tensor_numel(ts[i]) == 1)
			return x3_err(X3_EFORMAT, "tensor '%s': a marker of an unknown codebook "
			              "'%s' (known: mcg, mul1; no marker: 3inst)", nm, nm + kl + 1);
		return x3_err(X3_EFORMAT, "tensor '%s': not an EXL3 part of the quantized "
		              "linear '%s'", nm, key);
	}
	if (tr->dtype != X3_I16 && tr->dtype != X3_U16)
		return x3_err(X3_EFORMAT, "'%s': dtype %s, expected I16", tr->name,
		              x3_dtype_name(tr->dtype));
	if (tr->rank != 3 || tr->shape[0] < 1 || tr->shape[1] < 1 ||
	    tr->shape[2] % 16 != 0)
		return x3_err(X3_EFORMAT, "'%s': shape %s, expected (k/16, n/16, 16K)",
		              tr->name, x3_shape_str(tr, sb, sizeof sb));
	int64_t K = tr->shape[2] / 16;
	if (K < 1 || K > 8)
		return x3_err(X3_EFORMAT, "'%s': shape %s gives K = %lld, not in 1..8",
		              tr->name, x3_shape_str(tr, sb, sizeof sb), (long long)K);
	int64_t k = 16 * tr->shape[0], n = 16 * tr->shape[1];
	if (k % 128 || n % 128)
		return x3_err(X3_EFORMAT, "'%s': shape %s gives a %lldx%lld weight, "
		              "not a multiple of 128", tr->name,
		              x3_shape_str(tr, sb, sizeof sb), (long long)k, (long long)n);
	if (k > ((int64_t)1 << 24) || n > ((int64_t)1 << 24))
		return x3_err(X3_EFORMAT, "'%s': shape %s too large", tr->name,
		              x3_shape_str(tr, sb, sizeof sb));
	int rc = check_payload(tr);
	if (rc)
		return rc;
	int64_t mk;
	if ((rc = meta_size(tr, "K", "K", &mk)) == X3_OK && mk != K)
		return x3_err(X3_EFORMAT, "'%s': metadata K=%lld, but the shape %s says K=%lld",
		              tr->name, (long long)mk, x3_shape_str(tr, sb, sizeof sb), (long long)K);
	if (rc == X3_EFORMAT)
		return rc;
	if (mcg && (rc = check_marker(mcg, X3_MCG_MULT)))
		return rc;
	if (mul1 && (rc = check_marker(mul1, X3_MUL1_MULT)))
		return rc;
	int cb = mcg ? X3_CB_MCG : mul1 ? X3_CB_MUL1 : X3_CB_3INST, mcb;
	/* a frame states its codebook: a missing marker would decode as 3INST */
	const char *cbm = x3_meta_get(tr, "codebook");
	if (cbm && x3_codebook_parse(cbm, &mcb))
		return x3_err(X3_EFORMAT, "'%s': metadata names an unknown codebook '%s'",
		              tr->name, cbm);
	if (cbm && mcb != cb)
		return x3_err(X3_EFORMAT, "'%s': metadata says codebook %s, the markers %s",
		              tr->name, cbm, cb == X3_CB_3INST ? "none (3inst)" : x3_codebook_name(cb));
	/* the scales: suh (k) / svh (n) float vectors, or legacy packed signs */
	const x3_tensor *sc[2] = {suh ? suh : su, svh ? svh : sv};
	int64_t len[2] = {k, n};
	for (int s = 0; s < 2; s++) {
		const x3_tensor *t = sc[s];
		int legacy = t == su || t == sv;
		if (legacy ? t->rank != 1 || t->shape[0] * 16 != len[s] ||
		             (t->dtype != X3_I16 && t->dtype != X3_U16)
		           : t->rank != 1 || t->shape[0] != len[s] ||
		             (t->dtype != X3_F16 && t->dtype != X3_F32 && t->dtype != X3_BF16))
			return x3_err(X3_EFORMAT, "'%s': %s %s, expected %s (%lld)", t->name,
			              x3_dtype_name(t->dtype), x3_shape_str(t, sb, sizeof sb),
			              legacy ? "I16 packed signs" : "F16 (or F32/BF16)",
			              (long long)(legacy ? len[s] / 16 : len[s]));
		if ((rc = check_payload(t)))
			return rc;
		info->legacy |= legacy;
	}
	if (bias) {
		if (bias->rank != 1 || bias->shape[0] != n ||
		    (bias->dtype != X3_F16 && bias->dtype != X3_F32 && bias->dtype != X3_BF16))
			return x3_err(X3_EFORMAT, "'%s': %s %s, expected F16 (%lld)", bias->name,
			              x3_dtype_name(bias->dtype), x3_shape_str(bias, sb, sizeof sb),
			              (long long)n);
		if ((rc = check_payload(bias)))
			return rc;
	}
	int64_t oi = k, oo = n;
	if ((rc = meta_size(tr, "orig_in", "in_features", &oi)) == X3_OK)
		info->known |= X3_EXL3_IN_KNOWN;
	else if (rc != X3_EINVAL)
		return rc;
	if ((rc = meta_size(tr, "orig_out", "out_features", &oo)) == X3_OK)
		info->known |= X3_EXL3_OUT_KNOWN;
	else if (rc != X3_EINVAL)
		return rc;
	if (oi < 1 || oi > k || oo < 1 || oo > n)
		return x3_err(X3_EFORMAT, "'%s': original size %lldx%lld (in x out) does "
		              "not fit the padded %lldx%lld", tr->name, (long long)oi,
		              (long long)oo, (long long)k, (long long)n);
	double pe;
	if (x3_meta_get_f64(tr, "proxy_err", &pe) == X3_OK)
		info->proxy_err = pe;
	info->K = (int)K;
	info->cb = cb;
	info->k = k;
	info->n = n;
	info->in = oi;
	info->out = oo;
	info->has_bias = bias != NULL;
	const x3_tensor *all[8] = {tr, suh, su, svh, sv, bias, mcg, mul1};
	for (int i = 0; i < 8; i++)
		if (all[i])
			info->bytes += all[i]->nbytes;
	return X3_OK;
}

int x3_exl3_from_tensors(const char *key, const x3_tensor *const *ts, int nt,
                         x3_exl3 **out)
{
	*out = NULL;
	x3_exl3_info info;
	int rc = x3_exl3_inspect(key, ts, nt, &info);
	if (rc)
		return rc;
	const x3_tensor *tr = find(key, "trellis", ts, nt);
	const x3_tensor *suh = find(key, "suh", ts, nt), *su = find(key, "su", ts, nt);
	const x3_tensor *svh = find(key, "svh", ts, nt), *sv = find(key, "sv", ts, nt);
	const x3_tensor *bias = find(key, "bias", ts, nt);
	int64_t K = info.K, k = info.k, n = info.n;

	struct x3_exl3 *e = calloc(1, sizeof *e);
	if (!e || !(e->key = strdup(key))) {
		free(e);
		return x3_err(X3_ENOMEM, "tensor '%s': out of memory", key);
	}
	e->K = (int)K;
	e->cb = info.cb;
	e->k = k;
	e->n = n;
	e->in = info.in;
	e->out = info.out;
	e->known = info.known;
	size_t tb = tr->nbytes;
	/* padding: the SIMD kernels read whole windows around each tile */
	e->trellis_mem = aligned_alloc(64, 64 + (tb + 63) / 64 * 64 + 128);
	if (!e->trellis_mem) {
		x3_exl3_free(e);
		return x3_err(X3_ENOMEM, "'%s': out of memory (%zu bytes)", tr->name, tb);
	}
	memset(e->trellis_mem, 0, 64 + (tb + 63) / 64 * 64 + 128);
	e->trellis = (uint16_t *)((char *)e->trellis_mem + 64);
	size_t tw = (size_t)16 * e->K * 2;   /* bytes per tile */
	for (int64_t kb = 0; kb < k / 16; kb++)
		for (int64_t nb = 0; nb < n / 16; nb++)
			memcpy((char *)e->trellis + (size_t)(nb * (k / 16) + kb) * tw,
			       (const char *)tr->data + (size_t)(kb * (n / 16) + nb) * tw, tw);
	rc = suh ? load_vec(suh, k, &e->suh) : load_signs(su, k, &e->suh);
	if (!rc)
		rc = svh ? load_vec(svh, n, &e->svh) : load_signs(sv, n, &e->svh);
	if (!rc && bias)
		rc = load_vec(bias, n, &e->bias);
	if (rc) {
		x3_exl3_free(e);
		return rc;
	}
	*out = e;
	return X3_OK;
}

int x3_exl3_from_st(const x3_st *st, const char *key, x3_exl3 **out)
{
	const x3_tensor *ts[sizeof parts / sizeof *parts];
	int nt = 0;
	char name[1024];
	for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
		if ((size_t)snprintf(name, sizeof name, "%s.%s", key, parts[i]) >= sizeof name)
			return x3_err(X3_EINVAL, "tensor key too long");
		const x3_tensor *t = x3_st_find(st, name);
		if (t)
			ts[nt++] = t;
	}
	if (nt == 0)
		return x3_err(X3_EFORMAT, "tensor '%s': no EXL3 tensors with this key", key);
	return x3_exl3_from_tensors(key, ts, nt, out);
}

void x3_exl3_free(x3_exl3 *e)
{
	if (!e)
		return;
	free(e->key);
	free(e->trellis_mem);
	free(e->suh);
	free(e->svh);
	free(e->bias);
	free(e);
}

int x3_exl3_set_orig(x3_exl3 *e, int64_t in, int64_t out)
{
	int known = (in ? X3_EXL3_IN_KNOWN : 0) | (out ? X3_EXL3_OUT_KNOWN : 0);
	if (in == 0)
		in = e->in;
	if (out == 0)
		out = e->out;
	if (in < 1 || in > e->k)
		return x3_err(X3_EINVAL, "tensor '%s': in_features %lld not in 1..%lld",
		              e->key, (long long)in, (long long)e->k);
	if (out < 1 || out > e->n)
		return x3_err(X3_EINVAL, "tensor '%s': out_features %lld not in 1..%lld",
		              e->key, (long long)out, (long long)e->n);
	e->in = in;
	e->out = out;
	e->known |= known;
	return X3_OK;
}
int x3_exl3_known(const x3_exl3 *e) { return e->known; }

const char *x3_exl3_key(const x3_exl3 *e) { return e->key; }
int x3_exl3_bits(const x3_exl3 *e) { return e->K; }
int x3_exl3_codebook(const x3_exl3 *e) { return e->cb; }
int64_t x3_exl3_k(const x3_exl3 *e) { return e->k; }
int64_t x3_exl3_n(const x3_exl3 *e) { return e->n; }
int64_t x3_exl3_in(const x3_exl3 *e) { return e->in; }
int64_t x3_exl3_out(const x3_exl3 *e) { return e->out; }
int x3_exl3_has_bias(const x3_exl3 *e) { return e->bias != NULL; }

int x3_exl3_inner(const x3_exl3 *e, float *wt)
{
	/* back to the stored (k/16, n/16, 16K) order for the codec's decoder */
	int64_t ntk = e->k / 16, ntn = e->n / 16;
	size_t tw = (size_t)16 * e->K;
	uint16_t *t = malloc((size_t)(ntk * ntn) * tw * sizeof *t);
	if (!t)
		return x3_err(X3_ENOMEM, "tensor '%s': out of memory", e->key);
	for (int64_t kb = 0; kb < ntk; kb++)
		for (int64_t nb = 0; nb < ntn; nb++)
			memcpy(t + (size_t)(kb * ntn + nb) * tw, e->trellis + (size_t)(nb * ntk + kb) * tw,
			       tw * sizeof *t);
	int rc = x3_trellis_decode(e->K, e->cb, t, e->k, e->n, wt);
	free(t);
	return rc ? x3_errprefix(rc, "tensor '%s'", e->key) : X3_OK;
}

int x3_exl3_dequant(const x3_exl3 *e, float *w)
{
	size_t kn = (size_t)e->k * (size_t)e->n;
	float *t = malloc(kn * sizeof *t);
	if (!t)
		return x3_err(X3_ENOMEM, "tensor '%s': out of memory", e->key);
	int rc = x3_exl3_inner(e, t);
	if (rc) {
		free(t);
		return rc;
	}
	x3_had128_cols(t, e->k, e->n);   /* Hb_k · W~ */
	x3_had128_rows(t, e->k, e->n);   /* · Hb_n */
	for (int64_t o = 0; o < e->out; o++)
		for (int64_t i = 0; i < e->in; i++)
			w[o * e->in + i] = e->suh[i] * e->svh[o] * t[i * e->n + o];
	free(t);
	return X3_OK;
}

/* Hadamard over the 128-chunks of each row, rows split over our own
 * threads (threads <= 0: the library's default). Keeps small calls
 * single-threaded when the caller asked for one thread. */
static void had_rows(float *x, int64_t rows, int64_t cols, int threads)
{
	if (threads <= 0) {
		x3_had128_rows(x, rows, cols);
		return;
	}
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * cols >= 32768)
	for (int64_t r = 0; r < rows; r++)
		x3_had128_rows(x + r * cols, 1, cols);
}

/* x' = had128(x ⊙ suh), zero-extended to k: xh is (rows, k). */
static int prologue(const x3_exl3 *e, const float *x, int64_t rows,
                    int64_t xc, float **xh, int threads)
{
	if (xc != e->in && xc != e->k)
		return x3_err(X3_EINVAL, "tensor '%s': input has %lld columns, "
		              "expected in_features %lld%s", e->key, (long long)xc,
		              (long long)e->in, e->in != e->k ? " or the padded size" : "");
	if (rows < 1)
		return x3_err(X3_EINVAL, "tensor '%s': input has no rows", e->key);
	float *h = malloc((size_t)rows * (size_t)e->k * sizeof *h);
	if (!h)
		return x3_err(X3_ENOMEM, "tensor '%s': out of memory", e->key);
	for (int64_t r = 0; r < rows; r++) {
		float *d = h + r * e->k;
		const float *s = x + r * xc;
		for (int64_t i = 0; i < xc; i++)
			d[i] = s[i] * e->suh[i];
		for (int64_t i = xc; i < e->k; i++)
			d[i] = 0.0f;
	}
	had_rows(h, rows, e->k, threads);
	*xh = h;
	return X3_OK;
}

/* y = had128(y') ⊙ svh + bias, trimmed to out_features. */
static void epilogue(const x3_exl3 *e, float *yh, int64_t rows, float *y, int threads)
{
	had_rows(yh, rows, e->n, threads);
	for (int64_t r = 0; r < rows; r++) {
		const float *s = yh + r * e->n;
		float *d = y + r * e->out;
		for (int64_t o = 0; o < e->out; o++)
			d[o] = s[o] * e->svh[o] + (e->bias ? e->bias[o] : 0.0f);
	}
}

int x3_exl3_matmul_ref(const x3_exl3 *e, const float *x, int64_t rows,
                       int64_t xc, float *y)
{
	float *xh = NULL, *yh = NULL, *wt = NULL;
	if (rows > INT_MAX)
		return x3_err(X3_EINVAL, "tensor '%s': too many rows for the reference path", e->key);
	int rc = prologue(e, x, rows, xc, &xh, 0);
	if (rc)
		return rc;
	yh = malloc((size_t)rows * (size_t)e->n * sizeof *yh);
	wt = malloc((size_t)e->k * (size_t)e->n * sizeof *wt);
	if (!yh || !wt) {
		rc = x3_err(X3_ENOMEM, "tensor '%s': out of memory", e->key);
		goto out;
	}
	if ((rc = x3_exl3_inner(e, wt)))
		goto out;
	/* (rows, k) · (k, n) */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)e->n,
	            (int)e->k, 1.0f, xh, (int)e->k, wt, (int)e->n, 0.0f, yh, (int)e->n);
	epilogue(e, yh, rows, y, 0);
out:
	free(xh);
	free(yh);
	free(wt);
	return rc;
}

int x3_exl3_matmul(const x3_exl3 *e, const float *x, int64_t rows, int64_t xc,
                   float *y, int threads)
{
	float *xh = NULL;
	if (threads <= 0)
		threads = omp_get_max_threads();
	int rc = prologue(e, x, rows, xc, &xh, threads);
	if (rc)
		return rc;
	float *yh = malloc((size_t)rows * (size_t)e->n * sizeof *yh);
	if (!yh) {
		free(xh);
		return x3_err(X3_ENOMEM, "tensor '%s': out of memory", e->key);
	}
	rc = x3__exl3_mm_fast(e, xh, rows, yh, threads);
	if (!rc)
		epilogue(e, yh, rows, y, threads);
	free(xh);
	free(yh);
	return rc;
}

int x3_exl3_upload(const x3_exl3 *e, const x3_gpu *g, x3_gpu_linear **out)
{
	*out = NULL;
	if (!e || !g)
		return x3_err(X3_EINVAL, "linear: NULL layer or backend");
	const int64_t tk = e->k / 16, tn = e->n / 16, w = 16 * (int64_t)e->K;
	uint16_t *tr = malloc((size_t)(tk * tn * w) * sizeof(uint16_t));
	if (!tr)
		return x3_err(X3_ENOMEM, "out of memory");
	for (int64_t kb = 0; kb < tk; kb++)
		for (int64_t nb = 0; nb < tn; nb++)
			memcpy(tr + (kb * tn + nb) * w, e->trellis + (nb * tk + kb) * w,
			       (size_t)w * sizeof(uint16_t));
	int rc = g->linear_create_f32(e->K, e->cb, e->k, e->n, tr, e->suh, e->svh, e->bias, out);
	free(tr);
	return rc ? x3_errprefix(rc, "'%s'", e->key ? e->key : "?") : X3_OK;
}
