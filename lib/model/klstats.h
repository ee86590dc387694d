/* klstats.h: how far one next-token distribution drifts from another, per
 * position and summarized with the statistics llama.cpp's perplexity tool
 * made the shared vocabulary (KL percentiles, ln(PPL(Q)/PPL(base)) with its
 * uncertainty, Δp of the correct token, "same top p").
 *
 * Summaries sum in position order (no parallel reduction), so they do not
 * depend on the thread count or on how positions were batched. */
#ifndef X3_KLSTATS_H
#define X3_KLSTATS_H

#include <stdint.h>

/* One position: base and q are logits (V), correct the next token. */
typedef struct {
	double kl;                /* KL(P_base || P_q), nats */
	double nll_base, nll_q;   /* -ln p(correct) */
	double p_base, p_q;       /* p(correct) */
	int same_top;             /* argmax equal (first maximum) */
} x3_klpos;
/* q may be NULL (perplexity only: kl, nll_q, p_q are 0, same_top 1).
 * Non-finite logits give non-finite values here (never clamped). */
void x3_kl_position(const float *base, const float *q, int64_t V, int32_t correct,
                    x3_klpos *out);

/* Percentile of sorted v[0..n): linear interpolation between the closest
 * ranks, rank h = (n - 1)·f (numpy's default; f = 0.5 is the median). */
double x3_percentile(const double *sorted, int64_t n, double f);

enum { X3_DP_NPCT = 13 };
/* the Δp percentiles reported, in x3_klstats.dp_pct order */
extern const double x3_dp_pct_f[X3_DP_NPCT];   /* 0, .001, .01, .05, .1, .25, .5, ... 1 */

typedef struct {
	int64_t n;
	double nll_base, nll_q;             /* means */
	double kl_mean, kl_median, kl_p90, kl_p99, kl_p999, kl_max;
	/* mean of ln p_base - ln p_q = ln(PPL(Q)/PPL(base)), and its standard
	 * error sqrt(Σ(d - mean)² / (n (n - 1))) */
	double ln_ppl_ratio, ln_ppl_ratio_err;
	/* Δp = p_q - p_base of the correct token: mean, standard error, RMS */
	double dp_mean, dp_err, dp_rms;
	double dp_pct[X3_DP_NPCT];
	/* fraction of positions with the same top token, sqrt(f(1-f)/(n-1)) */
	double same_top, same_top_err;
} x3_klstats;
/* X3_EINVAL when n < 1; X3_ENUM when a position's KL, NLL or p is not
 * finite (NaN is neither averaged nor skipped); X3_ENOMEM. */
int x3_kl_summarize(const x3_klpos *p, int64_t n, x3_klstats *s);

#endif
