/* tensor-cat: select tensors from a safetensors file, a model directory or
 * a frame stream, and write them as frames or as a safetensors file. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <xxhash.h>
#include "frame.h"
#include "safetensors.h"
#include "util.h"

static const char usage[] =
	"usage: tensor-cat [-o FILE | --split DIR] [--dtype T] [--zstd[=LEVEL]] [--regex]\n"
	"                  [--meta KEY=VAL]... [--rows A:B] [--fuse NAME:E] [--shard-size MB] [-q]\n"
	"                  SOURCE [PATTERN...]\n";

static const char help[] =
	"Select tensors (shell globs, or --regex) from a frame stream, safetensors file\n"
	"or model directory; write frames (stdout), a safetensors file or directory.\n"
	"\n"
	"  -o FILE          write FILE atomically: NAME.safetensors, an existing\n"
	"                   directory (model.safetensors or shards + index), or frames\n"
	"  --split DIR      one DIR/NAME.frames per tensor, each written atomically\n"
	"  --dtype T        convert floating-point tensors to F32, F16 or BF16;\n"
	"                   F8_E4M3: each selected tensor (2-D, float) block-scaled\n"
	"                   as DeepSeek V3's FP8 checkpoints: E4M3 values (nearest,\n"
	"                   ties to even) and NAME_scale_inv, F32 (ceil(rows/128),\n"
	"                   ceil(cols/128)), per 128x128 block the smallest power\n"
	"                   of two that brings the block's largest |w| to 448 or\n"
	"                   less: the values the F8 weight dequantizes to are\n"
	"                   exact in F32 and BF16\n"
	"                   F32, F16 or BF16 also decode MXFP4 weights (GPT-OSS's\n"
	"                   experts, from a safetensors file or model directory):\n"
	"                   a selected NAME_blocks, U8 (..., G, 16), with its\n"
	"                   NAME_scales, U8 (..., G), is written as NAME (..., G*32)\n"
	"                   (E2M1 values times 2^(scale - 127), exact in F32)\n"
	"  --zstd[=LEVEL]   compress the output (level 1..22, default 3)\n"
	"  --regex          patterns are POSIX extended regexes, unanchored\n"
	"  --meta KEY=VAL   add metadata to every frame (repeatable; UTF-8)\n"
	"  --rows A:B       only rows A..B-1 (the first dimension) of every tensor\n"
	"                   (a linear fused with others in one tensor); metadata\n"
	"                   rows=A:B says so; a 3-D (E, R, C) tensor (fused experts)\n"
	"                   as its (E*R, C) rows\n"
	"  --fuse NAME:E    join the selected 2-D tensors (one dtype and width, in\n"
	"                   input order) by rows into one 3-D tensor NAME of E equal\n"
	"                   parts (E, rows/E, C): the experts of a layer fused, as\n"
	"                   Transformers v5 writes them\n"
	"  --shard-size MB  shard size of directory output\n"
	"  -q               quiet\n"
	"  -h               this help\n";

static char **pats;
static int npats, use_regex;
static regex_t *res;
static int *hits;
static x3_dtype to_dtype = X3_DTYPE_COUNT;
static char **metas;
static int nmetas;
static long long row_a = -1, row_b;   /* --rows A:B (row_a < 0: all rows) */

/* Would NAME be selected (without counting a pattern's hits)? */
static int matches(const char *name)
{
	for (int i = 0; i < npats; i++)
		if (use_regex ? regexec(&res[i], name, 0, NULL, 0) == 0 : x3_glob_match(pats[i], name))
			return 1;
	return !npats;
}

static int selected(const char *name)
{
	if (!npats)
		return 1;
	int any = 0;
	for (int i = 0; i < npats; i++) {
		int m = use_regex ? regexec(&res[i], name, 0, NULL, 0) == 0 : x3_glob_match(pats[i], name);
		if (m) {
			hits[i]++;
			any = 1;
		}
	}
	return any;
}

static int is_fbh(x3_dtype t) { return t == X3_F32 || t == X3_F16 || t == X3_BF16; }

/* Output dtype of a tensor: --dtype applies to floating-point tensors only. */
static x3_dtype out_dtype(x3_dtype src)
{
	if (to_dtype == X3_DTYPE_COUNT || !x3_dtype_info(src)->is_float)
		return src;
	return to_dtype;
}

