/* safetensors.c: reading safetensors files and model directories through
 * mmap (st_write.c writes them). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <jansson.h>
#include "frame.h"
#include "io.h"
#include "safetensors.h"
#include "stentry_impl.h"
#include "utf8.h"

struct virt;
struct stfile {
	char *path;
	unsigned char *map;
	size_t size;
	json_t *meta;
};

struct x3_st {
	struct stfile *files;
	int nfiles;
	x3_tensor **t;        /* tensors in file order */
	int *tfile;           /* file index of each tensor */
	int n;
	int *byname;          /* indices sorted by name */
	struct virt *v;       /* per tensor: how it is made (NULL: read) */
	x3_tensor **hid;      /* tensors read only through virtual ones */
	int nhid;
};

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int add_tensor(x3_st *s, x3_tensor *t, int fi)
{
	if ((s->n & (s->n - 1)) == 0 || s->n == 0) {
		int cap = s->n ? s->n * 2 : 16;
		x3_tensor **nt = realloc(s->t, cap * sizeof *nt);
		int *nf = realloc(s->tfile, cap * sizeof *nf);
		if (nt) s->t = nt;
		if (nf) s->tfile = nf;
		if (!nt || !nf)
			return x3_err(X3_ENOMEM, "out of memory");
	}
	s->t[s->n] = t;
	s->tfile[s->n] = fi;
	s->n++;
	return X3_OK;
}

struct ent { x3_tensor *t; uint64_t off; };
static int cmp_ent(const void *a, const void *b)
{
	const struct ent *x = a, *y = b;
	return x->off < y->off ? -1 : x->off > y->off;
}

void x3_st_drop(const x3_tensor *t, const void *p, size_t n)
{
	if (!t || !t->data || t->owns_data || !n)
		return;
	const char *lo = t->data, *hi = lo + t->nbytes, *a = p, *b = a + n;
	if (a < lo || b > hi || b < a)
		return;
	/* whole pages, outward: the mapping covers them (it starts on a page
	 * and its last page is mapped whole), and a page of a neighbouring
	 * tensor dropped with it is read again from the file when touched */
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t s0 = (uintptr_t)a & ~(pg - 1), s1 = ((uintptr_t)b + pg - 1) & ~(pg - 1);
	(void)madvise((void *)s0, s1 - s0, MADV_DONTNEED);
}

