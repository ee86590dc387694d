/* quant_ldlq.c: LDLQ (exl3(5) §9.4), 16-row blocks from the last with the
 * error of the blocks below fed back through L, and the refinement passes
 * after it (block coordinate descent on the proxy error). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <lapacke.h>
#include "blas.h"
#include "codec.h"
#include "quant.h"
#include "quant_impl.h"

/* ---- LDLQ --------------------------------------------------------------- */

/* Quantize the 16-row block X (16 x n): tiles to trellis order, Viterbi,
 * states of the n/16 tiles to st, decoded values back to Q (16 x n). */
static int quant_block(const float *X, int64_t n, int K, int cb, int threads,
                       float *tiles, float *vals, uint16_t *st, float *Q, int64_t *count)
{
	int64_t tn = n / 16;
	for (int64_t t = 0; t < tn; t++)
		x3q_get_tile(X, n, 0, t, tiles + 256 * t);
	struct x3q_tmemo memo = { 0 };   /* equal tiles of this block only */
	int rc = x3q_encode_tiles(K, cb, tiles, tn, st, vals, threads, &memo, count);
	x3q_tmemo_free(&memo);
	if (rc)
		return rc;
	for (int64_t t = 0; t < tn; t++)
		for (int i = 0; i < 256; i++) {
			int p = x3_tile_perm[i];
			Q[(p / 16) * n + t * 16 + p % 16] = vals[256 * t + i];
		}
	return X3_OK;
}

int x3_ldlq(const float *W, int64_t k, int64_t n, const float *L, int K,
            int cb, int threads, uint16_t *states, float *Q)
{
	return x3q_ldlq(W, k, n, L, K, cb, threads, states, Q, NULL);
}

/* x3_ldlq; *count (may be NULL) += the tiles the Viterbi encoded */
int x3q_ldlq(const float *W, int64_t k, int64_t n, const float *L, int K,
                int cb, int threads, uint16_t *states, float *Q, int64_t *count)
{
	if (K < 1 || K > 8)
		return x3_err(X3_EINVAL, "K=%d is outside 1..8", K);
	if (k <= 0 || n <= 0 || k % X3_QSPAN || n % 16)
		return x3_err(X3_EINVAL, "ldlq: bad shape %lldx%lld", (long long)k, (long long)n);
	int64_t tn = n / 16;
	float *tiles = xmalloc((size_t)(tn * 256), sizeof(float));
	float *vals = xmalloc((size_t)(tn * 256), sizeof(float));
	float *X = xmalloc((size_t)(16 * n), sizeof(float));
	float *E = L ? xmalloc((size_t)(k * n), sizeof(float)) : NULL;  /* W - Q */
	float *P = L ? xmalloc((size_t)(X3_QSPAN * n), sizeof(float)) : NULL; /* prod_cache */
	int rc = X3_OK;
	if (!tiles || !vals || !X || (L && (!E || !P))) {
		rc = x3_err(X3_ENOMEM, "out of memory in ldlq");
		goto out;
	}
	for (int64_t s1 = k; s1 > 0 && rc == X3_OK; s1 -= X3_QSPAN) {
		int64_t s0 = s1 - X3_QSPAN;
		/* feedback from the spans below, once per span:
		 * P = L[s1:k, s0:s1]^T E[s1:k, :]  (128 x n) */
		if (L && s1 < k)
			x3_gemm_atb(X3_QSPAN, n, k - s1, L + s1 * k + s0, k, E + s1 * n, n, 0.0f, P, n);
		else if (L)
			memset(P, 0, (size_t)(X3_QSPAN * n) * sizeof(float));
		for (int64_t b1 = s1; b1 > s0; b1 -= 16) {
			int64_t b0 = b1 - 16;
			memcpy(X, W + b0 * n, (size_t)(16 * n) * sizeof(float));
			if (L) {
				/* X = W_B + P_B + L[b1:s1, B]^T E[b1:s1, :] */
				const float *Pb = P + (b0 - s0) * n;
				for (int64_t i = 0; i < 16 * n; i++)
					X[i] += Pb[i];
				if (b1 < s1)
					x3_gemm_atb(16, n, s1 - b1, L + b1 * k + b0, k, E + b1 * n, n, 1.0f, X, n);
			}
			rc = quant_block(X, n, K, cb, threads, tiles, vals,
			                 states + (b0 / 16) * tn * 256, Q + b0 * n, count);
			if (rc)
				break;
			if (L)
				for (int64_t i = b0 * n; i < b1 * n; i++)
					E[i] = W[i] - Q[i];
		}
	}
out:
	free(tiles), free(vals), free(X), free(E), free(P);
	return rc;
}

/* ---- refinement passes after LDLQ (x3_quant_set_ldlq_passes) -----------
 * LDLQ encodes each 16-row block knowing the error of the blocks below it
 * only. A pass goes over the blocks again, in LDLQ's order (the last block
 * first), and re-encodes each with every other block's error known: the
 * proxy error tr(Eᵀ H E) as a function of block B's error E_B, the rest
 * fixed, is
 * tr(E_Bᵀ H_BB E_B) + 2 tr(E_Bᵀ g_B) + const with g_B = H[B, not B] E[not B],
 * least at E_B = -H_BB⁻¹ g_B, so the Viterbi's target is W_B + H_BB⁻¹ g_B.
 * The Viterbi's codes are kept only where they lower that function (the
 * Viterbi weighs the block's rows alike, not by H_BB), so no pass raises
 * the proxy error. A block coordinate descent on it: each pass one more
 * Viterbi of every tile. The objective is a sum over output columns, so a
 * sample of columns (x3_quantize_sample) refines as the whole would. HE is
 * kept up to date through the kept changes (x3_gemm_atb, whose column j
 * depends on column j alone: the result does not depend on the threads). */