/* Convert n elements, through F32 when there is no direct path. */
static void convert(void *dst, x3_dtype dt, const void *src, x3_dtype st, size_t n, const char *name)
{
	if (dt == st || dt == X3_F32 || (is_fbh(dt) && is_fbh(st))) {
		if (x3_convert(dst, dt, src, st, n))
			die_x3("tensor '%s'", name);
		return;
	}
	float *tmp = malloc(n * sizeof *tmp + 1);
	if (!tmp)
		die("out of memory");
	if (x3_convert(tmp, X3_F32, src, st, n) || x3_convert(dst, dt, tmp, X3_F32, n))
		die_x3("tensor '%s'", name);
	free(tmp);
}

/* The E4M3 ("fn": bias 7, max 448, no infinities) byte of v, |v| <= 448,
 * rounded to the nearest value, ties to even. */
static unsigned char f32_to_e4m3(float v)
{
	unsigned char sign = signbit(v) ? 0x80 : 0;
	double a = fabs((double)v);
	if (a == 0)
		return sign;
	int e;
	frexp(a, &e);   /* a = m 2^e, m in [0.5, 1): the leading bit is 2^(e-1) */
	if (e - 1 < -6)   /* subnormal: multiples of 2^-9; 8 of them is 0x08, the least normal */
		return sign | (unsigned char)nearbyint(ldexp(a, 9));
	int q = (int)nearbyint(ldexp(a, 4 - e));   /* 8..16: 1.mmm in eighths */
	if (q == 16)
		q = 8, e++;
	return sign | (unsigned char)(((e - 1 + 7) << 3) | (q - 8));
}

/* --dtype F8_E4M3: t as E4M3 bytes and its per-block scales (NAME_scale_inv) */
static void emit_whole(x3_tensor *t);
static void emit_f8(const x3_tensor *t)
{
	if (t->rank != 2 || !x3_dtype_info(t->dtype)->is_float)
		die("--dtype F8_E4M3: tensor '%s' is not a 2-D float tensor (select only the weights to block-scale)",
		    t->name);
	int64_t R = t->shape[0], C = t->shape[1], br = (R + 127) / 128, bc = (C + 127) / 128;
	float *f = x3_tensor_f32(t);
	char sn[1024];
	snprintf(sn, sizeof sn, "%s_scale_inv", t->name);
	x3_tensor *q = x3_tensor_new2(t->name, X3_F8_E4M3, R, C), *sc = x3_tensor_new2(sn, X3_F32, br, bc);
	if (!f || !q || !sc)
		die_x3("tensor '%s'", t->name);
	x3_meta_copy(q, t);
	unsigned char *b = q->data;
	float *s = sc->data;
	for (int64_t bi = 0; bi < br; bi++)
		for (int64_t bj = 0; bj < bc; bj++) {
			int64_t i1 = bi * 128 + 128 < R ? bi * 128 + 128 : R, j1 = bj * 128 + 128 < C ? bj * 128 + 128 : C;
			double mx = 0;
			for (int64_t i = bi * 128; i < i1; i++)
				for (int64_t j = bj * 128; j < j1; j++) {
					if (!isfinite(f[i * C + j]))
						die("--dtype F8_E4M3: tensor '%s': element (%lld, %lld) is not finite", t->name,
						    (long long)i, (long long)j);
					mx = fmax(mx, fabs((double)f[i * C + j]));
				}
			int k = 0;   /* the smallest 2^k with mx / 2^k <= 448 */
			while (mx > ldexp(448, k))
				k++;
			while (mx > 0 && mx <= ldexp(448, k - 1))
				k--;
			s[bi * bc + bj] = ldexpf(1, k);
			for (int64_t i = bi * 128; i < i1; i++)
				for (int64_t j = bj * 128; j < j1; j++)
					b[i * C + j] = f32_to_e4m3(ldexpf(f[i * C + j], -k));
		}
	free(f);
	emit_whole(q);
	emit_whole(sc);
	x3_tensor_free(q);
	x3_tensor_free(sc);
}

