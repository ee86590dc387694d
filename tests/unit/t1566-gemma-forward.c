/* t1566-gemma-forward: Gemma 2 and Gemma 3 (Gemma2ForCausalLM,
 * Gemma3ForCausalLM, the text part of Gemma3ForConditionalGeneration)
 * written here (seeded) and run by the model library: the logits match a
 * plain double-precision reference written in this file from Hugging
 * Face's modeling_gemma2.py / modeling_gemma3.py (transformers is not
 * available here, so the reference is this file's loops):
 *   - the embedding times sqrt(hidden_size) rounded to the embedding's
 *     dtype (BF16 here: sqrt(40) = 6.3246 -> 6.3125);
 *   - RMSNorms scaling by 1 + w: input, post-attention (on the attention's
 *     output, before the residual), pre- and post-feed-forward, final, and
 *     Gemma3's per-head q/k norms;
 *   - softmax scale query_pre_attn_scalar^-0.5 (not head_dim's), attention
 *     scores soft-capped cap * tanh(s / cap) (Gemma2), the final logits
 *     alike;
 *   - sliding layers (Gemma2: even layers; Gemma3: sliding_window_pattern
 *     or layer_types) see the keys i - sliding_window < j <= i only, and
 *     in Gemma3 rotate with rope_local_base_freq without rope_scaling
 *     while the global layers take rope_theta with linear scaling;
 *   - the GELU (tanh) gated MLP; a tied head or lm_head.
 * head_dim is independent of hidden/heads (10 x 3 heads with hidden 40),
 * no dimension is a multiple of 128. Each feature is shown to matter: the
 * reference without it differs from the model. Bad inputs fail naming the
 * tensor or key. */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test.h"
#include "model.h"
#include "safetensors.h"
#include "synth.h"

struct gm {
	int g3, mm, tied, bf16;         /* Gemma3, under language_model., tied head, BF16 embedding */
	int hidden, inter, layers, heads, kv, hd, vocab;
	double qpas, acap, fcap;        /* query_pre_attn_scalar, soft-caps (0: none) */
	int window, pattern;            /* sliding_window; Gemma3's pattern (0: layer_types) */
	const char *types;              /* layer_types: 's'liding / 'f'ull per layer, or NULL */
	double theta, local, factor;    /* rope_theta, rope_local_base_freq, linear factor (0: none) */
};
/* what the reference leaves out (to show that it matters) */
enum { NO_WINDOW = 1, NO_ACAP = 2, NO_FCAP = 4, NO_ONE = 8, NO_LOCAL = 16, NO_EMBSCALE = 32,
       HEAD_DIM_SCALE = 64, NO_ROUND = 128 };

/* synth_add's tensor with the values the checkpoint stores: F32, or BF16
 * (round16) */
static void add(const char *name, int r, int c, double scale, double mean, int round16, x3_rng *g)
{
	struct synth_tens *t = synth_add(name, r, c, scale, mean, g);
	for (int i = 0; i < r * (c ? c : 1); i++) {
		float f = (float)t->v[i];
		t->v[i] = round16 ? x3_bf16_to_f32(x3_f32_to_bf16(f)) : f;
	}
}

static const char *pfx(const struct gm *s) { return s->mm ? "language_model.model." : "model."; }

static const double *get(const struct gm *s, const char *fmt, int l)
{
	char n[160], k[200];
	snprintf(n, sizeof n, fmt, l);
	snprintf(k, sizeof k, "%s%s", strncmp(n, "lm_head", 7) ? pfx(s) : s->mm ? "language_model." : "", n);
	return synth_get("%s", k);
}

