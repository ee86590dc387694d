/* indexer.c: DeepSeek sparse attention's indexer and the attention over
 * the keys it picks (indexer.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "indexer.h"
#include "x3.h"

void x3_layernorm(float *x, const float *w, const float *b, int64_t rows, int64_t n, double eps)
{
	#pragma omp parallel for if(rows * n > (1 << 16)) schedule(static)
	for (int64_t r = 0; r < rows; r++) {
		float *xr = x + r * n;
		double m = 0, v = 0;
		for (int64_t i = 0; i < n; i++)
			m += xr[i];
		m /= (double)n;
		for (int64_t i = 0; i < n; i++)
			v += ((double)xr[i] - m) * ((double)xr[i] - m);
		double s = 1.0 / sqrt(v / (double)n + eps);
		for (int64_t i = 0; i < n; i++)
			xr[i] = (float)(((double)xr[i] - m) * s * w[i] + b[i]);
	}
}

/* a key's score and position, ordered by score down, then position up */
struct cand { double s; int64_t j; };

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->s != y->s)
		return x->s > y->s ? -1 : 1;
	return x->j < y->j ? -1 : x->j > y->j;
}

int x3_indexer_select(const float *q, const float *k, const float *w, int64_t nrows, int64_t cols,
                      int64_t heads, int64_t hd, int64_t topk, double scale, uint8_t *sel)
{
	const int64_t st = x3_sel_stride(cols), nt = nrows * cols;
	int rc = X3_OK;
	memset(sel, 0, (size_t)(nt * st));
	#pragma omp parallel
	{
		struct cand *c = malloc((size_t)cols * sizeof *c);
		if (!c) {
			#pragma omp critical
			rc = X3_ENOMEM;
		}
		#pragma omp for schedule(dynamic, 4)
		for (int64_t t = 0; t < nt; t++) {
			if (!c)
				continue;
			const int64_t i = t % cols, r0 = t - i;
			uint8_t *s = sel + t * st;
			if (i < topk) {
				for (int64_t j = 0; j <= i; j++)
					s[j / 8] |= (uint8_t)(1u << (j % 8));
				continue;
			}
			for (int64_t j = 0; j <= i; j++) {
				const float *kj = k + (r0 + j) * hd;
				double acc = 0;
				for (int64_t h = 0; h < heads; h++) {
					const float *qh = q + (t * heads + h) * hd;
					double d = 0;
					for (int64_t e = 0; e < hd; e++)
						d += (double)qh[e] * kj[e];
					if (d > 0)
						acc += (double)w[t * heads + h] * (d * scale);
				}
				c[j] = (struct cand){ acc, j };
			}
			qsort(c, (size_t)(i + 1), sizeof *c, cand_cmp);
			for (int64_t n = 0; n < topk; n++)
				s[c[n].j / 8] |= (uint8_t)(1u << (c[n].j % 8));
		}
		free(c);
	}
	return rc ? x3_err(rc, "indexer: out of memory for rows of %lld tokens", (long long)cols) : X3_OK;
}

int x3_sparse_attention(const float *q, const float *k, const float *v, float *out, int64_t nrows,
                        int64_t cols, int64_t nh, int64_t hd, int64_t hdv, double scale, const uint8_t *sel)
{
	const int64_t st = x3_sel_stride(cols), nt = nrows * cols;
	int rc = X3_OK;
	#pragma omp parallel
	{
		double *p = malloc((size_t)(cols + hdv) * sizeof *p);
		if (!p) {
			#pragma omp critical
			rc = X3_ENOMEM;
		}
		#pragma omp for collapse(2) schedule(dynamic, 8)
		for (int64_t t = 0; t < nt; t++)
			for (int64_t h = 0; h < nh; h++) {
				if (!p)
					continue;
				const int64_t i = t % cols, r0 = t - i;
				const uint8_t *s = sel + t * st;
				const float *qh = q + (t * nh + h) * hd;
				double mx = -INFINITY, sum = 0, *o = p + cols;
				for (int64_t j = 0; j <= i; j++) {
					if (!(s[j / 8] >> (j % 8) & 1))
						continue;
					const float *kh = k + ((r0 + j) * nh + h) * hd;
					double d = 0;
					for (int64_t e = 0; e < hd; e++)
						d += (double)qh[e] * kh[e];
					p[j] = d * scale;
					mx = p[j] > mx ? p[j] : mx;
				}
				memset(o, 0, (size_t)hdv * sizeof *o);
				for (int64_t j = 0; j <= i; j++) {
					if (!(s[j / 8] >> (j % 8) & 1))
						continue;
					double e = exp(p[j] - mx);
					const float *vh = v + ((r0 + j) * nh + h) * hdv;
					sum += e;
					for (int64_t d = 0; d < hdv; d++)
						o[d] += e * vh[d];
				}
				float *oh = out + (t * nh + h) * hdv;
				for (int64_t d = 0; d < hdv; d++)
					oh[d] = (float)(o[d] / sum);
			}
		free(p);
	}
	return rc ? x3_err(rc, "sparse attention: out of memory for rows of %lld tokens", (long long)cols) : X3_OK;
}
