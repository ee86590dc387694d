/* synth.c: helpers shared by the unit tests (synth.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <cblas.h>
#include "synth.h"
#include "frame.h"
#include "io.h"
#include "model.h"
#include "safetensors.h"

/* ---- scratch files and commands -------------------------------------- */
static char tmp[256];

int test_tmpdir(const char *name)
{
	const char *d = getenv("TMPDIR");
	snprintf(tmp, sizeof tmp, "%s/%s.XXXXXX", d && *d ? d : "/tmp", name);
	return mkdtemp(tmp) ? X3_OK : x3_err(X3_EIO, "mkdtemp %s", tmp);
}

const char *test_tmp(void) { return tmp; }

const char *test_path(const char *file)
{
	static char b[8][512];
	static int k;
	k = (k + 1) % 8;
	snprintf(b[k], sizeof b[k], "%s/%s", tmp, file);
	return b[k];
}

int test_tmpdir_remove(void)
{
	if (!tmp[0])
		return 0;
	return test_run("rm -rf '%s'", tmp);
}

int test_run(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof cmd, fmt, ap);
	va_end(ap);
	int rc = system(cmd);
	return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int test_write_frame(const char *path, const x3_tensor *t)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return x3_err(X3_EIO, "%s: cannot create", path);
	x3_writer *w;
	int rc = x3_writer_open_fd(fileno(f), 0, &w);
	if (!rc)
		rc = x3_writer_put(w, t);
	if (!rc)
		rc = x3_writer_close(w);
	if (fclose(f) && !rc)
		rc = x3_err(X3_EIO, "%s: write error", path);
	return rc;
}

/* ---- seeded weights and activations ---------------------------------- */
float *test_randn(x3_rng *g, int64_t n, double scale)
{
	float *p = malloc((size_t)n * sizeof(float));
	if (!p)
		abort();
	for (int64_t i = 0; i < n; i++)
		p[i] = (float)(x3_rng_normal(g) * scale);
	return p;
}

float *test_corr_acts(x3_rng *g, int64_t rows, int64_t k, double c)
{
	float *Z = test_randn(g, rows * k, 1.0), *A = test_randn(g, k * k, c / sqrt((double)k));
	for (int64_t i = 0; i < k; i++)
		A[i * k + i] += 1.0f;
	float *X = malloc((size_t)(rows * k) * sizeof(float));
	if (!X)
		abort();
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)k, (int)k, 1.0f, Z,
	            (int)k, A, (int)k, 0.0f, X, (int)k);
	free(Z), free(A);
	return X;
}

float *test_gram(const float *X, int64_t rows, int64_t k)
{
	float *H = calloc((size_t)(k * k), sizeof(float));
	if (!H)
		abort();
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)k, (int)k, (int)rows, 1.0f, X,
	            (int)k, X, (int)k, 0.0f, H, (int)k);
	return H;
}

double test_proxy_ref(const float *A, const float *B, const float *H, int64_t k, int64_t n)
{
	double s = 0, a = 0;
	for (int64_t c = 0; c < n; c++)
		for (int64_t i = 0; i < k; i++) {
			double t = 0, u = 0;
			for (int64_t l = 0; l < k; l++) {
				t += (double)H[i * k + l] * ((double)A[l * n + c] - B[l * n + c]);
				u += (double)H[i * k + l] * A[l * n + c];
			}
			s += ((double)A[i * n + c] - B[i * n + c]) * t;
			a += (double)A[i * n + c] * u;
		}
	return s / (a > 1e-8 ? a : 1e-8);
}

double test_max_diff(const float *a, const float *b, size_t n)
{
	double d = 0;
	for (size_t i = 0; i < n; i++)
		d = fmax(d, fabs((double)a[i] - b[i]));
	return d;
}

double test_max_rel(const float *a, const float *b, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++)
		m = fmax(m, fabs((double)b[i]));
	return test_max_diff(a, b, n) / (m > 0 ? m : 1);
}

int test_config_parse(const char *json, x3_model_config *c)
{
	return x3_config_parse(json, strlen(json), c);
}

/* ---- a synthetic checkpoint ------------------------------------------ */
struct synth_tens synth_t[SYNTH_MAX];
int synth_n;

void synth_reset(void)
{
	for (int i = 0; i < synth_n; i++)
		free(synth_t[i].v);
	synth_n = 0;
}

