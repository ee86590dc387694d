/* reader.c: the reader contract (see reader.h). */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include "reader.h"
#include "arch.h"
#include "codec.h"
#include "exl3.h"
#include "io.h"
#include "pack.h"
#include "safetensors.h"

static const char *const names[X3_READER_COUNT] = { "exllamav3", "gptqmodel", "strict" };

const char *x3_reader_name(int r) { return r >= 0 && r < X3_READER_COUNT ? names[r] : "?"; }

int x3_reader_lookup(const char *name)
{
	for (int r = 0; r < X3_READER_COUNT; r++)
		if (!strcmp(name, names[r]))
			return r;
	return -1;
}

const char *x3_reader_names(void) { return "exllamav3, gptqmodel, strict"; }

/* Why the reader does not load this model, or NULL: the architecture
 * (the description's readers), or ExLlamaV3 v1.4.1's routing: its
 * deepseek_v3.py asserts n_group and topk_group in (None, 1); glm4_moe.py
 * routes with one group whatever n_group says; qwen3_moe.py and
 * glm4_moe.py renormalize the top-k weights whatever norm_topk_prob says
 * (either would run another model than this one). */
static const char *refusal(int r, const x3_model_config *c, const char **rule, char *buf, size_t n)
{
	*rule = "family";
	if (r == X3_READER_STRICT)
		return NULL;
	if (!c->desc || !(c->desc->readers & X3_RD(r))) {
		snprintf(buf, n, "%s does not load %s (%s)", names[r], c->arch_name,
		         c->desc ? c->desc->family : "unknown architecture");
		return buf;
	}
	if (r != X3_READER_EXLLAMAV3)
		return NULL;
	*rule = "routing";
	if (c->arch == X3_ARCH_DEEPSEEK_V3 && (c->n_group > 1 || c->topk_group > 1)) {
		snprintf(buf, n, "n_group %lld, topk_group %lld: ExLlamaV3 refuses grouped routing (it "
		         "asserts n_group and topk_group in (None, 1))", (long long)c->n_group,
		         (long long)c->topk_group);
		return buf;
	}
	if (c->arch == X3_ARCH_GLM4_MOE && (c->n_group > 1 || c->topk_group > 1)) {
		snprintf(buf, n, "n_group %lld, topk_group %lld: ExLlamaV3 routes GLM-4-MoE with one group, "
		         "another model than this one", (long long)c->n_group, (long long)c->topk_group);
		return buf;
	}
	if (c->hybrid && c->n_experts > 0 && !c->norm_topk) {
		snprintf(buf, n, "norm_topk_prob false: ExLlamaV3 asserts it true for %s", c->desc->family);
		return buf;
	}
	*rule = "layers";
	for (int l = 0; c->arch == X3_ARCH_QWEN3_NEXT && l < c->n_layers; l++) {
		if (x3_arch_linear_layer(c, l) != ((l + 1) % c->full_interval != 0)) {
			snprintf(buf, n, "layer %d: layer_types disagree with full_attention_interval %lld, which "
			         "ExLlamaV3's Qwen3-Next follows alone (another model than this one)", l,
			         (long long)c->full_interval);
			return buf;
		}
		if (!x3_arch_sparse_layer(c, l)) {
			snprintf(buf, n, "layer %d is dense (mlp_only_layers, decoder_sparse_step): ExLlamaV3's "
			         "Qwen3-Next builds every layer with experts", l);
			return buf;
		}
	}
	*rule = "routing";
	if ((c->arch == X3_ARCH_QWEN3_MOE || c->arch == X3_ARCH_GLM4_MOE) && !c->norm_topk) {
		snprintf(buf, n, "norm_topk_prob false: ExLlamaV3 renormalizes the top-k routing weights, "
		         "another model than this one");
		return buf;
	}
	return NULL;
}

int x3_reader_loads(int r, const x3_model_config *c)
{
	const char *rule;
	char buf[256];
	return !refusal(r, c, &rule, buf, sizeof buf);
}

int x3_reader_refuses(int r, const x3_model_config *c, char *buf, size_t n)
{
	const char *rule;
	return refusal(r, c, &rule, buf, n) != NULL;
}

struct ctx {
	int reader;
	const char *dir;
	x3_reader_violation *v;
	int n, cap;
	int err;                     /* out of memory */
};

