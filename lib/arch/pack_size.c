/* pack_size.c: the size of a pack before any encode (see pack.h): the
 * bytes pack-write would write for a conversion at given bit widths. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include "x3.h"
#include "codec.h"
#include "pack.h"

int64_t x3_pack_trellis_bytes_per_bit(const x3_module *m)
{
	/* trellis I16 (k/16, n/16, 16K): k n K / 8 bytes, k, n padded to 128 */
	return x3_pack_pad128(m->in) * x3_pack_pad128(m->out) / 8;
}

struct sz_ent { x3_tensor *t; long module, rank; };

static int sz_cmp(const void *a, const void *b)
{
	const struct sz_ent *x = a, *y = b;
	return x3_pack_cmp(x->module, x->rank, x->t->name, y->module, y->rank, y->t->name);
}

static int cb_of(const char *name)
{
	return !strcmp(name, "mcg") ? X3_CB_MCG : !strcmp(name, "3inst") ? X3_CB_3INST : X3_CB_MUL1;
}

struct x3_pack_sizer {
	x3_model_config cfg;
	x3_module *mods;
	int nmods;
	x3_st *src;
	char *src_dir, *cfg_text;
	x3_pack_size_opts o;
	char *codebook, *out_scales;
};

int x3_pack_sizer_open(const char *src, const x3_pack_size_opts *o, x3_pack_sizer **out)
{
	*out = NULL;
	x3_pack_sizer *s = calloc(1, sizeof *s);
	if (!s)
		return x3_err(X3_ENOMEM, "out of memory");
	s->o = *o;
	int rc = X3_OK;
	if (!(s->src_dir = strdup(src)) || !(s->codebook = strdup(o->codebook ? o->codebook : "mul1")) ||
	    !(s->out_scales = strdup(o->out_scales ? o->out_scales : "always")))
		rc = x3_err(X3_ENOMEM, "out of memory");
	if (!rc && (rc = x3_config_text(src, &s->cfg_text, NULL)))
		;
	else if (!rc && (rc = x3_config_parse_as(s->cfg_text, strlen(s->cfg_text), X3_CONFIG_LAYOUT, &s->cfg)))
		x3_errprefix(rc, "%s", src);
	else if (!rc && (rc = x3_st_open(src, &s->src)))
		x3_errprefix(rc, "%s", src);
	else if (!rc && ((rc = x3_arch_fused_scan(&s->cfg, s->src)) || (rc = x3_arch_mtp_scan(&s->cfg, s->src))))
		x3_errprefix(rc, "%s", src);
	else if (!rc && o->vision_bits && (rc = x3_config_vision(&s->cfg, o->vision_bits)))
		x3_errprefix(rc, "%s", src);
	else if (!rc && (rc = x3_arch_modules(&s->cfg, &s->mods, &s->nmods)))
		x3_errprefix(rc, "%s/config.json", src);
	if (rc) {
		x3_pack_sizer_close(s);
		return rc;
	}
	s->o.codebook = s->codebook;
	s->o.out_scales = s->out_scales;
	*out = s;
	return X3_OK;
}

void x3_pack_sizer_close(x3_pack_sizer *s)
{
	if (!s)
		return;
	if (s->src)
		x3_st_close(s->src);
	free(s->mods);
	free(s->cfg_text);
	free(s->src_dir);
	free(s->codebook);
	free(s->out_scales);
	free(s);
}

const x3_module *x3_pack_sizer_modules(const x3_pack_sizer *s, int *n)
{
	*n = s->nmods;
	return s->mods;
}

/* The stream of a conversion into in (*nin tensors): what trellis-encode
 * writes for every quantized linear at its K (the head at head_bits; none
 * at 16), its codebook's marker pointing at marker. */
