/* hessian_merge.c: Hessian sets by name, a part's frames, and the merge of
 * whole Hessian streams and of parts (hessian_merge.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hessian_merge.h"
#include "moe_fallback.h"

/* "what: why", or the message alone where it begins with "what:" (a
 * reader's names its file, an accumulator's its Hessian) */
static int prefix_once(int rc, const char *what)
{
	const char *m = x3_errmsg();
	size_t l = strlen(what);
	if (l && !strncmp(m, what, l) && m[l] == ':')
		return rc;
	return x3_errprefix(rc, "%s", what);
}

/* ---- accumulators by name --------------------------------------------- */
x3_hess *x3_hset_find(const x3_hset *s, const char *name)
{
	for (int i = 0; i < s->n; i++)
		if (!strcmp(x3_hess_name(s->h[i]), name))
			return s->h[i];
	return NULL;
}

int x3_hset_add(x3_hset *s, const char *name, int64_t n, int f64, const char *members,
                int layer, x3_hess **out)
{
	if (s->n == s->cap) {
		int cap = s->cap ? 2 * s->cap : 16;
		x3_hess **p = realloc(s->h, (size_t)cap * sizeof *p);
		if (!p)
			return x3_err(X3_ENOMEM, "out of memory");
		s->h = p, s->cap = cap;
	}
	x3_hess *h;
	int rc = x3_hess_new(name, n, f64, members, layer, &h);
	if (!rc && s->spill_dir)
		rc = x3_hess_spill(h, s->spill_dir);
	if (rc) {
		char what[512];
		snprintf(what, sizeof what, "hessian '%s'", name);
		rc = prefix_once(rc, what);
	} else if (s->device && !f64) {
		/* F64 sums stay on the CPU (a device accumulates in F32) */
		rc = x3_hess_set_device(h, s->device);
	}
	if (rc) {
		x3_hess_free(h);
		return rc;
	}
	s->h[s->n++] = h;
	*out = h;
	return X3_OK;
}

void x3_hset_free(x3_hset *s)
{
	for (int i = 0; i < s->n; i++)
		x3_hess_free(s->h[i]);
	free(s->h);
	s->h = NULL;
	s->n = s->cap = 0;
}

/* ---- a part's frames -------------------------------------------------- */
const char *const x3_part_prov_keys[X3_PART_NPROV] = { "chunk", "chunks", "chunk_rows",
                                                       "calib_rows", "calib_xxh3", "products" };


void x3_part_prov_set(struct x3_part_prov *pv, long chunk, long chunks, long chunk_rows,
                      long calib_rows, const char *calib_xxh3, int f64)
{
	snprintf(pv->val[0], sizeof pv->val[0], "%ld", chunk);
	snprintf(pv->val[1], sizeof pv->val[1], "%ld", chunks);
	snprintf(pv->val[2], sizeof pv->val[2], "%ld", chunk_rows);
	snprintf(pv->val[3], sizeof pv->val[3], "%ld", calib_rows);
	snprintf(pv->val[4], sizeof pv->val[4], "%s", calib_xxh3);
	snprintf(pv->val[5], sizeof pv->val[5], "%s", f64 ? "f64" : "f32");
}

int x3_part_is_prov_key(const char *key)
{
	for (int i = 0; i < X3_PART_NPROV; i++)
		if (!strcmp(key, x3_part_prov_keys[i]))
			return 1;
	return 0;
}

static int set_prov(x3_tensor *t, const struct x3_part_prov *pv)
{
	for (int j = 0; j < X3_PART_NPROV; j++)
		if (x3_meta_set(t, x3_part_prov_keys[j], pv->val[j]))
			return X3_ENOMEM;
	return X3_OK;
}

