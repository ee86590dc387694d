/* quant.c: the EXL3 quantizer on CPU (exl3(5) §9), one K of one weight:
 * scale search, LDLQ, refinement, proxy error and packing
 * (x3_quantize_g), on a sample of the output strips (x3_quantize_sample),
 * the cheap estimate of the sign search, and the reconstruction. The
 * stages are in quant_*.c (quant_impl.h); dense algebra goes through
 * BLAS/LAPACK, the tile quantizer is the Viterbi encoder of codec.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "codec.h"
#include "device.h"
#include "quant.h"
#include "quant_impl.h"

/* Where LDLQ runs (x3_quant_set_ldlq_device): the GPU backend, or NULL */
static const x3_gpu *ldlq_gpu;

int x3_quant_set_ldlq_device(int dev)
{
	if (dev != X3_DEVICE_CPU && dev != X3_DEVICE_CUDA)
		return x3_err(X3_EINVAL, "LDLQ device %s (cpu or cuda expected)", x3_device_name(dev));
	const x3_gpu *g = NULL;
	if (dev == X3_DEVICE_CUDA && x3_gpu_open(&g))
		return X3_EUNSUP;
	ldlq_gpu = g;
	return X3_OK;
}

/* ---- one K ---------------------------------------------------------------- */

void x3_qresult_free(x3_qresult *r)
{
	if (!r)
		return;
	free(r->trellis);
	free(r->suh);
	free(r->svh);
	free(r->Q);
	free(r->Wg);
	free(r->strip);
	free(r);
}

int64_t x3_quant_bytes(int64_t k, int64_t n, int K, int cb, int has_bias)
{
	return k * n * K / 8 + 2 * k + 2 * n + (cb == X3_CB_3INST ? 0 : 4) + (has_bias ? 2 * n : 0);
}

/* The per-K step on the columns W (k x n) of a regularized weight, with
 * their input scales su (k) and output scales sv (n): scale search over at
 * most cap sampled tiles of the whole weight Wall (k x nall), LDLQ, proxy
 * error, packing. r is allocated and has K, cb, k, n and fallback set; the
 * rest is filled here. */
