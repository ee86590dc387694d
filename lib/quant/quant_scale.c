/* quant_scale.c: the global scale search (exl3(5) §9.3): the sampled
 * tiles (a wrapped diagonal and the outliers), the coarse grid and the
 * fine grid with its parabola, and the scale predicted from the tiles'
 * RMS for sampled measurements. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "codec.h"
#include "quant.h"
#include "quant_impl.h"

/* ---- scale search ------------------------------------------------------ */

int64_t x3_scale_sample_max(int64_t k, int64_t n)
{
	int64_t tk = k / 16, tn = n / 16, D = tk > tn ? tk : tn;
	int64_t nx = 3 * D / 16 > 8 ? 3 * D / 16 : 8;
	if (nx > (tk * tn + 1) / 2)
		nx = (tk * tn + 1) / 2;
	return 3 * D + 2 * nx;
}

struct ms { double v; int64_t i; };

static int cmp_ms(const void *a, const void *b)
{
	const struct ms *x = a, *y = b;
	if (x->v != y->v)
		return x->v < y->v ? -1 : 1;
	return x->i < y->i ? -1 : x->i > y->i;
}

int64_t x3_scale_sample(const float *W, int64_t k, int64_t n, float *tiles)
{
	int64_t tk = k / 16, tn = n / 16, D = tk > tn ? tk : tn, m = 0;
	/* wrapped diagonal of width 3 */
	for (int64_t ii = 0; ii < D; ii++)
		for (int64_t ww = 0; ww < 3; ww++)
			x3q_get_tile(W, n, ii % tk, (ii + ww) % tn, tiles + 256 * m++);
	/* outlier insurance: the tiles of highest and lowest mean square */
	int64_t nx = 3 * D / 16 > 8 ? 3 * D / 16 : 8;
	if (nx > (tk * tn + 1) / 2)
		nx = (tk * tn + 1) / 2;
	struct ms *v = xmalloc((size_t)(tk * tn), sizeof *v);
	if (!v) {
		x3_err(X3_ENOMEM, "out of memory for the scale search's sample (%lld tiles)",
		       (long long)(tk * tn));
		return -1;
	}
	for (int64_t t = 0; t < tk * tn; t++) {
		int64_t tr = t / tn, tc = t % tn;
		double s = 0;
		for (int r = 0; r < 16; r++)
			for (int c = 0; c < 16; c++) {
				double x = W[(tr * 16 + r) * n + tc * 16 + c];
				s += x * x;
			}
		v[t].v = s / 256, v[t].i = t;
	}
	qsort(v, (size_t)(tk * tn), sizeof *v, cmp_ms);
	for (int64_t j = 0; j < nx; j++) {
		int64_t t = v[tk * tn - 1 - j].i;
		x3q_get_tile(W, n, t / tn, t % tn, tiles + 256 * m++);
	}
	for (int64_t j = 0; j < nx; j++) {
		int64_t t = v[j].i;
		x3q_get_tile(W, n, t / tn, t % tn, tiles + 256 * m++);
	}
	free(v);
	return m;
}

/* mse(s) for ns scales on m tiles of stride `step` in src (one Viterbi
 * batch of ns*m tiles); *count += the tiles the Viterbi encoded */
static int eval_scales(const float *src, int64_t m, int64_t step, const double *s,
                       int ns, int K, int cb, int threads, struct x3q_tmemo *memo, double *mse,
                       int64_t *count)
{
	int64_t cnt = (m + step - 1) / step, nt = cnt * ns;
	float *x = xcalloc((size_t)(nt * 256), sizeof(float));
	float *q = xmalloc((size_t)(nt * 256), sizeof(float));
	if (!x || !q) {
		free(x), free(q);
		return x3_err(X3_ENOMEM, "out of memory in the scale search");
	}
	for (int j = 0; j < ns; j++)
		for (int64_t t = 0; t < cnt; t++)
			for (int i = 0; i < 256; i++)
				x[((j * cnt) + t) * 256 + i] = (float)(src[t * step * 256 + i] * s[j]);
	int rc = x3q_encode_tiles(K, cb, x, nt, NULL, q, threads, memo, count);
	if (rc == X3_OK)
		for (int j = 0; j < ns; j++) {
			double e = 0;
			for (int64_t t = 0; t < cnt; t++)
				for (int i = 0; i < 256; i++) {
					double d = q[((j * cnt) + t) * 256 + i] / s[j] - src[t * step * 256 + i];
					e += d * d;
				}
			mse[j] = e / (double)(cnt * 256);
		}
	free(x), free(q);
	return rc;
}

/* The coarse grid needs only its argmin, so a scale whose partial error
 * (the tiles summed in eval_scales' order) already exceeds a complete
 * scale's cannot win and is dropped (y = +inf): its final error is at least
 * the partial one. The argmin is eval_scales' exactly. The middle scale
 * (0.9; the optimum is usually near) is evaluated first, in full; then the
 * others together, a chunk of tiles at a time (one Viterbi batch per chunk,
 * of every scale still in the race). */
