/* siglip.c: Gemma3's SigLIP vision encoder in plain double loops (siglip.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "x3.h"
#include "exl3.h"
#include "siglip.h"

/* the encoder's tensors, as arch_tables.c's gemma3_vis rows and Hugging
 * Face's SiglipVisionModel name them */
#define SIGLIP_PREFIX "vision_tower.vision_model."

enum { LN1, LN2, NNORM };
enum { Q, K, V, O, FC1, FC2, NLIN };
static const char *const norm_name[NNORM] = {"layer_norm1", "layer_norm2"};
static const char *const lin_name[NLIN] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                           "self_attn.out_proj", "mlp.fc1", "mlp.fc2"};

typedef struct {
	double *nw[NNORM], *nb[NNORM];
	double *w[NLIN], *b[NLIN];   /* w (out, in) */
} layer;

struct x3_siglip {
	int64_t hidden, inter, heads, nl;
	double eps;
	layer *l;
	double *pw, *pb;             /* post_layernorm */
};

static double *to_double(const float *f, int64_t n)
{
	double *d = malloc((size_t)(n ? n : 1) * sizeof *d);
	for (int64_t i = 0; d && i < n; i++)
		d[i] = f[i];
	return d;
}

/* the float tensor NAME of shape d0 (x d1) as doubles */
static int read_t(const x3_st *st, const char *name, int64_t d0, int64_t d1, double **out)
{
	const x3_tensor *t = x3_st_find(st, name);
	int rc = x3_tensor_check_float(t, name, d1 ? 2 : 1, d0, d1);
	if (rc)
		return rc;
	float *f = x3_tensor_f32(t);
	if (!f)
		return x3_err(X3_ENOMEM, "out of memory");
	*out = to_double(f, d1 ? d0 * d1 : d0);
	free(f);
	return *out ? X3_OK : x3_err(X3_ENOMEM, "out of memory");
}

/* linear KEY (out, in): decoded from PACK when it holds KEY.trellis */
static int read_lin(const x3_st *src, const x3_st *pack, const char *key, int64_t out, int64_t in, double **w,
                    int *decoded)
{
	char n[256];
	snprintf(n, sizeof n, "%s.trellis", key);
	if (!pack || !x3_st_find(pack, n)) {
		snprintf(n, sizeof n, "%s.weight", key);
		return read_t(src, n, out, in, w);
	}
	x3_exl3 *e = NULL;
	int rc = x3_exl3_from_st(pack, key, &e);
	if (!rc)
		rc = x3_exl3_set_orig(e, in, out);
	float *f = rc ? NULL : malloc((size_t)(out * in) * sizeof *f);
	if (!rc && !f)
		rc = x3_err(X3_ENOMEM, "out of memory");
	if (!rc)
		rc = x3_exl3_dequant(e, f);
	if (!rc && !(*w = to_double(f, out * in)))
		rc = x3_err(X3_ENOMEM, "out of memory");
	free(f);
	x3_exl3_free(e);
	if (!rc)
		(*decoded)++;
	return rc;
}