static void violation(struct ctx *x, const char *what, const char *rule, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void violation(struct ctx *x, const char *what, const char *rule, const char *fmt, ...)
{
	if (x->n == x->cap) {
		int cap = x->cap ? 2 * x->cap : 16;
		x3_reader_violation *nv = realloc(x->v, (size_t)cap * sizeof *nv);
		if (!nv) {
			x->err = 1;
			return;
		}
		x->v = nv;
		x->cap = cap;
	}
	x3_reader_violation *v = &x->v[x->n++];
	snprintf(v->what, sizeof v->what, "%s", what);
	v->rule = rule;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(v->msg, sizeof v->msg, fmt, ap);
	va_end(ap);
}

static int exl(const struct ctx *x) { return x->reader == X3_READER_EXLLAMAV3 || x->reader == X3_READER_STRICT; }
static int gptq(const struct ctx *x) { return x->reader == X3_READER_GPTQMODEL || x->reader == X3_READER_STRICT; }

/* DIR/FILE as JSON, or NULL (missing, unreadable, not JSON, or not a
 * regular file: a FIFO there must not hang the check) */
static json_t *load_json(const char *dir, const char *file)
{
	char p[4096];
	int fd;
	snprintf(p, sizeof p, "%s/%s", dir, file);
	if (x3_open_regular(p, &fd))
		return NULL;
	json_t *j = json_loadfd(fd, 0, NULL);
	close(fd);
	return j;
}

static int exists(const char *dir, const char *file)
{
	char p[4096];
	struct stat sb;
	snprintf(p, sizeof p, "%s/%s", dir, file);
	return !stat(p, &sb) && S_ISREG(sb.st_mode);
}

/* family, routing: the reader loads the model (refusal) */
static void config_rules(struct ctx *x, const x3_model_config *c)
{
	const char *rule;
	char buf[256];
	if (refusal(x->reader, c, &rule, buf, sizeof buf))
		violation(x, "config.json", rule, "%s", buf);
}

/* architectures: exactly one entry (ExLlamaV3's Config.from_directory);
 * tensor_storage: GPTQModel's quantize config lists the EXL3 modules */
static void config_files(struct ctx *x, const x3_model_config *c)
{
	json_t *cfg = load_json(x->dir, "config.json");
	json_t *a = cfg ? json_object_get(cfg, "architectures") : NULL;
	if (exl(x) && (!json_is_array(a) || json_array_size(a) != 1))
		violation(x, "config.json", "architectures", "\"architectures\" must hold exactly one entry "
		          "(ExLlamaV3 reads the first and refuses others)");
	json_decref(cfg);
	if (gptq(x)) {
		json_t *q = load_json(x->dir, "quantize_config.json");
		json_t *ts = q ? json_object_get(q, "tensor_storage") : NULL;
		if (!json_is_object(ts) || !json_object_size(ts))
			violation(x, "quantize_config.json", "tensor_storage", "no non-empty \"tensor_storage\": "
			          "GPTQModel finds no EXL3 module to load");
		json_decref(q);
	}
	/* config: ExLlamaV3's gpt_oss.py reads these keys without a default
	 * (Hugging Face's GptOssConfig has defaults for them, exl3kit reads
	 * those: a config without them converts, but does not load) */
	static const char *const gpt_oss_keys[] = { "hidden_size", "num_attention_heads", "num_hidden_layers",
		"intermediate_size", "num_local_experts", "num_experts_per_tok", "rms_norm_eps", "sliding_window",
		"layer_types" };
	json_t *cj = load_json(x->dir, "config.json");
	for (size_t i = 0; exl(x) && c->arch == X3_ARCH_GPT_OSS && i < sizeof gpt_oss_keys / sizeof *gpt_oss_keys; i++)
		if (!cj || !json_object_get(cj, gpt_oss_keys[i]) || json_is_null(json_object_get(cj, gpt_oss_keys[i])))
			violation(x, "config.json", "config", "no \"%s\": ExLlamaV3's gpt_oss.py reads it without a "
			          "default and refuses the model", gpt_oss_keys[i]);
	json_decref(cj);
	if (exl(x) && (c->arch == X3_ARCH_QWEN3_5_MM || c->arch == X3_ARCH_QWEN3_5_MOE_MM) &&
	    !exists(x->dir, "preprocessor_config.json"))
		violation(x, "preprocessor_config.json", "files", "missing: ExLlamaV3 loads Qwen3.5's "
		          "multimodal model with its image preprocessor's config");
	if (exl(x) && c->arch == X3_ARCH_GEMMA3_MM && !exists(x->dir, "preprocessor_config.json"))
		violation(x, "preprocessor_config.json", "files", "missing: ExLlamaV3 loads Gemma3's "
		          "multimodal model with its image preprocessor's config");
}

static int is_shard_name(const char *n)
{
	unsigned a, b;
	char tail[32];
	if (!strcmp(n, "model.safetensors"))
		return 1;
	return sscanf(n, "model-%5u-of-%5u.%31s", &a, &b, tail) == 3 && !strcmp(tail, "safetensors") &&
	       strlen(n) == strlen("model-00001-of-00001.safetensors");
}

/* files: ExLlamaV3 reads every *.safetensors of the directory (not the
 * index); GPTQModel model.safetensors or the index's shards; strict: the
 * index lists every shard and every tensor where it is. */
static void file_rules(struct ctx *x, const x3_st *st)
{
	DIR *d = opendir(x->dir);
	int nshards = 0;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (l < 12 || strcmp(e->d_name + l - 12, ".safetensors"))
			continue;
		nshards++;
		if (!is_shard_name(e->d_name))
			violation(x, e->d_name, "files", "a .safetensors file that is no shard of the model: "
			          "%s", x->reader == X3_READER_GPTQMODEL ? "GPTQModel does not read it" :
			          "ExLlamaV3 reads every *.safetensors of the directory as the model's");
	}
	if (d)
		closedir(d);
	int has_index = exists(x->dir, "model.safetensors.index.json");
	if (gptq(x) && !has_index && !exists(x->dir, "model.safetensors"))
		violation(x, "model.safetensors", "files", "neither model.safetensors nor "
		          "model.safetensors.index.json: GPTQModel finds no weights");
	if (x->reader != X3_READER_STRICT)
		return;
	if (!has_index) {
		if (nshards > 1 || !exists(x->dir, "model.safetensors"))
			violation(x, "model.safetensors.index.json", "index", "missing: %d shards without an index",
			          nshards);
		return;
	}
	json_t *idx = load_json(x->dir, "model.safetensors.index.json");
	json_t *wm = idx ? json_object_get(idx, "weight_map") : NULL;
	if (!json_is_object(wm)) {
		violation(x, "model.safetensors.index.json", "index", "no \"weight_map\" object");
		json_decref(idx);
		return;
	}
	for (int i = 0; i < x3_st_count(st); i++) {
		const char *name = x3_st_get(st, i)->name, *file = x3_st_file(st, i);
		const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
		const char *in = json_string_value(json_object_get(wm, name));
		if (!in)
			violation(x, name, "index", "not in the index's weight_map (in %s)", base);
		else if (strcmp(in, base))
			violation(x, name, "index", "the index says %s, the tensor is in %s", in, base);
	}
	const char *k;
	json_t *v;
	json_object_foreach(wm, k, v) {
		if (!json_is_string(v) || !exists(x->dir, json_string_value(v)))
			violation(x, k, "index", "the index names shard %s, which is missing",
			          json_is_string(v) ? json_string_value(v) : "(not a string)");
		else if (!x3_st_find(st, k))
			violation(x, k, "index", "listed in the index, not in %s", json_string_value(v));
	}
	json_decref(idx);
}

