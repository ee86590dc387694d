/* moe.c: the mixture-of-experts block (see moe.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "blas.h"
#include "moe.h"
#include "x3.h"

/* top k of the softmax of logits l (n): idx, w; ties keep the lower index */
static void topk(const float *l, int64_t n, int64_t k, int renorm, int32_t *idx, float *w)
{
	double mx = -INFINITY, sum = 0;
	for (int64_t e = 0; e < n; e++)
		mx = l[e] > mx ? l[e] : mx;
	for (int64_t e = 0; e < n; e++)
		sum += exp((double)l[e] - mx);
	for (int64_t j = 0; j < k; j++) {
		int64_t best = -1;
		for (int64_t e = 0; e < n; e++) {
			int used = 0;
			for (int64_t i = 0; i < j && !used; i++)
				used = idx[i] == e;
			if (!used && (best < 0 || l[e] > l[best]))
				best = e;
		}
		idx[j] = (int32_t)best;
		w[j] = (float)(exp((double)l[best] - mx) / sum);
	}
	if (renorm) {
		double s = 0;
		for (int64_t j = 0; j < k; j++)
			s += w[j];
		for (int64_t j = 0; j < k; j++)
			w[j] = (float)(w[j] / s);
	}
}

/* GPT-OSS's routing of logits l (n): the top k logits (ties: the lower
 * index), their weights the softmax over the k */
static void topk_logits(const float *l, int64_t n, int64_t k, int32_t *idx, float *w)
{
	for (int64_t j = 0; j < k; j++) {
		int64_t best = -1;
		for (int64_t e = 0; e < n; e++) {
			int used = 0;
			for (int64_t i = 0; i < j && !used; i++)
				used = idx[i] == e;
			if (!used && (best < 0 || l[e] > l[best]))
				best = e;
		}
		idx[j] = (int32_t)best;
	}
	double mx = l[idx[0]], sum = 0;
	for (int64_t j = 0; j < k; j++)
		sum += exp((double)l[idx[j]] - mx);
	for (int64_t j = 0; j < k; j++)
		w[j] = (float)(exp((double)l[idx[j]] - mx) / sum);
}