struct synth_tens *synth_add(const char *name, int r, int c, double scale, double mean, x3_rng *g)
{
	if (synth_n == SYNTH_MAX) {
		fprintf(stderr, "synth_add: more than %d tensors\n", SYNTH_MAX);
		abort();
	}
	struct synth_tens *t = &synth_t[synth_n++];
	snprintf(t->name, sizeof t->name, "%s", name);
	t->r = r, t->c = c, t->mid = 0, t->omit = 0;
	t->v = malloc(sizeof(double) * (size_t)r * (c ? c : 1));
	for (int i = 0; i < r * (c ? c : 1); i++)
		t->v[i] = mean + scale * x3_rng_normal(g);
	return t;
}

const double *synth_get(const char *fmt, ...)
{
	char n[160];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(n, sizeof n, fmt, ap);
	va_end(ap);
	for (int i = 0; i < synth_n; i++)
		if (!strcmp(synth_t[i].name, n))
			return synth_t[i].v;
	return NULL;
}

void synth_round(x3_dtype dt)
{
	for (int i = 0; i < synth_n; i++)
		for (int j = 0; j < synth_t[i].r * (synth_t[i].c ? synth_t[i].c : 1); j++) {
			float f = (float)synth_t[i].v[j];
			if (dt == X3_F16)
				f = x3_f16_to_f32(x3_f32_to_f16(f));
			if (dt == X3_BF16)
				f = x3_bf16_to_f32(x3_f32_to_bf16(f));
			synth_t[i].v[j] = f;
		}
}

int synth_write(const char *dir, x3_dtype dt, uint64_t shard_bytes)
{
	return synth_write_as(dir, dt, NULL, shard_bytes);
}

int synth_write_as(const char *dir, x3_dtype dt0, x3_dtype (*dt_of)(const char *name, x3_dtype dt),
                   uint64_t shard_bytes)
{
	mkdir(dir, 0755);
	x3_stw *w;
	int rc = x3_stw_create(dir, shard_bytes, &w);
	if (rc)
		return rc;
	for (int i = 0; i < synth_n && !rc; i++) {
		const struct synth_tens *s = &synth_t[i];
		x3_dtype dt = dt_of ? dt_of(s->name, dt0) : dt0;
		if (s->omit)
			continue;
		int64_t sh3[3] = { s->mid > 0 ? s->r / s->mid : 0, s->mid, s->c };
		x3_tensor *t = s->mid > 0 ? x3_tensor_new(s->name, dt, 3, sh3, 1) :
		               s->c ? x3_tensor_new2(s->name, dt, s->r, s->c) : x3_tensor_new1(s->name, dt, s->r);
		if (!t) {
			rc = X3_ENOMEM;
			break;
		}
		int64_t m = x3_tensor_numel(t);
		float *f = malloc(sizeof(float) * (size_t)m);
		for (int64_t j = 0; j < m; j++)
			f[j] = (float)s->v[j];
		x3_convert(t->data, dt, f, X3_F32, (size_t)m);
		free(f);
		rc = x3_stw_module(w);
		if (!rc)
			rc = x3_stw_add(w, t);
		x3_tensor_free(t);
	}
	if (rc) {
		x3_stw_abort(w);
		return rc;
	}
	return x3_stw_commit(w);
}

static int write_vconfig(const char *dir, const char *fmt, va_list ap)
{
	char *js = NULL, p[600];
	int n = vasprintf(&js, fmt, ap);
	if (n < 0)
		return x3_err(X3_ENOMEM, "%s: config.json", dir);
	snprintf(p, sizeof p, "%s/config.json", dir);
	int rc = x3_write_file_atomic(p, js, (size_t)n);
	free(js);
	return rc;
}

int synth_write_config(const char *dir, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = write_vconfig(dir, fmt, ap);
	va_end(ap);
	return rc;
}

int synth_write_model(const char *dir, x3_dtype dt, uint64_t shard_bytes, const char *fmt, ...)
{
	int rc = synth_write(dir, dt, shard_bytes);
	if (rc)
		return rc;
	va_list ap;
	va_start(ap, fmt);
	rc = write_vconfig(dir, fmt, ap);
	va_end(ap);
	return rc;
}

