/* st_write.c: writing safetensors files and sharded model directories
 * atomically (spool file, tmp names, fsync, rename); safetensors.c reads
 * them. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <jansson.h>
#include "io.h"
#include "strix.h"
#include "safetensors.h"

struct went {
	char *name;
	x3_dtype dtype;
	int rank;
	int64_t shape[X3_MAX_RANK];
	uint64_t nbytes, spool_off;
	int module;
};

struct x3_stw {
	char *path;          /* file or directory */
	int single;          /* write exactly one file at path */
	uint64_t shard_bytes;
	char spool_dir[PATH_MAX], spool_path[PATH_MAX];
	int spool_fd;        /* -1 until the first x3_stw_add */
	int direct;          /* tensors declared, payloads given at commit */
	uint64_t spool_len;
	struct went *e;
	int n, cap;
	x3_strix names;     /* e by name */
	int module;
	json_t *meta;
	int sizer;           /* x3_stw_create_sizer: headers only, no files */
};

static int full_write(int fd, const void *p, size_t n, const char *what)
{
	return x3_write_full(fd, p, n) ? x3_err(X3_EIO, "writing %s: %s", what, strerror(errno)) : X3_OK;
}

int x3_stw_create(const char *path, uint64_t shard_bytes, x3_stw **out)
{
	*out = NULL;
	x3_stw *w = calloc(1, sizeof *w);
	if (!w || !(w->path = strdup(path)) || !(w->meta = json_object())) {
		if (w) free(w->path);
		free(w);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	size_t l = strlen(path);
	w->single = shard_bytes == 0 && l > 12 && !strcmp(path + l - 12, ".safetensors");
	w->shard_bytes = shard_bytes;
	char dir[PATH_MAX];
	if (w->single)
		x3_dir_of(path, dir, sizeof dir);
	else
		snprintf(dir, sizeof dir, "%s", path);
	struct stat st;
	if (!w->single && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
		int rc = x3_err(X3_EIO, "%s: not a directory", dir);
		json_decref(w->meta);
		free(w->path);
		free(w);
		return rc;
	}
	snprintf(w->spool_dir, sizeof w->spool_dir, "%s", dir);
	w->spool_fd = -1;
	*out = w;
	return X3_OK;
}

int x3_stw_module(x3_stw *w)
{
	if (w->n && w->e[w->n - 1].module == w->module)
		w->module++;
	return X3_OK;
}

int x3_stw_meta(x3_stw *w, const char *key, const char *val)
{
	int rc = x3_check_utf8("metadata key", key);
	if (rc)
		return rc;
	if ((rc = x3_check_utf8("value", val)))
		return x3_errprefix(rc, "metadata '%s'", key);
	if (json_object_set_new(w->meta, key, json_string(val)))
		return x3_err(X3_ENOMEM, "metadata '%s': out of memory", key);
	return X3_OK;
}

/* The entry of t (header only) */
static int add_entry(x3_stw *w, const x3_tensor *t, uint64_t spool_off)
{
	int rc = x3_tensor_check_utf8(t, 0);   /* jansson would drop it from the header */
	if (rc)
		return rc;
	if (!strcmp(t->name, "__metadata__"))
		return x3_err(X3_EINVAL, "tensor name '__metadata__' is reserved for the file's metadata");
	if (x3_strix_get(&w->names, t->name) >= 0)
		return x3_err(X3_EINVAL, "tensor '%s' added twice", t->name);
	if (w->n == w->cap) {
		int cap = w->cap ? 2 * w->cap : 64;
		struct went *ne = realloc(w->e, cap * sizeof *ne);
		if (!ne)
			return x3_err(X3_ENOMEM, "out of memory");
		w->e = ne;
		w->cap = cap;
	}
	struct went *e = &w->e[w->n];
	memset(e, 0, sizeof *e);
	if (!(e->name = strdup(t->name)))
		return x3_err(X3_ENOMEM, "out of memory");
	if ((rc = x3_strix_put(&w->names, e->name, w->n))) {
		free(e->name);
		return rc;
	}
	e->dtype = t->dtype;
	e->rank = t->rank;
	memcpy(e->shape, t->shape, sizeof e->shape);
	e->nbytes = t->nbytes;
	e->spool_off = spool_off;
	e->module = w->module;
	w->n++;
	return X3_OK;
}

int x3_stw_add(x3_stw *w, const x3_tensor *t)
{
	if (w->direct)
		return x3_err(X3_EINVAL, "tensor '%s': x3_stw_add after x3_stw_declare", t->name);
	if (w->sizer)   /* sizes only: no payload, no spool */
		return add_entry(w, t, 0);
	if (!t->data && t->nbytes)
		return x3_err(X3_EINVAL, "tensor '%s' has no data", t->name);
	if (w->spool_fd < 0) {
		snprintf(w->spool_path, sizeof w->spool_path, "%s/.x3spool-XXXXXX", w->spool_dir);
		if ((w->spool_fd = mkstemp(w->spool_path)) < 0)
			return x3_err(X3_EIO, "%s: cannot create a spool file: %s", w->spool_dir, strerror(errno));
	}
	int rc = add_entry(w, t, w->spool_len);
	if (rc)
		return rc;
	if ((rc = full_write(w->spool_fd, t->data, t->nbytes, w->spool_path))) {
		x3_strix_del(&w->names, w->e[--w->n].name);
		free(w->e[w->n].name);
		return x3_errprefix(rc, "tensor '%s'", t->name);
	}
	w->spool_len += t->nbytes;
	return X3_OK;
}

int x3_stw_declare(x3_stw *w, const x3_tensor *t)
{
	if (w->spool_fd >= 0)
		return x3_err(X3_EINVAL, "tensor '%s': x3_stw_declare after x3_stw_add", t->name);
	w->direct = 1;
	return add_entry(w, t, 0);
}

static void stw_free(x3_stw *w)
{
	if (w->spool_fd >= 0) {
		close(w->spool_fd);
		unlink(w->spool_path);
	}
	for (int i = 0; i < w->n; i++)
		free(w->e[i].name);
	free(w->e);
	x3_strix_free(&w->names);
	json_decref(w->meta);
	free(w->path);
	free(w);
}

void x3_stw_abort(x3_stw *w)
{
	if (w)
		stw_free(w);
}

/* The JSON header of the shard of tensors [a, b) (malloc'd), before its
 * padding to a multiple of 8 bytes. */
static char *shard_header(const x3_stw *w, int a, int b)
{
	json_t *root = json_object();
	int bad = !root;
	uint64_t off = 0;
	for (int i = a; i < b && !bad; i++) {
		json_t *ent = json_object(), *shape = json_array(), *jo = json_array();
		for (int d = 0; d < w->e[i].rank; d++)
			bad |= json_array_append_new(shape, json_integer(w->e[i].shape[d]));
		bad |= json_array_append_new(jo, json_integer((json_int_t)off));
		bad |= json_array_append_new(jo, json_integer((json_int_t)(off + w->e[i].nbytes)));
		bad |= json_object_set_new(ent, "dtype", json_string(x3_dtype_name(w->e[i].dtype)));
		bad |= json_object_set_new(ent, "shape", shape);
		bad |= json_object_set_new(ent, "data_offsets", jo);
		bad |= json_object_set_new(root, w->e[i].name, ent);
		off += w->e[i].nbytes;
	}
	if (!bad && json_object_size(w->meta))
		bad |= json_object_set(root, "__metadata__", w->meta);
	char *hs = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	return hs;
}

/* The payloads at commit: the spool's, or the caller's (direct). */
typedef struct {
	x3_stw_payload fn;
	void *ctx;
} payload_src;

/* Write tensors [a, b) as one safetensors file, under f's temporary name. */
static int write_shard(x3_stw *w, int a, int b, x3_afile *f, const payload_src *ps)
{
	char final[PATH_MAX];
	snprintf(final, sizeof final, "%s", f->path);
	char *hs = shard_header(w, a, b);
	if (!hs)
		return x3_err(X3_ENOMEM, "%s: cannot build the header: out of memory", final);
	size_t hn = strlen(hs), pad = (8 - hn % 8) % 8;
	int rc = x3_afile_open(f, final);
	if (rc) {
		free(hs);
		return rc;
	}
	unsigned char lb[8];
	for (int i = 0; i < 8; i++)
		lb[i] = (unsigned char)((hn + pad) >> (8 * i));
	rc = full_write(f->fd, lb, 8, final);
	if (!rc) rc = full_write(f->fd, hs, hn, final);
	if (!rc) rc = full_write(f->fd, "        ", pad, final);
	free(hs);
	static const size_t CH = 1 << 20;
	unsigned char *buf = rc || ps ? NULL : malloc(CH);
	if (!rc && !ps && !buf)
		rc = x3_err(X3_ENOMEM, "out of memory");
	for (int i = a; i < b && !rc; i++) {
		if (ps) {   /* direct: the caller's bytes, written once */
			const void *p = NULL;
			void *owned = NULL;
			if ((rc = ps->fn(ps->ctx, i, &p, &owned)))
				break;
			rc = w->e[i].nbytes ? full_write(f->fd, p, w->e[i].nbytes, final) : X3_OK;
			free(owned);
			continue;
		}
		uint64_t left = w->e[i].nbytes, so = w->e[i].spool_off;
		while (left && !rc) {
			size_t k = left < CH ? (size_t)left : CH;
			ssize_t got = pread(w->spool_fd, buf, k, (off_t)so);
			if (got < 0 && errno == EINTR)
				continue;
			if (got <= 0) {
				rc = x3_err(X3_EIO, "reading spool %s: %s", w->spool_path, got < 0 ? strerror(errno) : "short read");
				break;
			}
			rc = full_write(f->fd, buf, (size_t)got, final);
			left -= (uint64_t)got;
			so += (uint64_t)got;
		}
	}
	free(buf);
	if (!rc)
		rc = x3_afile_close(f);
	if (rc)
		x3_afile_abort(f);
	return rc;
}

/* Assign whole modules to shards: shard s = [start[s], start[s+1]);
 * start has n + 2 entries. Returns the number of shards. */
static int assign_shards(const x3_stw *w, int *start)
{
	uint64_t cur = 0;
	int nsh = 1;
	start[0] = 0;
	for (int i = 0; i < w->n;) {
		int j = i;
		uint64_t msize = 0;
		while (j < w->n && w->e[j].module == w->e[i].module)
			msize += w->e[j++].nbytes;
		if (!w->single && w->shard_bytes && cur > 0 && cur + msize > w->shard_bytes) {
			start[nsh++] = i;
			cur = 0;
		}
		cur += msize;
		i = j;
	}
	start[nsh] = w->n;
	return nsh;
}

/* File name of shard s of nsh (no directory). */
static void shard_name(const x3_stw *w, int s, int nsh, char *buf, size_t n)
{
	if (nsh == 1)
		snprintf(buf, n, "model.safetensors");
	else
		snprintf(buf, n, "model-%05d-of-%05d.safetensors", s + 1, nsh);
	(void)w;
}

/* model.safetensors.index.json of a sharded output (malloc'd), or NULL. */
static char *index_text(const x3_stw *w, const int *start, int nsh)
{
	json_t *idx = json_object(), *md = json_object(), *wm = json_object();
	int bad = !idx || !md || !wm;
	uint64_t total = 0;
	for (int s = 0; s < nsh; s++) {
		char base[64];
		shard_name(w, s, nsh, base, sizeof base);
		for (int i = start[s]; i < start[s + 1]; i++) {
			bad |= json_object_set_new(wm, w->e[i].name, json_string(base));
			total += w->e[i].nbytes;
		}
	}
	bad |= json_object_set_new(md, "total_size", json_integer((json_int_t)total));
	bad |= json_object_set_new(idx, "metadata", md);
	bad |= json_object_set_new(idx, "weight_map", wm);
	char *txt = bad ? NULL : json_dumps(idx, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(idx);
	return txt;
}

int x3_stw_create_sizer(uint64_t shard_bytes, int single, x3_stw **out)
{
	*out = NULL;
	x3_stw *w = calloc(1, sizeof *w);
	if (!w || !(w->meta = json_object())) {
		free(w);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	w->single = single;
	w->shard_bytes = shard_bytes;
	w->spool_fd = -1;
	w->sizer = 1;
	*out = w;
	return X3_OK;
}

int x3_stw_size(x3_stw *w, uint64_t *bytes, int *nshards)
{
	int rc = X3_OK;
	*bytes = 0;
	int *start = calloc((size_t)w->n + 2, sizeof *start);
	if (!start) {
		stw_free(w);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	int nsh = assign_shards(w, start);
	for (int s = 0; s < nsh && !rc; s++) {
		char *hs = shard_header(w, start[s], start[s + 1]);
		if (!hs) {
			rc = x3_err(X3_ENOMEM, "out of memory");
			break;
		}
		size_t hn = strlen(hs);
		*bytes += 8 + hn + (8 - hn % 8) % 8;
		free(hs);
		for (int i = start[s]; i < start[s + 1]; i++)
			*bytes += w->e[i].nbytes;
	}
	if (!rc && nsh > 1 && !w->single) {
		char *txt = index_text(w, start, nsh);
		if (!txt)
			rc = x3_err(X3_ENOMEM, "out of memory");
		else
			*bytes += strlen(txt);
		free(txt);
	}
	if (nshards)
		*nshards = nsh;
	free(start);
	stw_free(w);
	return rc;
}

static int commit(x3_stw *w, const payload_src *ps)
{
	int rc = X3_OK, nsh = 0;
	int *start = calloc(w->n + 2, sizeof *start);   /* shard s = [start[s], start[s+1]) */
	if (!start) {
		stw_free(w);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	if (w->sizer) {
		free(start);
		stw_free(w);
		return x3_err(X3_EINVAL, "a sizing writer writes nothing (x3_stw_size)");
	}
	nsh = assign_shards(w, start);
	x3_afile *sh = calloc(nsh, sizeof *sh);
	if (!sh) {
		rc = x3_err(X3_ENOMEM, "out of memory");
		goto out;
	}
	for (int s = 0; s < nsh; s++) {
		char base[64];
		shard_name(w, s, nsh, base, sizeof base);
		if (w->single)
			snprintf(sh[s].path, PATH_MAX, "%s", w->path);
		else
			snprintf(sh[s].path, PATH_MAX, "%s/%s", w->path, base);
		sh[s].fd = -1;
	}
	int done = 0;
	for (; done < nsh && !rc; done++)
		if ((rc = write_shard(w, start[done], start[done + 1], &sh[done], ps)))
			break;
	if (rc) {
		for (int s = 0; s < done; s++)
			x3_afile_abort(&sh[s]);
		goto out;
	}
	if (nsh > 1) {
		char *txt = index_text(w, start, nsh);
		char ip[PATH_MAX];
		snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", w->path);
		/* shards first, index last: a reader never sees an index without its shards */
		for (int s = 0; s < nsh && !rc; s++)
			rc = x3_afile_rename(&sh[s]);
		if (!rc)
			rc = txt ? x3_write_file_atomic(ip, txt, strlen(txt)) : x3_err(X3_ENOMEM, "out of memory");
		free(txt);
		if (rc)
			for (int s = 0; s < nsh; s++) {
				x3_afile_abort(&sh[s]);
				unlink(sh[s].path);
			}
	} else if ((rc = x3_afile_rename(&sh[0]))) {
		x3_afile_abort(&sh[0]);
	}
	if (!rc) {
		char dir[PATH_MAX];
		if (w->single)
			x3_dir_of(w->path, dir, sizeof dir);
		else
			snprintf(dir, sizeof dir, "%s", w->path);
		rc = x3_fsync_dir(dir, w->path);
	}
out:
	free(sh);
	free(start);
	stw_free(w);
	return rc;
}

int x3_stw_commit(x3_stw *w)
{
	if (w->direct) {
		stw_free(w);
		return x3_err(X3_EINVAL, "x3_stw_commit of declared tensors: use x3_stw_commit_direct");
	}
	return commit(w, NULL);
}

int x3_stw_commit_direct(x3_stw *w, x3_stw_payload fn, void *ctx)
{
	payload_src ps = {fn, ctx};
	return commit(w, &ps);
}