int x3_hset_write(x3_hset *s, x3_writer *w, x3_dtype dt, const struct x3_part_prov *pv,
                  x3_hset_dropped_fn *dropped, void *ctx)
{
	int rc = X3_OK, i;
	for (i = 0; i < s->n && !rc; i++) {
		x3_hess *h = s->h[i];
		const char *name = x3_hess_name(h);
		int64_t d = x3_hess_dropped(h), c = x3_hess_count(h);
		if (!pv && x3_hess_too_many_dropped(h)) {
			rc = x3_err(X3_ENUM, "'%s': %lld of %lld rows dropped for non-finite values "
			            "(more than 10%%)", name, (long long)d, (long long)(c + d));
			break;
		}
		if (!pv && d && dropped)
			dropped(ctx, name, d, c + d);
		x3_tensor *t = x3_hess_frame(h, dt);
		if (!t || (pv && set_prov(t, pv))) {
			rc = x3_errprefix(X3_ENOMEM, "'%s'", name);
		} else {
			/* what a part carries for the merge, not a whole capture */
			for (int j = 0; !pv && j < X3_MOE_NPART_KEYS; j++)
				(void)x3_meta_del(t, x3_moe_part_keys[j]);
			if (!pv)
				(void)x3_meta_del(t, "part_role");
			if ((rc = x3_writer_put(w, t)))
				rc = x3_errprefix(rc, "writing '%s'", name);
		}
		x3_tensor_free(t);
		x3_hess_free(h);
	}
	/* on an error, the accumulators not yet written are freed too */
	for (; i < s->n; i++)
		x3_hess_free(s->h[i]);
	s->n = 0;
	return rc;
}

int x3_part_put_all_tokens(x3_writer *w, const x3_hess *h, int layer_scope,
                           const struct x3_part_prov *pv)
{
	const char *name = x3_hess_name(h);
	x3_tensor *t = x3_hess_frame(h, X3_F64);
	int rc = !t || x3_meta_set(t, "part_role", "all_tokens") ||
	         x3_meta_set(t, "all_tokens_scope", layer_scope ? "layer" : "group") ||
	         set_prov(t, pv);
	if (rc)
		rc = x3_errprefix(X3_ENOMEM, "'%s'", name);
	else if ((rc = x3_writer_put(w, t)))
		rc = x3_errprefix(rc, "writing '%s'", name);
	x3_tensor_free(t);
	return rc;
}

/* ---- the merge -------------------------------------------------------- */

/* One input and its next frame (NULL at its end). */
struct min {
	const char *file;
	x3_reader *r;
	x3_tensor *t;
	long chunk;      /* a part's chunk */
	int64_t layer;   /* the layer of t */
};

static int min_next(struct min *f)
{
	int rc = x3_reader_next(f->r, &f->t);
	if (rc == X3_EOF) {
		f->t = NULL;
		return X3_OK;
	}
	if (rc)
		f->t = NULL;
	return rc ? prefix_once(rc, f->file) : X3_OK;
}

/* Add frame t (of file) to the accumulator of its name in s (F64), a chunk
 * of its own, added in double after the ones before it; a new one takes
 * the frame's metadata but the computed and provenance keys. */
static int merge_frame(x3_hset *s, const char *file, const x3_tensor *t)
{
	if (t->rank != 2 || t->shape[0] != t->shape[1])
		return x3_err(X3_EFORMAT, "%s: frame '%s' is not a square matrix", file, t->name);
	const char *mem = x3_meta_get(t, "members");
	x3_hess *h = x3_hset_find(s, t->name);
	int rc;
	if (!h) {
		int64_t layer = -1;
		x3_meta_get_i64(t, "layer", &layer);
		if ((rc = x3_hset_add(s, t->name, t->shape[0], 1, mem, (int)layer, &h)))
			return rc;
		for (int j = 0; j < t->nmeta; j++)
			if (!x3_hess_meta_is_computed(t->meta[j].key) &&
			    !x3_part_is_prov_key(t->meta[j].key) &&
			    (rc = x3_hess_set_meta(h, t->meta[j].key, t->meta[j].val)))
				return prefix_once(rc, file);
	} else if (mem && strcmp(mem, x3_hess_members(h) ? x3_hess_members(h) : "")) {
		return x3_err(X3_EFORMAT, "%s: frame '%s': members '%s' differ from the first stream's",
		              file, t->name, mem);
	} else if ((rc = x3_moe_merge_meta(h, t))) {
		return rc;
	}
	rc = x3_hess_add_frame(h, t);
	return rc ? prefix_once(rc, file) : X3_OK;
}

