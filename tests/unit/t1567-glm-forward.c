/* t1567-glm-forward: GLM-4 MoE (Glm4MoeForCausalLM: GLM-4.5, 4.5-Air, 4.6)
 * written here (seeded) and run by the model library: the logits match a
 * plain double-precision reference written in this file from Hugging
 * Face's modeling_glm4_moe.py (transformers is not available here, so the
 * reference is this file's loops, its attention synth.c's synth_attn):
 *   - GQA attention with q/k/v biases (attention_bias; o_proj has none),
 *     per-head q/k RMS norms (use_qk_norm), RoPE rotate-half on the first
 *     head_dim * partial_rotary_factor dims of each head (0.5);
 *   - layer 0 a dense MLP (first_k_dense_replace 1), layer 1 the MoE:
 *     sigmoid router scores, the choice on score + e_score_correction_bias
 *     among the best topk_group of n_group groups (each scored by its best
 *     two), weights the plain scores renormalized (norm_topk_prob) times
 *     routed_scaling_factor, plus the shared expert unscaled.
 * Each feature is shown to matter (the reference without it differs from
 * the model): partial rotary, rotate-half (not interleaved pairs), the
 * correction bias, the scaling factor. With all experts identical and top
 * k = all, the MoE layer equals the dense MLP (the model library's own
 * dense path of the concatenated expert and shared expert); distinct
 * experts do not. No dimension is a multiple of 128. Bad configs and a
 * missing expert fail naming the key or tensor; Hugging Face's defaults
 * fill what a config leaves out; the multi-token-prediction layer of a
 * config that names none is no module. One that the config names (layer
 * 2: enorm, hnorm, eh_proj, a decoder layer with experts,
 * shared_head.norm) gives the logits of the token two ahead that a
 * reference written here from vLLM's deepseek_mtp.py gives (the main
 * model's state before its final norm; a swapped concatenation and the
 * normed state each fail it). */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include "test.h"
#include "arch.h"
#include "config.h"
#include "model.h"
#include "synth.h"

enum { H = 40, NH = 4, NKV = 2, HD = 12, QD = NH * HD, KVD = NKV * HD, I = 40, MI = 20, E = 4, V = 30,
       NL = 2, ROWS = 2, COLS = 9 };

struct glm {
	int qk_norm, bias;       /* use_qk_norm, attention_bias */
	int n_group, topk_group, top_k;
	double scale;            /* routed_scaling_factor */
	double prf;              /* partial_rotary_factor */
	double cbias;            /* scale of the seeded e_score_correction_bias */
	int same;                /* every expert expert 0's weights */
	int dense;               /* every layer dense: layer 1's MLP the
	                            concatenation of expert 0 (down times
	                            scale) and the shared expert */
	int drop_expert;         /* leave model.layers.1.mlp.experts.3.down_proj out */
	int mtp;                 /* the whole multi-token-prediction layer NL
	                            (hnorm, shared_head.norm, a decoder layer
	                            with experts), named by the config */
};

/* what the reference does differently (to show that a feature matters) */
struct refo {
	int rd;                  /* rotated dims (0: the config's) */
	int interleave;          /* RoPE on pairs (2i, 2i+1) */
	int no_cbias;            /* choose on the plain scores */
	double scale;            /* routed_scaling_factor instead of the config's (0: it) */
	const struct glm *g;
};

#define LK(buf, l, s) (snprintf(buf, sizeof buf, "model.layers.%d.%s", l, s), buf)

/* forget the last k tensors of the table */
static void drop_last(int k)
{
	while (k-- > 0)
		free(synth_t[--synth_n].v);
}

