/* t1583: hessian_merge.h: a Hessian set written as a whole capture (the
 * dropped rows' warning and limit, the parts' metadata left out) and as a
 * part (its provenance); the merge of parts, given in any order, equal
 * byte for byte to the one process over the same chunks (a dense layer's
 * group, expert groups with the fallback from part 0's all-token Hessian,
 * an expert no row of the last chunk reached), its sums against a plain
 * double loop, the starved experts reported; parts missing, twice, of
 * another calibration or other capture options, or mixed with a whole
 * stream refused; whole streams summed by name. */
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>
#include "test.h"
#include "synth.h"
#include "hessian_merge.h"
#include "moe_fallback.h"

enum { K = 8, C = 3, ROWS = 4, MT = 10 };   /* width, chunks, rows a chunk, min tokens */

static float *X;        /* the rows of the dense group and of expert 0, C * ROWS */
static float *XA;       /* the all-token rows (the layer's first chunk) */
static int64_t min_tokens = MT, top_k = 2;   /* the capture's options */

struct w {
	int fd;
	x3_writer *w;
};

static x3_writer *wopen(struct w *o, const char *file)
{
	o->fd = open(test_path(file), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (o->fd < 0 || x3_writer_open_fd(o->fd, 0, &o->w))
		return NULL;
	return o->w;
}

static int wclose(struct w *o)
{
	int rc = x3_writer_close(o->w);
	close(o->fd);
	return rc;
}

static x3_hess *add(x3_hset *s, const char *name, int layer, const char *members)
{
	x3_hess *h = x3_hset_find(s, name);
	if (!h && x3_hset_add(s, name, K, 0, members, layer, &h))
		return NULL;
	return h;
}

/* Expert 0 gets every chunk's rows, expert 1 the first row of chunks 0
 * and 1 (none of the last): one process (part -1) writes the whole
 * capture to file, part c its chunk. */
static int capture(int part, const char *file, const char *calib)
{
	struct w o;
	x3_writer *w = wopen(&o, file);
	x3_hset dense = { 0 }, ex = { 0 }, all = { 0 }, l1 = { 0 };
	struct x3_part_prov pv;
	x3_part_prov_set(&pv, part, C, ROWS, C * ROWS, calib, 0);
	const struct x3_part_prov *p = part >= 0 ? &pv : NULL;
	int rc = !w;
	x3_hess *a = NULL;
	if (part <= 0) {
		rc |= x3_hset_add(&all, "L0.all", K, 0, NULL, 0, &a);
		rc |= rc || x3_hess_add_rows(a, XA, ROWS, K);
	}
	struct x3_moe_group g[2] = { { 0, 0, 0 }, { 1, 0, 0 } };
	for (int c = 0; c < C && !rc; c++) {
		if (part >= 0 && c != part)
			continue;
		const float *x = X + c * ROWS * K;
		x3_hess *d = add(&dense, "L0.attn", 0, "q,k,v"), *e0 = add(&ex, "L0.e0", 0, "e0.up");
		x3_hess *e1 = add(&ex, "L0.e1", 0, "e1.up"), *h1 = add(&l1, "L1.attn", 1, "q");
		rc |= !d || !e0 || !e1 || !h1;
		rc |= rc || x3_hess_add_rows(d, x, ROWS, K) || x3_hess_add_rows(e0, x, ROWS, K) ||
		      x3_hess_add_rows(h1, x + K, ROWS - 1, K);
		g[0].routed += ROWS;
		if (c < C - 1) {
			rc |= rc || x3_hess_add_rows(e1, x, 1, K);
			g[1].routed++;
		} else if (part >= 0) {   /* a part leaves out an expert none of its rows reached */
			x3_hess_free(ex.h[--ex.n]);
		}
		for (int i = 0; i < ex.n; i++)
			rc |= x3_hess_end_chunk(ex.h[i]);
		rc |= x3_hess_end_chunk(d) || x3_hess_end_chunk(h1);
	}
	x3_dtype dt = p ? X3_F64 : X3_F32;
	rc |= rc || x3_hset_write(&dense, w, dt, p, NULL, NULL);
	if (!rc && a && p)
		rc = x3_part_put_all_tokens(w, a, 1, p);
	for (int i = 0; i < ex.n && !rc; i++) {
		int64_t fb;
		rc = x3_moe_group_finish(ex.h[i], a, &g[i], X3_MOE_ROUTED, min_tokens, top_k, 0,
		                         p != NULL, &fb);
	}
	rc |= rc || x3_hset_write(&ex, w, dt, p, NULL, NULL) || x3_hset_write(&l1, w, dt, p, NULL, NULL);
	rc |= wclose(&o);
	x3_hset_free(&dense);
	x3_hset_free(&ex);
	x3_hset_free(&all);
	x3_hset_free(&l1);
	return rc;
}

static int same_file(const char *a, const char *b)
{
	char cmd[4096];
	snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
	return system(cmd) == 0;
}

struct starved {
	int n;
	long long layer, m;
	char list[256];
};

static void on_starved(void *ctx, int64_t layer, int64_t m, const char *experts)
{
	struct starved *s = ctx;
	s->n++;
	s->layer = layer, s->m = m;
	snprintf(s->list, sizeof s->list, "%s", experts);
}

static int merge(const char *out, int f64, struct starved *st, int n, ...)
{
	const char *files[8];
	char paths[8][1024];
	va_list ap;
	va_start(ap, n);
	for (int i = 0; i < n; i++) {
		snprintf(paths[i], sizeof paths[i], "%s", test_path(va_arg(ap, const char *)));
		files[i] = paths[i];
	}
	va_end(ap);
	struct x3_merge_opts o = { .f64 = f64, .starved = st ? on_starved : NULL, .ctx = st };
	struct w w;
	if (!wopen(&w, out))
		return X3_EIO;
	int rc = x3_hess_merge(files, n, &o, w.w);
	int rc2 = wclose(&w);
	return rc ? rc : rc2;
}

static const x3_tensor *find(x3_tensor **v, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(v[i]->name, name))
			return v[i];
	return NULL;
}