static int coarse_grid(const float *src, int64_t m, const double *s, int ns, int K, int cb,
                       int threads, struct x3q_tmemo *memo, double *y, int64_t *count)
{
	const int64_t step = 3, cnt = (m + step - 1) / step;
	const double N = (double)(cnt * 256);
	const int mid = (ns - 1) / 2;
	int rc = eval_scales(src, m, step, s + mid, 1, K, cb, threads, memo, y + mid, count);
	if (rc)
		return rc;
	int64_t chunk = 4 * (int64_t)(threads > 0 ? threads : omp_get_max_threads());
	if (chunk < (cnt + 7) / 8)
		chunk = (cnt + 7) / 8;
	if (chunk > cnt)
		chunk = cnt;
	float *x = xcalloc((size_t)(ns * chunk * 256), sizeof(float));
	float *q = xmalloc((size_t)(ns * chunk * 256), sizeof(float));
	double *e = xcalloc((size_t)ns, sizeof(double));
	int *alive = xmalloc((size_t)ns, sizeof(int));
	if (!x || !q || !e || !alive) {
		free(x), free(q), free(e), free(alive);
		return x3_err(X3_ENOMEM, "out of memory in the scale search");
	}
	int na = 0;
	for (int j = 0; j < ns; j++)
		if (j != mid)
			alive[na++] = j;
	for (int64_t t0 = 0; t0 < cnt && na > 0; t0 += chunk) {
		int64_t c = cnt - t0 < chunk ? cnt - t0 : chunk;
		for (int a = 0; a < na; a++)
			for (int64_t t = 0; t < c; t++)
				for (int i = 0; i < 256; i++)
					x[(a * c + t) * 256 + i] = (float)(src[(t0 + t) * step * 256 + i] * s[alive[a]]);
		if ((rc = x3q_encode_tiles(K, cb, x, na * c, NULL, q, threads, memo, count)))
			break;
		int keep = 0;
		for (int a = 0; a < na; a++) {
			int j = alive[a], dropped = 0;
			for (int64_t t = 0; t < c && !dropped; t++) {
				for (int i = 0; i < 256; i++) {
					double d = q[(a * c + t) * 256 + i] / s[j] - src[(t0 + t) * step * 256 + i];
					e[j] += d * d;
				}
				dropped = e[j] / N > y[mid];
			}
			if (dropped)
				y[j] = INFINITY;
			else
				alive[keep++] = j;
		}
		na = keep;
	}
	for (int a = 0; a < na; a++)
		y[alive[a]] = e[alive[a]] / N;
	free(x), free(q), free(e), free(alive);
	return rc;
}

/* The search encodes at most 10 ceil(m/3) + 5 m <= 9 m tiles for m sampled
 * tiles (coarse grid on every third, fine grid on all), and the encode
 * itself k n / 256 tiles. The full sample (3 max(k, n) / 16 + outliers)
 * grows with the longer side, not the area: a 128x128 weight has 64 tiles
 * and a 40-tile sample, so the search cost ~5 encodes of it, a 1024x1024
 * one ~27% of its encode. The cap keeps the search within 1/8 of the
 * encode, but at least X3_SCALE_MIN_TILES tiles (with 8, stories260K's mean
 * proxy error at K=4 rose 6%; with 16 it moved by <1%, within the noise). */
int64_t x3_scale_sample_cap(int64_t k, int64_t n)
{
	int64_t cap = (k / 16) * (n / 16) / (8 * 9);
	return cap > X3_SCALE_MIN_TILES ? cap : X3_SCALE_MIN_TILES;
}

int x3_scale_search(const float *W, int64_t k, int64_t n, int K, int cb,
                    int threads, double *g)
{
	return x3_scale_search_cap(W, k, n, K, cb, threads, x3_scale_sample_cap(k, n), g);
}

int x3_scale_search_cap(const float *W, int64_t k, int64_t n, int K, int cb,
                        int threads, int64_t cap, double *g)
{
	return x3q_scale_search(W, k, n, K, cb, threads, cap, 0, g, NULL);
}

/* The global scale a search would find, predicted from the RMS of its
 * sampled tiles: g RMS falls with K as c(K) = 0.90 * 0.965^(K - 3) (the
 * fit to full searches of stories260K's and a generated Llama's linears at
 * K = 2..6: g RMS 0.96/0.91/0.87/0.85/0.82 on average, within 2-10% of it
 * per tensor; real weights' heavier tails lower it, Gaussian ones raise it) */
