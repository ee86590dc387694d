/* t1569: x3_linear_on_use (the capture's memory, issue 12 part 3): a dense
 * linear that converts its weight for each product gives the same bits as
 * one that keeps its F32 copy, for a BF16 weight with a bias, a row slice
 * of a fused 2-D tensor and an expert of a fused 3-D tensor; repeated
 * products (each reading the dropped pages again from the file) too; the
 * products match a plain double reference. Each with a buffer per call
 * (NULL) and with one x3_wbuf that the linears share (given back after
 * each product, grown to the largest, and passed over while taken), and a
 * weight of more than 2^20 elements (converted in blocks over threads). */
#include <math.h>
#include "test.h"
#include "linear.h"
#include "safetensors.h"
#include "synth.h"

enum { IN = 200, OUT = 300, ROWS = 70, E = 3, BIG = 5300 };

static x3_tensor *tensor_bf16(const char *name, int rank, const int64_t *shape, x3_rng *g)
{
	x3_tensor *t = x3_tensor_new(name, X3_BF16, rank, shape, 1);
	size_t n = t->nbytes / 2;
	float *v = test_randn(g, (int64_t)n, 0.1);
	x3_convert(t->data, X3_BF16, v, X3_F32, n);
	free(v);
	return t;
}

/* y of lin on x, first with its F32 copy, then on use (twice): equal */
static void same_on_use(x3_st *st, const char *what, const char *key, const char *src, int64_t row0,
                        int64_t src_rows, int64_t out, int bias, const float *x, x3_wbuf *wb)
{
	x3_linear *a, *b;
	float *ya = malloc(sizeof(float) * ROWS * out), *yb = malloc(sizeof(float) * ROWS * out);
	CHECK_OK(x3_linear_open_rows(st, key, src, row0, src_rows, IN, out, bias, 0, &a), "%s: open", what);
	CHECK_OK(x3_linear_open_rows(st, key, src, row0, src_rows, IN, out, bias, 0, &b), "%s: open again", what);
	CHECK_OK(x3_linear_apply(a, x, ROWS, 0, ya), "%s: apply with the F32 copy", what);
	CHECK_OK(x3_linear_on_use(b, wb), "%s: on use", what);
	int same = 1, back = 1;
	for (int k = 0; k < 2; k++) {
		memset(yb, 0, sizeof(float) * ROWS * out);
		CHECK_OK(x3_linear_apply(b, x, ROWS, 0, yb), "%s: apply on use (%d)", what, k + 1);
		same &= !memcmp(ya, yb, sizeof(float) * ROWS * out);
		back &= !wb || (!wb->busy && wb->cap >= (size_t)(out * IN));
	}
	CHECK(same, "%s: on use == with the F32 copy, bit for bit, twice (%s)", what,
	      wb ? "shared buffer" : "a buffer per call");
	if (wb)
		CHECK(back, "%s: the shared buffer given back after each product, big enough", what);
	/* the reference: the BF16 rows in double */
	const x3_tensor *w = x3_st_find(st, src ? src : key), *bt = NULL;
	char wn[128], bn[128];
	if (!w) {
		snprintf(wn, sizeof wn, "%s.weight", src ? src : key);
		w = x3_st_find(st, wn);
	}
	snprintf(bn, sizeof bn, "%s.bias", key);
	if (bias)
		bt = x3_st_find(st, bn);
	float *wf = x3_tensor_f32(w), *bf = bt ? x3_tensor_f32(bt) : NULL;
	double err = 0, mx = 0;
	for (int r = 0; r < ROWS; r++)
		for (int o = 0; o < out; o++) {
			double s = bf ? bf[o] : 0;
			for (int i = 0; i < IN; i++)
				s += (double)x[r * IN + i] * wf[(row0 + o) * IN + i];
			err = fmax(err, fabs(s - yb[r * out + o]));
			mx = fmax(mx, fabs(s));
		}
	CHECK(err <= 1e-5 * mx, "%s: == the double reference (%.2g of %.2g)", what, err, mx);
	free(wf), free(bf), free(ya), free(yb);
	x3_linear_free(a), x3_linear_free(b);
}

int main(void)
{
	CHECK_OK(test_tmpdir("t1569"), "scratch");
	x3_rng g;
	x3_rng_seed(&g, 1569, 0);
	x3_stw *sw;
	CHECK_OK(x3_stw_create(test_path("m.safetensors"), 0, &sw), "writer");
	int64_t s2[2] = { OUT, IN }, sb[1] = { OUT }, sf[2] = { 3 * OUT, IN }, s3[3] = { E, OUT, IN };
	int64_t sbig[2] = { BIG, IN };
	x3_tensor *t[5] = { tensor_bf16("a.weight", 2, s2, &g), tensor_bf16("a.bias", 1, sb, &g),
	                    tensor_bf16("f.weight", 2, sf, &g), tensor_bf16("x.experts", 3, s3, &g),
	                    tensor_bf16("big.weight", 2, sbig, &g) };
	for (int i = 0; i < 5; i++) {
		CHECK_OK(x3_stw_add(sw, t[i]), "add %s", t[i]->name);
		x3_tensor_free(t[i]);
	}
	CHECK_OK(x3_stw_commit(sw), "commit");
	x3_st *st;
	CHECK_OK(x3_st_open(test_path("m.safetensors"), &st), "open the checkpoint");
	float *x = test_randn(&g, ROWS * IN, 1.0);
	x3_wbuf wb = { 0 };
	for (int shared = 0; shared < 2; shared++) {
		x3_wbuf *b = shared ? &wb : NULL;
		same_on_use(st, "BF16 weight and bias", "a", NULL, 0, OUT, OUT, 1, x, b);
		same_on_use(st, "rows 300..600 of a fused 2-D tensor", "f1", "f", OUT, 3 * OUT, OUT, 0, x, b);
		same_on_use(st, "expert 2 of a fused 3-D tensor", "x2", "x.experts", 2 * OUT, E * OUT, OUT, 0, x, b);
		same_on_use(st, "a weight of 5300x200 (blocks of 2^20)", "big", NULL, 0, BIG, BIG, 0, x, b);
	}
	CHECK(wb.cap == (size_t)BIG * IN, "the shared buffer grew to the largest weight (%zu floats)",
	      wb.cap);
	/* taken (a product under way elsewhere): a use allocates its own */
	wb.busy = 1;
	float *keep = wb.p;
	{
		x3_linear *l;
		float *y = malloc(sizeof(float) * ROWS * OUT), *y0 = malloc(sizeof(float) * ROWS * OUT);
		CHECK_OK(x3_linear_open_rows(st, "a", NULL, 0, OUT, IN, OUT, 1, 0, &l), "open a");
		CHECK_OK(x3_linear_apply(l, x, ROWS, 0, y0), "a with its F32 copy");
		CHECK_OK(x3_linear_on_use(l, &wb), "a on use with the taken buffer");
		CHECK_OK(x3_linear_apply(l, x, ROWS, 0, y), "a on use, buffer taken");
		CHECK(!memcmp(y, y0, sizeof(float) * ROWS * OUT) && wb.busy && wb.p == keep,
		      "a taken buffer is left alone (still taken, the same memory) and the product is the same");
		x3_linear_free(l);
		free(y), free(y0);
	}
	wb.busy = 0;
	x3_wbuf_free(&wb);
	CHECK(!wb.p && !wb.cap, "x3_wbuf_free empties the buffer");
	x3_wbuf_free(NULL);
	free(x);
	x3_st_close(st);
	CHECK(test_tmpdir_remove() == 0, "scratch removed");
	TEST_DONE();
}
