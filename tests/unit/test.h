/* test.h: minimal TAP-style checks for C unit tests. Each check prints
 * "ok N - what" or "not ok N - what"; tests/run counts them. */
#ifndef X3_TEST_H
#define X3_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "x3.h"

static int t_n, t_fail;
#define CHECK(cond, ...) do { \
	t_n++; \
	if (cond) { printf("ok %d - ", t_n); } \
	else { t_fail++; printf("not ok %d - ", t_n); } \
	printf(__VA_ARGS__); printf("\n"); \
	if (!(cond)) printf("#   at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
	fflush(stdout); \
} while (0)
#define CHECK_OK(expr, ...) do { int rc_ = (expr); \
	CHECK(rc_ == X3_OK, __VA_ARGS__); \
	if (rc_ != X3_OK) printf("#   rc=%d: %s\n", rc_, x3_errmsg()); } while (0)
#define SKIP(...) do { t_n++; printf("ok %d - ", t_n); printf(__VA_ARGS__); \
	printf(" # SKIP\n"); } while (0)
#define TEST_DONE() do { fflush(stdout); return t_fail ? 1 : 0; } while (0)
/* ../shared relative to the repository root (tests run from the root) */
static inline const char *test_shared(void) {
	const char *s = getenv("X3_SHARED");
	return s ? s : "../shared";
}
#endif