static int open_file(x3_st *s, const char *path)
{
	int fd, orc = x3_open_regular(path, &fd);
	if (orc)
		return orc;
	struct stat st;
	if (fstat(fd, &st) != 0) {
		close(fd);
		return x3_err(X3_EIO, "%s: %s", path, strerror(errno));
	}
	size_t size = (size_t)st.st_size;
	if (size < 8) {
		close(fd);
		return x3_err(X3_EFORMAT, "%s: truncated: %zu bytes is too short for a safetensors file", path, size);
	}
	unsigned char *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return x3_err(X3_EIO, "%s: mmap: %s", path, strerror(errno));
	uint64_t hn = 0;
	for (int i = 7; i >= 0; i--)
		hn = hn << 8 | map[i];
	int rc = X3_EFORMAT;
	json_t *root = NULL;
	struct ent *ents = NULL;
	size_t ne = 0;
	if (hn > X3_FRAME_MAX_HEADER || hn < 2) {
		x3_err(rc, "%s: bad magic: header length %" PRIu64 " is outside 2..%u", path, hn, X3_FRAME_MAX_HEADER);
		goto fail;
	}
	if (hn > size - 8) {
		x3_err(rc, "%s: truncated header: %" PRIu64 " bytes declared, %zu present", path, hn, size - 8);
		goto fail;
	}
	if (map[8] != '{') {
		x3_err(rc, "%s: bad magic: header does not start with '{'", path);
		goto fail;
	}
	size_t u = x3_utf8_valid_prefix((const char *)map + 8, hn);   /* JSON is UTF-8 */
	if (u != hn) {
		x3_err(rc, "%s: header is not valid UTF-8 (byte 0x%02x at offset %zu)", path, map[8 + u], u);
		goto fail;
	}
	json_error_t je;
	root = json_loadb((const char *)map + 8, hn, JSON_REJECT_DUPLICATES, &je);
	if (!root || !json_is_object(root)) {
		x3_err(rc, "%s: invalid JSON header: %s", path, root ? "not an object" : je.text);
		goto fail;
	}
	uint64_t dsize = size - 8 - hn;
	const unsigned char *base = map + 8 + hn;
	const char *k;
	json_t *v;
	char where[4200];
	snprintf(where, sizeof where, "%s: tensor", path);
	ents = calloc(json_object_size(root) + 1, sizeof *ents);
	if (!ents) {
		rc = x3_err(X3_ENOMEM, "out of memory");
		goto fail;
	}
	json_object_foreach(root, k, v) {
		if (!strcmp(k, "__metadata__"))
			continue;
		x3_tensor *t;
		uint64_t b;
		if ((rc = x3_stentry_check(where, k, v, dsize, 0, &t, &b)) != X3_OK) {
			if (rc != X3_ENOMEM)
				rc = X3_EFORMAT;
			goto fail;
		}
		t->data = (void *)(base + b);
		ents[ne].t = t;
		ents[ne].off = b;
		ne++;
	}
	qsort(ents, ne, sizeof *ents, cmp_ent);
	/* two tensors sharing bytes: a writer's bug, and a write to one would
	 * change the other (empty tensors occupy nothing) */
	uint64_t end = 0;   /* furthest end so far, of ents[last] */
	for (size_t i = 0, last = 0; i < ne; i++) {
		const x3_tensor *t = ents[i].t, *o = ents[last].t;
		if (!t->nbytes)
			continue;
		if (ents[i].off < end) {
			rc = x3_err(X3_EFORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] overlap those of '%s' "
			       "[%" PRIu64 ", %" PRIu64 "]", path, t->name, ents[i].off, ents[i].off + t->nbytes,
			       o->name, ents[last].off, end);
			goto fail;
		}
		end = ents[i].off + t->nbytes;
		last = i;
	}
	struct stfile *nf = realloc(s->files, (s->nfiles + 1) * sizeof *nf);
	if (!nf) {
		rc = x3_err(X3_ENOMEM, "out of memory");
		goto fail;
	}
	s->files = nf;
	int fi = s->nfiles++;
	s->files[fi].path = strdup(path);
	s->files[fi].map = map;
	s->files[fi].size = size;
	s->files[fi].meta = json_incref(json_object_get(root, "__metadata__"));
	map = NULL;
	for (size_t i = 0; i < ne; i++) {
		if ((rc = add_tensor(s, ents[i].t, fi))) {
			for (size_t j = i; j < ne; j++)
				x3_tensor_free(ents[j].t);
			free(ents);
			json_decref(root);
			return rc;
		}
	}
	free(ents);
	json_decref(root);
	return X3_OK;
fail:
	for (size_t i = 0; i < ne; i++)
		x3_tensor_free(ents[i].t);
	free(ents);
	json_decref(root);
	if (map)
		munmap(map, size);
	return rc;
}

static const x3_st *sort_ctx;
static int cmp_byname(const void *a, const void *b)
{
	return strcmp(sort_ctx->t[*(const int *)a]->name, sort_ctx->t[*(const int *)b]->name);
}

static int build_index(x3_st *s)
{
	s->byname = malloc((s->n + 1) * sizeof *s->byname);
	if (!s->byname)
		return x3_err(X3_ENOMEM, "out of memory");
	for (int i = 0; i < s->n; i++)
		s->byname[i] = i;
	sort_ctx = s;   /* qsort has no context argument in C11 */
	qsort(s->byname, s->n, sizeof *s->byname, cmp_byname);
	for (int i = 1; i < s->n; i++)
		if (!strcmp(s->t[s->byname[i]]->name, s->t[s->byname[i - 1]]->name))
			return x3_err(X3_EFORMAT, "tensor '%s' appears in both %s and %s",
			              s->t[s->byname[i]]->name, s->files[s->tfile[s->byname[i - 1]]].path,
			              s->files[s->tfile[s->byname[i]]].path);
	return X3_OK;
}

