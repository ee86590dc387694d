/* quant_refit.c: the output scales refit after the trellis (least
 * squares per output channel under the proxy or the output metric) and
 * the output metric itself. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "blas.h"
#include "codec.h"
#include "quant.h"
#include "quant_impl.h"

/* ---- output scales refit after the trellis -------------------------------- */

int x3_refit_out_scales(const x3_qweight *w, const x3_qhess *h, int metric, x3_qresult *r,
                        double *alpha)
{
	int64_t k = w->k, n = w->n;
	if (!r->Q || !r->Wg || r->n != n || r->k != k)
		return x3_err(X3_EINVAL, "refit: the result has no kept Q and Wg of the whole %lldx%lld weight",
		              (long long)k, (long long)n);
	if (metric != X3_EST_PROXY && metric != X3_EST_OUTPUT)
		return x3_err(X3_EINVAL, "refit: bad metric %d", metric);
	r->proxy_err_before = r->proxy_err;
	if (w->zeros) {
		for (int64_t j = 0; alpha && j < n; j++)
			alpha[j] = 1;
		return X3_OK;
	}
	size_t kn = (size_t)(k * n);
	/* A = Wg Hb_n, B = Q Hb_n (k x n): the output side back in the basis
	 * where svh scales each column; T = M B, M the metric (k x k) */
	float *A = xmalloc(kn, sizeof(float)), *B = xmalloc(kn, sizeof(float));
	float *T = xmalloc(kn, sizeof(float)), *M = NULL;
	double *al = xmalloc((size_t)n, sizeof(double));
	int rc = X3_OK;
	if (!A || !B || !T || !al) {
		rc = x3_err(X3_ENOMEM, "out of memory for the refit of a %lldx%lld weight", (long long)k, (long long)n);
		goto done;
	}
	const float *H = h->fallback ? NULL : h->H;
	if (H && metric == X3_EST_OUTPUT) {
		if (!(M = x3q_output_metric(h->H, w->su, k))) {
			rc = x3_err(X3_ENOMEM, "out of memory for the output metric");
			goto done;
		}
		H = M;
	}
	memcpy(A, r->Wg, kn * sizeof(float));
	memcpy(B, r->Q, kn * sizeof(float));
	x3_had128_rows(A, k, n);
	x3_had128_rows(B, k, n);
	if (H)   /* H symmetric: T = H^T B = H B */
		x3_gemm_atb(k, n, k, H, k, B, n, 0.0f, T, n);
	else
		memcpy(T, B, kn * sizeof(float));
	#pragma omp parallel for schedule(static)
	for (int64_t j = 0; j < n; j++) {
		double num = 0, den = 0;
		for (int64_t i = 0; i < k; i++) {
			num += (double)A[i * n + j] * T[i * n + j];
			den += (double)B[i * n + j] * T[i * n + j];
		}
		/* alpha = argmin (a - alpha b)^T H (a - alpha b); keep 1 where the
		 * column is empty or zeroed by its scale. A non-finite sum (NaN
		 * from the inputs, or an overflow) stays NaN: an error below. */
		al[j] = !isfinite(num) || !isfinite(den) ? NAN
		      : den > 1e-30 && w->sv[j] != 0 ? num / den : 1.0;
	}
	for (int64_t j = 0; j < n; j++) {
		if (!isfinite(al[j])) {
			rc = x3_err(X3_ENUM, "refit: output channel %lld: the least-squares scale is not finite",
			            (long long)j);
			goto done;
		}
		uint16_t s = x3_f32_to_f16((float)(w->sv[j] * al[j]));
		if (!isfinite(x3_f16_to_f32(s))) {
			rc = x3_err(X3_ENUM, "refit: output scale %lld overflows fp16 (%g x %g)",
			            (long long)j, (double)w->sv[j], al[j]);
			goto done;
		}
		r->svh[j] = s;
		if (alpha)
			alpha[j] = al[j];
	}
	/* the proxy error of what is stored now: Q_eff = (B diag(alpha)) Hb_n */
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < n; j++)
			B[i * n + j] = (float)(B[i * n + j] * al[j]);
	x3_had128_rows(B, k, n);
	rc = x3_proxy_error(r->Wg, B, h->fallback ? NULL : h->H, k, n, &r->proxy_err);
done:
	free(A), free(B), free(T), free(M), free(al);
	return rc;
}

/* The output metric M = R H R, R = Hb diag(|su|) Hb, of a rotated H (k x k):
 * H is Hb diag(sigma_u) H0 diag(sigma_u) Hb, so M is the Hessian of the
 * reconstruction's input side diag(su) Hb (exl3(5) section 1.2), the true
 * output error's metric up to the output scales. */
float *x3q_output_metric(const float *H, const float *su, int64_t k)
{
	float *M = xmalloc((size_t)(k * k), sizeof(float));
	if (!M)
		return NULL;
	memcpy(M, H, (size_t)(k * k) * sizeof(float));
	x3_had128_rows(M, k, k);
	x3_had128_cols(M, k, k);
	#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < k; j++)
			M[i * k + j] *= fabsf(su[i]) * fabsf(su[j]);
	x3_had128_rows(M, k, k);
	x3_had128_cols(M, k, k);
	return M;
}
