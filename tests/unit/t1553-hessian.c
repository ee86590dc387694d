/* t1553: Hessian accumulators: exact small case, non-finite rows dropped
 * and counted, the 10% limit, F32 vs F64, adding frames, the total spilled
 * to a file (x3_hess_spill). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "test.h"
#include "blas.h"
#include "hessian.h"

/* The packed upper triangle (blas.h x3_tri_*) at sizes around the block
 * width: every (i, j) a distinct index inside x3_tri_size, (i, j) and (j,
 * i) the same; the packed Gram products the same bits as the full ones
 * (F64) and the plain double sum to rounding (F32 products); unpacked
 * symmetric. */
static void tri_case(int64_t n)
{
	const int64_t rows = 37, sz = x3_tri_size(n);
	unsigned char *seen = calloc((size_t)sz, 1);
	const int64_t B = n < X3_GEMM_COLS ? n : X3_GEMM_COLS;
	int ok = sz >= n * (n + 1) / 2 && sz <= n * (n + 1) / 2 + n * B / 2, bad = 0;
	for (int64_t i = 0; i < n; i++)
		for (int64_t j = i; j < n; j++) {
			int64_t k = x3_tri_at(n, i, j);
			bad |= k < 0 || k >= sz || seen[k] || k != x3_tri_at(n, j, i);
			if (k >= 0 && k < sz)
				seen[k] = 1;
		}
	CHECK(ok && !bad, "n=%lld: %lld packed elements for %lld (at most n^2/2 + nB/2), one index per (i, j)", (long long)n,
	      (long long)sz, (long long)(n * (n + 1) / 2));
	x3_rng g;
	x3_rng_seed(&g, 1553, (uint64_t)n);
	float *x = malloc((size_t)(rows * n) * sizeof *x);
	double *xd = malloc((size_t)(rows * n) * sizeof *xd);
	for (int64_t i = 0; i < rows * n; i++)
		xd[i] = x[i] = (float)x3_rng_normal(&g);
	double *full = calloc((size_t)(n * n), sizeof *full), *T = calloc((size_t)sz, sizeof *T);
	double *T2 = calloc((size_t)sz, sizeof *T2), *U = malloc((size_t)(n * n) * sizeof *U);
	x3_gram_acc_f64(xd, rows, n, full);
	x3_gram_acc_tri_f64(xd, rows, n, T);
	CHECK_OK(x3_gram_acc_tri_f32_f64(x, rows, n, T2), "n=%lld: F32 products", (long long)n);
	x3_tri_unpack(T, n, 1, U);
	int same = 1, sym = 1;
	double err = 0;
	for (int64_t i = 0; i < n; i++)
		for (int64_t j = 0; j < n; j++) {
			if (j >= i)
				same &= !memcmp(&full[i * n + j], &T[x3_tri_at(n, i, j)], sizeof *T);
			sym &= U[i * n + j] == U[j * n + i] && U[i * n + j] == T[x3_tri_at(n, i, j)];
			double s = 0;
			for (int64_t r = 0; r < rows; r++)
				s += xd[r * n + i] * xd[r * n + j];
			err = fmax(err, fabs(s - T2[x3_tri_at(n, i, j)]) / rows);
		}
	CHECK(same, "n=%lld: packed F64 Gram == the full one's upper triangle, bit for bit", (long long)n);
	CHECK(sym, "n=%lld: unpacked: symmetric, each element the packed one", (long long)n);
	/* packed back from the full matrix: the same; added with a weight of 2: 3x */
	double *T3 = malloc((size_t)sz * sizeof *T3);
	x3_tri_add_full(T3, n, U, 0, 1.0, 1);
	x3_tri_add_full(T3, n, U, 0, 2.0, 0);
	int back = 1;
	for (int64_t i = 0; i < n; i++)
		for (int64_t j = i; j < n; j++)
			back &= T3[x3_tri_at(n, i, j)] == 3 * T[x3_tri_at(n, i, j)];
	CHECK(back, "n=%lld: x3_tri_add_full: the full matrix packed back, weights added", (long long)n);
	free(T3);
	CHECK(err < 1e-5, "n=%lld: packed F32 products == the plain double sum to F32 rounding (%.2g)",
	      (long long)n, err);
	free(seen), free(x), free(xd), free(full), free(T), free(T2), free(U);
}