static int open_dir(x3_st *s, const char *dir)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
	if (access(path, F_OK) == 0) {
		json_error_t je;
		json_t *idx = json_load_file(path, 0, &je);
		if (!idx)
			return x3_err(X3_EFORMAT, "%s: invalid JSON: %s (line %d)", path, je.text, je.line);
		json_t *wm = json_object_get(idx, "weight_map");
		if (!json_is_object(wm)) {
			json_decref(idx);
			return x3_err(X3_EFORMAT, "%s: no weight_map object", path);
		}
		/* distinct file names, sorted */
		size_t nw = json_object_size(wm), nf = 0;
		const char **files = calloc(nw + 1, sizeof *files);
		const char *k;
		json_t *v;
		int rc = X3_OK;
		json_object_foreach(wm, k, v) {
			if (!json_is_string(v) || strchr(json_string_value(v), '/')) {
				rc = x3_err(X3_EFORMAT, "%s: weight_map entry '%s' is not a file name", path, k);
				break;
			}
			files[nf++] = json_string_value(v);
		}
		if (!rc) {
			qsort(files, nf, sizeof *files, cmp_str);
			for (size_t i = 0; i < nf && !rc; i++) {
				if (i && !strcmp(files[i], files[i - 1]))
					continue;
				char fp[PATH_MAX];
				snprintf(fp, sizeof fp, "%s/%s", dir, files[i]);
				if (access(fp, F_OK) != 0)
					rc = x3_err(X3_EIO, "%s: missing shard '%s' listed in model.safetensors.index.json",
					            dir, files[i]);
				else
					rc = open_file(s, fp);
			}
		}
		free(files);
		if (!rc)
			rc = build_index(s);
		if (!rc) {
			json_object_foreach(wm, k, v) {
				if (!x3_st_find(s, k)) {
					rc = x3_err(X3_EFORMAT, "%s: tensor '%s' listed in the index is missing from '%s'",
					            dir, k, json_string_value(v));
					break;
				}
			}
		}
		/* and the other way: a tensor of a shard that the index does not
		 * list, or lists in another shard (readers that go by the index
		 * would not find it, or find another copy) */
		for (int i = 0; !rc && i < s->n; i++) {
			json_t *f = json_object_get(wm, s->t[i]->name);
			const char *base = strrchr(s->files[s->tfile[i]].path, '/');
			base = base ? base + 1 : s->files[s->tfile[i]].path;
			if (!f)
				rc = x3_err(X3_EFORMAT, "%s: tensor '%s' of shard '%s' is not in model.safetensors.index.json",
				            dir, s->t[i]->name, base);
			else if (strcmp(json_string_value(f), base))
				rc = x3_err(X3_EFORMAT, "%s: tensor '%s' is in shard '%s', the index says '%s'",
				            dir, s->t[i]->name, base, json_string_value(f));
		}
		json_decref(idx);
		return rc;
	}
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	if (access(path, F_OK) == 0) {
		int rc = open_file(s, path);
		return rc ? rc : build_index(s);
	}
	DIR *d = opendir(dir);
	if (!d)
		return x3_err(X3_EIO, "%s: %s", dir, strerror(errno));
	char **names = NULL;
	size_t n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors") && de->d_name[0] != '.') {
			char **nn = realloc(names, (n + 1) * sizeof *nn);
			if (!nn)
				break;
			names = nn;
			names[n++] = strdup(de->d_name);
		}
	}
	closedir(d);
	int rc = X3_OK;
	if (n == 0)
		rc = x3_err(X3_EIO, "%s: no .safetensors files in this directory", dir);
	qsort(names, n, sizeof *names, cmp_str);
	/* without an index, shards named PREFIX-00001-of-00003.safetensors must
	 * all be there: a partial download or copy is not a smaller model */
	for (size_t i = 0; i < n && !rc; i++) {
		size_t l = strlen(names[i]);
		if (l < 12 + 15)
			continue;
		const char *t = names[i] + l - 12 - 15;   /* "-00001-of-00003" */
		unsigned a = 0, b = 0;
		int ok = t[0] == '-' && !strncmp(t + 6, "-of-", 4);
		for (int d = 0; d < 5 && ok; d++) {
			ok = t[1 + d] >= '0' && t[1 + d] <= '9' && t[10 + d] >= '0' && t[10 + d] <= '9';
			a = a * 10 + (unsigned)(t[1 + d] - '0');
			b = b * 10 + (unsigned)(t[10 + d] - '0');
		}
		if (!ok || a < 1 || a > b)
			continue;
		for (unsigned j = 1; j <= b && !rc; j++) {
			char want[PATH_MAX];
			snprintf(want, sizeof want, "%.*s-%05u-of-%05u.safetensors", (int)(t - names[i]),
			         names[i], j, b);
			const char *key = want;
			if (!bsearch(&key, names, n, sizeof *names, cmp_str))
				rc = x3_err(X3_EFORMAT, "%s: shard '%s' is missing (%s is there, and no "
				            "model.safetensors.index.json lists the shards)", dir, want, names[i]);
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (!rc) {
			snprintf(path, sizeof path, "%s/%s", dir, names[i]);
			rc = open_file(s, path);
		}
		free(names[i]);
	}
	free(names);
	return rc ? rc : build_index(s);
}

