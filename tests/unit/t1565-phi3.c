/* t1565: Phi3ForCausalLM, written here (seeded): its fused checkpoint
 * tensors (self_attn.qkv_proj, mlp.gate_up_proj) are described as row
 * slices (q/k/v_proj, gate/up_proj of the fused rows); its logits equal a
 * Llama checkpoint's of the same split weights, and both match a plain
 * double-precision reference with partial_rotary_factor; a fused tensor
 * whose rows do not match the config fails naming it; longrope/su RoPE
 * (short and long factors) equals the reference; factor lists and
 * partial_rotary_factor values that do not fit are refused naming them. */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test.h"
#include "synth.h"
#include "arch.h"
#include "config.h"
#include "model.h"
#include "safetensors.h"

enum { H = 32, I = 40, NL = 2, NH = 4, NKV = 2, HD = 8, V = 30, QD = NH * HD, KVD = NKV * HD };

/* the split weights of one model, doubles (rounded through F32) */
struct w {
	double emb[V * H], fnorm[H], head[V * H];
	double in_norm[NL][H], post_norm[NL][H];
	double q[NL][QD * H], k[NL][KVD * H], v[NL][KVD * H], o[NL][H * QD];
	double g[NL][I * H], u[NL][I * H], d[NL][H * I];
};
static struct w W;

static void fill(double *p, int n, double scale, double mean, x3_rng *g)
{
	for (int i = 0; i < n; i++)
		p[i] = (float)(mean + scale * x3_rng_normal(g));
}

static void build(uint64_t seed)
{
	x3_rng g;
	x3_rng_seed(&g, seed, 0);
	fill(W.emb, V * H, 1, 0, &g);
	fill(W.fnorm, H, 0.1, 1, &g);
	fill(W.head, V * H, 1 / sqrt(H), 0, &g);
	for (int l = 0; l < NL; l++) {
		fill(W.in_norm[l], H, 0.1, 1, &g);
		fill(W.post_norm[l], H, 0.1, 1, &g);
		fill(W.q[l], QD * H, 1 / sqrt(H), 0, &g);
		fill(W.k[l], KVD * H, 1 / sqrt(H), 0, &g);
		fill(W.v[l], KVD * H, 1 / sqrt(H), 0, &g);
		fill(W.o[l], H * QD, 1 / sqrt(QD), 0, &g);
		fill(W.g[l], I * H, 1 / sqrt(H), 0, &g);
		fill(W.u[l], I * H, 1 / sqrt(H), 0, &g);
		fill(W.d[l], H * I, 1 / sqrt(I), 0, &g);
	}
}

/* one F32 tensor of the concatenated rows of up to three (rows x cols) parts */
static int put(x3_stw *w, const char *name, int cols, const double *a, int ra, const double *b, int rb,
               const double *c, int rc_)
{
	int rows = ra + rb + rc_;
	x3_tensor *t = cols ? x3_tensor_new2(name, X3_F32, rows, cols) : x3_tensor_new1(name, X3_F32, rows);
	if (!t)
		return X3_ENOMEM;
	float *f = t->data;
	int64_t n = cols ? cols : 1, k = 0;
	for (int64_t i = 0; i < ra * n; i++) f[k++] = (float)a[i];
	for (int64_t i = 0; i < rb * n; i++) f[k++] = (float)b[i];
	for (int64_t i = 0; i < rc_ * n; i++) f[k++] = (float)c[i];
	int rc = x3_stw_module(w);
	if (!rc)
		rc = x3_stw_add(w, t);
	x3_tensor_free(t);
	return rc;
}

/* commit w when rc is X3_OK, else abort it; rc or the commit's */
static int finish(x3_stw *w, int rc)
{
	if (rc) {
		x3_stw_abort(w);
		return rc;
	}
	return x3_stw_commit(w);
}