static int quantize_cols(const float *W, const float *su, const float *sv, int64_t k, int64_t n,
                         const float *Wall, int64_t nall, int zeros, const x3_qhess *h, int K,
                         int cb, int threads, int keep, int64_t cap, double gfix, int refine,
                         x3_qresult *r)
{
	size_t kn = (size_t)(k * n);
	float *Wg = xmalloc(kn, sizeof(float));
	float *Q = xmalloc(kn, sizeof(float));
	uint16_t *st = xmalloc(kn, sizeof(uint16_t));
	r->trellis = xmalloc(kn / 16 * (size_t)K, sizeof(uint16_t));
	r->suh = xmalloc((size_t)k, sizeof(uint16_t));
	r->svh = xmalloc((size_t)n, sizeof(uint16_t));
	int rc = X3_OK;
	if (!Wg || !Q || !st || !r->trellis || !r->suh || !r->svh) {
		rc = x3_err(X3_ENOMEM, "out of memory for a %lldx%lld weight", (long long)k, (long long)n);
		goto fail;
	}
	/* gfix > 0: a scale found before (x3_quantize_g): no search, or with
	 * refine the fine grid around it; gfix = 0 with refine: the fine grid
	 * around the predicted scale (x3_quantize_sample); else the search */
	const double v0 = x3q_vit_seconds;
	double t = x3_now(), t1;
	if (gfix > 0 && !refine)
		r->g = gfix;
	else if ((rc = x3q_scale_search(Wall, k, nall, K, cb, threads, cap, refine ? (gfix > 0 ? gfix : -1) : 0,
	                            &r->g, &r->search_tiles)))
		goto fail;
	float g = (float)r->g;
	#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < kn; i++)
		Wg[i] = W[i] * g;
	t1 = x3_now(), r->t_search = t1 - t, t = t1;
	if (ldlq_gpu) {
		rc = ldlq_gpu->ldlq(Wg, k, n, h->fallback ? NULL : h->L, K, cb, st, Q);
		r->ldlq_tiles += (int64_t)(kn / 256);
	} else
		rc = x3q_ldlq(Wg, k, n, h->fallback ? NULL : h->L, K, cb, threads, st, Q, &r->ldlq_tiles);
	if (rc)
		goto fail;
	t1 = x3_now(), r->t_ldlq = t1 - t, t = t1;
	if (x3_quant_ldlq_passes() > 0 && !h->fallback &&
	    (rc = x3q_ldlq_refine(Wg, k, n, h->H, K, cb, threads, x3_quant_ldlq_passes(), st, Q, &r->ldlq_tiles,
	                      &r->refine_kept)))
		goto fail;
	t1 = x3_now(), r->t_refine = t1 - t, t = t1;
	rc = x3_proxy_error(Wg, Q, h->fallback ? NULL : h->H, k, n, &r->proxy_err);
	if (rc)
		goto fail;
	r->t_proxy = x3_now() - t;
	r->t_viterbi = x3q_vit_seconds - v0;
	if (zeros)
		r->proxy_err = 0;
	#pragma omp parallel for schedule(static)
	for (size_t t = 0; t < kn / 256; t++)
		x3_trellis_pack(K, st + 256 * t, r->trellis + (size_t)16 * K * t);
	for (int64_t i = 0; i < k; i++)
		r->suh[i] = x3_f32_to_f16(su[i] / g);
	for (int64_t j = 0; j < n; j++)
		r->svh[j] = x3_f32_to_f16(sv[j]);
	free(st);
	if (keep & X3_QKEEP_Q)
		r->Q = Q;
	else
		free(Q);
	if (keep & X3_QKEEP_W)
		r->Wg = Wg;
	else
		free(Wg);
	return X3_OK;
fail:
	free(Wg), free(Q), free(st);
	return rc;
}

static int quantize_check(const x3_qweight *w, const x3_qhess *h, int K, int cb)
{
	if (K < 1 || K > 8)
		return x3_err(X3_EINVAL, "K=%d is outside 1..8", K);
	if (cb < 0 || cb >= X3_CB_COUNT)
		return x3_err(X3_EINVAL, "bad codebook id %d", cb);
	if (h->k != w->k)
		return x3_err(X3_EINVAL, "hessian is %lldx%lld but the weight has %lld (padded) inputs",
		              (long long)h->k, (long long)h->k, (long long)w->k);
	return X3_OK;
}

static x3_qresult *qresult_new(const x3_qweight *w, const x3_qhess *h, int K, int cb, int64_t n)
{
	x3_qresult *r = calloc(1, sizeof *r);
	if (!r) {
		x3_err(X3_ENOMEM, "out of memory");
		return NULL;
	}
	r->K = K, r->cb = cb, r->k = w->k, r->n = n;
	r->fallback = h->fallback;
	r->strips_total = w->n / 16;
	return r;
}

int x3_quantize(const x3_qweight *w, const x3_qhess *h, int K, int cb,
                int threads, int keep, x3_qresult **out)
{
	return x3_quantize_g(w, h, K, cb, threads, keep, 0, 0, out);
}

int x3_quantize_g(const x3_qweight *w, const x3_qhess *h, int K, int cb,
                  int threads, int keep, double g, int refine, x3_qresult **out)
{
	*out = NULL;
	int rc = quantize_check(w, h, K, cb);
	if (rc)
		return rc;
	if (!(g >= 0 && isfinite(g)))
		return x3_err(X3_EINVAL, "global scale %g is not a positive number", g);
	double t0 = x3_now();
	x3_qresult *r = qresult_new(w, h, K, cb, w->n);
	if (!r)
		return X3_ENOMEM;
	r->nstrips = r->strips_total;
	rc = quantize_cols(w->W, w->su, w->sv, w->k, w->n, w->W, w->n, w->zeros, h, K, cb, threads,
	                   keep, x3_scale_sample_cap(w->k, w->n), g, refine, r);
	if (rc) {
		x3_qresult_free(r);
		return rc;
	}
	r->seconds = x3_now() - t0;
	*out = r;
	return X3_OK;
}

