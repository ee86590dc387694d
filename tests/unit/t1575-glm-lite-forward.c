/* t1575-glm-lite-forward: GLM-4.7-Flash (Glm4MoeLiteForCausalLM) written
 * here (seeded, F32) and run by the model library: its logits match a
 * double-precision reference written from Hugging Face's
 * modeling_glm4_moe_lite.py (transformers is not available here; DeepSeek's
 * model, synth_mla_forward of tests/unit/synth.c, shared with t1555):
 *   - DeepSeek's multi-head latent attention as naive attention over the
 *     decompressed keys and values of every position, the rope part
 *     rotated on interleaved pairs (rope_interleave, the default) or by
 *     rotate-half; q_a_layernorm and kv_a_layernorm at epsilon 1e-6 (the
 *     norm's default: the model builds them without rms_norm_eps), every
 *     other norm at rms_norm_eps 1e-5; the latents are made small (q_a and
 *     kv_a weights scaled down) so that the two epsilons differ visibly;
 *   - RoPE's base from Transformers v5's rope_parameters (no top-level
 *     rope_theta: 100, not the default 10000);
 *   - the routing per token by sorting: sigmoid scores, the choice on
 *     score + e_score_correction_bias, top k, weights from the plain
 *     scores renormalized, times routed_scaling_factor 1.8; the shared
 *     expert added;
 *   - the dense layers from mlp_layer_types (a dense layer between sparse
 *     ones, first_k_dense_replace contradicting it and not read), or,
 *     without it, layer 0 dense.
 * The dimensions are not multiples of 128. Also: bad configs (a missing
 * kv_lora_rank, mlp_layer_types of the wrong length or an unknown entry, a
 * scaled rope_parameters type) fail naming the key. */
#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include "test.h"
#include "synth.h"
#include "model.h"
#include "arch.h"
#include "safetensors.h"

struct gl {
	int hidden, inter, layers, heads, vocab;
	int q_lora, kv_lora, nope, rope, vd;
	int E, K, moe_inter;
	unsigned dense;         /* bit l: layer l is dense */
	int interleave, types;  /* rope_interleave; write mlp_layer_types */
};
#define THETA 100.0
#define SCALE 1.8
#define EPS 1e-5
#define LAT_EPS 1e-6
#define LAT_W 0.03      /* q_a / kv_a weights N(0, (LAT_W)^2 / hidden) */

static int dense(const struct gl *s, int l) { return s->dense >> l & 1; }

static void build(const struct gl *s, uint64_t seed)
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
			synth_add(L("self_attn.q_a_proj.weight"), s->q_lora, H, LAT_W / sqrt(H), 0, &g);
			synth_add(L("self_attn.q_a_layernorm.weight"), s->q_lora, 0, 0.1, 1, &g);
			synth_add(L("self_attn.q_b_proj.weight"), qd, s->q_lora, 1 / sqrt(s->q_lora), 0, &g);
		} else {
			synth_add(L("self_attn.q_proj.weight"), qd, H, 1 / sqrt(H), 0, &g);
		}
		synth_add(L("self_attn.kv_a_proj_with_mqa.weight"), s->kv_lora + s->rope, H, LAT_W / sqrt(H), 0, &g);
		synth_add(L("self_attn.kv_a_layernorm.weight"), s->kv_lora, 0, 0.1, 1, &g);
		synth_add(L("self_attn.kv_b_proj.weight"), s->heads * (s->nope + s->vd), s->kv_lora, 1 / sqrt(s->kv_lora), 0, &g);
		synth_add(L("self_attn.o_proj.weight"), H, s->heads * s->vd, 1 / sqrt(s->heads * s->vd), 0, &g);
		if (dense(s, l)) {
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
		synth_add(L("mlp.shared_experts.gate_proj.weight"), s->moe_inter, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.shared_experts.up_proj.weight"), s->moe_inter, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.shared_experts.down_proj.weight"), H, s->moe_inter, 1 / sqrt(s->moe_inter), 0, &g);
#undef L
	}
	synth_add("model.norm.weight", H, 0, 0.1, 1, &g);
	synth_add("lm_head.weight", s->vocab, H, 1 / sqrt(H), 0, &g);
	synth_round(X3_F32);
}

/* config.json as Transformers v5 writes GLM-4.7-Flash's: rope_parameters,
 * mlp_layer_types (when types), first_k_dense_replace 2 beside it (a key
 * the model does not read); EXTRA appended (a later key replaces) */
static int write_model(const struct gl *s, const char *dir, const char *extra)
{
	char ql[32], lt[512] = "";
	snprintf(ql, sizeof ql, s->q_lora ? "%d" : "null", s->q_lora);
	if (s->types) {
		size_t k = (size_t)snprintf(lt, sizeof lt, ", \"mlp_layer_types\": [");
		for (int l = 0; l < s->layers; l++)
			k += (size_t)snprintf(lt + k, sizeof lt - k, "%s\"%s\"", l ? ", " : "", dense(s, l) ? "dense" : "sparse");
		snprintf(lt + k, sizeof lt - k, "]");
	}
	return synth_write_model(dir, X3_F32, 0,
	         "{\"architectures\": [\"Glm4MoeLiteForCausalLM\"], \"model_type\": \"glm4_moe_lite\", "
	         "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
	         "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"vocab_size\": %d, "
	         "\"rms_norm_eps\": %g, \"max_position_embeddings\": 256, "
	         "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %g}, "
	         "\"q_lora_rank\": %s, \"kv_lora_rank\": %d, \"qk_nope_head_dim\": %d, \"qk_rope_head_dim\": %d, "
	         "\"v_head_dim\": %d, \"n_routed_experts\": %d, \"num_experts_per_tok\": %d, "
	         "\"moe_intermediate_size\": %d, \"n_shared_experts\": 1, \"n_group\": 1, \"topk_group\": 1, "
	         "\"first_k_dense_replace\": 2, \"routed_scaling_factor\": %g, \"norm_topk_prob\": true, "
	         "\"rope_interleave\": %s, \"attention_bias\": false, \"hidden_act\": \"silu\", "
	         "\"tie_word_embeddings\": false%s%s}",
	         s->hidden, s->inter, s->layers, s->heads, s->heads, s->vocab, EPS, THETA, ql, s->kv_lora, s->nope,
	         s->rope, s->vd, s->E, s->K, s->moe_inter, SCALE, s->interleave ? "true" : "false", lt,
	         extra ? extra : "");
}

