/* strix: the string index against a plain array scanned per lookup, over
 * seeded random puts, replacements and deletions (deletions in the middle
 * of probe runs, growth with entries deleted before it). */
#include "strix.h"
#include "test.h"

enum { NK = 3000, OPS = 60000 };

int main(void)
{
	static char keys[NK][32];
	static int ref[NK];   /* the value each key should have, -1 absent */
	for (int i = 0; i < NK; i++) {
		snprintf(keys[i], sizeof keys[i], "model.layers.%d.mlp.experts.%d", i / 7, i % 7);
		ref[i] = -1;
	}
	x3_strix x = X3_STRIX_INIT;
	x3_rng r;
	x3_rng_seed(&r, 7, 0);
	int bad_get = 0, bad_n = 0, rc = X3_OK;
	for (int op = 0; op < OPS && !rc; op++) {
		int k = (int)(x3_rng_u64(&r) % NK), what = (int)(x3_rng_u64(&r) % 3);
		if (what < 2) {
			rc = x3_strix_put(&x, keys[k], op);
			ref[k] = op;
		} else {
			x3_strix_del(&x, keys[k]);
			ref[k] = -1;
		}
		if (op % 97 == 0) {   /* every key, now and then */
			size_t n = 0;
			for (int i = 0; i < NK; i++) {
				bad_get += x3_strix_get(&x, keys[i]) != ref[i];
				n += ref[i] >= 0;
			}
			bad_n += n != x.n;
		}
	}
	CHECK(rc == X3_OK, "60,000 puts and deletions of 3,000 keys");
	CHECK(bad_get == 0, "every lookup equals the plain array's (%d differ)", bad_get);
	CHECK(bad_n == 0, "the count equals the plain array's (%d differ)", bad_n);
	CHECK(x.cap >= 2 * x.n, "at most half full (%zu of %zu)", x.n, x.cap);
	/* a key equal by content, another pointer */
	char copy[32];
	int k = 0;
	while (ref[k] < 0)
		k++;
	snprintf(copy, sizeof copy, "%s", keys[k]);
	CHECK(x3_strix_get(&x, copy) == ref[k], "found by its bytes, not its pointer");
	CHECK(x3_strix_get(&x, "model.layers.0.mlp") == -1, "a prefix of a key is not the key");
	x3_strix_del(&x, "no such key");
	CHECK(x3_strix_get(&x, keys[k]) == ref[k], "deleting an absent key changes nothing");
	x3_strix_free(&x);
	CHECK(x3_strix_get(&x, keys[k]) == -1 && x.n == 0, "empty after x3_strix_free");
	x3_strix e = X3_STRIX_INIT;
	CHECK(x3_strix_get(&e, "a") == -1, "an empty index finds nothing");
	TEST_DONE();
}