static void build(const struct gm *s, uint64_t seed)
{
	x3_rng g;
	x3_rng_seed(&g, seed, 0);
	synth_reset();
	char n[200];
	int H = s->hidden, qd = s->heads * s->hd, kd = s->kv * s->hd;
	const char *P = pfx(s);
#define N(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
	add(N("%sembed_tokens.weight", P), s->vocab, H, 1 / sqrt(H), 0, s->bf16, &g);
	for (int l = 0; l < s->layers; l++) {
		add(N("%slayers.%d.input_layernorm.weight", P, l), H, 0, 0.3, 0, 0, &g);
		add(N("%slayers.%d.self_attn.q_proj.weight", P, l), qd, H, 1 / sqrt(H), 0, 0, &g);
		add(N("%slayers.%d.self_attn.k_proj.weight", P, l), kd, H, 1 / sqrt(H), 0, 0, &g);
		add(N("%slayers.%d.self_attn.v_proj.weight", P, l), kd, H, 1 / sqrt(H), 0, 0, &g);
		if (s->g3) {
			add(N("%slayers.%d.self_attn.q_norm.weight", P, l), s->hd, 0, 0.3, 0, 0, &g);
			add(N("%slayers.%d.self_attn.k_norm.weight", P, l), s->hd, 0, 0.3, 0, 0, &g);
		}
		add(N("%slayers.%d.self_attn.o_proj.weight", P, l), H, qd, 1 / sqrt(qd), 0, 0, &g);
		add(N("%slayers.%d.post_attention_layernorm.weight", P, l), H, 0, 0.3, 0, 0, &g);
		add(N("%slayers.%d.pre_feedforward_layernorm.weight", P, l), H, 0, 0.3, 0, 0, &g);
		add(N("%slayers.%d.mlp.gate_proj.weight", P, l), s->inter, H, 2 / sqrt(H), 0, 0, &g);
		add(N("%slayers.%d.mlp.up_proj.weight", P, l), s->inter, H, 1 / sqrt(H), 0, 0, &g);
		add(N("%slayers.%d.mlp.down_proj.weight", P, l), H, s->inter, 1 / sqrt(s->inter), 0, 0, &g);
		add(N("%slayers.%d.post_feedforward_layernorm.weight", P, l), H, 0, 0.3, 0, 0, &g);
	}
	add(N("%snorm.weight", P), H, 0, 0.3, 0, 0, &g);
	if (!s->tied)
		add(s->mm ? "language_model.lm_head.weight" : "lm_head.weight", s->vocab, H, 3 / sqrt(H), 0, 0, &g);
	if (s->mm) {   /* stand-ins for the vision tower and the projector */
		add("vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight", 8, 8, 1, 0, 0, &g);
		add("multi_modal_projector.mm_input_projection_weight", 8, H, 1, 0, 0, &g);
	}
#undef N
}

/* the text model's config keys */
static void text_keys(const struct gm *s, char *js, size_t n)
{
	size_t k = 0;
	k += (size_t)snprintf(js + k, n - k,
	        "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
	        "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
	        "\"vocab_size\": %d, \"query_pre_attn_scalar\": %g, \"sliding_window\": %d, "
	        "\"rope_theta\": %g, \"max_position_embeddings\": 256",
	        s->hidden, s->inter, s->layers, s->heads, s->kv, s->hd, s->vocab, s->qpas, s->window, s->theta);
	if (!s->mm)   /* the multimodal one leaves them to the defaults (1e-6, gelu_pytorch_tanh, tied) */
		k += (size_t)snprintf(js + k, n - k, ", \"rms_norm_eps\": 1e-6, \"hidden_activation\": "
		                      "\"gelu_pytorch_tanh\", \"tie_word_embeddings\": %s", s->tied ? "true" : "false");
	else if (!s->tied)
		k += (size_t)snprintf(js + k, n - k, ", \"tie_word_embeddings\": false");
	if (s->acap)
		k += (size_t)snprintf(js + k, n - k, ", \"attn_logit_softcapping\": %g", s->acap);
	else if (!s->g3)   /* Gemma2's default is 50 */
		k += (size_t)snprintf(js + k, n - k, ", \"attn_logit_softcapping\": null");
	k += (size_t)snprintf(js + k, n - k, ", \"final_logit_softcapping\": ");
	k += (size_t)snprintf(js + k, n - k, s->fcap ? "%g" : "null", s->fcap);
	if (s->g3 && s->local)
		k += (size_t)snprintf(js + k, n - k, ", \"rope_local_base_freq\": %g", s->local);
	if (s->factor)
		k += (size_t)snprintf(js + k, n - k, ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": %g}",
		                      s->factor);
	if (s->g3 && s->pattern)
		k += (size_t)snprintf(js + k, n - k, ", \"sliding_window_pattern\": %d", s->pattern);
	if (s->types) {
		k += (size_t)snprintf(js + k, n - k, ", \"layer_types\": [");
		for (int l = 0; s->types[l]; l++)
			k += (size_t)snprintf(js + k, n - k, "%s\"%s\"", l ? ", " : "",
			                      s->types[l] == 's' ? "sliding_attention" : "full_attention");
		k += (size_t)snprintf(js + k, n - k, "]");
	}
}

