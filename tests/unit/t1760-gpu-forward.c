/* t1760-gpu-forward: the device paths behind --device of hessian-capture,
 * model-eval and had-rotate, against their CPU references:
 *   the backend's dense_* (cuBLAS SGEMM + bias) vs a float64 product,
 *   x3_hess_set_device (device SSYRK) vs the CPU accumulator,
 *   x3_quant_set_device (Hadamards, block LDL) vs the CPU finalize and
 *   regularize, and the stories260K forward on cuda vs cpu.
 * Everywhere: argument checks and clean X3_EUNSUP without a device (the
 * backend's own where its object loads). With a
 * device (or an emulator that makes x3_gpu_available() true), the numeric
 * comparisons, each with an error budget of F32 rounding. */
#include <math.h>
#include "gpu-test.h"
#include "hessian.h"
#include "model.h"
#include "quant.h"

static void fill(x3_rng *r, float *x, int64_t n, double scale)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)(scale * x3_rng_normal(r));
}

/* max |a - b| / max(|b|) over n values */
static double rel_maxdiff(const float *a, const float *b, int64_t n)
{
	double d = 0, m = 0;
	for (int64_t i = 0; i < n; i++) {
		d = fmax(d, fabs((double)a[i] - b[i]));
		m = fmax(m, fabs((double)b[i]));
	}
	return m > 0 ? d / m : d;
}

/* y = x W^T + b against float64, each output within 1e-5 of sum |x w| + |b| */
static void dense_case(x3_rng *r, int64_t rows, int64_t in, int64_t out, int bias)
{
	float *w = malloc((size_t)(in * out) * sizeof *w), *b = malloc((size_t)out * sizeof *b);
	float *x = malloc((size_t)(rows * in) * sizeof *x), *y = malloc((size_t)(rows * out) * sizeof *y);
	fill(r, w, in * out, 0.05);
	fill(r, b, out, 1.0);
	fill(r, x, rows * in, 1.0);
	x3_gpu_dense *d;
	CHECK_OK(G->dense_create(w, bias ? b : NULL, in, out, &d), "dense %lldx%lld%s: create",
	         (long long)out, (long long)in, bias ? " + bias" : "");
	if (!d)
		goto done;
	CHECK(G->dense_bytes(d) >= (size_t)(in * out) * sizeof(float), "bytes held");
	CHECK_OK(G->dense_forward(d, x, rows, y), "forward of %lld rows", (long long)rows);
	int64_t bad = 0;
	for (int64_t i = 0; i < rows; i++)
		for (int64_t o = 0; o < out; o++) {
			double s = bias ? b[o] : 0, a = bias ? fabs(b[o]) : 0;
			for (int64_t k = 0; k < in; k++) {
				s += (double)x[i * in + k] * w[o * in + k];
				a += fabs((double)x[i * in + k] * w[o * in + k]);
			}
			bad += !(fabs(y[i * out + o] - s) <= 1e-5 * a + 1e-30);
		}
	CHECK(bad == 0, "%lld rows: every output within F32 rounding of float64 (%lld off)",
	      (long long)rows, (long long)bad);
	/* device pointers: the same numbers */
	float *x_d = NULL, *y_d = NULL, *y2 = malloc((size_t)(rows * out) * sizeof *y2);
	int rc = G->alloc((void **)&x_d, (size_t)(rows * in) * sizeof(float));
	if (!rc)
		rc = G->alloc((void **)&y_d, (size_t)(rows * out) * sizeof(float));
	if (!rc)
		rc = G->upload(x_d, x, (size_t)(rows * in) * sizeof(float));
	if (!rc)
		rc = G->dense_forward_d(d, x_d, rows, y_d);
	if (!rc)
		rc = G->download(y2, y_d, (size_t)(rows * out) * sizeof(float));
	CHECK(rc == X3_OK && !memcmp(y, y2, (size_t)(rows * out) * sizeof *y),
	      "forward_d gives the host path's bytes");
	G->free(x_d), G->free(y_d);
	free(y2);
	G->dense_free(d);
done:
	free(w), free(b), free(x), free(y);
}