void synth_rms(double *y, const double *x, const double *w, int n, double eps)
{
	double s = 0;
	for (int i = 0; i < n; i++)
		s += x[i] * x[i];
	s = 1 / sqrt(s / n + eps);
	for (int i = 0; i < n; i++)
		y[i] = x[i] * s * w[i];
}

void synth_mv(double *y, const double *W, const double *b, const double *x, int out, int in)
{
	for (int o = 0; o < out; o++) {
		double a = b ? b[o] : 0;
		for (int i = 0; i < in; i++)
			a += W[(size_t)o * in + i] * x[i];
		y[o] = a;
	}
}

void synth_attn_ex(double *a, const double *q, const double *k, const double *v, int n, int lo,
                   int nh, int nkv, int hd, int hdv, double scale, double softcap, double *sc)
{
	for (int h = 0; h < nh; h++) {
		int kh = h / (nh / nkv);
		double mx = -1e300, sum = 0;
		for (int j = lo; j < n; j++) {
			double d = 0;
			for (int e = 0; e < hd; e++)
				d += q[h * hd + e] * k[(size_t)j * nkv * hd + kh * hd + e];
			d *= scale;
			if (softcap > 0)
				d = softcap * tanh(d / softcap);
			sc[j] = d;
			mx = fmax(mx, sc[j]);
		}
		for (int j = lo; j < n; j++)
			sum += sc[j] = exp(sc[j] - mx);
		for (int e = 0; e < hdv; e++) {
			double acc = 0;
			for (int j = lo; j < n; j++)
				acc += sc[j] * v[(size_t)j * nkv * hdv + kh * hdv + e];
			a[h * hdv + e] = acc / sum;
		}
	}
}

void synth_attn(double *a, const double *q, const double *k, const double *v, int n, int nh, int nkv, int hd,
                double *sc)
{
	synth_attn_ex(a, q, k, v, n, 0, nh, nkv, hd, hd, 1 / sqrt(hd), 0, sc);
}

double synth_compare(const char *dir, int rows, int cols, int vocab, synth_ref_fn *ref_fn, const void *ctx,
                     float **lgo)
{
	int32_t *tok = malloc(sizeof(int32_t) * rows * cols);
	for (int i = 0; i < rows * cols; i++)
		tok[i] = (i * 7 + 3) % vocab;
	double e = synth_compare_tok(dir, tok, rows, cols, vocab, ref_fn, ctx, lgo);
	free(tok);
	return e;
}

double synth_compare_tok(const char *dir, const int32_t *tok, int rows, int cols, int vocab, synth_ref_fn *ref_fn,
                         const void *ctx, float **lgo)
{
	x3_model *m;
	int rc = x3_model_open(dir, NULL, &m);
	if (lgo)
		*lgo = NULL;
	if (rc) {
		printf("# open: %s\n", x3_errmsg());
		return 1e9;
	}
	float *lg = malloc(sizeof(float) * rows * cols * vocab);
	double *ref = malloc(sizeof(double) * cols * vocab), err = 0, mag = 0;
	struct x3_forward_opts o;
	x3_forward_opts_init(&o, m);
	o.logits_mode = X3_LOGITS_ALL;
	o.logits = lg;
	o.chunk_tokens = cols;
	if ((rc = x3_model_forward(m, tok, rows, cols, &o))) {
		printf("# forward: %s\n", x3_errmsg());
		err = 1e9;
	}
	for (int r = 0; r < rows && !rc; r++) {
		ref_fn(ctx, tok + r * cols, cols, ref);
		for (int i = 0; i < cols * vocab; i++) {
			double d = fabs(ref[i] - lg[(size_t)r * cols * vocab + i]);
			/* fmax drops a NaN: a NaN logit (or reference) is an error */
			err = isnan(d) ? INFINITY : fmax(err, d);
			mag = fmax(mag, fabs(ref[i]));
		}
	}
	free(ref);
	if (lgo)
		*lgo = lg;
	else
		free(lg);
	x3_model_close(m);
	return err / (mag > 0 ? mag : 1);
}

