/* pack.c: EXL3 model directory layout (see pack.h, exl3(5) §2): the checks on
 * one quantized linear's tensors, which tensors the directory holds and
 * where each one's bytes come from (classification and the completeness
 * check), the source files it copies and its model order. The JSON texts
 * are pack_config.c's, the roles by key name pack_role.c's, the size
 * before any encode pack_size.c's, the plan pack_plan.c's. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "x3.h"
#include "codec.h"
#include "pack.h"
#include "strix.h"

int64_t x3_pack_pad128(int64_t n)
{
	return (n + 127) / 128 * 128;
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

void x3_pack_order(const x3_model_config *c, const char *name, long *module, long *rank)
{
	x3_arch_order(c, name, module, rank);
}

/* ---- classification and the completeness check ---------------------- */

enum { P_TRELLIS, P_SUH, P_SVH, P_MCG, P_MUL1, P_BIAS, P_WEIGHT, P_COUNT };
static const char *const part_name[P_COUNT] = {"trellis", "suh", "svh", "mcg", "mul1", "bias", "weight"};

static int problem(x3_pack_layout *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int problem(x3_pack_layout *l, const char *fmt, ...)
{
	if (l->nprob < 200) {
		char buf[1024];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(buf, sizeof buf, fmt, ap);
		va_end(ap);
		char **np = realloc(l->prob, (size_t)(l->nprob + 1) * sizeof *np);
		if (!np || !(np[l->nprob] = strdup(buf))) {
			if (np)
				l->prob = np;
			return x3_err(X3_ENOMEM, "out of memory");
		}
		l->prob = np;
	}
	l->nprob++;
	return X3_OK;
}

static int is_float(x3_dtype t)
{
	return t == X3_F64 || t == X3_F32 || t == X3_F16 || t == X3_BF16;
}

/* Stored dtype of a pass-through tensor: F32 and F64 become F16 (ExLlamaV3
 * loads floats as F16 anyway, and its safetensors reader knows only F32,
 * F16, BF16, I32 and I16: loader/safetensors.py, convert_dtype). */
static x3_dtype passthrough_dtype(x3_dtype t)
{
	return t == X3_F32 || t == X3_F64 ? X3_F16 : t;
}

static const char *cb_name(int cb)
{
	return cb == X3_CB_MUL1 ? "mul1" : cb == X3_CB_MCG ? "mcg" : "3inst";
}

/* A new output tensor of dtype dt and shape (rank, shape). */
static int add_ent(x3_pack_layout *l, const char *name, x3_dtype dt, int rank, const int64_t *shape,
                   int in, const x3_tensor *src)
{
	if (l->nent == l->cap) {
		int cap = l->cap ? 2 * l->cap : 256;
		x3_pack_ent *ne = realloc(l->ent, (size_t)cap * sizeof *ne);
		if (!ne)
			return x3_err(X3_ENOMEM, "out of memory");
		l->ent = ne;
		l->cap = cap;
	}
	x3_tensor *t = x3_tensor_new(name, dt, rank, shape, 0);
	if (!t)
		return x3_errprefix(X3_ENOMEM, "tensor '%s'", name);
	l->ent[l->nent++] = (x3_pack_ent){ t, src, in };
	return X3_OK;
}

/* t's position in the stream, or -1 (byname: the first position of each
 * name; a later tensor of the same name is found by the scan) */
static int stream_index(const x3_strix *byname, const x3_pack_in *p, const x3_tensor *t)
{
	int i = x3_strix_get(byname, t->name);
	if (i >= 0 && p->in[i] == t)
		return i;
	for (i = 0; i < p->nin; i++)
		if (p->in[i] == t)
			return i;
	return -1;
}

void x3_pack_layout_free(x3_pack_layout *l)
{
	for (int i = 0; i < l->nent; i++)
		x3_tensor_free(l->ent[i].t);
	for (int i = 0; i < l->nprob && i < 200; i++)
		free(l->prob[i]);
	free(l->ent);
	free(l->prob);
	for (int i = 0; i < l->nfallback; i++)
		free(l->fallback_key[i]);
	free(l->fallback_key);
	free(l->fallback_why);
	memset(l, 0, sizeof *l);
}

/* the failure of x (X3_OK or a fatal code) returned to the caller */
#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* What x3_pack_classify works on: its input, the layout it fills, and the
 * indexes it builds of the stream and the model description. */
typedef struct {
	const x3_pack_in *p;
	x3_pack_layout *L;
	const x3_module **lin;              /* the linears of the description */
	int nlin;
	const x3_tensor *(*part)[P_COUNT];  /* each linear's stream tensors */
	int *used;                          /* stream tensor i is placed */
	int *linpos;                        /* module -> its j in lin, or -1 */
	char **inout;                       /* the stream's output names, sorted */
	x3_modix *ix;
	x3_strix byname;                    /* stream name -> first position */
} classify_ctx;

/* the allocations and the indexes of the stream's names and of the modules */
static int ctx_init(classify_ctx *c, const x3_pack_in *p, x3_pack_layout *L)
{
	int nin = p->nin;
	*c = (classify_ctx){ .p = p, .L = L, .byname = X3_STRIX_INIT };
	c->lin = calloc((size_t)p->nmods + 1, sizeof *c->lin);
	c->part = calloc((size_t)p->nmods + 1, sizeof *c->part);
	c->used = calloc((size_t)(nin ? nin : 1), sizeof *c->used);
	c->linpos = calloc((size_t)p->nmods + 1, sizeof *c->linpos);
	c->inout = calloc((size_t)nin + 1, sizeof *c->inout);
	if (!c->lin || !c->part || !c->used || !c->linpos || !c->inout)
		return x3_err(X3_ENOMEM, "out of memory");
	for (int i = nin - 1; i >= 0; i--)
		TRY(x3_strix_put(&c->byname, p->in[i]->name, i));
	TRY(x3_modix_build(p->mods, p->nmods, &c->ix));
	for (int i = 0; i < p->nmods; i++) {
		c->linpos[i] = -1;
		if (p->mods[i].d->kind == X3_KIND_LINEAR) {
			c->linpos[i] = c->nlin;
			c->lin[c->nlin++] = &p->mods[i];
		}
	}
	return X3_OK;
}

static void ctx_free(classify_ctx *c)
{
	x3_modix_free(c->ix);
	x3_strix_free(&c->byname);
	if (c->inout)
		for (int i = 0; i < c->p->nin; i++)
			free(c->inout[i]);
	free(c->inout);
	free(c->linpos);
	free(c->lin);
	free(c->part);
	free(c->used);
}

/* 1. the stream's tensors of each linear into part (a name of a linear
 * that is none of its parts is a problem); each one is marked used */
static int collect_parts(classify_ctx *c)
{
	const x3_pack_in *p = c->p;
	for (int i = 0; i < p->nin; i++) {
		const char *name = p->in[i]->name, *dot = strrchr(name, '.');
		const x3_module *own = x3_modix_owner(c->ix, name);
		if (!dot || !own || c->linpos[own - p->mods] < 0)
			continue;
		int j = (int)c->linpos[own - p->mods], q;
		for (q = 0; q < P_COUNT; q++)
			if (!strcmp(dot + 1, part_name[q]))
				break;
		if (q == P_COUNT)
			TRY(problem(c->L, "tensor '%s': not a tensor of an EXL3 linear (trellis, suh, svh, mcg, "
			            "mul1, bias; legacy su/sv are not written)", name));
		else
			c->part[j][q] = p->in[i];
		c->used[i] = 1;
	}
	return X3_OK;
}

/* A quantized linear M (its parts P): the parts checked against the
 * shapes, the metadata and the plan, its K counted into the layout, its
 * parts stored. *stored: 1 when they are (then *bias_len is the length of
 * its bias), 0 when a problem leaves it out. */
static int store_quantized(classify_ctx *c, const x3_module *M, const x3_tensor **P,
                           int64_t *bias_len, int *stored)
{
	const x3_pack_in *p = c->p;
	x3_pack_layout *L = c->L;
	int K, cb;
	if (x3_pack_check_exl3(M->key, M->in, M->out, P[P_TRELLIS], P[P_SUH], P[P_SVH],
	                       P[P_MCG], P[P_MUL1], &K, &cb))
		return problem(L, "%s", x3_errmsg());
	int64_t mk;
	if (x3_meta_get_i64(P[P_TRELLIS], "K", &mk) == X3_OK && mk != K)
		TRY(problem(L, "tensor '%s': metadata K=%lld but the shape says K=%d",
		            P[P_TRELLIS]->name, (long long)mk, K));
	/* a missing marker would silently decode as 3INST */
	const char *mcb = x3_meta_get(P[P_TRELLIS], "codebook");
	if (mcb && strcmp(mcb, cb_name(cb)))
		TRY(problem(L, "linear '%s': the trellis metadata says codebook %s, the stream has %s",
		            M->key, mcb, cb == X3_CB_3INST ? "no marker (3inst)" : cb_name(cb)));
	int pk = p->plan && p->plan->K ? p->plan->K[M - p->mods] : 0;
	if (pk && pk != K)
		TRY(problem(L, "linear '%s': K=%d in the stream, the plan says %d", M->key, K, pk));
	if (M->d->role == X3_ROLE_HEAD) {
		L->head_bits = K;
	} else if (M->d->role == X3_ROLE_MTP) {
		/* outside the budget, one K for the layer (ExLlamaV3's mtp_bits) */
		if (L->mtp_bits && L->mtp_bits != K)
			TRY(problem(L, "linear '%s': K=%d, but the multi-token prediction layer's other "
			            "linears have K=%d", M->key, K, L->mtp_bits));
		L->mtp_bits = K;
	} else if (M->d->role == X3_ROLE_VISION) {
		/* outside the budget, one K for the tower (ExLlamaV3's vision_bits) */
		if (L->vision_bits && L->vision_bits != K)
			TRY(problem(L, "linear '%s': K=%d, but the vision tower's other linears have K=%d",
			            M->key, K, L->vision_bits));
		L->vision_bits = K;
	} else {
		L->sum_k += (double)M->in * (double)M->out * K;
		L->sum_n += (double)M->in * (double)M->out;
		L->cb_count[cb]++;
	}
	const int parts[5] = {P_TRELLIS, P_SUH, P_SVH, P_MCG, P_MUL1};
	for (int q = 0; q < 5; q++) {
		const x3_tensor *s = P[parts[q]];
		if (s)
			TRY(add_ent(L, s->name, s->dtype, s->rank, s->shape, stream_index(&c->byname, p, s), NULL));
	}
	*bias_len = x3_pack_pad128(M->out);
	*stored = 1;
	return X3_OK;
}

/* An unquantized linear M whose .weight w is on the stream: only the head
 * may be, stored F16. *stored as for store_quantized. */
static int store_weight(classify_ctx *c, const x3_module *M, const x3_tensor *w,
                        int64_t *bias_len, int *stored)
{
	x3_pack_layout *L = c->L;
	if (M->d->role != X3_ROLE_HEAD)
		return problem(L, "linear '%s': stored unquantized (.weight); only the head may be 16-bit",
		               M->key);
	if (w->rank != 2 || w->shape[0] != M->out || w->shape[1] != M->in || !is_float(w->dtype)) {
		char s[64];
		return problem(L, "tensor '%s': %s %s, expected a float %lldx%lld", w->name,
		               x3_dtype_name(w->dtype), x3_shape_str(w, s, sizeof s),
		               (long long)M->out, (long long)M->in);
	}
	int64_t shp[2] = {M->out, M->in};
	TRY(add_ent(L, w->name, X3_F16, 2, shp, stream_index(&c->byname, c->p, w), NULL));
	L->head_bits = 16;
	*bias_len = M->out;
	*stored = 1;
	return X3_OK;
}

/* A tied head M with no quantized head: stored as KEY.weight, an F16 copy
 * of the embedding, as ExLlamaV3's converter does (it clones the head from
 * the embedding). Its own loader would fall back to the embedding, but its
 * transformers integration unties the embeddings and would leave a missing
 * head random. *stored as for store_quantized (0 also when the embedding
 * is nowhere: reported missing with the pass-through tensors). */
static int store_tied_head(classify_ctx *c, const x3_module *M, const char *wn,
                           int64_t *bias_len, int *stored)
{
	const x3_pack_in *p = c->p;
	const char *en = M->weight;
	const x3_tensor *emb = NULL;
	int ii;
	for (ii = 0; ii < p->nin && strcmp(p->in[ii]->name, en); ii++)
		;
	if (ii < p->nin)
		emb = p->in[ii];
	else if (p->passthrough)
		emb = x3_st_find(p->src, en);
	if (!emb)
		return X3_OK;
	if (emb->rank != 2 || emb->shape[0] != M->out || emb->shape[1] != M->in || !is_float(emb->dtype)) {
		char sh[64];
		return problem(c->L, "tensor '%s': %s %s, expected a float %lldx%lld (it is also the tied head)",
		               en, x3_dtype_name(emb->dtype), x3_shape_str(emb, sh, sizeof sh),
		               (long long)M->out, (long long)M->in);
	}
	int64_t shp[2] = {M->out, M->in};
	TRY(add_ent(c->L, wn, X3_F16, 2, shp, ii < p->nin ? ii : -1, ii < p->nin ? NULL : emb));
	c->L->head_bits = 16;
	*bias_len = M->out;
	*stored = 1;
	return X3_OK;
}

/* The head M at --head-bits 16 with no weight on the stream: its weight wn
 * passed through from SRC. *stored as for store_quantized. */
static int store_source_head(classify_ctx *c, const x3_module *M, const char *wn,
                             int64_t *bias_len, int *stored)
{
	const x3_pack_in *p = c->p;
	const x3_tensor *w = x3_st_find(p->src, wn);
	if (!p->passthrough || !w)
		return problem(c->L, "missing tensor '%s' (--head-bits 16: give it on stdin%s)", wn,
		               w ? " or use --passthrough" : "");
	if (w->rank != 2 || w->shape[0] != M->out || w->shape[1] != M->in || !is_float(w->dtype))
		return problem(c->L, "tensor '%s' in %s: not a float %lldx%lld", wn, p->src_name,
		               (long long)M->out, (long long)M->in);
	int64_t shp[2] = {M->out, M->in};
	TRY(add_ent(c->L, wn, X3_F16, 2, shp, -1, w));
	c->L->head_bits = 16;
	*bias_len = M->out;
	*stored = 1;
	return X3_OK;
}

/* The bias of the stored linear M (bias_len long): present in SRC =>
 * required, from the stream (b) or passed through; a stream bias without
 * one in SRC is stray. */
static int store_bias(classify_ctx *c, const x3_module *M, const x3_tensor *b, int64_t bias_len)
{
	const x3_pack_in *p = c->p;
	const char *src = p->src_name;
	char bname[X3_KEY_MAX + 8];
	snprintf(bname, sizeof bname, "%s.bias", M->key);
	const x3_tensor *sbias = x3_st_find(p->src, bname);
	if (M->sliced) {
		/* a row slice: SRC's bias is the fused source's */
		char sb[X3_KEY_MAX + 8];
		snprintf(sb, sizeof sb, "%s.bias", M->src);
		sbias = x3_st_find(p->src, sb);
	}
	if (b) {
		if (!sbias)
			return problem(c->L, "tensor '%s': %s has no such bias", b->name, src);
		if (b->rank != 1 || !is_float(b->dtype) || (b->shape[0] != M->out && b->shape[0] != bias_len))
			return problem(c->L, "tensor '%s': expected a float vector of %lld", b->name,
			               (long long)bias_len);
		return add_ent(c->L, b->name, X3_F16, 1, &bias_len, stream_index(&c->byname, p, b), NULL);
	}
	if (!sbias)
		return X3_OK;
	if (M->sliced)
		return problem(c->L, "missing tensor '%s' (rows %lld..%lld of '%s' in %s: give it on stdin)",
		               bname, (long long)M->row0, (long long)(M->row0 + M->out), sbias->name, src);
	if (!p->passthrough)
		return problem(c->L, "missing tensor '%s' (in %s; give it on stdin or use --passthrough)",
		               bname, src);
	if (sbias->rank != 1 || sbias->shape[0] != M->out || !is_float(sbias->dtype))
		return problem(c->L, "tensor '%s' in %s: expected a float vector of %lld", bname, src,
		               (long long)M->out);
	return add_ent(c->L, bname, X3_F16, 1, &bias_len, -1, sbias);
}

/* 2. the linear j: its weight (quantized, an unquantized head, the tied
 * head, the head from SRC) and then its bias, or the problem that leaves
 * it out */
static int classify_linear(classify_ctx *c, int j)
{
	const x3_module *M = c->lin[j];
	const x3_tensor **P = c->part[j];
	int is_head = M->d->role == X3_ROLE_HEAD, head_opt = c->p->head_bits;
	int has_q = P[P_TRELLIS] || P[P_SUH] || P[P_SVH] || P[P_MCG] || P[P_MUL1];
	char wn[X3_KEY_MAX + 8];
	snprintf(wn, sizeof wn, "%s.weight", M->key);
	int64_t bias_len = 0;
	int stored = 0;
	if (has_q && P[P_WEIGHT])
		return problem(c->L, "linear '%s': both quantized tensors and an unquantized .weight", M->key);
	if (has_q)
		TRY(store_quantized(c, M, P, &bias_len, &stored));
	else if (P[P_WEIGHT])
		TRY(store_weight(c, M, P[P_WEIGHT], &bias_len, &stored));
	else if (is_head && M->tied && (head_opt == 0 || head_opt == 16))
		TRY(store_tied_head(c, M, wn, &bias_len, &stored));
	else if (is_head && head_opt == 16)
		TRY(store_source_head(c, M, wn, &bias_len, &stored));
	else
		return problem(c->L, "missing linear '%s' (%s.trellis, .suh, .svh)%s", M->key, M->key,
		               is_head ? "; for an unquantized head use --head-bits 16 --passthrough" : "");
	return stored ? store_bias(c, M, P[P_BIAS], bias_len) : X3_OK;
}

/* 3a. the stream's tensors that are no linear's: passed through under
 * their output name (a renamed module's tensor, Mixtral v5's mlp.gate,
 * given by either name: written under the output's, found in SRC under
 * the source's), each checked against SRC's */
static int pass_stream(classify_ctx *c)
{
	const x3_pack_in *p = c->p;
	x3_tensor *const *in = p->in;
	for (int i = 0; i < p->nin; i++) {
		if (c->used[i])
			continue;
		char on[X3_KEY_MAX + 16], sn[X3_KEY_MAX + 16];
		x3_modix_out_name(c->ix, in[i]->name, on, sizeof on);
		x3_modix_src_name(c->ix, on, sn, sizeof sn);
		const x3_tensor *s = x3_st_find(p->src, sn);
		if (!s) {
			TRY(problem(c->L, "stray tensor '%s' (not a linear of the architecture and not in %s)",
			            in[i]->name, p->src_name));
			continue;
		}
		int same = s->rank == in[i]->rank;
		for (int d = 0; same && d < s->rank; d++)
			same = s->shape[d] == in[i]->shape[d];
		if (!same) {
			char a[64], b[64];
			TRY(problem(c->L, "tensor '%s': shape %s, but %s in %s", in[i]->name,
			            x3_shape_str(in[i], a, sizeof a), x3_shape_str(s, b, sizeof b), p->src_name));
			continue;
		}
		TRY(add_ent(c->L, on, passthrough_dtype(in[i]->dtype), in[i]->rank, in[i]->shape, i, NULL));
		c->used[i] = 1;
	}
	return X3_OK;
}

/* the stream's tensors by output name, sorted into inout: a source tensor
 * given on the stream is not passed through from SRC */
static int index_stream_names(classify_ctx *c)
{
	int nin = c->p->nin;
	for (int i = 0; i < nin; i++) {
		char on[X3_KEY_MAX + 16];
		x3_modix_out_name(c->ix, c->p->in[i]->name, on, sizeof on);
		if (!(c->inout[i] = strdup(on)))
			return x3_err(X3_ENOMEM, "out of memory");
	}
	qsort(c->inout, (size_t)nin, sizeof *c->inout, cmp_name);
	return X3_OK;
}

/* 3b. every SRC tensor that is no linear's and not on the stream: passed
 * through (with --passthrough; else missing), under its output name
 * (Mixtral v5's mlp.gate as block_sparse_moe.gate: x3_modules_out_name) */
static int pass_source(classify_ctx *c)
{
	const x3_pack_in *p = c->p;
	x3_pack_layout *L = c->L;
	for (int i = 0; i < x3_st_count(p->src); i++) {
		const x3_tensor *s = x3_st_get(p->src, i);
		char name[X3_KEY_MAX + 16];
		x3_modix_out_name(c->ix, s->name, name, sizeof name);
		const x3_module *own = x3_modix_owner(c->ix, name);
		size_t nl = strlen(name), rl = strlen("rotary_emb.inv_freq");
		/* the RoPE buffer some writers store is not a weight */
		/* ... nor a fused tensor whose rows are linears (x3_row_slice) */
		if ((own && own->d->kind == X3_KIND_LINEAR) || x3_modix_slice_of(c->ix, name) ||
		    (nl >= rl && !strcmp(name + nl - rl, "rotary_emb.inv_freq")))
			continue;
		if (!own && x3_arch_skipped(p->cfg, name)) {
			L->skipped++;
			continue;
		}
		const char *key = name;
		if (bsearch(&key, c->inout, (size_t)p->nin, sizeof *c->inout, cmp_name))
			continue;
		if (!p->passthrough) {
			TRY(problem(L, "missing tensor '%s' (in %s; give it on stdin or use --passthrough)", name,
			            p->src_name));
			continue;
		}
		/* an FP8 block-scaled source tensor (DeepSeek's kv_b_proj) is
		 * stored dequantized (weight times its block's scale_inv), as F32
		 * is (F16): the pack of an FP8 checkpoint is that of its
		 * dequantized copy; its NAME_scale_inv is not stored */
		if (nl > 10 && !strcmp(name + nl - 10, "_scale_inv")) {
			char sn[X3_KEY_MAX + 16];
			snprintf(sn, sizeof sn, "%.*s", (int)(nl - 10), s->name);
			const x3_tensor *w = x3_st_find(p->src, sn);
			if (w && w->scale_inv)
				continue;
		}
		TRY(add_ent(L, name, s->scale_inv ? passthrough_dtype(X3_F32) : passthrough_dtype(s->dtype),
		            s->rank, s->shape, -1, s));
	}
	return X3_OK;
}

/* 4. linears quantized without error feedback (a trellis frame says
 * fallback=1): recorded in quantization_config.json, for validate */
static int record_fallbacks(classify_ctx *c)
{
	x3_pack_layout *L = c->L;
	L->fallback_key = calloc((size_t)L->nent + 1, sizeof *L->fallback_key);
	L->fallback_why = calloc((size_t)L->nent + 1, sizeof *L->fallback_why);
	if (!L->fallback_key || !L->fallback_why)
		return x3_err(X3_ENOMEM, "out of memory");
	for (int i = 0; i < L->nent; i++) {
		const x3_tensor *t = L->ent[i].in >= 0 ? c->p->in[L->ent[i].in] : NULL;
		size_t l = t ? strlen(t->name) : 0;
		int64_t fb;
		if (!t || l < 8 || strcmp(t->name + l - 8, ".trellis") ||
		    x3_meta_get_i64(t, "fallback", &fb) != X3_OK || !fb)
			continue;
		if (!(L->fallback_key[L->nfallback] = strndup(t->name, l - 8)))
			return x3_err(X3_ENOMEM, "out of memory");
		const char *why = x3_meta_get(t, "fallback_reason");
		L->fallback_why[L->nfallback++] = why ? why : "no usable Hessian";
	}
	return X3_OK;
}

int x3_pack_classify(const x3_pack_in *p, x3_pack_layout *L)
{
	memset(L, 0, sizeof *L);
	classify_ctx c;
	int rc = ctx_init(&c, p, L);
	if (!rc)
		rc = collect_parts(&c);
	for (int j = 0; !rc && j < c.nlin; j++)
		rc = classify_linear(&c, j);
	if (!rc)
		rc = pass_stream(&c);
	if (!rc)
		rc = index_stream_names(&c);
	if (!rc)
		rc = pass_source(&c);
	if (!rc)
		rc = record_fallbacks(&c);
	ctx_free(&c);
	if (rc)
		x3_pack_layout_free(L);
	return rc;
}

/* ---- what pack-write copies, its order ------------------------------- */

int x3_pack_copies(const char *n, const char **why)
{
	size_t l = strlen(n);
	*why = NULL;
#define ENDS(s) (l >= strlen(s) && !strcmp(n + l - strlen(s), s))
	if (ENDS(".safetensors") || !strcmp(n, "config.json") ||
	    !strcmp(n, "model.safetensors.index.json") || !strcmp(n, "quantization_config.json"))
		return 0;   /* written by pack-write itself */
	/* a quantized source's own quantization config: GPTQModel reads
	 * quantize_config.json, then quant_config.json, before config.json;
	 * ours replaces the first, the second would describe weights that are
	 * no longer there (config.json nests it as original_quantization_config) */
	if (!strcmp(n, "quantize_config.json") || !strcmp(n, "quant_config.json")) {
		*why = "the source's quantization config";
		return 0;
	}
	if (ENDS(".bin") || ENDS(".ckpt") || ENDS(".pth") || ENDS(".pt")) {
		*why = "weights in another format";
		return 0;
	}
#undef ENDS
	return 1;
}

int x3_pack_cmp(long m1, long r1, const char *n1, long m2, long r2, const char *n2)
{
	if (m1 != m2)
		return m1 < m2 ? -1 : 1;
	if (r1 != r2)
		return r1 < r2 ? -1 : 1;
	return strcmp(n1, n2);
}