static void hessian_case(x3_rng *r)
{
	enum { N = 96, ROWS = 300 };
	float *x = malloc(sizeof(float) * N * ROWS);
	fill(r, x, N * ROWS, 1.0);
	x[17 * N + 5] = NAN;   /* one row dropped on both */
	x3_hess *hc, *hg;
	CHECK_OK(x3_hess_new("h", N, 0, "a.weight", 3, &hc), "cpu accumulator");
	CHECK_OK(x3_hess_new("h", N, 0, "a.weight", 3, &hg), "second accumulator");
	CHECK_OK(x3_hess_set_device(hg, X3_DEVICE_CUDA), "accumulate on cuda");
	CHECK_OK(x3_hess_add_rows(hc, x, 100, N), "cpu rows 0..99");
	CHECK_OK(x3_hess_add_rows(hc, x + 100 * N, ROWS - 100, N), "cpu rows 100..");
	CHECK_OK(x3_hess_add_rows(hg, x, 100, N), "cuda rows 0..99");
	CHECK_OK(x3_hess_add_rows(hg, x + 100 * N, ROWS - 100, N), "cuda rows 100..");
	CHECK(x3_hess_set_device(hg, X3_DEVICE_CPU) == X3_EINVAL, "no way back to the cpu");
	x3_tensor *tc = x3_hess_frame(hc, X3_F32), *tg = x3_hess_frame(hg, X3_F32);
	CHECK(tc && tg, "frames");
	if (tc && tg) {
		double e = rel_maxdiff(tg->data, tc->data, N * N);
		CHECK(e < 1e-5, "H on cuda = H on cpu up to F32 rounding (rel %.2e)", e);
		CHECK(!strcmp(x3_meta_get(tg, "count"), "299") && !strcmp(x3_meta_get(tg, "dropped"), "1"),
		      "count 299, dropped 1 (%s, %s)", x3_meta_get(tg, "count"), x3_meta_get(tg, "dropped"));
		const float *g = tg->data;
		int sym = 1;
		for (int i = 0; i < N; i++)
			for (int j = 0; j < N; j++)
				sym &= g[i * N + j] == g[j * N + i];
		CHECK(sym, "symmetric");
		/* a frame merged on the host adds to the device's sum */
		CHECK_OK(x3_hess_add_frame(hg, tc), "merge the cpu frame into the cuda accumulator");
		x3_tensor *t2 = x3_hess_frame(hg, X3_F32);
		float *h2 = malloc(sizeof(float) * N * N);
		for (int i = 0; i < N * N; i++)
			h2[i] = 2 * ((float *)tc->data)[i];
		double e2 = t2 ? rel_maxdiff(t2->data, h2, N * N) : 1;
		CHECK(e2 < 1e-5, "merged = 2 H (rel %.2e)", e2);
		free(h2);
		x3_tensor_free(t2);
		/* in two chunks: the device's sum of each joins the host's total */
		x3_hess *hk;
		CHECK_OK(x3_hess_new("h", N, 0, "a.weight", 3, &hk), "third accumulator");
		CHECK_OK(x3_hess_set_device(hk, X3_DEVICE_CUDA), "on cuda");
		CHECK_OK(x3_hess_add_rows(hk, x, 100, N), "chunk 0: rows 0..99");
		CHECK_OK(x3_hess_end_chunk(hk), "end chunk 0 (the device sum fetched, a new one)");
		CHECK_OK(x3_hess_add_rows(hk, x + 100 * N, ROWS - 100, N), "chunk 1: rows 100..");
		x3_tensor *t3 = x3_hess_frame(hk, X3_F32);
		double e3 = t3 ? rel_maxdiff(t3->data, tc->data, N * N) : 1;
		CHECK(e3 < 1e-5 && !strcmp(x3_meta_get(t3, "count"), "299"),
		      "two chunks on cuda = H on cpu up to F32 rounding (rel %.2e), count 299", e3);
		x3_tensor_free(t3);
		x3_hess_free(hk);
	}
	x3_tensor_free(tc), x3_tensor_free(tg);
	x3_hess_free(hc), x3_hess_free(hg);
	free(x);
}