static void parts(void)
{
	const char *calib = "0123456789abcdef";
	int rc = capture(-1, "one", calib);
	for (int c = 0; c < C; c++) {
		char f[16];
		snprintf(f, sizeof f, "part%d", c);
		rc |= capture(c, f, calib);
	}
	CHECK(!rc, "one process and its %d parts written (%s)", C, rc ? x3_errmsg() : "");
	struct starved st = { 0 };
	CHECK_OK(merge("merged", 0, &st, 3, "part2", "part0", "part1"), "parts merged (given 2, 0, 1)");
	char a[1024];
	snprintf(a, sizeof a, "%s", test_path("one"));
	CHECK(same_file(a, test_path("merged")), "merged parts == one process, byte for byte");
	CHECK(st.n == 1 && st.layer == 0 && st.m == MT && !strcmp(st.list, "1 (2)"),
	      "starved: layer 0, below %d: '1 (2)' (got %d calls: layer %lld, %lld, '%s')", MT, st.n,
	      st.layer, st.m, st.list);

	x3_tensor **v;
	int n;
	CHECK_OK(x3_read_all(test_path("merged"), &v, &n), "merged output read");
	const x3_tensor *d = find(v, n, "L0.attn"), *e1 = find(v, n, "L0.e1");
	CHECK(n == 4 && d && e1 && !find(v, n, "L0.all") && d->dtype == X3_F32,
	      "4 frames (the all-token one is the merge's), F32 as the parts' products");
	/* the dense group against a plain double loop over every row */
	double err = 0, scale = 0;
	for (int i = 0; d && i < K; i++)
		for (int j = 0; j < K; j++) {
			double s = 0;
			for (int r = 0; r < C * ROWS; r++)
				s += (double)X[r * K + i] * X[r * K + j];
			err = fmax(err, fabs(((float *)d->data)[i * K + j] - s));
			scale = fmax(scale, fabs(s));
		}
	int64_t cnt = 0;
	CHECK(d && err <= 1e-5 * scale && !x3_meta_get_i64(d, "count", &cnt) && cnt == C * ROWS &&
	      !strcmp(x3_meta_get(d, "members"), "q,k,v"),
	      "L0.attn: Σ xᵀx over the %d rows (max error %.3g of %.3g), count, members", C * ROWS, err,
	      scale);
	int64_t fbt = 0;
	CHECK(e1 && !x3_meta_get_i64(e1, "count", &cnt) && cnt == MT &&
	      !strcmp(x3_meta_get(e1, "expert_fallback"), "1") &&
	      !x3_meta_get_i64(e1, "fallback_tokens", &fbt) && fbt == MT - 2 &&
	      !strcmp(x3_meta_get(e1, "routed_tokens"), "2") && !x3_meta_get(e1, "min_tokens") &&
	      !x3_meta_get(e1, "routed_w2") && !x3_meta_get(e1, "all_tokens") &&
	      !x3_meta_get(e1, "chunk"), "L0.e1: 2 routed + 8 fallback rows, count 10; no part or "
	      "provenance metadata");
	x3_tensors_free(v, n);

	/* F64 out: the same sums, not rounded to F32 */
	CHECK_OK(merge("merged64", 1, NULL, 3, "part0", "part1", "part2"), "parts merged, F64");
	rc = x3_read_all(test_path("merged64"), &v, &n);
	CHECK(rc == X3_OK && n == 4 && v[0]->dtype == X3_F64, "--f64: F64 frames");
	x3_tensors_free(v, n);

	/* refused */
	rc = merge("bad", 0, NULL, 2, "part0", "part2");
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "chunk 1 of 3 is missing (2 chunk files given)"),
	      "a chunk missing (%s)", x3_errmsg());
	rc = merge("bad", 0, NULL, 4, "part0", "part1", "part1", "part2");
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "chunk 1 of 3 is given twice"),
	      "a chunk twice (%s)", x3_errmsg());
	rc = merge("bad", 0, NULL, 2, "part0", "one");
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "a whole stream, but the inputs before it are chunks"),
	      "parts and a whole stream (%s)", x3_errmsg());
	rc = capture(1, "other1", "fedcba9876543210");
	rc = rc ? rc : merge("bad", 0, NULL, 3, "part0", "other1", "part2");
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "not a chunk of the same capture") &&
	      strstr(x3_errmsg(), "calib_xxh3"), "a part of another calibration (%s)", x3_errmsg());
	/* parts of the same calibration but other options */
	min_tokens = MT + 1;
	rc = capture(1, "other1", calib);
	min_tokens = MT;
	rc = rc ? rc : merge("bad", 0, NULL, 3, "part0", "other1", "part2");
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "other1: frame 'L0.e0': metadata 'min_tokens' is "
	      "'11', not '10'"), "a part of another --min-tokens (%s)", x3_errmsg());
	top_k = 3;
	rc = capture(2, "other2", calib);
	top_k = 2;
	rc = rc ? rc : merge("bad", 0, NULL, 3, "part0", "part1", "other2");
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "metadata 'top_k' is '3', not '2'"),
	      "a part of another top k (%s)", x3_errmsg());
}

