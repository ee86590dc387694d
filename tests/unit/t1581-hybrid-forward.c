/* t1581-hybrid-forward: the Qwen3.5 / Qwen3-Next hybrids written here
 * (seeded, F32) and run by the model library against a double-precision
 * reference written in this file from Hugging Face's modeling_qwen3_next.py
 * and modeling_qwen3_5.py:
 *   - (1 + w) RMSNorms (input, post-attention, final, q/k norms);
 *   - gated full attention: q_proj's rows per head [query | gate], q/k
 *     norms, RoPE (rotate-half) on the first quarter of each head
 *     (partial_rotary_factor's default), the output times sigmoid(gate);
 *   - Gated DeltaNet layers (the token mixing by gdn.h's double reference,
 *     which t1580 checks by hand): in_proj_qkv, in_proj_z, in_proj_b,
 *     in_proj_a, the conv1d stored (channels, 1, kernel), out_proj;
 *   - which layers are which: layer_types, or full_attention_interval;
 *   - the MoE: softmax top-k renormalized, plus the shared expert times
 *     sigmoid(shared_expert_gate . x); experts per key or fused 3-D.
 * Also: Qwen3-Next's fused in_proj_qkvz / in_proj_ba (grouped per key head)
 * holding the same weights give the split form's logits; identical experts
 * give the dense MLP plus the gated shared expert; dropping either gate from
 * the reference moves it far from the model (so the checks see the gates);
 * bad checkpoints (a missing linear_* key, a conv1d of the wrong shape, a
 * fused expert tensor disagreeing with num_experts) fail naming the key or
 * tensor. Widths are not multiples of 128. */
#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include "test.h"
#include "synth.h"
#include "model.h"
#include "arch.h"
#include "gdn.h"
#include "config.h"
#include "reader.h"

struct hy {
	int H, I, layers, heads, kv, hd, vocab;
	int nk, nv, dk, dv, kconv;
	unsigned linear;        /* bit l: layer l is a DeltaNet layer */
	int types;              /* write layer_types (else full_attention_interval 4) */
	int E, K, MI, SI;       /* experts (0: dense), top k, widths */
	int mm, fused_gdn, fused_ex, ident;
	int mtp;                /* the whole MTP layer (dense models), not only mtp.fc */
	/* the reference without: the attention's gate, the shared expert's */
	int no_attn_gate, no_shared_gate;
};
#define THETA 1000.0
#define EPS 1e-6

static const char *pre(const struct hy *s) { return s->mm ? "model.language_model." : "model."; }
static int lin(const struct hy *s, int l) { return s->linear >> l & 1; }
static int cdim(const struct hy *s) { return 2 * s->nk * s->dk + s->nv * s->dv; }

