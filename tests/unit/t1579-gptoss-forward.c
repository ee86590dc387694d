/* t1579-gptoss-forward: GPT-OSS (GptOssForCausalLM) written here (seeded,
 * F32, per-expert keys: the layout an EXL3 GPT-OSS holds) and run by the
 * model library: its logits match a double-precision reference written in
 * this file from Hugging Face's modeling_gpt_oss.py (transformers is not
 * available here):
 *   - attention with q/k/v/o biases and one learned sink logit per head
 *     (the softmax over [scores, sink], the sink's share dropped);
 *     sliding layers (layer_types) see the keys with t - j < sliding_window,
 *     full layers all of them;
 *   - YaRN RoPE (rotate-half) with truncate false: the ramp's ends kept
 *     fractional (here 1.26 where truncation would make it 2);
 *   - the router: logits = W x + b, the top k, weights the softmax over
 *     those k logits;
 *   - the experts' clamped SwiGLU on the interleaved layout's split:
 *     gate = min(g, limit), up = clamp(u, -limit, limit),
 *     (up + 1) * gate * sigmoid(1.702 gate), with gate/up/down biases.
 * Also, each a check that can fail on its own: sinks of -inf give the bits
 * of plain attention; a sliding window at least the row length gives the
 * bits of full attention; the clamp changes the output when activations
 * pass it (and not when the limit is far); the router against a scalar
 * loop; the activation on hand-worked values; bad configs and the hub's
 * fused expert tensors named. */
#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include "test.h"
#include "synth.h"
#include "model.h"
#include "arch.h"
#include "attention.h"
#include "moe.h"
#include "safetensors.h"

struct go {
	int hidden, inter, layers, heads, kv, hd, vocab, E, K, window;
	unsigned swa;           /* bit l: layer l slides */
	double limit;           /* swiglu_limit */
	int truncate;           /* rope_scaling truncate */
};
#define THETA 10000.0
#define FACTOR 4.0
#define ORIG 64
#define EPS 1e-5
#define ALPHA 1.702