static void quant_case(x3_rng *r)
{
	enum { K0 = 200, N0 = 150, ROWS = 600 };
	const int64_t k = x3_pad128(K0), n = x3_pad128(N0);
	float *x = malloc(sizeof(float) * K0 * ROWS), *H = calloc(K0 * K0, sizeof(float));
	float *W = malloc(sizeof(float) * N0 * K0), *s = malloc(sizeof(float) * k);
	float *sv = malloc(sizeof(float) * n);
	fill(r, x, K0 * ROWS, 1.0);
	fill(r, W, N0 * K0, 0.02);
	for (int i = 0; i < K0; i++)
		for (int j = 0; j < K0; j++) {
			double a = 0;
			for (int t = 0; t < ROWS; t++)
				a += (double)x[t * K0 + i] * x[t * K0 + j];
			H[i * K0 + j] = (float)a;
		}
	x3_quant_signs(7, "t/su", k, s);
	x3_quant_signs(7, "t/sv", n, sv);
	x3_qhess *hc = NULL, *hg = NULL;
	x3_qweight *wc = NULL, *wg = NULL;
	CHECK_OK(x3_quant_set_device(X3_DEVICE_CPU), "quantizer on the cpu");
	CHECK_OK(x3_qhess_finalize(H, K0, k, ROWS, s, &hc), "cpu finalize");
	CHECK_OK(x3_regularize(W, N0, K0, hc, sv, X3_OUT_SCALES_ALWAYS, &wc), "cpu regularize");
	CHECK_OK(x3_quant_set_device(X3_DEVICE_CUDA), "quantizer on cuda");
	CHECK_OK(x3_qhess_finalize(H, K0, k, ROWS, s, &hg), "cuda finalize");
	CHECK_OK(x3_regularize(W, N0, K0, hg, sv, X3_OUT_SCALES_ALWAYS, &wg), "cuda regularize");
	x3_quant_set_device(X3_DEVICE_CPU);
	if (hc && hg && wc && wg) {
		CHECK(!hc->fallback && !hg->fallback && hc->retries == hg->retries,
		      "no fallback, same damping retries (%d, %d)", hc->retries, hg->retries);
		double eh = rel_maxdiff(hg->H, hc->H, k * k), el = rel_maxdiff(hg->L, hc->L, k * k);
		CHECK(eh < 1e-5, "rotated H equal up to rounding (rel %.2e)", eh);
		CHECK(el < 1e-3, "LDL factor equal up to rounding (rel %.2e)", el);
		double ew = rel_maxdiff(wg->W, wc->W, k * n), eu = rel_maxdiff(wg->su, wc->su, k);
		double ev = rel_maxdiff(wg->sv, wc->sv, n);
		CHECK(ew < 1e-5 && eu < 1e-5 && ev < 1e-6,
		      "W_reg, su, sv equal up to rounding (rel %.2e %.2e %.2e)", ew, eu, ev);
	}
	x3_qhess_free(hc), x3_qhess_free(hg);
	x3_qweight_free(wc), x3_qweight_free(wg);
	free(x), free(H), free(W), free(s), free(sv);
}

/* stories260K: logits of the whole forward, cuda vs cpu */
static void model_case(int avail)
{
	char dir[512];
	snprintf(dir, sizeof dir, "%s/models/stories260K", test_shared());
	x3_model *m = NULL;
	if (x3_model_open(dir, NULL, &m)) {
		SKIP("stories260K not found under %s", test_shared());
		return;
	}
	enum { R = 3, C = 40, V = 512 };
	int32_t ids[R * C];
	x3_rng r;
	x3_rng_seed(&r, 5, 0);
	for (int i = 0; i < R * C; i++)
		ids[i] = (int32_t)(x3_rng_u64(&r) % V);
	float *lc = malloc(sizeof(float) * R * C * V), *lg = malloc(sizeof(float) * R * C * V);
	struct x3_forward_opts o;
	x3_forward_opts_init(&o, m);
	CHECK(o.device == X3_DEVICE_CPU, "forward on the cpu by default");
	o.logits_mode = X3_LOGITS_ALL;
	o.logits = lc;
	o.chunk_tokens = 64;   /* several chunks per layer */
	CHECK_OK(x3_model_forward(m, ids, R, C, &o), "forward on cpu");
	o.logits = lg;
	o.device = X3_DEVICE_CUDA;
	int rc = x3_model_forward(m, ids, R, C, &o);
	if (!avail) {
		CHECK(rc == X3_EUNSUP && strstr(x3_errmsg(), "layer 0"),
		      "forward on cuda without a device: X3_EUNSUP naming the layer (%s)", x3_errmsg());
	} else {
		CHECK(rc == X3_OK, "forward on cuda (%s)", rc ? x3_errmsg() : "ok");
		double e = rel_maxdiff(lg, lc, R * C * V);
		CHECK(!rc && e < 1e-4, "logits on cuda = cpu up to F32 rounding (rel %.2e)", e);
	}
	free(lc), free(lg);
	x3_model_close(m);
}

