/* t1577-dsa-forward: DeepSeek sparse attention (GLM-5's
 * GlmMoeDsaForCausalLM, DeepSeek V3.2's DeepseekV32ForCausalLM) written
 * here (seeded, F32) and run by the model library against a double
 * reference written in this file from Hugging Face's modeling_glm_moe_dsa.py
 * / modeling_deepseek_v32.py and DeepSeek's reference Indexer:
 *   - the indexer: queries wq_b(q_a_layernorm(q_a(x))), one key per token
 *     LayerNorm(wk x) (weight and bias, eps 1e-6), the first qk_rope
 *     dimensions of both rotated on interleaved pairs (GLM-5) or as halves
 *     (DeepSeek V3.2, whose attention is interleaved), per-head weights
 *     weights_proj(x) * heads^-0.5,
 *     score(i, j) = sum_h w_h relu(q_h . k_j) index_head_dim^-0.5; query i
 *     keeps its index_topk keys of highest score (all of them before
 *     index_topk), the earlier of equal scores;
 *   - the latent attention (interleaved rope in both, whatever
 *     rope_interleave says: GLM-5's config below says false) attends to the
 *     picked keys only;
 *   - GLM-5's "shared" layers (indexer_types) have no indexer and attend to
 *     the keys of the last layer with one.
 * Also: the selection against a scalar loop of another algorithm (repeated
 * arg-max) with ties; the sparse attention over every key against the
 * dense attention; index_topk at the row length gives the bytes of plain
 * DeepSeek V3 attention (the same tensors as DeepseekV3ForCausalLM), one
 * less does not; the logits do not depend on the chunking; bad configs
 * and a full layer's missing indexer tensor are named. Dimensions are not
 * multiples of 128, index_topk below the row length. */
#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include "test.h"
#include "synth.h"
#include "model.h"
#include "arch.h"
#include "attention.h"
#include "indexer.h"
#include "safetensors.h"

struct ds {
	int hidden, inter, layers, heads, vocab;
	int q_lora, kv_lora, nope, rope, vd;
	int ih, ihd, topk;
	unsigned shared;        /* bit l: layer l has no indexer (GLM-5 "shared") */
	int glm;                /* GlmMoeDsaForCausalLM (interleaved indexer rope),
	                           else DeepseekV32ForCausalLM (halves) */
	int interleave;         /* the config's rope_interleave (not read) */
};
#define THETA 100.0
#define EPS 1e-5
#define LAT_EPS 1e-6
#define LAT_W 0.03

static int shared(const struct ds *s, int l) { return s->shared >> l & 1; }

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
		synth_add(L("self_attn.q_a_proj.weight"), s->q_lora, H, LAT_W / sqrt(H), 0, &g);
		synth_add(L("self_attn.q_a_layernorm.weight"), s->q_lora, 0, 0.1, 1, &g);
		synth_add(L("self_attn.q_b_proj.weight"), qd, s->q_lora, 3 / sqrt(s->q_lora), 0, &g);
		if (!shared(s, l)) {
			synth_add(L("self_attn.indexer.wq_b.weight"), s->ih * s->ihd, s->q_lora, 1 / sqrt(s->q_lora), 0, &g);
			synth_add(L("self_attn.indexer.wk.weight"), s->ihd, H, 1 / sqrt(H), 0, &g);
			synth_add(L("self_attn.indexer.k_norm.weight"), s->ihd, 0, 0.2, 1, &g);
			synth_add(L("self_attn.indexer.k_norm.bias"), s->ihd, 0, 0.3, 0, &g);
			synth_add(L("self_attn.indexer.weights_proj.weight"), s->ih, H, 1 / sqrt(H), 0, &g);
		}
		synth_add(L("self_attn.kv_a_proj_with_mqa.weight"), s->kv_lora + s->rope, H, LAT_W / sqrt(H), 0, &g);
		synth_add(L("self_attn.kv_a_layernorm.weight"), s->kv_lora, 0, 0.1, 1, &g);
		synth_add(L("self_attn.kv_b_proj.weight"), s->heads * (s->nope + s->vd), s->kv_lora, 3 / sqrt(s->kv_lora), 0, &g);
		synth_add(L("self_attn.o_proj.weight"), H, s->heads * s->vd, 1 / sqrt(s->heads * s->vd), 0, &g);
		synth_add(L("mlp.gate_proj.weight"), s->inter, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.up_proj.weight"), s->inter, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.down_proj.weight"), H, s->inter, 1 / sqrt(s->inter), 0, &g);
