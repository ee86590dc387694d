/* t1550: fp32 forward of the real stories260K model: greedy generation from
 * BOS reproduces llama2.c's documented sample token for token; batching,
 * chunking and logits modes agree; the capture hook sees every group. */
#include <math.h>
#include <jansson.h>
#include "test.h"
#include "model.h"
#include "tokenizer.h"

static const char ref_text[] =
	"Once upon a time, there was a little girl named Lily. She loved to play outside in "
	"the park. One day, she saw a big, red ball. She wanted to play with it, but it was "
	"too high";

/* Decode ids with the vocabulary of tokenizer.json, as its decoder says:
 * "▁" -> " ", <0xNN> byte fallback, leading space stripped. Written here,
 * independent of lib/tokenizer, so that the two check each other. */
static char *decode(json_t *vocab, const int32_t *ids, int n)
{
	const char **piece = calloc(4096, sizeof *piece);
	const char *k;
	json_t *v;
	json_object_foreach(vocab, k, v)
		if (json_integer_value(v) >= 0 && json_integer_value(v) < 4096)
			piece[json_integer_value(v)] = k;
	char *out = calloc((size_t)n * 64 + 1, 1);
	size_t p = 0;
	for (int i = 0; i < n; i++) {
		const char *s = piece[ids[i]];
		unsigned b;
		if (!s)
			continue;
		if (strlen(s) == 6 && sscanf(s, "<0x%2X>", &b) == 1) {
			out[p++] = (char)b;
			continue;
		}
		for (; *s; s++) {
			if (!strncmp(s, "\xe2\x96\x81", 3)) {
				out[p++] = ' ';
				s += 2;
			} else {
				out[p++] = *s;
			}
		}
	}
	free(piece);
	if (out[0] == ' ')
		memmove(out, out + 1, strlen(out));
	return out;
}

struct hookstat {
	int calls[8][4];
	int64_t tok[8][4];
	int head_calls;
	int64_t head_tok;
	int bad;
};

static int hook(void *ctx, const struct x3_capture *c)
{
	struct hookstat *h = ctx;
	static const char *g[4] = { "self_attn.input", "self_attn.o_proj.input", "mlp.input",
	                            "mlp.down_proj.input" };
	static const int64_t in[4] = { 64, 64, 64, 172 };
	if (c->layer == 5) {
		h->head_calls++;
		h->head_tok += c->ntok;
		if (strcmp(c->name, "lm_head.input") || c->in != 64 ||
		    strcmp(c->members, "lm_head.weight"))
			h->bad++;
		return 0;
	}
	for (int i = 0; i < 4; i++) {
		char want[128];
		snprintf(want, sizeof want, "model.layers.%d.%s", c->layer, g[i]);
		if (!strcmp(c->name, want)) {
			h->calls[c->layer][i]++;
			h->tok[c->layer][i] += c->ntok;
			if (c->in != in[i])
				h->bad++;
			if (i == 0 && !strstr(c->members, "self_attn.k_proj.weight"))
				h->bad++;
			return 0;
		}
	}
	h->bad++;
	return 0;
}

static double maxdiff(const float *a, const float *b, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++)
		if (fabs((double)a[i] - b[i]) > m)
			m = fabs((double)a[i] - b[i]);
	return m;
}

