/* gdn.c: the Gated DeltaNet (gdn.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include "gdn.h"
#include "blas.h"
#include "x3.h"

#define C_ X3_GDN_CHUNK
/* the L2 normalization's epsilon (the FLA kernels' and Transformers') */
#define L2_EPS 1e-6

int64_t x3_gdn_conv_dim(const x3_gdn_shape *s) { return 2 * s->nk * s->dk + s->nv * s->dv; }

int x3_gdn_check(const x3_gdn_shape *s)
{
	if (s->nk <= 0 || s->nv <= 0 || s->dk <= 0 || s->dv <= 0 || s->kconv <= 0)
		return x3_err(X3_EINVAL, "gated deltanet: heads %lld/%lld of %lld/%lld, conv kernel %lld: "
		              "each must be positive", (long long)s->nk, (long long)s->nv, (long long)s->dk,
		              (long long)s->dv, (long long)s->kconv);
	if (s->nv % s->nk)
		return x3_err(X3_EINVAL, "gated deltanet: %lld value heads are not a multiple of %lld key heads",
		              (long long)s->nv, (long long)s->nk);
	return X3_OK;
}

static double softplus(double x) { return x > 20 ? x : log1p(exp(x)); }
static double sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double silu(double x) { return x / (1 + exp(-x)); }

/* ---- the chunked delta rule --------------------------------------------- */

int64_t x3_gdn_rule_scratch(int64_t dk, int64_t dv)
{
	return 2 * C_ * C_ + 2 * C_ * (dk + dv) + C_ * dv + C_ + dk * dv;
}

/* One sequence, chunk by chunk. Within a chunk of n tokens with the
 * cumulative log decays G_i (from the chunk's start, inclusive) and the
 * state S0 at its start, the updates U (n, dv) solve
 *   (I + A) U = diag(beta) V - diag(beta e^G) K S0,
 *   A_ij = beta_i e^(G_i - G_j) k_i.k_j  (j < i),
 * the outputs are O = diag(e^G) Q S0 + (e^(G_i - G_j) q_i.k_j)_(j <= i) U,
 * and the state after it S = e^(G_n) S0 + sum_j e^(G_n - G_j) k_j u_j^T. */
void x3_gdn_rule_chunked(const float *q, const float *k, const float *v, const float *g,
                         const float *beta, int64_t T, int64_t dk, int64_t dv, float *o,
                         float *scratch)
{
	const int64_t nx = dv + dk;
	float *KK = scratch, *P = KK + C_ * C_, *X = P + C_ * C_, *Kd = X + C_ * nx;
	float *U = Kd + C_ * dk, *G = U + C_ * dv, *S = G + C_;
	memset(S, 0, (size_t)(dk * dv) * sizeof *S);
	for (int64_t t0 = 0; t0 < T; t0 += C_) {
		const int64_t n = T - t0 < C_ ? T - t0 : C_;
		const float *qc = q + t0 * dk, *kc = k + t0 * dk, *vc = v + t0 * dv;
		float *oc = o + t0 * dv;
		double acc = 0;
		for (int64_t i = 0; i < n; i++)
			G[i] = (float)(acc += g[t0 + i]);
		/* KK = K K^T, P = Q K^T */
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)dk, 1.0f, kc, (int)dk,
		            kc, (int)dk, 0.0f, KK, (int)n);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)dk, 1.0f, qc, (int)dk,
		            kc, (int)dk, 0.0f, P, (int)n);
		for (int64_t i = 0; i < n; i++) {
			const float bi = beta[t0 + i];
			for (int64_t j = 0; j < n; j++) {
				const float d = j <= i ? expf(G[i] - G[j]) : 0.0f;
				KK[i * n + j] = j < i ? bi * d * KK[i * n + j] : 0.0f;
				P[i * n + j] = j <= i ? d * P[i * n + j] : 0.0f;
			}
			/* the right-hand sides: [beta v | beta e^G k] */
			const float eg = expf(G[i]);
			for (int64_t e = 0; e < dv; e++)
				X[i * nx + e] = bi * vc[i * dv + e];
			for (int64_t e = 0; e < dk; e++)
				X[i * nx + dv + e] = bi * eg * kc[i * dk + e];
		}
		/* forward substitution: X_i -= sum_(j < i) A_ij X_j */
		for (int64_t i = 1; i < n; i++)
			cblas_sgemv(CblasRowMajor, CblasTrans, (int)i, (int)nx, -1.0f, X, (int)nx, KK + i * n, 1,
			            1.0f, X + i * nx, 1);
		/* U = W - Kc S0 */
		for (int64_t i = 0; i < n; i++)
			memcpy(U + i * dv, X + i * nx, (size_t)dv * sizeof *U);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)dv, (int)dk, -1.0f, X + dv,
		            (int)nx, S, (int)dv, 1.0f, U, (int)dv);
		/* O = diag(e^G) Q S0 + P U */
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)dv, (int)dk, 1.0f, qc, (int)dk,
		            S, (int)dv, 0.0f, oc, (int)dv);
		for (int64_t i = 0; i < n; i++) {
			const float eg = expf(G[i]);
			for (int64_t e = 0; e < dv; e++)
				oc[i * dv + e] *= eg;
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)dv, (int)n, 1.0f, P, (int)n,
		            U, (int)dv, 1.0f, oc, (int)dv);
		/* S = e^(G_n) S0 + Kd^T U, Kd_j = e^(G_n - G_j) k_j */
		const float gl = G[n - 1], el = expf(gl);
		for (int64_t j = 0; j < n; j++) {
			const float d = expf(gl - G[j]);
			for (int64_t e = 0; e < dk; e++)
				Kd[j * dk + e] = d * kc[j * dk + e];
		}
		for (int64_t e = 0; e < dk * dv; e++)
			S[e] *= el;
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)dk, (int)dv, (int)n, 1.0f, Kd, (int)dk,
		            U, (int)dv, 1.0f, S, (int)dv);
	}
}

