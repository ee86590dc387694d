/* unicode.c: White_Space and canonical normalization (see unicode.h). */
#include <stdlib.h>
#include <string.h>
#include "x3.h"
#include "unicode.h"
#include "unicode_tab.h"

int x3_u_is_space(uint32_t c)
{
	if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
	if (c < 0x85) return 0;
	return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
	       c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- normalization ------------------------------------------------------ */
/* Hangul syllable constants of the Unicode standard, section 3.12. */
enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7,
       LCOUNT = 19, VCOUNT = 21, TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT,
       SCOUNT = LCOUNT * NCOUNT };

static int ccc_of(uint32_t c)
{
	if (c < 0x300) return 0;
	size_t lo = 0, hi = sizeof u_ccc / sizeof u_ccc[0];
	while (lo < hi) {
		size_t m = (lo + hi) / 2;
		uint32_t k = u_ccc[m] >> 8;
		if (k == c) return (int)(u_ccc[m] & 0xFF);
		if (k < c) lo = m + 1; else hi = m;
	}
	return 0;
}

static const uint32_t *decomp_of(uint32_t c, int *len)
{
	size_t lo = 0, hi = sizeof u_dec / sizeof u_dec[0];
	while (lo < hi) {
		size_t m = (lo + hi) / 2;
		if (u_dec[m][0] == c) { *len = (int)u_dec[m][2]; return u_dpool + u_dec[m][1]; }
		if (u_dec[m][0] < c) lo = m + 1; else hi = m;
	}
	return NULL;
}

static uint32_t compose_pair(uint32_t a, uint32_t b)
{
	if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
		return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
	if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 &&
	    b > TBASE && b < TBASE + TCOUNT)
		return a + (b - TBASE);
	uint64_t key = (uint64_t)a << 21 | b;
	size_t lo = 0, hi = sizeof u_comp / sizeof u_comp[0];
	while (lo < hi) {
		size_t m = (lo + hi) / 2;
		if (u_comp[m].pair == key) return u_comp[m].c;
		if (u_comp[m].pair < key) lo = m + 1; else hi = m;
	}
	return 0;
}

static int is_second(uint32_t c)
{
	if (c >= VBASE && c < VBASE + VCOUNT) return 1;
	if (c > TBASE && c < TBASE + TCOUNT) return 1;
	size_t lo = 0, hi = sizeof u_second / sizeof u_second[0];
	while (lo < hi) {
		size_t m = (lo + hi) / 2;
		if (u_second[m] == c) return 1;
		if (u_second[m] < c) lo = m + 1; else hi = m;
	}
	return 0;
}

/* A character that every normalization form leaves alone whatever its
 * neighbours: a starter without a decomposition that composes with nothing
 * before it (a following mark is itself not stable). */
static int stable(uint32_t c, int compose)
{
	int dl;
	if (c < 0xC0) return 1;
	if (c >= SBASE && c < SBASE + SCOUNT) return compose;   /* NFD splits them */
	return ccc_of(c) == 0 && !decomp_of(c, &dl) && !is_second(c);
}

int x3_u_normalize(const char *s, size_t n, int compose, char **out, size_t *outlen)
{
	size_t i;
	int all_stable = 1;
	for (i = 0; i < n && all_stable;) {
		if ((unsigned char)s[i] < 0x80) i++;
		else all_stable = stable(x3_utf8_next(s, &i), compose);
	}
	if (all_stable) {
		char *o = malloc(n + 1);
		if (!o) return x3_err(X3_ENOMEM, "out of memory");
		memcpy(o, s, n); o[n] = 0;
		*out = o; *outlen = n;
		return X3_OK;
	}
	/* a decomposition is at most 4 code points per input code point
	 * (18 in theory for some compatibility ones; canonical <= 4) */
	uint32_t *cp = malloc((4 * n + 4) * sizeof *cp);
	int *cc = malloc((4 * n + 4) * sizeof *cc);
	char *o = malloc(4 * n + 1);
	if (!cp || !cc || !o) { free(cp); free(cc); free(o); return x3_err(X3_ENOMEM, "out of memory"); }
	size_t m = 0;
	for (i = 0; i < n;) {
		uint32_t c = x3_utf8_next(s, &i);
		if (c >= SBASE && c < SBASE + SCOUNT) {
			uint32_t si = c - SBASE;
			cp[m++] = LBASE + si / NCOUNT;
			cp[m++] = VBASE + si % NCOUNT / TCOUNT;
			if (si % TCOUNT) cp[m++] = TBASE + si % TCOUNT;
			continue;
		}
		int dl = 0;
		const uint32_t *d = c >= 0xC0 ? decomp_of(c, &dl) : NULL;
		if (d) { memcpy(cp + m, d, dl * sizeof *d); m += dl; }
		else cp[m++] = c;
	}
	/* canonical ordering: stable insertion sort of each run of non-starters */
	for (i = 0; i < m; i++) cc[i] = ccc_of(cp[i]);
	for (i = 1; i < m; i++) {
		if (!cc[i]) continue;
		size_t j = i;
		while (j > 0 && cc[j - 1] > cc[j]) {
			uint32_t tc = cp[j]; cp[j] = cp[j - 1]; cp[j - 1] = tc;
			int tk = cc[j]; cc[j] = cc[j - 1]; cc[j - 1] = tk;
			j--;
		}
	}
	if (compose && m) {
		/* canonical composition: the last starter absorbs each following
		 * character that is not blocked from it */
		size_t starter = 0, w = 1;
		int have_starter = cc[0] == 0;
		int last_cc = have_starter ? 0 : 256;
		for (i = 1; i < m; i++) {
			uint32_t c = cp[i];
			int k = cc[i];
			if (have_starter && (last_cc < k || (last_cc == 0 && w == starter + 1))) {
				uint32_t p = compose_pair(cp[starter], c);
				if (p) { cp[starter] = p; continue; }
			}
			if (k == 0) { starter = w; have_starter = 1; last_cc = 0; }
			else last_cc = k;
			cp[w] = c; cc[w] = k; w++;
		}
		m = w;
	}
	size_t j = 0;
	for (i = 0; i < m; i++) j += x3_utf8_put(cp[i], o + j);
	o[j] = 0;
	free(cp); free(cc);
	*out = o; *outlen = j;
	return X3_OK;
}
