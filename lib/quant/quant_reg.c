/* quant_reg.c: regularization of a weight (exl3(5) §9.2): the output
 * scales policy (always, never, auto by the skew of the Hessian's
 * diagonal), input and output scales, the signs and the rotation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <omp.h>
#include "codec.h"
#include "quant.h"
#include "quant_impl.h"

/* -1.24371088: RMS of the 3INST codebook, negated (exl3(5) §9.2 step 7) */
#define NEG_CB_SCALE (-1.24371088f)

int x3_out_scales_parse(const char *s, int *policy)
{
	static const char *names[] = { "always", "never", "auto" };
	for (int i = 0; i < 3; i++)
		if (!strcasecmp(s, names[i])) {
			*policy = i;
			return X3_OK;
		}
	return x3_err(X3_EINVAL, "unknown out_scales policy '%s' (always, never, auto)", s);
}

const char *x3_out_scales_name(int policy)
{
	switch (policy) {
	case X3_OUT_SCALES_ALWAYS: return "always";
	case X3_OUT_SCALES_NEVER: return "never";
	case X3_OUT_SCALES_AUTO: return "auto";
	}
	return "?";
}

static int cmp_desc(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

int x3_out_scales_auto(const float *d, int64_t k, double *skew, int *apply)
{
	*skew = 0;
	*apply = 0;
	double *s = xmalloc((size_t)k, sizeof(double));
	if (!s)
		return x3_err(X3_ENOMEM, "out of memory for the out_scales decision (%lld channels)",
		              (long long)k);
	for (int64_t i = 0; i < k; i++)
		s[i] = d[i] > 0 ? sqrt((double)d[i]) : 0.0;
	qsort(s, (size_t)k, sizeof *s, cmp_desc);
	double top = 0, all = 0;
	for (int64_t i = 0; i < k; i++) {
		if (i < k / 50)
			top += s[i];
		all += s[i];
	}
	free(s);
	*skew = all > 0 ? top / all : 0;
	*apply = *skew < 0.15;
	return X3_OK;
}

/* ---- regularization ---------------------------------------------------- */

void x3_qweight_free(x3_qweight *w)
{
	if (!w)
		return;
	free(w->W);
	free(w->su);
	free(w->sv);
	free(w);
}

x3_qweight *x3_qweight_wrap(int64_t k0, int64_t n0, int64_t k, int64_t n,
                            float *W, float *su, float *sv)
{
	x3_qweight *w = calloc(1, sizeof *w);
	if (!w)
		return NULL;
	w->k0 = k0, w->n0 = n0, w->k = k, w->n = n;
	w->W = W, w->su = su, w->sv = sv;
	return w;
}

int x3_regularize(const float *Whf, int64_t n0, int64_t k0, const x3_qhess *h,
                  const float *sign_v, int policy, x3_qweight **out)
{
	*out = NULL;
	if (n0 <= 0 || k0 <= 0)
		return x3_err(X3_EINVAL, "empty weight %lldx%lld", (long long)n0, (long long)k0);
	int64_t k = x3_pad128(k0), n = x3_pad128(n0);
	if (h->k != k)
		return x3_err(X3_EINVAL, "hessian is %lldx%lld but the weight has %lld inputs (padded %lld)",
		              (long long)h->k, (long long)h->k, (long long)k0, (long long)k);
	if ((size_t)k > SIZE_MAX / sizeof(float) / (size_t)n)
		return x3_err(X3_ENOMEM, "weight too large");
	float *W = xcalloc((size_t)(k * n), sizeof(float));
	float *su = xmalloc((size_t)k, sizeof(float));
	float *sv = xmalloc((size_t)n, sizeof(float));
	double *c = xcalloc((size_t)n, sizeof(double));
	x3_qweight *w = x3_qweight_wrap(k0, n0, k, n, W, su, sv);
	if (!W || !su || !sv || !c || !w) {
		free(c);
		if (w)
			x3_qweight_free(w);
		else
			free(W), free(su), free(sv);
		return x3_err(X3_ENOMEM, "out of memory for a %lldx%lld weight", (long long)k, (long long)n);
	}
	int rc = X3_OK;
	/* fp16 rounding as ExLlamaV3 loads it, transpose, pad */
	for (int64_t o = 0; o < n0 && rc == X3_OK; o++)
		for (int64_t i = 0; i < k0; i++) {
			float v = Whf[o * k0 + i];
			if (!isfinite(v)) {
				rc = x3_err(X3_ENUM, "non-finite value %g at [%lld][%lld]", v, (long long)o, (long long)i);
				break;
			}
			float f = x3_round_f16(v);
			if (!isfinite(f)) {
				rc = x3_err(X3_ENUM, "value %g at [%lld][%lld] overflows fp16", v, (long long)o, (long long)i);
				break;
			}
			W[i * n + o] = f;
		}
	if (rc) {
		free(c);
		x3_qweight_free(w);
		return rc;
	}
	/* 1. output-channel RMS, normalized to mean 1 */
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++)
			c[j] += (double)W[i * n + j] * W[i * n + j];
	double cmean = 0;
	for (int64_t j = 0; j < n; j++) {
		c[j] = sqrt(c[j] / (double)k);
		cmean += c[j];
	}
	cmean /= (double)n;
	w->zeros = !(cmean > 1e-30);
	if (!w->zeros)
		for (int64_t j = 0; j < n; j++)
			c[j] /= cmean;
	int apply;
	if (policy == X3_OUT_SCALES_ALWAYS)
		apply = 1;
	else if (policy == X3_OUT_SCALES_NEVER)
		apply = 0;
	else if (h->fallback || !h->diag)
		apply = 0;
	else {
		double skew;
		if ((rc = x3_out_scales_auto(h->diag, k, &skew, &apply))) {
			free(c);
			x3_qweight_free(w);
			return rc;
		}
	}
	/* an all-zero weight must come out exactly zero: svh = 0 does that */
	if (w->zeros)
		apply = 1;
	w->out_scales = apply;
	/* 2.-4. output scales */
	for (int64_t j = 0; j < n; j++) {
		int zero = fabs(c[j]) < 1e-30;
		if (apply)
			sv[j] = sign_v[j] * (zero ? 0.1f : (float)c[j]) + 1e-10f;
		else
			sv[j] = sign_v[j];
		c[j] = zero; /* reuse: zero-column flag */
	}
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++)
			W[i * n + j] /= sv[j];
	for (int64_t j = 0; j < n; j++)
		if (c[j] != 0)
			sv[j] = 0;
	/* 5. right Hadamard */
	if ((rc = x3q_had_rows(W, k, n))) {
		free(c);
		x3_qweight_free(w);
		return x3_errprefix(rc, "weight rotation");
	}
	/* 6.-8. input-channel RMS, rows normalized to the codebook RMS */
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++) {
		double s = 0;
		for (int64_t j = 0; j < n; j++)
			s += (double)W[i * n + j] * W[i * n + j];
		float ri = (float)sqrt(s / (double)n);
		if (ri < 1e-30f)
			ri = 0.1f;
		su[i] = h->sign[i] * ri / NEG_CB_SCALE + 1e-10f;
		for (int64_t j = 0; j < n; j++)
			W[i * n + j] /= su[i];
	}
	/* 9. left Hadamard */
	if ((rc = x3q_had_cols(W, k, n))) {
		free(c);
		x3_qweight_free(w);
		return x3_errprefix(rc, "weight rotation");
	}
	free(c);
	*out = w;
	return X3_OK;
}
