/* qframe.c: frame glue of the quantizer (had-rotate, trellis-encode):
 * frame roles and keys, Hessian/weight/bias frames to quant.h structs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "quant.h"

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

const char *x3_qframe_role(const x3_tensor *t)
{
	const char *r = x3_meta_get(t, "role");
	if (r && *r)
		return r;
	if (x3_meta_get(t, "count") || ends_with(t->name, ".hessian"))
		return "hessian";
	if (ends_with(t->name, ".bias"))
		return "bias";
	return "weight";
}

const char *x3_qframe_key(const x3_tensor *t, char *buf, size_t len)
{
	static const char *suf[] = { ".weight", ".bias", ".w_reg", ".su_reg", ".sv_reg",
	                             ".h_rot", ".h_ldl", ".trellis", ".suh", ".svh", NULL };
	const char *k = x3_meta_get(t, "key");
	if (k && *k) {
		snprintf(buf, len, "%s", k);
		return buf;
	}
	snprintf(buf, len, "%s", t->name);
	for (int i = 0; suf[i]; i++)
		if (ends_with(buf, suf[i]) && strlen(buf) > strlen(suf[i])) {
			buf[strlen(buf) - strlen(suf[i])] = 0;
			break;
		}
	return buf;
}

int x3_qhess_from_frame(const x3_tensor *Ht, int64_t k0, uint64_t seed, x3_qhess **out)
{
	return x3_qhess_from_frame_draw(Ht, k0, seed, 0, out);
}

int x3_qhess_from_frame_draw(const x3_tensor *Ht, int64_t k0, uint64_t seed, int draw,
                             x3_qhess **out)
{
	*out = NULL;
	if (Ht->rank != 2 || Ht->shape[0] != Ht->shape[1]) {
		char b[64];
		return x3_err(X3_EFORMAT, "hessian must be a square matrix, got shape %s",
		              x3_shape_str(Ht, b, sizeof b));
	}
	if (!x3_dtype_info(Ht->dtype)->is_float)
		return x3_err(X3_EFORMAT, "hessian dtype %s is not a float type", x3_dtype_name(Ht->dtype));
	int64_t kh = Ht->shape[0], k = x3_pad128(k0);
	if (kh != k0 && kh != k)
		return x3_err(X3_EINVAL, "hessian is %lldx%lld but the weight has %lld inputs (expected %lldx%lld%s)",
		              (long long)kh, (long long)kh, (long long)k0, (long long)k0, (long long)k0,
		              k != k0 ? " or the padded size" : "");
	double count = 1;
	int rc = x3_meta_get_f64(Ht, "count", &count);
	if (rc == X3_EFORMAT)
		return x3_err(X3_EFORMAT, "hessian metadata count='%s' is not a number",
		              x3_meta_get(Ht, "count"));
	float *H = x3_tensor_f32(Ht);
	float *sign = malloc((size_t)k * sizeof(float));
	if (!H || !sign) {
		free(H), free(sign);
		return x3_err(X3_ENOMEM, "out of memory reading the hessian");
	}
	x3_quant_signs_draw(seed, draw, Ht->name, k, sign);
	rc = x3_qhess_finalize(H, kh, k, count, sign, out);
	free(H), free(sign);
	return rc;
}

int x3_qweight_from_frame(const x3_tensor *Wt, const char *key, const x3_qhess *h,
                          uint64_t seed, int policy, x3_qweight **out)
{
	return x3_qweight_from_frame_draw(Wt, key, h, seed, 0, policy, out);
}

int x3_qweight_from_frame_draw(const x3_tensor *Wt, const char *key, const x3_qhess *h,
                               uint64_t seed, int draw, int policy, x3_qweight **out)
{
	*out = NULL;
	char b[64];
	if (Wt->rank != 2)
		return x3_err(X3_EFORMAT, "weight must be rank 2 (out x in), got shape %s",
		              x3_shape_str(Wt, b, sizeof b));
	if (!x3_dtype_info(Wt->dtype)->is_float)
		return x3_err(X3_EFORMAT, "weight dtype %s is not a float type", x3_dtype_name(Wt->dtype));
	int64_t n0 = Wt->shape[0], k0 = Wt->shape[1];
	if (n0 <= 0 || k0 <= 0)
		return x3_err(X3_EFORMAT, "weight shape %s is empty", x3_shape_str(Wt, b, sizeof b));
	int64_t n = x3_pad128(n0);
	float *W = x3_tensor_f32(Wt);
	char *nm = malloc(strlen(key) + 4);
	float *sv = malloc((size_t)n * sizeof(float));
	if (!W || !nm || !sv) {
		free(W), free(nm), free(sv);
		return x3_err(X3_ENOMEM, "out of memory reading the weight");
	}
	sprintf(nm, "%s/sv", key);
	x3_quant_signs_draw(seed, draw, nm, n, sv);
	int rc = x3_regularize(W, n0, k0, h, sv, policy, out);
	free(W), free(nm), free(sv);
	return rc;
}

/* One draw: its finalized Hessian and regularized weight. */
static int draw_prepare(const x3_tensor *Ht, const x3_tensor *Wt, const char *key, uint64_t seed,
                        int draw, int policy, x3_qhess **h, x3_qweight **w)
{
	*h = NULL, *w = NULL;
	int64_t k0 = Wt->rank == 2 ? Wt->shape[1] : 0;
	if (k0 <= 0) {
		char b[64];
		return x3_err(X3_EFORMAT, "weight shape %s is not a non-empty matrix (out x in)",
		              x3_shape_str(Wt, b, sizeof b));
	}
	int rc;
	if (Ht) {
		rc = x3_qhess_from_frame_draw(Ht, k0, seed, draw, h);
		if (rc)
			return x3_errprefix(rc, "hessian '%s'", Ht->name);
	} else {
		int64_t k = x3_pad128(k0);
		float *s = malloc((size_t)k * sizeof(float));
		char *nm = malloc(strlen(key) + 4);
		if (!s || !nm) {
			free(s), free(nm);
			return x3_err(X3_ENOMEM, "out of memory");
		}
		sprintf(nm, "%s/su", key);
		x3_quant_signs_draw(seed, draw, nm, k, s);
		rc = x3_qhess_none(k, s, h);
		free(s), free(nm);
		if (rc)
			return rc;
	}
	rc = x3_qweight_from_frame_draw(Wt, key, *h, seed, draw, policy, w);
	if (rc) {
		x3_qhess_free(*h);
		*h = NULL;
	}
	return rc;
}

