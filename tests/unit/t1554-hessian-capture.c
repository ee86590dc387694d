/* t1554: bin/hessian-capture end to end on stories260K (token frames written
 * here, seeded): 21 frames, symmetric positive semidefinite, count = rows x
 * cols, members; --merge of two halves captured apart equals, byte for
 * byte, the whole captured in chunks of those halves' rows (F64; hessian.h:
 * H is the sum of the chunks' sums in chunk order), and merging one stream
 * is the identity; the F32 capture equals the F64 one to F32 rounding;
 * --activations exact. */
#include <math.h>
#include <unistd.h>
#include <lapacke.h>
#include "test.h"
#include "synth.h"
#include "frame.h"

static int write_tokens(const char *path, int rows, int cols, int r0, uint64_t seed)
{
	x3_tensor *t = x3_tensor_new2("tokens", X3_I32, rows, cols);
	x3_rng g;
	x3_rng_seed(&g, seed, 0);
	int32_t *v = t->data;
	/* rows are a function of their global index, so halves match the whole */
	for (int r = 0; r < rows; r++) {
		x3_rng_seed(&g, seed, (uint64_t)(r0 + r));
		for (int c = 0; c < cols; c++)
			v[r * cols + c] = c == 0 ? 1 : (int32_t)(3 + x3_rng_u64(&g) % 509);
	}
	int rc = test_write_frame(path, t);
	x3_tensor_free(t);
	return rc;
}

static double *as_f64(const x3_tensor *t)
{
	int64_t n = x3_tensor_numel(t);
	double *d = malloc(sizeof(double) * (size_t)n);
	for (int64_t i = 0; i < n; i++)
		d[i] = t->dtype == X3_F64 ? ((double *)t->data)[i] : ((float *)t->data)[i];
	return d;
}

/* two streams of the same frames, the same bytes: names, count, members,
 * dtype, shape and data */
static int stream_same(x3_tensor **a, int na, x3_tensor **b, int nb)
{
	int same = na == nb;
	for (int i = 0; same && i < na; i++)
		same = !strcmp(a[i]->name, b[i]->name) && !strcmp(x3_meta_get(a[i], "count"), x3_meta_get(b[i], "count")) &&
		       !strcmp(x3_meta_get(a[i], "members"), x3_meta_get(b[i], "members")) &&
		       a[i]->dtype == b[i]->dtype && a[i]->rank == b[i]->rank &&
		       !memcmp(a[i]->shape, b[i]->shape, sizeof(int64_t) * (size_t)a[i]->rank) &&
		       a[i]->nbytes == b[i]->nbytes && !memcmp(a[i]->data, b[i]->data, a[i]->nbytes);
	return same;
}

/* max |a-b| / max |a| over two streams of the same frames */
static double stream_diff(x3_tensor **a, int na, x3_tensor **b, int nb, int *meta_ok)
{
	double err = 0;
	*meta_ok = na == nb;
	for (int i = 0; i < na && i < nb; i++) {
		*meta_ok &= !strcmp(a[i]->name, b[i]->name) &&
		            !strcmp(x3_meta_get(a[i], "count"), x3_meta_get(b[i], "count")) &&
		            !strcmp(x3_meta_get(a[i], "members"), x3_meta_get(b[i], "members"));
		double *x = as_f64(a[i]), *y = as_f64(b[i]), mx = 0, d = 0;
		for (int64_t j = 0; j < x3_tensor_numel(a[i]); j++) {
			mx = fmax(mx, fabs(x[j]));
			d = fmax(d, fabs(x[j] - y[j]));
		}
		err = fmax(err, d / mx);
		free(x), free(y);
	}
	return err;
}