/* Whole streams: summed by name in the order given. */
static int merge_streams(struct min *in, int nin, const struct x3_merge_opts *o, x3_writer *w)
{
	x3_hset s = { .spill_dir = o->spill_dir };
	x3_dtype out = o->f64 ? X3_F64 : X3_DTYPE_COUNT;
	int rc = X3_OK;
	for (int i = 0; i < nin && !rc; i++)
		while (!rc && in[i].t) {
			if (x3_meta_get(in[i].t, "chunk"))
				rc = x3_err(X3_EFORMAT, "%s: frame '%s' is a chunk's partial sum (--part), "
				            "not a whole stream like the first input's", in[i].file,
				            in[i].t->name);
			if (!rc && out == X3_DTYPE_COUNT)
				out = in[i].t->dtype == X3_F64 ? X3_F64 : X3_F32;
			if (!rc)
				rc = merge_frame(&s, in[i].file, in[i].t);
			x3_tensor_free(in[i].t);
			in[i].t = NULL;
			if (!rc)
				rc = min_next(&in[i]);
		}
	if (!rc)
		rc = x3_hset_write(&s, w, out == X3_DTYPE_COUNT ? X3_F32 : out, NULL, o->dropped, o->ctx);
	x3_hset_free(&s);
	return rc;
}

static int by_chunk(const void *a, const void *b)
{
	const struct min *x = *(struct min *const *)a, *y = *(struct min *const *)b;
	return (x->chunk > y->chunk) - (x->chunk < y->chunk);
}

static int is_all_tokens(const x3_tensor *t)
{
	const char *role = x3_meta_get(t, "part_role");
	return role && !strcmp(role, "all_tokens");
}

/* A part's frame just read: of its chunk, in layer order (after layer l),
 * all-token frames in part 0 only. */
static int part_check(struct min *f, int64_t l)
{
	if (!f->t)
		return X3_OK;
	const char *v = x3_meta_get(f->t, "chunk");
	if (!v || strtol(v, NULL, 10) != f->chunk)
		return x3_err(X3_EFORMAT, "%s: frame '%s' is not of chunk %ld like the file's first frame",
		              f->file, f->t->name, f->chunk);
	if (f->chunk != 0 && is_all_tokens(f->t))
		return x3_err(X3_EFORMAT, "%s: all-token frame '%s' not of chunk 0", f->file, f->t->name);
	int64_t nl = -1;
	if (x3_meta_get_i64(f->t, "layer", &nl) || nl < 0)
		return x3_err(X3_EFORMAT, "%s: frame '%s' has no 'layer' metadata (not a hessian-capture "
		              "--part output)", f->file, f->t->name);
	if (nl < l)
		return x3_err(X3_EFORMAT, "%s: frame '%s' of layer %lld comes after layer %lld", f->file,
		              f->t->name, (long long)nl, (long long)l);
	f->layer = nl;
	return X3_OK;
}

static int part_next(struct min *f)
{
	int64_t l = f->layer;
	x3_tensor_free(f->t);
	f->t = NULL;
	int rc = min_next(f);
	return rc ? rc : part_check(f, l);
}

/* A layer being merged from parts: its starved experts (named at its end,
 * as one process names them), the groups written (a name twice is an
 * error) and the all-token Hessians part 0 carried for it. */
struct mlayer {
	int64_t layer;   /* -1: none yet */
	int64_t m;       /* the threshold */
	int last;        /* the expert of the group before (-1: none) */
	char starved[1024];
	size_t so;
	char **names;
	int nnames, capnames;
	x3_hset all;
};