void x3_gdn_rule_ref(const double *q, const double *k, const double *v, const double *g,
                     const double *beta, int64_t T, int64_t dk, int64_t dv, double *o)
{
	double *S = calloc((size_t)(dk * dv), sizeof *S), *u = malloc((size_t)dv * sizeof *u);
	if (!S || !u) {
		free(S), free(u);
		for (int64_t i = 0; i < T * dv; i++)
			o[i] = NAN;
		return;
	}
	for (int64_t t = 0; t < T; t++) {
		const double *qt = q + t * dk, *kt = k + t * dk, *vt = v + t * dv;
		const double d = exp(g[t]);
		for (int64_t i = 0; i < dk * dv; i++)
			S[i] *= d;
		for (int64_t e = 0; e < dv; e++) {
			double m = 0;
			for (int64_t i = 0; i < dk; i++)
				m += S[i * dv + e] * kt[i];
			u[e] = beta[t] * (vt[e] - m);
		}
		for (int64_t i = 0; i < dk; i++)
			for (int64_t e = 0; e < dv; e++)
				S[i * dv + e] += kt[i] * u[e];
		for (int64_t e = 0; e < dv; e++) {
			double s = 0;
			for (int64_t i = 0; i < dk; i++)
				s += S[i * dv + e] * qt[i];
			o[t * dv + e] = s;
		}
	}
	free(S), free(u);
}

/* ---- the layer ---------------------------------------------------------- */

/* The conv1d (zero before the row) and SiLU of channel c at token t of a
 * row starting at token r0, in double. */
static double conv_at(const x3_gdn_shape *s, const float *w, const float *mixed, int64_t cd,
                      int64_t r0, int64_t t, int64_t c)
{
	double acc = 0;
	for (int64_t j = 0; j < s->kconv; j++) {
		int64_t src = t - (s->kconv - 1) + j;
		if (src >= r0)
			acc += (double)w[c * s->kconv + j] * mixed[src * cd + c];
	}
	return silu(acc);
}

/* x / sqrt(sum x^2 + eps) times scale, n of them, in place */
static void l2norm_f(float *x, int64_t n, double scale)
{
	double ss = 0;
	for (int64_t i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	const double f = scale / sqrt(ss + L2_EPS);
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)(x[i] * f);
}

/* o (dv) in place: o / rms(o) * w * silu(z) */
static void gated_norm_f(float *o, const float *z, const float *w, int64_t dv, double eps)
{
	double ss = 0;
	for (int64_t e = 0; e < dv; e++)
		ss += (double)o[e] * o[e];
	const double r = 1 / sqrt(ss / (double)dv + eps);
	for (int64_t e = 0; e < dv; e++)
		o[e] = (float)(o[e] * r * w[e] * silu(z[e]));
}

