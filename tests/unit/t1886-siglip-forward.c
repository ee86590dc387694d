/* t1886-siglip-forward: the SigLIP encoder of lib/model/siglip.h (what
 * vision-eval measures a quantized vision tower with) against a second
 * reference written here from Hugging Face's modeling_siglip.py
 * (SiglipEncoderLayer, SiglipVisionTransformer's post_layernorm), whole
 * matrices at a time: a seeded two-layer tower (hidden 24, 3 heads of 8,
 * MLP 40, no width a multiple of 128) in F32, its output on seeded tokens
 * equal to 1e-10. Each feature is shown to matter (the reference without
 * it differs): GELU's tanh form (not erf), the 1/sqrt(head_dim) scale,
 * the heads (one head of 24 differs), post_layernorm, the biases. The
 * linears come from the source without a pack (none decoded); a missing
 * bias fails naming it; a config without a vision_config, or another
 * architecture, is refused; a vision_config's missing keys take Hugging
 * Face's defaults, a bad value leaves the model's config parsing. */
#include <math.h>
#include "test.h"
#include "config.h"
#include "safetensors.h"
#include "siglip.h"
#include "synth.h"

enum { H = 24, NH = 3, HD = H / NH, I = 40, NL = 2, T = 7 };
#define P "vision_tower.vision_model."

static const char cfg_json[] =
	"{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\", "
	"\"text_config\": {\"model_type\": \"gemma3_text\", \"hidden_size\": 32, \"intermediate_size\": 64, "
	"\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16, "
	"\"vocab_size\": 64}, "
	"\"vision_config\": {\"model_type\": \"siglip_vision_model\", \"hidden_size\": 24, "
	"\"intermediate_size\": 40, \"num_hidden_layers\": 2, \"num_attention_heads\": 3, "
	"\"layer_norm_eps\": 1e-6}}";

struct feat { int erf_gelu, no_scale, one_head, no_post, no_bias; };

static void ln(const double *x, const double *w, const double *b, double *y)
{
	double s = 0, s2 = 0;
	for (int i = 0; i < H; i++)
		s += x[i], s2 += x[i] * x[i];
	double m = s / H, var = s2 / H - m * m;
	for (int i = 0; i < H; i++)
		y[i] = (x[i] - m) / sqrt(var + 1e-6) * w[i] + b[i];
}

static const double *bias(const struct feat *f, const char *fmt, int l)
{
	static double zero[I];
	char n[160];
	snprintf(n, sizeof n, fmt, l);
	return f->no_bias ? zero : synth_get("%s", n);
}

