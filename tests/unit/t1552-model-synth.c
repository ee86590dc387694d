/* t1552: synthetic models written here (seeded): the forward of Llama (GQA,
 * llama3 RoPE, biases), Qwen2 (q/k/v biases) and Qwen3 (q/k norm) matches a
 * plain double-precision reference written in this file (its attention
 * synth.c's synth_attn); sharded and F16 / BF16 checkpoints load; bad
 * checkpoints fail naming the tensor or file. */
#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include "test.h"
#include "synth.h"
#include "model.h"
#include "safetensors.h"

struct synth {
	const char *arch;
	int hidden, inter, layers, heads, kv, hd, vocab;
	int qkv_bias, o_bias, qk_norm, tied, llama3;
	x3_dtype dt;
	uint64_t shard;
};

static void build(const struct synth *s, uint64_t seed)
{
	x3_rng g;
	x3_rng_seed(&g, seed, 0);
	synth_reset();
	char n[128];
	int qd = s->heads * s->hd, kvd = s->kv * s->hd, H = s->hidden;
	synth_add("model.embed_tokens.weight", s->vocab, H, 1.0, 0, &g);
	for (int l = 0; l < s->layers; l++) {
#define L(x) (snprintf(n, sizeof n, "model.layers.%d." x, l), n)
		synth_add(L("input_layernorm.weight"), H, 0, 0.1, 1, &g);
		synth_add(L("post_attention_layernorm.weight"), H, 0, 0.1, 1, &g);
		synth_add(L("self_attn.q_proj.weight"), qd, H, 1 / sqrt(H), 0, &g);
		synth_add(L("self_attn.k_proj.weight"), kvd, H, 1 / sqrt(H), 0, &g);
		synth_add(L("self_attn.v_proj.weight"), kvd, H, 1 / sqrt(H), 0, &g);
		synth_add(L("self_attn.o_proj.weight"), H, qd, 1 / sqrt(qd), 0, &g);
		synth_add(L("mlp.gate_proj.weight"), s->inter, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.up_proj.weight"), s->inter, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.down_proj.weight"), H, s->inter, 1 / sqrt(s->inter), 0, &g);
		if (s->qkv_bias) {
			synth_add(L("self_attn.q_proj.bias"), qd, 0, 0.5, 0, &g);
			synth_add(L("self_attn.k_proj.bias"), kvd, 0, 0.5, 0, &g);
			synth_add(L("self_attn.v_proj.bias"), kvd, 0, 0.5, 0, &g);
		}
		if (s->o_bias)
			synth_add(L("self_attn.o_proj.bias"), H, 0, 0.5, 0, &g);
		if (s->qk_norm) {
			synth_add(L("self_attn.q_norm.weight"), s->hd, 0, 0.3, 1, &g);
			synth_add(L("self_attn.k_norm.weight"), s->hd, 0, 0.3, 1, &g);
		}
#undef L
	}
	synth_add("model.norm.weight", H, 0, 0.1, 1, &g);
	if (!s->tied)
		synth_add("lm_head.weight", s->vocab, H, 1 / sqrt(H), 0, &g);
	synth_round(s->dt);   /* the reference sees the values the checkpoint stores */
}

static int write_model(const struct synth *s, const char *dir, const char *extra_json)
{
	return synth_write_model(dir, s->dt, s->shard,
	         "{\"architectures\": [\"%s\"], \"hidden_size\": %d, \"intermediate_size\": %d, "
	         "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
	         "\"head_dim\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-5, \"rope_theta\": 100.0, "
	         "\"tie_word_embeddings\": %s, \"attention_bias\": %s%s%s}",
	         s->arch, s->hidden, s->inter, s->layers, s->heads, s->kv, s->hd, s->vocab,
	         s->tied ? "true" : "false", s->o_bias ? "true" : "false",
	         s->llama3 ? ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 4.0, "
	                     "\"low_freq_factor\": 1.0, \"high_freq_factor\": 2.0, "
	                     "\"original_max_position_embeddings\": 8}" : "",
	         extra_json ? extra_json : "");
}

/* ---- plain reference forward (double) -------------------------------- */
static void rope(double *v, int hd, int pos, const struct synth *s)
{
	for (int i = 0; i < hd / 2; i++) {
		double inv = pow(100.0, -2.0 * i / hd);
		if (s->llama3) {  /* HF _compute_llama3_parameters, factor 4, 1..2, 8 */
			double wl = 2 * M_PI / inv, lo_wl = 8 / 1.0, hi_wl = 8 / 2.0;
			double il = wl > lo_wl ? inv / 4 : inv;
			double sm = (8 / wl - 1.0) / (2.0 - 1.0);
			double smoothed = (1 - sm) * il / 4 + sm * il;
			inv = (!(wl < hi_wl) && !(wl > lo_wl)) ? smoothed : il;
		}
		double c = cos(pos * inv), sn = sin(pos * inv), a = v[i], b = v[i + hd / 2];
		v[i] = a * c - b * sn;
		v[i + hd / 2] = b * c + a * sn;
	}
}

