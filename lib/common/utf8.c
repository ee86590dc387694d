/* utf8.c: UTF-8 validation, repair, decoding and encoding (see utf8.h). */
#include <stdlib.h>
#include <string.h>
#include "x3.h"
#include "utf8.h"

/* Length of the valid sequence at s[i..n), or 0 if invalid there; *bad is
 * set to the length of the maximal invalid subpart (>= 1) when invalid. */
static size_t seq_len(const unsigned char *s, size_t i, size_t n, size_t *bad)
{
	unsigned c = s[i];
	unsigned lo = 0x80, hi = 0xBF;
	size_t need;
	if (c < 0x80) return 1;
	if (c >= 0xC2 && c <= 0xDF) need = 1;
	else if (c >= 0xE0 && c <= 0xEF) {
		need = 2;
		if (c == 0xE0) lo = 0xA0;
		if (c == 0xED) hi = 0x9F;
	} else if (c >= 0xF0 && c <= 0xF4) {
		need = 3;
		if (c == 0xF0) lo = 0x90;
		if (c == 0xF4) hi = 0x8F;
	} else { *bad = 1; return 0; }
	size_t k;
	for (k = 1; k <= need; k++) {
		if (i + k >= n) { *bad = k; return 0; }
		unsigned b = s[i + k];
		if (b < lo || b > hi) { *bad = k; return 0; }
		lo = 0x80; hi = 0xBF;
	}
	return need + 1;
}

size_t x3_utf8_valid_prefix(const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i = 0, bad;
	while (i < n) {
		if (u[i] < 0x80) { i++; continue; }
		size_t l = seq_len(u, i, n, &bad);
		if (!l) return i;
		i += l;
	}
	return n;
}

int x3_utf8_lossy(const char *s, size_t n, char **out, size_t *outlen)
{
	const unsigned char *u = (const unsigned char *)s;
	/* worst case: every byte becomes 3 bytes of U+FFFD */
	if (n > (SIZE_MAX - 1) / 3) return x3_err(X3_ENOMEM, "text too large");
	char *o = malloc(3 * n + 1);
	if (!o) return x3_err(X3_ENOMEM, "out of memory");
	size_t i = 0, j = 0, bad;
	while (i < n) {
		size_t l = u[i] < 0x80 ? 1 : seq_len(u, i, n, &bad);
		if (l) { memcpy(o + j, s + i, l); i += l; j += l; continue; }
		memcpy(o + j, "\xEF\xBF\xBD", 3);
		j += 3;
		i += bad;
	}
	o[j] = 0;
	*out = o;
	*outlen = j;
	return X3_OK;
}

uint32_t x3_utf8_next(const char *s, size_t *i)
{
	const unsigned char *u = (const unsigned char *)s + *i;
	uint32_t c = u[0];
	if (c < 0x80) { *i += 1; return c; }
	if (c < 0xE0) { *i += 2; return (c & 0x1F) << 6 | (u[1] & 0x3F); }
	if (c < 0xF0) {
		*i += 3;
		return (c & 0x0F) << 12 | (u[1] & 0x3F) << 6 | (u[2] & 0x3F);
	}
	*i += 4;
	return (c & 0x07) << 18 | (u[1] & 0x3F) << 12 | (u[2] & 0x3F) << 6 | (u[3] & 0x3F);
}

int x3_utf8_put(uint32_t c, char *b)
{
	if (c < 0x80) { b[0] = (char)c; return 1; }
	if (c < 0x800) { b[0] = (char)(0xC0 | c >> 6); b[1] = (char)(0x80 | (c & 0x3F)); return 2; }
	if (c < 0x10000) {
		b[0] = (char)(0xE0 | c >> 12); b[1] = (char)(0x80 | (c >> 6 & 0x3F));
		b[2] = (char)(0x80 | (c & 0x3F));
		return 3;
	}
	b[0] = (char)(0xF0 | c >> 18); b[1] = (char)(0x80 | (c >> 12 & 0x3F));
	b[2] = (char)(0x80 | (c >> 6 & 0x3F)); b[3] = (char)(0x80 | (c & 0x3F));
	return 4;
}