static void mlayer_end(struct mlayer *ml, const struct x3_merge_opts *o)
{
	if (ml->so && o->starved)
		o->starved(o->ctx, ml->layer, ml->m, ml->starved);
	x3_hset_free(&ml->all);
	for (int i = 0; i < ml->nnames; i++)
		free(ml->names[i]);
	ml->nnames = 0;
	ml->so = 0;
	ml->starved[0] = 0;
	ml->last = -1;
	ml->layer = -1;
}

static int mlayer_name(struct mlayer *ml, const char *file, const char *name)
{
	for (int i = 0; i < ml->nnames; i++)
		if (!strcmp(ml->names[i], name))
			return x3_err(X3_EFORMAT, "%s: frame '%s' twice in layer %lld", file, name,
			              (long long)ml->layer);
	if (ml->nnames == ml->capnames) {
		int cap = ml->capnames ? 2 * ml->capnames : 64;
		char **p = realloc(ml->names, (size_t)cap * sizeof *p);
		if (!p)
			return x3_err(X3_ENOMEM, "out of memory");
		ml->names = p, ml->capnames = cap;
	}
	if (!(ml->names[ml->nnames] = strdup(name)))
		return x3_err(X3_ENOMEM, "out of memory");
	ml->nnames++;
	return X3_OK;
}

/* Part 0 (c[0]) is past layer ml->layer (next: layer next): no other part
 * may have a frame of it left, one part 0 does not list in that order. */
static int merge_layer_end(struct min **c, int nin, struct mlayer *ml, int64_t next,
                           const struct x3_merge_opts *o)
{
	for (int i = 1; i < nin; i++)
		if (c[i]->t && c[i]->layer < next)
			return x3_err(X3_EFORMAT, "%s: frame '%s' of layer %lld is not in %s (chunk 0), or "
			              "not in its order: the parts of a layer list the same frames in the "
			              "same order", c[i]->file, c[i]->t->name, (long long)c[i]->layer,
			              c[0]->file);
	if (ml->layer >= 0)
		mlayer_end(ml, o);
	return X3_OK;
}

/* The group just summed (h): its fallback, the starved expert named once
 * (its first group: an expert's groups are adjacent), an expert's own
 * all-token Hessian freed (read by its group alone). */
static int merge_group_end(x3_hess *h, struct mlayer *ml, int f64)
{
	const char *an = x3_hess_get_meta(h, x3_moe_part_keys[3]);   /* all_tokens */
	struct x3_moe_group g;
	int64_t fb;
	int rc = x3_moe_merged_blend(h, an, an ? x3_hset_find(&ml->all, an) : NULL, f64, &g, &ml->m,
	                             &fb);
	if (rc)
		return rc;
	if (fb >= 0) {
		if (fb && g.expert != ml->last && ml->so < sizeof ml->starved - 32)
			ml->so += (size_t)snprintf(ml->starved + ml->so, sizeof ml->starved - ml->so,
			                           "%s%d (%lld)", ml->so ? ", " : "", g.expert,
			                           (long long)g.routed);
		ml->last = g.expert;
	}
	for (int i = 0; an && i < ml->all.n; i++) {
		x3_hess *a = ml->all.h[i];
		const char *sc = x3_hess_get_meta(a, "all_tokens_scope");
		if (sc && !strcmp(sc, "group") && !strcmp(x3_hess_name(a), an)) {
			x3_hess_free(a);
			ml->all.h[i] = ml->all.h[--ml->all.n];
			break;
		}
	}
	return X3_OK;
}

/* The first frames of the parts: chunks of the same capture, each once,
 * none missing; c gets them in chunk order. */
