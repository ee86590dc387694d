/* jsonw.c: checked JSON building (jsonw.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "jsonw.h"
#include "utf8.h"
#include "x3.h"

static int is_utf8(const char *s)
{
	size_t n = strlen(s);
	return x3_utf8_valid_prefix(s, n) == n;
}

/* record a failed call on key (the first one's key and reason are kept) */
static void fail(x3_jw *w, const char *key, int code, const char *why)
{
	if (w->nbad++)
		return;
	w->code = code;
	w->why = why;
	char *k = NULL;
	size_t n = 0;
	if (!key)
		key = "?";
	if (x3_utf8_lossy(key, strlen(key), &k, &n) == X3_OK) {
		/* cut at a character boundary */
		n = n < sizeof w->key - 1 ? n : sizeof w->key - 1;
		n = x3_utf8_valid_prefix(k, n);
		memcpy(w->key, k, n);
		w->key[n] = 0;
	} else {
		snprintf(w->key, sizeof w->key, "?");
	}
	free(k);
}

void x3_jw_set(x3_jw *w, json_t *o, const char *key, json_t *v)
{
	if (!key || !is_utf8(key)) {
		json_decref(v);
		fail(w, key, X3_EFORMAT, "the key is not UTF-8");
	} else if (!v) {
		fail(w, key, X3_ENOMEM, "out of memory");
	} else if (json_object_set_new(o, key, v)) {   /* decrefs v */
		fail(w, key, X3_ENOMEM, "out of memory");
	}
}

void x3_jw_set_str(x3_jw *w, json_t *o, const char *key, const char *s)
{
	if (!s)
		fail(w, key, X3_EINVAL, "no value");
	else if (!is_utf8(s))
		fail(w, key, X3_EFORMAT, "the value is not UTF-8");
	else
		x3_jw_set(w, o, key, json_string(s));
}

void x3_jw_append(x3_jw *w, json_t *a, const char *key, json_t *v)
{
	if (!v || json_array_append_new(a, v))   /* decrefs v */
		fail(w, key, X3_ENOMEM, "out of memory");
}

char *x3_jw_dump(const x3_jw *w, const json_t *o, size_t flags, const char *doc, int *code)
{
	int rc = X3_OK;
	char *s = NULL;
	if (w->nbad) {
		char more[48] = "";
		if (w->nbad > 1)
			snprintf(more, sizeof more, " (and %d more failed)", w->nbad - 1);
		rc = x3_err(w->code, "%s: cannot write '%s': %s%s", doc, w->key, w->why, more);
	} else if (!o || !(s = json_dumps(o, flags))) {
		rc = x3_err(X3_ENOMEM, "%s: cannot write it: out of memory", doc);
	}
	if (code)
		*code = rc;
	return s;
}
