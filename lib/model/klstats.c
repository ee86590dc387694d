/* klstats.c: per-position KL, Δp and top-token agreement, and their
 * summary statistics (see klstats.h). */
#include <math.h>
#include <stdlib.h>
#include "x3.h"
#include "klstats.h"

const double x3_dp_pct_f[X3_DP_NPCT] = {0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5,
                                        0.75, 0.9, 0.95, 0.99, 0.999, 1};

/* max and ln Σ exp(v - max), in double */
static void lse(const float *v, int64_t n, double *mx, double *ls, int64_t *arg)
{
	int64_t b = 0;
	for (int64_t i = 1; i < n; i++)
		if (v[i] > v[b])
			b = i;
	double m = v[b], s = 0;
	for (int64_t i = 0; i < n; i++)
		s += exp((double)v[i] - m);
	*mx = m;
	*ls = log(s);
	*arg = b;
}

void x3_kl_position(const float *a, const float *b, int64_t V, int32_t correct, x3_klpos *o)
{
	double ma, la, mb = 0, lb = 0;
	int64_t ta, tb = 0;
	lse(a, V, &ma, &la, &ta);
	double lpa_c = (double)a[correct] - ma - la;
	o->nll_base = -lpa_c;
	o->p_base = exp(lpa_c);
	if (!b) {
		o->kl = o->nll_q = o->p_q = 0;
		o->same_top = 1;
		return;
	}
	lse(b, V, &mb, &lb, &tb);
	/* Σ p_a (ln p_a - ln p_b); ln p_a - ln p_b = (a - b) - (ma + la - mb - lb) */
	double c = (ma - mb) + (la - lb), kl = 0;   /* exactly 0 for equal inputs */
	for (int64_t i = 0; i < V; i++) {
		double lpa = (double)a[i] - ma - la;
		kl += exp(lpa) * (((double)a[i] - (double)b[i]) - c);
	}
	/* KL >= 0, but rounding can leave -1e-17 for equal inputs: a finite
	 * negative sum is 0. A NaN or Inf (from non-finite logits) stays what it
	 * is, for x3_kl_summarize to refuse. */
	o->kl = isfinite(kl) && kl < 0 ? 0 : kl;
	double lpb_c = (double)b[correct] - mb - lb;
	o->nll_q = -lpb_c;
	o->p_q = exp(lpb_c);
	o->same_top = ta == tb;
}

double x3_percentile(const double *v, int64_t n, double f)
{
	if (n < 1)
		return NAN;
	double h = (double)(n - 1) * f;
	int64_t lo = (int64_t)floor(h);
	if (lo >= n - 1)
		return v[n - 1];
	if (lo < 0)
		return v[0];
	return v[lo] + (h - (double)lo) * (v[lo + 1] - v[lo]);
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int x3_kl_summarize(const x3_klpos *p, int64_t n, x3_klstats *s)
{
	if (n < 1)
		return x3_err(X3_EINVAL, "no positions to summarize");
	/* a non-finite value would make every mean and percentile meaningless
	 * (or, clamped, good): refused, by position and quantity */
	for (int64_t i = 0; i < n; i++) {
		const char *bad = !isfinite(p[i].nll_base) || !isfinite(p[i].p_base) ? "the base model's NLL"
		                : !isfinite(p[i].nll_q) || !isfinite(p[i].p_q) ? "the second model's NLL"
		                : !isfinite(p[i].kl) ? "the KL divergence" : NULL;
		if (bad)
			return x3_err(X3_ENUM, "position %lld: %s is not finite (non-finite logits)",
			              (long long)i, bad);
	}
	double *v = malloc((size_t)n * sizeof *v);
	if (!v)
		return x3_err(X3_ENOMEM, "out of memory for %lld positions", (long long)n);
	s->n = n;
	double snb = 0, snq = 0, skl = 0, sd = 0, sdp = 0, sdp2 = 0, ssame = 0;
	for (int64_t i = 0; i < n; i++) {
		snb += p[i].nll_base;
		snq += p[i].nll_q;
		skl += p[i].kl;
		sd += p[i].nll_q - p[i].nll_base;
		double dp = p[i].p_q - p[i].p_base;
		sdp += dp;
		sdp2 += dp * dp;
		ssame += p[i].same_top;
	}
	double N = (double)n;
	s->nll_base = snb / N;
	s->nll_q = snq / N;
	s->kl_mean = skl / N;
	s->ln_ppl_ratio = sd / N;
	s->dp_mean = sdp / N;
	s->dp_rms = sqrt(sdp2 / N);
	s->same_top = ssame / N;
	/* second pass for the spreads (two-pass variance) */
	double vd = 0, vdp = 0;
	for (int64_t i = 0; i < n; i++) {
		double d = p[i].nll_q - p[i].nll_base - s->ln_ppl_ratio;
		double e = p[i].p_q - p[i].p_base - s->dp_mean;
		vd += d * d;
		vdp += e * e;
	}
	s->ln_ppl_ratio_err = n > 1 ? sqrt(vd / (N * (N - 1))) : NAN;
	s->dp_err = n > 1 ? sqrt(vdp / (N * (N - 1))) : NAN;
	s->same_top_err = n > 1 ? sqrt(s->same_top * (1 - s->same_top) / (N - 1)) : NAN;
	for (int64_t i = 0; i < n; i++)
		v[i] = p[i].kl;
	qsort(v, (size_t)n, sizeof *v, cmp_d);
	s->kl_median = x3_percentile(v, n, 0.5);
	s->kl_p90 = x3_percentile(v, n, 0.9);
	s->kl_p99 = x3_percentile(v, n, 0.99);
	s->kl_p999 = x3_percentile(v, n, 0.999);
	s->kl_max = v[n - 1];
	for (int64_t i = 0; i < n; i++)
		v[i] = p[i].p_q - p[i].p_base;
	qsort(v, (size_t)n, sizeof *v, cmp_d);
	for (int k = 0; k < X3_DP_NPCT; k++)
		s->dp_pct[k] = x3_percentile(v, n, x3_dp_pct_f[k]);
	free(v);
	return X3_OK;
}
