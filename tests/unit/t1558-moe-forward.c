/* t1558-moe-forward: the mixture-of-experts block (lib/model/moe.c) against
 * a double-precision token-by-token reference written in this file, with
 * its own routing: the softmax of the router's logits in double, the top k
 * by sorting (qsort: probability down, then expert number up), weights
 * the softmax probabilities, renormalized to sum 1 or not (norm_topk_prob;
 * both are checked). The batched form (rows gathered per expert,
 * x3_gemm_xwt products) routes every token as the reference does and gives
 * its output; with all experts identical and top k = all experts
 * (renormalized) the block is the dense MLP; the rows the experts see are
 * exactly the routed ones (the per-expert Hessian capture reads them: XᵀX
 * of exactly those rows).
 * Qwen2-MoE through the model library (x3_model_forward of a seeded
 * 2-layer Qwen2MoeForCausalLM written here, hidden 40, 6 experts of 24,
 * top 2, a shared expert of 36): its logits against the same reference
 * plus the shared expert scaled by sigmoid(shared_expert_gate · x), with
 * norm_topk_prob false (the Qwen2-MoE default) and true. o_proj is zero in
 * every layer, so attention adds nothing and each layer is x + block(norm(x)):
 * the reference is the block alone. The reference without the sigmoid gate,
 * or with the other norm_topk_prob, is shown to differ (the check can fail). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "synth.h"
#include "blas.h"
#include "moe.h"
#include "model.h"

enum { E = 5, H = 24, I = 40, NT = 37 };
static float *gw[E], *uw[E], *dw[E];
static double xtx[E][H * H];
static int64_t seen[E];

static int apply(void *ctx, int64_t e, int j, const float *x, int64_t n, float *y)
{
	(void)ctx;
	if (j == 0) {
		seen[e] += n;
		for (int64_t r = 0; r < n; r++)
			for (int a = 0; a < H; a++)
				for (int b = 0; b < H; b++)
					xtx[e][a * H + b] += (double)x[r * H + a] * x[r * H + b];
	}
	return j == 2 ? x3_gemm_xwt(x, n, 0, I, dw[e], H, y) : x3_gemm_xwt(x, n, 0, H, j ? uw[e] : gw[e], I, y);
}

/* ---- the reference: double, token by token ---------------------------- */
struct cand { double p; int e; };
static int by_prob(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->p != y->p)
		return x->p < y->p ? 1 : -1;
	return x->e - y->e;
}

/* The routing of one token's logits l (n): the softmax, sorted, its first
 * k: idx (best first), w; returns the margin p_k - p_(k+1) (1 when k = n):
 * a routing decided by less than float rounding (about 1e-6 here) would not
 * be a test. */
static double route_sorted(const double *l, int n, int k, int renorm, int32_t *idx, double *w)
{
	struct cand c[64];
	double mx = -INFINITY, sum = 0, s = 0;
	for (int e = 0; e < n; e++)
		mx = fmax(mx, l[e]);
	for (int e = 0; e < n; e++)
		sum += c[e].p = exp(l[e] - mx), c[e].e = e;
	for (int e = 0; e < n; e++)
		c[e].p /= sum;
	qsort(c, (size_t)n, sizeof *c, by_prob);
	for (int j = 0; j < k; j++)
		idx[j] = c[j].e, w[j] = c[j].p, s += c[j].p;
	for (int j = 0; j < k && renorm; j++)
		w[j] /= s;
	return k < n ? c[k - 1].p - c[k].p : 1;
}

/* A block of n experts (router (n, h); expert e's gate and up (in, h),
 * down (h, in)) on x (h): y (h) += its output; top k, renorm as above. The
 * chosen experts and weights in idx, w (k; may be NULL); returns the
 * routing margin. */
