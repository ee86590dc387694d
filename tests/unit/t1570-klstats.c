/* t1570-klstats: the KL statistics on synthetic logits whose values are
 * known in closed form. Base logits are all zero over V tokens (uniform);
 * the other distribution raises token 0 by c: q0 = e^c / Z, Z = e^c + V - 1.
 * Then KL(base || q) = ln Z - ln V - c/V, ln p_base(0) - ln p_q(0) =
 * ln Z - c - ln V, Δp(0) = e^c/Z - 1/V, and the top token is the same
 * (token 0, the first maximum) exactly when c >= 0. */
#include <math.h>
#include <string.h>
#include "test.h"
#include "klstats.h"

#define V 4
static const double cs[] = {-1, 0, 0.5, 1, 2, -0.25, 3};
#define N ((int)(sizeof cs / sizeof *cs))

static double kl_of(double c) { double Z = exp(c) + V - 1; return log(Z) - log(V) - c / V; }
static double d_of(double c) { double Z = exp(c) + V - 1; return log(Z) - c - log(V); }
static double dp_of(double c) { double Z = exp(c) + V - 1; return exp(c) / Z - 1.0 / V; }

static void sort(double *v, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t;
		}
}
static double pct(const double *v, int n, double f)   /* the definition, spelled out */
{
	double h = (n - 1) * f;
	int lo = (int)h;
	return lo + 1 < n ? v[lo] + (h - lo) * (v[lo + 1] - v[lo]) : v[n - 1];
}
static int near(double a, double b) { return fabs(a - b) <= 1e-12 * (1 + fabs(b)); }