static void build(const struct glm *g, uint64_t seed)
{
	x3_rng r;
	char n[160];
	x3_rng_seed(&r, seed, 0);
	synth_reset();
	synth_add("model.embed_tokens.weight", V, H, 1, 0, &r);
	synth_add("model.norm.weight", H, 0, 0.1, 1, &r);
	synth_add("lm_head.weight", V, H, 1 / sqrt(H), 0, &r);
	for (int l = 0; l < NL; l++) {
		synth_add(LK(n, l, "input_layernorm.weight"), H, 0, 0.1, 1, &r);
		synth_add(LK(n, l, "post_attention_layernorm.weight"), H, 0, 0.1, 1, &r);
		synth_add(LK(n, l, "self_attn.q_proj.weight"), QD, H, 1 / sqrt(H), 0, &r);
		synth_add(LK(n, l, "self_attn.k_proj.weight"), KVD, H, 1 / sqrt(H), 0, &r);
		synth_add(LK(n, l, "self_attn.v_proj.weight"), KVD, H, 1 / sqrt(H), 0, &r);
		synth_add(LK(n, l, "self_attn.o_proj.weight"), H, QD, 1 / sqrt(QD), 0, &r);
		if (g->bias) {
			synth_add(LK(n, l, "self_attn.q_proj.bias"), QD, 0, 0.2, 0, &r);
			synth_add(LK(n, l, "self_attn.k_proj.bias"), KVD, 0, 0.2, 0, &r);
			synth_add(LK(n, l, "self_attn.v_proj.bias"), KVD, 0, 0.2, 0, &r);
		}
		if (g->qk_norm) {
			synth_add(LK(n, l, "self_attn.q_norm.weight"), HD, 0, 0.2, 1, &r);
			synth_add(LK(n, l, "self_attn.k_norm.weight"), HD, 0, 0.2, 1, &r);
		}
	}
	synth_add(LK(n, 0, "mlp.gate_proj.weight"), I, H, 1 / sqrt(H), 0, &r);
	synth_add(LK(n, 0, "mlp.up_proj.weight"), I, H, 1 / sqrt(H), 0, &r);
	synth_add(LK(n, 0, "mlp.down_proj.weight"), H, I, 1 / sqrt(I), 0, &r);
	/* the multi-token-prediction layer (layer NL) real checkpoints carry, its
	 * projection and a norm of it; the config names none (left out) */
	synth_add(LK(n, NL, "eh_proj.weight"), H, 2 * H, 0.1, 0, &r);
	synth_add(LK(n, NL, "enorm.weight"), H, 0, 0, 1, &r);
	/* layer 1's MoE last, so that the dense variant draws the same others */
	static double sg[MI * H], su[MI * H], sd[H * MI], eg[MI * H], eu[MI * H], ed[H * MI];
	x3_rng m;
	x3_rng_seed(&m, seed, 1);
	struct synth_tens *t;
	int l = 1;
	t = synth_add(LK(n, l, "mlp.gate.weight"), E, H, 1 / sqrt(H), 0, &m);
	t = synth_add(LK(n, l, "mlp.gate.e_score_correction_bias"), E, 0, g->cbias, 0, &m);
	for (int e = 0; e < E; e++) {
		char k[160];
		snprintf(k, sizeof k, "mlp.experts.%d.gate_proj.weight", e);
		t = synth_add(LK(n, l, k), MI, H, 1 / sqrt(H), 0, &m);
		if (e == 0) memcpy(eg, t->v, sizeof eg);
		if (g->same) memcpy(t->v, eg, sizeof eg);
		snprintf(k, sizeof k, "mlp.experts.%d.up_proj.weight", e);
		t = synth_add(LK(n, l, k), MI, H, 1 / sqrt(H), 0, &m);
		if (e == 0) memcpy(eu, t->v, sizeof eu);
		if (g->same) memcpy(t->v, eu, sizeof eu);
		snprintf(k, sizeof k, "mlp.experts.%d.down_proj.weight", e);
		t = synth_add(LK(n, l, k), H, MI, 1 / sqrt(MI), 0, &m);
		if (e == 0) memcpy(ed, t->v, sizeof ed);
		if (g->same) memcpy(t->v, ed, sizeof ed);
		if (g->drop_expert && e == 3)
			drop_last(1);
	}
	t = synth_add(LK(n, l, "mlp.shared_experts.gate_proj.weight"), MI, H, 1 / sqrt(H), 0, &m);
	memcpy(sg, t->v, sizeof sg);
	t = synth_add(LK(n, l, "mlp.shared_experts.up_proj.weight"), MI, H, 1 / sqrt(H), 0, &m);
	memcpy(su, t->v, sizeof su);
	t = synth_add(LK(n, l, "mlp.shared_experts.down_proj.weight"), H, MI, 1 / sqrt(MI), 0, &m);
	memcpy(sd, t->v, sizeof sd);
	synth_round(X3_F32);
	if (g->mtp) {
		/* the rest of the MTP layer, from a stream of its own (the
		 * other tensors are those of the model without it) */
		x3_rng q;
		x3_rng_seed(&q, seed, 2);
		int L = NL;
		synth_add(LK(n, L, "hnorm.weight"), H, 0, 0.1, 1, &q);
		synth_add(LK(n, L, "shared_head.norm.weight"), H, 0, 0.1, 1, &q);
		synth_add(LK(n, L, "input_layernorm.weight"), H, 0, 0.1, 1, &q);
		synth_add(LK(n, L, "post_attention_layernorm.weight"), H, 0, 0.1, 1, &q);
		synth_add(LK(n, L, "self_attn.q_proj.weight"), QD, H, 1 / sqrt(H), 0, &q);
		synth_add(LK(n, L, "self_attn.k_proj.weight"), KVD, H, 1 / sqrt(H), 0, &q);
		synth_add(LK(n, L, "self_attn.v_proj.weight"), KVD, H, 1 / sqrt(H), 0, &q);
		synth_add(LK(n, L, "self_attn.o_proj.weight"), H, QD, 1 / sqrt(QD), 0, &q);
		if (g->bias) {
			synth_add(LK(n, L, "self_attn.q_proj.bias"), QD, 0, 0.2, 0, &q);
			synth_add(LK(n, L, "self_attn.k_proj.bias"), KVD, 0, 0.2, 0, &q);
			synth_add(LK(n, L, "self_attn.v_proj.bias"), KVD, 0, 0.2, 0, &q);
		}
		if (g->qk_norm) {
			synth_add(LK(n, L, "self_attn.q_norm.weight"), HD, 0, 0.2, 1, &q);
			synth_add(LK(n, L, "self_attn.k_norm.weight"), HD, 0, 0.2, 1, &q);
		}
		synth_add(LK(n, L, "mlp.gate.weight"), E, H, 1 / sqrt(H), 0, &q);
		synth_add(LK(n, L, "mlp.gate.e_score_correction_bias"), E, 0, g->cbias, 0, &q);
		for (int e = 0; e < E; e++) {
			char k[160];
			snprintf(k, sizeof k, "mlp.experts.%d.gate_proj.weight", e);
			synth_add(LK(n, L, k), MI, H, 1 / sqrt(H), 0, &q);
			snprintf(k, sizeof k, "mlp.experts.%d.up_proj.weight", e);
			synth_add(LK(n, L, k), MI, H, 1 / sqrt(H), 0, &q);
			snprintf(k, sizeof k, "mlp.experts.%d.down_proj.weight", e);
			synth_add(LK(n, L, k), H, MI, 1 / sqrt(MI), 0, &q);
		}
		synth_add(LK(n, L, "mlp.shared_experts.gate_proj.weight"), MI, H, 1 / sqrt(H), 0, &q);
		synth_add(LK(n, L, "mlp.shared_experts.up_proj.weight"), MI, H, 1 / sqrt(H), 0, &q);
		synth_add(LK(n, L, "mlp.shared_experts.down_proj.weight"), H, MI, 1 / sqrt(MI), 0, &q);
		synth_round(X3_F32);
	}
	if (!g->dense)
		return;
	/* the dense MLP of the same function: gate/up rows of expert 0 then
	 * the shared expert, down's columns alike (expert 0's times scale) */
	drop_last(3 * E + 5);
	struct synth_tens *G = synth_add(LK(n, l, "mlp.gate_proj.weight"), 2 * MI, H, 0, 0, &m);
	struct synth_tens *U = synth_add(LK(n, l, "mlp.up_proj.weight"), 2 * MI, H, 0, 0, &m);
	struct synth_tens *D = synth_add(LK(n, l, "mlp.down_proj.weight"), H, 2 * MI, 0, 0, &m);
	for (int i = 0; i < MI * H; i++) {
		double x = eg[i], y = eu[i];
		G->v[i] = (float)x, U->v[i] = (float)y;
		G->v[MI * H + i] = (float)sg[i], U->v[MI * H + i] = (float)su[i];
	}
	for (int o = 0; o < H; o++)
		for (int j = 0; j < MI; j++) {
			D->v[o * 2 * MI + j] = (float)ed[o * MI + j] * (float)g->scale;
			D->v[o * 2 * MI + MI + j] = (float)sd[o * MI + j];
		}
	synth_round(X3_F32);
}