/* Block-quantized F8 weights (DeepSeek V3's FP8 checkpoints): each F8
 * tensor NAME needs NAME_scale_inv, F32 or F8_E8M0 (the "ue8m0" scale
 * format) (ceil(rows/128), ceil(cols/128)), which x3_tensor_f32 applies
 * (x3.h, scale_inv). */
static int link_scales(x3_st *s)
{
	for (int i = 0; i < s->n; i++) {
		x3_tensor *t = s->t[i];
		if (t->dtype != X3_F8_E4M3 && t->dtype != X3_F8_E5M2)
			continue;
		char sn[1024];
		snprintf(sn, sizeof sn, "%s_scale_inv", t->name);
		const x3_tensor *sc = x3_st_find(s, sn);
		if (!sc)
			return x3_err(X3_EFORMAT, "tensor '%s': %s without its block scales '%s'", t->name,
			              x3_dtype_name(t->dtype), sn);
		if (t->rank != 2)
			return x3_err(X3_EFORMAT, "tensor '%s': %s scaled per 128x128 block must be 2-D", t->name,
			              x3_dtype_name(t->dtype));
		int64_t br = (t->shape[0] + 127) / 128, bc = (t->shape[1] + 127) / 128;
		if ((sc->dtype != X3_F32 && sc->dtype != X3_F8_E8M0) || sc->rank != 2 || sc->shape[0] != br ||
		    sc->shape[1] != bc) {
			char b[64];
			return x3_err(X3_EFORMAT, "tensor '%s': %s %s, the block scales of '%s' must be F32 or F8_E8M0 "
			              "%lldx%lld",
			              sn, x3_dtype_name(sc->dtype), x3_shape_str(sc, b, sizeof b), t->name,
			              (long long)br, (long long)bc);
		}
		t->scale_inv = sc;
	}
	return X3_OK;
}

/* NAME_scales of NAME_blocks into buf; 0 if NAME does not end in _blocks */
static int mxfp4_scales_name(const char *name, char *buf, size_t n)
{
	size_t l = strlen(name);
	if (l < 8 || strcmp(name + l - 7, "_blocks") || l + 1 > n)
		return 0;
	snprintf(buf, n, "%.*s_scales", (int)(l - 7), name);
	return 1;
}

int x3_st_is_mxfp4(const x3_st *s, const x3_tensor *t)
{
	char sn[1024];
	return t->dtype == X3_U8 && mxfp4_scales_name(t->name, sn, sizeof sn) && x3_st_find(s, sn);
}

static int mxfp4_check(const x3_st *s, const x3_tensor *b, const x3_tensor **scales);

int x3_st_mxfp4(const x3_st *s, const x3_tensor *b, x3_tensor **out)
{
	char sn[1024];
	const x3_tensor *sc;
	*out = NULL;
	int rc = mxfp4_check(s, b, &sc);
	if (rc)
		return rc;
	snprintf(sn, sizeof sn, "%s", sc->name);
	int64_t sh[X3_MAX_RANK];
	for (int d = 0; d < b->rank - 1; d++)
		sh[d] = b->shape[d];
	sh[b->rank - 2] *= 32;
	x3_tensor *t = x3_tensor_new(b->name, X3_F32, b->rank - 1, sh, 1);
	if (!t)
		return x3_errprefix(X3_ENOMEM, "tensor '%s'", b->name);
	t->name[strlen(t->name) - 7] = 0;
	size_t bad = 0, ng = (size_t)x3_tensor_numel(sc);
	if (x3_mxfp4_decode(b->data, sc->data, ng, t->data, &bad)) {
		x3_tensor_free(t);
		return x3_errprefix(X3_EFORMAT, "tensor '%s': group %zu (scale %u in '%s')", b->name, bad,
		                    ((const uint8_t *)sc->data)[bad], sn);
	}
	*out = t;
	return X3_OK;
}

