/* t1555-deepseek-forward: DeepSeek V3 (DeepseekV3ForCausalLM) written here
 * (seeded, F32) and run by the model library: its logits match a plain
 * double-precision reference written from Hugging Face's
 * modeling_deepseek_v3.py (transformers is not available here, so the
 * reference is the loops of synth_mla_forward, tests/unit/synth.c, with
 * this file's yarn frequencies and scales):
 *   - multi-head latent attention as naive attention over the decompressed
 *     keys and values of every position (kv_b applied per position, every
 *     head its own key: nope part | the shared rope key), the rope part
 *     rotated the Hugging Face way (rope_interleave: de-interleaved, then
 *     rotate-half), yarn inverse frequencies and attention factor, the
 *     softmax scale with the mscale_all_dim correction;
 *   - the routing per token by sorting: sigmoid scores, the choice on
 *     score + e_score_correction_bias, the best topk_group of n_group
 *     groups (each by the sum of its two best), top k, weights from the
 *     plain scores (norm_topk_prob), times routed_scaling_factor; the
 *     shared experts added; the first first_k_dense_replace layers dense.
 * Variants: q_lora_rank set / null, interleaved / rotate-half RoPE, yarn /
 * none, attention_bias, norm_topk_prob false. The dimensions are not
 * multiples of 128 (hidden 40, kv_lora 20, q_lora 28, v 6). Also: the
 * routing moves the output (a model with the correction bias changed
 * differs), and bad configs fail naming the key. */
#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include "test.h"
#include "synth.h"
#include "model.h"
#include "safetensors.h"

struct ds {
	int hidden, inter, layers, heads, vocab;
	int q_lora, kv_lora, nope, rope, vd;
	int E, K, moe_inter, n_shared, n_group, topk_group, first_dense;
	int interleave, yarn, bias, norm_topk;
	double scale;           /* routed_scaling_factor */
};
/* yarn as configured: factor 4, mscale 0.9, mscale_all_dim 0.7, original 64 */
#define YF 4.0
#define YMS 0.9
#define YMSA 0.7
#define YORIG 64.0
#define THETA 100.0

static void build(const struct ds *s, uint64_t seed)
{
	x3_rng g;
	x3_rng_seed(&g, seed, 0);
	synth_reset();
	char n[160];
	int H = s->hidden, qd = s->heads * (s->nope + s->rope);
	synth_add("model.embed_tokens.weight", s->vocab, H, 1.0, 0, &g);
	for (int l = 0; l < s->layers; l++) {
#define L(x) (snprintf(n, sizeof n, "model.layers.%d." x, l), n)
		synth_add(L("input_layernorm.weight"), H, 0, 0.1, 1, &g);
		synth_add(L("post_attention_layernorm.weight"), H, 0, 0.1, 1, &g);
		if (s->q_lora) {
			synth_add(L("self_attn.q_a_proj.weight"), s->q_lora, H, 1 / sqrt(H), 0, &g);
			synth_add(L("self_attn.q_a_layernorm.weight"), s->q_lora, 0, 0.1, 1, &g);
			synth_add(L("self_attn.q_b_proj.weight"), qd, s->q_lora, 1 / sqrt(s->q_lora), 0, &g);
			if (s->bias)
				synth_add(L("self_attn.q_a_proj.bias"), s->q_lora, 0, 0.3, 0, &g);
		} else {
			synth_add(L("self_attn.q_proj.weight"), qd, H, 1 / sqrt(H), 0, &g);
		}
		synth_add(L("self_attn.kv_a_proj_with_mqa.weight"), s->kv_lora + s->rope, H, 1 / sqrt(H), 0, &g);
		synth_add(L("self_attn.kv_a_layernorm.weight"), s->kv_lora, 0, 0.1, 1, &g);
		synth_add(L("self_attn.kv_b_proj.weight"), s->heads * (s->nope + s->vd), s->kv_lora, 1 / sqrt(s->kv_lora), 0, &g);
		synth_add(L("self_attn.o_proj.weight"), H, s->heads * s->vd, 1 / sqrt(s->heads * s->vd), 0, &g);
		if (s->bias) {
			synth_add(L("self_attn.kv_a_proj_with_mqa.bias"), s->kv_lora + s->rope, 0, 0.3, 0, &g);
			synth_add(L("self_attn.o_proj.bias"), H, 0, 0.3, 0, &g);
		}
		if (l < s->first_dense) {
			synth_add(L("mlp.gate_proj.weight"), s->inter, H, 1 / sqrt(H), 0, &g);
			synth_add(L("mlp.up_proj.weight"), s->inter, H, 1 / sqrt(H), 0, &g);
			synth_add(L("mlp.down_proj.weight"), H, s->inter, 1 / sqrt(s->inter), 0, &g);
			continue;
		}
		synth_add(L("mlp.gate.weight"), s->E, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.gate.e_score_correction_bias"), s->E, 0, 0.2, 0, &g);
		for (int e = 0; e < s->E; e++) {
			char m[160];
#define LE(x) (snprintf(m, sizeof m, "model.layers.%d.mlp.experts.%d." x, l, e), m)
			synth_add(LE("gate_proj.weight"), s->moe_inter, H, 1 / sqrt(H), 0, &g);
			synth_add(LE("up_proj.weight"), s->moe_inter, H, 1 / sqrt(H), 0, &g);
			synth_add(LE("down_proj.weight"), H, s->moe_inter, 1 / sqrt(s->moe_inter), 0, &g);
#undef LE
		}
		int si = s->n_shared * s->moe_inter;
		synth_add(L("mlp.shared_experts.gate_proj.weight"), si, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.shared_experts.up_proj.weight"), si, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.shared_experts.down_proj.weight"), H, si, 1 / sqrt(si), 0, &g);
#undef L
	}
	synth_add("model.norm.weight", H, 0, 0.1, 1, &g);
	synth_add("lm_head.weight", s->vocab, H, 1 / sqrt(H), 0, &g);
	synth_round(X3_F32);   /* the reference sees the values the checkpoint stores */
}