int main(void)
{
	static const int64_t sizes[] = { 1, 7, 256, 257, 300, 600, 2600 };
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
		tri_case(sizes[i]);
	/* X = [[1,2],[3,4],[5,6]]: XᵀX = [[35,44],[44,56]] */
	const float x[6] = { 1, 2, 3, 4, 5, 6 };
	x3_hess *h;
	CHECK_OK(x3_hess_new("g", 2, 0, "a.weight,b.weight", 3, &h), "new F32");
	CHECK_OK(x3_hess_add_rows(h, x, 3, 2), "add 3x2");
	x3_tensor *t = x3_hess_frame(h, X3_F32);
	const float *v = t->data;
	CHECK(t->rank == 2 && t->shape[0] == 2 && t->shape[1] == 2 && t->dtype == X3_F32,
	      "frame 2x2 F32");
	CHECK(v[0] == 35 && v[1] == 44 && v[2] == 44 && v[3] == 56, "XᵀX exact and symmetric");
	CHECK(!strcmp(x3_meta_get(t, "count"), "3") && !strcmp(x3_meta_get(t, "dropped"), "0") &&
	      !strcmp(x3_meta_get(t, "members"), "a.weight,b.weight") &&
	      !strcmp(x3_meta_get(t, "layer"), "3") && !strcmp(x3_meta_get(t, "role"), "hessian"),
	      "metadata count/dropped/members/layer/role");
	CHECK(x3_hess_add_rows(h, x, 2, 3) == X3_EINVAL, "wrong width refused");

	/* add the frame to itself: doubles */
	CHECK_OK(x3_hess_add_frame(h, t), "add frame");
	x3_tensor *t2 = x3_hess_frame(h, X3_F64);
	const double *d = t2->data;
	CHECK(d[0] == 70 && d[1] == 88 && d[3] == 112 && !strcmp(x3_meta_get(t2, "count"), "6"),
	      "frame added: H and count double, F64 output");
	x3_tensor_free(t2);
	x3_hess_free(h);

	/* non-finite rows: dropped, counted, the rest accumulated */
	float y[12] = { 1, 2, NAN, 0, 3, 4, 1, INFINITY, 5, 6, 0, 0 };
	CHECK_OK(x3_hess_new("g", 2, 1, NULL, -1, &h), "new F64");
	CHECK_OK(x3_hess_add_rows(h, y, 6, 2), "add 6x2 with a NaN and an Inf row");
	CHECK(x3_hess_count(h) == 4 && x3_hess_dropped(h) == 2, "4 rows counted, 2 dropped");
	CHECK(x3_hess_too_many_dropped(h), "2 of 6 dropped is over 10%%");
	t2 = x3_hess_frame(h, X3_F64);
	d = t2->data;
	CHECK(d[0] == 35 && d[1] == 44 && d[2] == 44 && d[3] == 56 && !x3_meta_get(t2, "layer") &&
	      !x3_meta_get(t2, "members"), "finite rows only; no layer/members metadata");
	x3_tensor_free(t2);
	float ones[2 * 40];
	for (int i = 0; i < 80; i++)
		ones[i] = 1;
	CHECK_OK(x3_hess_add_rows(h, ones, 40, 2), "add 40 good rows");
	CHECK(!x3_hess_too_many_dropped(h), "2 of 46 dropped is under 10%%");
	x3_hess_free(h);

	/* bad frames for add_frame */
	CHECK_OK(x3_hess_new("g", 2, 0, NULL, -1, &h), "new");
	x3_meta_del(t, "count");
	int rc = x3_hess_add_frame(h, t);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "count"), "frame without count: %s",
	      x3_errmsg());
	x3_tensor *sq = x3_tensor_new2("big", X3_F32, 3, 3);
	x3_meta_set(sq, "count", "1");
	rc = x3_hess_add_frame(h, sq);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "'big'"), "wrong size: %s", x3_errmsg());
	x3_tensor_free(sq);
	x3_hess_free(h);
	x3_tensor_free(t);

	/* SYRK path on a larger random case against a plain double sum */
	enum { R = 300, N = 37 };
	float *z = malloc(sizeof(float) * R * N);
	x3_rng g;
	x3_rng_seed(&g, 7, 0);
	for (int i = 0; i < R * N; i++)
		z[i] = (float)x3_rng_normal(&g);
	CHECK_OK(x3_hess_new("z", N, 1, NULL, -1, &h), "new 37");
	CHECK_OK(x3_hess_add_rows(h, z, 100, N), "rows 0..99");
	CHECK_OK(x3_hess_add_rows(h, z + 100 * N, 200, N), "rows 100..299");
	t = x3_hess_frame(h, X3_F64);
	double err = 0;
	for (int i = 0; i < N; i++)
		for (int j = 0; j < N; j++) {
			double s = 0;
			for (int r = 0; r < R; r++)
				s += (double)z[r * N + i] * z[r * N + j];
			err = fmax(err, fabs(s - ((double *)t->data)[i * N + j]));
		}
	CHECK(err < 1e-9, "DSYRK accumulation == plain sum (err %.2g)", err);
	x3_tensor_free(t);
	x3_hess_free(h);

	/* chunks: rows summed in 3 chunks (F32 products, two calls in each
	 * one) == the 3 chunks' partial frames added in chunk order, bit for
	 * bit; == a plain double sum to F32 rounding of the products */
	x3_hess *w, *p[3], *m;
	static const int lo[4] = { 0, 120, 250, R };
	CHECK_OK(x3_hess_new("z", N, 0, NULL, -1, &w), "new (F32 products)");
	for (int c = 0; c < 3; c++) {
		CHECK_OK(x3_hess_new("z", N, 0, NULL, -1, &p[c]), "part %d", c);
		int64_t mid = (lo[c] + lo[c + 1]) / 2;   /* each chunk in two calls */
		x3_hess_add_rows(w, z + lo[c] * N, mid - lo[c], N);
		x3_hess_add_rows(p[c], z + lo[c] * N, mid - lo[c], N);
		x3_hess_add_rows(w, z + mid * N, lo[c + 1] - mid, N);
		x3_hess_add_rows(p[c], z + mid * N, lo[c + 1] - mid, N);
		CHECK_OK(x3_hess_end_chunk(w), "end chunk %d", c);
	}
	CHECK_OK(x3_hess_new("z", N, 1, NULL, -1, &m), "merge accumulator");
	x3_tensor *tw = x3_hess_frame(w, X3_F64);
	for (int c = 0; c < 3; c++) {
		x3_tensor *tp = x3_hess_frame(p[c], X3_F64);
		CHECK_OK(x3_hess_add_frame(m, tp), "add part %d", c);
		x3_tensor_free(tp);
		x3_hess_free(p[c]);
	}
	x3_tensor *tm = x3_hess_frame(m, X3_F64);
	CHECK(!memcmp(tw->data, tm->data, sizeof(double) * N * N) && x3_hess_count(m) == R &&
	      x3_hess_count(w) == R, "3 chunks summed == their partial frames merged, bit for bit");
	err = 0;
	for (int i = 0; i < N; i++)
		for (int j = 0; j < N; j++) {
			double s = 0;
			for (int r = 0; r < R; r++)
				s += (double)z[r * N + i] * z[r * N + j];
			err = fmax(err, fabs(s - ((double *)tw->data)[i * N + j]) / R);
		}
	CHECK(err < 1e-5, "chunked F32 products == plain sum to F32 rounding (err %.2g)", err);
	CHECK_OK(x3_hess_end_chunk(w), "ending an empty chunk");
	x3_tensor *te = x3_hess_frame(w, X3_F64);
	CHECK(!memcmp(te->data, tw->data, sizeof(double) * N * N), "... changes nothing");
	x3_tensor_free(te), x3_tensor_free(tm);

	/* x3_hess_spill: the ended chunks' total in a file while later chunks
	 * run; every frame the same bits as without (F32 and F64 products),
	 * with a chunk still open too, and after a frame is added (the total
	 * read back); the file unlinked from the start; a directory that
	 * cannot take it is an error naming the Hessian and the directory */
	char dir[] = "/tmp/t1553-XXXXXX";
	CHECK(mkdtemp(dir) != NULL, "spill directory");
	for (int f64 = 0; f64 < 2; f64++) {
		x3_hess *a, *b;
		CHECK_OK(x3_hess_new("z", N, f64, NULL, -1, &a), "new, F64 %d", f64);
		CHECK_OK(x3_hess_new("z", N, f64, NULL, -1, &b), "new (spilled), F64 %d", f64);
		CHECK_OK(x3_hess_spill(b, dir), "spill to %s", dir);
		for (int c = 0; c < 3; c++) {
			int64_t mid = (lo[c] + lo[c + 1]) / 2;
			x3_hess_add_rows(a, z + lo[c] * N, mid - lo[c], N);
			x3_hess_add_rows(b, z + lo[c] * N, mid - lo[c], N);
			x3_hess_add_rows(a, z + mid * N, lo[c + 1] - mid, N);
			x3_hess_add_rows(b, z + mid * N, lo[c + 1] - mid, N);
			CHECK_OK(x3_hess_end_chunk(a), "end chunk %d", c);
			CHECK_OK(x3_hess_end_chunk(b), "end chunk %d (spilled)", c);
		}
		x3_tensor *fa = x3_hess_frame(a, X3_F64), *fb = x3_hess_frame(b, X3_F64);
		CHECK(fa && fb && !memcmp(fa->data, fb->data, sizeof(double) * N * N),
		      "F64 %d: 3 chunks with the total spilled == in memory, bit for bit", f64);
		x3_tensor_free(fa), x3_tensor_free(fb);
		/* a fourth chunk left open: the frame adds it as end_chunk would */
		x3_hess_add_rows(a, z, 40, N);
		x3_hess_add_rows(b, z, 40, N);
		fa = x3_hess_frame(a, X3_F32), fb = x3_hess_frame(b, X3_F32);
		CHECK(fa && fb && !memcmp(fa->data, fb->data, sizeof(float) * N * N),
		      "F64 %d: ... with a chunk still open (F32 frame)", f64);
		/* a frame added: the spilled total comes back to memory first */
		CHECK_OK(x3_hess_add_frame(a, fa), "add a frame");
		CHECK_OK(x3_hess_add_frame(b, fa), "add a frame (spilled)");
		x3_tensor_free(fb);
		fb = x3_hess_frame(b, X3_F64);
		x3_tensor *fa2 = x3_hess_frame(a, X3_F64);
		CHECK(fa2 && fb && !memcmp(fa2->data, fb->data, sizeof(double) * N * N) &&
		      x3_hess_count(a) == x3_hess_count(b), "F64 %d: ... and after a frame is added", f64);
		x3_tensor_free(fa), x3_tensor_free(fb), x3_tensor_free(fa2);
		x3_hess_free(a), x3_hess_free(b);
	}
	char cmd[64];
	snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", dir);
	CHECK(system(cmd) == 0, "no file left in the spill directory");
	rmdir(dir);
	x3_hess *bad;
	CHECK_OK(x3_hess_new("spilled", N, 0, NULL, -1, &bad), "new");
	CHECK_OK(x3_hess_spill(bad, "/nonexistent/x3"), "spill to a missing directory");
	x3_hess_add_rows(bad, z, 20, N);
	CHECK_OK(x3_hess_end_chunk(bad), "one chunk does not spill");
	rc = x3_hess_add_rows(bad, z, 20, N);
	CHECK(rc == X3_EIO && strstr(x3_errmsg(), "'spilled'") && strstr(x3_errmsg(), "/nonexistent/x3"),
	      "the second chunk cannot spill: an error naming the Hessian and the directory (%s)",
	      x3_errmsg());
	x3_hess_free(bad);

	x3_tensor_free(tw);
	x3_hess_free(w), x3_hess_free(m);
	free(z);
	TEST_DONE();
}
