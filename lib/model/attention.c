/* attention.c: causal attention on BLAS products (attention.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include "attention.h"
#include "blas.h"
#include "x3.h"

/* the first key query i sees */
static int64_t first_key(int64_t i, int64_t window)
{
	return window > 0 && i >= window ? i - window + 1 : 0;
}

/* One (row, head): K (cols, hd) and V (cols, hdv) of the head gathered
 * contiguous; then per block of QB queries i0..i0+nb-1, the keys kst..kend-1
 * that any of them sees: S = Qs K^T (nb x nk, one SGEMM), each query's
 * weights exp(s - max) over its own keys and zero elsewhere, O = P V (one
 * SGEMM), each output row times 1 / (sum of its weights). */
static void head_task(const float *q, const float *k, const float *v, float *out, int64_t r,
                      int64_t h, int64_t cols, int64_t nq, int64_t nkv, int64_t hd, int64_t hdv,
                      float scale, int64_t window, float softcap, const float *sinks, float *kh,
                      float *vh, float *qb, float *S, float *ob)
{
	/* the head's sink logit: a key without a value in the softmax */
	const float sink = sinks ? sinks[h] : -INFINITY;
	const int64_t kvh = h / (nq / nkv);
	const float *kr = k + (r * cols * nkv + kvh) * hd;
	const float *vr = v + (r * cols * nkv + kvh) * hdv;
	for (int64_t j = 0; j < cols; j++) {
		memcpy(kh + j * hd, kr + j * nkv * hd, (size_t)hd * sizeof *kh);
		memcpy(vh + j * hdv, vr + j * nkv * hdv, (size_t)hdv * sizeof *vh);
	}
	for (int64_t i0 = 0; i0 < cols; i0 += X3_ATT_QB) {
		const int64_t nb = cols - i0 < X3_ATT_QB ? cols - i0 : X3_ATT_QB;
		const int64_t kst = first_key(i0, window), kend = i0 + nb, nk = kend - kst;
		for (int64_t t = 0; t < nb; t++) {
			const float *qi = q + ((r * cols + i0 + t) * nq + h) * hd;
			for (int64_t e = 0; e < hd; e++)
				qb[t * hd + e] = qi[e] * scale;
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)nk, (int)hd, 1.0f, qb,
		            (int)hd, kh + kst * hd, (int)hd, 0.0f, S, (int)nk);
		float inv[X3_ATT_QB];
		for (int64_t t = 0; t < nb; t++) {
			const int64_t i = i0 + t, lo = first_key(i, window) - kst, hi = i - kst; /* keys lo..hi */
			float *s = S + t * nk;
			if (softcap > 0)
				for (int64_t j = lo; j <= hi; j++)
					s[j] = softcap * tanhf(s[j] / softcap);
			float mx = sink;
			for (int64_t j = lo; j <= hi; j++)
				mx = s[j] > mx ? s[j] : mx;
			float sum = 0;
			for (int64_t j = lo; j <= hi; j++) {
				s[j] = expf(s[j] - mx);
				sum += s[j];
			}
			if (sinks)
				sum += expf(sink - mx);
			inv[t] = 1.0f / sum;
			if (lo > 0)
				memset(s, 0, (size_t)lo * sizeof *s);
			if (hi + 1 < nk)
				memset(s + hi + 1, 0, (size_t)(nk - hi - 1) * sizeof *s);
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nb, (int)hdv, (int)nk, 1.0f, S,
		            (int)nk, vh + kst * hdv, (int)hdv, 0.0f, ob, (int)hdv);
		for (int64_t t = 0; t < nb; t++) {
			float *o = out + ((r * cols + i0 + t) * nq + h) * hdv;
			for (int64_t e = 0; e < hdv; e++)
				o[e] = ob[t * hdv + e] * inv[t];
		}
	}
}

int x3_attention(const float *q, const float *k, const float *v, float *out, int64_t nrows,
                 int64_t cols, int64_t nq, int64_t nkv, int64_t hd, int64_t hdv, float scale,
                 int64_t window, float softcap)
{
	return x3_attention_sinks(q, k, v, out, nrows, cols, nq, nkv, hd, hdv, scale, window, softcap, NULL);
}

int x3_attention_sinks(const float *q, const float *k, const float *v, float *out, int64_t nrows,
                       int64_t cols, int64_t nq, int64_t nkv, int64_t hd, int64_t hdv, float scale,
                       int64_t window, float softcap, const float *sinks)
{
	if (nrows <= 0 || cols <= 0 || nq <= 0)
		return X3_OK;
	/* the keys a block of queries sees: all before it, or a window's */
	const int64_t maxk = window > 0 && window + X3_ATT_QB < cols ? window + X3_ATT_QB : cols;
	int fail = 0;
	int prev = x3_blas_serial_begin();
	#pragma omp parallel if(nrows * nq * cols * cols * hd > (1 << 20))
	{
		float *kh = malloc((size_t)(cols * hd) * sizeof *kh);
		float *vh = malloc((size_t)(cols * hdv) * sizeof *vh);
		float *qb = malloc((size_t)(X3_ATT_QB * hd) * sizeof *qb);
		float *S = malloc((size_t)(X3_ATT_QB * maxk) * sizeof *S);
		float *ob = malloc((size_t)(X3_ATT_QB * hdv) * sizeof *ob);
		const int ok = kh && vh && qb && S && ob;
		if (!ok) {
			#pragma omp atomic write
			fail = 1;
		}
		#pragma omp for collapse(2) schedule(dynamic, 1)
		for (int64_t r = 0; r < nrows; r++)
			for (int64_t h = 0; h < nq; h++)
				if (ok)
					head_task(q, k, v, out, r, h, cols, nq, nkv, hd, hdv, scale, window, softcap,
					          sinks, kh, vh, qb, S, ob);
		free(kh), free(vh), free(qb), free(S), free(ob);
	}
	x3_blas_serial_end(prev);
	return fail ? x3_err(X3_ENOMEM, "attention: out of memory") : X3_OK;
}