/* the embedding in BF16 (Gemma's checkpoints), the rest as written */
static x3_dtype embed_bf16(const char *name, x3_dtype dt)
{
	return strstr(name, "embed_tokens") ? X3_BF16 : dt;
}

static int write_model(const struct gm *s, const char *dir, const char *extra)
{
	int rc;
	if ((rc = synth_write_as(dir, X3_F32, s->bf16 ? embed_bf16 : NULL, 0)))
		return rc;
	char tk[2048];
	text_keys(s, tk, sizeof tk);
	if (s->mm)
		return synth_write_config(dir, "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": "
		         "\"gemma3\", \"mm_tokens_per_image\": 4, \"text_config\": {\"model_type\": \"gemma3_text\", "
		         "%s}, \"vision_config\": {\"hidden_size\": 8, \"num_attention_heads\": 2, \"patch_size\": 14}%s}",
		         tk, extra ? extra : "");
	return synth_write_config(dir, "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", %s%s}",
	                          s->g3 ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM", s->g3 ? "gemma3_text" : "gemma2",
	                          tk, extra ? extra : "");
}

/* ---- the reference (double, token by token) -------------------------- */
static void rms1p(double *y, const double *x, const double *w, int n, int one)
{
	double s = 0;
	for (int i = 0; i < n; i++)
		s += x[i] * x[i];
	s = 1 / sqrt(s / n + 1e-6);
	for (int i = 0; i < n; i++)
		y[i] = x[i] * s * ((one ? 1 : 0) + w[i]);
}

static int sliding(const struct gm *s, int l)
{
	if (s->types)
		return s->types[l] == 's';
	if (!s->g3)
		return l % 2 == 0;
	return (l + 1) % (s->pattern ? s->pattern : 6) != 0;
}

/* rotate-half RoPE of one head vector at position pos */
static void rope(double *v, int pos, int hd, double theta, double factor)
{
	for (int i = 0; i < hd / 2; i++) {
		double inv = pow(theta, -2.0 * i / hd) / (factor > 0 ? factor : 1);
		double a = v[i], b = v[i + hd / 2], c = cos(pos * inv), sn = sin(pos * inv);
		v[i] = a * c - b * sn;
		v[i + hd / 2] = b * c + a * sn;
	}
}