/* a Phi3 checkpoint of one layer whose qkv_proj has extra rows (bad) */
static int write_bad(const char *dir, int extra)
{
	x3_stw *w;
	mkdir(dir, 0755);
	int rc = x3_stw_create(dir, 0, &w);
	static double qkv[(QD + 2 * KVD + 4) * H];
	memcpy(qkv, W.q[0], sizeof W.q[0]);
	memcpy(qkv + QD * H, W.k[0], sizeof W.k[0]);
	memcpy(qkv + (QD + KVD) * H, W.v[0], sizeof W.v[0]);
	memset(qkv + (QD + 2 * KVD) * H, 0, sizeof(double) * 4 * H);
	if (rc)
		return rc;
	char n[128];
	int l = 0;
#define L(x) (snprintf(n, sizeof n, "model.layers.%d." x, l), n)
	rc = put(w, "model.embed_tokens.weight", H, W.emb, V, NULL, 0, NULL, 0) ||
	     put(w, L("input_layernorm.weight"), 0, W.in_norm[0], H, NULL, 0, NULL, 0) ||
	     put(w, L("self_attn.qkv_proj.weight"), H, qkv, QD + 2 * KVD + extra, NULL, 0, NULL, 0) ||
	     put(w, L("self_attn.o_proj.weight"), QD, W.o[0], H, NULL, 0, NULL, 0) ||
	     put(w, L("post_attention_layernorm.weight"), 0, W.post_norm[0], H, NULL, 0, NULL, 0) ||
	     put(w, L("mlp.gate_up_proj.weight"), H, W.g[0], I, W.u[0], I, NULL, 0) ||
	     put(w, L("mlp.down_proj.weight"), I, W.d[0], H, NULL, 0, NULL, 0) ||
	     put(w, "model.norm.weight", 0, W.fnorm, H, NULL, 0, NULL, 0) ||
	     put(w, "lm_head.weight", H, W.head, V, NULL, 0, NULL, 0);
#undef L
	if ((rc = finish(w, rc ? X3_EIO : X3_OK)))
		return rc;
	return synth_write_config(dir, "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_size\": %d, "
	         "\"intermediate_size\": %d, \"num_hidden_layers\": 1, \"num_attention_heads\": %d, "
	         "\"num_key_value_heads\": %d, \"vocab_size\": %d}", H, I, NH, NKV, V);
}

/* fused: Phi3's tensors, else Llama's */
static int write_model(const char *dir, int fused, double prf, const char *rope_scaling)
{
	mkdir(dir, 0755);
	x3_stw *w;
	int rc = x3_stw_create(dir, 0, &w);
	if (rc)
		return rc;
	char n[128];
	rc = put(w, "model.embed_tokens.weight", H, W.emb, V, NULL, 0, NULL, 0);
	for (int l = 0; l < NL && !rc; l++) {
#define L(x) (snprintf(n, sizeof n, "model.layers.%d." x, l), n)
		rc = put(w, L("input_layernorm.weight"), 0, W.in_norm[l], H, NULL, 0, NULL, 0);
		if (!rc && fused)   /* q, k, v rows one below the other */
			rc = put(w, L("self_attn.qkv_proj.weight"), H, W.q[l], QD, W.k[l], KVD, W.v[l], KVD);
		if (!rc && !fused)
			rc = put(w, L("self_attn.q_proj.weight"), H, W.q[l], QD, NULL, 0, NULL, 0) ||
			     put(w, L("self_attn.k_proj.weight"), H, W.k[l], KVD, NULL, 0, NULL, 0) ||
			     put(w, L("self_attn.v_proj.weight"), H, W.v[l], KVD, NULL, 0, NULL, 0);
		if (!rc)
			rc = put(w, L("self_attn.o_proj.weight"), QD, W.o[l], H, NULL, 0, NULL, 0);
		if (!rc)
			rc = put(w, L("post_attention_layernorm.weight"), 0, W.post_norm[l], H, NULL, 0, NULL, 0);
		if (!rc && fused)
			rc = put(w, L("mlp.gate_up_proj.weight"), H, W.g[l], I, W.u[l], I, NULL, 0);
		if (!rc && !fused)
			rc = put(w, L("mlp.gate_proj.weight"), H, W.g[l], I, NULL, 0, NULL, 0) ||
			     put(w, L("mlp.up_proj.weight"), H, W.u[l], I, NULL, 0, NULL, 0);
		if (!rc)
			rc = put(w, L("mlp.down_proj.weight"), I, W.d[l], H, NULL, 0, NULL, 0);
#undef L
	}
	if (!rc)
		rc = put(w, "model.norm.weight", 0, W.fnorm, H, NULL, 0, NULL, 0);
	if (!rc)
		rc = put(w, "lm_head.weight", H, W.head, V, NULL, 0, NULL, 0);
	if ((rc = finish(w, rc)))
		return rc;
	return synth_write_config(dir,
	         "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %d, "
	         "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
	         "\"num_key_value_heads\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-5, "
	         "\"rope_theta\": 100.0, \"partial_rotary_factor\": %g, \"max_position_embeddings\": 64, "
	         "\"sliding_window\": 64, \"rope_scaling\": %s, \"tie_word_embeddings\": false, "
	         "\"hidden_act\": \"silu\"}",
	         fused ? "Phi3ForCausalLM" : "LlamaForCausalLM", fused ? "phi3" : "llama", H, I, NL, NH, NKV, V,
	         prf, rope_scaling ? rope_scaling : "null");
}

