/* tok_uclass.c: a tokenizer.json regex rewritten so that PCRE2 sees the
 * Unicode classes as the reference's regex engine (Oniguruma, Unicode
 * X3_UNICODE_CAT_VERSION) does, before it is compiled.
 *
 * - \s and \S are the White_Space property (PCRE2's \s also takes U+180E);
 * - \p{Xy}, \pX and \P{Xy} of a general category also take the code
 *   points that the newer Unicode assigned to it and PCRE2's tables, from
 *   Unicode X3_UNICODE_CAT_BASE on, may leave unassigned (unicode_cat.h).
 *   C, Cn and other properties (scripts, \p{Alphabetic}) are left as they
 *   are, and so are \S and the negated properties inside a character
 *   class (a union cannot take code points out).
 * Outside a class a rewritten escape becomes a class of its own: \s is
 * [<spaces>], \p{L} is [\p{L}<ranges>], \P{L} is [^\p{L}<ranges>]. */
#include <stdio.h>
#include "tok_impl.h"
#include "unicode_cat.h"

/* the rewritten regex, and the first error of appending to it */
typedef struct { sbuf b; int rc; } wbuf;

static void put(wbuf *w, const char *s, size_t n)
{
	if (!w->rc) w->rc = sb_add(&w->b, s, n);
}
static void puts_(wbuf *b, const char *s) { put(b, s, strlen(s)); }
static void put_range(wbuf *b, uint32_t lo, uint32_t hi)
{
	char tmp[40];
	int k = lo == hi ? snprintf(tmp, sizeof tmp, "\\x{%x}", (unsigned)lo)
	                 : snprintf(tmp, sizeof tmp, "\\x{%x}-\\x{%x}", (unsigned)lo, (unsigned)hi);
	put(b, tmp, (size_t)k);
}
static void put_spaces(wbuf *b)
{
	for (size_t i = 0; i < sizeof u_space / sizeof u_space[0]; i++) put_range(b, u_space[i][0], u_space[i][1]);
}
/* The ranges newly in general category cat (one letter: all of its
 * two-letter categories); 0 if cat is not one this file extends. */
static int put_newcat(wbuf *b, const char *cat, size_t n)
{
	static const char gc[][3] = { "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
	                              "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co" };
	int known = 0;
	if (n == 1) known = cat[0] && strchr("LMNPSZ", cat[0]);
	else if (n == 2) for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++) known |= !memcmp(gc[i], cat, 2);
	if (!known) return 0;
	for (size_t i = 0; i < sizeof u_newcat / sizeof u_newcat[0]; i++)
		if (u_newcat[i].cat[0] == cat[0] && (n == 1 || u_newcat[i].cat[1] == cat[1]))
			put_range(b, u_newcat[i].lo, u_newcat[i].hi);
	return 1;
}

/* Rewrite re[0..n) into *out (malloc'd, NUL-terminated, length *outn). */
int tok_uclass_rewrite(const char *re, size_t n, char **out, size_t *outn)
{
	wbuf b = { 0 };
	int inclass = 0;
	put(&b, "", 0);
	for (size_t i = 0; i < n;) {
		char c = re[i];
		if (c == '\\' && i + 1 < n) {
			char e = re[i + 1];
			if (e == 'Q') {  /* \Q...\E: literal */
				const char *q = NULL;
				for (size_t j = i + 2; j + 1 < n && !q; j++) if (re[j] == '\\' && re[j + 1] == 'E') q = re + j + 2;
				size_t end = q ? (size_t)(q - re) : n;
				put(&b, re + i, end - i);
				i = end;
				continue;
			}
			if (e == 's') {
				if (!inclass) puts_(&b, "[");
				put_spaces(&b);
				if (!inclass) puts_(&b, "]");
				i += 2;
				continue;
			}
			if (e == 'S' && !inclass) {
				puts_(&b, "[^");
				put_spaces(&b);
				puts_(&b, "]");
				i += 2;
				continue;
			}
			if (e == 'p' || e == 'P') {
				/* \pX or \p{X} / \p{^X} */
				size_t j = i + 2, ns = 0, end;
				const char *name = NULL;
				int neg = e == 'P';
				if (j < n && re[j] == '{') {
					const char *cl = memchr(re + j, '}', n - j);
					if (cl) {
						name = re + j + 1;
						end = (size_t)(cl - re) + 1;
						ns = (size_t)(cl - name);
						if (ns && name[0] == '^') { neg = !neg; name++; ns--; }
					}
				} else if (j < n) {
					name = re + j; ns = 1; end = j + 1;
				}
				if (name && !(neg && inclass)) {
					wbuf extra = { 0 };
					put(&extra, "", 0);
					if (put_newcat(&extra, name, ns) && extra.b.n) {
						if (!inclass) puts_(&b, neg ? "[^" : "[");
						puts_(&b, "\\p{");
						put(&b, name, ns);
						puts_(&b, "}");
						put(&b, extra.b.p, extra.b.n);
						if (!inclass) puts_(&b, "]");
						free(extra.b.p);
						if (!b.rc) b.rc = extra.rc;
						i = end;
						continue;
					}
					if (!b.rc) b.rc = extra.rc;
					free(extra.b.p);
				}
			}
			put(&b, re + i, 2);
			i += 2;
			continue;
		}
		if (!inclass && c == '[') {
			/* a class: a ']' first (after '^') is a literal */
			size_t j = i + 1;
			if (j < n && re[j] == '^') j++;
			if (j < n && re[j] == ']') j++;
			put(&b, re + i, j - i);
			i = j;
			inclass = 1;
			continue;
		}
		if (inclass && c == '[' && i + 1 < n && re[i + 1] == ':') {  /* [:alpha:] */
			const char *q = NULL;
			for (size_t j = i + 2; j + 1 < n && !q; j++) if (re[j] == ':' && re[j + 1] == ']') q = re + j + 2;
			size_t end = q ? (size_t)(q - re) : i + 1;
			put(&b, re + i, end - i);
			i = end;
			continue;
		}
		if (inclass && c == ']') inclass = 0;
		put(&b, &c, 1);
		i++;
	}
	if (b.rc) { free(b.b.p); return b.rc; }
	*out = b.b.p;
	*outn = b.b.n;
	return X3_OK;
}