int x3_siglip_load(const x3_model_config *c, const x3_st *src, const x3_st *pack, x3_siglip **out,
                   int *decoded)
{
	*out = NULL;
	*decoded = 0;
	if (c->arch != X3_ARCH_GEMMA3_MM || !c->v_layers)
		return x3_err(X3_EUNSUP, "%s: the SigLIP encoder is Gemma3ForConditionalGeneration's (with a "
		              "vision_config)", c->arch_name);
	x3_siglip *s = calloc(1, sizeof *s);
	if (!s || !(s->l = calloc((size_t)c->v_layers, sizeof *s->l))) {
		free(s);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	s->hidden = c->v_hidden, s->inter = c->v_inter, s->heads = c->v_heads, s->nl = c->v_layers;
	s->eps = c->v_eps;
	int rc = X3_OK;
	char n[256];
	for (int64_t l = 0; l < s->nl && !rc; l++) {
		layer *L = &s->l[l];
		for (int j = 0; j < NNORM && !rc; j++) {
			snprintf(n, sizeof n, SIGLIP_PREFIX "encoder.layers.%lld.%s.weight", (long long)l, norm_name[j]);
			if (!(rc = read_t(src, n, s->hidden, 0, &L->nw[j]))) {
				snprintf(n, sizeof n, SIGLIP_PREFIX "encoder.layers.%lld.%s.bias", (long long)l, norm_name[j]);
				rc = read_t(src, n, s->hidden, 0, &L->nb[j]);
			}
		}
		for (int j = 0; j < NLIN && !rc; j++) {
			int64_t o = j == FC1 ? s->inter : s->hidden, i = j == FC2 ? s->inter : s->hidden;
			snprintf(n, sizeof n, SIGLIP_PREFIX "encoder.layers.%lld.%s", (long long)l, lin_name[j]);
			if (!(rc = read_lin(src, pack, n, o, i, &L->w[j], decoded))) {
				snprintf(n, sizeof n, SIGLIP_PREFIX "encoder.layers.%lld.%s.bias", (long long)l, lin_name[j]);
				rc = read_t(src, n, o, 0, &L->b[j]);
			}
		}
	}
	if (!rc && !(rc = read_t(src, SIGLIP_PREFIX "post_layernorm.weight", s->hidden, 0, &s->pw)))
		rc = read_t(src, SIGLIP_PREFIX "post_layernorm.bias", s->hidden, 0, &s->pb);
	if (rc) {
		x3_siglip_free(s);
		return rc;
	}
	*out = s;
	return X3_OK;
}

void x3_siglip_free(x3_siglip *s)
{
	if (!s)
		return;
	for (int64_t l = 0; s->l && l < s->nl; l++) {
		for (int j = 0; j < NNORM; j++)
			free(s->l[l].nw[j]), free(s->l[l].nb[j]);
		for (int j = 0; j < NLIN; j++)
			free(s->l[l].w[j]), free(s->l[l].b[j]);
	}
	free(s->l);
	free(s->pw);
	free(s->pb);
	free(s);
}

int64_t x3_siglip_hidden(const x3_siglip *s)
{
	return s->hidden;
}

static void layer_norm(const double *x, int64_t n, const double *w, const double *b, double eps, double *y)
{
	double m = 0, v = 0;
	for (int64_t i = 0; i < n; i++)
		m += x[i];
	m /= (double)n;
	for (int64_t i = 0; i < n; i++)
		v += (x[i] - m) * (x[i] - m);
	double r = 1 / sqrt(v / (double)n + eps);
	for (int64_t i = 0; i < n; i++)
		y[i] = (x[i] - m) * r * w[i] + b[i];
}

/* y (out) = W (out, in) x + b */
static void linear(const double *w, const double *b, int64_t out, int64_t in, const double *x, double *y)
{
	for (int64_t o = 0; o < out; o++) {
		double a = b[o];
		for (int64_t i = 0; i < in; i++)
			a += w[o * in + i] * x[i];
		y[o] = a;
	}
}

static double gelu_tanh(double x)
{
	return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

int x3_siglip_forward(const x3_siglip *s, int64_t ntok, const double *x, double *y)
{
	int64_t H = s->hidden, I = s->inter, nh = s->heads, hd = H / nh;
	double *h = malloc((size_t)(ntok * H) * sizeof *h), *q = malloc((size_t)(ntok * H) * sizeof *q);
	double *k = malloc((size_t)(ntok * H) * sizeof *k), *v = malloc((size_t)(ntok * H) * sizeof *v);
	double *a = malloc((size_t)(ntok * H) * sizeof *a), *p = malloc((size_t)(ntok > 0 ? ntok : 1) * sizeof *p);
	double *f = malloc((size_t)(I > H ? I : H) * sizeof *f), *t = malloc((size_t)H * sizeof *t);
	int rc = h && q && k && v && a && p && f && t ? X3_OK : x3_err(X3_ENOMEM, "out of memory");
	if (!rc && y != x)
		memcpy(y, x, (size_t)(ntok * H) * sizeof *y);
	double scale = 1 / sqrt((double)hd);
	for (int64_t l = 0; l < s->nl && !rc; l++) {
		const layer *L = &s->l[l];
		for (int64_t i = 0; i < ntok; i++) {
			layer_norm(y + i * H, H, L->nw[LN1], L->nb[LN1], s->eps, h + i * H);
			linear(L->w[Q], L->b[Q], H, H, h + i * H, q + i * H);
			linear(L->w[K], L->b[K], H, H, h + i * H, k + i * H);
			linear(L->w[V], L->b[V], H, H, h + i * H, v + i * H);
		}
		/* every token attends to every token (no mask) */
		for (int64_t i = 0; i < ntok; i++)
			for (int64_t hh = 0; hh < nh; hh++) {
				double mx = -INFINITY, sum = 0;
				for (int64_t j = 0; j < ntok; j++) {
					double d = 0;
					for (int64_t e = 0; e < hd; e++)
						d += q[i * H + hh * hd + e] * k[j * H + hh * hd + e];
					p[j] = d * scale;
					mx = p[j] > mx ? p[j] : mx;
				}
				for (int64_t j = 0; j < ntok; j++)
					sum += (p[j] = exp(p[j] - mx));
				for (int64_t e = 0; e < hd; e++) {
					double o = 0;
					for (int64_t j = 0; j < ntok; j++)
						o += p[j] * v[j * H + hh * hd + e];
					a[i * H + hh * hd + e] = o / sum;
				}
			}
		for (int64_t i = 0; i < ntok; i++) {
			linear(L->w[O], L->b[O], H, H, a + i * H, t);
			for (int64_t e = 0; e < H; e++)
				y[i * H + e] += t[e];
			layer_norm(y + i * H, H, L->nw[LN2], L->nb[LN2], s->eps, h + i * H);
			linear(L->w[FC1], L->b[FC1], I, H, h + i * H, f);
			for (int64_t e = 0; e < I; e++)
				f[e] = gelu_tanh(f[e]);
			linear(L->w[FC2], L->b[FC2], H, I, f, t);
			for (int64_t e = 0; e < H; e++)
				y[i * H + e] += t[e];
		}
	}
	for (int64_t i = 0; i < ntok && !rc; i++) {
		memcpy(t, y + i * H, (size_t)H * sizeof *t);
		layer_norm(t, H, s->pw, s->pb, s->eps, y + i * H);
	}
	free(h), free(q), free(k), free(v), free(a), free(p), free(f), free(t);
	return rc;
}