/* ---- GPT-OSS's experts as the hub stores them --------------------------
 * Its checkpoints hold a layer's experts fused, P = model.layers.N.mlp.experts:
 * MXFP4 P.gate_up_proj_blocks (E, 2I, H/32, 16) with P.gate_up_proj_scales
 * (E, 2I, H/32) and P.down_proj_blocks (E, H, I/32, 16) with its scales,
 * each expert (out, in) as a Linear holds it; or, in the BF16 re-uploads,
 * P.gate_up_proj (E, H, 2I) and P.down_proj (E, I, H), the matrices that
 * x @ W multiplies (a Linear's transposed); and P.gate_up_proj_bias (E, 2I),
 * P.down_proj_bias (E, H). Along 2I gate and up interleave: gate the even,
 * up the odd rows of the blocks (columns of gate_up_proj). The reader
 * shows them as the tensors of the per-expert layout,
 * P.E.{gate,up,down}_proj.{weight,bias}, weights (out, in), and hides the
 * fused ones; each is made on first use and kept while the checkpoint is
 * open (an MXFP4 weight as BF16, exact: E2M1 times a power of two has at
 * most 2 significant bits). */
struct virt {
	const x3_tensor *src, *scales; /* NULL src: a stored tensor */
	int64_t e;                     /* the expert */
	int64_t off, sr, sc;           /* element (r, c) of expert e's part of
	                                  src: off + r * sr + c * sc; MXFP4:
	                                  row r is the blocks' row off + r * sr */
};

/* blocks B and its scales: present, U8, (..., G, 16) and (..., G) */
static int mxfp4_check(const x3_st *s, const x3_tensor *b, const x3_tensor **scales)
{
	char sn[1024], bs[64], ss[64];
	if (!mxfp4_scales_name(b->name, sn, sizeof sn))
		return x3_err(X3_EFORMAT, "tensor '%s': MXFP4 blocks are named NAME_blocks", b->name);
	const x3_tensor *sc = x3_st_find(s, sn);
	if (!sc)
		return x3_err(X3_EFORMAT, "tensor '%s': MXFP4 blocks without their scales '%s'", b->name, sn);
	if (b->dtype != X3_U8 || b->rank < 2 || b->rank > X3_MAX_RANK - 1 || b->shape[b->rank - 1] != 16)
		return x3_err(X3_EFORMAT, "tensor '%s': %s %s, MXFP4 blocks must be U8 (..., groups, 16)", b->name,
		              x3_dtype_name(b->dtype), x3_shape_str(b, bs, sizeof bs));
	int ok = sc->dtype == X3_U8 && sc->rank == b->rank - 1;
	for (int d = 0; ok && d < sc->rank; d++)
		ok = sc->shape[d] == b->shape[d];
	if (!ok) {
		x3_shape_str(sc, ss, sizeof ss);
		x3_shape_str(b, bs, sizeof bs);
		const char *x = strrchr(bs, 'x');
		return x3_err(X3_EFORMAT, "tensor '%s': %s %s, the MXFP4 scales of '%s' (%s) must be U8 %.*s", sn,
		              x3_dtype_name(sc->dtype), ss, b->name, bs, x ? (int)(x - bs) : 0, bs);
	}
	*scales = sc;
	return X3_OK;
}

/* every group of B that decodes outside F32 (a scale 0xFF, or 6 x 2^k
 * past F32's range: only scales above 252 can), named: a made tensor
 * cannot fail later */
static int mxfp4_range(const x3_tensor *b, const x3_tensor *sc)
{
	const uint8_t *S = sc->data, *B = b->data;
	float f[32];
	for (size_t g = 0, ng = (size_t)x3_tensor_numel(sc); g < ng; g++) {
		size_t bad;
		if (S[g] > 252 && x3_mxfp4_decode(B + 16 * g, S + g, 1, f, &bad))
			return x3_errprefix(X3_EFORMAT, "tensor '%s': group %zu (scale %u in '%s')", b->name, g,
			                    S[g], sc->name);
	}
	return X3_OK;
}