/* ---- DeepSeek's multi-head latent attention model (the reference) ----- */
/* RoPE on the rope part v (d) at position pos */
static void mla_rope(double *v, int pos, const struct synth_mla *s)
{
	int d = s->rope, h = d / 2;
	double tmp[64];
	for (int i = 0; i < d; i++)
		tmp[i] = s->interleave ? (i < h ? v[2 * i] : v[2 * (i - h) + 1]) : v[i];
	for (int i = 0; i < h; i++) {
		double f = s->inv_freq[i], c = cos(pos * f) * s->rope_factor, sn = sin(pos * f) * s->rope_factor;
		v[i] = tmp[i] * c - tmp[i + h] * sn;
		v[i + h] = tmp[i + h] * c + tmp[i] * sn;
	}
}

static const double *mla_key;
static int mla_desc(const void *a, const void *b)
{
	double x = mla_key[*(const int *)a], y = mla_key[*(const int *)b];
	return x > y ? -1 : x < y ? 1 : *(const int *)a - *(const int *)b;
}

/* the routed experts of one token by sorting: idx (K), w (K) */
static void mla_route(const struct synth_mla *s, const double *logit, const double *bias, int *idx, double *w)
{
	int E = s->E, per = E / s->n_group, ord[256], gord[64];
	double sc[256], ch[256], gs[64];
	for (int e = 0; e < E; e++) {
		sc[e] = 1 / (1 + exp(-logit[e]));
		ch[e] = sc[e] + bias[e];
	}
	for (int g = 0; g < s->n_group; g++) {
		for (int j = 0; j < per; j++)
			ord[j] = g * per + j;
		mla_key = ch;
		qsort(ord, (size_t)per, sizeof *ord, mla_desc);
		gs[g] = ch[ord[0]] + ch[ord[1]];
		gord[g] = g;
	}
	mla_key = gs;
	qsort(gord, (size_t)s->n_group, sizeof *gord, mla_desc);
	for (int e = 0; e < E; e++) {
		int keep = 0;
		for (int j = 0; j < s->topk_group; j++)
			keep |= gord[j] == e / per;
		if (!keep)
			ch[e] = 0;
		ord[e] = e;
	}
	mla_key = ch;
	qsort(ord, (size_t)E, sizeof *ord, mla_desc);
	double sum = 0;
	for (int j = 0; j < s->K; j++)
		idx[j] = ord[j], sum += sc[ord[j]];
	for (int j = 0; j < s->K; j++)
		w[j] = (s->norm_topk ? sc[idx[j]] / (sum + 1e-20) : sc[idx[j]]) * s->routed_scale;
}

/* the SwiGLU MLP of width w on x (H) */
static void mla_mlp(double *y, const double *x, const double *G, const double *U, const double *D, int H, int w)
{
	double g[512], u[512];
	synth_mv(g, G, NULL, x, w, H);
	synth_mv(u, U, NULL, x, w, H);
	for (int i = 0; i < w; i++)
		g[i] = g[i] / (1 + exp(-g[i])) * u[i];
	synth_mv(y, D, NULL, g, H, w);
}