int x3_gdn_forward(const x3_gdn_shape *s, const x3_gdn_weights *w, const float *mixed,
                   const float *z, const float *b, const float *a, int64_t nrows, int64_t cols,
                   float *out)
{
	int rc = x3_gdn_check(s);
	if (rc)
		return rc;
	const int64_t cd = x3_gdn_conv_dim(s), kd = s->nk * s->dk, vd = s->nv * s->dv;
	const int64_t ntok = nrows * cols, r = s->nv / s->nk;
	const double qscale = 1 / sqrt((double)s->dk);
	if (ntok <= 0)
		return X3_OK;
	float *cv = malloc((size_t)(ntok * cd) * sizeof *cv);
	float *gb = malloc((size_t)(ntok * s->nv * 2) * sizeof *gb);
	if (!cv || !gb) {
		free(cv), free(gb);
		return x3_err(X3_ENOMEM, "gated deltanet: out of memory for %lld tokens", (long long)ntok);
	}
	/* the conv, SiLU, the L2 norms, beta and g, token by token */
	#pragma omp parallel for schedule(static) if(ntok * cd * s->kconv > (1 << 18))
	for (int64_t t = 0; t < ntok; t++) {
		const int64_t r0 = t / cols * cols;
		float *ct = cv + t * cd;
		for (int64_t c = 0; c < cd; c++)
			ct[c] = (float)conv_at(s, w->conv, mixed, cd, r0, t, c);
		for (int64_t h = 0; h < s->nk; h++) {
			l2norm_f(ct + h * s->dk, s->dk, qscale);
			l2norm_f(ct + kd + h * s->dk, s->dk, 1);
		}
		for (int64_t h = 0; h < s->nv; h++) {
			gb[(t * s->nv + h) * 2] = (float)(-exp(w->a_log[h]) *
			                                  softplus((double)a[t * s->nv + h] + w->dt_bias[h]));
			gb[(t * s->nv + h) * 2 + 1] = (float)sigmoid(b[t * s->nv + h]);
		}
	}
	int fail = 0;
	const int64_t sc = x3_gdn_rule_scratch(s->dk, s->dv) + cols * (2 * s->dk + 2 * s->dv + 2);
	int prev = x3_blas_serial_begin();
	#pragma omp parallel if(nrows * s->nv * cols * s->dk * s->dv > (1 << 18))
	{
		float *buf = malloc((size_t)sc * sizeof *buf);
		if (!buf) {
			#pragma omp atomic write
			fail = 1;
		}
		#pragma omp for collapse(2) schedule(dynamic, 1)
		for (int64_t row = 0; row < nrows; row++)
			for (int64_t h = 0; h < s->nv; h++) {
				if (!buf)
					continue;
				float *q = buf, *k = q + cols * s->dk, *v = k + cols * s->dk, *g = v + cols * s->dv;
				float *be = g + cols, *o = be + cols, *scr = o + cols * s->dv;
				const int64_t kh = h / r;
				for (int64_t i = 0; i < cols; i++) {
					const float *ct = cv + (row * cols + i) * cd;
					memcpy(q + i * s->dk, ct + kh * s->dk, (size_t)s->dk * sizeof *q);
					memcpy(k + i * s->dk, ct + kd + kh * s->dk, (size_t)s->dk * sizeof *k);
					memcpy(v + i * s->dv, ct + 2 * kd + h * s->dv, (size_t)s->dv * sizeof *v);
					g[i] = gb[((row * cols + i) * s->nv + h) * 2];
					be[i] = gb[((row * cols + i) * s->nv + h) * 2 + 1];
				}
				x3_gdn_rule_chunked(q, k, v, g, be, cols, s->dk, s->dv, o, scr);
				for (int64_t i = 0; i < cols; i++) {
					const int64_t t = row * cols + i;
					float *ot = out + t * vd + h * s->dv;
					memcpy(ot, o + i * s->dv, (size_t)s->dv * sizeof *ot);
					gated_norm_f(ot, z + t * vd + h * s->dv, w->norm, s->dv, s->eps);
				}
			}
		free(buf);
	}
	x3_blas_serial_end(prev);
	free(cv), free(gb);
	return fail ? x3_err(X3_ENOMEM, "gated deltanet: out of memory") : X3_OK;
}