static int make(const struct virt *v, x3_tensor *t)
{
	const x3_tensor *b = v->src;
	size_t es = x3_dtype_size(t->dtype), n = (size_t)x3_tensor_numel(t);
	int64_t rows = t->rank == 2 ? t->shape[0] : 1, cols = t->shape[t->rank - 1];
	char *d = malloc(n * es + 1);
	float *f = NULL;
	if (!d)
		return x3_err(X3_ENOMEM, "tensor '%s': out of memory", t->name);
	if (v->scales) {
		int64_t R = b->shape[1], G = b->shape[2];
		if (!(f = malloc((size_t)G * 32 * sizeof *f))) {
			free(d);
			return x3_err(X3_ENOMEM, "tensor '%s': out of memory", t->name);
		}
		for (int64_t r = 0; r < rows; r++) {
			size_t g0 = (size_t)((v->e * R + v->off + r * v->sr) * G), bad;
			if (x3_mxfp4_decode((const uint8_t *)b->data + 16 * g0, (const uint8_t *)v->scales->data + g0,
			                    (size_t)G, f, &bad)) {
				free(d), free(f);
				return x3_errprefix(X3_EFORMAT, "tensor '%s'", b->name);
			}
			for (int64_t c = 0; c < cols; c++)
				((uint16_t *)d)[r * cols + c] = x3_f32_to_bf16(f[c]);
		}
		free(f);
	} else {
		int64_t per = 1;
		for (int k = 1; k < b->rank; k++)
			per *= b->shape[k];
		const char *p = (const char *)b->data + (size_t)(v->e * per) * es;
		for (int64_t r = 0; r < rows; r++)
			for (int64_t c = 0; c < cols; c++)
				memcpy(d + (size_t)(r * cols + c) * es, p + (size_t)(v->off + r * v->sr + c * v->sc) * es, es);
	}
	t->data = d;
	return X3_OK;
}

/* tensor i, made first if it is one of hub_experts' */
static const x3_tensor *made(const x3_st *s, int i)
{
	x3_tensor *t = s->t[i];
	int rc = X3_OK;
	if (!s->v || !s->v[i].src)
		return t;
	#pragma omp critical(x3_st_made)
	{
		if (!t->data)
			rc = make(&s->v[i], t);
	}
	return rc ? NULL : t;
}

static int is_float(x3_dtype d) { return d == X3_F32 || d == X3_F16 || d == X3_BF16; }

/* fused tensor NAME (P.SFX): its shape (rank dims of want, -1 any) */
static int hub_tensor(const x3_st *s, const char *p, const char *sfx, int fl, int rank, const int64_t *want,
                      const char *what, const x3_tensor **out)
{
	char n[1024], b[64];
	snprintf(n, sizeof n, "%s.%s", p, sfx);
	const x3_tensor *t = *out = x3_st_find(s, n);
	if (!t)
		return x3_err(X3_EFORMAT, "missing tensor '%s' (GPT-OSS's experts fused per layer, the hub's layout)", n);
	int ok = t->rank == rank && (fl ? is_float(t->dtype) : t->dtype == X3_U8);
	for (int d = 0; ok && d < rank; d++)
		ok = want[d] < 0 || t->shape[d] == want[d];
	if (!ok)
		return x3_err(X3_EFORMAT, "tensor '%s': %s %s, expected %s %s", n, x3_dtype_name(t->dtype),
		              x3_shape_str(t, b, sizeof b), fl ? "float" : "U8", what);
	return X3_OK;
}

static int add_virt(x3_st *s, const char *name, x3_dtype dt, int rank, int64_t r, int64_t c, int fi,
                    struct virt v)
{
	int64_t sh[2] = { r, c };
	x3_tensor *t = x3_tensor_new(name, dt, rank, rank == 2 ? sh : sh + 1, 0);
	if (!t)
		return x3_errprefix(X3_ENOMEM, "tensor '%s'", name);
	t->nbytes = (size_t)(r * c) * x3_dtype_size(dt);
	t->owns_data = 1;
	int rc = add_tensor(s, t, fi);
	if (rc) {
		x3_tensor_free(t);
		return rc;
	}
	struct virt *nv = realloc(s->v, ((size_t)s->n + 1) * sizeof *nv);
	if (!nv)
		return x3_err(X3_ENOMEM, "out of memory");
	s->v = nv;
	s->v[s->n - 1] = v;
	return X3_OK;
}