static int write_glm(const char *dir, const struct glm *g, uint64_t seed)
{
	build(g, seed);
	return synth_write_model(dir, X3_F32, 0,
	         "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", \"hidden_size\": %d, "
	         "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
	         "\"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-5, "
	         "\"rope_theta\": 100.0, \"partial_rotary_factor\": %g, \"max_position_embeddings\": 64, "
	         "\"attention_bias\": %s, \"use_qk_norm\": %s, \"n_routed_experts\": %d, "
	         "\"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, \"n_shared_experts\": 1, "
	         "\"first_k_dense_replace\": %d, \"n_group\": %d, \"topk_group\": %d, \"norm_topk_prob\": true, "
	         "\"routed_scaling_factor\": %g, \"num_nextn_predict_layers\": %d, \"tie_word_embeddings\": false, "
	         "\"hidden_act\": \"silu\"}",
	         H, g->dense ? 2 * MI : I, NL, NH, NKV, HD, V, g->prf, g->bias ? "true" : "false",
	         g->qk_norm ? "true" : "false", E, g->top_k, MI, g->dense ? NL : 1, g->n_group, g->topk_group,
	         g->scale, g->mtp);
}

/* ---- plain reference forward (double) --------------------------------- */

static void rope(double *v, int rd, int inter, int pos)
{
	for (int i = 0; i < rd / 2; i++) {
		double inv = pow(100.0, -2.0 * i / rd), c = cos(pos * inv), s = sin(pos * inv);
		int ia = inter ? 2 * i : i, ib = inter ? 2 * i + 1 : i + rd / 2;
		double a = v[ia], b = v[ib];
		v[ia] = a * c - b * s;
		v[ib] = b * c + a * s;
	}
}