/* the whole tower on x (T, H) into y, matrices at a time */
static void reference(const struct feat *f, const double *x, double *y)
{
	static double h[T][H], q[T][H], k[T][H], v[T][H], s[T][T], a[T][H], t[T][H], m[T][I];
	memcpy(y, x, sizeof(double) * T * H);
	int nh = f->one_head ? 1 : NH, hd = H / nh;
	for (int l = 0; l < NL; l++) {
		char n[160];
#define W(name) (snprintf(n, sizeof n, P "encoder.layers.%d." name ".weight", l), synth_get("%s", n))
#define B(name) bias(f, P "encoder.layers.%d." name ".bias", l)
		for (int i = 0; i < T; i++) {
			snprintf(n, sizeof n, P "encoder.layers.%d.layer_norm1.bias", l);
			ln(y + i * H, W("layer_norm1"), synth_get("%s", n), h[i]);
		}
		const double *ws[3] = {W("self_attn.q_proj"), W("self_attn.k_proj"), W("self_attn.v_proj")};
		const double *bs[3] = {B("self_attn.q_proj"), B("self_attn.k_proj"), B("self_attn.v_proj")};
		double (*outs[3])[H] = {q, k, v};
		for (int z = 0; z < 3; z++)
			for (int i = 0; i < T; i++)
				synth_mv(outs[z][i], ws[z], bs[z], h[i], H, H);
		for (int hh = 0; hh < nh; hh++) {
			for (int i = 0; i < T; i++)
				for (int j = 0; j < T; j++) {
					double d = 0;
					for (int e = 0; e < hd; e++)
						d += q[i][hh * hd + e] * k[j][hh * hd + e];
					s[i][j] = f->no_scale ? d : d / sqrt((double)hd);
				}
			for (int i = 0; i < T; i++) {
				double mx = s[i][0], z = 0;
				for (int j = 1; j < T; j++)
					mx = fmax(mx, s[i][j]);
				for (int j = 0; j < T; j++)
					z += exp(s[i][j] - mx);
				for (int e = 0; e < hd; e++) {
					double o = 0;
					for (int j = 0; j < T; j++)
						o += exp(s[i][j] - mx) / z * v[j][hh * hd + e];
					a[i][hh * hd + e] = o;
				}
			}
		}
		for (int i = 0; i < T; i++) {
			synth_mv(t[i], W("self_attn.out_proj"), B("self_attn.out_proj"), a[i], H, H);
			for (int e = 0; e < H; e++)
				y[i * H + e] += t[i][e];
			snprintf(n, sizeof n, P "encoder.layers.%d.layer_norm2.bias", l);
			ln(y + i * H, W("layer_norm2"), synth_get("%s", n), h[i]);
			synth_mv(m[i], W("mlp.fc1"), B("mlp.fc1"), h[i], I, H);
			for (int e = 0; e < I; e++) {
				double u = m[i][e];
				m[i][e] = f->erf_gelu ? 0.5 * u * (1 + erf(u / sqrt(2.0)))
				                      : 0.5 * u * (1 + tanh(sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
			}
			synth_mv(t[i], W("mlp.fc2"), B("mlp.fc2"), m[i], H, I);
			for (int e = 0; e < H; e++)
				y[i * H + e] += t[i][e];
		}
#undef W
#undef B
	}
	if (!f->no_post)
		for (int i = 0; i < T; i++) {
			double c[H];
			memcpy(c, y + i * H, sizeof c);
			ln(c, synth_get(P "post_layernorm.weight"), synth_get(P "post_layernorm.bias"), y + i * H);
		}
}

static void build(uint64_t seed, int omit_bias)
{
	x3_rng g;
	x3_rng_seed(&g, seed, 0);
	synth_reset();
	char n[160];
	for (int l = 0; l < NL; l++) {
		const char *lin[6] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
		                      "mlp.fc1", "mlp.fc2"};
		for (int j = 0; j < 6; j++) {
			int out = j == 4 ? I : H, in = j == 5 ? I : H;
			snprintf(n, sizeof n, P "encoder.layers.%d.%s.weight", l, lin[j]);
			synth_add(n, out, in, 1 / sqrt((double)in), 0, &g);
			snprintf(n, sizeof n, P "encoder.layers.%d.%s.bias", l, lin[j]);
			struct synth_tens *t = synth_add(n, out, 0, 0.2, 0, &g);
			if (omit_bias && l == 1 && j == 4)
				t->omit = 1;
		}
		for (int j = 1; j <= 2; j++) {
			snprintf(n, sizeof n, P "encoder.layers.%d.layer_norm%d.weight", l, j);
			synth_add(n, H, 0, 0.1, 1, &g);
			snprintf(n, sizeof n, P "encoder.layers.%d.layer_norm%d.bias", l, j);
			synth_add(n, H, 0, 0.1, 0, &g);
		}
	}
	synth_add(P "post_layernorm.weight", H, 0, 0.1, 1, &g);
	synth_add(P "post_layernorm.bias", H, 0, 0.1, 0, &g);
	synth_round(X3_F32);
}

static double maxrel(const double *a, const double *b, int n)
{
	double d = 0, m = 0;
	for (int i = 0; i < n; i++)
		d = fmax(d, fabs(a[i] - b[i])), m = fmax(m, fabs(b[i]));
	return d / m;
}

int main(void)
{
	if (test_tmpdir("t1886")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	build(1886, 0);
	CHECK_OK(synth_write(test_path("m"), X3_F32, 0), "write the tower");
	x3_model_config c;
	CHECK_OK(test_config_parse(cfg_json, &c), "config: Gemma3ForConditionalGeneration with a vision_config");
	CHECK(c.v_layers == NL && c.v_hidden == H && c.v_inter == I && c.v_heads == NH && c.v_eps == 1e-6 &&
	      !c.vision_bits, "vision_config read: %lld layers, hidden %lld, MLP %lld, %lld heads; no vision_bits",
	      (long long)c.v_layers, (long long)c.v_hidden, (long long)c.v_inter, (long long)c.v_heads);
	x3_st *st = NULL;
	CHECK_OK(x3_st_open(test_path("m"), &st), "open the tower");
	x3_siglip *s = NULL;
	int dec = -1;
	CHECK_OK(x3_siglip_load(&c, st, NULL, &s, &dec), "load the encoder from the source");
	CHECK(dec == 0, "no pack: no linear decoded (%d)", dec);
	double x[T * H], y[T * H], r[T * H];
	x3_rng g;
	x3_rng_seed(&g, 7, 1);
	for (int i = 0; i < T * H; i++)
		x[i] = 2 * x3_rng_uniform(&g) - 1;
	CHECK_OK(s ? x3_siglip_forward(s, T, x, y) : X3_EINVAL, "forward");
	struct feat f0 = {0};
	reference(&f0, x, r);
	double e = maxrel(y, r, T * H);
	CHECK(e < 1e-10, "the encoder's output is the reference's (max rel diff %.3g)", e);
	double y2[T * H];
	memcpy(y2, x, sizeof y2);
	CHECK_OK(s ? x3_siglip_forward(s, T, y2, y2) : X3_EINVAL, "forward in place");
	CHECK(!memcmp(y2, y, sizeof y), "in place gives the same output");
	static const char *const what[] = {"GELU's tanh form (erf differs)", "the 1/sqrt(head_dim) scale",
	                                   "the heads (one head of 24 differs)", "post_layernorm",
	                                   "the biases"};
	for (int k = 0; k < 5; k++) {
		struct feat f = {0};
		int *p[5] = {&f.erf_gelu, &f.no_scale, &f.one_head, &f.no_post, &f.no_bias};
		*p[k] = 1;
		reference(&f, x, r);
		double d = maxrel(y, r, T * H);
		CHECK(d > 1e-5, "%s matters: the reference without it differs by %.3g", what[k], d);
	}
	x3_siglip_free(s);
	x3_st_close(st);

	build(1886, 1);
	CHECK_OK(synth_write(test_path("nb"), X3_F32, 0), "write a tower without layer 1's fc1 bias");
	CHECK_OK(x3_st_open(test_path("nb"), &st), "open it");
	s = NULL;
	int rc = x3_siglip_load(&c, st, NULL, &s, &dec);
	CHECK(rc != X3_OK && strstr(x3_errmsg(), "encoder.layers.1.mlp.fc1.bias"),
	      "a missing bias fails naming it (%s)", x3_errmsg());
	x3_siglip_free(s);
	x3_st_close(st);

	x3_model_config t;
	CHECK_OK(test_config_parse("{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": "
	                           "\"gemma3\", \"text_config\": {\"model_type\": \"gemma3_text\", "
	                           "\"num_hidden_layers\": 1, \"vocab_size\": 64}}", &t),
	         "config without a vision_config");
	CHECK(x3_siglip_load(&t, NULL, NULL, &s, &dec) == X3_EUNSUP, "no vision_config: refused (%s)", x3_errmsg());
	CHECK(x3_config_vision(&t, 4) == X3_EUNSUP, "--vision-bits without a vision_config refused (%s)",
	      x3_errmsg());
	CHECK_OK(test_config_parse("{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": "
	                           "\"gemma3\", \"text_config\": {\"model_type\": \"gemma3_text\", "
	                           "\"num_hidden_layers\": 1, \"vocab_size\": 64}, \"vision_config\": "
	                           "{\"hidden_size\": 1152, \"num_attention_heads\": -3}}", &t),
	         "a vision_config with a bad value: the model's config still parses (its tower passed through)");
	CHECK(!t.v_layers && x3_config_vision(&t, 4) == X3_EUNSUP, "... and --vision-bits refuses it (%s)",
	      x3_errmsg());
	CHECK_OK(test_config_parse("{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": "
	                           "\"gemma3\", \"text_config\": {\"model_type\": \"gemma3_text\", "
	                           "\"num_hidden_layers\": 1, \"vocab_size\": 64}, \"vision_config\": "
	                           "{\"hidden_size\": 1152}}", &t), "a partial vision_config parses");
	CHECK(t.v_layers == 12 && t.v_hidden == 1152 && t.v_inter == 3072 && t.v_heads == 12,
	      "... the missing keys SiglipVisionConfig's defaults (12 layers, MLP 3072, 12 heads)");
	CHECK(x3_config_vision(&c, 9) != X3_OK && x3_config_vision(&c, 16) == X3_OK && !c.vision_bits,
	      "--vision-bits 9 refused, 16 leaves the tower passed through");
	CHECK(!test_tmpdir_remove(), "the scratch directory removed");
	TEST_DONE();
}