#undef L
	}
	synth_add("model.norm.weight", H, 0, 0.1, 1, &g);
	synth_add("lm_head.weight", s->vocab, H, 1 / sqrt(H), 0, &g);
	synth_round(X3_F32);
}

/* config.json: every layer dense (mlp_layer_types / first_k_dense_replace),
 * indexer_types for GLM-5; arch "v3" writes the same model as DeepSeek V3
 * (no indexer); EXTRA appended (a later key replaces) */
static int write_model(const struct ds *s, const char *dir, const char *arch, const char *extra)
{
	char lt[512] = "", it[512] = "";
	size_t k = (size_t)snprintf(lt, sizeof lt, ", \"mlp_layer_types\": [");
	size_t j = (size_t)snprintf(it, sizeof it, ", \"indexer_types\": [");
	for (int l = 0; l < s->layers; l++) {
		k += (size_t)snprintf(lt + k, sizeof lt - k, "%s\"dense\"", l ? ", " : "");
		j += (size_t)snprintf(it + j, sizeof it - j, "%s\"%s\"", l ? ", " : "", shared(s, l) ? "shared" : "full");
	}
	snprintf(lt + k, sizeof lt - k, "]");
	snprintf(it + j, sizeof it - j, "]");
	int v3 = !strcmp(arch, "v3");
	const char *an = v3 ? "DeepseekV3ForCausalLM" : s->glm ? "GlmMoeDsaForCausalLM" : "DeepseekV32ForCausalLM";
	const char *mt = v3 ? "deepseek_v3" : s->glm ? "glm_moe_dsa" : "deepseek_v32";
	return synth_write_model(dir, X3_F32, 0,
	         "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", "
	         "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
	         "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"vocab_size\": %d, "
	         "\"rms_norm_eps\": %g, \"max_position_embeddings\": 256, "
	         "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %g}, \"rope_theta\": %g, "
	         "\"q_lora_rank\": %d, \"kv_lora_rank\": %d, \"qk_nope_head_dim\": %d, \"qk_rope_head_dim\": %d, "
	         "\"v_head_dim\": %d, \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, "
	         "\"moe_intermediate_size\": 8, \"n_shared_experts\": 1, \"n_group\": 1, \"topk_group\": 1, "
	         "\"first_k_dense_replace\": %d, \"routed_scaling_factor\": 2.5, \"norm_topk_prob\": true, "
	         "\"rope_interleave\": %s, \"attention_bias\": false, \"hidden_act\": \"silu\", "
	         "\"index_topk\": %d, \"index_n_heads\": %d, \"index_head_dim\": %d, "
	         "%s\"tie_word_embeddings\": false%s%s%s}",
	         an, mt, s->hidden, s->inter, s->layers, s->heads, s->heads, s->vocab, EPS, THETA, THETA, s->q_lora,
	         s->kv_lora, s->nope, s->rope, s->vd, s->layers, s->interleave || v3 ? "true" : "false", s->topk, s->ih,
	         s->ihd, v3 ? "" : "\"layer_types\": [\"deepseek_sparse_attention\"], ", s->glm && !v3 ? lt : "", s->glm && !v3 ? it : "", extra ? extra : "");
}

/* ---- the reference (double, token by token) -------------------------- */
/* RoPE on d values at position pos: interleaved pairs (de-interleaved as
 * Hugging Face does, q and k alike), else rotate-half */
