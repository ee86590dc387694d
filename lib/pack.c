/* pack.c: EXL3 model directory layout (see pack.h, spec §2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "x3.h"
#include "codec.h"
#include "pack.h"

int64_t x3_pack_pad128(int64_t n)
{
	return (n + 127) / 128 * 128;
}

static int get_int(json_t *o, const char *key, int64_t dflt, int64_t *v)
{
	json_t *j = json_object_get(o, key);
	if (!j || json_is_null(j)) {
		if (dflt < 0)
			return x3_err(X3_EFORMAT, "config.json: missing \"%s\"", key);
		*v = dflt;
		return X3_OK;
	}
	if (!json_is_integer(j) || json_integer_value(j) <= 0 || json_integer_value(j) > ((int64_t)1 << 31))
		return x3_err(X3_EFORMAT, "config.json: \"%s\" is not a positive integer", key);
	*v = json_integer_value(j);
	return X3_OK;
}

int x3_pack_arch_parse(const char *text, x3_pack_arch *a)
{
	json_error_t je;
	memset(a, 0, sizeof *a);
	json_t *o = json_loads(text, 0, &je);
	if (!o)
		return x3_err(X3_EFORMAT, "config.json: line %d: %s", je.line, je.text);
	if (!json_is_object(o)) {
		json_decref(o);
		return x3_err(X3_EFORMAT, "config.json: not a JSON object");
	}
	/* multimodal configs keep the language model under text_config */
	json_t *tc = json_object_get(o, "text_config");
	json_t *c = json_is_object(tc) && !json_object_get(o, "num_hidden_layers") ? tc : o;
	int64_t layers = 0;
	static const char *const moe[] = {"num_experts", "num_local_experts", "n_routed_experts"};
	for (size_t i = 0; i < sizeof moe / sizeof *moe; i++) {
		json_t *e = json_object_get(c, moe[i]);
		if (json_is_integer(e) && json_integer_value(e) > 0) {
			json_decref(o);
			return x3_err(X3_EUNSUP, "config.json: \"%s\": mixture-of-experts models are not "
			              "supported yet (dense Llama family only)", moe[i]);
		}
	}
	int rc = get_int(c, "num_hidden_layers", -1, &layers);
	if (!rc) rc = get_int(c, "hidden_size", -1, &a->hidden);
	if (!rc) rc = get_int(c, "intermediate_size", -1, &a->inter);
	if (!rc) rc = get_int(c, "num_attention_heads", -1, &a->heads);
	if (!rc) rc = get_int(c, "num_key_value_heads", a->heads, &a->kv_heads);
	if (!rc) rc = get_int(c, "vocab_size", -1, &a->vocab);
	if (!rc && a->hidden % a->heads && !json_object_get(c, "head_dim"))
		rc = x3_err(X3_EFORMAT, "config.json: hidden_size %lld is not a multiple of "
		            "num_attention_heads %lld and there is no head_dim",
		            (long long)a->hidden, (long long)a->heads);
	if (!rc) rc = get_int(c, "head_dim", a->hidden / a->heads, &a->head_dim);
	if (!rc && layers > 100000)
		rc = x3_err(X3_EFORMAT, "config.json: num_hidden_layers %lld is implausible", (long long)layers);
	a->layers = (int)layers;
	json_t *t = json_object_get(c, "tie_word_embeddings");
	if (!t && c != o)
		t = json_object_get(o, "tie_word_embeddings");
	a->tied = json_is_true(t);
	json_decref(o);
	return rc;
}