int x3_gdn_reference(const x3_gdn_shape *s, const x3_gdn_weights *w, const float *mixed,
                     const float *z, const float *b, const float *a, int64_t nrows, int64_t cols,
                     double *out)
{
	int rc = x3_gdn_check(s);
	if (rc)
		return rc;
	const int64_t cd = x3_gdn_conv_dim(s), kd = s->nk * s->dk, vd = s->nv * s->dv;
	const int64_t r = s->nv / s->nk;
	double *q = malloc((size_t)(cols * s->dk) * sizeof *q), *k = malloc((size_t)(cols * s->dk) * sizeof *k);
	double *v = malloc((size_t)(cols * s->dv) * sizeof *v), *o = malloc((size_t)(cols * s->dv) * sizeof *o);
	double *g = malloc((size_t)cols * sizeof *g), *be = malloc((size_t)cols * sizeof *be);
	if (!q || !k || !v || !o || !g || !be) {
		free(q), free(k), free(v), free(o), free(g), free(be);
		return x3_err(X3_ENOMEM, "gated deltanet reference: out of memory");
	}
	for (int64_t row = 0; row < nrows; row++)
		for (int64_t h = 0; h < s->nv; h++) {
			const int64_t kh = h / r, r0 = row * cols;
			for (int64_t i = 0; i < cols; i++) {
				const int64_t t = r0 + i;
				double nq = 0, nk = 0;
				for (int64_t e = 0; e < s->dk; e++) {
					q[i * s->dk + e] = conv_at(s, w->conv, mixed, cd, r0, t, kh * s->dk + e);
					k[i * s->dk + e] = conv_at(s, w->conv, mixed, cd, r0, t, kd + kh * s->dk + e);
					nq += q[i * s->dk + e] * q[i * s->dk + e];
					nk += k[i * s->dk + e] * k[i * s->dk + e];
				}
				nq = 1 / sqrt(nq + L2_EPS) / sqrt((double)s->dk);
				nk = 1 / sqrt(nk + L2_EPS);
				for (int64_t e = 0; e < s->dk; e++)
					q[i * s->dk + e] *= nq, k[i * s->dk + e] *= nk;
				for (int64_t e = 0; e < s->dv; e++)
					v[i * s->dv + e] = conv_at(s, w->conv, mixed, cd, r0, t, 2 * kd + h * s->dv + e);
				g[i] = -exp(w->a_log[h]) * softplus((double)a[t * s->nv + h] + w->dt_bias[h]);
				be[i] = sigmoid(b[t * s->nv + h]);
			}
			x3_gdn_rule_ref(q, k, v, g, be, cols, s->dk, s->dv, o);
			for (int64_t i = 0; i < cols; i++) {
				const int64_t t = r0 + i;
				double ss = 0;
				for (int64_t e = 0; e < s->dv; e++)
					ss += o[i * s->dv + e] * o[i * s->dv + e];
				const double rr = 1 / sqrt(ss / (double)s->dv + s->eps);
				for (int64_t e = 0; e < s->dv; e++)
					out[t * vd + h * s->dv + e] = o[i * s->dv + e] * rr * w->norm[e] *
					                              silu(z[t * vd + h * s->dv + e]);
			}
		}
	free(q), free(k), free(v), free(o), free(g), free(be);
	return X3_OK;
}

/* ---- Qwen3-Next's fused projections -------------------------------------- */

int64_t x3_gdn_qkvz_row(const x3_gdn_shape *s, int64_t i)
{
	const int64_t kd = s->nk * s->dk, vd = s->nv * s->dv, r = s->nv / s->nk;
	const int64_t per = 2 * s->dk + 2 * r * s->dv;   /* a key head's rows */
	if (i < kd)                                       /* q */
		return i / s->dk * per + i % s->dk;
	if (i < 2 * kd)                                   /* k */
		return (i - kd) / s->dk * per + s->dk + (i - kd) % s->dk;
	const int64_t gw = r * s->dv;                     /* a key head's v (or z) */
	if (i < 2 * kd + vd)                              /* v */
		return (i - 2 * kd) / gw * per + 2 * s->dk + (i - 2 * kd) % gw;
	return (i - 2 * kd - vd) / gw * per + 2 * s->dk + gw + (i - 2 * kd - vd) % gw;   /* z */
}

int64_t x3_gdn_ba_row(const x3_gdn_shape *s, int64_t i)
{
	const int64_t r = s->nv / s->nk;
	if (i < s->nv)                                    /* b */
		return i / r * 2 * r + i % r;
	return (i - s->nv) / r * 2 * r + r + (i - s->nv) % r;   /* a */
}

void x3_gdn_unfuse(const x3_gdn_shape *s, const float *qkvz, const float *ba, int64_t ntok,
                   float *mixed, float *z, float *b, float *a)
{
	const int64_t cd = x3_gdn_conv_dim(s), vd = s->nv * s->dv, fw = cd + vd;
	for (int64_t t = 0; t < ntok; t++) {
		for (int64_t i = 0; i < cd; i++)
			mixed[t * cd + i] = qkvz[t * fw + x3_gdn_qkvz_row(s, i)];
		for (int64_t i = 0; i < vd; i++)
			z[t * vd + i] = qkvz[t * fw + x3_gdn_qkvz_row(s, cd + i)];
		for (int64_t i = 0; i < s->nv; i++) {
			b[t * s->nv + i] = ba[t * 2 * s->nv + x3_gdn_ba_row(s, i)];
			a[t * s->nv + i] = ba[t * 2 * s->nv + x3_gdn_ba_row(s, s->nv + i)];
		}
	}
}