int main(void)
{
	float base[N][V] = {{0}}, q[N][V] = {{0}};
	x3_klpos pos[N];
	for (int i = 0; i < N; i++) {
		q[i][0] = (float)cs[i];   /* the cs are exact in float */
		x3_kl_position(base[i], q[i], V, 0, &pos[i]);
	}
	int okp = 1;
	for (int i = 0; i < N; i++)
		okp &= near(pos[i].kl, kl_of(cs[i])) && near(pos[i].nll_q - pos[i].nll_base, d_of(cs[i])) &&
		       near(pos[i].p_q - pos[i].p_base, dp_of(cs[i])) && near(pos[i].p_base, 0.25) &&
		       pos[i].same_top == (cs[i] >= 0);
	CHECK(okp, "per position: KL, ln-ratio, delta-p, same top match the closed forms");
	CHECK(pos[1].kl == 0, "c = 0: KL exactly 0");

	x3_klstats s;
	CHECK_OK(x3_kl_summarize(pos, N, &s), "summarize %d positions", N);
	double kl[N], d[N], dp[N], mk = 0, md = 0, mdp = 0, mdp2 = 0;
	for (int i = 0; i < N; i++) {
		kl[i] = kl_of(cs[i]), d[i] = d_of(cs[i]), dp[i] = dp_of(cs[i]);
		mk += kl[i] / N, md += d[i] / N, mdp += dp[i] / N, mdp2 += dp[i] * dp[i] / N;
	}
	double vd = 0, vdp = 0;
	for (int i = 0; i < N; i++)
		vd += (d[i] - md) * (d[i] - md), vdp += (dp[i] - mdp) * (dp[i] - mdp);
	sort(kl, N);
	sort(dp, N);
	CHECK(near(s.kl_mean, mk), "KL mean %.12g (closed form %.12g)", s.kl_mean, mk);
	CHECK(near(s.kl_median, kl[N / 2]), "KL median %.12g = the middle value %.12g", s.kl_median, kl[N / 2]);
	CHECK(near(s.kl_p90, pct(kl, N, 0.9)) && near(s.kl_p99, pct(kl, N, 0.99)) &&
	      near(s.kl_p999, pct(kl, N, 0.999)), "KL p90/p99/p99.9 interpolate between ranks");
	CHECK(near(s.kl_max, kl[N - 1]) && near(s.kl_max, kl_of(3)), "KL max is c = 3's %.12g", kl_of(3));
	CHECK(near(s.ln_ppl_ratio, md), "ln(PPL(Q)/PPL(base)) %.12g (closed form %.12g)", s.ln_ppl_ratio, md);
	CHECK(near(s.ln_ppl_ratio_err, sqrt(vd / N / (N - 1))), "... its standard error");
	CHECK(near(s.dp_mean, mdp) && near(s.dp_err, sqrt(vdp / N / (N - 1))) && near(s.dp_rms, sqrt(mdp2)),
	      "delta-p mean %.12g, standard error, RMS", s.dp_mean);
	int okq = 1;
	for (int k = 0; k < X3_DP_NPCT; k++)
		okq &= near(s.dp_pct[k], pct(dp, N, x3_dp_pct_f[k]));
	CHECK(okq && near(s.dp_pct[0], dp[0]) && near(s.dp_pct[X3_DP_NPCT - 1], dp[N - 1]), "delta-p percentiles, min and max");
	CHECK(near(s.same_top, 5.0 / 7) && near(s.same_top_err, sqrt(5.0 / 7 * 2.0 / 7 / 6)),
	      "same top p 5/7 (c >= 0), with sqrt(f(1-f)/(n-1))");
	CHECK(near(s.nll_base, log(V)), "base NLL ln V (uniform)");

	/* the percentile definition on 1..4 */
	double v4[4] = {1, 2, 3, 4};
	CHECK(x3_percentile(v4, 4, 0.5) == 2.5 && near(x3_percentile(v4, 4, 0.9), 3.7) &&
	      x3_percentile(v4, 4, 0) == 1 && x3_percentile(v4, 4, 1) == 4, "percentile: 2.5, 3.7, 1, 4 on 1..4");

	/* order of the positions does not matter: reversed, same summary */
	x3_klpos rev[N];
	for (int i = 0; i < N; i++)
		rev[i] = pos[N - 1 - i];
	x3_klstats r;
	x3_kl_summarize(rev, N, &r);
	CHECK(r.kl_median == s.kl_median && r.kl_max == s.kl_max && near(r.kl_mean, s.kl_mean) &&
	      r.dp_pct[3] == s.dp_pct[3], "reversed positions: same percentiles, mean to rounding");
	CHECK(x3_kl_summarize(pos, 0, &r) == X3_EINVAL, "no positions: X3_EINVAL");
	/* perplexity only */
	x3_klpos one;
	x3_kl_position(q[4], NULL, V, 0, &one);
	CHECK(near(one.nll_base, -(2 - log(exp(2) + 3))) && one.kl == 0, "without q: the NLL of the base");

	/* a NaN or an Inf among the second model's logits: the position's KL
	 * and NLL stay non-finite, and the summary refuses them (never 0) */
	float qn[V] = {0, NAN, 0, 0}, qi[V] = {0, INFINITY, 0, 0};
	x3_klpos bad[N];
	for (int i = 0; i < N; i++)
		bad[i] = pos[i];
	x3_kl_position(base[0], qn, V, 0, &bad[3]);
	CHECK(isnan(bad[3].kl) && !isfinite(bad[3].nll_q), "a NaN logit: KL and NLL NaN, not clamped");
	CHECK(x3_kl_summarize(bad, N, &r) == X3_ENUM && strstr(x3_errmsg(), "position 3: "),
	      "... and the summary refuses it, naming the position: %s", x3_errmsg());
	x3_kl_position(base[0], qi, V, 0, &bad[3]);
	CHECK(!isfinite(bad[3].kl) && x3_kl_summarize(bad, N, &r) == X3_ENUM, "an Inf logit: refused too");
	x3_kl_position(qn, q[0], V, 0, &bad[3]);
	CHECK(x3_kl_summarize(bad, N, &r) == X3_ENUM && strstr(x3_errmsg(), "base model"),
	      "a NaN in the base logits: refused, naming the base: %s", x3_errmsg());
	TEST_DONE();
}