int main(void)
{
	gpu_test_backend_env();
	const int loaded = x3_gpu_load(&G) == X3_OK;
	printf("# backend object: %s\n", loaded ? x3_gpu_path() : x3_errmsg());
	const int avail = x3_gpu_available();
	printf("# x3_gpu_available() = %d%s%s\n", avail, avail ? "" : ": ", avail ? "" : x3_errmsg());
	x3_rng r;
	x3_rng_seed(&r, 1760, 0);

	/* everywhere: argument checks */
	x3_gpu_dense *d = (x3_gpu_dense *)1;
	float w[4] = { 1, 2, 3, 4 };
	if (loaded) {
		CHECK(G->dense_create(NULL, NULL, 2, 2, &d) == X3_EINVAL && d == NULL,
		      "dense: NULL weight refused");
		CHECK(G->dense_create(w, NULL, 0, 2, &d) == X3_EINVAL, "dense: empty shape refused");
		CHECK(G->dense_forward(NULL, w, 1, w) == X3_EINVAL,
		      "dense forward: NULL linear refused");
		G->dense_free(NULL);
	} else {
		SKIP("the backend's argument checks: no backend object");
	}
	x3_hess *h;
	CHECK_OK(x3_hess_new("f64", 8, 1, NULL, -1, &h), "f64 accumulator");
	CHECK(x3_hess_set_device(h, X3_DEVICE_CUDA) == X3_EINVAL && strstr(x3_errmsg(), "F64"),
	      "f64 sums stay on the cpu (%s)", x3_errmsg());
	CHECK(x3_hess_set_device(h, X3_DEVICE_AUTO) == X3_EINVAL, "auto must be resolved first");
	CHECK_OK(x3_hess_set_device(h, X3_DEVICE_CPU), "cpu is fine");
	x3_hess_free(h);
	CHECK(x3_quant_set_device(X3_DEVICE_AUTO) == X3_EINVAL, "quantizer: auto must be resolved");
	if (!avail) {
		if (loaded) {
			int rc = G->dense_create(w, NULL, 2, 2, &d);
			CHECK(rc == X3_EUNSUP && d == NULL, "dense without a device: X3_EUNSUP");
		}
		CHECK_OK(x3_hess_new("h", 8, 0, NULL, -1, &h), "f32 accumulator");
		CHECK(x3_hess_set_device(h, X3_DEVICE_CUDA) == X3_EUNSUP && strstr(x3_errmsg(), "'h'"),
		      "hessian on cuda without a device: X3_EUNSUP naming it (%s)", x3_errmsg());
		x3_hess_free(h);
		CHECK(x3_quant_set_device(X3_DEVICE_CUDA) == X3_EUNSUP,
		      "quantizer on cuda without a device: X3_EUNSUP");
		model_case(0);
		SKIP("numeric comparisons with the cpu: no CUDA device");
		TEST_DONE();
	}
	dense_case(&r, 1, 64, 64, 0);
	dense_case(&r, 37, 200, 300, 1);
	dense_case(&r, 1000, 172, 64, 1);
	hessian_case(&r);
	quant_case(&r);
	model_case(1);
	TEST_DONE();
}