static void rope(double *v, int d, int pos, int interleave)
{
	int h = d / 2;
	double tmp[128];
	for (int i = 0; i < d; i++)
		tmp[i] = interleave ? (i < h ? v[2 * i] : v[2 * (i - h) + 1]) : v[i];
	for (int i = 0; i < h; i++) {
		double f = 1 / pow(THETA, 2.0 * i / d), c = cos(pos * f), sn = sin(pos * f);
		v[i] = tmp[i] * c - tmp[i + h] * sn;
		v[i + h] = tmp[i + h] * c + tmp[i] * sn;
	}
}

static void mlp(double *y, const double *x, const double *G, const double *U, const double *D, int H, int I)
{
	double g[512], u[512];
	synth_mv(g, G, NULL, x, I, H);
	synth_mv(u, U, NULL, x, I, H);
	for (int i = 0; i < I; i++)
		g[i] = g[i] / (1 + exp(-g[i])) * u[i];
	synth_mv(y, D, NULL, g, H, I);
}

/* query t's keys: picked[t * n + j]; the topk of highest score, ties to the
 * earlier key, by repeated arg-max (qsort in the library) */
static void pick(const double *score, int t, int topk, unsigned char *picked)
{
	if (t < topk) {
		for (int j = 0; j <= t; j++)
			picked[j] = 1;
		return;
	}
	for (int n = 0; n < topk; n++) {
		int b = -1;
		for (int j = 0; j <= t; j++)
			if (!picked[j] && (b < 0 || score[j] > score[b]))
				b = j;
		picked[b] = 1;
	}
}

static int ref_dense;   /* the reference without the indexer (every key) */