int64_t x3_sample_strips(int64_t n, double frac, uint64_t seed, const char *name, int64_t *strip)
{
	int64_t ns = n / 16;
	if (ns <= 0)
		return 0;
	int64_t m = frac >= 1 ? ns : (int64_t)ceil(frac * (double)ns - 1e-9);
	/* at least X3_SAMPLE_MIN_STRIPS: one strip of a narrow linear is too
	 * noisy an estimate (it measured KL +2.5-2.9% on 128-wide linears) */
	m = m < X3_SAMPLE_MIN_STRIPS ? X3_SAMPLE_MIN_STRIPS : m;
	m = m > ns ? ns : m;
	/* one strip drawn uniformly from each of m equal runs of strips
	 * (stratified: the sample spans the width, e.g. both 128-column
	 * Hadamard blocks of a padded weight, in proportion) */
	char nm[1100];
	snprintf(nm, sizeof nm, "%s/strips", name ? name : "");
	x3_rng rng;
	x3_rng_seed(&rng, seed, x3_rng_stream_of(nm));
	for (int64_t j = 0; j < m; j++) {
		int64_t lo = j * ns / m, hi = (j + 1) * ns / m;
		strip[j] = lo + (int64_t)(x3_rng_u64(&rng) % (uint64_t)(hi - lo));
	}
	return m;
}

