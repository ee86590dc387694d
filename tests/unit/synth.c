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