static void build(const struct hy *s, uint64_t seed)
{
	x3_rng g, g0;   /* g0 draws the fused tensors' (overwritten) values, so
	                   that g gives both layouts the same weights */
	x3_rng_seed(&g, seed, 0);
	x3_rng_seed(&g0, seed, 1);
	synth_reset();
	char n[200];
	const char *P = pre(s);
	int H = s->H, cd = cdim(s), vd = s->nv * s->dv;
	x3_gdn_shape gs = { s->nk, s->nv, s->dk, s->dv, s->kconv, EPS };
	snprintf(n, sizeof n, "%sembed_tokens.weight", P);
	synth_add(n, s->vocab, H, 1.0, 0, &g);
	for (int l = 0; l < s->layers; l++) {
#define L(x) (snprintf(n, sizeof n, "%slayers.%d." x, P, l), n)
		synth_add(L("input_layernorm.weight"), H, 0, 0.1, 0, &g);
		synth_add(L("post_attention_layernorm.weight"), H, 0, 0.1, 0, &g);
		if (lin(s, l)) {
			struct synth_tens *qkv = synth_add(L("linear_attn.in_proj_qkv.weight"), cd, H, 1 / sqrt(H), 0, &g);
			struct synth_tens *z = synth_add(L("linear_attn.in_proj_z.weight"), vd, H, 1 / sqrt(H), 0, &g);
			struct synth_tens *b = synth_add(L("linear_attn.in_proj_b.weight"), s->nv, H, 1 / sqrt(H), 0, &g);
			struct synth_tens *a = synth_add(L("linear_attn.in_proj_a.weight"), s->nv, H, 1 / sqrt(H), 0, &g);
			synth_add(L("linear_attn.conv1d.weight"), cd, s->kconv, 0.5, 0, &g)->mid = 1;
			synth_add(L("linear_attn.A_log"), s->nv, 0, 0.5, 0, &g);
			synth_add(L("linear_attn.dt_bias"), s->nv, 0, 0.5, 0, &g);
			synth_add(L("linear_attn.norm.weight"), s->dv, 0, 0.1, 1, &g);
			synth_add(L("linear_attn.out_proj.weight"), H, vd, 1 / sqrt(vd), 0, &g);
			if (s->fused_gdn) {
				/* the same rows regrouped per key head */
				struct synth_tens *f = synth_add(L("linear_attn.in_proj_qkvz.weight"), cd + vd, H, 0, 0, &g0);
				for (int i = 0; i < cd + vd; i++)
					memcpy(f->v + x3_gdn_qkvz_row(&gs, i) * H, i < cd ? qkv->v + (size_t)i * H :
					       z->v + (size_t)(i - cd) * H, sizeof(double) * H);
				struct synth_tens *ba = synth_add(L("linear_attn.in_proj_ba.weight"), 2 * s->nv, H, 0, 0, &g0);
				for (int i = 0; i < 2 * s->nv; i++)
					memcpy(ba->v + x3_gdn_ba_row(&gs, i) * H, i < s->nv ? b->v + (size_t)i * H :
					       a->v + (size_t)(i - s->nv) * H, sizeof(double) * H);
				qkv->omit = z->omit = b->omit = a->omit = 1;
			}
		} else {
			int qd = s->heads * s->hd, kd = s->kv * s->hd;
			synth_add(L("self_attn.q_proj.weight"), 2 * qd, H, 1 / sqrt(H), 0, &g);
			synth_add(L("self_attn.k_proj.weight"), kd, H, 1 / sqrt(H), 0, &g);
			synth_add(L("self_attn.v_proj.weight"), kd, H, 1 / sqrt(H), 0, &g);
			synth_add(L("self_attn.q_norm.weight"), s->hd, 0, 0.1, 0, &g);
			synth_add(L("self_attn.k_norm.weight"), s->hd, 0, 0.1, 0, &g);
			synth_add(L("self_attn.o_proj.weight"), H, qd, 1 / sqrt(qd), 0, &g);
		}
		if (!s->E) {
			synth_add(L("mlp.gate_proj.weight"), s->I, H, 1 / sqrt(H), 0, &g);
			synth_add(L("mlp.up_proj.weight"), s->I, H, 1 / sqrt(H), 0, &g);
			synth_add(L("mlp.down_proj.weight"), H, s->I, 1 / sqrt(s->I), 0, &g);
			continue;
		}
		synth_add(L("mlp.gate.weight"), s->E, H, 1 / sqrt(H), 0, &g);
		struct synth_tens *ex[3 * 64];
		for (int e = 0; e < s->E; e++) {
			char m[200];
#define LE(x) (snprintf(m, sizeof m, "%slayers.%d.mlp.experts.%d." x, P, l, e), m)
			ex[3 * e] = synth_add(LE("gate_proj.weight"), s->MI, H, 1 / sqrt(H), 0, &g);
			ex[3 * e + 1] = synth_add(LE("up_proj.weight"), s->MI, H, 1 / sqrt(H), 0, &g);
			ex[3 * e + 2] = synth_add(LE("down_proj.weight"), H, s->MI, 1 / sqrt(s->MI), 0, &g);
#undef LE
			for (int j = 0; j < 3 && s->ident && e; j++)
				memcpy(ex[3 * e + j]->v, ex[j]->v, sizeof(double) * (size_t)H * s->MI);
		}
		if (s->fused_ex) {
			struct synth_tens *gu = synth_add(L("mlp.experts.gate_up_proj"), s->E * 2 * s->MI, H, 0, 0, &g0);
			gu->mid = 2 * s->MI;
			struct synth_tens *dn = synth_add(L("mlp.experts.down_proj"), s->E * H, s->MI, 0, 0, &g0);
			dn->mid = H;
			size_t ew = (size_t)s->MI * H;
			for (int e = 0; e < s->E; e++) {
				memcpy(gu->v + 2 * e * ew, ex[3 * e]->v, sizeof(double) * ew);
				memcpy(gu->v + (2 * e + 1) * ew, ex[3 * e + 1]->v, sizeof(double) * ew);
				memcpy(dn->v + e * ew, ex[3 * e + 2]->v, sizeof(double) * ew);
				ex[3 * e]->omit = ex[3 * e + 1]->omit = ex[3 * e + 2]->omit = 1;
			}
		}
		synth_add(L("mlp.shared_expert.gate_proj.weight"), s->SI, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.shared_expert.up_proj.weight"), s->SI, H, 1 / sqrt(H), 0, &g);
		synth_add(L("mlp.shared_expert.down_proj.weight"), H, s->SI, 1 / sqrt(s->SI), 0, &g);
		synth_add(L("mlp.shared_expert_gate.weight"), 1, H, 2 / sqrt(H), 0, &g);
#undef L
	}
	snprintf(n, sizeof n, "%snorm.weight", P);
	synth_add(n, H, 0, 0.1, 0, &g);
	synth_add("lm_head.weight", s->vocab, H, 1 / sqrt(H), 0, &g);
	/* the multi-token prediction layer of the real checkpoints (ExLlamaV3's
	 * keys): its projection, norms and one full-attention decoder layer
	 * with the model's MLP; without them (mtp_num_hidden_layers alone) the
	 * model has none */
	if (s->mtp) {
		synth_add("mtp.fc.weight", H, 2 * H, 1 / sqrt(2 * H), 0, &g);
		synth_add("mtp.pre_fc_norm_embedding.weight", H, 0, 0.1, 0, &g);
		synth_add("mtp.pre_fc_norm_hidden.weight", H, 0, 0.1, 0, &g);
		synth_add("mtp.norm.weight", H, 0, 0.1, 0, &g);
		int qd = s->heads * s->hd, kd = s->kv * s->hd;
#define M(x) "mtp.layers.0." x
		synth_add(M("input_layernorm.weight"), H, 0, 0.1, 0, &g);
		synth_add(M("post_attention_layernorm.weight"), H, 0, 0.1, 0, &g);
		synth_add(M("self_attn.q_proj.weight"), 2 * qd, H, 1 / sqrt(H), 0, &g);
		synth_add(M("self_attn.k_proj.weight"), kd, H, 1 / sqrt(H), 0, &g);
		synth_add(M("self_attn.v_proj.weight"), kd, H, 1 / sqrt(H), 0, &g);
		synth_add(M("self_attn.q_norm.weight"), s->hd, 0, 0.1, 0, &g);
		synth_add(M("self_attn.k_norm.weight"), s->hd, 0, 0.1, 0, &g);
		synth_add(M("self_attn.o_proj.weight"), H, qd, 1 / sqrt(qd), 0, &g);
		synth_add(M("mlp.gate_proj.weight"), s->I, H, 1 / sqrt(H), 0, &g);
		synth_add(M("mlp.up_proj.weight"), s->I, H, 1 / sqrt(H), 0, &g);
		synth_add(M("mlp.down_proj.weight"), H, s->I, 1 / sqrt(s->I), 0, &g);
#undef M
	}
	synth_round(X3_F32);
}

static int write_model(const struct hy *s, const char *dir, const char *extra)
{
	char lt[1024] = "", moe[512] = "";
	const char *arch = s->fused_gdn ? "Qwen3NextForCausalLM" :
	                   s->E ? (s->mm ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5MoeForCausalLM") :
	                   (s->mm ? "Qwen3_5ForConditionalGeneration" : "Qwen3_5ForCausalLM");
	const char *mt = s->fused_gdn ? "qwen3_next" : s->E ? (s->mm ? "qwen3_5_moe" : "qwen3_5_moe_text") :
	                 (s->mm ? "qwen3_5" : "qwen3_5_text");
	if (s->types) {
		size_t k = (size_t)snprintf(lt, sizeof lt, "\"layer_types\": [");
		for (int l = 0; l < s->layers; l++)
			k += (size_t)snprintf(lt + k, sizeof lt - k, "%s\"%s\"", l ? ", " : "",
			                      lin(s, l) ? "linear_attention" : "full_attention");
		snprintf(lt + k, sizeof lt - k, "], ");
	} else {
		snprintf(lt, sizeof lt, "\"full_attention_interval\": 4, ");
	}
	if (s->E)
		snprintf(moe, sizeof moe, "\"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, "
		         "\"shared_expert_intermediate_size\": %d, \"norm_topk_prob\": true, %s", s->E, s->K, s->MI, s->SI,
		         s->fused_gdn ? "\"decoder_sparse_step\": 1, \"mlp_only_layers\": [], " : "");
	char text[2048];
	snprintf(text, sizeof text,
	         "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
	         "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d, "
	         "\"rms_norm_eps\": %g, \"max_position_embeddings\": 256, %s%s"
	         "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %g, \"partial_rotary_factor\": 0.25%s}, "
	         "\"linear_num_key_heads\": %d, \"linear_num_value_heads\": %d, \"linear_key_head_dim\": %d, "
	         "\"linear_value_head_dim\": %d, \"linear_conv_kernel_dim\": %d, \"hidden_act\": \"silu\", "
	         "\"attention_bias\": false, \"tie_word_embeddings\": false, \"mtp_num_hidden_layers\": 1%s",
	         s->H, s->I, s->layers, s->heads, s->kv, s->hd, s->vocab, EPS, lt, moe, THETA,
	         s->mm ? ", \"mrope_section\": [1, 1, 0], \"mrope_interleaved\": true" : "",
	         s->nk, s->nv, s->dk, s->dv, s->kconv, extra ? extra : "");
	if (s->mm)
		return synth_write_model(dir, X3_F32, 0, "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", "
		                         "\"text_config\": {\"model_type\": \"%s_text\", %s}, \"vision_config\": "
		                         "{\"depth\": 1}, \"tie_word_embeddings\": false}", arch, mt, mt, text);
	return synth_write_model(dir, X3_F32, 0, "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", %s}", arch,
	                         mt, text);
}

/* ---- the reference (double) ------------------------------------------ */
static void rms1(double *y, const double *x, const double *w, int n)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	double r = 1 / sqrt(ss / n + EPS);
	for (int i = 0; i < n; i++)
		y[i] = x[i] * r * (1 + w[i]);
}

