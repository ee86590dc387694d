/* t1569: x3_linear_on_use (the capture's memory, issue 12 part 3): a dense
 * linear that converts its weight for each product gives the same bits as
 * one that keeps its F32 copy, for a BF16 weight with a bias, a row slice
 * of a fused 2-D tensor and an expert of a fused 3-D tensor; repeated
 * products (each reading the dropped pages again from the file) too; the
 * products match a plain double reference. */
#include <math.h>
#include "test.h"
#include "linear.h"
#include "safetensors.h"
#include "synth.h"

enum { IN = 200, OUT = 300, ROWS = 70, E = 3 };

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
                        int64_t src_rows, int bias, const float *x)
{
	x3_linear *a, *b;
	float *ya = malloc(sizeof(float) * ROWS * OUT), *yb = malloc(sizeof(float) * ROWS * OUT);
	CHECK_OK(x3_linear_open_rows(st, key, src, row0, src_rows, IN, OUT, bias, 0, &a), "%s: open", what);
	CHECK_OK(x3_linear_open_rows(st, key, src, row0, src_rows, IN, OUT, bias, 0, &b), "%s: open again", what);
	CHECK_OK(x3_linear_apply(a, x, ROWS, 0, ya), "%s: apply with the F32 copy", what);
	CHECK_OK(x3_linear_on_use(b), "%s: on use", what);
	int same = 1;
	for (int k = 0; k < 2; k++) {
		memset(yb, 0, sizeof(float) * ROWS * OUT);
		CHECK_OK(x3_linear_apply(b, x, ROWS, 0, yb), "%s: apply on use (%d)", what, k + 1);
		same &= !memcmp(ya, yb, sizeof(float) * ROWS * OUT);
	}
	CHECK(same, "%s: on use == with the F32 copy, bit for bit, twice", what);
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
		for (int o = 0; o < OUT; o++) {
			double s = bf ? bf[o] : 0;
			for (int i = 0; i < IN; i++)
				s += (double)x[r * IN + i] * wf[(row0 + o) * IN + i];
			err = fmax(err, fabs(s - yb[r * OUT + o]));
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
	x3_tensor *t[4] = { tensor_bf16("a.weight", 2, s2, &g), tensor_bf16("a.bias", 1, sb, &g),
	                    tensor_bf16("f.weight", 2, sf, &g), tensor_bf16("x.experts", 3, s3, &g) };
	for (int i = 0; i < 4; i++) {
		CHECK_OK(x3_stw_add(sw, t[i]), "add %s", t[i]->name);
		x3_tensor_free(t[i]);
	}
	CHECK_OK(x3_stw_commit(sw), "commit");
	x3_st *st;
	CHECK_OK(x3_st_open(test_path("m.safetensors"), &st), "open the checkpoint");
	float *x = test_randn(&g, ROWS * IN, 1.0);
	same_on_use(st, "BF16 weight and bias", "a", NULL, 0, OUT, 1, x);
	same_on_use(st, "rows 300..600 of a fused 2-D tensor", "f1", "f", OUT, 3 * OUT, 0, x);
	same_on_use(st, "expert 2 of a fused 3-D tensor", "x2", "x.experts", 2 * OUT, E * OUT, 0, x);
	free(x);
	x3_st_close(st);
	CHECK(test_tmpdir_remove() == 0, "scratch removed");
	TEST_DONE();
}