int x3_quantize_sample(const x3_qweight *w, const x3_qhess *h, int K, int cb, int threads,
                       double frac, int predict, uint64_t seed, const char *name, x3_qresult **out)
{
	*out = NULL;
	int rc = quantize_check(w, h, K, cb);
	if (rc)
		return rc;
	if (!(frac > 0 && frac <= 1))
		return x3_err(X3_EINVAL, "sample fraction %g is not in (0, 1]", frac);
	double t0 = x3_now();
	int64_t k = w->k, ns = w->n / 16;
	int64_t *strip = xmalloc((size_t)ns, sizeof *strip);
	int64_t m = strip ? x3_sample_strips(w->n, frac, seed, name, strip) : 0;
	if (m <= 0) {
		free(strip);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	int64_t n = 16 * m;
	x3_qresult *r = qresult_new(w, h, K, cb, n);
	float *W = xmalloc((size_t)(k * n), sizeof *W), *sv = xmalloc((size_t)n, sizeof *sv);
	if (!r || !W || !sv) {
		free(strip), free(W), free(sv), x3_qresult_free(r);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	r->strip = strip, r->nstrips = m;
	/* the chosen strips' columns, in order: LDLQ mixes rows only (its
	 * feedback is L^T E over the input dimension; x3_gemm_atb's column j
	 * depends on column j alone) and a tile lies within one strip, so
	 * these columns quantize as they would within the whole */
	for (int64_t i = 0; i < k; i++)
		for (int64_t j = 0; j < m; j++)
			memcpy(W + i * n + 16 * j, w->W + i * w->n + 16 * strip[j], 16 * sizeof *W);
	for (int64_t j = 0; j < m; j++)
		memcpy(sv + 16 * j, w->sv + 16 * strip[j], 16 * sizeof *sv);
	/* the scale search samples the whole weight as x3_quantize's does (its
	 * diagonal and outliers), with the tile cap in proportion to the
	 * strips kept (with every strip, x3_quantize's), at least one tile */
	int64_t capf = x3_scale_sample_cap(k, w->n), cap = (capf * m + ns - 1) / ns;
	rc = quantize_cols(W, w->su, sv, k, n, w->W, w->n, w->zeros, h, K, cb, threads, 0,
	                   cap > 0 ? cap : 1, 0, predict, r);
	free(W), free(sv);
	if (rc) {
		x3_qresult_free(r);
		return rc;
	}
	r->seconds = x3_now() - t0;
	*out = r;
	return X3_OK;
}

int x3_reconstruct(const float *Wt, const uint16_t *suh, const uint16_t *svh,
                   int64_t k, int64_t n, float *W)
{
	if (k <= 0 || n <= 0 || k % 128 || n % 128)
		return x3_err(X3_EINVAL, "reconstruct: shape %lldx%lld is not a multiple of 128",
		              (long long)k, (long long)n);
	memcpy(W, Wt, (size_t)(k * n) * sizeof(float));
	x3_had128_rows(W, k, n);
	x3_had128_cols(W, k, n);
	for (int64_t i = 0; i < k; i++) {
		float a = x3_f16_to_f32(suh[i]);
		for (int64_t j = 0; j < n; j++)
			W[i * n + j] *= a * x3_f16_to_f32(svh[j]);
	}
	return X3_OK;
}

/* ---- cheap estimate (for the sign search) --------------------------------- */

int64_t x3_estimate_strips(int64_t n)
{
	int64_t tn = n / 16, s = tn / 8;
	if (s < X3_EST_MIN_STRIPS)
		s = X3_EST_MIN_STRIPS;
	return s < tn ? s : tn;
}

int x3_quantize_estimate(const x3_qweight *w, const x3_qhess *h, int K, int cb,
                         int threads, int64_t strips, int metric, double *g, double *err)
{
	*err = -1;
	if (K < 1 || K > 8)
		return x3_err(X3_EINVAL, "K=%d is outside 1..8", K);
	if (cb < 0 || cb >= X3_CB_COUNT)
		return x3_err(X3_EINVAL, "bad codebook id %d", cb);
	int64_t k = w->k, n = w->n, tn = n / 16;
	if (k < 1 || tn < 1)
		return x3_err(X3_EINVAL, "a %lldx%lld weight has no 16x16 tiles", (long long)k,
		              (long long)n);
	if (h->k != k)
		return x3_err(X3_EINVAL, "hessian is %lldx%lld but the weight has %lld (padded) inputs",
		              (long long)h->k, (long long)h->k, (long long)k);
	if (w->zeros) {
		*err = 0;
		return X3_OK;
	}
	if (strips <= 0 || strips > tn)
		strips = tn;
	int rc;
	if (!(*g > 0) && (rc = x3_scale_search(w->W, k, n, K, cb, threads, g)))
		return rc;
	/* the strips: 16 output columns each, evenly spaced; LDLQ feeds the
	 * error back along the input only, so a strip quantizes as it would in
	 * the whole matrix */
	int64_t ns = 16 * strips;
	float *Ws = xmalloc((size_t)(k * ns), sizeof(float));
	float *Q = xmalloc((size_t)(k * ns), sizeof(float));
	uint16_t *st = xmalloc((size_t)(k * ns), sizeof(uint16_t));
	if (!Ws || !Q || !st) {
		free(Ws), free(Q), free(st);
		return x3_err(X3_ENOMEM, "out of memory for the estimate of a %lldx%lld weight",
		              (long long)k, (long long)n);
	}
	float gf = (float)*g;
	for (int64_t s = 0; s < strips; s++) {
		int64_t c0 = 16 * ((2 * s + 1) * tn / (2 * strips));
		for (int64_t i = 0; i < k; i++)
			for (int j = 0; j < 16; j++)
				Ws[i * ns + 16 * s + j] = w->W[i * n + c0 + j] * gf;
	}
	rc = x3_ldlq(Ws, k, ns, h->fallback ? NULL : h->L, K, cb, threads, st, Q);
	float *M = NULL;
	if (!rc && metric == X3_EST_OUTPUT && !h->fallback && !(M = x3q_output_metric(h->H, w->su, k)))
		rc = x3_err(X3_ENOMEM, "out of memory for the output metric");
	if (!rc)
		rc = x3_proxy_error(Ws, Q, h->fallback ? NULL : M ? M : h->H, k, ns, err);
	free(Ws), free(Q), free(st), free(M);
	return rc;
}
