/* libFuzzer target: an EXL3 model directory as exl3-matmul and model-eval
 * read it. The input is config.json, a NUL byte, then model.safetensors;
 * both are written into a directory. Every EXL3 linear found there is
 * built (x3_exl3_from_st), dequantized, and multiplied by the fast path
 * and the reference, which must agree; then the directory is opened as a
 * model (x3_model_open) and, when small, run forward over two tokens.
 * Every input must give results or an error, never a crash.
 *
 * Kept fast (issue 15 part 3): every linear is built, but the dequantize
 * and the two products (the cost of an input) run once per kind of linear
 * in an input, the kind being what selects the code they run (the
 * trellis's shape, which holds K, its dtype, and which of the codebook
 * markers, sign vectors and bias are there): a model's many linears of
 * one shape and width repeat the same paths on other numbers. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "exl3.h"
#include "model.h"
#include "safetensors.h"

static char dir[512], cfgp[560], stp[560];

static int put(const char *path, const uint8_t *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	size_t w = fwrite(p, 1, n, f);
	return fclose(f) || w != n ? -1 : 0;
}

/* what selects the code a linear runs: trellis shape and dtype, the parts
 * present and their dtypes */
struct kind { int64_t shape[X3_MAX_RANK]; int rank, dtype, parts, pdt[7]; };

static int seen(struct kind *k, int *nk, int max, const x3_st *st, const char *key, const x3_tensor *tr)
{
	static const char *const part[] = { ".mcg", ".mul1", ".suh", ".svh", ".su", ".sv", ".bias" };
	struct kind c;
	memset(&c, 0, sizeof c);
	c.rank = tr->rank, c.dtype = (int)tr->dtype;
	for (int j = 0; j < tr->rank; j++)
		c.shape[j] = tr->shape[j];
	for (size_t j = 0; j < sizeof part / sizeof *part; j++) {
		char n[600];
		snprintf(n, sizeof n, "%s%s", key, part[j]);
		const x3_tensor *pt = x3_st_find(st, n);
		if (pt)
			c.parts |= 1 << j, c.pdt[j] = (int)pt->dtype;
	}
	for (int j = 0; j < *nk; j++)
		if (!memcmp(&k[j], &c, sizeof c))
			return 1;
	if (*nk < max)
		k[(*nk)++] = c;
	return 0;
}

static void linears(x3_st *st)
{
	struct kind kinds[64];
	int nkinds = 0;
	for (int i = 0; i < x3_st_count(st); i++) {
		char key[512];
		const x3_tensor *t = x3_st_get(st, i);
		if (!x3_exl3_is_part(t->name, key, sizeof key) || strcmp(t->name + strlen(key), ".trellis"))
			continue;
		x3_exl3 *e;
		if (x3_exl3_from_st(st, key, &e))
			continue;
		int64_t in = x3_exl3_in(e), out = x3_exl3_out(e);
		if (in * out <= (1 << 20) && !seen(kinds, &nkinds, 64, st, key, t)) {
			float *w = malloc((size_t)(in * out) * sizeof *w);
			float *x = malloc((size_t)in * sizeof *x);
			float *y = malloc((size_t)out * sizeof *y), *yr = malloc((size_t)out * sizeof *yr);
			if (w && x && y && yr) {
				(void)x3_exl3_dequant(e, w);
				for (int64_t j = 0; j < in; j++)
					x[j] = (float)((j * 37 % 11) - 5) / 8;
				if (!x3_exl3_matmul(e, x, 1, in, y, 1) && !x3_exl3_matmul_ref(e, x, 1, in, yr)) {
					double mx = 0;
					for (int64_t j = 0; j < out; j++)
						mx = fmax(mx, fabs(yr[j]));
					for (int64_t j = 0; j < out && isfinite(mx) && mx < 1e30; j++)
						if (!(fabs(y[j] - yr[j]) <= 1e-3 * mx + 1e-6))
							abort();   /* fast path and reference disagree */
				}
			}
			free(w); free(x); free(y); free(yr);
		}
		x3_exl3_free(e);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!dir[0]) {
		const char *tmp = getenv("TMPDIR");   /* tests/fuzz/run: one per run */
		snprintf(dir, sizeof dir, "%s/x3fuzz-dir-%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
		snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
		snprintf(stp, sizeof stp, "%s/model.safetensors", dir);
		if (mkdir(dir, 0700) && errno != EEXIST)
			abort();
	}
	const uint8_t *nul = memchr(data, 0, size);
	if (!nul)
		return 0;
	/* a scratch file that cannot be written stops the run: every input
	 * would return here untested and still count as an execution */
	if (put(cfgp, data, (size_t)(nul - data)) || put(stp, nul + 1, size - (size_t)(nul - data) - 1)) {
		fprintf(stderr, "fuzz_exl3dir: cannot write the scratch files in %s\n", dir);
		abort();
	}
	x3_st *st;
	if (x3_st_open(dir, &st) == X3_OK) {
		linears(st);
		x3_st_close(st);
	}
	x3_model *m;
	if (x3_model_open(dir, NULL, &m) == X3_OK) {
		const x3_model_config *c = x3_model_cfg(m);
		if (c->hidden <= 512 && c->intermediate <= 2048 && c->vocab <= 4096 && c->n_layers <= 4) {
			int32_t tok[2] = {0, (int32_t)(c->vocab > 1 ? 1 : 0)};
			float *lg = malloc((size_t)c->vocab * sizeof *lg);
			struct x3_forward_opts fo;
			x3_forward_opts_init(&fo, m);
			fo.logits_mode = X3_LOGITS_LAST;
			fo.logits = lg;
			if (lg)
				(void)x3_model_forward(m, tok, 1, 2, &fo);
			free(lg);
		}
		x3_model_close(m);
	}
	return 0;
}
