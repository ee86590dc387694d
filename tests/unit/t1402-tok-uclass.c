/* t1402-tok-uclass: the rewrite of a tokenizer.json regex's Unicode classes
 * (lib/text/tok_uclass.c) before PCRE2 compiles it: \s as White_Space
 * (not U+180E), general categories with the code points Unicode assigned
 * after PCRE2's tables (U+1C89 CYRILLIC CAPITAL LETTER TJE and U+A7CB are
 * letters of Unicode 16), inside and outside character classes, negated,
 * and what is left alone (\Q..\E, a literal ']' first in a class, POSIX
 * classes, scripts, \S and \P inside a class). Each rewritten pattern is
 * compiled and matched against the code points. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "test.h"
#include "tok_impl.h"

static char *rewrite(const char *re)
{
	char *out = NULL;
	size_t n = 0;
	if (tok_uclass_rewrite(re, strlen(re), &out, &n)) return NULL;
	return out;
}
/* 1 if the rewritten re matches all of s, 0 if not, -1 if it fails to compile */
static int full(const char *re, const char *s)
{
	char *rw = rewrite(re);
	if (!rw) return -1;
	int e;
	PCRE2_SIZE off;
	pcre2_code *c = pcre2_compile((PCRE2_SPTR)rw, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED | PCRE2_ENDANCHORED,
	                              &e, &off, NULL);
	free(rw);
	if (!c) return -1;
	pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
	int rc = pcre2_match(c, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL);
	pcre2_match_data_free(md);
	pcre2_code_free(c);
	return rc >= 0;
}
static int same(const char *re)
{
	char *rw = rewrite(re);
	int r = rw && !strcmp(rw, re);
	free(rw);
	return r;
}

#define TJE "\xe1\xb2\x89"      /* U+1C89, Lu in Unicode 16 */
#define SHA "\xea\x9f\x8b"      /* U+A7CB, Lu in Unicode 16 */
#define MVS "\xe1\xa0\x8e"      /* U+180E MONGOLIAN VOWEL SEPARATOR, Cf */
#define OGHAM "\xe1\x9a\x80"    /* U+1680, White_Space */
#define NEL "\xc2\x85"          /* U+0085, White_Space */

int main(void)
{
	CHECK(full("\\s", " ") == 1 && full("\\s", OGHAM) == 1 && full("\\s", NEL) == 1 && full("\\s", "\t") == 1,
	      "\\s takes space, tab, U+0085, U+1680");
	CHECK(full("\\s", MVS) == 0 && full("\\S", MVS) == 1, "\\s leaves U+180E to \\S");
	CHECK(full("[^\\s\\p{L}\\p{N}]", MVS) == 1 && full("[^\\s\\p{L}\\p{N}]", " ") == 0,
	      "[^\\s\\p{L}\\p{N}] takes U+180E, not a space");
	CHECK(full("\\p{L}", TJE) == 1 && full("\\pL", SHA) == 1 && full("\\p{Lu}", TJE) == 1 && full("\\p{Ll}", TJE) == 0,
	      "\\p{L}, \\pL and \\p{Lu} take U+1C89 and U+A7CB; \\p{Ll} does not");
	CHECK(full("[\\p{Lu}\\p{Lt}]+", "A" TJE SHA) == 1 && full("[^\\r\\n\\p{L}\\p{N}]", TJE) == 0,
	      "in a class: [\\p{Lu}\\p{Lt}]+ takes them, [^\\r\\n\\p{L}\\p{N}] does not");
	CHECK(full("\\P{L}", TJE) == 0 && full("\\p{^L}", TJE) == 0 && full("\\P{L}", "1") == 1,
	      "\\P{L} and \\p{^L} leave U+1C89 out");
	CHECK(full("a\\s+b", "a " OGHAM "b") == 1 && full("(?i:'s|'t)\\p{L}+", "'S" TJE) == 1,
	      "rewritten classes inside longer patterns");
	CHECK(same("\\p{Han}+") && same("\\p{Alphabetic}") && same("\\Q\\s\\p{L}\\E") && same("[\\S\\P{L}]") &&
	      same("[[:alpha:]]") && same("\\p{Lt}") && same("\\\\s") && same("\\x{41}\\d"),
	      "left alone: scripts, other properties, \\Q..\\E, \\S and \\P in a class, POSIX, a category with no new code points, \\\\s");
	char *rw = rewrite("[]\\s]");
	CHECK(rw && !strncmp(rw, "[]\\x{9}-\\x{d}", 12) && rw[strlen(rw) - 1] == ']' && strchr(rw, ']') == rw + 1,
	      "a ']' first in a class is a literal: [ ]\\s ] -> %s", rw ? rw : "(null)");
	free(rw);
	CHECK(full("[]\\s]", "]") == 1 && full("[]\\s]", " ") == 1 && full("[^]\\s]", "x") == 1, "[]\\s] and [^]\\s] compile and match");
	TEST_DONE();
}