/* the experts of P, fused (gate_up tensor i): MXFP4 or not */
static int hub_layer(x3_st *s, const char *p, int i, int mx)
{
	const x3_tensor *gu = s->t[i], *dn, *gb, *db, *gs = NULL, *ds = NULL;
	int fi = s->tfile[i], rc;
	int64_t E = gu->shape[0], H, I2, I;
	if (mx) {
		if ((rc = mxfp4_check(s, gu, &gs)))
			return rc;
		if (gu->rank != 4 || gu->shape[1] % 2)
			return x3_err(X3_EFORMAT, "tensor '%s': expected U8 (experts, 2 * inter, hidden / 32, 16)", gu->name);
		I2 = gu->shape[1], I = I2 / 2, H = gu->shape[2] * 32;
		int64_t w[4] = { E, H, -1, 16 };
		if ((rc = hub_tensor(s, p, "down_proj_blocks", 0, 4, w, "(experts, hidden, inter / 32, 16)", &dn)) ||
		    (rc = mxfp4_check(s, dn, &ds)))
			return rc;
		if (dn->shape[2] * 32 != I)
			return x3_err(X3_EFORMAT, "tensor '%s': %lld groups of 32 per row, '%s' says %lld inputs",
			              dn->name, (long long)dn->shape[2], gu->name, (long long)I);
		if ((rc = mxfp4_range(gu, gs)) || (rc = mxfp4_range(dn, ds)))
			return rc;
	} else {
		if (!is_float(gu->dtype) || gu->shape[2] % 2)
			return x3_err(X3_EFORMAT, "tensor '%s': expected float (experts, hidden, 2 * inter)", gu->name);
		H = gu->shape[1], I2 = gu->shape[2], I = I2 / 2;
		int64_t w[3] = { E, I, H };
		if ((rc = hub_tensor(s, p, "down_proj", 1, 3, w, "(experts, inter, hidden)", &dn)))
			return rc;
	}
	int64_t wg[2] = { E, I2 }, wd[2] = { E, H };
	if ((rc = hub_tensor(s, p, "gate_up_proj_bias", 1, 2, wg, "(experts, 2 * inter)", &gb)) ||
	    (rc = hub_tensor(s, p, "down_proj_bias", 1, 2, wd, "(experts, hidden)", &db)))
		return rc;
	const x3_tensor *all[] = { gu, gs, dn, ds, gb, db };
	for (int a = 0; a < 6; a++) {
		x3_tensor **nh = all[a] ? realloc(s->hid, (size_t)(s->nhid + 1) * sizeof *nh) : s->hid;
		if (!nh)
			return x3_err(X3_ENOMEM, "out of memory");
		s->hid = nh;
		if (all[a])
			s->hid[s->nhid++] = (x3_tensor *)all[a];
	}
	x3_dtype wt = mx ? X3_BF16 : gu->dtype;
	char n[1024];
	for (int64_t e = 0; e < E && !rc; e++)
		for (int k = 0; k < 3 && !rc; k++) {
			static const char *const nm[] = { "gate_proj", "up_proj", "down_proj" };
			/* gate rows 2r, up rows 2r + 1 of gate_up; down as it is */
			struct virt w = { k < 2 ? gu : dn, k < 2 ? gs : ds, e, k == 1, k < 2 ? 2 : 1, 0 };
			if (!mx)
				w.sc = k < 2 ? I2 : H;   /* the source's row is the input */
			struct virt b = { k < 2 ? gb : db, NULL, e, k == 1, 0, k < 2 ? 2 : 1 };
			int64_t out = k < 2 ? I : H, in = k < 2 ? H : I;
			snprintf(n, sizeof n, "%s.%lld.%s.weight", p, (long long)e, nm[k]);
			if (!(rc = add_virt(s, n, wt, 2, out, in, fi, w))) {
				snprintf(n, sizeof n, "%s.%lld.%s.bias", p, (long long)e, nm[k]);
				rc = add_virt(s, n, (k < 2 ? gb : db)->dtype, 1, 1, out, fi, b);
			}
		}
	return rc;
}