static double sigm(double x) { return 1 / (1 + exp(-x)); }

/* SiLU MLP of width w: y = down(silu(gate x) * up x) */
static void mlp(double *y, const double *gw, const double *uw, const double *dw, int w, const double *x)
{
	double g[2 * MI > I ? 2 * MI : I], u[2 * MI > I ? 2 * MI : I];
	synth_mv(g, gw, NULL, x, w, H);
	synth_mv(u, uw, NULL, x, w, H);
	for (int i = 0; i < w; i++)
		g[i] = g[i] * sigm(g[i]) * u[i];
	synth_mv(y, dw, NULL, g, H, w);
}

/* HF's route_tokens_to_experts for one token: the top_k experts and weights */
static void route(const struct refo *o, int l, const double *xn, int *idx, double *w)
{
	const struct glm *g = o->g;
	double lg[E], s[E], ch[E], gs[E];
	int gsel[E] = {0}, per = E / g->n_group, used[E] = {0};
	synth_mv(lg, synth_get("model.layers.%d.mlp.gate.weight", l), NULL, xn, E, H);
	const double *cb = synth_get("model.layers.%d.mlp.gate.e_score_correction_bias", l);
	for (int e = 0; e < E; e++)
		s[e] = sigm(lg[e]), ch[e] = s[e] + (o->no_cbias ? 0 : cb[e]);
	for (int q = 0; q < g->n_group; q++) {   /* a group: the sum of its best two */
		double b1 = -1e300, b2 = -1e300;
		for (int e = q * per; e < (q + 1) * per; e++)
			if (ch[e] > b1) b2 = b1, b1 = ch[e];
			else if (ch[e] > b2) b2 = ch[e];
		gs[q] = b1 + b2;
	}
	for (int k = 0; k < g->topk_group; k++) {
		int best = -1;
		for (int q = 0; q < g->n_group; q++)
			if (!gsel[q] && (best < 0 || gs[q] > gs[best]))
				best = q;
		gsel[best] = 1;
	}
	for (int e = 0; e < E; e++)
		if (!gsel[e / per])
			ch[e] = 0.0;   /* masked_fill(~mask, 0.0) */
	double sum = 0;
	for (int k = 0; k < g->top_k; k++) {
		int best = -1;
		for (int e = 0; e < E; e++)
			if (!used[e] && (best < 0 || ch[e] > ch[best]))
				best = e;
		used[best] = 1;
		idx[k] = best, w[k] = s[best], sum += s[best];
	}
	for (int k = 0; k < g->top_k; k++)
		w[k] = w[k] / (sum + 1e-20) * (o->scale > 0 ? o->scale : g->scale);
}