static void add_metas(x3_tensor *t)
{
	for (int i = 0; i < nmetas; i++) {
		char *eq = strchr(metas[i], '=');
		*eq = 0;
		if (x3_meta_set(t, metas[i], eq + 1))
			die_x3("metadata");
		*eq = '=';
	}
}

/* --rows: rows [row_a, row_b) of t's first dimension, a new tensor in
 * dtype dt (a block-scaled F8 weight dequantized first), metadata rows=A:B */
static x3_tensor *slice_rows(const x3_tensor *t, x3_dtype dt)
{
	if (t->rank < 1 || (t->rank != 3 && row_b > t->shape[0]))
		die("tensor '%s': --rows %lld:%lld past its %lld rows", t->name, row_a, row_b,
		    t->rank < 1 ? 0LL : (long long)t->shape[0]);
	x3_tensor *full = NULL;
	if (t->scale_inv) {
		if (!(full = x3_tensor_copy(t, X3_F32)))
			die_x3("tensor '%s'", t->name);
		t = full;
	}
	int64_t sh[8];
	int rank = t->rank;
	for (int d = 0; d < t->rank; d++)
		sh[d] = t->shape[d];
	if (rank == 3) {
		/* the experts of a layer fused in one (experts, rows, in)
		 * tensor: rows of its (experts * rows, in) view */
		sh[0] = t->shape[0] * t->shape[1], sh[1] = t->shape[2], rank = 2;
		if (row_b > sh[0])
			die("tensor '%s': --rows %lld:%lld past the %lld rows of its %lldx%lld view", t->name, row_a,
			    row_b, (long long)sh[0], (long long)sh[0], (long long)sh[1]);
	}
	size_t rowel = (size_t)(x3_tensor_numel(t) / (sh[0] ? sh[0] : 1));
	sh[0] = row_b - row_a;
	x3_tensor *c = x3_tensor_new(t->name, dt, rank, sh, 1);
	if (!c || x3_meta_copy(c, t))
		die_x3("tensor '%s'", t->name);
	size_t es = x3_dtype_size(t->dtype);
	convert(c->data, dt, (const char *)t->data + (size_t)row_a * rowel * es, t->dtype,
	        (size_t)(row_b - row_a) * rowel, t->name);
	char v[64];
	snprintf(v, sizeof v, "%lld:%lld", row_a, row_b);
	if (x3_meta_set(c, "rows", v))
		die_x3("metadata");
	x3_tensor_free(full);
	return c;
}

/* --fuse NAME:E: the selected tensors' rows, joined */
static const char *fuse_name;
static long fuse_e;
static x3_tensor *fuse_t;      /* (rows so far, C), its data grown */

static void fuse_add(const x3_tensor *t)
{
	if (t->rank != 2 || t->scale_inv)
		die("tensor '%s': --fuse joins 2-D float tensors", t->name);
	if (!fuse_t) {
		int64_t sh[2] = {0, t->shape[1]};
		if (!(fuse_t = x3_tensor_new(fuse_name, t->dtype, 2, sh, 0)))
			die_x3("tensor '%s'", fuse_name);
	} else if (t->dtype != fuse_t->dtype || t->shape[1] != fuse_t->shape[1])
		die("tensor '%s': %s with %lld columns, the first one joined is %s with %lld (--fuse)", t->name,
		    x3_dtype_name(t->dtype), (long long)t->shape[1], x3_dtype_name(fuse_t->dtype),
		    (long long)fuse_t->shape[1]);
	char *d = realloc(fuse_t->data, fuse_t->nbytes + t->nbytes + 1);
	if (!d)
		die("out of memory (--fuse)");
	memcpy(d + fuse_t->nbytes, t->data, t->nbytes);
	fuse_t->data = d, fuse_t->owns_data = 1;
	fuse_t->nbytes += t->nbytes;
	fuse_t->shape[0] += t->shape[0];
}

/* sinks */
static x3_writer *fw;
static x3_stw *sw;
static const char *sw_path;   /* -o FILE.safetensors or DIR, for messages */

/* --split DIR: each tensor to its own frame file DIR/NAME.frames, written
 * atomically (one pass over the source instead of one per tensor) */
static const char *split_dir;
static int split_zlevel;
static char split_path[4096];
static char **split_seen;
static int nsplit_seen;