/* dtype: ExLlamaV3 reads F32, F16, BF16, I32 and I16 only */
static void dtype_rules(struct ctx *x, const x3_st *st)
{
	if (!exl(x))
		return;
	for (int i = 0; i < x3_st_count(st); i++) {
		const x3_tensor *t = x3_st_get(st, i);
		if (t->dtype != X3_F32 && t->dtype != X3_F16 && t->dtype != X3_BF16 && t->dtype != X3_I32 &&
		    t->dtype != X3_I16)
			violation(x, t->name, "dtype", "dtype %s: ExLlamaV3 reads F32, F16, BF16, I32 and I16",
			          x3_dtype_name(t->dtype));
	}
}

/* A linear of the pack: its EXL3 parts, K and codebook (K 0: stored
 * unquantized as KEY.weight, -1: absent or unreadable). */
struct lin { int K, cb; int64_t in, out; };

static void read_linear(struct ctx *x, const x3_st *st, const x3_module *m, struct lin *L)
{
	static const char *const parts[] = { "trellis", "suh", "svh", "su", "sv", "mcg", "mul1", "bias" };
	const x3_tensor *ts[8];
	int nt = 0;
	char n[X3_KEY_MAX + 16];
	L->K = -1;
	L->cb = -1;
	for (size_t p = 0; p < sizeof parts / sizeof *parts; p++) {
		snprintf(n, sizeof n, "%s.%s", m->key, parts[p]);
		const x3_tensor *t = x3_st_find(st, n);
		if (t)
			ts[nt++] = t;
	}
	snprintf(n, sizeof n, "%s.trellis", m->key);
	if (!x3_st_find(st, n)) {
		if (x3_st_find(st, m->weight) || (m->tied && x3_st_find(st, m->weight)))
			L->K = 0;
		else
			violation(x, m->key, "present", "linear missing: neither %s.trellis nor %s", m->key,
			          m->weight);
		return;
	}
	x3_exl3_info q;
	if (x3_exl3_inspect(m->key, ts, nt, &q)) {
		violation(x, m->key, "present", "%s", x3_errmsg());
		return;
	}
	if (q.k != x3_pack_pad128(m->in) || q.n != x3_pack_pad128(m->out)) {
		violation(x, n, "present", "a %lldx%lld (in x out, padded) trellis, config.json gives %lldx%lld",
		          (long long)q.k, (long long)q.n, (long long)m->in, (long long)m->out);
		return;
	}
	L->K = q.K;
	L->cb = q.cb;
	L->in = m->in;
	L->out = m->out;
}