/* Decoder layer l (0 dense, else sparse) on x (n, H) in place */
static void ref_layer(const struct refo *o, int l, double *x, int n)
{
	const struct glm *g = o->g;
	int rd = o->rd ? o->rd : (int)(HD * g->prf);
	double xn[H], a[QD], y[H], y2[H];
	double *q = malloc(sizeof(double) * n * QD), *k = malloc(sizeof(double) * n * KVD);
	double *v = malloc(sizeof(double) * n * KVD), *sc = malloc(sizeof(double) * n);
	char b1[160], b2[160], b3[160];
	{
		for (int t = 0; t < n; t++) {
			synth_rms(xn, x + t * H, synth_get("%s", LK(b1, l, "input_layernorm.weight")), H, 1e-5);
			synth_mv(q + t * QD, synth_get("%s", LK(b1, l, "self_attn.q_proj.weight")),
			         g->bias ? synth_get("%s", LK(b2, l, "self_attn.q_proj.bias")) : NULL, xn, QD, H);
			synth_mv(k + t * KVD, synth_get("%s", LK(b1, l, "self_attn.k_proj.weight")),
			         g->bias ? synth_get("%s", LK(b2, l, "self_attn.k_proj.bias")) : NULL, xn, KVD, H);
			synth_mv(v + t * KVD, synth_get("%s", LK(b1, l, "self_attn.v_proj.weight")),
			         g->bias ? synth_get("%s", LK(b2, l, "self_attn.v_proj.bias")) : NULL, xn, KVD, H);
			for (int h = 0; h < NH; h++) {
				if (g->qk_norm)
					synth_rms(q + t * QD + h * HD, q + t * QD + h * HD,
					          synth_get("%s", LK(b1, l, "self_attn.q_norm.weight")), HD, 1e-5);
				rope(q + t * QD + h * HD, rd, o->interleave, t);
			}
			for (int h = 0; h < NKV; h++) {
				if (g->qk_norm)
					synth_rms(k + t * KVD + h * HD, k + t * KVD + h * HD,
					          synth_get("%s", LK(b1, l, "self_attn.k_norm.weight")), HD, 1e-5);
				rope(k + t * KVD + h * HD, rd, o->interleave, t);
			}
		}
		for (int t = 0; t < n; t++) {
			synth_attn(a, q + t * QD, k, v, t + 1, NH, NKV, HD, sc);
			synth_mv(y, synth_get("%s", LK(b1, l, "self_attn.o_proj.weight")), NULL, a, H, QD);
			for (int i = 0; i < H; i++)
				x[t * H + i] += y[i];
		}
		for (int t = 0; t < n; t++) {
			synth_rms(xn, x + t * H, synth_get("%s", LK(b1, l, "post_attention_layernorm.weight")), H, 1e-5);
			if (l == 0 || g->dense) {
				int w = l == 0 ? I : 2 * MI;
				mlp(y, synth_get("%s", LK(b1, l, "mlp.gate_proj.weight")),
				    synth_get("%s", LK(b2, l, "mlp.up_proj.weight")),
				    synth_get("%s", LK(b3, l, "mlp.down_proj.weight")), w, xn);
			} else {
				int idx[E];
				double wt[E];
				route(o, l, xn, idx, wt);
				mlp(y, synth_get("model.layers.%d.mlp.shared_experts.gate_proj.weight", l),
				    synth_get("model.layers.%d.mlp.shared_experts.up_proj.weight", l),
				    synth_get("model.layers.%d.mlp.shared_experts.down_proj.weight", l), MI, xn);
				for (int j = 0; j < g->top_k; j++) {
					int e = idx[j];
					mlp(y2, synth_get("model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e),
					    synth_get("model.layers.%d.mlp.experts.%d.up_proj.weight", l, e),
					    synth_get("model.layers.%d.mlp.experts.%d.down_proj.weight", l, e), MI, xn);
					for (int i = 0; i < H; i++)
						y[i] += wt[j] * y2[i];
				}
			}
			for (int i = 0; i < H; i++)
				x[t * H + i] += y[i];
		}
	}
	free(q), free(k), free(v), free(sc);
}

/* the layers over the embedding of tok: x (n, H) before the final norm */
static double *ref_hidden(const struct refo *o, const int32_t *tok, int n)
{
	double *x = calloc((size_t)n * H, sizeof *x);
	for (int t = 0; t < n; t++)
		memcpy(x + t * H, synth_get("model.embed_tokens.weight") + (size_t)tok[t] * H, sizeof(double) * H);
	for (int l = 0; l < NL; l++)
		ref_layer(o, l, x, n);
	return x;
}

static void ref_forward(const void *ctx, const int32_t *tok, int n, double *logits)
{
	double *x = ref_hidden(ctx, tok, n), xn[H];
	for (int t = 0; t < n; t++) {
		synth_rms(xn, x + t * H, synth_get("model.norm.weight"), H, 1e-5);
		synth_mv(logits + (size_t)t * V, synth_get("lm_head.weight"), NULL, xn, V, H);
	}
	free(x);
}

/* The multi-token prediction layer NL (DeepSeek V3's, vLLM's deepseek_mtp):
 * at t < n - 1, eh_proj of [enorm(embed(tok[t + 1])) | hnorm(h_t)], h_t the
 * main model's state before its final norm (as ExLlamaV3 describes the
 * DeepSeek / GLM MTP heads); then decoder layer NL over positions 0..n-2,
 * shared_head.norm and lm_head: logits (n - 1, V) */
static void ref_mtp(const struct refo *o, const int32_t *tok, int n, int swap, double *logits)
{
	double *x = ref_hidden(o, tok, n), *u = malloc(sizeof(double) * (size_t)(n - 1) * H), cat[2 * H], xn[H];
	char b[160];
	int eo = swap ? H : 0, ho = swap ? 0 : H;
	for (int t = 0; t < n - 1; t++) {
		synth_rms(cat + eo, synth_get("model.embed_tokens.weight") + (size_t)tok[t + 1] * H,
		          synth_get("%s", LK(b, NL, "enorm.weight")), H, 1e-5);
		synth_rms(cat + ho, x + t * H, synth_get("%s", LK(b, NL, "hnorm.weight")), H, 1e-5);
		synth_mv(u + t * H, synth_get("%s", LK(b, NL, "eh_proj.weight")), NULL, cat, H, 2 * H);
	}
	ref_layer(o, NL, u, n - 1);
	for (int t = 0; t < n - 1; t++) {
		synth_rms(xn, u + t * H, synth_get("%s", LK(b, NL, "shared_head.norm.weight")), H, 1e-5);
		synth_mv(logits + (size_t)t * V, synth_get("lm_head.weight"), NULL, xn, V, H);
	}
	free(x), free(u);
}

/* the model's MTP logits of rows of tok against ref_mtp's: max relative
 * error; swap: against the reference with the halves of its input swapped */
static double mtp_compare(const struct refo *o, const char *dir, const int32_t *tok, int rows, int cols, int swap)
{
	x3_model *m;
	if (x3_model_open(dir, NULL, &m)) {
		printf("# %s\n", x3_errmsg());
		return INFINITY;
	}
	size_t nl = (size_t)rows * (cols - 1) * V;
	float *lg = malloc(sizeof(float) * nl);
	double *ref = malloc(sizeof(double) * nl), num = 0, den = 0;
	struct x3_forward_opts fo;
	x3_forward_opts_init(&fo, m);
	fo.mtp_logits = lg;
	int rc = x3_model_forward(m, tok, rows, cols, &fo);
	if (rc)
		printf("# %s\n", x3_errmsg());
	x3_model_close(m);
	for (int r = 0; r < rows && !rc; r++)
		ref_mtp(o, tok + r * cols, cols, swap, ref + (size_t)r * (cols - 1) * V);
	for (size_t i = 0; i < nl && !rc; i++) {
		num = fmax(num, fabs(lg[i] - ref[i]));
		den = fmax(den, fabs(ref[i]));
	}
	free(lg), free(ref);
	return rc ? INFINITY : num / den;
}

int main(void)
{
	if (test_tmpdir("t1567")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	const double TOL = 2e-5;
	/* A: GLM-4.5 (q/k norms, biases), 1 group, top 2 of 4, scale 2.5 */
	struct glm A = { .qk_norm = 1, .bias = 1, .n_group = 1, .topk_group = 1, .top_k = 2, .scale = 2.5,
	                 .prf = 0.5, .cbias = 0.3 };
	CHECK_OK(write_glm(test_path("a"), &A, 1567), "write GLM-4 MoE A (q/k norms, q/k/v biases)");
	x3_model_config c;
	CHECK_OK(x3_config_load(test_path("a"), &c), "A: config");
	CHECK(c.arch == X3_ARCH_GLM4_MOE && c.rot_dim == HD / 2 && c.qkv_bias && !c.o_bias && c.qk_norm &&
	      c.sigmoid_route && c.n_experts == E && c.first_dense == 1 && c.shared_inter == MI &&
	      c.routed_scale == 2.5 && c.norm_topk, "A: Glm4MoeForCausalLM, RoPE on %lld of %d dims, q/k/v bias, "
	      "no o bias, q/k norms, sigmoid routing, 1 dense layer, shared expert %lld wide",
	      (long long)c.rot_dim, HD, (long long)c.shared_inter);
	x3_module *m = NULL;
	int n = 0;
	CHECK_OK(x3_arch_modules(&c, &m, &n), "A: modules");
	int nlin = 0, nrouter = 0;
	for (int i = 0; i < n; i++)
		nlin += m[i].d->kind == X3_KIND_LINEAR, nrouter += m[i].d->role == X3_ROLE_ROUTER;
	CHECK(nlin == 4 + 3 + 4 + 3 * E + 3 + 1 && nrouter == 2, "A: %d linears (2 x 4 attention, 3 dense, "
	      "%d x 3 experts, 3 shared, the head), router and correction bias unquantized", nlin, E);
	const x3_module *ob = x3_modules_find(m, n, "model.layers.1.self_attn.o_proj");
	const x3_module *qb = x3_modules_find(m, n, "model.layers.1.self_attn.q_proj");
	CHECK(ob && qb && !ob->bias && qb->bias, "A: q_proj has a bias, o_proj none (Hugging Face's Glm4MoeAttention)");
	free(m);
	CHECK(x3_arch_skipped(&c, "model.layers.2.eh_proj.weight") &&
	      !x3_arch_skipped(&c, "model.layers.1.mlp.gate.weight"),
	      "the multi-token-prediction layer (model.layers.2) is left out, layer 1 is not");

	/* the multi-token prediction layer (A's, with its whole layer 2) against ref_mtp */
	{
		struct glm AM = A;
		AM.mtp = 1;
		CHECK_OK(write_glm(test_path("mtp"), &AM, 1567), "write A with its MTP layer (num_nextn_predict_layers 1)");
		x3_model_config mc;
		CHECK(!x3_config_load(test_path("mtp"), &mc) && mc.n_mtp == 1, "the MTP layer is the model's (n_mtp 1)");
		struct refo rm = { .g = &AM };
		int32_t tok[2 * 20];
		x3_rng tg;
		x3_rng_seed(&tg, 7, 0);
		for (int i = 0; i < 40; i++)
			tok[i] = (int32_t)(x3_rng_u64(&tg) % V);
		double em = mtp_compare(&rm, test_path("mtp"), tok, 2, 20, 0);
		CHECK(em < TOL, "the MTP layer's logits == the reference (rel err %.2g)", em);
		em = mtp_compare(&rm, test_path("mtp"), tok, 1, 20, 1);
		CHECK(em > 1e-2, "... and far from a reference reading [hidden | embedding] (%.2g)", em);
		build(&A, 1567);
	}
	struct refo ro = { .g = &A };
	float *la = NULL;
	double e = synth_compare(test_path("a"), ROWS, COLS, V, ref_forward, &ro, &la);
	CHECK(e < TOL, "A: == reference (rel err %.2g)", e);
	ro.rd = HD;
	e = synth_compare(test_path("a"), ROWS, COLS, V, ref_forward, &ro, NULL);
	CHECK(e > 1e-3, "A: partial rotary matters: the full-rotary reference differs (rel err %.2g)", e);
	ro.rd = 0, ro.interleave = 1;
	e = synth_compare(test_path("a"), ROWS, COLS, V, ref_forward, &ro, NULL);
	CHECK(e > 1e-3, "A: rotate-half, not interleaved pairs: the interleaved reference differs (rel err %.2g)", e);
	ro.interleave = 0, ro.no_cbias = 1;
	e = synth_compare(test_path("a"), ROWS, COLS, V, ref_forward, &ro, NULL);
	CHECK(e > 1e-3, "A: the correction bias matters for the choice (rel err %.2g without it)", e);
	ro.no_cbias = 0, ro.scale = 1.0;
	e = synth_compare(test_path("a"), ROWS, COLS, V, ref_forward, &ro, NULL);
	CHECK(e > 1e-3, "A: routed_scaling_factor matters (rel err %.2g with 1.0)", e);

	/* B: GLM-4.5-Air-like (no q/k norms, no biases), 2 groups, the best 1 */
	struct glm B = { .qk_norm = 0, .bias = 0, .n_group = 2, .topk_group = 1, .top_k = 2, .scale = 1.5,
	                 .prf = 0.5, .cbias = 0.05 };
	CHECK_OK(write_glm(test_path("b"), &B, 1568), "write GLM-4 MoE B (no q/k norms, no biases, 2 groups)");
	CHECK_OK(x3_config_load(test_path("b"), &c), "B: config");
	CHECK(!c.qkv_bias && !c.qk_norm && c.n_group == 2 && c.topk_group == 1, "B: no bias, no q/k norms, "
	      "n_group 2, topk_group 1");
	struct refo rb = { .g = &B };
	e = synth_compare(test_path("b"), ROWS, COLS, V, ref_forward, &rb, NULL);
	CHECK(e < TOL, "B: == reference (rel err %.2g)", e);
	struct glm B1 = B;
	B1.n_group = 1;
	rb.g = &B1;   /* the same weights routed without groups */
	e = synth_compare(test_path("b"), ROWS, COLS, V, ref_forward, &rb, NULL);
	CHECK(e > 1e-3, "B: the group restriction matters (rel err %.2g without it)", e);

	/* identical experts, top k = all: the MoE layer is the dense MLP */
	struct glm S = A;
	S.same = 1, S.top_k = E;
	struct glm D = S;
	D.dense = 1;
	float *ls = NULL, *ld = NULL, *l2 = NULL;
	CHECK_OK(write_glm(test_path("d"), &D, 1567), "write the dense equivalent (first_k_dense_replace 2)");
	struct refo rd = { .g = &D };
	e = synth_compare(test_path("d"), ROWS, COLS, V, ref_forward, &rd, &ld);
	CHECK(e < TOL, "dense equivalent: == reference (rel err %.2g)", e);
	CHECK_OK(write_glm(test_path("s"), &S, 1567), "write identical experts, top k = all");
	struct refo rs = { .g = &S };
	e = synth_compare(test_path("s"), ROWS, COLS, V, ref_forward, &rs, &ls);
	CHECK(e < TOL, "identical experts: == reference (rel err %.2g)", e);
	size_t nl = (size_t)ROWS * COLS * V;
	e = ls && ld ? test_max_rel(ls, ld, nl) : 1;
	CHECK(e < TOL, "identical experts, top k = all: the dense MLP's logits (rel diff %.2g)", e);
	struct glm S2 = A;   /* distinct experts, top 2 */
	CHECK_OK(write_glm(test_path("s2"), &S2, 1567), "write distinct experts");
	struct refo r2 = { .g = &S2 };
	e = synth_compare(test_path("s2"), ROWS, COLS, V, ref_forward, &r2, &l2);
	CHECK(e < TOL, "distinct experts: == reference (rel err %.2g)", e);
	e = l2 && ld ? test_max_rel(l2, ld, nl) : 0;
	CHECK(e > 1e-3, "distinct experts, top 2: not the dense MLP (rel diff %.2g; the check can fail)", e);
	free(la), free(ls), free(ld), free(l2);

	/* bad inputs: exit 1 naming the key or tensor */
	struct glm X = A;
	X.drop_expert = 1;
	CHECK_OK(write_glm(test_path("x"), &X, 1567), "write a checkpoint without expert 3's down_proj");
	x3_model *bm = NULL;
	int rc = x3_model_open(test_path("x"), NULL, &bm);
	CHECK(rc != X3_OK && strstr(x3_errmsg(), "model.layers.1.mlp.experts.3.down_proj.weight"),
	      "a missing expert named: %s", x3_errmsg());
	x3_model_close(bm);
	const char *base = "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"hidden_size\": 64, "
	                   "\"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
	                   "\"num_key_value_heads\": 2, \"vocab_size\": 30";
	char js[1024];
	snprintf(js, sizeof js, "%s, \"n_routed_experts\": 4, \"num_experts_per_tok\": 5}", base);
	rc = test_config_parse(js, &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "'num_experts_per_tok' = 5") &&
	      strstr(x3_errmsg(), "'n_routed_experts' = 4"), "top k above the expert count: %s", x3_errmsg());
	snprintf(js, sizeof js, "%s, \"n_routed_experts\": 5, \"num_experts_per_tok\": 2, \"n_group\": 2}", base);
	rc = test_config_parse(js, &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "'n_routed_experts' = 5"), "5 experts in 2 groups: %s",
	      x3_errmsg());
	snprintf(js, sizeof js, "%s, \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, \"num_experts\": 8}", base);
	rc = test_config_parse(js, &c);
	CHECK(rc != X3_OK && strstr(x3_errmsg(), "\"num_experts\"") && strstr(x3_errmsg(), "n_routed_experts"),
	      "a second, contradicting expert count (num_experts) refused: %s", x3_errmsg());
	snprintf(js, sizeof js, "%s, \"use_qk_norm\": 1}", base);
	rc = test_config_parse(js, &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "'use_qk_norm'"), "use_qk_norm not a boolean: %s",
	      x3_errmsg());
	/* Hugging Face's Glm4MoeConfig defaults for what the config leaves out */
	snprintf(js, sizeof js, "%s}", base);
	CHECK(test_config_parse(js, &c) == X3_OK && c.rot_dim == 8 && c.n_experts == 128 && c.n_experts_tok == 8 &&
	      c.moe_inter == 1408 && c.n_group == 1 && c.topk_group == 1 && c.routed_scale == 1.0 &&
	      c.first_dense == 1 && c.shared_inter == 1408 && c.norm_topk && !c.qk_norm && !c.qkv_bias &&
	      c.rms_eps == 1e-5, "defaults: partial rotary 0.5 (%lld of 16 dims), 128 experts, top 8, 1 group, "
	      "scale 1, 1 dense layer, 1 shared expert, no q/k norms or biases", (long long)c.rot_dim);

	CHECK(!test_tmpdir_remove(), "the scratch directory removed");
	TEST_DONE();
}
