/* tests/helpers/rtn.c: the round-to-nearest baseline of the conversion
 * tests (t1800): quantize every 2-D weight frame on stdin per output channel
 * (row of the HF (out, in) weight) to L = floor(2^B) integer levels with an
 * absmax scale, no rotation, and write the dequantized weights as F32
 * frames. Built by the test with the project's flags; not installed.
 *
 *   rtn B [NAME] < frames > frames     (NAME renames a single frame)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "frame.h"

static void fail(const char *what)
{
	fprintf(stderr, "rtn: %s: %s\n", what, x3_errmsg());
	exit(1);
}

int main(int argc, char **argv)
{
	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: rtn B [NAME] < frames > frames\n");
		return 2;
	}
	double B = atof(argv[1]);
	if (!(B >= 1 && B <= 16)) {
		fprintf(stderr, "rtn: B must be 1..16\n");
		return 2;
	}
	long L = (long)floor(pow(2.0, B) + 1e-9);
	/* levels qmin..qmax, L of them, symmetric when L is odd */
	long qmin = -(L / 2), qmax = L - 1 - L / 2;
	if (qmax < 1)
		qmax = 1, qmin = -1;
	x3_reader *r;
	x3_writer *w;
	if (x3_reader_open_fd(STDIN_FILENO, "stdin", 0, &r))
		fail("stdin");
	if (x3_writer_open_fd(STDOUT_FILENO, 0, &w))
		fail("stdout");
	x3_tensor *t;
	int rc;
	while ((rc = x3_reader_next(r, &t)) == X3_OK) {
		if (t->rank != 2) {
			fprintf(stderr, "rtn: frame '%s' is not 2-D\n", t->name);
			return 1;
		}
		float *x = x3_tensor_f32(t);
		if (!x)
			fail(t->name);
		int64_t rows = t->shape[0], cols = t->shape[1];
		for (int64_t i = 0; i < rows; i++) {
			float *row = x + i * cols;
			double amax = 0;
			for (int64_t j = 0; j < cols; j++)
				amax = fmax(amax, fabs(row[j]));
			double s = amax > 0 ? amax / (double)qmax : 1;
			/* the scale is stored in fp16, as a real format would */
			s = (double)x3_f16_to_f32(x3_f32_to_f16((float)s));
			for (int64_t j = 0; j < cols; j++) {
				double q = nearbyint(row[j] / s);
				q = q < qmin ? qmin : q > qmax ? qmax : q;
				row[j] = (float)(q * s);
			}
		}
		x3_tensor *o = x3_tensor_new2(argc == 3 ? argv[2] : t->name, X3_F32, rows, cols);
		if (!o)
			fail(t->name);
		memcpy(o->data, x, (size_t)(rows * cols) * sizeof *x);
		if (x3_writer_put(w, o))
			fail("stdout");
		x3_tensor_free(o);
		x3_tensor_free(t);
		free(x);
	}
	if (rc != X3_EOF)
		fail("stdin");
	if (x3_writer_close(w))
		fail("stdout");
	return 0;
}