static void ref_forward(const struct ds *s, const int32_t *tok, int n, double *logits)
{
	int H = s->hidden, nh = s->heads, qkd = s->nope + s->rope, kvb = s->nope + s->vd, ihd = s->ihd;
	double *x = calloc((size_t)n * H, sizeof *x), xn[256], o[256];
	double *q = malloc(sizeof(double) * n * nh * qkd), *lat = malloc(sizeof(double) * n * (s->kv_lora + s->rope));
	double *K = malloc(sizeof(double) * n * nh * qkd), *V = malloc(sizeof(double) * n * nh * s->vd);
	double *IQ = malloc(sizeof(double) * n * s->ih * ihd), *IK = malloc(sizeof(double) * n * ihd);
	double *IW = malloc(sizeof(double) * n * s->ih), *isc = malloc(sizeof(double) * n);
	unsigned char *sel = calloc((size_t)n * n, 1);
	double *a = malloc(sizeof(double) * nh * s->vd), *sc = malloc(sizeof(double) * n);
	double qa[256], ckv[256], kv[2048], sm = 1 / sqrt(qkd);
	const double *E = synth_get("model.embed_tokens.weight");
	for (int t = 0; t < n; t++)
		memcpy(x + t * H, E + (size_t)tok[t] * H, sizeof(double) * H);
	for (int l = 0; l < s->layers; l++) {
#define W(x) synth_get("model.layers.%d." x, l)
		for (int t = 0; t < n; t++) {
			synth_rms(xn, x + t * H, W("input_layernorm.weight"), H, EPS);
			synth_mv(qa, W("self_attn.q_a_proj.weight"), NULL, xn, s->q_lora, H);
			synth_rms(qa, qa, W("self_attn.q_a_layernorm.weight"), s->q_lora, LAT_EPS);
			synth_mv(q + t * nh * qkd, W("self_attn.q_b_proj.weight"), NULL, qa, nh * qkd, s->q_lora);
			if (!shared(s, l)) {
				synth_mv(IQ + t * s->ih * ihd, W("self_attn.indexer.wq_b.weight"), NULL, qa, s->ih * ihd, s->q_lora);
				for (int h = 0; h < s->ih; h++)
					rope(IQ + (t * s->ih + h) * ihd, s->rope, t, s->glm);
				double *k = IK + t * ihd, m = 0, v = 0;
				synth_mv(k, W("self_attn.indexer.wk.weight"), NULL, xn, ihd, H);
				for (int e = 0; e < ihd; e++)
					m += k[e] / ihd;
				for (int e = 0; e < ihd; e++)
					v += (k[e] - m) * (k[e] - m) / ihd;
				for (int e = 0; e < ihd; e++)
					k[e] = (k[e] - m) / sqrt(v + 1e-6) * W("self_attn.indexer.k_norm.weight")[e] +
					       W("self_attn.indexer.k_norm.bias")[e];
				rope(k, s->rope, t, s->glm);
				synth_mv(IW + t * s->ih, W("self_attn.indexer.weights_proj.weight"), NULL, xn, s->ih, H);
			}
			double *lt = lat + t * (s->kv_lora + s->rope);
			synth_mv(lt, W("self_attn.kv_a_proj_with_mqa.weight"), NULL, xn, s->kv_lora + s->rope, H);
			rope(lt + s->kv_lora, s->rope, t, 1);
			for (int h = 0; h < nh; h++)
				rope(q + (t * nh + h) * qkd + s->nope, s->rope, t, 1);
			synth_rms(ckv, lt, W("self_attn.kv_a_layernorm.weight"), s->kv_lora, LAT_EPS);
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
		if (!shared(s, l)) {
			memset(sel, 0, (size_t)n * n);
			for (int t = 0; t < n; t++) {
				for (int j = 0; j <= t; j++) {
					isc[j] = 0;
					for (int h = 0; h < s->ih; h++) {
						double d = 0;
						for (int e = 0; e < ihd; e++)
							d += IQ[(t * s->ih + h) * ihd + e] * IK[j * ihd + e];
						isc[j] += IW[t * s->ih + h] / sqrt(s->ih) * fmax(d / sqrt(ihd), 0);
					}
				}
				pick(isc, t, ref_dense ? n : s->topk, sel + (size_t)t * n);
			}
		}
		for (int t = 0; t < n; t++) {
			for (int h = 0; h < nh; h++) {
				double mx = -1e300, sum = 0;
				for (int j = 0; j <= t; j++) {
					if (!sel[t * n + j])
						continue;
					double d = 0;
					for (int e = 0; e < qkd; e++)
						d += q[(t * nh + h) * qkd + e] * K[(j * nh + h) * qkd + e];
					sc[j] = d * sm;
					mx = sc[j] > mx ? sc[j] : mx;
				}
				for (int j = 0; j <= t; j++)
					if (sel[t * n + j])
						sum += sc[j] = exp(sc[j] - mx);
				for (int e = 0; e < s->vd; e++) {
					double acc = 0;
					for (int j = 0; j <= t; j++)
						if (sel[t * n + j])
							acc += sc[j] * V[(j * nh + h) * s->vd + e];
					a[h * s->vd + e] = acc / sum;
				}
			}
			synth_mv(o, W("self_attn.o_proj.weight"), NULL, a, H, nh * s->vd);
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
		for (int t = 0; t < n; t++) {
			synth_rms(xn, x + t * H, W("post_attention_layernorm.weight"), H, EPS);
			mlp(o, xn, W("mlp.gate_proj.weight"), W("mlp.up_proj.weight"), W("mlp.down_proj.weight"), H, s->inter);
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
#undef W
	}
	for (int t = 0; t < n; t++) {
		synth_rms(xn, x + t * H, synth_get("model.norm.weight"), H, EPS);
		synth_mv(logits + (size_t)t * s->vocab, synth_get("lm_head.weight"), NULL, xn, s->vocab, H);
	}
	free(x), free(q), free(lat), free(K), free(V), free(a), free(sc);
	free(IQ), free(IK), free(IW), free(isc), free(sel);
}

static void ref_rows(const void *ctx, const int32_t *tok, int n, double *logits)
{
	ref_forward(ctx, tok, n, logits);
}

static int bad(const struct ds *s, const char *name, const char *extra, const char *want)
{
	if (write_model(s, test_path(name), "dsa", extra))
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

/* the model's logits of rows x cols tokens, chunk_tokens chunk (NULL on error) */
static float *logits(const char *dir, int rows, int cols, int vocab, int64_t chunk)
{
	x3_model *m;
	if (x3_model_open(dir, NULL, &m)) {
		printf("# open: %s\n", x3_errmsg());
		return NULL;
	}
	int32_t *tok = malloc(sizeof(int32_t) * rows * cols);
	float *lg = malloc(sizeof(float) * rows * cols * vocab);
	for (int i = 0; i < rows * cols; i++)
		tok[i] = (i * 7 + 3) % vocab;
	struct x3_forward_opts o;
	x3_forward_opts_init(&o, m);
	o.logits_mode = X3_LOGITS_ALL;
	o.logits = lg;
	o.chunk_tokens = chunk;
	if (x3_model_forward(m, tok, rows, cols, &o)) {
		printf("# forward: %s\n", x3_errmsg());
		free(lg);
		lg = NULL;
	}
	free(tok);
	x3_model_close(m);
	return lg;
}

/* The selection against the scalar loop: random q, k, w, some queries with
 * every weight zero (all scores 0: the earliest keys) and some keys
 * repeated (equal scores). */
static void check_select(void)
{
	enum { R = 2, C = 37, NH = 3, HD = 10, TOPK = 7 };
	x3_rng g;
	x3_rng_seed(&g, 5, 0);
	float *q = test_randn(&g, R * C * NH * HD, 1), *k = test_randn(&g, R * C * HD, 1);
	float *w = test_randn(&g, R * C * NH, 1);
	for (int h = 0; h < NH; h++)
		w[(C + 20) * NH + h] = w[30 * NH + h] = 0;
	memcpy(k + 12 * HD, k + 3 * HD, HD * sizeof *k);
	memcpy(k + (C + 25) * HD, k + (C + 9) * HD, HD * sizeof *k);
	int64_t st = x3_sel_stride(C);
	uint8_t *sel = malloc((size_t)(R * C * st));
	CHECK_OK(x3_indexer_select(q, k, w, R, C, NH, HD, TOPK, 1 / sqrt(HD), sel),
	         "indexer: select over 2 rows of 37 tokens, 3 heads of 10, top 7");
	int same = 1, count = 1, zero_first = 1;
	unsigned char picked[C];
	double score[C];
	for (int t = 0; t < R * C; t++) {
		int i = t % C, r0 = t - i, n = 0;
		for (int j = 0; j <= i; j++) {
			score[j] = 0;
			for (int h = 0; h < NH; h++) {
				double d = 0;
				for (int e = 0; e < HD; e++)
					d += (double)q[(t * NH + h) * HD + e] * k[(r0 + j) * HD + e];
				score[j] += w[t * NH + h] * fmax(d / sqrt(HD), 0);
			}
		}
		memset(picked, 0, sizeof picked);
		pick(score, i, TOPK, picked);
		for (int j = 0; j < C; j++) {
			int b = sel[t * st + j / 8] >> (j % 8) & 1;
			same &= b == picked[j];
			n += b;
		}
		count &= n == (i < TOPK ? i + 1 : TOPK);
		if (t == C + 20 || t == 30)
			for (int j = 0; j < C; j++)
				zero_first &= (sel[t * st + j / 8] >> (j % 8) & 1) == (j < TOPK);
	}
	CHECK(same, "the selection == the scalar loop's (repeated arg-max, ties to the earlier key), every query");
	CHECK(count, "each query picks min(its position + 1, index_topk) keys, none after it");
	CHECK(zero_first, "a query whose scores are all 0 picks the first index_topk keys");

	/* the sparse attention over every key == the dense attention */
	enum { QD = 9, VD = 7 };
	float *aq = test_randn(&g, R * C * NH * QD, 1), *ak = test_randn(&g, R * C * NH * QD, 1);
	float *av = test_randn(&g, R * C * NH * VD, 1);
	float *o1 = malloc(sizeof(float) * R * C * NH * VD), *o2 = malloc(sizeof(float) * R * C * NH * VD);
	CHECK_OK(x3_indexer_select(q, k, w, R, C, NH, HD, C, 1 / sqrt(HD), sel), "select with index_topk = the row");
	CHECK_OK(x3_sparse_attention(aq, ak, av, o1, R, C, NH, QD, VD, 0.3, sel), "sparse attention over every key");
	CHECK_OK(x3_attention(aq, ak, av, o2, R, C, NH, NH, QD, VD, 0.3f, 0, 0), "dense attention");
	double e = test_max_diff(o1, o2, (size_t)(R * C * NH * VD));
	CHECK(e < 1e-5, "... the same outputs (max diff %.2g)", e);
	free(q), free(k), free(w), free(sel), free(aq), free(ak), free(av), free(o1), free(o2);
}

int main(void)
{
	if (test_tmpdir("t1577")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	check_select();

	/* hidden inter layers heads vocab | q_lora kv_lora nope rope v |
	 * ih ihd topk | shared glm interleave */
	struct ds a = { 40, 44, 4, 3, 50, 28, 20, 10, 8, 6, 3, 12, 5, 0x6, 1, 0 };
	build(&a, 1);
	CHECK_OK(write_model(&a, test_path("a"), "dsa", NULL), "write GLM-5: 4 layers, 1 and 2 \"shared\", "
	         "indexer 3 heads of 12, index_topk 5, rope_interleave false");
	x3_model *m;
	CHECK_OK(x3_model_open(test_path("a"), NULL, &m), "open it");
	if (m) {
		const x3_model_config *c = x3_model_cfg(m);
		CHECK(c->arch == X3_ARCH_GLM_MOE_DSA && c->dsa && c->index_topk == 5 && c->index_heads == 3 &&
		      c->index_hd == 12 && !x3_arch_idx_shared(c, 0) && x3_arch_idx_shared(c, 1) &&
		      x3_arch_idx_shared(c, 2) && !x3_arch_idx_shared(c, 3) && c->rope_interleave && c->idx_interleave,
		      "config: index_topk 5, 3 heads of 12, layers 1 and 2 shared (indexer_types), the attention's "
		      "and the indexer's rope interleaved (rope_interleave false not read)");
		x3_module *mods;
		int nm;
		int n_wq = 0, n_idx = 0, grp = 0;
		if (!x3_arch_modules(c, &mods, &nm)) {
			for (int i = 0; i < nm; i++) {
				if (strstr(mods[i].key, ".indexer."))
					n_idx++;
				if (strstr(mods[i].key, "indexer.wq_b")) {
					n_wq++;
					grp += mods[i].d->kind == X3_KIND_LINEAR &&
					       strstr(mods[i].group, "self_attn.q_b_proj.input") != NULL;
				}
				if (strstr(mods[i].key, "indexer.wk") || strstr(mods[i].key, "weights_proj"))
					grp += 10 * (mods[i].d->kind == X3_KIND_MATRIX);
			}
			free(mods);
		}
		CHECK(n_idx == 10 && n_wq == 2 && grp == 2 + 40,
		      "modules: the indexer's 5 in the 2 full layers only; wq_b a linear of q_b_proj's Hessian group, "
		      "wk and weights_proj kept matrices (%d %d %d)", n_idx, n_wq, grp);
		x3_model_close(m);
	}
	double e = synth_compare(test_path("a"), 2, 13, a.vocab, ref_rows, &a, NULL);
	CHECK(e < 1e-5, "GLM-5 forward (rows of 13, index_topk 5) == the reference (rel err %.2g)", e);
	ref_dense = 1;
	e = synth_compare(test_path("a"), 2, 13, a.vocab, ref_rows, &a, NULL);
	ref_dense = 0;
	CHECK(e > 1e-3, "... and differs from the reference attending to every key (rel diff %.2g)", e);
	float *l1 = logits(test_path("a"), 3, 13, a.vocab, 13), *l2 = logits(test_path("a"), 3, 13, a.vocab, 4096);
	CHECK(l1 && l2 && !memcmp(l1, l2, sizeof(float) * 3 * 13 * a.vocab),
	      "the same logits from chunks of one row and of all 3 rows");
	free(l1), free(l2);

	struct ds b = { 36, 30, 2, 2, 50, 22, 16, 8, 6, 8, 4, 10, 4, 0, 0, 0 };
	build(&b, 2);
	CHECK_OK(write_model(&b, test_path("b"), "dsa", NULL), "write DeepSeek V3.2: 2 layers, index_topk 4");
	e = synth_compare(test_path("b"), 2, 11, b.vocab, ref_rows, &b, NULL);
	CHECK(e < 1e-5, "DeepSeek V3.2 forward == the reference (rel err %.2g)", e);

	/* index_topk at the row length: plain MLA, byte for byte */
	build(&a, 1);
	a.topk = 13;
	CHECK_OK(write_model(&a, test_path("t13"), "dsa", NULL), "write GLM-5 at index_topk 13");
	a.topk = 12;
	CHECK_OK(write_model(&a, test_path("t12"), "dsa", NULL), "... at 12");
	/* DeepSeek V3 reads no indexer tensors: the same file */
	CHECK_OK(write_model(&a, test_path("v3"), "v3", NULL), "... and as DeepseekV3ForCausalLM");
	float *p13 = logits(test_path("t13"), 2, 13, a.vocab, 13), *p12 = logits(test_path("t12"), 2, 13, a.vocab, 13);
	float *pv3 = logits(test_path("v3"), 2, 13, a.vocab, 13);
	CHECK(p13 && pv3 && !memcmp(p13, pv3, sizeof(float) * 2 * 13 * a.vocab),
	      "index_topk 13 on rows of 13: DeepSeek V3's logits, byte for byte");
	CHECK(p12 && pv3 && test_max_diff(p12, pv3, (size_t)(2 * 13 * a.vocab)) > 1e-4,
	      "index_topk 12: not (max diff %.2g)", p12 && pv3 ? test_max_diff(p12, pv3, (size_t)(2 * 13 * a.vocab)) : 0);
	free(p13), free(p12), free(pv3);

	/* bad configs and a missing indexer tensor */
	a.shared = 0x6, a.topk = 5;
	build(&a, 1);
	CHECK(bad(&a, "c1", ", \"indexer_types\": [\"shared\", \"full\", \"full\", \"full\"]", "layer 0 is \"shared\""),
	      "layer 0 shared: named");
	CHECK(bad(&a, "c2", ", \"indexer_types\": [\"full\", \"full\"]", "'indexer_types' is not a list of "
	          "num_hidden_layers = 4"), "indexer_types of 2 entries for 4 layers: named");
	CHECK(bad(&a, "c3", ", \"indexer_types\": [\"full\", \"skip\", \"full\", \"full\"]", "'indexer_types' entry 1"),
	      "an indexer_types entry other than full / shared: named");
	CHECK(bad(&a, "c4", ", \"index_head_dim\": 6", "index_head_dim 6 is less than qk_rope_head_dim 8"),
	      "index_head_dim below qk_rope_head_dim: named");
	CHECK(bad(&a, "c5", ", \"q_lora_rank\": null", "q_lora_rank is null"), "no q_lora_rank: named");
	a.shared = 0x2;   /* layer 2 full, but its tensors as written (shared) are missing */
	CHECK(bad(&a, "c6", NULL, "model.layers.2.self_attn.indexer.wq_b"),
	      "layer 2 full without its indexer tensors: the missing tensor named");
	if (test_tmpdir_remove())
		printf("# could not remove %s\n", test_tmp());
	synth_reset();
	TEST_DONE();
}