/* ---- the reference (synth_mla_forward) ------------------------------- */
/* the model as the reference reads it: RoPE on interleaved pairs (the
 * output evens then odds: q and k alike, so their dot products are those
 * of the pairs) or rotate-half, the default frequencies of rope_theta; one
 * group (no group choice), weights the plain scores renormalized */
static struct synth_mla mla(const struct gl *s)
{
	struct synth_mla m = {
		.hidden = s->hidden, .inter = s->inter, .layers = s->layers, .heads = s->heads, .vocab = s->vocab,
		.q_lora = s->q_lora, .kv_lora = s->kv_lora, .nope = s->nope, .rope = s->rope, .vd = s->vd,
		.E = s->E, .K = s->K, .moe_inter = s->moe_inter, .shared_inter = s->moe_inter,
		.n_group = 1, .topk_group = 1, .norm_topk = 1, .routed_scale = SCALE, .dense = s->dense,
		.eps = EPS, .lat_eps = LAT_EPS, .softmax_scale = 1 / sqrt(s->nope + s->rope),
		.interleave = s->interleave, .rope_factor = 1,
	};
	for (int i = 0; i < s->rope / 2; i++)
		m.inv_freq[i] = 1 / pow(THETA, 2.0 * i / s->rope);
	return m;
}

static int bad(const struct gl *s, const char *name, const char *extra, const char *want)
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
	if (test_tmpdir("t1575")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	/* hidden inter layers heads vocab | q_lora kv_lora nope rope v | E K moe_inter |
	 * dense | interleave types */
	struct gl a = { 40, 56, 3, 3, 50, 28, 20, 10, 8, 6, 6, 3, 12, 2, 1, 1 };
	build(&a, 1);
	CHECK_OK(write_model(&a, test_path("a"), NULL), "write GLM-4.7-Flash: q_lora 28, kv_lora 20, interleaved "
	         "rope, 6 experts top 3, layer 1 dense by mlp_layer_types (first_k_dense_replace 2)");
	x3_model *m;
	CHECK_OK(x3_model_open(test_path("a"), NULL, &m), "open it");
	if (m) {
		const x3_model_config *c = x3_model_cfg(m);
		CHECK(c->arch == X3_ARCH_GLM4_MOE_LITE && c->mla && c->head_dim == 18 && c->shared_inter == 12 &&
		      c->rope_interleave && c->rope_theta == THETA && fabs(c->routed_scale - SCALE) < 1e-12 &&
		      c->n_group == 1 && c->topk_group == 1 && fabs(c->rms_eps - EPS) < 1e-15,
		      "config: MLA, head 10 + 8, one shared expert of 12, rope_theta 100 from rope_parameters, "
		      "routed_scaling_factor 1.8, one group, rms_norm_eps 1e-5");
		CHECK(!x3_arch_sparse_layer(c, 1) && x3_arch_sparse_layer(c, 0) && x3_arch_sparse_layer(c, 2),
		      "layers 0 and 2 sparse, 1 dense (mlp_layer_types; first_k_dense_replace not read)");
		x3_model_close(m);
	}
	struct synth_mla ma = mla(&a);
	double e = synth_compare(test_path("a"), 2, 13, a.vocab, synth_mla_forward, &ma, NULL);
	CHECK(e < 1e-5, "forward == the reference (latent norms at 1e-6, the others at 1e-5) (rel err %.2g)", e);

	struct gl b = { 48, 40, 2, 2, 50, 0, 24, 6, 4, 10, 4, 2, 10, 1, 0, 0 };
	build(&b, 2);
	CHECK_OK(write_model(&b, test_path("b"), NULL), "write: q_lora null (q_proj), rotate-half rope, "
	         "no mlp_layer_types (layer 0 dense), 4 experts top 2");
	struct synth_mla mb = mla(&b);
	e = synth_compare(test_path("b"), 1, 9, b.vocab, synth_mla_forward, &mb, NULL);
	CHECK(e < 1e-5, "forward == the reference (rel err %.2g)", e);

	/* bad configs */
	build(&a, 1);
	CHECK(bad(&a, "c1", ", \"mlp_layer_types\": [\"dense\", \"sparse\"]", "'mlp_layer_types' is not a list of "
	          "num_hidden_layers = 3"), "mlp_layer_types of 2 entries for 3 layers: named");
	CHECK(bad(&a, "c2", ", \"mlp_layer_types\": [\"sparse\", \"moe\", \"sparse\"]", "'mlp_layer_types' entry 1"),
	      "an mlp_layer_types entry other than dense / sparse: named");
	CHECK(bad(&a, "c3", ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 100, \"factor\": 4}",
	          "rope_parameters rope_type 'yarn'"), "a yarn rope_parameters (not run as the default): named");
	CHECK(bad(&a, "c4", ", \"kv_lora_rank\": null", "kv_lora_rank"), "kv_lora_rank missing: named");
	if (test_tmpdir_remove())
		printf("# could not remove %s\n", test_tmp());
	synth_reset();
	TEST_DONE();
}