static int size_stream(const x3_pack_sizer *sz, const int *K, int cb, unsigned char *marker,
                       x3_tensor **in, int *nin)
{
	int n = 0, rc = X3_OK;
	for (int j = 0; j < sz->nmods && !rc; j++) {
		const x3_module *m = &sz->mods[j];
		if (m->d->kind != X3_KIND_LINEAR)
			continue;
		int k = m->d->role == X3_ROLE_HEAD ? sz->o.head_bits :
		        m->d->role == X3_ROLE_MTP ? (sz->o.mtp_bits ? sz->o.mtp_bits : 4) :
		        m->d->role == X3_ROLE_VISION ? sz->cfg.vision_bits : K[j];
		if (k == 16)
			continue;
		if (k < 1 || k > 8) {
			rc = x3_err(X3_EINVAL, "linear '%s': K=%d is not in 1..8", m->key, k);
			break;
		}
		int64_t kp = x3_pack_pad128(m->in), np = x3_pack_pad128(m->out);
		int64_t ts[3] = {kp / 16, np / 16, 16 * k};
		char name[X3_KEY_MAX + 16];
		snprintf(name, sizeof name, "%s.trellis", m->key);
		in[n] = x3_tensor_new(name, X3_I16, 3, ts, 0);
		if (in[n])
			n++;
		snprintf(name, sizeof name, "%s.suh", m->key);
		if ((in[n] = x3_tensor_new1(name, X3_F16, kp)))
			n++;
		snprintf(name, sizeof name, "%s.svh", m->key);
		if ((in[n] = x3_tensor_new1(name, X3_F16, np)))
			n++;
		if (cb != X3_CB_3INST) {
			snprintf(name, sizeof name, "%s.%s", m->key, cb == X3_CB_MCG ? "mcg" : "mul1");
			if ((in[n] = x3_tensor_new(name, X3_I32, 0, NULL, 0))) {
				in[n]->data = marker;   /* classify checks the multiplier */
				n++;
			}
		}
		if (n == 0 || !in[n - 1])
			rc = x3_err(X3_ENOMEM, "out of memory");
	}
	*nin = n;
	return rc;
}

/* The shards of layout L, in model order, by the writer's own code: the
 * tensor, safetensors and shard counts into out; hdr[i] the i-th tensor
 * written. */
static int size_shards(const x3_pack_sizer *sz, const x3_pack_layout *L, x3_tensor **hdr,
                       x3_pack_size_info *out)
{
	struct sz_ent *e = calloc((size_t)L->nent + 1, sizeof *e);
	if (!e)
		return x3_err(X3_ENOMEM, "out of memory");
	for (int i = 0; i < L->nent; i++) {
		e[i].t = L->ent[i].t;
		x3_pack_order(&sz->cfg, e[i].t->name, &e[i].module, &e[i].rank);
		out->tensor_bytes += e[i].t->nbytes;
	}
	qsort(e, (size_t)L->nent, sizeof *e, sz_cmp);
	x3_stw *w;
	int rc = x3_stw_create_sizer(sz->o.shard_bytes, 0, &w);
	if (rc) {
		free(e);
		return rc;
	}
	long module = -1;
	for (int i = 0; i < L->nent && !rc; i++) {
		if (e[i].module != module) {
			x3_stw_module(w);
			module = e[i].module;
		}
		rc = x3_stw_add(w, e[i].t);
		hdr[i] = e[i].t;
	}
	free(e);
	if (rc) {
		x3_stw_abort(w);
		return rc;
	}
	uint64_t st_bytes;
	if ((rc = x3_stw_size(w, &st_bytes, &out->nshards)))
		return rc;
	out->safetensors_bytes = st_bytes;
	out->ntensors = L->nent;
	return X3_OK;
}

/* The bytes of the three JSON texts, as pack-write writes them, into
 * out->json_bytes (and the bits per weight into out->bits). */
