/* plan_sources.c: what each step of a conversion reads of the model, as
 * lines of the tensors' and files' identities (x3_plan_sources, plan.h).
 * A tensor's identity is "NAME DTYPE SHAPE BYTES XXH3" (SHAPE its
 * dimensions joined by x), a file's "FILE BYTES XXH3", from the lines of
 * tensor-ls --digest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "x3.h"
#include "strix.h"
#include "plan.h"

typedef struct {
	char *name, *line, *stem;
	int next;            /* the next tensor of the same stem, or -1 */
} tens;

typedef struct {
	char *name, *line;
} file;

typedef struct {
	tens *t;
	int n, cap;
	x3_strix byname, bystem;   /* bystem: the first tensor of each stem */
	file *f;
	int nf, fcap;
} srcs;

static void srcs_free(srcs *s)
{
	for (int i = 0; i < s->n; i++)
		free(s->t[i].name), free(s->t[i].line), free(s->t[i].stem);
	for (int i = 0; i < s->nf; i++)
		free(s->f[i].name), free(s->f[i].line);
	free(s->t);
	free(s->f);
	x3_strix_free(&s->byname);
	x3_strix_free(&s->bystem);
}

/* NAME without its last ".part" (NAME when it has no dot) */
static char *stem_of(const char *name)
{
	const char *dot = strrchr(name, '.');
	return strndup(name, dot ? (size_t)(dot - name) : strlen(name));
}

/* P (N of ELEM bytes used, *CAP allocated) with room for one more, or NULL */
static void *room(void *p, int *cap, int n, size_t elem)
{
	if (n < *cap)
		return p;
	int nc = *cap ? 2 * *cap : 256;
	void *np = realloc(p, (size_t)nc * elem);
	if (np)
		*cap = nc;
	return np;
}

static int add_tensor(srcs *s, json_t *o, const char *label, long lineno)
{
	const char *name = json_string_value(json_object_get(o, "name"));
	const char *dtype = json_string_value(json_object_get(o, "dtype"));
	const char *xxh = json_string_value(json_object_get(o, "xxh3"));
	json_t *shape = json_object_get(o, "shape"), *bytes = json_object_get(o, "bytes");
	if (!dtype || !json_is_array(shape) || !json_is_integer(bytes))
		return x3_err(X3_EFORMAT, "%s: line %ld: tensor '%s' without its dtype, shape or bytes", label,
		              lineno, name);
	if (x3_strix_get(&s->byname, name) >= 0)
		return x3_err(X3_EFORMAT, "%s: line %ld: tensor '%s' listed twice", label, lineno, name);
	tens *nt = room(s->t, &s->cap, s->n, sizeof *nt);
	if (!nt)
		return x3_err(X3_ENOMEM, "out of memory");
	s->t = nt;
	char dims[256] = "";
	size_t dl = 0;
	for (size_t d = 0; d < json_array_size(shape) && dl < sizeof dims; d++)
		dl += (size_t)snprintf(dims + dl, sizeof dims - dl, "%s%lld", d ? "x" : "",
		                       (long long)json_integer_value(json_array_get(shape, d)));
	int i = s->n;
	tens *t = &s->t[i];
	memset(t, 0, sizeof *t);
	t->next = -1;
	s->n++;   /* freed with the others from here on */
	if (!(t->name = strdup(name)) || !(t->stem = stem_of(name)) ||
	    asprintf(&t->line, "%s %s %s %lld %s", name, dtype, dims, (long long)json_integer_value(bytes),
	             xxh) < 0) {
		t->line = NULL;
		return x3_err(X3_ENOMEM, "out of memory");
	}
	int rc = x3_strix_put(&s->byname, t->name, i);
	if (rc)
		return rc;
	int j = x3_strix_get(&s->bystem, t->stem);
	if (j < 0)
		return x3_strix_put(&s->bystem, t->stem, i);
	while (s->t[j].next >= 0)   /* the end of its stem's chain */
		j = s->t[j].next;
	s->t[j].next = i;
	return X3_OK;
}

static int add_file(srcs *s, json_t *o, const char *label, long lineno)
{
	const char *name = json_string_value(json_object_get(o, "file"));
	const char *xxh = json_string_value(json_object_get(o, "xxh3"));
	json_t *bytes = json_object_get(o, "bytes");
	if (!xxh || !json_is_integer(bytes))
		return x3_err(X3_EFORMAT, "%s: line %ld: file '%s' without its bytes or xxh3", label, lineno, name);
	file *nf = room(s->f, &s->fcap, s->nf, sizeof *nf);
	if (!nf)
		return x3_err(X3_ENOMEM, "out of memory");
	s->f = nf;
	file *f = &s->f[s->nf];
	memset(f, 0, sizeof *f);
	s->nf++;
	if (!(f->name = strdup(name)) ||
	    asprintf(&f->line, "%s %lld %s", name, (long long)json_integer_value(bytes), xxh) < 0) {
		f->line = NULL;
		return x3_err(X3_ENOMEM, "out of memory");
	}
	return X3_OK;
}