int x3_sign_search(const x3_tensor *Ht, const x3_tensor *Wt, const char *key, uint64_t seed,
                   int draws, int policy, int K, int cb, int threads, int64_t strips,
                   int metric, x3_qhess **h, x3_qweight **w, int *best, double *errs)
{
	*h = NULL, *w = NULL, *best = 0;
	if (draws < 1)
		return x3_err(X3_EINVAL, "sign draws %d is not positive", draws);
	double beste = INFINITY, g = 0;
	for (int d = 0; d < draws; d++) {
		x3_qhess *hd;
		x3_qweight *wd;
		int rc = draw_prepare(Ht, Wt, key, seed, d, policy, &hd, &wd);
		double e = 0;
		if (!rc && draws > 1)
			rc = x3_quantize_estimate(wd, hd, K, cb, threads, strips, metric, &g, &e);
		if (rc) {
			x3_qhess_free(hd), x3_qweight_free(wd);
			x3_qhess_free(*h), x3_qweight_free(*w);
			*h = NULL, *w = NULL;
			return x3_errprefix(rc, "sign draw %d", d);
		}
		if (errs)
			errs[d] = e;
		if (d == 0 || e < beste) {
			x3_qhess_free(*h), x3_qweight_free(*w);
			*h = hd, *w = wd, *best = d, beste = e;
		} else {
			x3_qhess_free(hd), x3_qweight_free(wd);
		}
	}
	return X3_OK;
}

int x3_bias_from_frame(const x3_tensor *Bt, int64_t n0, int64_t n, float **out)
{
	*out = NULL;
	char b[64];
	if (Bt->rank != 1 || Bt->shape[0] != n0)
		return x3_err(X3_EFORMAT, "bias shape %s does not match %lld output features",
		              x3_shape_str(Bt, b, sizeof b), (long long)n0);
	if (!x3_dtype_info(Bt->dtype)->is_float)
		return x3_err(X3_EFORMAT, "bias dtype %s is not a float type", x3_dtype_name(Bt->dtype));
	float *v = x3_tensor_f32(Bt);
	float *p = calloc((size_t)n, sizeof(float));
	if (!v || !p) {
		free(v), free(p);
		return x3_err(X3_ENOMEM, "out of memory reading the bias");
	}
	for (int64_t i = 0; i < n0; i++) {
		if (!isfinite(v[i])) {
			float x = v[i];
			free(v), free(p);
			return x3_err(X3_ENUM, "non-finite bias value %g at [%lld]", x, (long long)i);
		}
		p[i] = v[i];
	}
	free(v);
	*out = p;
	return X3_OK;
}