int x3_pack_linears(const x3_pack_arch *a, x3_pack_linear **out, int *n)
{
	static const char *names[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
		"self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
	int cnt = a->layers * 7 + 1;
	x3_pack_linear *v = calloc((size_t)cnt, sizeof *v);
	if (!v)
		return x3_err(X3_ENOMEM, "out of memory");
	int64_t qd = a->heads * a->head_dim, kvd = a->kv_heads * a->head_dim;
	int64_t in[7] = {a->hidden, a->hidden, a->hidden, qd, a->hidden, a->hidden, a->inter};
	int64_t o[7] = {qd, kvd, kvd, a->hidden, a->inter, a->inter, a->hidden};
	int k = 0;
	for (int l = 0; l < a->layers; l++)
		for (int j = 0; j < 7; j++, k++) {
			snprintf(v[k].key, sizeof v[k].key, "model.layers.%d.%s", l, names[j]);
			v[k].in = in[j];
			v[k].out = o[j];
			v[k].layer = l;
		}
	snprintf(v[k].key, sizeof v[k].key, "lm_head");
	v[k].in = a->hidden;
	v[k].out = a->vocab;
	v[k].layer = -1;
	*out = v;
	*n = cnt;
	return X3_OK;
}

static int want_shape(const x3_tensor *t, x3_dtype dt, int rank, const int64_t *shape)
{
	char got[128], want[128] = "";
	size_t o = 0;
	for (int d = 0; d < rank; d++)
		o += (size_t)snprintf(want + o, sizeof want - o, "%s%lld", d ? "x" : "", (long long)shape[d]);
	if (!rank)
		snprintf(want, sizeof want, "scalar");
	int bad = t->rank != rank;
	for (int d = 0; !bad && d < rank; d++)
		bad = t->shape[d] != shape[d];
	if (bad) {
		if (t->rank == 0)
			snprintf(got, sizeof got, "scalar");
		else
			x3_shape_str(t, got, sizeof got);
		return x3_err(X3_EFORMAT, "tensor '%s': shape %s, expected %s", t->name, got, want);
	}
	if (t->dtype != dt)
		return x3_err(X3_EFORMAT, "tensor '%s': dtype %s, expected %s", t->name,
		              x3_dtype_name(t->dtype), x3_dtype_name(dt));
	return X3_OK;
}

static int32_t scalar_i32(const x3_tensor *t)
{
	const unsigned char *p = t->data;
	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

int x3_pack_check_exl3(const char *key, int64_t in, int64_t out,
                       const x3_tensor *trellis, const x3_tensor *suh,
                       const x3_tensor *svh, const x3_tensor *mcg,
                       const x3_tensor *mul1, int *K, int *cb)
{
	int64_t k = x3_pack_pad128(in), n = x3_pack_pad128(out);
	if (!trellis || !suh || !svh)
		return x3_err(X3_EFORMAT, "linear '%s': missing %s%s%s", key, trellis ? "" : "trellis ",
		              suh ? "" : "suh ", svh ? "" : "svh");
	if (trellis->rank != 3 || trellis->shape[2] % 16 || trellis->shape[2] < 16 || trellis->shape[2] > 128)
		return x3_err(X3_EFORMAT, "tensor '%s': not a trellis of shape (k/16, n/16, 16K) with K in 1..8",
		              trellis->name);
	*K = (int)(trellis->shape[2] / 16);
	int64_t ts[3] = {k / 16, n / 16, trellis->shape[2]};
	int rc = want_shape(trellis, X3_I16, 3, ts);
	if (!rc) rc = want_shape(suh, X3_F16, 1, &k);
	if (!rc) rc = want_shape(svh, X3_F16, 1, &n);
	if (rc)
		return rc;
	if (mcg && mul1)
		return x3_err(X3_EFORMAT, "linear '%s': both mcg and mul1 markers", key);
	*cb = X3_CB_3INST;
	const x3_tensor *m = mcg ? mcg : mul1;
	if (m) {
		if ((rc = want_shape(m, X3_I32, 0, NULL)))
			return rc;
		uint32_t want = mcg ? X3_MCG_MULT : X3_MUL1_MULT;
		if (!m->data || m->nbytes != 4)
			return x3_err(X3_EFORMAT, "tensor '%s': no data", m->name);
		if ((uint32_t)scalar_i32(m) != want)
			return x3_err(X3_EFORMAT, "tensor '%s': value %d is not the locked multiplier %d "
			              "(0x%08X); ExLlamaV3 would mis-decode it", m->name, scalar_i32(m),
			              (int32_t)want, want);
		*cb = mcg ? X3_CB_MCG : X3_CB_MUL1;
	}
	return X3_OK;
}

/* order of the sub-modules inside a decoder layer */
static const char *const layer_parts[] = {
	"input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
	"self_attn.q_norm", "self_attn.k_norm", "self_attn.o_proj", "self_attn.",
	"post_attention_layernorm", "pre_feedforward_layernorm", "mlp.gate_proj",
	"mlp.up_proj", "mlp.down_proj", "mlp.", "post_feedforward_layernorm",
};
static const char *const suffixes[] = {"trellis", "suh", "svh", "su", "sv", "mcg", "mul1", "weight", "bias"};

static long suffix_rank(const char *name)
{
	const char *dot = strrchr(name, '.');
	const char *s = dot ? dot + 1 : name;
	for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++)
		if (!strcmp(s, suffixes[i]))
			return (long)i;
	return 15;
}

void x3_pack_order(const char *name, long *module, long *rank)
{
	static const char lp[] = "model.layers.";
	*rank = suffix_rank(name);
	if (!strncmp(name, "model.embed_tokens.", 19)) {
		*module = 0;
		return;
	}
	if (!strncmp(name, lp, sizeof lp - 1)) {
		char *end;
		long l = strtol(name + sizeof lp - 1, &end, 10);
		if (end != name + sizeof lp - 1 && *end == '.' && l >= 0 && l < 1000000) {
			*module = 1 + l;
			const char *rest = end + 1;
			size_t np = sizeof layer_parts / sizeof *layer_parts;
			long part = (long)np;
			for (size_t i = 0; i < np; i++)
				if (!strncmp(rest, layer_parts[i], strlen(layer_parts[i]))) {
					part = (long)i;
					break;
				}
			*rank += 16 * part;
			return;
		}
	}
	if (!strncmp(name, "model.norm.", 11))
		*module = 2000000;
	else if (!strncmp(name, "lm_head.", 8))
		*module = 2000001;
	else
		*module = 2000002;
}

static json_t *qcfg_block(const x3_pack_qcfg *q)
{
	json_t *b = json_object(), *cal = json_object();
	json_object_set_new(b, "quant_method", json_string("exl3"));
	json_object_set_new(b, "version", json_string(q->version));
	json_object_set_new(b, "bits", json_real(round(q->bits * 100) / 100));
	json_object_set_new(b, "head_bits", json_integer(q->head_bits));
	json_object_set_new(cal, "rows", json_integer(q->cal_rows));
	json_object_set_new(cal, "cols", json_integer(q->cal_cols));
	json_object_set_new(b, "calibration", cal);
	json_object_set_new(b, "out_scales", json_string(q->out_scales));
	json_object_set_new(b, "codebook", json_string(q->codebook));
	return b;
}

static char *dump(json_t *o)
{
	char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
	if (!s)
		x3_err(X3_ENOMEM, "cannot encode JSON");
	return s;
}

int x3_pack_config_json(const char *src, const x3_pack_qcfg *q, char **out)
{
	json_error_t je;
	*out = NULL;
	json_t *o = json_loads(src, 0, &je);
	if (!o || !json_is_object(o)) {
		json_decref(o);
		return x3_err(X3_EFORMAT, "config.json: %s", o ? "not an object" : je.text);
	}
	json_t *old = json_object_get(o, "quantization_config");
	json_t *qm = json_is_object(old) ? json_object_get(old, "quant_method") : NULL;
	if (json_is_string(qm) && !strcmp(json_string_value(qm), "exl3")) {
		/* re-compile: keep the block, update what changed */
		json_object_set_new(old, "bits", json_real(round(q->bits * 100) / 100));
		json_object_set_new(old, "head_bits", json_integer(q->head_bits));
		json_object_set_new(old, "codebook", json_string(q->codebook));
	} else {
		json_t *b = qcfg_block(q);
		if (old)
			json_object_set(b, "original_quantization_config", old);
		json_object_set_new(o, "quantization_config", b);
	}
	if (json_object_get(o, "tied_word_embeddings"))
		json_object_set_new(o, "tied_word_embeddings", json_true());
	*out = dump(o);
	json_decref(o);
	return *out ? X3_OK : X3_ENOMEM;
}

static void torch_names(x3_dtype t, const char **torch, const char **plain)
{
	static const char *const n[X3_DTYPE_COUNT] = {
		[X3_F64] = "float64", [X3_F32] = "float32", [X3_F16] = "float16",
		[X3_BF16] = "bfloat16", [X3_I64] = "int64", [X3_I32] = "int32",
		[X3_I16] = "int16", [X3_I8] = "int8", [X3_U64] = "uint64", [X3_U32] = "uint32",
		[X3_U16] = "uint16", [X3_U8] = "uint8", [X3_BOOL] = "bool",
		[X3_F8_E4M3] = "float8_e4m3fn", [X3_F8_E5M2] = "float8_e5m2",
	};
	static char buf[X3_DTYPE_COUNT][32];
	*plain = (unsigned)t < X3_DTYPE_COUNT && n[t] ? n[t] : "unknown";
	if ((unsigned)t < X3_DTYPE_COUNT) {
		snprintf(buf[t], sizeof buf[t], "torch.%s", *plain);
		*torch = buf[t];
	} else {
		*torch = "unknown";
	}
}

/* tensor_storage over t[0..n), grouped by leaf module (the tensor name
 * without its last component). exl3_only: only modules with a trellis. */
static json_t *tensor_storage(x3_tensor *const *t, int n, int exl3_only)
{
	json_t *ts = json_object();
	for (int i = 0; i < n; i++) {
		const char *name = t[i]->name, *dot = strrchr(name, '.');
		char mod[512];
		snprintf(mod, sizeof mod, "%.*s", dot ? (int)(dot - name) : (int)strlen(name), name);
		if (exl3_only) {
			int q = 0;
			for (int j = 0; j < n && !q; j++)
				q = !strncmp(t[j]->name, mod, strlen(mod)) && !strcmp(t[j]->name + strlen(mod), ".trellis");
			if (!q)
				continue;
		}
		json_t *m = json_object_get(ts, mod);
		if (!m) {
			m = json_object();
			json_object_set_new(m, "stored_tensors", json_object());
			json_object_set_new(ts, mod, m);
		}
		json_t *e = json_object(), *shape = json_array();
		for (int d = 0; d < t[i]->rank; d++)
			json_array_append_new(shape, json_integer(t[i]->shape[d]));
		const char *torch, *plain;
		torch_names(t[i]->dtype, &torch, &plain);
		json_object_set_new(e, "shape", shape);
		json_object_set_new(e, "n_bytes", json_integer((json_int_t)t[i]->nbytes));
		json_object_set_new(e, "dtype", json_string(torch));        /* ExLlamaV3 */
		json_object_set_new(e, "torch_dtype", json_string(plain));  /* GPTQModel */
		json_object_set_new(json_object_get(m, "stored_tensors"), name, e);
		const char *leaf = dot ? dot + 1 : name;
		if (!strcmp(leaf, "trellis") && t[i]->rank == 3) {
			json_object_set_new(m, "quant_format", json_string("exl3"));
			json_object_set_new(m, "bits_per_weight", json_integer(t[i]->shape[2] / 16));
		} else if (!strcmp(leaf, "mul1")) {
			json_object_set_new(m, "mul1_multiplier", json_integer(X3_MUL1_MULT));
		} else if (!strcmp(leaf, "mcg")) {
			json_object_set_new(m, "mcg_multiplier", json_integer(X3_MCG_MULT));
		}
	}
	return ts;
}

int x3_pack_qconfig_json(const x3_pack_qcfg *q, x3_tensor *const *t, int n, char **out)
{
	json_t *root = qcfg_block(q);
	json_object_set_new(root, "tensor_storage", tensor_storage(t, n, 0));
	*out = dump(root);
	json_decref(root);
	return *out ? X3_OK : X3_ENOMEM;
}

int x3_pack_gptqmodel_json(const x3_pack_qcfg *q, x3_tensor *const *t, int n, char **out)
{
	json_t *root = qcfg_block(q);
	json_object_set_new(root, "tensor_storage", tensor_storage(t, n, 1));
	*out = dump(root);
	json_decref(root);
	return *out ? X3_OK : X3_ENOMEM;
}

int x3_pack_plan_parse(const char *text, const char *label, const x3_pack_linear *lin,
                       int nlin, x3_pack_plan *p)
{
	memset(p, 0, sizeof *p);
	p->bits = NAN;
	json_error_t je;
	json_t *o = json_loads(text, 0, &je);
	if (!o)
		return x3_err(X3_EFORMAT, "%s: line %d: %s", label, je.line, je.text);
	json_t *t = json_object_get(o, "tensors");
	int rc = X3_OK;
	if (!json_is_object(t)) {
		rc = x3_err(X3_EFORMAT, "%s: no \"tensors\" object (not a bitalloc plan)", label);
		goto out;
	}
	if (!(p->K = calloc(nlin > 0 ? (size_t)nlin : 1, sizeof *p->K))) {
		rc = x3_err(X3_ENOMEM, "%s: out of memory", label);
		goto out;
	}
	const char *k;
	json_t *v;
	json_object_foreach(t, k, v) {
		int j = 0;
		while (j < nlin && strcmp(lin[j].key, k))
			j++;
		if (j == nlin) {
			rc = x3_err(X3_EFORMAT, "%s: tensor '%s' is not a linear of the architecture", label, k);
			goto out;
		}
		if (!json_is_integer(v)) {
			rc = x3_err(X3_EFORMAT, "%s: tensor '%s': K is not an integer", label, k);
			goto out;
		}
		json_int_t K = json_integer_value(v);
		if (K < 1 || K > 8) {
			rc = x3_err(X3_EFORMAT, "%s: tensor '%s': K=%lld is not 1..8", label, k, (long long)K);
			goto out;
		}
		p->K[j] = (int)K;
	}
	json_t *hb = json_object_get(o, "head_bits");
	if (hb) {
		json_int_t h = json_is_integer(hb) ? json_integer_value(hb) : 0;
		if (!json_is_integer(hb) || h < 1 || (h > 8 && h != 16)) {
			rc = x3_err(X3_EFORMAT, "%s: \"head_bits\" is not an integer 1..8 or 16", label);
			goto out;
		}
		p->head_bits = (int)h;
	}
	json_t *b = json_object_get(o, "bits");
	if (b && json_is_number(b))
		p->bits = json_number_value(b);
out:
	json_decref(o);
	if (rc)
		x3_pack_plan_free(p);
	return rc;
}

void x3_pack_plan_free(x3_pack_plan *p)
{
	free(p->K);
	p->K = NULL;
}
