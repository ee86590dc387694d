/* strix.h: an index from strings to ints (open addressing on XXH3), for
 * the lookups by tensor name that run once per tensor of a model: a
 * DeepSeek-V3 pack holds ~250,000 tensors, too many to scan per lookup.
 * The index keeps the caller's key pointers: each key must stay valid
 * and unchanged while it is in the index. */
#ifndef X3_STRIX_H
#define X3_STRIX_H

#include <stddef.h>

typedef struct {
	const char **key;   /* NULL: empty slot */
	int *val;
	size_t cap;         /* a power of two, or 0 */
	size_t n;
} x3_strix;

#define X3_STRIX_INIT { NULL, NULL, 0, 0 }

/* the value of key, or -1 */
int x3_strix_get(const x3_strix *x, const char *key);
/* key -> val (val >= 0), replacing key's value if it is there; X3_ENOMEM */
int x3_strix_put(x3_strix *x, const char *key, int val);
/* key out of the index, if it is there */
void x3_strix_del(x3_strix *x, const char *key);
void x3_strix_free(x3_strix *x);

#endif