static int parts_order(struct min *in, int nin, struct min **c)
{
	for (int i = 0; i < nin; i++) {
		struct min *f = &in[i];
		if (!f->t)
			return x3_err(X3_EFORMAT, "%s: no frames (an empty chunk output)", f->file);
		for (int k = 1; k < X3_PART_NPROV; k++) {
			const char *key = x3_part_prov_keys[k];
			const char *v = x3_meta_get(f->t, key), *v0 = x3_meta_get(in[0].t, key);
			if (!v || !v0 || strcmp(v, v0))
				return x3_err(X3_EFORMAT, "%s: not a chunk of the same capture as %s (metadata "
				              "'%s' is '%s', not '%s')", f->file, in[0].file, key,
				              v ? v : "", v0 ? v0 : "");
		}
		char *end;
		const char *v = x3_meta_get(f->t, "chunk");
		f->chunk = strtol(v, &end, 10);
		if (*end || end == v || f->chunk < 0)
			return x3_err(X3_EFORMAT, "%s: frame '%s': bad metadata 'chunk' '%s'", f->file,
			              f->t->name, v);
		c[i] = f;
	}
	long n = strtol(x3_meta_get(in[0].t, "chunks"), NULL, 10);
	qsort(c, (size_t)nin, sizeof *c, by_chunk);
	for (int i = 0; i < nin; i++) {
		if (c[i]->chunk >= n)
			return x3_err(X3_EFORMAT, "%s: chunk %ld of a calibration of %ld chunks (0-%ld)",
			              c[i]->file, c[i]->chunk, n, n - 1);
		if (i && c[i]->chunk == c[i - 1]->chunk)
			return x3_err(X3_EFORMAT, "chunk %ld of %ld is given twice: %s and %s", c[i]->chunk,
			              n, c[i - 1]->file, c[i]->file);
		if (c[i]->chunk != i)
			return x3_err(X3_EFORMAT, "chunk %d of %ld is missing (%d chunk file%s given)", i, n,
			              nin, nin > 1 ? "s" : "");
	}
	if (nin < n)
		return x3_err(X3_EFORMAT, "chunk %d of %ld is missing (%d chunk file%s given)", nin, n,
		              nin, nin > 1 ? "s" : "");
	return X3_OK;
}

/* One group: part 0's frame t0 and the other parts' of its name, in chunk
 * order; a later part has no frame for an expert the router sent none of
 * its rows (it has the next). */
static int merge_group(struct min **c, int nin, x3_hset *s)
{
	struct min *p0 = c[0];
	const x3_tensor *t0 = p0->t;
	int expert = x3_meta_get(t0, "expert") != NULL;
	int rc = merge_frame(s, p0->file, t0);
	for (int i = 1; i < nin && !rc; i++) {
		struct min *f = c[i];
		const char *key;
		if (f->t && f->layer == p0->layer && !strcmp(f->t->name, t0->name) &&
		    (key = x3_moe_part_differs(t0, f->t))) {
			const char *v = x3_meta_get(f->t, key), *v0 = x3_meta_get(t0, key);
			rc = x3_err(X3_EFORMAT, "%s: frame '%s': metadata '%s' is '%s', not '%s' as in %s "
			            "(chunk 0): a part of another capture", f->file, t0->name, key,
			            v ? v : "", v0 ? v0 : "", p0->file);
		} else if (f->t && f->layer == p0->layer && !strcmp(f->t->name, t0->name)) {
			if (!(rc = merge_frame(s, f->file, f->t)))
				rc = part_next(f);
		} else if (!expert && !f->t) {
			rc = x3_err(X3_EFORMAT, "%s: ends where %s (chunk 0) has frame '%s' of layer %lld: "
			            "the parts of a layer list the same frames in the same order", f->file,
			            p0->file, t0->name, (long long)p0->layer);
		} else if (!expert) {
			rc = x3_err(X3_EFORMAT, "%s: frame '%s' of layer %lld where %s (chunk 0) has '%s' of "
			            "layer %lld: the parts of a layer list the same frames in the same "
			            "order", f->file, f->t->name, (long long)f->layer, p0->file, t0->name,
			            (long long)p0->layer);
		}
	}
	return rc;
}

