/* jsonw.h: the JSON documents other programs read (config.json,
 * quantization_config.json, bitalloc's plan and its --predict line), built
 * with jansson and every call's result checked.
 *
 * jansson's setters fail, and drop the value, on a key or string that is
 * not UTF-8, on a NULL value (a json_string of bad UTF-8, a failed
 * json_pack or allocation) and on no memory; a document that silently
 * lacks a key is worse than none. So a document is built through an
 * x3_jw, which counts the failed calls and keeps the first one's key, and
 * x3_jw_dump gives its text only when nothing failed, else an error naming
 * the document and what could not be written (as the frame writer does
 * with a header, lib/format/frame.c). */
#ifndef X3_JSONW_H
#define X3_JSONW_H

#include <jansson.h>

typedef struct x3_jw {
	int nbad;            /* calls that failed */
	int code;            /* the first one's: X3_EFORMAT (not UTF-8), X3_EINVAL, X3_ENOMEM */
	char key[128];       /* the first one's key (U+FFFD for bytes that are not UTF-8) */
	const char *why;     /* and why */
} x3_jw;
#define X3_JW_INIT { 0, 0, "", NULL }

/* o[key] = v, taking v's reference also on failure (json_object_set_new).
 * A NULL o or v is a failure (an allocation that failed before). */
void x3_jw_set(x3_jw *w, json_t *o, const char *key, json_t *v);
/* o[key] = the string s (its failure says whether s is not UTF-8). */
void x3_jw_set_str(x3_jw *w, json_t *o, const char *key, const char *s);
/* a[] += v, taking v's reference; a failure is recorded under key (the
 * array's own key). */
void x3_jw_append(x3_jw *w, json_t *a, const char *key, json_t *v);
/* The text of o (json_dumps with flags; free() it), or NULL with x3_err
 * set: "DOC: cannot write 'KEY': WHY" (and how many more failed), code
 * X3_EFORMAT for a key or string that is not UTF-8, X3_EINVAL for a NULL
 * string, else X3_ENOMEM. *code
 * (may be NULL) gets that code, X3_OK on success. o stays the caller's. */
char *x3_jw_dump(const x3_jw *w, const json_t *o, size_t flags, const char *doc, int *code);

#endif