static double scale_predict(const float *tiles, int64_t m, int K)
{
	double ss = 0;
	for (int64_t i = 0; i < m * 256; i++)
		ss += (double)tiles[i] * tiles[i];
	double rms = m > 0 ? sqrt(ss / (double)(m * 256)) : 0;
	return rms > 1e-12 ? 0.90 * pow(0.965, K - 3) / rms : 1.0;
}

/* x3_scale_search_cap; *count (may be NULL) += the tiles the Viterbi
 * encoded. center > 0: no coarse grid, the fine grid around center (a
 * scale found before on fewer tiles, refined on this search's sample);
 * center < 0: the same around scale_predict's scale */
int x3q_scale_search(const float *W, int64_t k, int64_t n, int K, int cb,
                        int threads, int64_t cap, double center, double *g, int64_t *count)
{
	*g = 1.0;
	int64_t mmax = x3_scale_sample_max(k, n);
	float *tiles = xmalloc((size_t)(mmax * 256), sizeof(float));
	if (!tiles)
		return x3_err(X3_ENOMEM, "out of memory in the scale search");
	int64_t m = x3_scale_sample(W, k, n, tiles);
	if (m < 0) {
		free(tiles);
		return X3_ENOMEM;
	}
	/* over the cap: every (m/cap)-th sampled tile, in sample order (the
	 * diagonal and the outliers in proportion) */
	if (cap > 0 && m > cap) {
		for (int64_t i = 0; i < cap; i++) {
			int64_t j = (2 * i + 1) * m / (2 * cap);
			if (j != i)
				memcpy(tiles + 256 * i, tiles + 256 * j, 256 * sizeof *tiles);
		}
		m = cap;
	}
	struct x3q_tmemo memo = { 0 };
	double c = center < 0 ? scale_predict(tiles, m, K) : center;
	int rc, best;
	if (center == 0) {   /* coarse grid 0.1, 0.3, ..., 1.9 on every third sampled tile */
		double s[10], y[10];
		for (int i = 0; i < 10; i++)
			s[i] = 0.1 + 0.2 * i;
		if ((rc = coarse_grid(tiles, m, s, 10, K, cb, threads, &memo, y, count))) {
			free(tiles);
			x3q_tmemo_free(&memo);
			return rc;
		}
		best = 0;
		for (int i = 1; i < 10; i++)
			if (y[i] < y[best])
				best = i;
		c = s[best];
	}
	/* fine grid c + 0.075 (i - 2) on all sampled tiles; scales <= 0 (only
	 * around c = 0.1) are skipped */
	double fs[5], fy[5], ps[5], py[5];
	int np = 0, idx[5];
	for (int i = 0; i < 5; i++) {
		fs[i] = c + 0.075 * (i - 2);
		fy[i] = INFINITY;
		if (fs[i] > 1e-6) {
			idx[np] = i;
			ps[np++] = fs[i];
		}
	}
	rc = eval_scales(tiles, m, 1, ps, np, K, cb, threads, &memo, py, count);
	for (int j = 0; !rc && j < np; j++)
		fy[idx[j]] = py[j];
	best = 0;
	for (int i = 1; i < 5; i++)
		if (fy[i] < fy[best])
			best = i;
	/* a centre given from outside may be off by more than the grid: while
	 * its best is an end, slide the grid a step that way (at most
	 * X3_SCALE_WALK steps; the coarse grid's 0.2 spacing needs none) */
	for (int w = 0; !rc && center != 0 && w < X3_SCALE_WALK && (best == 4 || (best == 0 && fs[0] > 0.0875)); w++) {
		int up = best == 4;
		double ns = up ? fs[4] + 0.075 : fs[0] - 0.075, ny;
		if ((rc = eval_scales(tiles, m, 1, &ns, 1, K, cb, threads, &memo, &ny, count)))
			break;
		if (up) {
			memmove(fs, fs + 1, 4 * sizeof *fs), memmove(fy, fy + 1, 4 * sizeof *fy);
			fs[4] = ns, fy[4] = ny;
		} else {
			memmove(fs + 1, fs, 4 * sizeof *fs), memmove(fy + 1, fy, 4 * sizeof *fy);
			fs[0] = ns, fy[0] = ny;
		}
		best = 0;
		for (int i = 1; i < 5; i++)
			if (fy[i] < fy[best])
				best = i;
	}
	free(tiles);
	x3q_tmemo_free(&memo);
	if (rc)
		return rc;
	double off = 0;
	if (best > 0 && best < 4 && isfinite(fy[best - 1]) && isfinite(fy[best + 1])) {
		double den = fy[best - 1] - 2 * fy[best] + fy[best + 1];
		if (den > 0) {
			off = 0.5 * (fy[best - 1] - fy[best + 1]) / den;
			off = off > 0.5 ? 0.5 : off < -0.5 ? -0.5 : off;
		}
	}
	*g = fs[best] + off * 0.075;
	if (*g < 0.01)
		*g = 0.01;
	return X3_OK;
}