static void split_open(const char *name)
{
	if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		die("tensor '%s': not usable as a file name (--split)", name);
	for (int i = 0; i < nsplit_seen; i++)
		if (!strcmp(split_seen[i], name))
			die("tensor '%s' appears twice (--split writes one file per name)", name);
	char **p = realloc(split_seen, (size_t)(nsplit_seen + 1) * sizeof *p);
	if (!p || !(p[nsplit_seen] = strdup(name)))
		die("out of memory");
	split_seen = p;
	nsplit_seen++;
	if (snprintf(split_path, sizeof split_path, "%s/%s.frames", split_dir, name) >= (int)sizeof split_path)
		die("%s/%s.frames: path too long", split_dir, name);
	if (x3_writer_open_fd(output_open(split_path), split_zlevel, &fw))
		die("%s: %s", split_path, x3_errmsg());
}

static void split_close(void)
{
	if (x3_writer_close(fw))
		die("%s: %s", split_path, x3_errmsg());
	fw = NULL;
	output_commit();
}

static void abort_sw(void)
{
	if (sw)
		x3_stw_abort(sw);
}

/* Shards of a safetensors directory break only between modules: a module is
 * a name up to its last '.', e.g. model.layers.0.self_attn.q_proj. */
static void module_of(const char *name)
{
	static char last[1024];
	char cur[1024];
	snprintf(cur, sizeof cur, "%s", name);
	char *dot = strrchr(cur, '.');
	if (dot)
		*dot = 0;
	if (strcmp(cur, last)) {
		x3_stw_module(sw);
		snprintf(last, sizeof last, "%s", cur);
	}
}

static void emit_whole(x3_tensor *t)
{
	add_metas(t);
	if (sw) {
		module_of(t->name);
		if (x3_stw_add(sw, t))
			die_x3("%s: writing '%s'", sw_path, t->name);
	} else if (x3_writer_put(fw, t)) {
		die_x3("writing frame '%s'", t->name);
	}
}

/* A tensor whose payload is in memory (mmap): stream it to frames without
 * copying, converting in chunks (two passes: hash, then write). */
static void emit_mapped(const x3_tensor *src)
{
	if (to_dtype == X3_F8_E4M3) {
		emit_f8(src);
		return;
	}
	x3_dtype dt = out_dtype(src->dtype);
	if (row_a >= 0) {
		x3_tensor *c = slice_rows(src, src->scale_inv && dt == src->dtype ? X3_F32 : dt);
		emit_whole(c);
		x3_tensor_free(c);
		return;
	}
	if (src->scale_inv) {
		/* a block-scaled F8 weight: dequantized (F32 unless --dtype) */
		x3_tensor *c = x3_tensor_copy(src, dt == src->dtype ? X3_F32 : dt);
		if (!c)
			die_x3("tensor '%s'", src->name);
		emit_whole(c);
		x3_tensor_free(c);
		return;
	}
	x3_tensor *h = x3_tensor_new(src->name, dt, src->rank, src->shape, 0);
	if (!h)
		die_x3("tensor '%s'", src->name);
	x3_meta_copy(h, src);
	if (sw) {
		h->data = malloc(h->nbytes + 1);
		h->owns_data = 1;
		if (!h->data)
			die("out of memory for '%s'", src->name);
		convert(h->data, dt, src->data, src->dtype, (size_t)x3_tensor_numel(src), src->name);
		emit_whole(h);
		x3_tensor_free(h);
		return;
	}
	add_metas(h);
	size_t n = (size_t)x3_tensor_numel(src), es = x3_dtype_size(src->dtype), ed = x3_dtype_size(dt);
	const size_t CH = 1 << 18;   /* elements per chunk */
	if (dt == src->dtype) {
		if (x3_writer_put_header(fw, h, XXH3_64bits(src->data, src->nbytes)) ||
		    (src->nbytes && x3_writer_put_data(fw, src->data, src->nbytes)))
			die_x3("writing frame '%s'", src->name);
	} else {
		unsigned char *buf = malloc(CH * ed);
		XXH3_state_t *hs = XXH3_createState();
		if (!buf || !hs)
			die("out of memory");
		XXH3_64bits_reset(hs);
		for (size_t i = 0; i < n; i += CH) {
			size_t k = n - i < CH ? n - i : CH;
			convert(buf, dt, (const char *)src->data + i * es, src->dtype, k, src->name);
			XXH3_64bits_update(hs, buf, k * ed);
		}
		if (x3_writer_put_header(fw, h, XXH3_64bits_digest(hs)))
			die_x3("writing frame '%s'", src->name);
		for (size_t i = 0; i < n; i += CH) {
			size_t k = n - i < CH ? n - i : CH;
			convert(buf, dt, (const char *)src->data + i * es, src->dtype, k, src->name);
			if (x3_writer_put_data(fw, buf, k * ed))
				die_x3("writing frame '%s'", src->name);
		}
		free(buf);
		XXH3_freeState(hs);
	}
	x3_tensor_free(h);
}