static void ref_forward(const struct synth *s, const int32_t *tok, int n, double *logits)
{
	int H = s->hidden, qd = s->heads * s->hd, kvd = s->kv * s->hd;
	double *x = calloc((size_t)n * H, sizeof *x), *xn = malloc(sizeof(double) * H);
	double *q = malloc(sizeof(double) * n * qd), *k = malloc(sizeof(double) * n * kvd);
	double *v = malloc(sizeof(double) * n * kvd), *a = malloc(sizeof(double) * qd);
	double *o = malloc(sizeof(double) * H), *g = malloc(sizeof(double) * s->inter);
	double *u = malloc(sizeof(double) * s->inter), *sc = malloc(sizeof(double) * n);
	const double *E = synth_get("model.embed_tokens.weight");
	for (int t = 0; t < n; t++)
		memcpy(x + t * H, E + (size_t)tok[t] * H, sizeof(double) * H);
	for (int l = 0; l < s->layers; l++) {
		for (int t = 0; t < n; t++) {
			synth_rms(xn, x + t * H, synth_get("model.layers.%d.input_layernorm.weight", l), H, 1e-5);
			synth_mv(q + t * qd, synth_get("model.layers.%d.self_attn.q_proj.weight", l),
			   synth_get("model.layers.%d.self_attn.q_proj.bias", l), xn, qd, H);
			synth_mv(k + t * kvd, synth_get("model.layers.%d.self_attn.k_proj.weight", l),
			   synth_get("model.layers.%d.self_attn.k_proj.bias", l), xn, kvd, H);
			synth_mv(v + t * kvd, synth_get("model.layers.%d.self_attn.v_proj.weight", l),
			   synth_get("model.layers.%d.self_attn.v_proj.bias", l), xn, kvd, H);
			for (int h = 0; h < s->heads; h++) {
				if (s->qk_norm)
					synth_rms(q + t * qd + h * s->hd, q + t * qd + h * s->hd,
					          synth_get("model.layers.%d.self_attn.q_norm.weight", l), s->hd, 1e-5);
				rope(q + t * qd + h * s->hd, s->hd, t, s);
			}
			for (int h = 0; h < s->kv; h++) {
				if (s->qk_norm)
					synth_rms(k + t * kvd + h * s->hd, k + t * kvd + h * s->hd,
					          synth_get("model.layers.%d.self_attn.k_norm.weight", l), s->hd, 1e-5);
				rope(k + t * kvd + h * s->hd, s->hd, t, s);
			}
		}
		for (int t = 0; t < n; t++) {
			synth_attn(a, q + t * qd, k, v, t + 1, s->heads, s->kv, s->hd, sc);
			synth_mv(o, synth_get("model.layers.%d.self_attn.o_proj.weight", l),
			   synth_get("model.layers.%d.self_attn.o_proj.bias", l), a, H, qd);
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
		for (int t = 0; t < n; t++) {
			synth_rms(xn, x + t * H, synth_get("model.layers.%d.post_attention_layernorm.weight", l), H, 1e-5);
			synth_mv(g, synth_get("model.layers.%d.mlp.gate_proj.weight", l), NULL, xn, s->inter, H);
			synth_mv(u, synth_get("model.layers.%d.mlp.up_proj.weight", l), NULL, xn, s->inter, H);
			for (int i = 0; i < s->inter; i++)
				g[i] = g[i] / (1 + exp(-g[i])) * u[i];
			synth_mv(o, synth_get("model.layers.%d.mlp.down_proj.weight", l), NULL, g, H, s->inter);
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
	}
	const double *W = s->tied ? E : synth_get("lm_head.weight");
	for (int t = 0; t < n; t++) {
		synth_rms(xn, x + t * H, synth_get("model.norm.weight"), H, 1e-5);
		synth_mv(logits + (size_t)t * s->vocab, W, NULL, xn, s->vocab, H);
	}
	free(x), free(xn), free(q), free(k), free(v), free(a), free(o), free(g), free(u), free(sc);
}

static void ref_rows(const void *ctx, const int32_t *tok, int n, double *logits)
{
	ref_forward(ctx, tok, n, logits);
}

static double compare(const struct synth *s, const char *dir, int rows, int cols)
{
	return synth_compare(dir, rows, cols, s->vocab, ref_rows, s, NULL);
}

int main(void)
{
	if (test_tmpdir("t1552")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	struct synth llama = { "LlamaForCausalLM", 32, 48, 2, 4, 2, 8, 40, 0, 0, 0, 0, 1, X3_F32, 0 };
	build(&llama, 1);
	CHECK_OK(write_model(&llama, test_path("llama"), NULL), "write llama (GQA, llama3 rope)");
	double e = compare(&llama, test_path("llama"), 2, 12);
	CHECK(e < 1e-5, "llama: forward == reference (rel err %.2g)", e);

	struct synth lb = llama;
	lb.qkv_bias = lb.o_bias = 1, lb.tied = 1, lb.llama3 = 0, lb.dt = X3_BF16, lb.shard = 4000;
	build(&lb, 2);
	CHECK_OK(write_model(&lb, test_path("llama-bias"), NULL), "write llama, biases, tied, bf16, sharded");
	e = compare(&lb, test_path("llama-bias"), 1, 9);
	CHECK(e < 1e-5, "llama attention_bias/tied/bf16/sharded: == reference (rel err %.2g)", e);

	struct synth q2 = { "Qwen2ForCausalLM", 32, 40, 2, 4, 1, 8, 30, 1, 0, 0, 0, 0, X3_F16, 0 };
	build(&q2, 3);
	CHECK_OK(write_model(&q2, test_path("qwen2"), NULL), "write qwen2 (f16)");
	e = compare(&q2, test_path("qwen2"), 2, 7);
	CHECK(e < 1e-5, "qwen2 q/k/v bias: == reference (rel err %.2g)", e);

	struct synth q3 = { "Qwen3ForCausalLM", 32, 40, 2, 4, 2, 16, 30, 0, 0, 1, 1, 0, X3_F32, 0 };
	build(&q3, 4);
	CHECK_OK(write_model(&q3, test_path("qwen3"), NULL), "write qwen3 (head_dim 16 != 32/4)");
	e = compare(&q3, test_path("qwen3"), 2, 7);
	CHECK(e < 1e-5, "qwen3 q/k norm, head_dim: == reference (rel err %.2g)", e);

	/* bad checkpoints */
	x3_model *m = NULL;
	int rc;
	struct synth bad = llama;
	build(&bad, 5);
	synth_t[3].r = 24;   /* model.layers.0.self_attn.q_proj.weight: 24 rows, not 32 */
	synth_t[3].v = realloc(synth_t[3].v, sizeof(double) * 24 * 32);
	CHECK_OK(write_model(&bad, test_path("badshape"), NULL), "write model with a bad q_proj");
	rc = x3_model_open(test_path("badshape"), NULL, &m);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "model.layers.0.self_attn.q_proj.weight") &&
	      strstr(x3_errmsg(), "24x32"), "shape disagreeing with config: %s", x3_errmsg());

	build(&bad, 5);
	snprintf(synth_t[synth_n - 1].name, sizeof synth_t[synth_n - 1].name, "lm_head.wieght");
	CHECK_OK(write_model(&bad, test_path("nohead"), NULL), "write model without lm_head");
	rc = x3_model_open(test_path("nohead"), NULL, &m);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "'lm_head.weight' is missing"),
	      "missing tensor: %s", x3_errmsg());

	build(&bad, 5);
	CHECK_OK(write_model(&bad, test_path("swa"), ", \"architectures\": [\"MistralForCausalLM\"], "
	                     "\"sliding_window\": 4"), "write mistral with a 4-token window");
	rc = x3_model_open(test_path("swa"), NULL, &m);
	CHECK_OK(rc, "open mistral");
	if (!rc) {
		int32_t tk[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
		struct x3_forward_opts o;
		x3_forward_opts_init(&o, m);
		rc = x3_model_forward(m, tk, 1, 8, &o);
		CHECK(rc == X3_EUNSUP && strstr(x3_errmsg(), "sliding window"),
		      "sliding window in effect -> EUNSUP: %s", x3_errmsg());
		CHECK_OK(x3_model_forward(m, tk, 2, 4, &o), "rows within the window run");
		x3_model_close(m);
	}

	struct synth sh = llama;
	sh.shard = 3000;
	build(&sh, 6);
	CHECK_OK(write_model(&sh, test_path("sharded"), NULL), "write sharded model");
	char shard[600];
	snprintf(shard, sizeof shard, "%s/model-00002-of-%05d.safetensors", test_path("sharded"), 0);
	/* find the real name of shard 2 */
	for (int nsh = 2; nsh < 100; nsh++) {
		snprintf(shard, sizeof shard, "%s/model-00002-of-%05d.safetensors", test_path("sharded"), nsh);
		if (access(shard, F_OK) == 0)
			break;
	}
	int ul = unlink(shard);
	CHECK(ul == 0, "remove shard 2 (%s)", shard);
	rc = x3_model_open(test_path("sharded"), NULL, &m);
	CHECK(rc != X3_OK && strstr(x3_errmsg(), "model-00002-of-"), "missing shard: %s",
	      x3_errmsg());

	if (test_tmpdir_remove())
		printf("# could not remove %s\n", test_tmp());
	synth_reset();
	TEST_DONE();
}