int main(void)
{
	char model[512];
	snprintf(model, sizeof model, "%s/models/stories260K", test_shared());
	if (access(model, R_OK)) {
		SKIP("stories260K not found under %s", test_shared());
		TEST_DONE();
	}
	if (access("bin/hessian-capture", X_OK)) {
		CHECK(0, "bin/hessian-capture is built");
		TEST_DONE();
	}
	if (test_tmpdir("t1554")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	enum { R = 4, C = 64 };
	CHECK_OK(write_tokens(test_path("all"), R, C, 0, 9), "tokens 4x64");
	CHECK_OK(write_tokens(test_path("a"), R / 2, C, 0, 9), "tokens rows 0-1");
	CHECK_OK(write_tokens(test_path("b"), R / 2, C, R / 2, 9), "tokens rows 2-3");
	const char *hc = "bin/hessian-capture -q";
	CHECK(test_run("%s --model %s --tokens %s > %s", hc, model, test_path("all"), test_path("h")) == 0, "capture 4x64");
	/* the halves below are two chunks of 2 rows: the whole in those chunks */
	CHECK(test_run("%s --model %s --tokens %s --f64 --chunk-rows %d -o %s", hc, model, test_path("all"), R / 2,
	               test_path("h64")) == 0, "capture 4x64 --f64 --chunk-rows 2 -o");
	CHECK(test_run("%s --model %s --tokens %s --f64 > %s", hc, model, test_path("a"), test_path("ha")) == 0 &&
	      test_run("%s --model %s --tokens %s --f64 --zstd > %s", hc, model, test_path("b"), test_path("hb")) == 0,
	      "capture the halves (F64, one zstd)");
	CHECK(test_run("%s --merge %s - < %s > %s", hc, test_path("ha"), test_path("hb"), test_path("m64")) == 0,
	      "merge a file and stdin");
	CHECK(test_run("%s --merge %s %s | %s --merge > %s", hc, test_path("ha"), test_path("hb"), hc, test_path("m32")) == 0,
	      "merge (F64 in, F64 out), merge again");

	x3_tensor **h = NULL, **h64 = NULL, **m64 = NULL, **ha = NULL;
	int nh = 0, n64 = 0, nm = 0, na = 0;
	CHECK_OK(x3_read_all(test_path("h"), &h, &nh), "read the capture");
	CHECK(nh == 21, "21 frames: 4 groups x 5 layers + head (got %d)", nh);
	int psd = 1, sym = 1, cnt = 1, names = 1;
	for (int i = 0; i < nh; i++) {
		x3_tensor *t = h[i];
		int64_t n = t->shape[0], count = 0;
		x3_meta_get_i64(t, "count", &count);
		cnt &= count == R * C && t->dtype == X3_F32 && t->rank == 2 && t->shape[1] == n;
		const float *v = t->data;
		double *d = as_f64(t), tr = 0;
		for (int64_t r = 0; r < n; r++) {
			tr += d[r * n + r];
			for (int64_t c = 0; c < n; c++)
				sym &= v[r * n + c] == v[c * n + r];
		}
		for (int64_t r = 0; r < n; r++)
			d[r * n + r] += 1e-6 * tr / (double)n;
		psd &= LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', (int)n, d, (int)n) == 0;
		free(d);
		int l = i / 4, g = i % 4;
		char want[128];
		static const char *gn[4] = { "self_attn.input", "self_attn.o_proj.input", "mlp.input",
		                             "mlp.down_proj.input" };
		if (i < 20)
			snprintf(want, sizeof want, "model.layers.%d.%s", l, gn[g]);
		else
			snprintf(want, sizeof want, "lm_head.input");
		names &= !strcmp(t->name, want) && x3_meta_get(t, "members") && x3_meta_get(t, "layer");
		if (i == 0)
			names &= !strcmp(x3_meta_get(t, "members"), "model.layers.0.self_attn.q_proj.weight,"
			                 "model.layers.0.self_attn.k_proj.weight,"
			                 "model.layers.0.self_attn.v_proj.weight");
		if (i == 20)
			names &= !strcmp(x3_meta_get(t, "layer"), "5") && x3_meta_get(t, "tied") &&
			         t->shape[0] == 64;
		if (i == 3)
			names &= t->shape[0] == 172;
	}
	CHECK(sym, "every H exactly symmetric");
	CHECK(psd, "every H + 1e-6 mean(diag) I has a Cholesky factor (PSD)");
	CHECK(cnt, "count = rows x cols = %d, F32 square", R * C);
	CHECK(names, "names, members, layer, tied head");

	CHECK_OK(x3_read_all(test_path("h64"), &h64, &n64), "read the F64 capture");
	CHECK_OK(x3_read_all(test_path("m64"), &m64, &nm), "read the merged halves");
	int mok = 0;
	double e = stream_diff(h64, n64, m64, nm, &mok);
	CHECK(mok && m64[0]->dtype == X3_F64, "merged: same frames, counts (%s), members, F64",
	      nm ? x3_meta_get(m64[0], "count") : "-");
	CHECK(stream_same(h64, n64, m64, nm), "merge of the halves == the whole in chunks of 2 rows, F64 byte for byte "
	      "(max rel diff %.2g)", e);
	e = stream_diff(h, nh, h64, n64, &mok);
	CHECK(mok && e < 1e-5, "F32 capture == F64 capture to F32 rounding (rel err %.2g)", e);
	x3_tensor **m2 = NULL;
	int n2 = 0;
	CHECK_OK(x3_read_all(test_path("m32"), &m2, &n2), "read the re-merged stream");
	CHECK(stream_same(m64, nm, m2, n2), "merging a single stream is the identity, byte for byte");
	x3_tensors_free(m2, n2);
	x3_tensors_free(m64, nm);
	CHECK_OK(x3_read_all(test_path("ha"), &ha, &na), "read half a");
	CHECK(na == 21 && !strcmp(x3_meta_get(ha[0], "count"), "128"), "half: count 128");

	/* --layers: only the asked-for layers, the head is layer 5 */
	CHECK(test_run("%s --model %s --tokens %s --layers 2-3 > %s", hc, model, test_path("all"), test_path("l")) == 0,
	      "capture --layers 2-3");
	CHECK_OK(x3_read_all(test_path("l"), &m64, &nm), "read it");
	e = stream_diff(h + 8, 8, m64, nm, &mok);
	CHECK(nm == 8 && mok && e == 0, "layers 2-3 == the same frames of the full capture");
	x3_tensors_free(m64, nm);

	/* --activations: X = arange 3x2 -> XᵀX = [[20,26],[26,35]] */
	x3_tensor *x = x3_tensor_new2("x", X3_F32, 3, 2);
	for (int i = 0; i < 6; i++)
		((float *)x->data)[i] = (float)i;
	x3_meta_set(x, "group", "g.input");
	FILE *f = fopen(test_path("act"), "wb");
	x3_writer *w;
	x3_writer_open_fd(fileno(f), 0, &w);
	x3_writer_put(w, x);
	x3_writer_put(w, x);
	x3_writer_close(w);
	fclose(f);
	x3_tensor_free(x);
	CHECK(test_run("%s --activations --members a.weight < %s > %s", hc, test_path("act"), test_path("ah")) == 0,
	      "--activations");
	CHECK_OK(x3_read_all(test_path("ah"), &m64, &nm), "read it");
	if (nm == 1) {
		const float *v = m64[0]->data;
		CHECK(!strcmp(m64[0]->name, "g.input") && v[0] == 40 && v[1] == 52 && v[2] == 52 &&
		      v[3] == 70 && !strcmp(x3_meta_get(m64[0], "count"), "6") &&
		      !strcmp(x3_meta_get(m64[0], "members"), "a.weight"),
		      "two 3x2 frames of arange: H = 2 [[20,26],[26,35]], count 6, name from 'group'");
	} else {
		CHECK(0, "one frame from --activations (got %d)", nm);
	}
	x3_tensors_free(m64, nm);

	x3_tensors_free(h, nh);
	x3_tensors_free(h64, n64);
	x3_tensors_free(ha, na);
	test_tmpdir_remove();
	TEST_DONE();
}