/* ---- plain reference forward (double), RoPE on the first rd dims ------ */

/* longrope in the reference: per-frequency ext factors (NULL: none) and
 * the cos/sin factor */
static const double *ref_ext;
static double ref_af = 1;

/* Hugging Face's partial rotary: rotate_half on x[:rd], inv_freq over rd */
static void rope(double *v, int rd, int pos)
{
	for (int i = 0; i < rd / 2; i++) {
		double inv = pow(100.0, -2.0 * i / rd) / (ref_ext ? ref_ext[i] : 1.0);
		double c = cos(pos * inv) * ref_af, s = sin(pos * inv) * ref_af;
		double a = v[i], b = v[i + rd / 2];
		v[i] = a * c - b * s;
		v[i + rd / 2] = b * c + a * s;
	}
}

static void ref_forward(const int32_t *tok, int n, int rd, double *logits)
{
	double *x = calloc((size_t)n * H, sizeof *x), xn[H], a[QD], o[H], g[I], u[I];
	double *q = malloc(sizeof(double) * n * QD), *k = malloc(sizeof(double) * n * KVD);
	double *v = malloc(sizeof(double) * n * KVD), *sc = malloc(sizeof(double) * n);
	for (int t = 0; t < n; t++)
		memcpy(x + t * H, W.emb + (size_t)tok[t] * H, sizeof(double) * H);
	for (int l = 0; l < NL; l++) {
		for (int t = 0; t < n; t++) {
			synth_rms(xn, x + t * H, W.in_norm[l], H, 1e-5);
			synth_mv(q + t * QD, W.q[l], NULL, xn, QD, H);
			synth_mv(k + t * KVD, W.k[l], NULL, xn, KVD, H);
			synth_mv(v + t * KVD, W.v[l], NULL, xn, KVD, H);
			for (int h = 0; h < NH; h++)
				rope(q + t * QD + h * HD, rd, t);
			for (int h = 0; h < NKV; h++)
				rope(k + t * KVD + h * HD, rd, t);
		}
		for (int t = 0; t < n; t++) {
			synth_attn(a, q + t * QD, k, v, t + 1, NH, NKV, HD, sc);
			synth_mv(o, W.o[l], NULL, a, H, QD);
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
		for (int t = 0; t < n; t++) {
			synth_rms(xn, x + t * H, W.post_norm[l], H, 1e-5);
			synth_mv(g, W.g[l], NULL, xn, I, H);
			synth_mv(u, W.u[l], NULL, xn, I, H);
			for (int i = 0; i < I; i++)
				g[i] = g[i] / (1 + exp(-g[i])) * u[i];
			synth_mv(o, W.d[l], NULL, g, H, I);
			for (int i = 0; i < H; i++)
				x[t * H + i] += o[i];
		}
	}
	for (int t = 0; t < n; t++) {
		synth_rms(xn, x + t * H, W.fnorm, H, 1e-5);
		synth_mv(logits + (size_t)t * V, W.head, NULL, xn, V, H);
	}
	free(x), free(q), free(k), free(v), free(sc);
}

enum { ROWS = 2, COLS = 11 };

/* the model's logits (ROWS x COLS x V) of a fixed token pattern */
static int logits_of(const char *dir, float *lg)
{
	x3_model *m;
	int rc = x3_model_open(dir, NULL, &m);
	if (rc)
		return rc;
	int32_t tok[ROWS * COLS];
	for (int i = 0; i < ROWS * COLS; i++)
		tok[i] = (i * 7 + 3) % V;
	struct x3_forward_opts o;
	x3_forward_opts_init(&o, m);
	o.logits_mode = X3_LOGITS_ALL;
	o.logits = lg;
	o.chunk_tokens = COLS;
	rc = x3_model_forward(m, tok, ROWS, COLS, &o);
	x3_model_close(m);
	return rc;
}

static double ref_err(const float *lg, int rd)
{
	int32_t tok[ROWS * COLS];
	for (int i = 0; i < ROWS * COLS; i++)
		tok[i] = (i * 7 + 3) % V;
	static double ref[COLS * V];
	double err = 0, mag = 0;
	for (int r = 0; r < ROWS; r++) {
		ref_forward(tok + r * COLS, COLS, rd, ref);
		for (int i = 0; i < COLS * V; i++) {
			err = fmax(err, fabs(ref[i] - lg[(size_t)r * COLS * V + i]));
			mag = fmax(mag, fabs(ref[i]));
		}
	}
	return err / mag;
}


int main(void)
{
	if (test_tmpdir("t1565")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	build(1565);

	/* the description: row slices of the fused tensors */
	x3_model_config c;
	CHECK_OK(write_model(test_path("phi3"), 1, 0.5, NULL), "write phi3 (fused qkv_proj, gate_up_proj)");
	CHECK_OK(x3_config_load(test_path("phi3"), &c), "phi3 config");
	CHECK(c.arch == X3_ARCH_PHI3 && c.rot_dim == HD / 2, "Phi3ForCausalLM, partial_rotary_factor 0.5: "
	      "RoPE on %lld of %d dims", (long long)c.rot_dim, HD);
	x3_module *m = NULL;
	int n = 0;
	CHECK_OK(x3_arch_modules(&c, &m, &n), "phi3 modules");
	const x3_module *q = x3_modules_find(m, n, "model.layers.1.self_attn.q_proj");
	const x3_module *k = x3_modules_find(m, n, "model.layers.1.self_attn.k_proj");
	const x3_module *v = x3_modules_find(m, n, "model.layers.1.self_attn.v_proj");
	const x3_module *g = x3_modules_find(m, n, "model.layers.1.mlp.gate_proj");
	const x3_module *u = x3_modules_find(m, n, "model.layers.1.mlp.up_proj");
	const x3_module *o = x3_modules_find(m, n, "model.layers.1.self_attn.o_proj");
	CHECK(q && k && v && g && u && o, "q/k/v_proj, gate/up_proj, o_proj are modules");
	if (q && k && v && g && u && o) {
		CHECK(q->sliced && k->sliced && v->sliced && !strcmp(v->weight, "model.layers.1.self_attn.qkv_proj.weight") &&
		      q->row0 == 0 && k->row0 == QD && v->row0 == QD + KVD && v->src_rows == QD + 2 * KVD &&
		      v->out == KVD, "q/k/v: rows 0, %d, %d of the %d rows of qkv_proj", QD, QD + KVD, QD + 2 * KVD);
		CHECK(g->sliced && u->sliced && g->row0 == 0 && u->row0 == I && u->src_rows == 2 * I &&
		      !strcmp(u->src, "model.layers.1.mlp.gate_up_proj"), "gate/up: rows 0, %d of gate_up_proj", I);
		CHECK(!o->sliced && o->row0 == 0 && o->src_rows == H && !strcmp(o->src, o->key),
		      "o_proj: its own weight");
		CHECK(!strcmp(q->group, v->group) && !strcmp(g->group, u->group) && strcmp(q->group, g->group),
		      "Hessian groups: q/k/v share one, gate/up another");
	}
	CHECK(x3_modules_slice_of(m, n, "model.layers.0.self_attn.qkv_proj.weight") != NULL &&
	      x3_modules_slice_of(m, n, "model.layers.0.mlp.gate_up_proj.weight") != NULL &&
	      !x3_modules_slice_of(m, n, "model.layers.0.self_attn.o_proj.weight") &&
	      !x3_modules_slice_of(m, n, "model.layers.0.self_attn.qkv_proj.weightx"),
	      "the fused tensors are consumed by slices, others not");
	int nlin = 0;
	for (int i = 0; i < n; i++)
		nlin += m[i].d->kind == X3_KIND_LINEAR;
	CHECK(nlin == 7 * NL + 1, "%d linears (7 per layer and the head)", nlin);
	free(m);

	/* the forward: Phi3 == Llama of the split weights == the reference */
	size_t nl = (size_t)ROWS * COLS * V;
	float *lp = malloc(nl * sizeof *lp), *ll = malloc(nl * sizeof *ll), *lf = malloc(nl * sizeof *lf);
	CHECK_OK(write_model(test_path("llama"), 0, 0.5, NULL), "write llama (split weights)");
	CHECK_OK(logits_of(test_path("phi3"), lp), "phi3 forward");
	CHECK_OK(logits_of(test_path("llama"), ll), "llama forward");
	double d = test_max_diff(lp, ll, nl);
	CHECK(d == 0, "phi3 logits == llama logits of the same split weights (max diff %.3g)", d);
	double e = ref_err(lp, HD / 2);
	CHECK(e < 1e-5, "phi3, partial rotary 0.5: == reference (rel err %.2g)", e);
	CHECK_OK(write_model(test_path("phi3-full"), 1, 1.0, NULL), "write phi3 with full rotary");
	CHECK_OK(logits_of(test_path("phi3-full"), lf), "phi3 full rotary forward");
	e = ref_err(lf, HD);
	CHECK(e < 1e-5, "phi3, full rotary: == reference (rel err %.2g)", e);
	d = test_max_diff(lp, lf, nl);
	CHECK(d > 1e-3, "partial rotary changes the logits (max diff %.3g)", d);

	/* longrope (Phi-3 128k): short factors for rows within the original
	 * context, long ones past it; cos/sin times sqrt(1 + ln s / ln orig),
	 * s = max_position_embeddings / original_max_position_embeddings */
	static const double lf4[] = { 1.0, 1.7, 3.1, 6.0 }, sf4[] = { 1.0, 1.2, 1.9, 2.5 };
	const char *lr = "{\"type\": \"longrope\", \"long_factor\": [1.0, 1.7, 3.1, 6.0], "
	                 "\"short_factor\": [1.0, 1.2, 1.9, 2.5]}, \"original_max_position_embeddings\": %d";
	char rs[512];
	float *lo = malloc(nl * sizeof *lo);
	for (int pass = 0; pass < 2; pass++) {
		int orig = pass ? COLS - 3 : COLS + 5;   /* rows of COLS: long factors, then short */
		snprintf(rs, sizeof rs, lr, orig);
		CHECK_OK(write_model(test_path("phi3-long"), 1, 1.0, rs), "write phi3 with longrope");
		CHECK_OK(x3_config_load(test_path("phi3-long"), &c), "phi3 longrope config");
		double af = sqrt(1 + log(64.0 / orig) / log((double)orig));
		CHECK(c.rope_type == 4 && c.rope_orig_max_pos == orig && fabs(c.rope_attn_factor - af) < 1e-12,
		      "longrope: original context %d, attention factor %.6f (want %.6f)", orig,
		      c.rope_attn_factor, af);
		CHECK_OK(logits_of(test_path("phi3-long"), lo), "phi3 longrope forward");
		ref_ext = pass ? lf4 : sf4, ref_af = af;
		e = ref_err(lo, HD);
		CHECK(e < 1e-5, "phi3 longrope, rows %s the original context: == reference with the %s factors "
		      "(rel err %.2g)", pass ? "past" : "within", pass ? "long" : "short", e);
		ref_ext = pass ? sf4 : lf4;
		double e2 = ref_err(lo, HD);
		CHECK(e2 > 1e-3, "... and not the %s factors' (rel err %.2g)", pass ? "short" : "long", e2);
		ref_ext = NULL, ref_af = 1;
		e2 = ref_err(lo, HD);
		CHECK(e2 > 1e-3, "... nor plain RoPE's (rel err %.2g)", e2);
	}
	free(lo);
	free(lp), free(ll), free(lf);

	/* bad inputs */
	CHECK_OK(write_bad(test_path("bad-rows"), 1), "write phi3 with one extra qkv row");
	x3_model *bm = NULL;
	int rc = x3_model_open(test_path("bad-rows"), NULL, &bm);
	CHECK(rc != X3_OK && strstr(x3_errmsg(), "'model.layers.0.self_attn.qkv_proj.weight'") &&
	      strstr(x3_errmsg(), "65x32"), "fused tensor of the wrong rows: %s", x3_errmsg());
	x3_model_close(bm);
	const char *base = "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_size\": 32, \"intermediate_size\": 40, "
	                   "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 30";
	char js[1024];
	/* longrope factor lists that do not fit */
	snprintf(js, sizeof js, "%s, \"rope_scaling\": {\"type\": \"longrope\", \"long_factor\": [1, 1, 1], "
	         "\"short_factor\": [1, 1, 1]}}", base);
	rc = test_config_parse(js, &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "longrope") && strstr(x3_errmsg(), "3 factors"),
	      "longrope with 3 factors for 8 rotated dims refused: %s", x3_errmsg());
	snprintf(js, sizeof js, "%s, \"rope_scaling\": {\"type\": \"su\", \"long_factor\": [1, 1, 1, 1], "
	         "\"short_factor\": [1, 1, 1]}}", base);
	rc = test_config_parse(js, &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "4 long_factor and 3 short_factor"),
	      "su with lists of unequal length refused: %s", x3_errmsg());
	snprintf(js, sizeof js, "%s, \"rope_scaling\": {\"type\": \"longrope\", \"long_factor\": [1, 1, 1, 0], "
	         "\"short_factor\": [1, 1, 1, 1]}}", base);
	rc = test_config_parse(js, &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "'long_factor'[3]"), "a zero factor refused: %s",
	      x3_errmsg());
	snprintf(js, sizeof js, "%s, \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 1, 1, 1]}}",
	         base);
	rc = test_config_parse(js, &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "'long_factor'"), "no long_factor refused: %s",
	      x3_errmsg());
	snprintf(js, sizeof js, "%s, \"partial_rotary_factor\": 0.1}", base);
	rc = test_config_parse(js, &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "partial_rotary_factor"),
	      "partial_rotary_factor 0.1 (0 dims of 8) refused: %s", x3_errmsg());
	snprintf(js, sizeof js, "%s, \"partial_rotary_factor\": 0.75}", base);
	CHECK(test_config_parse(js, &c) == X3_OK && c.rot_dim == 6, "partial_rotary_factor 0.75 of 8: %lld dims",
	      (long long)c.rot_dim);

	CHECK(!test_tmpdir_remove(), "the scratch directory removed");
	TEST_DONE();
}