static int ldlq_passes = 0;

int x3_quant_set_ldlq_passes(int p)
{
	if (p < 0 || p > X3_LDLQ_PASSES_MAX)
		return x3_err(X3_EINVAL, "LDLQ refinement passes %d are outside 0..%d", p,
		              X3_LDLQ_PASSES_MAX);
	ldlq_passes = p;
	return X3_OK;
}

int x3_quant_ldlq_passes(void)
{
	return ldlq_passes;
}

int x3q_ldlq_refine(const float *W, int64_t k, int64_t n, const float *H, int K, int cb,
                       int threads, int passes, uint16_t *states, float *Q, int64_t *count,
                       int64_t *kept)
{
	int64_t tn = n / 16;
	size_t bn = (size_t)(16 * n);
	float *E = xmalloc((size_t)(k * n), sizeof(float));
	float *HE = xmalloc((size_t)(k * n), sizeof(float));
	float *G = xmalloc(bn, sizeof(float)), *X = xmalloc(bn, sizeof(float));
	float *Qn = xmalloc(bn, sizeof(float)), *D = xmalloc(bn, sizeof(float));
	float *tiles = xmalloc((size_t)(tn * 256), sizeof(float));
	float *vals = xmalloc((size_t)(tn * 256), sizeof(float));
	uint16_t *stn = xmalloc((size_t)(tn * 256), sizeof(uint16_t));
	float Hb[256], C[256];
	int rc = X3_OK;
	if (!E || !HE || !G || !X || !Qn || !D || !tiles || !vals || !stn) {
		rc = x3_err(X3_ENOMEM, "out of memory in x3q_ldlq_refine");
		goto out;
	}
	for (int64_t i = 0; i < k * n; i++)
		E[i] = W[i] - Q[i];
	x3_gemm_atb(k, n, k, H, k, E, n, 0.0f, HE, n);
	for (int pass = 0; pass < passes && rc == X3_OK; pass++)
		for (int64_t b0 = k - 16; b0 >= 0; b0 -= 16) {
			for (int i = 0; i < 16; i++)
				for (int j = 0; j < 16; j++)
					Hb[i * 16 + j] = C[i * 16 + j] = H[(b0 + i) * k + b0 + j];
			/* g = HE_B - H_BB E_B */
			const float *Eb = E + b0 * n;
			for (int i = 0; i < 16; i++)
				for (int64_t c = 0; c < n; c++) {
					double a = HE[(b0 + i) * n + c];
					for (int j = 0; j < 16; j++)
						a -= (double)Hb[i * 16 + j] * Eb[j * n + c];
					G[i * n + c] = (float)a;
				}
			memcpy(X, G, bn * sizeof(float));
			/* H_BB is a principal block of the damped SPD Hessian whose
			 * block LDL succeeded; should its Cholesky fail all the
			 * same (non-finite input), the block keeps its codes */
			if (LAPACKE_spotrf(LAPACK_ROW_MAJOR, 'L', 16, C, 16) ||
			    LAPACKE_spotrs(LAPACK_ROW_MAJOR, 'L', 16, (lapack_int)n, C, 16, X, (lapack_int)n))
				continue;
			for (size_t i = 0; i < bn; i++)
				X[i] += W[b0 * n + (int64_t)i];
			if ((rc = quant_block(X, n, K, cb, threads, tiles, vals, stn, Qn, count)))
				break;
			/* f(e) = e^T H_BB e + 2 e^T g, old against new */
			double fo = 0, fn = 0;
			for (int64_t c = 0; c < n; c++) {
				float eo[16], en[16];
				for (int i = 0; i < 16; i++) {
					eo[i] = Eb[i * n + c];
					en[i] = W[(b0 + i) * n + c] - Qn[i * n + c];
				}
				for (int i = 0; i < 16; i++) {
					double ho = 0, hn = 0;
					for (int j = 0; j < 16; j++)
						ho += (double)Hb[i * 16 + j] * eo[j], hn += (double)Hb[i * 16 + j] * en[j];
					fo += eo[i] * (ho + 2.0 * G[i * n + c]);
					fn += en[i] * (hn + 2.0 * G[i * n + c]);
				}
			}
			if (!(fn < fo))
				continue;
			for (size_t i = 0; i < bn; i++) {
				float e = W[b0 * n + (int64_t)i] - Qn[i];
				D[i] = e - E[b0 * n + (int64_t)i];
				E[b0 * n + (int64_t)i] = e;
			}
			memcpy(Q + b0 * n, Qn, bn * sizeof(float));
			(*kept)++;
			memcpy(states + (b0 / 16) * tn * 256, stn, (size_t)(tn * 256) * sizeof(uint16_t));
			x3_gemm_atb(k, n, 16, H + b0 * k, k, D, n, 1.0f, HE, n);
		}
out:
	free(E), free(HE), free(G), free(X), free(Qn), free(D), free(tiles), free(vals), free(stn);
	return rc;
}