static void dropped_fn(void *ctx, const char *name, int64_t d, int64_t rows)
{
	char *s = ctx;
	snprintf(s, 64, "%s %lld/%lld", name, (long long)d, (long long)rows);
}

static void whole(void)
{
	/* one row of 20 non-finite: a warning; 1 of 5: over the limit */
	float x[20 * K];
	for (int i = 0; i < 20 * K; i++)
		x[i] = X[i % (C * ROWS * K)];
	x[3 * K + 1] = NAN;
	x3_hset s = { 0 };
	x3_hess *h;
	char got[64] = "";
	struct w o;
	int rc = !wopen(&o, "whole") || x3_hset_add(&s, "g", K, 0, "m", 0, &h) ||
	         x3_hess_add_rows(h, x, 20, K) || x3_hess_set_meta(h, "min_tokens", "5") ||
	         x3_hset_write(&s, o.w, X3_F32, NULL, dropped_fn, got);
	rc |= wclose(&o);
	CHECK(!rc && !strcmp(got, "g 1/20") && s.n == 0, "1 of 20 rows dropped: written, reported "
	      "('%s'), the set emptied", got);
	got[0] = 0;
	rc = !wopen(&o, "whole5") || x3_hset_add(&s, "g", K, 0, "m", 0, &h) ||
	     x3_hess_add_rows(h, x, 5, K);
	int rw = rc ? rc : x3_hset_write(&s, o.w, X3_F32, NULL, dropped_fn, got);
	wclose(&o);
	CHECK(rw == X3_ENUM && strstr(x3_errmsg(), "'g': 1 of 5 rows dropped") && s.n == 0,
	      "1 of 5 dropped: over the limit, an error (%s)", x3_errmsg());
	x3_tensor **v;
	int n;
	rc = x3_read_all(test_path("whole"), &v, &n);
	CHECK(rc == X3_OK && n == 1 && !x3_meta_get(v[0], "min_tokens"),
	      "a whole capture's frame leaves out the parts' metadata");
	x3_tensors_free(v, n);
	x3_hset_free(&s);

	/* streams: by name, in order; twice the same stream is twice its sums */
	CHECK_OK(merge("twice", 0, NULL, 2, "one", "one"), "whole streams merged");
	x3_tensor **a, **b;
	int na, nb, ok = x3_read_all(test_path("one"), &a, &na) == X3_OK &&
	                 x3_read_all(test_path("twice"), &b, &nb) == X3_OK && na == nb;
	for (int i = 0; ok && i < na; i++) {
		int64_t c1 = 0, c2 = 0;
		ok = !strcmp(a[i]->name, b[i]->name) && b[i]->dtype == X3_F32 &&
		     !x3_meta_get_i64(a[i], "count", &c1) && !x3_meta_get_i64(b[i], "count", &c2) &&
		     c2 == 2 * c1;
		for (int64_t j = 0; ok && j < K * K; j++)
			ok = ((float *)b[i]->data)[j] == 2 * ((float *)a[i]->data)[j];
	}
	CHECK(ok, "a stream merged with itself: the same names in order, 2x the sums and counts");
	x3_tensors_free(a, na);
	x3_tensors_free(b, nb);
	int rc2 = merge("bad", 0, NULL, 2, "one", "part0");
	CHECK(rc2 == X3_EFORMAT && strstr(x3_errmsg(), "the partial sums of a chunk (--part), but the "
	      "inputs before it are whole streams"), "a whole stream then a part (%s)", x3_errmsg());
}

int main(void)
{
	if (test_tmpdir("t1583")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	x3_rng g;
	x3_rng_seed(&g, 1583, 0);
	X = test_randn(&g, C * ROWS * K, 1.0);
	XA = test_randn(&g, ROWS * K, 1.0);
	parts();
	whole();
	free(X);
	free(XA);
	test_tmpdir_remove();
	TEST_DONE();
}