/* The parts, read in lockstep one group at a time: its sums added,
 * blended, written and freed before the next is read, so that the merge
 * holds one group's Hessian (beside the all-token Hessians part 0 carries
 * for the fallback: the layer's shared gate/up one for the layer, an
 * expert's own until its group is written), not a layer's. */
static int merge_chunks(struct min *in, int nin, const struct x3_merge_opts *o, x3_writer *w)
{
	struct min **c = malloc((size_t)nin * sizeof *c);
	if (!c)
		return x3_err(X3_ENOMEM, "out of memory");
	x3_hset s = { .spill_dir = o->spill_dir };
	struct mlayer ml = { .layer = -1, .last = -1, .all = { .spill_dir = o->spill_dir } };
	int rc = parts_order(in, nin, c);
	x3_dtype out = X3_F32;
	if (!rc) {
		const char *pr = x3_meta_get(in[0].t, "products");
		out = o->f64 || !strcmp(pr, "f64") ? X3_F64 : X3_F32;
	}
	for (int i = 0; i < nin && !rc; i++)
		rc = part_check(c[i], -1);
	struct min *p0 = c[0];
	while (!rc) {
		/* part 0's all-token frames, carried before the groups using them */
		for (; !rc && p0->t && is_all_tokens(p0->t); rc = rc ? rc : part_next(p0)) {
			if (p0->layer != ml.layer) {
				if ((rc = merge_layer_end(c, nin, &ml, p0->layer, o)))
					break;
				ml.layer = p0->layer;
			}
			if (x3_hset_find(&ml.all, p0->t->name))
				rc = x3_err(X3_EFORMAT, "%s: all-token frame '%s' twice in layer %lld",
				            p0->file, p0->t->name, (long long)p0->layer);
			else
				rc = merge_frame(&ml.all, p0->file, p0->t);
		}
		if (rc || !p0->t)
			break;
		if (p0->layer != ml.layer) {
			if ((rc = merge_layer_end(c, nin, &ml, p0->layer, o)))
				break;
			ml.layer = p0->layer;
		}
		if ((rc = mlayer_name(&ml, p0->file, p0->t->name)) || (rc = merge_group(c, nin, &s)) ||
		    (rc = part_next(p0)) || (rc = merge_group_end(s.h[0], &ml, out == X3_F64)))
			break;
		rc = x3_hset_write(&s, w, out, NULL, o->dropped, o->ctx);
	}
	if (!rc)
		rc = merge_layer_end(c, nin, &ml, INT64_MAX, o);
	ml.so = 0;   /* no starved list of a layer the merge did not finish */
	mlayer_end(&ml, o);
	free(ml.names);
	x3_hset_free(&s);
	free(c);
	return rc;
}

int x3_hess_merge(const char *const *files, int n, const struct x3_merge_opts *o, x3_writer *w)
{
	struct min *in = calloc((size_t)n, sizeof *in);
	if (!in)
		return x3_err(X3_ENOMEM, "out of memory");
	int parts = -1, rc = X3_OK;
	for (int i = 0; i < n && !rc; i++) {
		in[i].file = files[i];
		if ((rc = x3_reader_open(files[i], &in[i].r))) {
			rc = prefix_once(rc, files[i]);
			break;
		}
		if ((rc = min_next(&in[i])))
			break;
		/* the first input with frames says what they all are */
		int p = in[i].t && x3_meta_get(in[i].t, "chunk");
		if (parts < 0 && in[i].t)
			parts = p;
		else if (in[i].t && p != parts)
			rc = x3_err(X3_EFORMAT, "%s: %s, but the inputs before it are %s", files[i],
			            p ? "the partial sums of a chunk (--part)" : "a whole stream",
			            parts ? "chunks" : "whole streams");
	}
	if (!rc)
		rc = parts == 1 ? merge_chunks(in, n, o, w) : merge_streams(in, n, o, w);
	for (int i = 0; i < n; i++) {
		x3_tensor_free(in[i].t);
		if (in[i].r)
			x3_reader_close(in[i].r);
	}
	free(in);
	return rc;
}