void synth_mla_forward(const void *ctx, const int32_t *tok, int n, double *logits)
{
	const struct synth_mla *s = ctx;
	int H = s->hidden, nh = s->heads, qkd = s->nope + s->rope, kvb = s->nope + s->vd;
	double *x = calloc((size_t)n * H, sizeof *x), xn[256], o[256], y[256];
	double *q = malloc(sizeof(double) * n * nh * qkd), *lat = malloc(sizeof(double) * n * (s->kv_lora + s->rope));
	double *K = malloc(sizeof(double) * n * nh * qkd), *V = malloc(sizeof(double) * n * nh * s->vd);
	double *a = malloc(sizeof(double) * nh * s->vd), *sc = malloc(sizeof(double) * n);
	double qa[256], ckv[256], kv[1024], sm = s->softmax_scale;
	const double *E = synth_get("model.embed_tokens.weight");
	for (int t = 0; t < n; t++)
		memcpy(x + t * H, E + (size_t)tok[t] * H, sizeof(double) * H);
	for (int l = 0; l < s->layers; l++) {
#define W(x) synth_get("model.layers.%d." x, l)
		for (int t = 0; t < n; t++) {
			synth_rms(xn, x + t * H, W("input_layernorm.weight"), H, s->eps);
			if (s->q_lora) {
				synth_mv(qa, W("self_attn.q_a_proj.weight"), W("self_attn.q_a_proj.bias"), xn, s->q_lora, H);
				synth_rms(qa, qa, W("self_attn.q_a_layernorm.weight"), s->q_lora, s->lat_eps);
				synth_mv(q + t * nh * qkd, W("self_attn.q_b_proj.weight"), NULL, qa, nh * qkd, s->q_lora);
			} else {
				synth_mv(q + t * nh * qkd, W("self_attn.q_proj.weight"), NULL, xn, nh * qkd, H);
			}
			double *lt = lat + t * (s->kv_lora + s->rope);
			synth_mv(lt, W("self_attn.kv_a_proj_with_mqa.weight"), W("self_attn.kv_a_proj_with_mqa.bias"), xn,
			         s->kv_lora + s->rope, H);
			mla_rope(lt + s->kv_lora, t, s);
			for (int h = 0; h < nh; h++)
				mla_rope(q + (t * nh + h) * qkd + s->nope, t, s);
			/* decompress this position's keys and values, every head */
			synth_rms(ckv, lt, W("self_attn.kv_a_layernorm.weight"), s->kv_lora, s->lat_eps);
			synth_mv(kv, W("self_attn.kv_b_proj.weight"), NULL, ckv, nh * kvb, s->kv_lora);
			for (int h = 0; h < nh; h++) {
				for (int e = 0; e < s->nope; e++)
					K[(t * nh + h) * qkd + e] = kv[h * kvb + e];
				for (int e = 0; e < s->rope; e++)
					K[(t * nh + h) * qkd + s->nope + e] = lt[s->kv_lora + e];
				for (int e = 0; e < s->vd; e++)
					V[(t * nh + h) * s->vd + e] = kv[h * kvb + s->nope + e];
			}
		}
		for (int t = 0; t < n; t++) {
			for (int h = 0; h < nh; h++) {
				double mx = -1e300, sum = 0;
				for (int j = 0; j <= t; j++) {
					double d = 0;
					for (int e = 0; e < qkd; e++)
						d += q[(t * nh + h) * qkd + e] * K[(j * nh + h) * qkd + e];
					sc[j] = d * sm;
					mx = sc[j] > mx ? sc[j] : mx;
				}
				for (int j = 0; j <= t; j++)
					sum += sc[j] = exp(sc[j] - mx);
				for (int e = 0; e < s->vd; e++) {
					double acc = 0;
					for (int j = 0; j <= t; j++)
						acc += sc[j] * V[(j * nh + h) * s->vd + e];
					a[h * s->vd + e] = acc / sum;
				}
			}
			synth_mv(o, W("self_attn.o_proj.weight"), W("self_attn.o_proj.bias"), a, H, nh * s->vd);
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
		for (int t = 0; t < n; t++) {
			synth_rms(xn, x + t * H, W("post_attention_layernorm.weight"), H, s->eps);
			if (s->dense >> l & 1) {
				mla_mlp(o, xn, W("mlp.gate_proj.weight"), W("mlp.up_proj.weight"), W("mlp.down_proj.weight"), H,
				        s->inter);
			} else {
				double lg[256], w[16];
				int idx[16];
				synth_mv(lg, W("mlp.gate.weight"), NULL, xn, s->E, H);
				mla_route(s, lg, W("mlp.gate.e_score_correction_bias"), idx, w);
				mla_mlp(o, xn, W("mlp.shared_experts.gate_proj.weight"), W("mlp.shared_experts.up_proj.weight"),
				        W("mlp.shared_experts.down_proj.weight"), H, s->shared_inter);
				for (int j = 0; j < s->K; j++) {
					mla_mlp(y, xn, synth_get("model.layers.%d.mlp.experts.%d.gate_proj.weight", l, idx[j]),
					        synth_get("model.layers.%d.mlp.experts.%d.up_proj.weight", l, idx[j]),
					        synth_get("model.layers.%d.mlp.experts.%d.down_proj.weight", l, idx[j]), H,
					        s->moe_inter);
					for (int i = 0; i < H; i++)
						o[i] += w[j] * y[i];
				}
			}
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
#undef W
	}
	for (int t = 0; t < n; t++) {
		synth_rms(xn, x + t * H, synth_get("model.norm.weight"), H, s->eps);
		synth_mv(logits + (size_t)t * s->vocab, synth_get("lm_head.weight"), NULL, xn, s->vocab, H);
	}
	free(x), free(q), free(lat), free(K), free(V), free(a), free(sc);
}