struct block { int n, h, in, k, renorm; const double *router, **gate, **up, **down; };
static double block_ref(const struct block *b, const double *x, double *y, int32_t *idx, double *w)
{
	double l[64], ww[64], a[256], gg, uu;
	int32_t ii[64];
	for (int e = 0; e < b->n; e++) {
		l[e] = 0;
		for (int i = 0; i < b->h; i++)
			l[e] += b->router[e * b->h + i] * x[i];
	}
	double margin = route_sorted(l, b->n, b->k, b->renorm, ii, ww);
	for (int j = 0; j < b->k; j++) {
		int e = ii[j];
		for (int o = 0; o < b->in; o++) {
			gg = uu = 0;
			for (int i = 0; i < b->h; i++)
				gg += b->gate[e][o * b->h + i] * x[i], uu += b->up[e][o * b->h + i] * x[i];
			a[o] = gg / (1 + exp(-gg)) * uu;
		}
		for (int o = 0; o < b->h; o++) {
			double s = 0;
			for (int i = 0; i < b->in; i++)
				s += b->down[e][o * b->in + i] * a[i];
			y[o] += ww[j] * s;
		}
	}
	if (idx)
		memcpy(idx, ii, sizeof(int32_t) * b->k);
	if (w)
		memcpy(w, ww, sizeof(double) * b->k);
	return margin;
}

/* ---- Qwen2-MoE through the model library -------------------------------- */
enum { QH = 40, QHEADS = 4, QKV = 2, QE = 6, QK = 2, QMI = 24, QSI = 36, QV = 64, QL = 2 };
/* the reference's options: the sigmoid gate used (0: the shared expert
 * unscaled), norm_topk_prob */
struct q2ref { int gate, renorm; };

static void q2_build(uint64_t seed)
{
	x3_rng g;
	x3_rng_seed(&g, seed, 0);
	synth_reset();
	char n[160];
	int hd = QH / QHEADS;
	synth_add("model.embed_tokens.weight", QV, QH, 1.0, 0, &g);
	for (int l = 0; l < QL; l++) {
#define L(x) (snprintf(n, sizeof n, "model.layers.%d." x, l), n)
		synth_add(L("input_layernorm.weight"), QH, 0, 0.1, 1, &g);
		synth_add(L("post_attention_layernorm.weight"), QH, 0, 0.1, 1, &g);
		synth_add(L("self_attn.q_proj.weight"), QHEADS * hd, QH, 1 / sqrt(QH), 0, &g);
		synth_add(L("self_attn.q_proj.bias"), QHEADS * hd, 0, 0.1, 0, &g);
		synth_add(L("self_attn.k_proj.weight"), QKV * hd, QH, 1 / sqrt(QH), 0, &g);
		synth_add(L("self_attn.k_proj.bias"), QKV * hd, 0, 0.1, 0, &g);
		synth_add(L("self_attn.v_proj.weight"), QKV * hd, QH, 1 / sqrt(QH), 0, &g);
		synth_add(L("self_attn.v_proj.bias"), QKV * hd, 0, 0.1, 0, &g);
		synth_add(L("self_attn.o_proj.weight"), QH, QHEADS * hd, 0, 0, &g);   /* zero: no attention */
		synth_add(L("mlp.gate.weight"), QE, QH, 1 / sqrt(QH), 0, &g);
		for (int e = 0; e < QE; e++) {
			char m[160];
#define LE(x) (snprintf(m, sizeof m, "model.layers.%d.mlp.experts.%d." x, l, e), m)
			synth_add(LE("gate_proj.weight"), QMI, QH, 1 / sqrt(QH), 0, &g);
			synth_add(LE("up_proj.weight"), QMI, QH, 1 / sqrt(QH), 0, &g);
			synth_add(LE("down_proj.weight"), QH, QMI, 1 / sqrt(QMI), 0, &g);
#undef LE
		}
		synth_add(L("mlp.shared_expert.gate_proj.weight"), QSI, QH, 1 / sqrt(QH), 0, &g);
		synth_add(L("mlp.shared_expert.up_proj.weight"), QSI, QH, 1 / sqrt(QH), 0, &g);
		synth_add(L("mlp.shared_expert.down_proj.weight"), QH, QSI, 1 / sqrt(QSI), 0, &g);
		synth_add(L("mlp.shared_expert_gate.weight"), 1, QH, 1 / sqrt(QH), 0, &g);
#undef L
	}
	synth_add("model.norm.weight", QH, 0, 0.1, 1, &g);
	synth_add("lm_head.weight", QV, QH, 1 / sqrt(QH), 0, &g);
	synth_round(X3_F32);
}