static void from_frames(const char *path)
{
	x3_reader *r;
	if (x3_reader_open(path, &r))
		die_x3("%s", path);
	for (;;) {
		x3_tensor *t;
		int rc = x3_reader_next_header(r, &t);
		if (rc == X3_EOF)
			break;
		if (rc)
			die("%s", x3_errmsg());
		if (!selected(t->name)) {
			if (x3_reader_skip(r))
				die("%s", x3_errmsg());
			x3_tensor_free(t);
			continue;
		}
		if (fuse_name) {
			if (x3_reader_load(r, t))
				die("%s", x3_errmsg());
			fuse_add(t);
			x3_tensor_free(t);
			continue;
		}
		if (split_dir)
			split_open(t->name);
		x3_dtype dt = out_dtype(t->dtype);
		if (!sw && dt == t->dtype && row_a < 0 && to_dtype != X3_F8_E4M3) {
			/* pass-through: re-declare the input's checksum and stream the
			 * payload in chunks (bounded memory). The reader verifies the
			 * checksum when the payload ends; so does the next reader. */
			add_metas(t);
			if (x3_writer_put_header(fw, t, x3_reader_checksum(r)))
				die_x3("writing frame '%s'", t->name);
			for (size_t left = t->nbytes; left;) {
				const void *p;
				size_t k;
				if (x3_reader_peek(r, &p, left, &k))
					die("%s", x3_errmsg());
				if (x3_writer_put_data(fw, p, k))
					die_x3("writing frame '%s'", t->name);
				left -= k;
			}
			x3_tensor_free(t);
			if (split_dir)
				split_close();
			continue;
		}
		if (x3_reader_load(r, t))
			die("%s", x3_errmsg());
		if (to_dtype == X3_F8_E4M3) {
			emit_f8(t);
			x3_tensor_free(t);
			if (split_dir)
				split_close();
			continue;
		}
		if (row_a >= 0) {
			x3_tensor *c = slice_rows(t, dt);
			x3_tensor_free(t);
			t = c;
		} else if (dt != t->dtype) {
			x3_tensor *c = x3_tensor_new(t->name, dt, t->rank, t->shape, 1);
			if (!c)
				die_x3("tensor '%s'", t->name);
			x3_meta_copy(c, t);
			convert(c->data, dt, t->data, t->dtype, (size_t)x3_tensor_numel(t), t->name);
			x3_tensor_free(t);
			t = c;
		}
		emit_whole(t);
		x3_tensor_free(t);
		if (split_dir)
			split_close();
	}
	x3_reader_close(r);
}

/* --dtype F32, F16 or BF16 (a float dtype to decode MXFP4 weights into) */
static int to_float(void) { return to_dtype == X3_F32 || to_dtype == X3_F16 || to_dtype == X3_BF16; }

/* MXFP4 weights (NAME_blocks and NAME_scales, x3_st_mxfp4) as the float
 * tensor NAME: decoded to F32, then --dtype, then --rows */
static void emit_mxfp4(const x3_st *s, const x3_tensor *b)
{
	x3_tensor *t, *c;
	if (x3_st_mxfp4(s, b, &t))
		die_x3("%s", x3_st_file(s, 0));
	if (row_a >= 0) {
		c = slice_rows(t, to_dtype);
	} else if (!(c = x3_tensor_copy(t, to_dtype))) {
		die_x3("tensor '%s'", t->name);
	}
	x3_tensor_free(t);
	emit_whole(c);
	x3_tensor_free(c);
}

