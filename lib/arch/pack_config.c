/* pack_config.c: the JSON texts of an EXL3 model directory (see pack.h,
 * exl3(5) §2.5): config.json with its quantization_config block,
 * quantization_config.json and GPTQModel's quantize_config.json. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <jansson.h>
#include "x3.h"
#include "codec.h"
#include "jsonw.h"
#include "strix.h"
#include "pack.h"

static json_t *qcfg_block(x3_jw *w, const x3_pack_qcfg *q)
{
	json_t *b = json_object(), *cal = json_object();
	x3_jw_set_str(w, b, "quant_method", "exl3");
	x3_jw_set_str(w, b, "version", q->version);
	x3_jw_set(w, b, "bits", json_real(round(q->bits * 100) / 100));
	x3_jw_set(w, b, "head_bits", json_integer(q->head_bits));
	if (q->mtp_bits)
		x3_jw_set(w, b, "mtp_bits", json_integer(q->mtp_bits));
	if (q->vision_bits)
		x3_jw_set(w, b, "vision_bits", json_integer(q->vision_bits));
	x3_jw_set(w, cal, "rows", json_integer(q->cal_rows));
	x3_jw_set(w, cal, "cols", json_integer(q->cal_cols));
	x3_jw_set(w, b, "calibration", cal);
	x3_jw_set_str(w, b, "out_scales", q->out_scales);
	x3_jw_set_str(w, b, "codebook", q->codebook);
	return b;
}

/* the text of o, or NULL with the error naming doc and what failed */
static int dump(const x3_jw *w, json_t *o, const char *doc, char **out)
{
	int rc;
	*out = x3_jw_dump(w, o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15), doc, &rc);
	json_decref(o);
	return rc;
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
	x3_jw w = X3_JW_INIT;
	json_t *old = json_object_get(o, "quantization_config");
	json_t *qm = json_is_object(old) ? json_object_get(old, "quant_method") : NULL;
	if (json_is_string(qm) && !strcmp(json_string_value(qm), "exl3")) {
		/* re-compile: keep the block, update what changed */
		x3_jw_set(&w, old, "bits", json_real(round(q->bits * 100) / 100));
		x3_jw_set(&w, old, "head_bits", json_integer(q->head_bits));
		if (q->mtp_bits)
			x3_jw_set(&w, old, "mtp_bits", json_integer(q->mtp_bits));
		if (q->vision_bits)
			x3_jw_set(&w, old, "vision_bits", json_integer(q->vision_bits));
		x3_jw_set_str(&w, old, "codebook", q->codebook);
	} else {
		json_t *b = qcfg_block(&w, q);
		if (old)
			x3_jw_set(&w, b, "original_quantization_config", json_incref(old));
		x3_jw_set(&w, o, "quantization_config", b);
	}
	if (json_object_get(o, "tied_word_embeddings"))
		x3_jw_set(&w, o, "tied_word_embeddings", json_true());
	return dump(&w, o, "config.json", out);
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
static json_t *tensor_storage(x3_jw *w, x3_tensor *const *t, int n, int exl3_only)
{
	json_t *ts = json_object();
	/* the modules with a trellis, by name (the trellis names, cut at
	 * their last dot) */
	x3_strix quant = X3_STRIX_INIT;
	char **qmod = exl3_only ? calloc((size_t)n + 1, sizeof *qmod) : NULL;
	if (exl3_only && !qmod)
		goto oom;
	for (int i = 0; exl3_only && i < n; i++) {
		size_t l = strlen(t[i]->name);
		if (l > 8 && !strcmp(t[i]->name + l - 8, ".trellis") &&
		    (!(qmod[i] = strndup(t[i]->name, l - 8)) || x3_strix_put(&quant, qmod[i], i)))
			goto oom;
	}
	for (int i = 0; i < n; i++) {
		const char *name = t[i]->name, *dot = strrchr(name, '.');
		char mod[512];
		snprintf(mod, sizeof mod, "%.*s", dot ? (int)(dot - name) : (int)strlen(name), name);
		if (exl3_only && x3_strix_get(&quant, mod) < 0)
			continue;
		json_t *m = json_object_get(ts, mod);
		if (!m) {
			m = json_object();
			x3_jw_set(w, m, "stored_tensors", json_object());
			x3_jw_set(w, ts, mod, m);
		}
		json_t *e = json_object(), *shape = json_array();
		for (int d = 0; d < t[i]->rank; d++)
			x3_jw_append(w, shape, "shape", json_integer(t[i]->shape[d]));
		const char *torch, *plain;
		torch_names(t[i]->dtype, &torch, &plain);
		x3_jw_set(w, e, "shape", shape);
		x3_jw_set(w, e, "n_bytes", json_integer((json_int_t)t[i]->nbytes));
		x3_jw_set_str(w, e, "dtype", torch);        /* ExLlamaV3 */
		x3_jw_set_str(w, e, "torch_dtype", plain);  /* GPTQModel */
		x3_jw_set(w, json_object_get(m, "stored_tensors"), name, e);
		const char *leaf = dot ? dot + 1 : name;
		if (!strcmp(leaf, "trellis") && t[i]->rank == 3) {
			x3_jw_set_str(w, m, "quant_format", "exl3");
			x3_jw_set(w, m, "bits_per_weight", json_integer(t[i]->shape[2] / 16));
		} else if (!strcmp(leaf, "mul1")) {
			x3_jw_set(w, m, "mul1_multiplier", json_integer(X3_MUL1_MULT));
		} else if (!strcmp(leaf, "mcg")) {
			x3_jw_set(w, m, "mcg_multiplier", json_integer(X3_MCG_MULT));
		}
	}
	if (0) {
oom:    /* a NULL value: x3_jw_set records the failure */
		json_decref(ts);
		ts = NULL;
	}
	x3_strix_free(&quant);
	for (int i = 0; qmod && i < n; i++)
		free(qmod[i]);
	free(qmod);
	return ts;
}

int x3_pack_qconfig_json(const x3_pack_qcfg *q, x3_tensor *const *t, int n, char **out)
{
	x3_jw w = X3_JW_INIT;
	json_t *root = qcfg_block(&w, q), *fb = q->nfallback ? json_object() : NULL;
	x3_jw_set(&w, root, "tensor_storage", tensor_storage(&w, t, n, 0));
	for (int i = 0; i < q->nfallback; i++)
		x3_jw_set_str(&w, fb, q->fallback_key[i], q->fallback_why[i]);
	if (fb)
		x3_jw_set(&w, root, "fallback", fb);
	if (q->measurement) {
		json_error_t je;
		json_t *m = json_loads(q->measurement, 0, &je);
		if (!json_is_object(m)) {
			json_decref(root);
			json_decref(m);
			return x3_err(X3_EFORMAT, "quantization_config.json: the plan's measurement: %s",
			              m ? "not an object" : je.text);
		}
		x3_jw_set(&w, root, "measurement", m);
	}
	return dump(&w, root, "quantization_config.json", out);
}

int x3_pack_gptqmodel_json(const x3_pack_qcfg *q, x3_tensor *const *t, int n, char **out)
{
	x3_jw w = X3_JW_INIT;
	json_t *root = qcfg_block(&w, q);
	x3_jw_set(&w, root, "tensor_storage", tensor_storage(&w, t, n, 1));
	return dump(&w, root, "quantize_config.json", out);
}