/* a linear's width as one number: K 0..8 (0 unquantized) and codebook */
#define WIDTHS (9 * X3_CB_COUNT)
static int width(const struct lin *l) { return l->K * X3_CB_COUNT + (l->K ? l->cb : 0); }

/* tied groups in order: by group, then by index */
static int tie_cmp(const void *a, const void *b, void *mods)
{
	const x3_module *m = mods;
	int i = *(const int *)a, j = *(const int *)b;
	int c = strcmp(m[i].tie, m[j].tie);
	return c ? c : i - j;
}

/* present, kept, tied, fused-codebook, aligned: the modules of the
 * description against the tensors */
static void module_rules(struct ctx *x, const x3_st *st, const x3_model_config *c)
{
	x3_module *m;
	int nm;
	if (x3_arch_modules(c, &m, &nm)) {
		violation(x, "config.json", "present", "%s", x3_errmsg());
		return;
	}
	struct lin *L = calloc((size_t)(nm ? nm : 1), sizeof *L);
	if (!L) {
		free(m);
		x->err = 1;
		return;
	}
	char n[X3_KEY_MAX + 16];
	for (int i = 0; i < nm; i++) {
		const x3_module *d = &m[i];
		L[i].K = -1;
		if (d->d->kind == X3_KIND_LINEAR) {
			read_linear(x, st, d, &L[i]);
			snprintf(n, sizeof n, "%s.bias", d->key);
			if (d->bias && !x3_st_find(st, n))
				violation(x, n, "present", "missing: config.json gives %s a bias", d->key);
			/* ExLlamaV3's Qwen3.5 MTP layer loads mtp.fc unpadded
			 * (qwen3_5_mtp.py: pad_to 1), the pack pads every linear */
			if (L[i].K > 0 && exl(x) && d->d->slot == X3_SLOT_MTP_FC && (c->desc->flags & X3_AF_HYBRID) &&
			    (d->in % 128 || d->out % 128))
				violation(x, d->key, "mtp-fc", "%lldx%lld (in x out) is not a multiple of 128: ExLlamaV3 "
				          "loads the MTP projection unpadded and would not match its padded trellis",
				          (long long)d->in, (long long)d->out);
			/* ... and its vision towers' MLP and patch merger linears
			 * (gemma3.py, qwen3_vl.py: pad_to 1) */
			if (L[i].K > 0 && exl(x) && d->d->slot == X3_SLOT_VISION_UNPADDED && (d->in % 128 || d->out % 128))
				violation(x, d->key, "vision-unpadded", "%lldx%lld (in x out) is not a multiple of 128: "
				          "ExLlamaV3 loads the vision tower's MLP and merger linears unpadded and would "
				          "not match their padded trellis", (long long)d->in, (long long)d->out);
			if (L[i].K > 0 && gptq(x) && (d->in % 128 || d->out % 128))
				violation(x, d->key, "aligned", "%lldx%lld (in x out) is not a multiple of 128: %s",
				          (long long)d->in, (long long)d->out, x->reader == X3_READER_GPTQMODEL ?
				          "GPTQModel sizes EXL3 modules from the unpadded model and cannot run it" :
				          "a strict reader takes only whole 128x128 blocks");
			continue;
		}
		snprintf(n, sizeof n, "%s.trellis", d->key);
		if (x3_st_find(st, n) && exl(x))
			violation(x, d->key, "kept", "quantized, but ExLlamaV3 reads %s as a plain tensor "
			          "(it keeps it in the source precision)", d->weight);
		else if (!x3_st_find(st, d->weight))
			violation(x, d->weight, "present", "missing: the model's %s %s",
			          x3_role_name(d->d->role), d->d->kind == X3_KIND_VECTOR ? "vector" : "matrix");
	}
	/* tied: one K and one codebook per tied group (MultiLinear asserts
	 * it); the members off the group's most common width are named. The
	 * groups' members in index order, group by group (a DeepSeek-V3 has
	 * ~45,000 expert linears: no pass over all modules per group) */
	int *ord = malloc((size_t)(nm > 0 ? nm : 1) * sizeof *ord), no = 0;
	if (!ord) {
		free(L);
		free(m);
		x->err = 1;
		return;
	}
	for (int i = 0; i < nm && exl(x); i++)
		if (m[i].tie[0] && L[i].K >= 0)
			ord[no++] = i;
	qsort_r(ord, (size_t)no, sizeof *ord, tie_cmp, m);
	for (int s = 0, e; s < no; s = e) {
		int cnt[WIDTHS] = {0}, best = ord[s];
		for (e = s; e < no && !strcmp(m[ord[e]].tie, m[ord[s]].tie); e++)
			cnt[width(&L[ord[e]])]++;
		for (int a = s; a < e; a++)   /* the most common; the first on a tie */
			if (cnt[width(&L[ord[a]])] > cnt[width(&L[best])])
				best = ord[a];
		for (int a = s; a < e; a++) {
			const struct lin *la = &L[ord[a]], *lb = &L[best];
			if (width(la) == width(lb))
				continue;
			char wa[32], wb[32];
			snprintf(wa, sizeof wa, la->K ? "K=%d %s" : "unquantized", la->K,
			         la->K ? x3_codebook_name(la->cb) : "");
			snprintf(wb, sizeof wb, lb->K ? "K=%d %s" : "unquantized", lb->K,
			         lb->K ? x3_codebook_name(lb->cb) : "");
			violation(x, m[ord[a]].key, "tied", "%s, but %d of its tied group %s are %s: ExLlamaV3 "
			          "loads the group as one MultiLinear and asserts one K and codebook", wa,
			          cnt[width(lb)], m[ord[s]].tie, wb);
		}
	}
	free(ord);
	/* fused-codebook: ExLlamaV3 fuses k/v and gate/up of equal K
	 * (attn.py, mlp.py) and then asserts one codebook */
	static const int pairs[][2] = { { X3_SLOT_K, X3_SLOT_V }, { X3_SLOT_GATE, X3_SLOT_UP },
	                                { X3_SLOT_SHX_GATE, X3_SLOT_SHX_UP } };
	for (int i = 0; i < nm && exl(x); i++)
		for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
			if (m[i].d->slot != pairs[p][0] || L[i].K <= 0 || m[i].expert >= 0)
				continue;
			int j0 = i, j1 = i;   /* the modules of i's layer, adjacent */
			while (j0 > 0 && m[j0 - 1].layer == m[i].layer)
				j0--;
			while (j1 + 1 < nm && m[j1 + 1].layer == m[i].layer)
				j1++;
			for (int j = j0; j <= j1; j++)
				if (m[j].expert < 0 && m[j].d->slot == pairs[p][1] &&
				    L[j].K == L[i].K && L[j].cb != L[i].cb)
					violation(x, m[j].key, "fused-codebook", "codebook %s, %s of the same K has %s: "
					          "ExLlamaV3 fuses them and asserts one codebook",
					          x3_codebook_name(L[j].cb), m[i].key, x3_codebook_name(L[i].cb));
		}
	free(L);
	free(m);
}

int x3_reader_check(int reader, const char *dir, x3_reader_violation **out, int *n)
{
	*out = NULL;
	*n = 0;
	if (reader < 0 || reader >= X3_READER_COUNT)
		return x3_err(X3_EINVAL, "unknown reader %d", reader);
	x3_model_config c;
	int rc = x3_config_load_as(dir, X3_CONFIG_LAYOUT, &c);
	if (rc)
		return rc;
	x3_st *st;
	if ((rc = x3_st_open(dir, &st)))
		return rc;
	struct ctx x = { reader, dir, NULL, 0, 0, 0 };
	config_rules(&x, &c);
	config_files(&x, &c);
	file_rules(&x, st);
	dtype_rules(&x, st);
	module_rules(&x, st, &c);
	x3_st_close(st);
	if (x.err) {
		free(x.v);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	*out = x.v;
	*n = x.n;
	return X3_OK;
}