/* NAME_scales whose NAME_blocks is selected too: read by emit_mxfp4 */
static int mxfp4_scales_of_selected(const x3_st *s, const x3_tensor *t)
{
	char bn[1024];
	size_t l = strlen(t->name);
	if (l < 8 || strcmp(t->name + l - 7, "_scales") || l + 1 > sizeof bn)
		return 0;
	snprintf(bn, sizeof bn, "%.*s_blocks", (int)(l - 7), t->name);
	const x3_tensor *b = x3_st_find(s, bn);
	return b && x3_st_is_mxfp4(s, b) && matches(bn);
}

static void from_st(const char *path)
{
	x3_st *s;
	if (x3_st_open(path, &s))
		die("%s", x3_errmsg());
	for (int i = 0; i < x3_st_count(s); i++) {
		const x3_tensor *t = x3_st_get(s, i);
		if (!selected(t->name))
			continue;
		if (fuse_name) {
			fuse_add(t);
			continue;
		}
		if (to_float() && mxfp4_scales_of_selected(s, t))
			continue;
		int mx = to_float() && x3_st_is_mxfp4(s, t);
		if (split_dir) {
			/* the decoded tensor's file: NAME, not NAME_blocks */
			char sn[1024];
			snprintf(sn, sizeof sn, "%.*s", (int)(strlen(t->name) - (mx ? 7 : 0)), t->name);
			split_open(sn);
		}
		if (mx)
			emit_mxfp4(s, t);
		else
			emit_mapped(t);
		if (split_dir)
			split_close();
	}
	x3_st_close(s);
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	const char *outp = NULL;
	int zlevel = 0;
	long shard_mb = 0;
	enum { O_DTYPE = 256, O_ZSTD, O_REGEX, O_META, O_SHARD, O_SPLIT, O_ROWS, O_FUSE };
	static const struct option lo[] = {
		{"output", required_argument, 0, 'o'}, {"dtype", required_argument, 0, O_DTYPE},
		{"zstd", optional_argument, 0, O_ZSTD}, {"regex", no_argument, 0, O_REGEX},
		{"meta", required_argument, 0, O_META}, {"shard-size", required_argument, 0, O_SHARD},
		{"split", required_argument, 0, O_SPLIT}, {"rows", required_argument, 0, O_ROWS},
		{"fuse", required_argument, 0, O_FUSE}, {"quiet", no_argument, 0, 'q'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int c;
	metas = calloc(argc, sizeof *metas);
	while ((c = getopt_long(argc, argv, "o:qh", lo, NULL)) != -1) {
		switch (c) {
		case 'o': outp = optarg; break;
		case 'q': quiet = 1; break;
		case 'h': printf("%s\n%s", usage, help); return 0;
		case O_DTYPE:
			if (x3_dtype_parse(optarg, &to_dtype) || !x3_dtype_info(to_dtype)->is_float ||
			    to_dtype == X3_F64 || to_dtype == X3_F8_E5M2)
				usage_error(usage, "--dtype: '%s' is not one of F32, F16, BF16, F8_E4M3", optarg);
			break;
		case O_ZSTD: zlevel = optarg ? (int)parse_long(usage, "--zstd", optarg, 1, 22) : 3; break;
		case O_REGEX: use_regex = 1; break;
		case O_META:
			meta_arg_check(usage, optarg);
			metas[nmetas++] = optarg;
			break;
		case O_SHARD: shard_mb = parse_long(usage, "--shard-size", optarg, 1, 1L << 30); break;
		case O_SPLIT: split_dir = optarg; break;
		case O_ROWS: {
			char *e1, *e2 = "";
			errno = 0;
			row_a = strtoll(optarg, &e1, 10);
			row_b = *e1 == ':' ? strtoll(e1 + 1, &e2, 10) : 0;
			if (errno || optarg[0] < '0' || optarg[0] > '9' || *e1 != ':' || e1[1] < '0' || e1[1] > '9' ||
			    *e2 || row_a < 0 || row_b <= row_a)
				usage_error(usage, "--rows: '%s' is not A:B with 0 <= A < B", optarg);
			break;
		}
		case O_FUSE: {
			char *colon = strrchr(optarg, ':');
			if (!colon || colon == optarg)
				usage_error(usage, "--fuse: '%s' is not NAME:E", optarg);
			*colon = 0;
			fuse_name = optarg;
			fuse_e = parse_long(usage, "--fuse", colon + 1, 1, 1L << 20);
			break;
		}
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind >= argc)
		usage_error(usage, "missing SOURCE");
	const char *src = argv[optind++];
	npats = argc - optind;
	pats = argv + optind;
	hits = calloc(npats + 1, sizeof *hits);
	if (use_regex) {
		res = calloc(npats + 1, sizeof *res);
		for (int i = 0; i < npats; i++)
			if (regcomp(&res[i], pats[i], REG_EXTENDED | REG_NOSUB))
				usage_error(usage, "--regex: invalid regular expression '%s'", pats[i]);
	}
	int kind;
	if (x3_source_kind(src, &kind))
		die("%s", x3_errmsg());

	/* output: safetensors file/dir, a frame file, stdout, or a frame file
	 * per tensor */
	if (split_dir) {
		if (outp)
			usage_error(usage, "-o and --split exclude each other");
		if (shard_mb)
			usage_error(usage, "--shard-size needs -o DIR");
		struct stat sd;
		if (stat(split_dir, &sd) || !S_ISDIR(sd.st_mode))
			die("%s: not a directory (--split)", split_dir);
		split_zlevel = zlevel;
	}
	size_t ol = outp ? strlen(outp) : 0;
	struct stat st;
	int out_dir = outp && stat(outp, &st) == 0 && S_ISDIR(st.st_mode);
	if (outp && (out_dir || (ol > 12 && !strcmp(outp + ol - 12, ".safetensors")))) {
		if (zlevel)
			usage_error(usage, "--zstd applies to frame output, not safetensors");
		sw_path = outp;
		if (x3_stw_create(outp, out_dir ? (uint64_t)shard_mb << 20 : 0, &sw))
			die("%s", x3_errmsg());
		atexit(abort_sw);   /* a failed run leaves no spool file behind */
	} else if (!split_dir) {
		if (shard_mb)
			usage_error(usage, "--shard-size needs -o DIR");
		if (x3_writer_open_fd(output_open(outp), zlevel, &fw))
			die("%s", x3_errmsg());
	}

	if (fuse_name && (row_a >= 0 || split_dir))
		usage_error(usage, "--fuse excludes --rows and --split");
	if (to_dtype == X3_F8_E4M3 && (fuse_name || row_a >= 0 || split_dir))
		usage_error(usage, "--dtype F8_E4M3 excludes --fuse, --rows and --split");
	if (kind == X3_SRC_FRAMES)
		from_frames(src);
	else
		from_st(src);
	if (fuse_name) {
		if (!fuse_t)
			die("--fuse %s: no tensor selected", fuse_name);
		if (fuse_t->shape[0] % fuse_e)
			die("--fuse %s:%ld: %lld rows are not %ld equal parts", fuse_name, fuse_e,
			    (long long)fuse_t->shape[0], fuse_e);
		fuse_t->rank = 3;
		fuse_t->shape[2] = fuse_t->shape[1];
		fuse_t->shape[1] = fuse_t->shape[0] / fuse_e;
		fuse_t->shape[0] = fuse_e;
		x3_dtype dt = out_dtype(fuse_t->dtype);
		if (dt != fuse_t->dtype) {
			x3_tensor *c = x3_tensor_new(fuse_name, dt, 3, fuse_t->shape, 1);
			if (!c)
				die_x3("tensor '%s'", fuse_name);
			convert(c->data, dt, fuse_t->data, fuse_t->dtype, (size_t)x3_tensor_numel(fuse_t), fuse_name);
			x3_tensor_free(fuse_t);
			fuse_t = c;
		}
		emit_whole(fuse_t);
		x3_tensor_free(fuse_t);
	}

	for (int i = 0; i < npats; i++)
		if (!hits[i])
			die("%s: no tensor matches '%s'", src, pats[i]);
	if (sw) {
		x3_stw *w = sw;
		sw = NULL;   /* commit frees it, whatever the outcome */
		if (x3_stw_commit(w))
			die("%s", x3_errmsg());
	} else if (!split_dir) {
		if (x3_writer_close(fw))
			die("%s: %s", outp ? outp : "stdout", x3_errmsg());
		output_commit();
	}
	return 0;
}