int main(void)
{
	char dir[1024], tj[1100];
	snprintf(dir, sizeof dir, "%s/models/stories260K", test_shared());
	snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
	FILE *f = fopen(tj, "rb");
	if (!f) {
		SKIP("stories260K not found under %s", test_shared());
		TEST_DONE();
	}
	fclose(f);
	json_error_t je;
	json_t *tok = json_load_file(tj, 0, &je);
	CHECK(tok != NULL, "tokenizer.json parses");
	json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab");

	x3_model *m;
	CHECK_OK(x3_model_open(dir, NULL, &m), "open stories260K");
	if (!m)
		TEST_DONE();
	const x3_model_config *c = x3_model_cfg(m);
	CHECK(c->arch == X3_ARCH_LLAMA && c->hidden == 64 && c->intermediate == 172 &&
	      c->n_layers == 5 && c->n_heads == 8 && c->n_kv_heads == 4 && c->head_dim == 8 &&
	      c->vocab == 512 && c->tied, "config: llama 64/172/5 layers, 8/4 heads, tied");

	/* greedy from BOS */
	enum { N = 64 };
	int32_t ids[N + 1] = { 1 };
	float lg[512];
	int n = 1;
	struct x3_forward_opts o;
	for (; n <= N; n++) {
		x3_forward_opts_init(&o, m);
		o.logits_mode = X3_LOGITS_LAST;
		o.logits = lg;
		int rc = x3_model_forward(m, ids, 1, n, &o);
		if (rc) {
			CHECK_OK(rc, "forward of %d tokens", n);
			break;
		}
		int b = 0;
		for (int i = 1; i < 512; i++)
			if (lg[i] > lg[b])
				b = i;
		if (n < N + 1)
			ids[n] = b;
	}
	char *text = decode(vocab, ids + 1, N);
	CHECK(!strncmp(text, ref_text, strlen(ref_text)), "greedy text from BOS is the reference");
	printf("# generated: %s\n", text);
	free(text);
	/* token for token: the reference text through lib/tokenizer (BOS added) */
	x3_tok *tk;
	int32_t *rid = NULL;
	size_t rn = 0;
	CHECK_OK(x3_tok_load(dir, &tk), "load tokenizer.json");
	if (tk) {
		CHECK_OK(x3_tok_encode(tk, ref_text, strlen(ref_text), 1, &rid, &rn), "encode reference");
		int same = rn > 40 && rn <= N + 1 && rid[0] == 1;
		for (size_t i = 0; same && i < rn; i++)
			same = rid[i] == ids[i];
		CHECK(same, "greedy ids == the reference text's %zu ids (BOS first)", rn);
		free(rid);
		x3_tok_free(tk);
	}

	/* the same 40-token rows as a batch, chunked or not, ALL vs LAST */
	enum { R = 3, C = 40 };
	int32_t rows[R * C];
	for (int r = 0; r < R; r++)
		for (int i = 0; i < C; i++)
			rows[r * C + i] = r == 0 ? ids[i] : (i == 0 ? 1 : (int32_t)(3 + (i * 37 + r * 11) % 509));
	float *all = malloc(sizeof(float) * R * C * 512), *all2 = malloc(sizeof(float) * R * C * 512);
	float *one = malloc(sizeof(float) * C * 512), last[R * 512];
	struct hookstat hs = { 0 };
	x3_forward_opts_init(&o, m);
	o.logits_mode = X3_LOGITS_ALL;
	o.logits = all;
	o.hook = hook;
	o.hook_ctx = &hs;
	o.chunk_tokens = C;   /* one row per chunk */
	CHECK_OK(x3_model_forward(m, rows, R, C, &o), "forward 3x40, chunks of one row");
	int calls_ok = !hs.bad && hs.head_calls == R && hs.head_tok == R * C;
	for (int l = 0; l < 5; l++)
		for (int g = 0; g < 4; g++)
			calls_ok &= hs.calls[l][g] == R && hs.tok[l][g] == R * C;
	CHECK(calls_ok, "hook: 4 groups x 5 layers + head, every token, right widths and names");
	x3_forward_opts_init(&o, m);
	o.logits_mode = X3_LOGITS_ALL;
	o.logits = all2;
	CHECK_OK(x3_model_forward(m, rows, R, C, &o), "forward 3x40 in one chunk");
	CHECK(maxdiff(all, all2, (size_t)R * C * 512) < 1e-4, "chunked == unchunked logits");
	x3_forward_opts_init(&o, m);
	o.logits_mode = X3_LOGITS_ALL;
	o.logits = one;
	CHECK_OK(x3_model_forward(m, rows + 2 * C, 1, C, &o), "forward row 2 alone");
	CHECK(maxdiff(one, all + 2 * C * 512, (size_t)C * 512) < 1e-4, "row alone == row in batch");
	x3_forward_opts_init(&o, m);
	o.logits_mode = X3_LOGITS_LAST;
	o.logits = last;
	CHECK_OK(x3_model_forward(m, rows, R, C, &o), "forward LAST");
	int lok = 1;
	for (int r = 0; r < R; r++)
		lok &= maxdiff(last + r * 512, all2 + ((size_t)r * C + C - 1) * 512, 512) < 1e-5;
	CHECK(lok, "LAST logits == the last position of ALL");
	/* causality: logits at position i do not depend on later tokens */
	int32_t alt[C];
	memcpy(alt, rows, sizeof alt);
	alt[C - 1] = 7;
	x3_forward_opts_init(&o, m);
	o.logits_mode = X3_LOGITS_ALL;
	o.logits = one;
	CHECK_OK(x3_model_forward(m, alt, 1, C, &o), "forward with the last token changed");
	CHECK(maxdiff(one, all, (size_t)(C - 1) * 512) < 1e-5 &&
	      maxdiff(one + (C - 1) * 512, all + (C - 1) * 512, 512) > 1e-3, "causal mask");

	int32_t badtok[2] = { 1, 512 };
	x3_forward_opts_init(&o, m);
	int rc = x3_model_forward(m, badtok, 1, 2, &o);
	CHECK(rc == X3_EINVAL && strstr(x3_errmsg(), "token id 512"), "token id out of range: %s",
	      x3_errmsg());

	free(all), free(all2), free(one);
	x3_model_close(m);
	json_decref(tok);
	TEST_DONE();
}