static int hub_experts(x3_st *s)
{
	static const char gu[] = ".experts.gate_up_proj", bl[] = "_blocks";
	int n0 = s->n, rc = X3_OK;
	if (!(s->v = calloc((size_t)n0 + 1, sizeof *s->v)))
		return x3_err(X3_ENOMEM, "out of memory");
	char p[1024], b[1024];
	for (int i = 0; i < n0 && !rc; i++) {
		const char *nm = s->t[i]->name;
		size_t l = strlen(nm), lg = sizeof gu - 1, lb = sizeof bl - 1;
		int mx = l > lg + lb && !strcmp(nm + l - lb, bl) && !strncmp(nm + l - lg - lb, gu, lg);
		if (!mx && !(l > lg && !strcmp(nm + l - lg, gu) && s->t[i]->rank == 3))
			continue;
		snprintf(p, sizeof p, "%.*s", (int)(l - lg - (mx ? lb : 0) + sizeof ".experts" - 1), nm);
		snprintf(b, sizeof b, "%s.gate_up_proj_bias", p);
		/* a (experts, out, in) gate_up_proj without biases is Transformers
		 * v5's fused layout of other MoE models, read where arch.h says */
		if (mx || x3_st_find(s, b))
			rc = hub_layer(s, p, i, mx);
	}
	if (rc)
		s->nhid = 0;    /* still in s->t, freed from there */
	if (rc || s->n == n0)
		return rc;
	/* hide the fused tensors of every layer made above */
	int k = 0;
	for (int i = 0; i < s->n; i++) {
		int hide = 0;
		for (int h = 0; h < s->nhid && !hide; h++)
			hide = s->hid[h] == s->t[i];
		if (hide)
			continue;
		s->t[k] = s->t[i], s->tfile[k] = s->tfile[i], s->v[k] = s->v[i];
		k++;
	}
	s->n = k;
	free(s->byname);
	s->byname = NULL;
	return build_index(s);
}

int x3_st_open(const char *path, x3_st **out)
{
	*out = NULL;
	x3_st *s = calloc(1, sizeof *s);
	if (!s)
		return x3_err(X3_ENOMEM, "out of memory");
	struct stat st;
	int rc;
	if (stat(path, &st) != 0)
		rc = x3_err(X3_EIO, "%s: %s", path, strerror(errno));
	else if (S_ISDIR(st.st_mode))
		rc = open_dir(s, path);
	else {
		rc = open_file(s, path);
		if (!rc)
			rc = build_index(s);
	}
	if (!rc)
		rc = link_scales(s);
	if (!rc)
		rc = hub_experts(s);
	if (rc) {
		x3_st_close(s);
		return rc;
	}
	*out = s;
	return X3_OK;
}

int x3_st_count(const x3_st *s) { return s->n; }
const x3_tensor *x3_st_get(const x3_st *s, int i) { return i >= 0 && i < s->n ? made(s, i) : NULL; }
const char *x3_st_file(const x3_st *s, int i) { return i >= 0 && i < s->n ? s->files[s->tfile[i]].path : NULL; }

const x3_tensor *x3_st_find(const x3_st *s, const char *name)
{
	int lo = 0, hi = s->n - 1;
	if (!s->byname)
		return NULL;
	while (lo <= hi) {
		int mid = (lo + hi) / 2, c = strcmp(name, s->t[s->byname[mid]]->name);
		if (!c)
			return made(s, s->byname[mid]);
		if (c < 0)
			hi = mid - 1;
		else
			lo = mid + 1;
	}
	return NULL;
}

const char *x3_st_meta(const x3_st *s, const char *key)
{
	if (!s->nfiles || !s->files[0].meta)
		return NULL;
	json_t *v = json_object_get(s->files[0].meta, key);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

void x3_st_close(x3_st *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->n; i++)
		x3_tensor_free(s->t[i]);
	for (int i = 0; i < s->nhid; i++)
		x3_tensor_free(s->hid[i]);
	free(s->v);
	free(s->hid);
	for (int i = 0; i < s->nfiles; i++) {
		if (s->files[i].map)
			munmap(s->files[i].map, s->files[i].size);
		json_decref(s->files[i].meta);
		free(s->files[i].path);
	}
	free(s->files);
	free(s->t);
	free(s->tfile);
	free(s->byname);
	free(s);
}