static void ref_forward(const struct gm *s, const int32_t *tok, int n, double *logits, unsigned no)
{
	int H = s->hidden, I = s->inter, hd = s->hd, nh = s->heads, nkv = s->kv, qd = nh * hd, kd = nkv * hd;
	int one = !(no & NO_ONE);
	double *x = calloc((size_t)n * H, sizeof *x), *h = malloc(sizeof(double) * H);
	double *q = malloc(sizeof(double) * (size_t)n * qd), *k = malloc(sizeof(double) * (size_t)n * kd);
	double *v = malloc(sizeof(double) * (size_t)n * kd), *a = malloc(sizeof(double) * qd);
	double *o = malloc(sizeof(double) * H), *g = malloc(sizeof(double) * I), *u = malloc(sizeof(double) * I);
	double *p = malloc(sizeof(double) * n);
	const double *E = get(s, "embed_tokens.weight", 0);
	double nrm = no & NO_EMBSCALE ? 1 : s->bf16 && !(no & NO_ROUND) ? x3_bf16_to_f32(x3_f32_to_bf16((float)sqrt(H))) : (double)(float)sqrt(H);
	for (int t = 0; t < n; t++)
		for (int i = 0; i < H; i++)
			x[t * H + i] = E[(size_t)tok[t] * H + i] * nrm;
	for (int l = 0; l < s->layers; l++) {
		int sw = sliding(s, l);
		double theta = s->g3 && sw && !(no & NO_LOCAL) ? s->local : s->theta;
		double factor = s->g3 && sw && !(no & NO_LOCAL) ? 0 : s->factor;
		for (int t = 0; t < n; t++) {
			rms1p(h, x + t * H, get(s, "layers.%d.input_layernorm.weight", l), H, one);
			synth_mv(q + t * qd, get(s, "layers.%d.self_attn.q_proj.weight", l), NULL, h, qd, H);
			synth_mv(k + t * kd, get(s, "layers.%d.self_attn.k_proj.weight", l), NULL, h, kd, H);
			synth_mv(v + t * kd, get(s, "layers.%d.self_attn.v_proj.weight", l), NULL, h, kd, H);
			for (int e = 0; e < nh; e++) {
				if (s->g3)
					rms1p(q + t * qd + e * hd, q + t * qd + e * hd,
					      get(s, "layers.%d.self_attn.q_norm.weight", l), hd, one);
				rope(q + t * qd + e * hd, t, hd, theta, factor);
			}
			for (int e = 0; e < nkv; e++) {
				if (s->g3)
					rms1p(k + t * kd + e * hd, k + t * kd + e * hd,
					      get(s, "layers.%d.self_attn.k_norm.weight", l), hd, one);
				rope(k + t * kd + e * hd, t, hd, theta, factor);
			}
		}
		double scale = no & HEAD_DIM_SCALE ? 1 / sqrt(hd) : 1 / sqrt(s->qpas);
		for (int t = 0; t < n; t++) {
			int lo = sw && !(no & NO_WINDOW) && t >= s->window ? t - s->window + 1 : 0;
			synth_attn_ex(a, q + t * qd, k, v, t + 1, lo, nh, nkv, hd, hd, scale,
			              s->acap && !(no & NO_ACAP) ? s->acap : 0, p);
			synth_mv(o, get(s, "layers.%d.self_attn.o_proj.weight", l), NULL, a, H, qd);
			rms1p(o, o, get(s, "layers.%d.post_attention_layernorm.weight", l), H, one);
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
		for (int t = 0; t < n; t++) {
			rms1p(h, x + t * H, get(s, "layers.%d.pre_feedforward_layernorm.weight", l), H, one);
			synth_mv(g, get(s, "layers.%d.mlp.gate_proj.weight", l), NULL, h, I, H);
			synth_mv(u, get(s, "layers.%d.mlp.up_proj.weight", l), NULL, h, I, H);
			for (int i = 0; i < I; i++)
				g[i] = 0.5 * g[i] * (1 + tanh(sqrt(2 / M_PI) * (g[i] + 0.044715 * g[i] * g[i] * g[i]))) * u[i];
			synth_mv(o, get(s, "layers.%d.mlp.down_proj.weight", l), NULL, g, H, I);
			rms1p(o, o, get(s, "layers.%d.post_feedforward_layernorm.weight", l), H, one);
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
	}
	const double *W = s->tied ? E : get(s, "lm_head.weight", 0);
	for (int t = 0; t < n; t++) {
		rms1p(h, x + t * H, get(s, "norm.weight", 0), H, one);
		synth_mv(logits + (size_t)t * s->vocab, W, NULL, h, s->vocab, H);
		for (int i = 0; s->fcap && !(no & NO_FCAP) && i < s->vocab; i++)
			logits[(size_t)t * s->vocab + i] = s->fcap * tanh(logits[(size_t)t * s->vocab + i] / s->fcap);
	}
	free(x), free(h), free(q), free(k), free(v), free(a), free(o), free(g), free(u), free(p);
}

/* the reference of one row for synth_compare_tok: ref_forward(s, ..., no) */
struct refc { const struct gm *s; unsigned no; };
static void ref_row(const void *ctx, const int32_t *tok, int n, double *logits)
{
	const struct refc *c = ctx;
	ref_forward(c->s, tok, n, logits, c->no);
}

/* max |model - reference(no)| / max |reference| over rows x cols tokens
 * (i * 7 + 3 + i / cols) mod vocab (synth_compare_tok) */
static double compare(const struct gm *s, const char *dir, int rows, int cols, unsigned no)
{
	int32_t *tok = malloc(sizeof(int32_t) * rows * cols);
	for (int i = 0; i < rows * cols; i++)
		tok[i] = (i * 7 + 3 + i / cols) % s->vocab;
	struct refc c = { s, no };
	double e = synth_compare_tok(dir, tok, rows, cols, s->vocab, ref_row, &c, NULL);
	free(tok);
	return e;
}


/* the model in DIR fails to open with a message containing WANT */
static int bad_open(const char *dir, const char *want)
{
	x3_model *m;
	int rc = x3_model_open(dir, NULL, &m);
	if (!rc) {
		x3_model_close(m);
		printf("# %s: opened\n", dir);
		return 0;
	}
	if (!strstr(x3_errmsg(), want))
		printf("# %s: got '%s'\n", dir, x3_errmsg());
	return strstr(x3_errmsg(), want) != NULL;
}

static int bad(const struct gm *s, const char *name, const char *extra, const char *want)
{
	return !write_model(s, test_path(name), extra) && bad_open(test_path(name), want);
}

/* features that must matter: the reference without each differs */
static void matters(const struct gm *s, const char *dir, const char *what, unsigned no, double by)
{
	double e = compare(s, dir, 1, 13, no);
	CHECK(e > by, "... and without %s the reference differs (rel %.3g > %g)", what, e, by);
}

int main(void)
{
	if (test_tmpdir("t1566")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	/* g3 mm tied bf16 | hidden inter layers heads kv hd vocab | qpas acap fcap |
	 * window pattern types | theta local factor */
	struct gm a = { 0, 0, 1, 1, 40, 56, 3, 3, 1, 10, 50, 14, 1.5, 3.0, 5, 0, NULL, 100, 0, 0 };
	build(&a, 1);
	CHECK_OK(write_model(&a, test_path("a"), NULL), "write Gemma2: hidden 40, 3 heads of 10, 1 kv head, "
	         "query_pre_attn_scalar 14, soft-caps 1.5 / 3, window 5, BF16 embedding, tied head");
	x3_model *m;
	CHECK_OK(x3_model_open(test_path("a"), NULL, &m), "open it");
	if (m) {
		const x3_model_config *c = x3_model_cfg(m);
		CHECK(c->gemma && c->act_gelu_tanh && fabs(c->attn_scale - 1 / sqrt(14.0)) < 1e-12 &&
		      c->attn_softcap == 1.5 && c->final_softcap == 3.0 && c->sliding_window == 5 && c->tied &&
		      c->swa_layers[0] == 5 && c->rope_local_theta == 0,
		      "config: Gemma2, scale 14^-0.5, caps, layers 0 and 2 sliding, tied");
		x3_model_close(m);
	}
	double e = compare(&a, test_path("a"), 2, 13, 0);
	CHECK(e < 1e-5, "Gemma2 forward == the reference (rel err %.2g)", e);
	matters(&a, test_path("a"), "the sliding window", NO_WINDOW, 1e-3);
	matters(&a, test_path("a"), "the attention soft-cap", NO_ACAP, 1e-3);
	matters(&a, test_path("a"), "the final soft-cap", NO_FCAP, 1e-3);
	matters(&a, test_path("a"), "the 1 + w norms", NO_ONE, 1e-3);
	matters(&a, test_path("a"), "the embedding scale", NO_EMBSCALE, 1e-3);
	matters(&a, test_path("a"), "query_pre_attn_scalar", HEAD_DIM_SCALE, 1e-3);
	matters(&a, test_path("a"), "the BF16 rounding of sqrt(hidden_size)", NO_ROUND, 2e-5);

	struct gm b = { 1, 0, 0, 0, 48, 40, 3, 4, 2, 12, 50, 12, 0, 0, 4, 3, NULL, 1000, 10, 4 };
	build(&b, 2);
	CHECK_OK(write_model(&b, test_path("b"), NULL), "write Gemma3ForCausalLM: q/k norms, sliding_window_pattern 3, "
	         "rope_theta 1000 with linear factor 4 (global), rope_local_base_freq 10 (sliding), lm_head");
	e = compare(&b, test_path("b"), 2, 11, 0);
	CHECK(e < 1e-5, "Gemma3 forward == the reference (rel err %.2g)", e);
	matters(&b, test_path("b"), "the local RoPE base", NO_LOCAL, 1e-3);
	matters(&b, test_path("b"), "the sliding window", NO_WINDOW, 1e-3);
	matters(&b, test_path("b"), "the 1 + w norms (q/k norms included)", NO_ONE, 1e-3);

	struct gm c = { 1, 1, 1, 0, 40, 36, 3, 2, 2, 14, 50, 20, 0, 0, 3, 0, "fsf", 500, 10000, 0 };
	build(&c, 3);
	CHECK_OK(write_model(&c, test_path("c"), NULL), "write Gemma3ForConditionalGeneration: language_model.model. "
	         "keys, text_config without rms_norm_eps / hidden_activation / tie_word_embeddings (the "
	         "defaults), layer_types full/sliding/full, a vision tower and projector");
	if (!x3_model_open(test_path("c"), NULL, &m)) {
		const x3_model_config *cc = x3_model_cfg(m);
		CHECK(cc->tied && cc->rms_eps == 1e-6 && cc->act_gelu_tanh && cc->swa_layers[0] == 2 &&
		      cc->rope_local_theta == 10000 && cc->attn_softcap == 0 && cc->final_softcap == 0,
		      "config: the text_config's keys and Gemma3's defaults (tied, eps 1e-6, local base 10000, "
		      "no caps), layer 1 sliding");
		x3_model_close(m);
	}
	e = compare(&c, test_path("c"), 1, 12, 0);
	CHECK(e < 1e-5, "Gemma3 (multimodal, text part) forward == the reference (rel err %.2g)", e);
	matters(&c, test_path("c"), "the sliding window", NO_WINDOW, 1e-3);

	/* the real gemma-3-4b-it config.json's text part: 6 keys, the rest defaults */
	static const char real[] = "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], "
		"\"model_type\": \"gemma3\", \"mm_tokens_per_image\": 256, \"eos_token_id\": [1, 106], "
		"\"text_config\": {\"hidden_size\": 2560, \"intermediate_size\": 10240, \"model_type\": "
		"\"gemma3_text\", \"num_hidden_layers\": 34, \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": "
		"\"linear\"}, \"sliding_window\": 1024}, \"vision_config\": {\"hidden_size\": 1152}}";
	x3_model_config rc3;
	CHECK_OK(x3_config_parse(real, strlen(real), &rc3), "gemma-3-4b-it's config.json parses");
	CHECK(rc3.hidden == 2560 && rc3.n_heads == 8 && rc3.n_kv_heads == 4 && rc3.head_dim == 256 &&
	      rc3.vocab == 262208 && rc3.tied && rc3.rope_theta == 1e6 && rc3.rope_type == 1 &&
	      rc3.rope_factor == 8 && rc3.sliding_window == 1024 && rc3.max_pos == 131072 &&
	      rc3.swa_layers[0] == (((1ull << 34) - 1) & ~0x20820820ull),
	      "... with Hugging Face's defaults: 8/4 heads of 256, vocab 262208, tied, rope 1e6 linear x8, "
	      "layers 5, 11, 17, 23, 29 global");

	/* bad inputs */
	build(&a, 1);
	CHECK(bad(&a, "x1", ", \"hidden_activation\": \"relu\"", "hidden_activation 'relu'"),
	      "hidden_activation relu: named");
	CHECK(bad(&a, "x2", ", \"layer_types\": [\"sliding_attention\"]", "'layer_types'"),
	      "layer_types of the wrong length: named");
	CHECK(bad(&a, "x3", ", \"query_pre_attn_scalar\": 0", "query_pre_attn_scalar"),
	      "query_pre_attn_scalar 0: named");
	write_model(&a, test_path("x4"), NULL);
	synth_write_config(test_path("x4"), "{\"model_type\": \"gemma4\", \"hidden_size\": 40}");
	CHECK(bad_open(test_path("x4"), "'gemma4' is not supported"), "unknown model_type gemma4: named");
	/* a missing tensor and one of the wrong shape */
	for (int i = 0; i < synth_n; i++)
		if (!strcmp(synth_t[i].name, "model.layers.1.post_feedforward_layernorm.weight"))
			snprintf(synth_t[i].name, sizeof synth_t[i].name, "model.layers.1.post_feedforward_layernorm.bias");
	CHECK(bad(&a, "x5", NULL, "'model.layers.1.post_feedforward_layernorm.weight' is missing"),
	      "a missing post_feedforward_layernorm: named");
	build(&b, 2);
	for (int i = 0; i < synth_n; i++)
		if (!strcmp(synth_t[i].name, "model.layers.2.self_attn.k_norm.weight"))
			synth_t[i].r = 11;
	CHECK(bad(&b, "x6", NULL, "tensor 'model.layers.2.self_attn.k_norm.weight': shape 11, config says 12"),
	      "a k_norm of the wrong length: named");
	synth_reset();
	CHECK(!test_tmpdir_remove(), "the scratch directory removed");
	TEST_DONE();
}
