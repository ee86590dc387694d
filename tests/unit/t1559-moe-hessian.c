/* t1559-moe-hessian: bin/hessian-capture's expert Hessians on a seeded tiny
 * Qwen3-MoE (examples/make-tiny-llama --arch qwen3-moe, 1 layer, 8 experts
 * 48 wide, top 2; 4 experts at top 1 for a starved one). The routing and the
 * rows are found here independently: a per-token loop over the router
 * (double logits, softmax, top k, renormalized) on the block's input, and
 * each expert's activations by plain loops over its dense weights. Checked:
 *   - routed (default): H of expert e = XᵀX of exactly the rows routed to e
 *     (gate/up: the block input; down_proj: silu(gate x) * up x), count and
 *     routed_tokens = those rows, expert_fallback=0;
 *   - --min-tokens m: an expert below m is H_routed + (m - n)/T H_all
 *     (T: all tokens, the first chunk holding them all), count m,
 *     expert_fallback=1, fallback_tokens=m-n, named on stderr and in --report;
 *     an expert no token reaches (every token the same id: one expert
 *     gets them all) gets the all-token Hessian;
 *   - --moe-capture all: the all-token Hessian, count T; weighted: Σ w² xᵀx,
 *     blended below m with the all-token Hessian at the expert's mean w². */
#include <math.h>
#include <unistd.h>
#include "test.h"
#include "synth.h"
#include "frame.h"
#include "model.h"
#include "safetensors.h"

enum { R = 2, C = 24, T = R * C, EMAX = 8 };
static int64_t Hd, Id;      /* hidden, expert width */
static float *X;            /* (T, Hd): the block's input, from the forward */
static int64_t xn;

/* the forward's hook: the block's input is the rows of expert 0's
 * all-token gate/up event (x3_capture.all_tokens 2) */
static int grab(void *ctx, const struct x3_capture *c)
{
	(void)ctx;
	if (c->all_tokens == 2 && c->expert == 0) {
		memcpy(X + xn * c->in, c->x, (size_t)(c->ntok * c->in) * sizeof *X);
		xn += c->ntok;
	}
	return X3_OK;
}

static double silu(double a) { return a / (1.0 + exp(-a)); }

struct ref {
	int E, K;
	int n[EMAX];                   /* routed tokens */
	double w2[EMAX];               /* Σ w² over them */
	double *hin[EMAX], *hdn[EMAX];  /* routed XᵀX: gate/up, down */
	double *win[EMAX], *wdn[EMAX];  /* Σ w² xᵀx */
	double *ain, *adn[EMAX];        /* all tokens */
};

static void syr(double *h, const double *x, int64_t n, double w)
{
	for (int64_t a = 0; a < n; a++)
		for (int64_t b = 0; b < n; b++)
			h[a * n + b] += w * x[a] * x[b];
}