static void build(const struct go *s, uint64_t seed)
{
	x3_rng g;
	x3_rng_seed(&g, seed, 0);
	synth_reset();
	char n[160];
	int H = s->hidden, qd = s->heads * s->hd, kvd = s->kv * s->hd, I = s->inter;
	synth_add("model.embed_tokens.weight", s->vocab, H, 1.0, 0, &g);
	for (int l = 0; l < s->layers; l++) {
#define L(x) (snprintf(n, sizeof n, "model.layers.%d." x, l), n)
		synth_add(L("input_layernorm.weight"), H, 0, 0.1, 1, &g);
		synth_add(L("self_attn.q_proj.weight"), qd, H, 1 / sqrt(H), 0, &g);
		synth_add(L("self_attn.q_proj.bias"), qd, 0, 0.3, 0, &g);
		synth_add(L("self_attn.k_proj.weight"), kvd, H, 1 / sqrt(H), 0, &g);
		synth_add(L("self_attn.k_proj.bias"), kvd, 0, 0.3, 0, &g);
		synth_add(L("self_attn.v_proj.weight"), kvd, H, 1 / sqrt(H), 0, &g);
		synth_add(L("self_attn.v_proj.bias"), kvd, 0, 0.3, 0, &g);
		synth_add(L("self_attn.o_proj.weight"), H, qd, 1 / sqrt(qd), 0, &g);
		synth_add(L("self_attn.o_proj.bias"), H, 0, 0.3, 0, &g);
		synth_add(L("self_attn.sinks"), s->heads, 0, 1.0, 0.5, &g);
		synth_add(L("post_attention_layernorm.weight"), H, 0, 0.1, 1, &g);
		synth_add(L("mlp.router.weight"), s->E, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.router.bias"), s->E, 0, 0.5, 0, &g);
		for (int e = 0; e < s->E; e++) {
			char m[160];
#define LE(x) (snprintf(m, sizeof m, "model.layers.%d.mlp.experts.%d." x, l, e), m)
			/* large enough that the clamp at 2 matters */
			synth_add(LE("gate_proj.weight"), I, H, 3 / sqrt(H), 0, &g);
			synth_add(LE("gate_proj.bias"), I, 0, 0.5, 0, &g);
			synth_add(LE("up_proj.weight"), I, H, 3 / sqrt(H), 0, &g);
			synth_add(LE("up_proj.bias"), I, 0, 0.5, 0, &g);
			synth_add(LE("down_proj.weight"), H, I, 1 / sqrt(I), 0, &g);
			synth_add(LE("down_proj.bias"), H, 0, 0.3, 0, &g);
#undef LE
		}
#undef L
	}
	synth_add("model.norm.weight", H, 0, 0.1, 1, &g);
	synth_add("lm_head.weight", s->vocab, H, 1 / sqrt(H), 0, &g);
	synth_round(X3_F32);
}

/* config.json as the hub's gpt-oss configs (both top-k keys, rope_scaling
 * yarn with truncate); EXTRA appended (a later key replaces) */
static int write_model(const struct go *s, const char *dir, const char *extra)
{
	char lt[512];
	size_t k = (size_t)snprintf(lt, sizeof lt, "[");
	for (int l = 0; l < s->layers; l++)
		k += (size_t)snprintf(lt + k, sizeof lt - k, "%s\"%s\"", l ? ", " : "",
		                      s->swa >> l & 1 ? "sliding_attention" : "full_attention");
	snprintf(lt + k, sizeof lt - k, "]");
	return synth_write_model(dir, X3_F32, 0,
	         "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", "
	         "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
	         "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d, "
	         "\"rms_norm_eps\": %g, \"max_position_embeddings\": 256, \"rope_theta\": %g, "
	         "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": %g, \"beta_fast\": 32.0, \"beta_slow\": 1.0, "
	         "\"truncate\": %s, \"original_max_position_embeddings\": %d}, "
	         "\"num_local_experts\": %d, \"num_experts_per_tok\": %d, \"experts_per_token\": %d, "
	         "\"sliding_window\": %d, \"layer_types\": %s, \"swiglu_limit\": %g, \"attention_bias\": true, "
	         "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false%s}",
	         s->hidden, s->inter, s->layers, s->heads, s->kv, s->hd, s->vocab, EPS, THETA, FACTOR,
	         s->truncate ? "true" : "false", ORIG, s->E, s->K, s->K, s->window, lt, s->limit, extra ? extra : "");
}

/* ---- the reference (double, token by token) -------------------------- */
/* Hugging Face's yarn inverse frequencies (_compute_yarn_parameters) */
static double yarn_dim(double rot, double d)
{
	return d * log(ORIG / (rot * 2 * M_PI)) / (2 * log(THETA));
}

static void rope(double *v, int pos, const struct go *s)
{
	int d = s->hd, h = d / 2;
	double lo = yarn_dim(32, d), hi = yarn_dim(1, d);
	if (s->truncate)
		lo = floor(lo), hi = ceil(hi);
	lo = lo < 0 ? 0 : lo;
	hi = hi > d - 1 ? d - 1 : hi;
	if (lo == hi)
		hi += 0.001;
	double af = 0.1 * log(FACTOR) + 1;
	for (int i = 0; i < h; i++) {
		double pf = pow(THETA, 2.0 * i / d), ramp = (i - lo) / (hi - lo);
		ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
		double ex = 1 - ramp, f = 1 / (FACTOR * pf) * (1 - ex) + 1 / pf * ex;
		double c = cos(pos * f) * af, sn = sin(pos * f) * af, a = v[i], b = v[i + h];
		v[i] = a * c - b * sn;
		v[i + h] = b * c + a * sn;
	}
}

static const double *cmp_key;
static int cmp_desc(const void *a, const void *b)
{
	double x = cmp_key[*(const int *)a], y = cmp_key[*(const int *)b];
	return x > y ? -1 : x < y ? 1 : *(const int *)a - *(const int *)b;
}

/* the top k of the logits, their weights the softmax over them */
static void route(int E, int K, const double *logit, int *idx, double *w)
{
	int ord[256];
	for (int e = 0; e < E; e++)
		ord[e] = e;
	cmp_key = logit;
	qsort(ord, (size_t)E, sizeof *ord, cmp_desc);
	double sum = 0;
	for (int j = 0; j < K; j++)
		idx[j] = ord[j], sum += exp(logit[ord[j]] - logit[ord[0]]);
	for (int j = 0; j < K; j++)
		w[j] = exp(logit[idx[j]] - logit[ord[0]]) / sum;
}

static void expert(double *y, const double *x, const struct go *s, int l, int e)
{
	int H = s->hidden, I = s->inter;
	double g[512], u[512];
	char p[96];
	snprintf(p, sizeof p, "model.layers.%d.mlp.experts.%d.", l, e);
#define EW(x) synth_get("%s" x, p)
	synth_mv(g, EW("gate_proj.weight"), EW("gate_proj.bias"), x, I, H);
	synth_mv(u, EW("up_proj.weight"), EW("up_proj.bias"), x, I, H);
	for (int i = 0; i < I; i++) {
		double gv = g[i] < s->limit ? g[i] : s->limit;
		double uv = u[i] < -s->limit ? -s->limit : u[i] > s->limit ? s->limit : u[i];
		g[i] = (uv + 1) * gv / (1 + exp(-ALPHA * gv));
	}
	synth_mv(y, EW("down_proj.weight"), EW("down_proj.bias"), g, H, I);
#undef EW
}

static int ref_nosinks;   /* the reference without sinks */

static void ref_forward(const struct go *s, const int32_t *tok, int n, double *logits)
{
	int H = s->hidden, nh = s->heads, nkv = s->kv, hd = s->hd, qd = nh * hd, kvd = nkv * hd;
	double *x = calloc((size_t)n * H, sizeof *x), xn[256], o[256], y[256];
	double *q = malloc(sizeof(double) * n * qd), *K = malloc(sizeof(double) * n * kvd);
	double *V = malloc(sizeof(double) * n * kvd), *a = malloc(sizeof(double) * qd), *sc = malloc(sizeof(double) * n);
	const double *E = synth_get("model.embed_tokens.weight");
	for (int t = 0; t < n; t++)
		memcpy(x + t * H, E + (size_t)tok[t] * H, sizeof(double) * H);
	for (int l = 0; l < s->layers; l++) {
#define W(x) synth_get("model.layers.%d." x, l)
		int swa = s->swa >> l & 1;
		for (int t = 0; t < n; t++) {
			synth_rms(xn, x + t * H, W("input_layernorm.weight"), H, EPS);
			synth_mv(q + t * qd, W("self_attn.q_proj.weight"), W("self_attn.q_proj.bias"), xn, qd, H);
			synth_mv(K + t * kvd, W("self_attn.k_proj.weight"), W("self_attn.k_proj.bias"), xn, kvd, H);
			synth_mv(V + t * kvd, W("self_attn.v_proj.weight"), W("self_attn.v_proj.bias"), xn, kvd, H);
			for (int h = 0; h < nh; h++)
				rope(q + t * qd + h * hd, t, s);
			for (int h = 0; h < nkv; h++)
				rope(K + t * kvd + h * hd, t, s);
		}
		const double *sinks = W("self_attn.sinks");
		for (int t = 0; t < n; t++) {
			int lo = swa && t >= s->window ? t - s->window + 1 : 0;
			for (int h = 0; h < nh; h++) {
				int kh = h / (nh / nkv);
				double mx = ref_nosinks ? -INFINITY : sinks[h], sum = 0;
				for (int j = lo; j <= t; j++) {
					double d = 0;
					for (int e = 0; e < hd; e++)
						d += q[t * qd + h * hd + e] * K[j * kvd + kh * hd + e];
					sc[j] = d / sqrt(hd);
					mx = sc[j] > mx ? sc[j] : mx;
				}
				for (int j = lo; j <= t; j++)
					sum += sc[j] = exp(sc[j] - mx);
				if (!ref_nosinks)
					sum += exp(sinks[h] - mx);
				for (int e = 0; e < hd; e++) {
					double acc = 0;
					for (int j = lo; j <= t; j++)
						acc += sc[j] * V[j * kvd + kh * hd + e];
					a[h * hd + e] = acc / sum;
				}
			}
			synth_mv(o, W("self_attn.o_proj.weight"), W("self_attn.o_proj.bias"), a, H, qd);
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
		for (int t = 0; t < n; t++) {
			double lg[256], w[16];
			int idx[16];
			synth_rms(xn, x + t * H, W("post_attention_layernorm.weight"), H, EPS);
			synth_mv(lg, W("mlp.router.weight"), W("mlp.router.bias"), xn, s->E, H);
			route(s->E, s->K, lg, idx, w);
			for (int i = 0; i < H; i++)
				o[i] = 0;
			for (int j = 0; j < s->K; j++) {
				expert(y, xn, s, l, idx[j]);
				for (int i = 0; i < H; i++)
					o[i] += w[j] * y[i];
			}
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
#undef W
	}
	for (int t = 0; t < n; t++) {
		synth_rms(xn, x + t * H, synth_get("model.norm.weight"), H, EPS);
		synth_mv(logits + (size_t)t * s->vocab, synth_get("lm_head.weight"), NULL, xn, s->vocab, H);
	}
	free(x), free(q), free(K), free(V), free(a), free(sc);
}

static void ref_rows(const void *ctx, const int32_t *tok, int n, double *logits)
{
	ref_forward(ctx, tok, n, logits);
}

static int bad(const struct go *s, const char *name, const char *extra, const char *want)
{
	if (write_model(s, test_path(name), extra))
		return 0;
	x3_model *m;
	int rc = x3_model_open(test_path(name), NULL, &m);
	if (!rc) {
		x3_model_close(m);
		return 0;
	}
	if (!strstr(x3_errmsg(), want))
		printf("# %s: got '%s'\n", name, x3_errmsg());
	return strstr(x3_errmsg(), want) != NULL;
}

/* max |a - b| over n floats, and whether they are the same bits */
static double maxdiff(const float *a, const float *b, size_t n, int *same)
{
	double d = 0;
	*same = !memcmp(a, b, n * sizeof *a);
	for (size_t i = 0; i < n; i++)
		d = fmax(d, fabs((double)a[i] - b[i]));
	return d;
}

int main(void)
{
	if (test_tmpdir("t1579")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	/* hidden inter layers heads kv hd vocab E K window | swa limit truncate */
	struct go a = { 40, 20, 3, 4, 2, 12, 50, 6, 2, 5, 5u, 2.0, 0 };
	const int cols = 13;
	build(&a, 1);
	CHECK_OK(write_model(&a, test_path("a"), NULL), "write GPT-OSS: hidden 40, 4 heads of 12 over 2 kv heads, "
	         "layers sliding/full/sliding with window 5, 6 experts top 2 of 20, swiglu_limit 2, yarn truncate false");
	x3_model *m;
	CHECK_OK(x3_model_open(test_path("a"), NULL, &m), "open it");
	if (m) {
		const x3_model_config *c = x3_model_cfg(m);
		CHECK(c->arch == X3_ARCH_GPT_OSS && c->sinks && c->topk_softmax && c->swa_masked && c->qkv_bias &&
		      c->o_bias && c->swa_layers[0] == 5 && c->sliding_window == 5 && c->swiglu_limit == 2.0 &&
		      c->swiglu_alpha == 1.702 && c->rope_type == 3 && !c->rope_truncate && c->moe_inter == 20 &&
		      c->n_experts == 6 && c->n_experts_tok == 2,
		      "config: sinks, top-k softmax, layers 0 and 2 slide (window 5), q/k/v/o biases, limit 2, "
		      "alpha 1.702, yarn without truncation, 6 experts of 20, top 2");
		x3_model_close(m);
	}
	double e = synth_compare(test_path("a"), 2, cols, a.vocab, ref_rows, &a, NULL);
	CHECK(e < 1e-5, "forward == the reference (sinks, windows, yarn, router bias, clamped SwiGLU) (rel err %.2g)", e);
	ref_nosinks = 1;
	e = synth_compare(test_path("a"), 1, cols, a.vocab, ref_rows, &a, NULL);
	ref_nosinks = 0;
	CHECK(e > 1e-3, "... and the sinks matter: the reference without them is off (rel err %.2g)", e);
	/* truncation: the reference with the ramp's ends floored and ceiled
	 * differs from the forward of a truncate-false config */
	a.truncate = 1;
	e = synth_compare(test_path("a"), 1, cols, a.vocab, ref_rows, &a, NULL);
	CHECK(e > 1e-5, "... and truncate matters: the reference with whole-dimension ramp ends is off (rel err %.2g)", e);
	CHECK_OK(write_model(&a, test_path("at"), NULL), "write the same with truncate true");
	e = synth_compare(test_path("at"), 1, cols, a.vocab, ref_rows, &a, NULL);
	CHECK(e < 1e-5, "truncate true: forward == the reference with whole-dimension ends (rel err %.2g)", e);
	a.truncate = 0;

	/* the clamp: with limit 2 the activations pass it; with limit 1e6 they
	 * do not, and the output is another; each matches its reference */
	float *l2 = NULL, *lbig = NULL;
	synth_compare(test_path("a"), 1, cols, a.vocab, ref_rows, &a, &l2);
	struct go b = a;
	b.limit = 1e6;
	CHECK_OK(write_model(&b, test_path("b"), NULL), "write the same weights with swiglu_limit 1e6");
	e = synth_compare(test_path("b"), 1, cols, b.vocab, ref_rows, &b, &lbig);
	CHECK(e < 1e-5, "limit 1e6: forward == the reference (rel err %.2g)", e);
	if (l2 && lbig) {
		int same;
		double d = maxdiff(l2, lbig, (size_t)cols * a.vocab, &same);
		CHECK(d > 1e-2, "the clamp at 2 changes the logits (max diff %.3g against limit 1e6)", d);
	} else {
		CHECK(0, "the clamp changes the logits: no logits");
	}
	free(l2), free(lbig);

	/* a sliding window at least the row length: the bits of full layers */
	float *lw = NULL, *lf = NULL;
	struct go w13 = a, full = a;
	w13.window = cols;
	full.swa = 0;
	CHECK_OK(write_model(&w13, test_path("w"), NULL), "write with sliding_window 13 (the row length)");
	CHECK_OK(write_model(&full, test_path("f"), NULL), "write with every layer full_attention");
	synth_compare(test_path("w"), 2, cols, a.vocab, ref_rows, &w13, &lw);
	e = synth_compare(test_path("f"), 2, cols, a.vocab, ref_rows, &full, &lf);
	CHECK(e < 1e-5, "every layer full: forward == the reference (rel err %.2g)", e);
	if (lw && lf) {
		int same;
		maxdiff(lw, lf, (size_t)2 * cols * a.vocab, &same);
		CHECK(same, "window 13 on rows of 13 gives the bits of full attention");
	} else {
		CHECK(0, "window 13 vs full: no logits");
	}
	free(lw), free(lf);

	/* the attention alone: sinks of -inf are no sinks (the same bits), a
	 * window of the row length is no window (the same bits) */
	{
		x3_rng g;
		x3_rng_seed(&g, 7, 0);
		int64_t nr = 2, c = 70, nq = 4, nkv = 2, hd = 12, nt = nr * c;
		float *q = malloc(sizeof(float) * nt * nq * hd), *k = malloc(sizeof(float) * nt * nkv * hd);
		float *v = malloc(sizeof(float) * nt * nkv * hd), *o1 = malloc(sizeof(float) * nt * nq * hd);
		float *o2 = malloc(sizeof(float) * nt * nq * hd), sk[4], ninf[4];
		for (int64_t i = 0; i < nt * nq * hd; i++)
			q[i] = (float)x3_rng_normal(&g);
		for (int64_t i = 0; i < nt * nkv * hd; i++)
			k[i] = (float)x3_rng_normal(&g), v[i] = (float)x3_rng_normal(&g);
		for (int i = 0; i < 4; i++)
			sk[i] = (float)x3_rng_normal(&g), ninf[i] = -INFINITY;
		int same;
		x3_attention(q, k, v, o1, nr, c, nq, nkv, hd, hd, 0.3f, 0, 0);
		x3_attention_sinks(q, k, v, o2, nr, c, nq, nkv, hd, hd, 0.3f, 0, 0, ninf);
		maxdiff(o1, o2, (size_t)(nt * nq * hd), &same);
		CHECK(same, "x3_attention_sinks with sinks of -inf: the bits of x3_attention");
		x3_attention_sinks(q, k, v, o2, nr, c, nq, nkv, hd, hd, 0.3f, 0, 0, sk);
		double d = maxdiff(o1, o2, (size_t)(nt * nq * hd), &same);
		CHECK(d > 1e-3, "... and finite sinks change it (max diff %.3g)", d);
		x3_attention_sinks(q, k, v, o2, nr, c, nq, nkv, hd, hd, 0.3f, c, 0, ninf);
		maxdiff(o1, o2, (size_t)(nt * nq * hd), &same);
		CHECK(same, "a window of the row length (70, past a block of %d queries): the bits of no window",
		      X3_ATT_QB);
		free(q), free(k), free(v), free(o1), free(o2);
	}

	/* the router against a scalar loop: bias, top k of the logits,
	 * softmax over them */
	{
		x3_rng g;
		x3_rng_seed(&g, 9, 0);
		enum { NT = 37, HH = 24, EE = 9, KK = 3 };
		float x[NT * HH], W[EE * HH], bias[EE], w[NT * KK];
		int32_t idx[NT * KK];
		for (int i = 0; i < NT * HH; i++)
			x[i] = (float)x3_rng_normal(&g);
		for (int i = 0; i < EE * HH; i++)
			W[i] = (float)x3_rng_normal(&g);
		for (int i = 0; i < EE; i++)
			bias[i] = 2 * (float)x3_rng_normal(&g);
		struct x3_moe p = { .n_experts = EE, .top_k = KK, .hidden = HH, .router = W, .router_bias = bias,
		                    .topk_softmax = 1 };
		int ok = !x3_moe_route(&p, x, NT, 0, idx, w);
		double werr = 0;
		for (int t = 0; t < NT && ok; t++) {
			double lg[EE], rw[KK];
			int ri[KK];
			for (int e2 = 0; e2 < EE; e2++) {
				lg[e2] = bias[e2];
				for (int i = 0; i < HH; i++)
					lg[e2] += (double)W[e2 * HH + i] * x[t * HH + i];
			}
			route(EE, KK, lg, ri, rw);
			for (int j = 0; j < KK; j++) {
				ok = ok && ri[j] == idx[t * KK + j];
				werr = fmax(werr, fabs(rw[j] - w[t * KK + j]));
			}
		}
		CHECK(ok && werr < 1e-6, "x3_moe_route (bias, top 3 of 9, softmax over the 3) == a scalar loop: the same "
		      "experts in the same order, weights within %.2g", werr);
	}

	/* the activation on hand-worked values (limit 7, alpha 1.702) */
	{
		struct x3_moe p = { .act_limit = 7, .act_alpha = 1.702 };
		float g[4] = { 10, 1, -3, NAN }, u[4] = { -10, 8, 0.5f, 1 };
		x3_moe_act(&p, g, u, 4);
		double want[3] = { (-7 + 1) * 7 / (1 + exp(-1.702 * 7)), (7 + 1) * 1 / (1 + exp(-1.702)),
		                   1.5 * -3 / (1 + exp(1.702 * 3)) };
		CHECK(fabs(g[0] - want[0]) < 1e-5 && fabs(g[1] - want[1]) < 1e-5 && fabs(g[2] - want[2]) < 1e-6 &&
		      isnan(g[3]), "clamped SwiGLU: g 10 -> 7 and u -10 -> -7: %.6g; u 8 -> 7: %.6g; inside: %.6g; "
		      "NaN stays NaN", g[0], g[1], g[2]);
	}

	/* bad configs and the hub's fused layout */
	CHECK(bad(&a, "c1", ", \"experts_per_token\": 3", "'experts_per_token' = 3 and 'num_experts_per_tok' = 2"),
	      "experts_per_token disagreeing with num_experts_per_tok: named");
	CHECK(bad(&a, "c2", ", \"layer_types\": [\"sliding_attention\", \"full_attention\"]",
	          "'layer_types' is not a list of num_hidden_layers = 3"), "layer_types of 2 entries for 3 layers: named");
	CHECK(bad(&a, "c3", ", \"layer_types\": [\"sliding_attention\", \"chunked_attention\", \"full_attention\"]",
	          "'layer_types' entry 1"), "an unknown layer type: named");
	CHECK(bad(&a, "c4", ", \"swiglu_limit\": 0", "'swiglu_limit'"), "swiglu_limit 0: named");
	{
		/* the hub's config names its MXFP4 experts, which the reader
		 * decodes (t1880): it opens */
		x3_model *m = NULL;
		int rc = write_model(&a, test_path("c6"), ", \"quantization_config\": {\"quant_method\": \"mxfp4\", "
		                     "\"modules_to_not_convert\": [\"model.layers.*.self_attn\"]}");
		if (!rc && !(rc = x3_model_open(test_path("c6"), NULL, &m)))
			x3_model_close(m);
		CHECK(!rc, "the hub's MXFP4 quantization_config: read (%s)", rc ? x3_errmsg() : "opens");
	}
	build(&a, 1);
	x3_rng g;
	x3_rng_seed(&g, 3, 0);
	synth_add("model.layers.1.mlp.experts.gate_up_proj", 6 * 40, 40, 1, 0, &g);
	CHECK(bad(&a, "c5", NULL, "tensor 'model.layers.1.mlp.experts.gate_up_proj': not a layout of GPT-OSS's experts"),
	      "a fused gate_up_proj of no layout that is read (2-D, no biases): refused naming it");
	if (test_tmpdir_remove())
		printf("# could not remove %s\n", test_tmp());
	synth_reset();
	TEST_DONE();
}