static int write_model(const struct ds *s, const char *dir, const char *extra)
{
	char ql[32];
	snprintf(ql, sizeof ql, s->q_lora ? "%d" : "null", s->q_lora);
	return synth_write_model(dir, X3_F32, 0,
	         "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", "
	         "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
	         "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"vocab_size\": %d, "
	         "\"rms_norm_eps\": 1e-6, \"rope_theta\": %g, \"max_position_embeddings\": 256, "
	         "\"q_lora_rank\": %s, \"kv_lora_rank\": %d, \"qk_nope_head_dim\": %d, \"qk_rope_head_dim\": %d, "
	         "\"v_head_dim\": %d, \"n_routed_experts\": %d, \"num_experts_per_tok\": %d, "
	         "\"moe_intermediate_size\": %d, \"n_shared_experts\": %d, \"n_group\": %d, \"topk_group\": %d, "
	         "\"first_k_dense_replace\": %d, \"routed_scaling_factor\": %g, \"norm_topk_prob\": %s, "
	         "\"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", \"rope_interleave\": %s, "
	         "\"attention_bias\": %s, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false%s%s}",
	         s->hidden, s->inter, s->layers, s->heads, s->heads, s->vocab, THETA, ql, s->kv_lora, s->nope,
	         s->rope, s->vd, s->E, s->K, s->moe_inter, s->n_shared, s->n_group, s->topk_group,
	         s->first_dense, s->scale, s->norm_topk ? "true" : "false", s->interleave ? "true" : "false",
	         s->bias ? "true" : "false",
	         s->yarn ? ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, \"mscale\": 0.9, "
	                   "\"mscale_all_dim\": 0.7, \"original_max_position_embeddings\": 64, "
	                   "\"beta_fast\": 32, \"beta_slow\": 1}" : "",
	         extra ? extra : "");
}

/* ---- the reference (double, token by token) -------------------------- */
static double mscale(double s, double m) { return s <= 1 ? 1 : 0.1 * m * log(s) + 1; }

/* Hugging Face's inverse frequencies (default or yarn) of dim d */
static double inv_freq(const struct ds *s, int i)
{
	int d = s->rope;
	double base = pow(THETA, 2.0 * i / d);
	if (!s->yarn)
		return 1 / base;
	double lo = floor(d * log(YORIG / (32 * 2 * M_PI)) / (2 * log(THETA)));
	double hi = ceil(d * log(YORIG / (1 * 2 * M_PI)) / (2 * log(THETA)));
	lo = lo < 0 ? 0 : lo, hi = hi > d - 1 ? d - 1 : hi;
	if (lo == hi)
		hi += 0.001;
	double ramp = (i - lo) / (hi - lo);
	ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
	double extra = 1 - ramp;
	return 1 / (YF * base) * (1 - extra) + 1 / base * extra;
}

/* the reference's description of the model (synth_mla_forward) */
static struct synth_mla mla(const struct ds *s)
{
	struct synth_mla m = {
		.hidden = s->hidden, .inter = s->inter, .layers = s->layers, .heads = s->heads, .vocab = s->vocab,
		.q_lora = s->q_lora, .kv_lora = s->kv_lora, .nope = s->nope, .rope = s->rope, .vd = s->vd,
		.E = s->E, .K = s->K, .moe_inter = s->moe_inter, .shared_inter = s->n_shared * s->moe_inter,
		.n_group = s->n_group, .topk_group = s->topk_group, .norm_topk = s->norm_topk, .routed_scale = s->scale,
		.dense = (1u << s->first_dense) - 1, .eps = 1e-6, .lat_eps = 1e-6, .interleave = s->interleave,
		/* the softmax scale with the mscale_all_dim correction; cos/sin
		 * times yarn's attention factor */
		.softmax_scale = 1 / sqrt(s->nope + s->rope) * (s->yarn ? mscale(YF, YMSA) * mscale(YF, YMSA) : 1),
		.rope_factor = s->yarn ? mscale(YF, YMS) / mscale(YF, YMSA) : 1,
	};
	for (int i = 0; i < s->rope / 2; i++)
		m.inv_freq[i] = inv_freq(s, i);
	return m;
}

