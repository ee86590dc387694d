/* utf8.h: UTF-8 as every JSON header, tensor name and text needs it:
 * validation, lossy repair, decoding and encoding (lib/common/utf8.c). */
#ifndef X3_UTF8_H
#define X3_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 prefix of s (== n iff s is valid UTF-8). */
size_t x3_utf8_valid_prefix(const char *s, size_t n);
/* Replace every maximal invalid subsequence by U+FFFD (the Unicode
 * "substitution of maximal subparts" practice, as Rust's from_utf8_lossy
 * and WHATWG decoders do). *out is malloc'd, NUL-terminated.
 * Returns X3_OK or X3_ENOMEM. */
int x3_utf8_lossy(const char *s, size_t n, char **out, size_t *outlen);
/* Decode the code point at s[*i] of a VALID UTF-8 string; advances *i. */
uint32_t x3_utf8_next(const char *s, size_t *i);
/* Encode cp (<= 0x10FFFF) into buf (4 bytes room); returns the length. */
int x3_utf8_put(uint32_t cp, char *buf);
/* Bytes of the UTF-8 sequence starting with lead byte c (1 for invalid). */
static inline int x3_utf8_len(unsigned char c)
{
	return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

#endif