/* the per-token reference of a model dir */
static int reference(const char *dir, int E, int K, struct ref *r)
{
	char path[600];
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	x3_st *st;
	if (x3_st_open(path, &st))
		return 1;
	float *router, *g[EMAX], *u[EMAX], *d[EMAX];
	char name[256];
	router = x3_tensor_f32(x3_st_find(st, "model.layers.0.mlp.gate.weight"));
	for (int e = 0; e < E; e++) {
		snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.gate_proj.weight", e);
		g[e] = x3_tensor_f32(x3_st_find(st, name));
		snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.up_proj.weight", e);
		u[e] = x3_tensor_f32(x3_st_find(st, name));
		snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.down_proj.weight", e);
		d[e] = x3_tensor_f32(x3_st_find(st, name));
	}
	memset(r, 0, sizeof *r);
	r->E = E, r->K = K;
	r->ain = calloc((size_t)(Hd * Hd), sizeof(double));
	for (int e = 0; e < E; e++) {
		r->hin[e] = calloc((size_t)(Hd * Hd), sizeof(double));
		r->win[e] = calloc((size_t)(Hd * Hd), sizeof(double));
		r->hdn[e] = calloc((size_t)(Id * Id), sizeof(double));
		r->wdn[e] = calloc((size_t)(Id * Id), sizeof(double));
		r->adn[e] = calloc((size_t)(Id * Id), sizeof(double));
	}
	double *x = malloc((size_t)Hd * sizeof *x), *act = malloc((size_t)Id * sizeof *act);
	for (int64_t t = 0; t < T; t++) {
		double l[EMAX], pr[EMAX], mx = -INFINITY, s = 0;
		for (int64_t i = 0; i < Hd; i++)
			x[i] = X[t * Hd + i];
		for (int e = 0; e < E; e++) {
			l[e] = 0;
			for (int64_t i = 0; i < Hd; i++)
				l[e] += (double)router[e * Hd + i] * x[i];
			mx = fmax(mx, l[e]);
		}
		for (int e = 0; e < E; e++)
			s += pr[e] = exp(l[e] - mx);
		int sel[EMAX] = { 0 }, top[EMAX];
		double ws = 0;
		for (int k = 0; k < K; k++) {
			int b = -1;
			for (int e = 0; e < E; e++)
				if (!sel[e] && (b < 0 || l[e] > l[b]))
					b = e;
			sel[b] = 1, top[k] = b, ws += pr[b] / s;
		}
		syr(r->ain, x, Hd, 1);
		for (int e = 0; e < E; e++) {
			for (int64_t o = 0; o < Id; o++) {
				double a = 0, b = 0;
				for (int64_t i = 0; i < Hd; i++)
					a += (double)g[e][o * Hd + i] * x[i], b += (double)u[e][o * Hd + i] * x[i];
				act[o] = silu(a) * b;
			}
			syr(r->adn[e], act, Id, 1);
			for (int k = 0; k < K; k++) {
				if (top[k] != e)
					continue;
				double w = pr[e] / s / ws;   /* norm_topk_prob: renormalized */
				r->n[e]++;
				r->w2[e] += w * w;
				syr(r->hin[e], x, Hd, 1), syr(r->hdn[e], act, Id, 1);
				syr(r->win[e], x, Hd, w * w), syr(r->wdn[e], act, Id, w * w);
			}
		}
	}
	free(x), free(act), free(router);
	for (int e = 0; e < E; e++)
		free(g[e]), free(u[e]), free(d[e]);
	x3_st_close(st);
	return 0;
}

static const x3_tensor *find(x3_tensor **f, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(f[i]->name, name))
			return f[i];
	return NULL;
}

/* max |frame - (a + wb·b)| / max |a + wb·b| */
static double rel(const x3_tensor *t, const double *a, const double *b, double wb, int64_t n)
{
	if (!t || t->shape[0] != n)
		return INFINITY;
	double d = 0, m = 0;
	for (int64_t i = 0; i < n * n; i++) {
		double v = t->dtype == X3_F64 ? ((double *)t->data)[i] : ((float *)t->data)[i];
		double want = (a ? a[i] : 0) + (b ? wb * b[i] : 0);
		d = fmax(d, fabs(v - want)), m = fmax(m, fabs(want));
	}
	return d / m;
}

static long long meta(const x3_tensor *t, const char *k)
{
	const char *v = t ? x3_meta_get(t, k) : NULL;
	return v ? atoll(v) : -1;
}

/* seeded ids, or every one the same (same = 1); rows r0..r1-1 of them */
static int write_rows(const char *path, int same, int r0, int r1)
{
	x3_tensor *t = x3_tensor_new2("tokens", X3_I32, r1 - r0, C);
	x3_rng g;
	x3_rng_seed(&g, 7, 0);
	for (int i = 0; i < r1 * C; i++) {
		int32_t v = same ? 65 : (int32_t)(x3_rng_u64(&g) % 256);
		if (i >= r0 * C)
			((int32_t *)t->data)[i - r0 * C] = v;
	}
	int rc = test_write_frame(path, t);
	x3_tensor_free(t);
	return rc;
}

static int write_tokens(const char *path, int same) { return write_rows(path, same, 0, R); }

/* the block input of a model (its forward's hook) */
static int block_input(const char *dir, const char *tokfile)
{
	x3_model *m;
	if (x3_model_open(dir, NULL, &m))
		return 1;
	Hd = x3_model_cfg(m)->hidden, Id = x3_model_cfg(m)->moe_inter;
	free(X);
	X = malloc((size_t)(T * Hd) * sizeof *X);
	xn = 0;
	int32_t tok[T];
	x3_tensor **f;
	int nf;
	if (x3_read_all(tokfile, &f, &nf) || nf != 1)
		return 1;
	memcpy(tok, f[0]->data, sizeof tok);
	x3_tensor_free(f[0]);
	free(f);
	struct x3_forward_opts o;
	x3_forward_opts_init(&o, m);
	o.hook = grab;
	o.last_layer = 0;
	o.moe_all_tokens = INT64_MAX;
	int rc = x3_model_forward(m, tok, R, C, &o);
	x3_model_close(m);
	return rc || xn != T;
}