static void rope(double *v, int pos, int hd)
{
	int rd = hd / 4, h = rd / 2;
	for (int i = 0; i < h; i++) {
		double f = 1 / pow(THETA, 2.0 * i / rd), c = cos(pos * f), sn = sin(pos * f);
		double a = v[i], b = v[i + h];
		v[i] = a * c - b * sn;
		v[i + h] = b * c + a * sn;
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

static float *to_f(const double *v, size_t n)
{
	float *f = malloc(sizeof(float) * n);
	for (size_t i = 0; i < n; i++)
		f[i] = (float)v[i];
	return f;
}

/* One decoder layer, its keys under LP ("model.layers.3."), the Gated
 * DeltaNet's when linear, on x (n, H) in place. */
static void ref_layer(const struct hy *s, const char *LP, int linear, double *x, int n)
{
	int H = s->H, nh = s->heads, hd = s->hd, qd = nh * hd, kd = s->kv * hd, cd = cdim(s), vd = s->nv * s->dv;
	double *xn = malloc(sizeof(double) * (size_t)n * H), o[512], y[512];
	double *q = malloc(sizeof(double) * n * qd), *gt = malloc(sizeof(double) * n * qd);
	double *K = malloc(sizeof(double) * n * kd), *V = malloc(sizeof(double) * n * kd), a[512], sc[256], q2[1024];
	x3_gdn_shape gs = { s->nk, s->nv, s->dk, s->dv, s->kconv, EPS };
	{
#define W(x) synth_get("%s" x, LP)
		for (int t = 0; t < n; t++)
			rms1(xn + t * H, x + t * H, W("input_layernorm.weight"), H);
		if (linear) {
			double *mx = malloc(sizeof(double) * n * cd), *zz = malloc(sizeof(double) * n * vd);
			double *bb = malloc(sizeof(double) * n * s->nv), *aa = malloc(sizeof(double) * n * s->nv);
			double *out = malloc(sizeof(double) * n * vd);
			for (int t = 0; t < n; t++) {
				synth_mv(mx + t * cd, W("linear_attn.in_proj_qkv.weight"), NULL, xn + t * H, cd, H);
				synth_mv(zz + t * vd, W("linear_attn.in_proj_z.weight"), NULL, xn + t * H, vd, H);
				synth_mv(bb + t * s->nv, W("linear_attn.in_proj_b.weight"), NULL, xn + t * H, s->nv, H);
				synth_mv(aa + t * s->nv, W("linear_attn.in_proj_a.weight"), NULL, xn + t * H, s->nv, H);
			}
			float *fm = to_f(mx, (size_t)n * cd), *fz = to_f(zz, (size_t)n * vd);
			float *fb = to_f(bb, (size_t)n * s->nv), *fa = to_f(aa, (size_t)n * s->nv);
			float *cw = to_f(W("linear_attn.conv1d.weight"), (size_t)cd * s->kconv);
			float *al = to_f(W("linear_attn.A_log"), s->nv), *dt = to_f(W("linear_attn.dt_bias"), s->nv);
			float *nw = to_f(W("linear_attn.norm.weight"), s->dv);
			x3_gdn_weights gw = { cw, al, dt, nw };
			x3_gdn_reference(&gs, &gw, fm, fz, fb, fa, 1, n, out);
			for (int t = 0; t < n; t++) {
				synth_mv(o, W("linear_attn.out_proj.weight"), NULL, out + t * vd, H, vd);
				for (int i = 0; i < H; i++)
					x[t * H + i] += o[i];
			}
			free(mx), free(zz), free(bb), free(aa), free(out), free(fm), free(fz), free(fb), free(fa);
			free(cw), free(al), free(dt), free(nw);
		} else {
			for (int t = 0; t < n; t++) {
				synth_mv(q2, W("self_attn.q_proj.weight"), NULL, xn + t * H, 2 * qd, H);
				for (int h = 0; h < nh; h++) {
					rms1(q + (t * nh + h) * hd, q2 + h * 2 * hd, W("self_attn.q_norm.weight"), hd);
					memcpy(gt + (t * nh + h) * hd, q2 + h * 2 * hd + hd, sizeof(double) * hd);
					rope(q + (t * nh + h) * hd, t, hd);
				}
				synth_mv(K + t * kd, W("self_attn.k_proj.weight"), NULL, xn + t * H, kd, H);
				synth_mv(V + t * kd, W("self_attn.v_proj.weight"), NULL, xn + t * H, kd, H);
				for (int h = 0; h < s->kv; h++) {
					rms1(K + (t * s->kv + h) * hd, K + (t * s->kv + h) * hd, W("self_attn.k_norm.weight"), hd);
					rope(K + (t * s->kv + h) * hd, t, hd);
				}
			}
			for (int t = 0; t < n; t++) {
				synth_attn(a, q + t * qd, K, V, t + 1, nh, s->kv, hd, sc);
				for (int i = 0; i < qd && !s->no_attn_gate; i++)
					a[i] *= 1 / (1 + exp(-gt[t * qd + i]));
				synth_mv(o, W("self_attn.o_proj.weight"), NULL, a, H, qd);
				for (int i = 0; i < H; i++)
					x[t * H + i] += o[i];
			}
		}
		for (int t = 0; t < n; t++) {
			double xm[512];
			rms1(xm, x + t * H, W("post_attention_layernorm.weight"), H);
			if (!s->E) {
				mlp(o, xm, W("mlp.gate_proj.weight"), W("mlp.up_proj.weight"), W("mlp.down_proj.weight"), H, s->I);
			} else {
				double lg[64], p[64], sum = 0, sg;
				int idx[64];
				synth_mv(lg, W("mlp.gate.weight"), NULL, xm, s->E, H);
				double mxl = -1e300;
				for (int e = 0; e < s->E; e++)
					mxl = fmax(mxl, lg[e]);
				for (int e = 0; e < s->E; e++)
					sum += p[e] = exp(lg[e] - mxl);
				for (int e = 0; e < s->E; e++)
					p[e] /= sum;
				/* top k by probability (the lower index first on ties) */
				for (int j = 0; j < s->K; j++) {
					int best = -1;
					for (int e = 0; e < s->E; e++) {
						int used = 0;
						for (int i = 0; i < j; i++)
							used |= idx[i] == e;
						if (!used && (best < 0 || p[e] > p[best]))
							best = e;
					}
					idx[j] = best;
				}
				double ws = 0;
				for (int j = 0; j < s->K; j++)
					ws += p[idx[j]];
				memset(o, 0, sizeof(double) * H);
				if (s->ident) {
					/* identical experts: the weights sum to 1, one dense MLP */
					mlp(o, xm, W("mlp.experts.0.gate_proj.weight"), W("mlp.experts.0.up_proj.weight"),
					    W("mlp.experts.0.down_proj.weight"), H, s->MI);
				} else {
					for (int j = 0; j < s->K; j++) {
						mlp(y, xm, synth_get("%smlp.experts.%d.gate_proj.weight", LP, idx[j]),
						    synth_get("%smlp.experts.%d.up_proj.weight", LP, idx[j]),
						    synth_get("%smlp.experts.%d.down_proj.weight", LP, idx[j]), H, s->MI);
						for (int i = 0; i < H; i++)
							o[i] += p[idx[j]] / ws * y[i];
					}
				}
				mlp(y, xm, W("mlp.shared_expert.gate_proj.weight"), W("mlp.shared_expert.up_proj.weight"),
				    W("mlp.shared_expert.down_proj.weight"), H, s->SI);
				synth_mv(&sg, W("mlp.shared_expert_gate.weight"), NULL, xm, 1, H);
				sg = s->no_shared_gate ? 1 : 1 / (1 + exp(-sg));
				for (int i = 0; i < H; i++)
					o[i] += sg * y[i];
			}
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
#undef W
	}
	free(xn), free(q), free(gt), free(K), free(V);
}

/* The layers over the embedding of tok: x (n, H), the last hidden state
 * before the final norm */
static double *ref_hidden(const struct hy *s, const int32_t *tok, int n)
{
	const char *P = pre(s);
	int H = s->H;
	double *x = calloc((size_t)n * H, sizeof *x);
	const double *E = synth_get("%sembed_tokens.weight", P);
	for (int t = 0; t < n; t++)
		memcpy(x + t * H, E + (size_t)tok[t] * H, sizeof(double) * H);
	for (int l = 0; l < s->layers; l++) {
		char lp[64];
		snprintf(lp, sizeof lp, "%slayers.%d.", P, l);
		ref_layer(s, lp, lin(s, l), x, n);
	}
	return x;
}

static void ref_forward(const struct hy *s, const int32_t *tok, int n, double *logits)
{
	int H = s->H;
	double *x = ref_hidden(s, tok, n), xn[512];
	for (int t = 0; t < n; t++) {
		rms1(xn, x + t * H, synth_get("%snorm.weight", pre(s)), H);
		synth_mv(logits + (size_t)t * s->vocab, synth_get("lm_head.weight"), NULL, xn, s->vocab, H);
	}
	free(x);
}

/* The multi-token prediction layer (ExLlamaV3's qwen3_5_mtp.py, vLLM's
 * qwen3_next_mtp.py): at t < n - 1, mtp.fc of [pre_fc_norm_embedding(
 * embed(tok[t + 1])) | pre_fc_norm_hidden(h_t)], h_t the main model's
 * state after its final norm; then the full-attention layer mtp.layers.0
 * over positions 0..n-2, mtp.norm, lm_head: logits (n - 1, vocab) */
static void ref_mtp(const struct hy *s, const int32_t *tok, int n, int swap, double *logits)
{
	int H = s->H, eo = swap ? H : 0, ho = swap ? 0 : H;
	double *x = ref_hidden(s, tok, n), *u = malloc(sizeof(double) * (size_t)(n - 1) * H);
	double h[512], cat[1024], xn[512];
	const double *E = synth_get("%sembed_tokens.weight", pre(s));
	for (int t = 0; t < n - 1; t++) {
		rms1(h, x + t * H, synth_get("%snorm.weight", pre(s)), H);
		rms1(cat + ho, h, synth_get("mtp.pre_fc_norm_hidden.weight"), H);
		rms1(cat + eo, E + (size_t)tok[t + 1] * H, synth_get("mtp.pre_fc_norm_embedding.weight"), H);
		synth_mv(u + t * H, synth_get("mtp.fc.weight"), NULL, cat, H, 2 * H);
	}
	ref_layer(s, "mtp.layers.0.", 0, u, n - 1);
	for (int t = 0; t < n - 1; t++) {
		rms1(xn, u + t * H, synth_get("mtp.norm.weight"), H);
		synth_mv(logits + (size_t)t * s->vocab, synth_get("lm_head.weight"), NULL, xn, s->vocab, H);
	}
	free(x), free(u);
}

/* The model's MTP logits of tok (rows of cols) against ref_mtp's: the max
 * relative error; swap: against the reference with the halves of its input
 * swapped */
static double mtp_compare(const struct hy *s, const char *dir, const int32_t *tok, int rows, int cols, int swap)
{
	x3_model *m;
	if (x3_model_open(dir, NULL, &m)) {
		printf("# %s\n", x3_errmsg());
		return INFINITY;
	}
	size_t nl = (size_t)rows * (cols - 1) * s->vocab;
	float *lg = malloc(sizeof(float) * nl);
	double *ref = malloc(sizeof(double) * nl);
	struct x3_forward_opts fo;
	x3_forward_opts_init(&fo, m);
	fo.mtp_logits = lg;
	int rc = x3_model_forward(m, tok, rows, cols, &fo);
	if (rc)
		printf("# %s\n", x3_errmsg());
	x3_model_close(m);
	double num = 0, den = 0;
	for (int r = 0; r < rows && !rc; r++) {
		ref_mtp(s, tok + r * cols, cols, swap, ref + (size_t)r * (cols - 1) * s->vocab);
	}
	for (size_t i = 0; i < nl && !rc; i++) {
		num = fmax(num, fabs(lg[i] - ref[i]));
		den = fmax(den, fabs(ref[i]));
	}
	free(lg), free(ref);
	return rc ? INFINITY : num / den;
}

static void ref_rows(const void *ctx, const int32_t *tok, int n, double *logits)
{
	ref_forward(ctx, tok, n, logits);
}

/* the model does not open dir; its message names want */
static int refused(const char *dir, const char *want)
{
	x3_model *m;
	if (!x3_model_open(dir, NULL, &m)) {
		x3_model_close(m);
		return 0;
	}
	if (!strstr(x3_errmsg(), want))
		printf("# %s: got '%s'\n", dir, x3_errmsg());
	return strstr(x3_errmsg(), want) != NULL;
}

int main(void)
{
	x3_model_config c0;
	if (test_tmpdir("t1581")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	/* H I layers heads kv hd vocab | nk nv dk dv kconv | linear types | E K MI SI | mm fused_gdn fused_ex ident mtp */
	struct hy d = { 40, 56, 4, 2, 1, 16, 60, 2, 4, 12, 10, 4, 0x7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 };
	build(&d, 1);
	CHECK_OK(write_model(&d, test_path("dense"), NULL), "write Qwen3_5ForCausalLM: 4 layers, "
	         "full_attention_interval 4, DeltaNet 2/4 heads of 12/10, gated attention 2/1 heads of 16");
	x3_model *m;
	CHECK_OK(x3_model_open(test_path("dense"), NULL, &m), "open it");
	if (m) {
		const x3_model_config *c = x3_model_cfg(m);
		CHECK(c->hybrid && c->norm_offset && c->lin_nk == 2 && c->lin_nv == 4 && c->rot_dim == 4 &&
		      x3_arch_linear_layer(c, 0) && x3_arch_linear_layer(c, 2) && !x3_arch_linear_layer(c, 3),
		      "config: layers 0-2 DeltaNet, 3 full attention, a quarter of each head rotated");
		x3_model_close(m);
	}
	double e = synth_compare(test_path("dense"), 2, 70, d.vocab, ref_rows, &d, NULL);
	CHECK(e < 1e-4, "forward == the reference over rows of 70 (rel err %.2g)", e);
	d.no_attn_gate = 1;
	e = synth_compare(test_path("dense"), 1, 20, d.vocab, ref_rows, &d, NULL);
	CHECK(e > 1e-2, "the reference without the attention's sigmoid gate is far from the model (%.2g)", e);
	d.no_attn_gate = 0;

	/* the multi-token prediction layer against its reference */
	struct hy dm = d;
	dm.mtp = 1;
	build(&dm, 5);
	CHECK_OK(write_model(&dm, test_path("mtp"), NULL), "write Qwen3_5ForCausalLM with its whole MTP layer");
	{
		x3_model_config mc;
		CHECK(!x3_config_load(test_path("mtp"), &mc) && mc.n_mtp == 1 && !x3_config_load(test_path("dense"), &c0) &&
		      c0.n_mtp == 0, "the MTP layer is the model's when the checkpoint holds it (n_mtp 1), not with "
		      "mtp_num_hidden_layers alone");
		x3_rng g;
		x3_rng_seed(&g, 9, 0);
		int32_t tok[2 * 30];
		for (int i = 0; i < 60; i++)
			tok[i] = (int32_t)(x3_rng_u64(&g) % (uint64_t)dm.vocab);
		e = mtp_compare(&dm, test_path("mtp"), tok, 2, 30, 0);
		CHECK(e < 1e-4, "the MTP layer's logits == the reference over rows of 30 (rel err %.2g)", e);
		e = mtp_compare(&dm, test_path("mtp"), tok, 1, 30, 1);
		CHECK(e > 1e-2, "... and far from a reference reading [hidden | embedding] (%.2g)", e);
	}

	/* Qwen3.5-MoE's hub layout: text under model.language_model., experts
	 * fused 3-D, layer_types with two full-attention layers */
	struct hy mo = { 48, 40, 3, 2, 2, 16, 60, 1, 2, 16, 12, 3, 0x5, 1, 6, 2, 10, 14, 1, 0, 1, 0, 0, 0, 0 };
	build(&mo, 2);
	CHECK_OK(write_model(&mo, test_path("moe"), NULL), "write Qwen3_5MoeForConditionalGeneration: experts "
	         "fused (6, 20, 48) and (6, 48, 10), shared expert 14, layer_types");
	e = synth_compare(test_path("moe"), 2, 33, mo.vocab, ref_rows, &mo, NULL);
	CHECK(e < 1e-4, "forward == the reference (rel err %.2g)", e);
	mo.no_shared_gate = 1;
	e = synth_compare(test_path("moe"), 1, 20, mo.vocab, ref_rows, &mo, NULL);
	CHECK(e > 1e-2, "the reference without shared_expert_gate is far from the model (%.2g)", e);
	mo.no_shared_gate = 0;

	/* identical experts: the dense MLP plus the gated shared expert */
	struct hy id = mo;
	id.ident = 1, id.mm = 0, id.fused_ex = 0;
	build(&id, 3);
	CHECK_OK(write_model(&id, test_path("ident"), NULL), "write Qwen3_5MoeForCausalLM with 6 identical experts");
	e = synth_compare(test_path("ident"), 1, 25, id.vocab, ref_rows, &id, NULL);
	CHECK(e < 1e-4, "identical experts == one dense MLP + sigmoid(gate) shared expert (rel err %.2g)", e);

	/* Qwen3-Next: the fused projections of the same weights */
	struct hy sp = mo, nx = mo;
	sp.mm = 0, sp.fused_ex = 0, sp.linear = 0x7, sp.types = 0, sp.layers = 4;
	nx = sp;
	nx.fused_gdn = 1;
	build(&sp, 4);
	CHECK_OK(write_model(&sp, test_path("split"), NULL), "write Qwen3_5MoeForCausalLM (split projections)");
	build(&nx, 4);
	CHECK_OK(write_model(&nx, test_path("next"), NULL), "write Qwen3NextForCausalLM: the same weights, "
	         "in_proj_qkvz / in_proj_ba grouped per key head, experts per key");
	float *l1 = NULL, *l2 = NULL;
	e = synth_compare(test_path("next"), 2, 40, nx.vocab, ref_rows, &nx, &l1);
	CHECK(e < 1e-4, "Qwen3-Next forward == the reference (rel err %.2g)", e);
	e = synth_compare(test_path("split"), 2, 40, sp.vocab, ref_rows, &sp, &l2);
	CHECK(e < 1e-4, "the split form == the reference (rel err %.2g)", e);
	CHECK(l1 && l2 && test_max_rel(l1, l2, (size_t)2 * 40 * nx.vocab) < 1e-5,
	      "the fused projections regrouped give the split form's logits (rel %.2g)",
	      l1 && l2 ? test_max_rel(l1, l2, (size_t)2 * 40 * nx.vocab) : -1.0);
	free(l1), free(l2);

	/* the reader contract: ExLlamaV3's Qwen3-Next follows
	 * full_attention_interval alone and builds every layer with experts */
	x3_model_config c;
	CHECK(!x3_config_load(test_path("next"), &c) && x3_reader_loads(X3_READER_EXLLAMAV3, &c),
	      "ExLlamaV3 loads the Qwen3-Next checkpoint");
	struct hy lt = nx;
	lt.types = 1, lt.linear = 0x5;
	build(&lt, 4);
	CHECK(!write_model(&lt, test_path("next-types"), NULL) && !x3_config_load(test_path("next-types"), &c) &&
	      !x3_reader_loads(X3_READER_EXLLAMAV3, &c) && x3_reader_loads(X3_READER_STRICT, &c),
	      "... not one whose layer_types disagree with full_attention_interval (4)");
	CHECK(!write_model(&nx, test_path("next-dense"), ", \"mlp_only_layers\": [1]") &&
	      !x3_config_load(test_path("next-dense"), &c) && !x3_reader_loads(X3_READER_EXLLAMAV3, &c),
	      "... nor one with a dense layer (mlp_only_layers)");
	CHECK(!write_model(&sp, test_path("split"), NULL) && !x3_config_load(test_path("split"), &c) &&
	      !x3_reader_loads(X3_READER_EXLLAMAV3, &c),
	      "ExLlamaV3 v1.4.1 does not load Qwen3_5MoeForCausalLM (only ...ForConditionalGeneration)");

	/* bad checkpoints */
	build(&d, 1);
	CHECK(!write_model(&d, test_path("nokey"), ", \"linear_num_value_heads\": null") &&
	      refused(test_path("nokey"), "linear_num_value_heads"), "a missing linear_num_value_heads is refused "
	      "naming it");
	for (int i = 0; i < synth_n; i++)
		if (strstr(synth_t[i].name, "layers.1.linear_attn.conv1d.weight"))
			synth_t[i].r = cdim(&d) - 1;   /* one channel short */
	CHECK(!write_model(&d, test_path("conv"), NULL) && refused(test_path("conv"), "layers.1.linear_attn.conv1d.weight"),
	      "a conv1d of the wrong shape is refused naming the tensor");
	struct hy bx = mo;
	build(&bx, 2);
	bx.E = 5;   /* the config says 5, the fused tensors hold 6 */
	CHECK(!write_model(&bx, test_path("experts"), NULL) &&
	      refused(test_path("experts"), "mlp.experts.gate_up_proj"),
	      "num_experts disagreeing with the fused expert tensors is refused naming the tensor");
	synth_reset();
	test_tmpdir_remove();
	TEST_DONE();
}