static int read_digests(srcs *s, FILE *in, const char *label)
{
	char *buf = NULL;
	size_t cap = 0;
	long lineno = 0;
	int rc = X3_OK;
	while (!rc && getline(&buf, &cap, in) >= 0) {
		lineno++;
		if (strspn(buf, " \t\r\n") == strlen(buf))
			continue;
		json_error_t je;
		json_t *o = json_loads(buf, 0, &je);
		if (!json_is_object(o))
			rc = x3_err(X3_EFORMAT, "%s: line %ld: not a JSON object%s%s", label, lineno, o ? "" : ": ",
			            o ? "" : je.text);
		else if (json_is_string(json_object_get(o, "name")) && json_is_string(json_object_get(o, "xxh3")))
			rc = add_tensor(s, o, label, lineno);
		else if (json_is_string(json_object_get(o, "file")))
			rc = add_file(s, o, label, lineno);
		else
			rc = x3_err(X3_EFORMAT, "%s: line %ld: neither a tensor with its xxh3 nor a file", label,
			            lineno);
		json_decref(o);
	}
	if (!rc && ferror(in))
		rc = x3_err(X3_EIO, "%s: read error", label);
	free(buf);
	return rc;
}

/* a list of tensors */
typedef struct {
	int *i;
	int n, cap;
} tlist;

static int push(tlist *l, int i)
{
	int *ni = room(l->i, &l->cap, l->n, sizeof *ni);
	if (!ni)
		return x3_err(X3_ENOMEM, "out of memory");
	l->i = ni;
	l->i[l->n++] = i;
	return X3_OK;
}

/* the tensors of module M: those of its stem and of its weight's stem, and
 * its weight */
static int names_of(const srcs *s, const x3_module *m, tlist *l)
{
	char *ws = stem_of(m->weight);
	if (!ws)
		return x3_err(X3_ENOMEM, "out of memory");
	int rc = X3_OK;
	for (int j = x3_strix_get(&s->bystem, m->key); !rc && j >= 0; j = s->t[j].next)
		rc = push(l, j);
	if (strcmp(ws, m->key))
		for (int j = x3_strix_get(&s->bystem, ws); !rc && j >= 0; j = s->t[j].next)
			rc = push(l, j);
	int w = x3_strix_get(&s->byname, m->weight);
	if (!rc && w >= 0)
		rc = push(l, w);
	free(ws);
	return rc;
}

/* qsort has no context argument: the tensors being sorted */
static const tens *sort_t;

static int by_name(const void *a, const void *b)
{
	return strcmp(sort_t[*(const int *)a].name, sort_t[*(const int *)b].name);
}

/* the identities of L's tensors, each once, by name, space-separated */
static void put_ids(const srcs *s, tlist *l, FILE *out)
{
	sort_t = s->t;
	qsort(l->i, (size_t)l->n, sizeof *l->i, by_name);
	sort_t = NULL;
	for (int k = 0, first = 1; k < l->n; k++) {
		if (k && l->i[k] == l->i[k - 1])
			continue;
		fprintf(out, "%s%s", first ? "" : " ", s->t[l->i[k]].line);
		first = 0;
	}
}

static int by_layer(const void *a, const void *b)
{
	return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

enum { F_CONFIG, F_TOKENIZER, F_ALL };

/* KEY, a tab and the identities of the files WHICH selects, in their order */
static void put_files(const srcs *s, const char *key, int which, FILE *out)
{
	fprintf(out, "%s\t", key);
	for (int k = 0, first = 1; k < s->nf; k++) {
		const char *f = s->f[k].name;
		int tok = !strcmp(f, "tokenizer.json") || !strcmp(f, "tokenizer_config.json");
		if (which == F_ALL || !strcmp(f, "config.json") || (which == F_TOKENIZER && tok)) {
			fprintf(out, "%s%s", first ? "" : " ", s->f[k].line);
			first = 0;
		}
	}
	fputc('\n', out);
}

int x3_plan_sources(const x3_module *m, int n, FILE *digests, const char *label, FILE *out)
{
	srcs s = {0};
	tlist l = {0};
	int *layers = malloc(((size_t)n + 1) * sizeof *layers), nl = 0;
	unsigned char *used = NULL;
	int rc = layers ? read_digests(&s, digests, label) : x3_err(X3_ENOMEM, "out of memory");
	if (!rc && !(used = calloc((size_t)s.n + 1, 1)))
		rc = x3_err(X3_ENOMEM, "out of memory");
	/* each linear's tensors */
	for (int i = 0; !rc && i < n; i++) {
		l.n = 0;
		if ((rc = names_of(&s, &m[i], &l)))
			break;
		for (int k = 0; k < l.n; k++)
			used[l.i[k]] = 1;
		layers[nl++] = m[i].layer;
		if (m[i].d->kind != X3_KIND_LINEAR)
			continue;
		fprintf(out, "%s\t", m[i].key);
		put_ids(&s, &l, out);
		fputc('\n', out);
	}
	/* each layer's: its modules' tensors */
	if (!rc)
		qsort(layers, (size_t)nl, sizeof *layers, by_layer);
	for (int k = 0; !rc && k < nl; k++) {
		if (k && layers[k] == layers[k - 1])
			continue;
		l.n = 0;
		for (int i = 0; !rc && i < n; i++)
			if (m[i].layer == layers[k])
				rc = names_of(&s, &m[i], &l);
		if (rc)
			break;
		fprintf(out, "layer.%d\t", layers[k]);
		put_ids(&s, &l, out);
		fputc('\n', out);
	}
	/* the tensors of no module */
	if (!rc) {
		l.n = 0;
		for (int i = 0; !rc && i < s.n; i++)
			if (!used[i])
				rc = push(&l, i);
	}
	if (!rc) {
		fputs("other\t", out);
		put_ids(&s, &l, out);
		fputc('\n', out);
		put_files(&s, "config", F_CONFIG, out);
		put_files(&s, "tokenizer", F_TOKENIZER, out);
		put_files(&s, "files", F_ALL, out);
	}
	free(l.i);
	free(layers);
	free(used);
	srcs_free(&s);
	return rc;
}