#define GIN "model.layers.0.mlp.experts.%d.input"
#define GDN "model.layers.0.mlp.experts.%d.down_proj.input"

int main(void)
{
	if (access("bin/hessian-capture", X_OK)) {
		CHECK(0, "bin/hessian-capture is built");
		TEST_DONE();
	}
	if (test_tmpdir("t1559")) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	CHECK(test_run("examples/make-tiny-llama --arch qwen3-moe --experts 8 --top-k 2 --moe-inter 48 %s 1 64 96 >/dev/null",
	          test_path("m8")) == 0 &&
	      test_run("examples/make-tiny-llama --arch qwen3-moe --experts 4 --top-k 1 --moe-inter 48 %s 1 64 96 >/dev/null",
	          test_path("m4")) == 0, "tiny Qwen3-MoE checkpoints (8 experts top 2; 4 top 1)");
	CHECK_OK(write_tokens(test_path("tok"), 0), "tokens %dx%d", R, C);
	CHECK_OK(write_tokens(test_path("same"), 1), "tokens %dx%d, all the same id", R, C);
	const char *hc = "bin/hessian-capture -q --f64 --layers 0-0";
	char name[128];

	/* ---- routed, no fallback (--min-tokens 0: only an expert without tokens) */
	struct ref r;
	CHECK(block_input(test_path("m8"), test_path("tok")) == 0 && reference(test_path("m8"), 8, 2, &r) == 0, "8 experts: the per-token reference");
	CHECK(test_run("%s --model %s --tokens %s --min-tokens 0 -o %s", hc, test_path("m8"), test_path("tok"), test_path("h")) == 0,
	      "capture, routed");
	x3_tensor **f;
	int nf, ok = 1, tot = 0, nmin = T, nmax = 0;
	CHECK_OK(x3_read_all(test_path("h"), &f, &nf), "read it");
	double err = 0;
	for (int e = 0; e < 8; e++) {
		snprintf(name, sizeof name, GIN, e);
		const x3_tensor *ti = find(f, nf, name);
		snprintf(name, sizeof name, GDN, e);
		const x3_tensor *td = find(f, nf, name);
		if (!r.n[e])
			continue;
		err = fmax(err, fmax(rel(ti, r.hin[e], NULL, 0, Hd), rel(td, r.hdn[e], NULL, 0, Id)));
		ok &= meta(ti, "count") == r.n[e] && meta(td, "count") == r.n[e] &&
		      meta(ti, "routed_tokens") == r.n[e] && meta(ti, "expert_fallback") == 0 && meta(ti, "expert") == e;
		tot += r.n[e];
		nmin = r.n[e] < nmin ? r.n[e] : nmin, nmax = r.n[e] > nmax ? r.n[e] : nmax;
	}
	CHECK(tot == 2 * T, "the reference routes 2 x %d tokens (%d)", T, tot);
	CHECK(err < 1e-5, "every expert's Hessians (gate/up, down) are XᵀX of exactly its routed rows (rel. err %.2g)", err);
	CHECK(ok, "count = routed_tokens = the expert's routed rows, expert_fallback=0, expert=E");
	for (int i = 0; i < nf; i++)
		x3_tensor_free(f[i]);
	free(f);

	/* ---- --min-tokens between the fewest and the most routed tokens */
	int m = (nmin + nmax + 1) / 2, below = 0, above = 0;
	CHECK(nmin < m && m <= nmax, "the experts' loads differ (%d..%d tokens): threshold %d", nmin, nmax, m);
	CHECK(test_run("%s --model %s --tokens %s --min-tokens %d --report %s -o %s 2>%s", "bin/hessian-capture --f64 --layers 0-0",
	          test_path("m8"), test_path("tok"), m, test_path("rep"), test_path("hb"), test_path("err")) == 0, "capture, --min-tokens %d --report", m);
	CHECK_OK(x3_read_all(test_path("hb"), &f, &nf), "read it");
	err = 0, ok = 1;
	char want[4096] = "", line[256];
	for (int e = 0; e < 8; e++) {
		snprintf(name, sizeof name, GIN, e);
		const x3_tensor *ti = find(f, nf, name);
		snprintf(name, sizeof name, GDN, e);
		const x3_tensor *td = find(f, nf, name);
		int n = r.n[e];
		if (n < m) {
			below++;
			double w = (double)(m - n) / T;
			err = fmax(err, fmax(rel(ti, r.hin[e], r.ain, w, Hd), rel(td, r.hdn[e], r.adn[e], w, Id)));
			ok &= meta(ti, "count") == m && meta(td, "count") == m && meta(ti, "expert_fallback") == 1 &&
			      meta(td, "fallback_tokens") == m - n && meta(ti, "routed_tokens") == n;
			snprintf(line, sizeof line, "%s%d (%d)", *want ? ", " : "", e, n);
			strcat(want, line);
		} else {
			above++;
			err = fmax(err, fmax(rel(ti, r.hin[e], NULL, 0, Hd), rel(td, r.hdn[e], NULL, 0, Id)));
			ok &= meta(ti, "count") == n && meta(ti, "expert_fallback") == 0;
		}
	}
	CHECK(below && above, "%d experts below the threshold, %d at or above", below, above);
	CHECK(err < 1e-5, "below it: H_routed + (m-n)/T H_all; above: the routed H (rel. err %.2g)", err);
	CHECK(ok, "count m, expert_fallback=1, fallback_tokens=m-n below; the routed count above");
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "grep -qF 'layer 0: experts below %d routed tokens, blended with the all-token Hessian (expert (tokens)): %s' %s",
	         m, want, test_path("err"));
	CHECK(system(cmd) == 0, "stderr names the starved experts: %s", want);
	snprintf(cmd, sizeof cmd, "test \"$(jq -sc '[.[] | select(.fallback) | .expert]' %s)\" = \"$(jq -sc '[.[] | select(.routed_tokens < %d) | .expert]' %s)\" && test $(wc -l <%s) -eq 8",
	         test_path("rep"), m, test_path("rep"), test_path("rep"));
	CHECK(system(cmd) == 0, "--report: one line per expert, fallback true exactly below the threshold");
	for (int i = 0; i < nf; i++)
		x3_tensor_free(f[i]);
	free(f);

	/* ---- --merge of captures of the two rows: the experts' tokens add up */
	CHECK(write_rows(test_path("r0"), 0, 0, 1) == X3_OK && write_rows(test_path("r1"), 0, 1, 2) == X3_OK &&
	      test_run("%s --model %s --tokens %s --min-tokens 0 -o %s 2>/dev/null", hc, test_path("m8"), test_path("r0"), test_path("p0")) == 0 &&
	      test_run("%s --model %s --tokens %s --min-tokens 0 -o %s 2>/dev/null", hc, test_path("m8"), test_path("r1"), test_path("p1")) == 0 &&
	      test_run("bin/hessian-capture --merge %s %s > %s", test_path("p0"), test_path("p1"), test_path("pm")) == 0,
	      "capture row 0 and row 1 apart, merge");
	CHECK_OK(x3_read_all(test_path("pm"), &f, &nf), "read the merge");
	err = 0, ok = 1;
	for (int e = 0; e < 8; e++) {
		snprintf(name, sizeof name, GIN, e);
		const x3_tensor *ti = find(f, nf, name);
		if (r.n[e])
			err = fmax(err, rel(ti, r.hin[e], NULL, 0, Hd));
		ok &= meta(ti, "routed_tokens") == r.n[e];
	}
	CHECK(ok && err < 1e-5, "merged: routed_tokens and H of each expert are the whole capture's (rel. err %.2g)", err);
	for (int i = 0; i < nf; i++)
		x3_tensor_free(f[i]);
	free(f);

	/* ---- all tokens; weighted */
	CHECK(test_run("%s --model %s --tokens %s --moe-capture all -o %s", hc, test_path("m8"), test_path("tok"), test_path("ha")) == 0 &&
	      test_run("%s --model %s --tokens %s --moe-capture weighted --min-tokens 0 -o %s", hc, test_path("m8"), test_path("tok"), test_path("hw")) == 0,
	      "capture, --moe-capture all and weighted");
	x3_tensor **fa, **fw;
	int na, nw;
	CHECK_OK(x3_read_all(test_path("ha"), &fa, &na), "read all");
	CHECK_OK(x3_read_all(test_path("hw"), &fw, &nw), "read weighted");
	double ea = 0, ew = 0;
	ok = 1;
	for (int e = 0; e < 8; e++) {
		snprintf(name, sizeof name, GIN, e);
		const x3_tensor *ti = find(fa, na, name), *wi = find(fw, nw, name);
		snprintf(name, sizeof name, GDN, e);
		const x3_tensor *td = find(fa, na, name), *wd = find(fw, nw, name);
		ea = fmax(ea, fmax(rel(ti, r.ain, NULL, 0, Hd), rel(td, r.adn[e], NULL, 0, Id)));
		ok &= meta(ti, "count") == T && meta(ti, "routed_tokens") == r.n[e];
		if (r.n[e])
			ew = fmax(ew, fmax(rel(wi, r.win[e], NULL, 0, Hd), rel(wd, r.wdn[e], NULL, 0, Id)));
	}
	CHECK(ea < 1e-5 && ok, "all: every expert's Hessians over all %d tokens, count %d, routed_tokens kept (rel. err %.2g)", T, T, ea);
	CHECK(ew < 1e-5, "weighted: Σ w² xᵀx over the routed rows (rel. err %.2g)", ew);
	x3_tensor **fb;
	int nb;
	CHECK(test_run("%s --model %s --tokens %s --moe-capture weighted --min-tokens %d -o %s 2>/dev/null", hc, test_path("m8"),
	          test_path("tok"), m, test_path("hwb")) == 0, "capture, weighted, --min-tokens %d", m);
	CHECK_OK(x3_read_all(test_path("hwb"), &fb, &nb), "read it");
	ew = 0, ok = 1;
	for (int e = 0; e < 8; e++) {
		snprintf(name, sizeof name, GDN, e);
		const x3_tensor *wd = find(fb, nb, name);
		double s = r.n[e] < m ? r.w2[e] / r.n[e] * (m - r.n[e]) / T : 0;
		ew = fmax(ew, rel(wd, r.wdn[e], r.adn[e], s, Id));
		ok &= meta(wd, "count") == (r.n[e] < m ? m : r.n[e]);
	}
	CHECK(ew < 1e-5 && ok, "weighted below m: H_w + (m-n)/T mean(w²) H_all, count m (rel. err %.2g)", ew);

	/* ---- 4 experts, top 1, every token the same id: the block's input is
	 * the same in every position (attention over equal values), so one
	 * expert gets all tokens and the others none */
	struct ref r4;
	CHECK(block_input(test_path("m4"), test_path("same")) == 0 && reference(test_path("m4"), 4, 1, &r4) == 0, "4 experts top 1: the reference");
	CHECK(test_run("%s --model %s --tokens %s --min-tokens 1 -o %s 2>%s", hc, test_path("m4"), test_path("same"), test_path("h4"), test_path("err4")) == 0,
	      "capture, --min-tokens 1");
	CHECK_OK(x3_read_all(test_path("h4"), &f, &nf), "read it");
	err = 0, ok = 1;
	int zero = 0, full = 0;
	want[0] = 0;
	for (int e = 0; e < 4; e++) {
		snprintf(name, sizeof name, GIN, e);
		const x3_tensor *ti = find(f, nf, name);
		snprintf(name, sizeof name, GDN, e);
		const x3_tensor *td = find(f, nf, name);
		if (r4.n[e] == 0) {
			zero++;
			err = fmax(err, fmax(rel(ti, NULL, r4.ain, 1.0 / T, Hd), rel(td, NULL, r4.adn[e], 1.0 / T, Id)));
			ok &= meta(ti, "count") == 1 && meta(td, "expert_fallback") == 1 && meta(ti, "routed_tokens") == 0;
			snprintf(line, sizeof line, "%s%d (0)", *want ? ", " : "", e);
			strcat(want, line);
		} else {
			full += r4.n[e] == T;
			err = fmax(err, fmax(rel(ti, r4.hin[e], NULL, 0, Hd), rel(td, r4.hdn[e], NULL, 0, Id)));
			ok &= meta(ti, "count") == T && meta(ti, "expert_fallback") == 0;
		}
	}
	CHECK(zero == 3 && full == 1, "one expert gets all %d tokens, 3 get none (%d, %d, %d, %d)", T,
	      r4.n[0], r4.n[1], r4.n[2], r4.n[3]);
	CHECK(err < 1e-5 && ok, "an expert without tokens: the all-token Hessian (weight 1/T, count 1), expert_fallback=1 (rel. err %.2g)", err);
	snprintf(cmd, sizeof cmd, "grep -qF 'experts below 1 routed tokens, blended with the all-token Hessian (expert (tokens)): %s' %s",
	         want, test_path("err4"));
	CHECK(system(cmd) == 0, "stderr names them: %s", want);

	test_tmpdir_remove();
	TEST_DONE();
}