static int q2_write(const char *dir, int renorm)
{
	return synth_write_model(dir, X3_F32, 0,
	         "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"model_type\": \"qwen2_moe\", "
	         "\"hidden_size\": %d, \"intermediate_size\": 96, \"num_hidden_layers\": %d, "
	         "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"vocab_size\": %d, "
	         "\"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"max_position_embeddings\": 256, "
	         "\"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, "
	         "\"shared_expert_intermediate_size\": %d, \"norm_topk_prob\": %s, \"decoder_sparse_step\": 1, "
	         "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false}",
	         QH, QL, QHEADS, QKV, QV, QE, QK, QMI, QSI, renorm ? "true" : "false");
}

static double q2_margin;   /* the smallest routing margin the reference met */
static void q2_ref(const void *ctx, const int32_t *tok, int n, double *logits)
{
	const struct q2ref *r = ctx;
	const double *gate[QE], *up[QE], *down[QE];
	double h[QH], xn[QH], y[QH], sg[QSI], su[QSI], a[QH];
	for (int t = 0; t < n; t++) {
		memcpy(h, synth_get("model.embed_tokens.weight") + (size_t)tok[t] * QH, sizeof h);
		for (int l = 0; l < QL; l++) {
			for (int e = 0; e < QE; e++) {
				gate[e] = synth_get("model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
				up[e] = synth_get("model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
				down[e] = synth_get("model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
			}
			struct block b = { QE, QH, QMI, QK, r->renorm, synth_get("model.layers.%d.mlp.gate.weight", l),
			                   gate, up, down };
			synth_rms(xn, h, synth_get("model.layers.%d.post_attention_layernorm.weight", l), QH, 1e-6);
			memset(y, 0, sizeof y);
			q2_margin = fmin(q2_margin, block_ref(&b, xn, y, NULL, NULL));
			/* the shared expert, times sigmoid(shared_expert_gate · x) */
			synth_mv(sg, synth_get("model.layers.%d.mlp.shared_expert.gate_proj.weight", l), NULL, xn, QSI, QH);
			synth_mv(su, synth_get("model.layers.%d.mlp.shared_expert.up_proj.weight", l), NULL, xn, QSI, QH);
			for (int i = 0; i < QSI; i++)
				sg[i] = sg[i] / (1 + exp(-sg[i])) * su[i];
			synth_mv(a, synth_get("model.layers.%d.mlp.shared_expert.down_proj.weight", l), NULL, sg, QH, QSI);
			double z;
			synth_mv(&z, synth_get("model.layers.%d.mlp.shared_expert_gate.weight", l), NULL, xn, 1, QH);
			double s = r->gate ? 1 / (1 + exp(-z)) : 1;
			for (int i = 0; i < QH; i++)
				h[i] += y[i] + s * a[i];
		}
		synth_rms(xn, h, synth_get("model.norm.weight"), QH, 1e-6);
		synth_mv(logits + (size_t)t * QV, synth_get("lm_head.weight"), NULL, xn, QV, QH);
	}
}

static float *rnd(x3_rng *g, int64_t n, double s)
{
	float *v = malloc((size_t)n * sizeof *v);
	for (int64_t i = 0; i < n; i++)
		v[i] = (float)(s * x3_rng_normal(g));
	return v;
}

static double maxdiff(const float *a, const float *b, int64_t n, double *scale)
{
	double d = 0, m = 0;
	for (int64_t i = 0; i < n; i++) {
		d = fmax(d, fabs((double)a[i] - b[i]));
		m = fmax(m, fabs((double)b[i]));
	}
	*scale = m;
	return d;
}

/* floats as doubles (malloc'd) */
static double *dbl(const float *v, int64_t n)
{
	double *d = malloc((size_t)n * sizeof *d);
	for (int64_t i = 0; i < n; i++)
		d[i] = v[i];
	return d;
}

int main(void)
{
	x3_rng g;
	x3_rng_seed(&g, 16, 0);
	float *router = rnd(&g, E * H, 1.0), *x = rnd(&g, NT * H, 1.0);
	for (int e = 0; e < E; e++)
		gw[e] = rnd(&g, I * H, 0.2), uw[e] = rnd(&g, I * H, 0.2), dw[e] = rnd(&g, H * I, 0.15);
	float y[NT * H], yr[NT * H], w[NT * E];
	int32_t idx[NT * E], idr[NT * E];
	double wr[NT * E], xd[H], yd1[H];
	const double *dg[E], *du[E], *dd[E];
	for (int e = 0; e < E; e++)
		dg[e] = dbl(gw[e], I * H), du[e] = dbl(uw[e], I * H), dd[e] = dbl(dw[e], H * I);
	double *drouter = dbl(router, E * H);
	for (int renorm = 0; renorm < 2; renorm++) {
		struct x3_moe p = { .n_experts = E, .top_k = 2, .hidden = H, .inter = I, .renorm = renorm,
		                    .router = router, .apply = apply };
		struct block b = { E, H, I, 2, renorm, drouter, dg, du, dd };
		memset(xtx, 0, sizeof xtx), memset(seen, 0, sizeof seen);
		CHECK_OK(x3_moe_route(&p, x, NT, 0, idx, w), "route");
		CHECK_OK(x3_moe_forward(&p, x, NT, 0, y), "forward");
		double margin = 1;
		for (int t = 0; t < NT; t++) {
			for (int i = 0; i < H; i++)
				xd[i] = x[t * H + i], yd1[i] = 0;
			margin = fmin(margin, block_ref(&b, xd, yd1, idr + t * 2, wr + t * 2));
			for (int i = 0; i < H; i++)
				yr[t * H + i] = (float)yd1[i];
		}
		int same = !memcmp(idx, idr, sizeof(int32_t) * NT * 2), wok = 1;
		for (int i = 0; i < NT * 2; i++)
			wok &= fabs(w[i] - wr[i]) < 1e-6;
		CHECK(same && wok && margin > 1e-5,
		      "renorm %d: every token's top-2 experts and weights as the sorted reference (smallest margin %.3g)",
		      renorm, margin);
		double sc, d = maxdiff(y, yr, NT * H, &sc);
		CHECK(d < 1e-5 * sc, "renorm %d: output as the double reference (max diff %.3g of %.3g)", renorm, d, sc);
		if (renorm) {
			double s = 0;
			for (int j = 0; j < 2; j++)
				s += w[5 * 2 + j];
			CHECK(fabs(s - 1) < 1e-6, "renormalized top-k weights sum to 1");
		} else {
			CHECK(w[0] + w[1] < 1, "softmax top-k weights, not renormalized, sum below 1");
		}
		/* the other norm_topk_prob in the reference: the output moves */
		b.renorm = !renorm;
		for (int t = 0; t < NT; t++) {
			for (int i = 0; i < H; i++)
				xd[i] = x[t * H + i], yd1[i] = 0;
			block_ref(&b, xd, yd1, NULL, NULL);
			for (int i = 0; i < H; i++)
				yr[t * H + i] = (float)yd1[i];
		}
		d = maxdiff(y, yr, NT * H, &sc);
		CHECK(d > 1e-2 * sc, "renorm %d: the reference with renorm %d differs (%.3g of %.3g; the check can fail)",
		      renorm, !renorm, d, sc);
		/* the rows each expert saw: exactly the routed ones */
		int hok = 1, any_idle = 0;
		int64_t tot = 0;
		for (int e = 0; e < E; e++) {
			double ref[H * H] = {0};
			int64_t cnt = 0;
			for (int t = 0; t < NT; t++)
				for (int j = 0; j < 2; j++)
					if (idr[t * 2 + j] == e) {
						cnt++;
						for (int a = 0; a < H; a++)
							for (int b = 0; b < H; b++)
								ref[a * H + b] += (double)x[t * H + a] * x[t * H + b];
					}
			hok &= cnt == seen[e] && !memcmp(ref, xtx[e], sizeof ref);
			any_idle |= cnt < NT;
			tot += seen[e];
		}
		CHECK(hok && any_idle && tot == 2 * NT, "each expert's XᵀX is of exactly its routed rows (%lld rows in all)",
		      (long long)tot);
	}

	/* all experts the same, top k = all, renormalized: the dense MLP */
	for (int e = 1; e < E; e++)
		memcpy(gw[e], gw[0], sizeof(float) * I * H), memcpy(uw[e], uw[0], sizeof(float) * I * H),
		memcpy(dw[e], dw[0], sizeof(float) * H * I);
	struct x3_moe p = { .n_experts = E, .top_k = E, .hidden = H, .inter = I, .renorm = 1,
	                    .router = router, .apply = apply };
	CHECK_OK(x3_moe_forward(&p, x, NT, 0, y), "forward, top k = all");
	float gd[NT * I], ud[NT * I], yd[NT * H];
	x3_gemm_xwt(x, NT, 0, H, gw[0], I, gd);
	x3_gemm_xwt(x, NT, 0, H, uw[0], I, ud);
	for (int i = 0; i < NT * I; i++)
		gd[i] = gd[i] / (1.0f + expf(-gd[i])) * ud[i];
	x3_gemm_xwt(gd, NT, 0, I, dw[0], H, yd);
	double sc, d = maxdiff(y, yd, NT * H, &sc);
	CHECK(d < 1e-5 * sc, "identical experts, top k = all: the dense MLP (max diff %.3g of %.3g)", d, sc);
	/* and a block that is not: top 1 of distinct experts differs */
	x3_rng_seed(&g, 17, 0);
	for (int e = 1; e < E; e++)
		for (int i = 0; i < I * H; i++)
			gw[e][i] = (float)(0.2 * x3_rng_normal(&g));
	struct x3_moe p1 = { .n_experts = E, .top_k = 1, .hidden = H, .inter = I, .renorm = 1,
	                     .router = router, .apply = apply };
	CHECK_OK(x3_moe_forward(&p1, x, NT, 0, y), "forward, distinct experts");
	d = maxdiff(y, yd, NT * H, &sc);
	CHECK(d > 1e-2 * sc, "distinct experts are not the dense MLP (the check can fail)");

	/* Qwen2-MoE through the model library */
	CHECK_OK(test_tmpdir("t1558"), "scratch directory");
	q2_build(1558);
	for (int renorm = 0; renorm < 2; renorm++) {
		char dir[32];
		snprintf(dir, sizeof dir, "q2-%d", renorm);
		CHECK_OK(q2_write(test_path(dir), renorm), "Qwen2-MoE checkpoint, norm_topk_prob %s", renorm ? "true" : "false");
		struct q2ref r = { 1, renorm };
		q2_margin = 1;
		double e = synth_compare(test_path(dir), 2, 12, QV, q2_ref, &r, NULL);
		CHECK(e < 2e-6 && q2_margin > 1e-5,
		      "Qwen2-MoE, norm_topk_prob %s: the model's logits are the reference's (rel. error %.3g; "
		      "smallest routing margin %.3g)", renorm ? "true" : "false", e, q2_margin);
		r.gate = 0;
		e = synth_compare(test_path(dir), 2, 12, QV, q2_ref, &r, NULL);
		CHECK(e > 1e-2, "... the reference without the sigmoid shared_expert_gate differs (%.3g; the check can fail)", e);
		r.gate = 1, r.renorm = !renorm;
		e = synth_compare(test_path(dir), 2, 12, QV, q2_ref, &r, NULL);
		CHECK(e > 1e-2, "... the reference with norm_topk_prob %s differs (%.3g; the check can fail)",
		      renorm ? "false" : "true", e);
	}
	test_tmpdir_remove();
	TEST_DONE();
}