/* max |model - reference| / max |reference| (synth_compare) */
static double compare(const struct ds *s, const char *dir, int rows, int cols, float **lgo)
{
	struct synth_mla m = mla(s);
	return synth_compare(dir, rows, cols, s->vocab, synth_mla_forward, &m, lgo);
}

static int bad(const struct ds *s, const char *name, const char *extra, const char *want)
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

int main(void)
{
	if (test_tmpdir("t1555")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	/* hidden inter layers heads vocab | q_lora kv_lora nope rope v | E K moe_inter
	 * n_shared n_group topk_group first_dense | interleave yarn bias norm_topk | scale */
	struct ds a = { 40, 56, 3, 3, 50, 28, 20, 8, 8, 6, 8, 3, 12, 2, 4, 2, 1, 1, 1, 0, 1, 2.5 };
	build(&a, 1);
	CHECK_OK(write_model(&a, test_path("a"), NULL), "write DeepSeek V3: q_lora 28, kv_lora 20, yarn, 8 experts "
	         "in 4 groups, top 3 of the best 2 groups, 2 shared, layer 0 dense");
	x3_model *m;
	CHECK_OK(x3_model_open(test_path("a"), NULL, &m), "open it");
	if (m) {
		const x3_model_config *c = x3_model_cfg(m);
		double ms = 0.1 * YMSA * log(YF) + 1;
		CHECK(c->mla && c->head_dim == 16 && c->shared_inter == 24 && c->first_dense == 1 &&
		      fabs(c->attn_scale - ms * ms / 4) < 1e-12 && c->rope_type == 3,
		      "config: MLA, head 8 + 8, shared 2 x 12, softmax scale 16^-0.5 mscale(4, 0.7)^2");
		x3_model_close(m);
	}
	float *lga = NULL;
	double e = compare(&a, test_path("a"), 2, 13, &lga);
	CHECK(e < 1e-5, "forward == the reference (naive attention over decompressed k/v, per-token "
	      "routing) (rel err %.2g)", e);

	/* the correction bias chooses the experts: another one gives other logits */
	struct ds a2 = a;
	for (int i = 0; i < synth_n; i++)
		if (strstr(synth_t[i].name, "e_score_correction_bias"))
			for (int j = 0; j < synth_t[i].r; j++)
				synth_t[i].v[j] = -synth_t[i].v[j] * 8;
	CHECK_OK(write_model(&a2, test_path("a2"), NULL), "write it with other correction biases");
	float *lgb = NULL;
	e = compare(&a2, test_path("a2"), 2, 13, &lgb);
	CHECK(e < 1e-5, "... == the reference (rel err %.2g)", e);
	double diff = 0;
	for (int i = 0; lga && lgb && i < 2 * 13 * a.vocab; i++)
		diff = fmax(diff, fabs((double)lga[i] - lgb[i]));
	CHECK(diff > 1e-2, "... and the routing moved the logits (max change %.3g)", diff);
	free(lga), free(lgb);

	struct ds b = { 40, 56, 2, 2, 50, 0, 20, 6, 4, 10, 6, 2, 10, 1, 3, 1, 0, 0, 0, 1, 0, 1.0 };
	build(&b, 2);
	CHECK_OK(write_model(&b, test_path("b"), NULL), "write: q_lora null (q_proj), rotate-half rope, no yarn, "
	         "attention_bias, norm_topk_prob false, no dense layer, 3 groups of 2, top 2 of 1 group");
	e = compare(&b, test_path("b"), 1, 9, NULL);
	CHECK(e < 1e-5, "forward == the reference (rel err %.2g)", e);

	/* bad configs */
	build(&a, 1);
	CHECK(bad(&a, "c1", ", \"n_group\": 3", "n_group = 3"), "8 experts in 3 groups: named");
	CHECK(bad(&a, "c2", ", \"scoring_func\": \"softmax\"", "scoring_func 'softmax'"), "softmax scoring: named");
	CHECK(bad(&a, "c3", ", \"topk_group\": 5", "'topk_group' = 5"), "topk_group > n_group: named");
	CHECK(bad(&a, "c4", ", \"moe_layer_freq\": 2", "moe_layer_freq"), "moe_layer_freq 2: named");
	if (test_tmpdir_remove())
		printf("# could not remove %s\n", test_tmp());
	synth_reset();
	TEST_DONE();
}