static int size_json(const x3_pack_sizer *sz, const x3_pack_layout *L, x3_tensor **hdr,
                     x3_pack_size_info *out)
{
	out->bits = L->sum_n > 0 ? L->sum_k / L->sum_n : 0;
	/* the MTP layer's and the vision tower's linears are encoded without
	 * a Hessian: each is a "fallback" entry of quantization_config.json */
	int nfb = 0, rc;
	const char **fbk = calloc((size_t)sz->nmods + 1, sizeof *fbk), **fbw = calloc((size_t)sz->nmods + 1, sizeof *fbw);
	if (!fbk || !fbw) {
		free(fbk), free(fbw);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	for (int j = 0; j < sz->nmods; j++)
		if (sz->mods[j].d->kind == X3_KIND_LINEAR &&
		    (sz->mods[j].d->role == X3_ROLE_MTP || sz->mods[j].d->role == X3_ROLE_VISION)) {
			fbk[nfb] = sz->mods[j].key;
			fbw[nfb++] = X3_FALLBACK_NO_HESSIAN;
		}
	x3_pack_qcfg q = {
		.bits = out->bits, .head_bits = L->head_bits ? L->head_bits : sz->o.head_bits ? sz->o.head_bits : 16,
		.mtp_bits = L->mtp_bits, .vision_bits = L->vision_bits, .nfallback = nfb, .fallback_key = fbk, .fallback_why = fbw,
		.cal_rows = sz->o.cal_rows, .cal_cols = sz->o.cal_cols,
		.out_scales = sz->o.out_scales ? sz->o.out_scales : "always",
		.codebook = sz->o.codebook ? sz->o.codebook : "mul1", .version = "1.4.1",
		.measurement = sz->o.measurement,
	};
	char *txt = NULL;
	rc = x3_pack_config_json(sz->cfg_text, &q, &txt);
	if (!rc) {
		out->json_bytes += strlen(txt);
		free(txt);
		txt = NULL;
		rc = x3_pack_qconfig_json(&q, hdr, L->nent, &txt);
	}
	free(fbk), free(fbw);
	if (rc) {
		free(txt);
		return rc;
	}
	out->json_bytes += strlen(txt);
	free(txt);
	txt = NULL;
	if ((rc = x3_pack_gptqmodel_json(&q, hdr, L->nent, &txt))) {
		free(txt);
		return rc;
	}
	out->json_bytes += strlen(txt);
	free(txt);
	return X3_OK;
}

/* The files pack-write copies from SRC: their count and bytes into out. */
static int size_copied(const x3_pack_sizer *sz, x3_pack_size_info *out)
{
	DIR *d = opendir(sz->src_dir);
	if (!d)
		return x3_err(X3_EIO, "%s: %s", sz->src_dir, strerror(errno));
	struct dirent *de;
	while ((de = readdir(d))) {
		char p[4096];
		const char *why;
		struct stat st;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", sz->src_dir, de->d_name);
		if (stat(p, &st) != 0 || !S_ISREG(st.st_mode) || !x3_pack_copies(de->d_name, &why))
			continue;
		out->copied_bytes += (uint64_t)st.st_size;
		out->ncopied++;
	}
	closedir(d);
	return X3_OK;
}

int x3_pack_size(const x3_pack_sizer *sz, const int *K, x3_pack_size_info *out)
{
	memset(out, 0, sizeof *out);
	int rc, nin = 0, cb = cb_of(sz->o.codebook ? sz->o.codebook : "mul1");
	x3_tensor **in = calloc((size_t)sz->nmods * 4 + 1, sizeof *in);
	x3_tensor **hdr = NULL;
	x3_pack_layout L;
	int have_layout = 0;
	unsigned char marker[4];
	uint32_t mult = cb == X3_CB_MCG ? X3_MCG_MULT : X3_MUL1_MULT;
	for (int b = 0; b < 4; b++)
		marker[b] = (unsigned char)(mult >> (8 * b));
	if (!in)
		return x3_err(X3_ENOMEM, "out of memory");
	rc = size_stream(sz, K, cb, marker, in, &nin);
	x3_pack_in pin = {
		.cfg = &sz->cfg, .mods = sz->mods, .nmods = sz->nmods, .in = in, .nin = nin, .src = sz->src,
		.src_name = sz->src_dir, .passthrough = 1, .head_bits = sz->o.head_bits,
	};
	if (!rc && !(rc = x3_pack_classify(&pin, &L)))
		have_layout = 1;
	if (!rc && L.nprob)
		rc = x3_err(X3_EFORMAT, "%s (and %d more problems)", L.prob[0], L.nprob - 1);
	if (!rc && !(hdr = calloc((size_t)L.nent + 1, sizeof *hdr)))
		rc = x3_err(X3_ENOMEM, "out of memory");
	if (!rc)
		rc = size_shards(sz, &L, hdr, out);
	if (!rc)
		rc = size_json(sz, &L, hdr, out);
	if (!rc)
		rc = size_copied(sz, out);
	if (!rc)
		out->total = out->safetensors_bytes + out->json_bytes + out->copied_bytes;
	free(hdr);
	if (have_layout)
		x3_pack_layout_free(&L);
	for (int i = 0; i < nin; i++) {
		if (in[i]->rank == 0)
			in[i]->data = NULL;   /* the marker on our stack */
		x3_tensor_free(in[i]);
	}
	free(in);
	return rc;
}
