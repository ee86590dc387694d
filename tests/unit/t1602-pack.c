/* t1602-pack: EXL3 directory layout helpers: architecture, linears,
 * model order, the EXL3 linear check, config.json merging. */
#include <jansson.h>
#include "test.h"
#include "codec.h"
#include "arch.h"
#include "model.h"
#include "pack.h"

static json_t *parse(const char *s)
{
	json_error_t je;
	return json_loads(s, 0, &je);
}

static const char *str(json_t *o, const char *path1, const char *path2)
{
	json_t *v = json_object_get(o, path1);
	if (path2)
		v = json_object_get(v, path2);
	return json_is_string(v) ? json_string_value(v) : "";
}

static x3_tensor *scalar(const char *name, uint32_t v)
{
	x3_tensor *t = x3_tensor_new(name, X3_I32, 0, NULL, 1);
	unsigned char *p = t->data;
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
	return t;
}

int main(void)
{
	/* the description of a Qwen3-like config: explicit head_dim, GQA,
	 * tied, q/k norms (arch.h; layout parse) */
	x3_model_config a;
#define Q3 "{\"architectures\": [\"Qwen3ForCausalLM\"], \"num_hidden_layers\": 2, \"hidden_size\": 2560, " \
	"\"intermediate_size\": 9728, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"head_dim\": 128," \
	"\"vocab_size\": 151936, \"tie_word_embeddings\": true"
	CHECK_OK(x3_config_parse_as(Q3 "}", strlen(Q3 "}"), X3_CONFIG_LAYOUT, &a), "parse Qwen3-like config");
	x3_module *m;
	int n;
	CHECK_OK(x3_arch_modules(&a, &m, &n), "modules");
	const x3_module *l[16];
	int nl = 0;
	for (int i = 0; i < n && nl < 16; i++)
		if (m[i].d->kind == X3_KIND_LINEAR)
			l[nl++] = &m[i];
	CHECK(nl == 15 && a.tied && n == 1 + 2 * 11 + 2, "2 x 7 linears + head (%d), tied; %d modules", nl, n);
	CHECK(!strcmp(l[0]->key, "model.layers.0.self_attn.q_proj") && l[0]->in == 2560 && l[0]->out == 4096,
	      "q_proj (in 2560, out 32 x 128)");
	CHECK(l[1]->out == 1024 && l[3]->in == 4096 && l[3]->out == 2560, "k_proj out 8 x 128; o_proj 4096 -> 2560");
	CHECK(l[6]->in == 9728 && l[6]->out == 2560 && !strcmp(l[14]->key, "lm_head") && l[14]->out == 151936,
	      "down_proj, head");
	CHECK(l[14]->tied && !strcmp(l[14]->weight, "model.embed_tokens.weight") && l[14]->layer == 2 &&
	      !strcmp(l[14]->group, "lm_head.input"), "tied head reads the embedding, layer 2, group lm_head.input");
	CHECK(!strcmp(l[8]->group, "model.layers.1.self_attn.input") && !strcmp(l[9]->group, l[8]->group) &&
	      !strcmp(l[10]->group, "model.layers.1.self_attn.o_proj.input") && l[12]->d->role == X3_ROLE_MLP &&
	      l[0]->d->hq == 0 && l[12]->d->hq == 0, "groups, roles, no --hq promotion (a dense family)");
	const x3_module *qn = x3_modules_find(m, n, "model.layers.1.self_attn.q_norm");
	CHECK(qn && qn->d->kind == X3_KIND_VECTOR && qn->out == 128, "q_norm (128) in a Qwen3 layer");
	char mb[512];
	CHECK_OK(x3_modules_members(m, n, "model.layers.0.mlp.input", mb, sizeof mb), "members");
	CHECK(!strcmp(mb, "model.layers.0.mlp.gate_proj.weight,model.layers.0.mlp.up_proj.weight"),
	      "members of mlp.input: %s", mb);
	free(m);
	int lay;
	const x3_module_desc *d = x3_arch_classify("model.layers.17.self_attn.k_proj", &lay);
	CHECK(d && d->role == X3_ROLE_ATTENTION && lay == 17 && !strcmp(d->alloc, "qkv"), "classify a key");
	CHECK(!x3_arch_classify("model.layers.x.self_attn.k_proj", &lay) && !x3_arch_classify("foo", &lay),
	      "unknown keys are not classified");
#define CFG_ERR(js, code, what) do { const char *j_ = (js); \
	CHECK(x3_config_parse_as(j_, strlen(j_), X3_CONFIG_LAYOUT, &a) == (code), what ": %s", x3_errmsg()); } while (0)
	CFG_ERR("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64}", X3_EFORMAT, "missing field");
	CHECK(strstr(x3_errmsg(), "intermediate_size") != NULL, "missing field named");
	CFG_ERR("{\"architectures\": [\"LlamaForCausalLM\"], \"num_hidden_layers\": 2, \"hidden_size\": 64, "
	        "\"intermediate_size\": 9, \"num_attention_heads\": 4, \"vocab_size\": 9, \"num_experts\": 8}",
	        X3_EUNSUP, "MoE refused");
	CFG_ERR("{\"architectures\": [\"LlamaForCausalLM\"], \"num_hidden_layers\": 2, \"hidden_size\": 64, "
	        "\"intermediate_size\": 9, \"num_attention_heads\": 4, \"vocab_size\": 9, \"hidden_act\": \"gelu\", "
	        "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}", X3_OK,
	        "the layout does not check the forward's options");
	CFG_ERR("{\"architectures\": [\"LlavaForConditionalGeneration\"], \"text_config\": "
	        "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, \"intermediate_size\": 9, "
	        "\"num_attention_heads\": 4, \"vocab_size\": 9}}", X3_EUNSUP, "a wrapper is refused by its name");
	CFG_ERR("[1]", X3_EFORMAT, "not an object");
	CHECK_OK(x3_config_parse_as(Q3 "}", strlen(Q3 "}"), X3_CONFIG_LAYOUT, &a), "parse again");
	CHECK(x3_pack_pad128(172) == 256 && x3_pack_pad128(128) == 128 && x3_pack_pad128(1) == 128, "pad128");

	/* model order */
	const char *names[] = {"lm_head.weight", "model.norm.weight", "model.layers.10.input_layernorm.weight",
		"model.layers.2.mlp.down_proj.trellis", "model.layers.2.mlp.down_proj.suh",
		"model.layers.2.self_attn.q_norm.weight", "model.layers.2.self_attn.q_proj.svh",
		"model.embed_tokens.weight", "model.layers.2.post_attention_layernorm.weight"};
	const char *want[] = {"model.embed_tokens.weight", "model.layers.2.self_attn.q_proj.svh",
		"model.layers.2.self_attn.q_norm.weight", "model.layers.2.post_attention_layernorm.weight",
		"model.layers.2.mlp.down_proj.trellis", "model.layers.2.mlp.down_proj.suh",
		"model.layers.10.input_layernorm.weight", "model.norm.weight", "lm_head.weight"};
	long mod[9], rk[9];
	for (int i = 0; i < 9; i++)
		x3_pack_order(&a, names[i], &mod[i], &rk[i]);
	/* selection sort by (module, rank) */
	int idx[9], ok = 1;
	for (int i = 0; i < 9; i++)
		idx[i] = i;
	for (int i = 0; i < 9; i++)
		for (int j = i + 1; j < 9; j++)
			if (mod[idx[j]] < mod[idx[i]] || (mod[idx[j]] == mod[idx[i]] && rk[idx[j]] < rk[idx[i]])) {
				int t = idx[i]; idx[i] = idx[j]; idx[j] = t;
			}
	for (int i = 0; i < 9; i++)
		if (strcmp(names[idx[i]], want[i])) {
			ok = 0;
			printf("# %d: %s want %s\n", i, names[idx[i]], want[i]);
		}
	CHECK(ok, "model order: embedding, layers numerically, q/k norms after q, mlp, final norm, head");
	CHECK(mod[2] != mod[3] && mod[3] == mod[4], "a layer is one module, layers differ");

	/* EXL3 linear check */
	int64_t ts[3] = {16, 8, 64};
	x3_tensor *tr = x3_tensor_new("k.trellis", X3_I16, 3, ts, 1), *suh = x3_tensor_new1("k.suh", X3_F16, 256),
	          *svh = x3_tensor_new1("k.svh", X3_F16, 128), *mul1 = scalar("k.mul1", X3_MUL1_MULT),
	          *mcg = scalar("k.mcg", X3_MCG_MULT), *bad = scalar("k.mul1", 7);
	int K, cb;
	CHECK_OK(x3_pack_check_exl3("k", 172, 64, tr, suh, svh, NULL, mul1, &K, &cb), "valid MUL1 linear");
	CHECK(K == 4 && cb == X3_CB_MUL1, "K 4, MUL1");
	CHECK_OK(x3_pack_check_exl3("k", 172, 64, tr, suh, svh, mcg, NULL, &K, &cb), "valid MCG linear");
	CHECK(cb == X3_CB_MCG, "MCG");
	CHECK_OK(x3_pack_check_exl3("k", 172, 64, tr, suh, svh, NULL, NULL, &K, &cb), "valid 3INST linear");
	CHECK(x3_pack_check_exl3("k", 172, 64, tr, suh, svh, mcg, mul1, &K, &cb) == X3_EFORMAT, "both markers");
	CHECK(x3_pack_check_exl3("k", 172, 64, tr, suh, svh, NULL, bad, &K, &cb) == X3_EFORMAT &&
	      strstr(x3_errmsg(), "locked"), "wrong multiplier: %s", x3_errmsg());
	CHECK(x3_pack_check_exl3("k", 172, 200, tr, suh, svh, NULL, NULL, &K, &cb) == X3_EFORMAT &&
	      strstr(x3_errmsg(), "expected 16x16x64"), "n mismatch: %s", x3_errmsg());
	CHECK(x3_pack_check_exl3("k", 172, 64, tr, NULL, svh, NULL, NULL, &K, &cb) == X3_EFORMAT &&
	      strstr(x3_errmsg(), "missing suh"), "missing suh: %s", x3_errmsg());
	x3_tensor_free(tr); x3_tensor_free(suh); x3_tensor_free(svh);
	x3_tensor_free(mul1); x3_tensor_free(mcg); x3_tensor_free(bad);

	/* config.json merging */
	x3_pack_qcfg q = {.bits = 3.456, .head_bits = 6, .cal_rows = 250, .cal_cols = 2048,
	                  .out_scales = "always", .codebook = "mcg", .version = "1.4.1"};
	char *out;
	CHECK_OK(x3_pack_config_json("{\"a\": 1, \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4},"
	                             " \"tied_word_embeddings\": false}", &q, &out), "foreign quantization_config");
	json_t *o = parse(out);
	json_t *qc = json_object_get(o, "quantization_config");
	CHECK(!strcmp(str(qc, "quant_method", NULL), "exl3") &&
	      !strcmp(str(qc, "original_quantization_config", "quant_method"), "gptq"),
	      "foreign block nested as original_quantization_config");
	CHECK(json_real_value(json_object_get(qc, "bits")) == 3.46, "bits rounded to 2 decimals");
	CHECK(json_is_true(json_object_get(o, "tied_word_embeddings")), "tied_word_embeddings set where it exists");
	CHECK(json_integer_value(json_object_get(o, "a")) == 1, "source fields kept");
	json_decref(o);
	free(out);
	CHECK_OK(x3_pack_config_json("{\"quantization_config\": {\"quant_method\": \"exl3\", \"version\": \"0.0.9\","
	                             " \"bits\": 5.0, \"head_bits\": 8, \"codebook\": \"3inst\", \"calibration\":"
	                             " {\"rows\": 10, \"cols\": 20}}}", &q, &out), "exl3 re-compile");
	o = parse(out);
	qc = json_object_get(o, "quantization_config");
	CHECK(!strcmp(str(qc, "version", NULL), "0.0.9") &&
	      json_integer_value(json_object_get(json_object_get(qc, "calibration"), "rows")) == 10 &&
	      !strcmp(str(qc, "codebook", NULL), "mcg") && json_integer_value(json_object_get(qc, "head_bits")) == 6 &&
	      json_real_value(json_object_get(qc, "bits")) == 3.46,
	      "existing exl3 block kept, bits/head_bits/codebook updated");
	CHECK(!json_object_get(o, "tied_word_embeddings"), "tied_word_embeddings not added");
	json_decref(o);
	free(out);

	/* a value jansson cannot write fails the whole document, naming it
	 * (it used to be dropped: a config without its codebook) */
	x3_pack_qcfg qb = q;
	qb.codebook = "mc\xffg";
	CHECK(x3_pack_config_json("{}", &qb, &out) == X3_EFORMAT && !out &&
	      strstr(x3_errmsg(), "config.json: cannot write 'codebook': the value is not UTF-8"),
	      "config.json with a codebook that is not UTF-8: an error naming it (%s)", x3_errmsg());
	CHECK(x3_pack_config_json("{\"quantization_config\": {\"quant_method\": \"exl3\"}}", &qb, &out) == X3_EFORMAT &&
	      !out && strstr(x3_errmsg(), "'codebook'"), "... also when it updates an exl3 block (%s)", x3_errmsg());
	const char *fk[] = { "model.layers.0.mlp.up_proj" }, *fw[] = { "no usable \xfe Hessian" };
	qb = q;
	qb.nfallback = 1, qb.fallback_key = fk, qb.fallback_why = fw;
	CHECK(x3_pack_qconfig_json(&qb, NULL, 0, &out) == X3_EFORMAT && !out &&
	      strstr(x3_errmsg(), "quantization_config.json: cannot write 'model.layers.0.mlp.up_proj': the value is not UTF-8"),
	      "quantization_config.json with a fallback reason that is not UTF-8: an error naming the key (%s)",
	      x3_errmsg());
	qb.fallback_why = fk;
	CHECK_OK(x3_pack_qconfig_json(&qb, NULL, 0, &out), "... and a valid one is written");
	free(out);
	qb = q;
	qb.version = NULL;
	CHECK(x3_pack_gptqmodel_json(&qb, NULL, 0, &out) && !out &&
	      strstr(x3_errmsg(), "quantize_config.json: cannot write 'version'"),
	      "quantize_config.json without a version: an error naming it (%s)", x3_errmsg());
	TEST_DONE();
}