void x3_moe_act(const struct x3_moe *p, float *g, const float *u, int64_t n)
{
	if (p->act_limit > 0) {
		const float lim = (float)p->act_limit, al = (float)p->act_alpha;
		#pragma omp parallel for if(n > (1 << 16)) schedule(static)
		for (int64_t i = 0; i < n; i++) {
			float gv = g[i] < lim ? g[i] : lim, uv = u[i] < -lim ? -lim : u[i] > lim ? lim : u[i];
			/* NaN passes through (neither comparison holds): never clamped to a number */
			if (isnan(g[i]))
				gv = g[i];
			if (isnan(u[i]))
				uv = u[i];
			g[i] = (uv + 1.0f) * (gv / (1.0f + expf(-al * gv)));
		}
		return;
	}
	for (int64_t i = 0; i < n; i++)
		g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* DeepSeek V3's grouped sigmoid routing of logits l (n) (moe.h): idx, w */
static void topk_grouped(const struct x3_moe *p, const float *l, int32_t *idx, float *w)
{
	int64_t n = p->n_experts, G = p->n_group > 0 ? p->n_group : 1, per = n / G, K = p->top_k;
	double *s = malloc((size_t)n * sizeof *s), *c = malloc((size_t)n * sizeof *c);
	double *gs = malloc((size_t)G * sizeof *gs);
	char *keep = calloc((size_t)G, 1);
	if (!s || !c || !gs || !keep)
		abort();   /* a few experts' worth: treated as the allocator's failure */
	for (int64_t e = 0; e < n; e++) {
		s[e] = 1.0 / (1.0 + exp(-(double)l[e]));
		c[e] = s[e] + (p->score_bias ? p->score_bias[e] : 0.0);
	}
	for (int64_t g = 0; g < G; g++) {
		double b1 = -INFINITY, b2 = -INFINITY;
		for (int64_t e = g * per; e < (g + 1) * per; e++)
			if (c[e] > b1)
				b2 = b1, b1 = c[e];
			else if (c[e] > b2)
				b2 = c[e];
		gs[g] = b1 + (per > 1 ? b2 : 0);
	}
	for (int64_t j = 0; j < p->topk_group && j < G; j++) {
		int64_t best = -1;
		for (int64_t g = 0; g < G; g++)
			if (!keep[g] && (best < 0 || gs[g] > gs[best]))
				best = g;
		keep[best] = 1;
	}
	for (int64_t e = 0; e < n; e++)
		if (!keep[e / per])
			c[e] = 0.0;
	double sum = 0;
	for (int64_t j = 0; j < K; j++) {
		int64_t best = -1;
		for (int64_t e = 0; e < n; e++) {
			int used = 0;
			for (int64_t i = 0; i < j && !used; i++)
				used = idx[i] == e;
			if (!used && (best < 0 || c[e] > c[best]))
				best = e;
		}
		idx[j] = (int32_t)best;
		sum += s[best];
	}
	for (int64_t j = 0; j < K; j++)
		w[j] = (float)((p->renorm ? s[idx[j]] / (sum + 1e-20) : s[idx[j]]) * p->scale);
	free(s), free(c), free(gs), free(keep);
}

/* The routing of one token's logits l (n_experts). */
static void route_one(const struct x3_moe *p, const float *l, int32_t *idx, float *w)
{
	if (p->sigmoid)
		topk_grouped(p, l, idx, w);
	else if (p->topk_softmax)
		topk_logits(l, p->n_experts, p->top_k, idx, w);
	else
		topk(l, p->n_experts, p->top_k, p->renorm, idx, w);
}

int x3_moe_route(const struct x3_moe *p, const float *x, int64_t nt, int64_t seg, int32_t *idx, float *w)
{
	float *l = malloc((size_t)(nt * p->n_experts) * sizeof *l);
	if (!l)
		return x3_err(X3_ENOMEM, "moe: out of memory for the router logits");
	int rc = x3_gemm_xwt(x, nt, seg, p->hidden, p->router, p->n_experts, l);
	for (int64_t t = 0; t < nt && !rc && p->router_bias; t++)
		for (int64_t e = 0; e < p->n_experts; e++)
			l[t * p->n_experts + e] += p->router_bias[e];
	if (!rc)
		for (int64_t t = 0; t < nt; t++)
			route_one(p, l + t * p->n_experts, idx + t * p->top_k, w + t * p->top_k);
	free(l);
	return rc;
}

int64_t x3_moe_rows(const struct x3_moe *p, const int32_t *idx, const float *w, int64_t nt, int64_t e,
                    int64_t *rows, float *rw)
{
	int64_t n = 0, K = p->top_k;
	for (int64_t t = 0; t < nt; t++)
		for (int64_t j = 0; j < K; j++)
			if (idx[t * K + j] == e)
				rows[n] = t, rw[n] = w[t * K + j], n++;
	return n;
}

int x3_moe_forward(const struct x3_moe *p, const float *x, int64_t nt, int64_t seg, float *y)
{
	int64_t H = p->hidden, I = p->inter, K = p->top_k;
	int32_t *idx = malloc((size_t)(nt * K) * sizeof *idx);
	float *w = malloc((size_t)(nt * K) * sizeof *w);
	int64_t *rows = malloc((size_t)nt * sizeof *rows);
	float *rw = malloc((size_t)nt * sizeof *rw);
	float *xe = malloc((size_t)(nt * H) * sizeof *xe), *ye = malloc((size_t)(nt * H) * sizeof *ye);
	float *g = malloc((size_t)(nt * I) * sizeof *g), *u = malloc((size_t)(nt * I) * sizeof *u);
	int rc = X3_OK;
	if (!idx || !w || !rows || !rw || !xe || !ye || !g || !u) {
		rc = x3_err(X3_ENOMEM, "moe: out of memory for %lld tokens", (long long)nt);
		goto out;
	}
	if ((rc = x3_moe_route(p, x, nt, seg, idx, w)))
		goto out;
	memset(y, 0, (size_t)(nt * H) * sizeof *y);
	for (int64_t e = 0; e < p->n_experts && !rc; e++) {
		int64_t n = x3_moe_rows(p, idx, w, nt, e, rows, rw);
		if (!n)
			continue;
		for (int64_t r = 0; r < n; r++)
			memcpy(xe + r * H, x + rows[r] * H, (size_t)H * sizeof *xe);
		if (p->weights && (rc = p->weights(p->ctx, e, rw, n)))
			break;
		if ((rc = p->apply(p->ctx, e, 0, xe, n, g)) || (rc = p->apply(p->ctx, e, 1, xe, n, u)))
			break;
		x3_moe_act(p, g, u, n * I);
		if ((rc = p->apply(p->ctx, e, 2, g, n, ye)))
			break;
		for (int64_t r = 0; r < n; r++)
			for (int64_t i = 0; i < H; i++)
				y[rows[r] * H + i] += rw[r] * ye[r * H + i];
	}
out:
	free(idx), free(w), free(rows), free(rw), free(xe), free(ye), free(g), free(u);
	return rc;
}
