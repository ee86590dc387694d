/* tensor-ls: one JSON line per tensor (name, dtype, shape, bytes, metadata,
 * and with --stats min/max/mean/rms and NaN/Inf counts), for jq; with
 * --linears, --modules or --config, the description of a model from the
 * library's architecture table (arch.h): what a conversion encodes and
 * passes through, and its config. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <jansson.h>
#include <xxhash.h>
#include "arch.h"
#include "frame.h"
#include "linear.h"
#include "model.h"
#include "pack.h"
#include "safetensors.h"
#include "util.h"

static const char usage[] =
	"usage: tensor-ls [--stats] [--digest] [SOURCE...]\n"
	"       tensor-ls --linears|--modules|--config [--vision-bits N] MODEL\n"
	"       tensor-ls --architectures\n";
static int stats, digest;
static int vision_bits = 16;

/* the XXH3 128-bit digest as 32 hex digits (its canonical byte order) */
static void hex128(XXH128_hash_t h, char out[33])
{
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, h);
	for (int i = 0; i < 16; i++)
		snprintf(out + 2 * i, 3, "%02x", c.digest[i]);
}

struct acc { double min, max, sum, sq; int64_t n, nan, inf; };

static void acc_add(struct acc *a, const float *f, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float v = f[i];
		if (isnan(v)) { a->nan++; continue; }
		if (isinf(v)) { a->inf++; continue; }
		if (!a->n || v < a->min) a->min = v;
		if (!a->n || v > a->max) a->max = v;
		a->sum += v;
		a->sq += (double)v * v;
		a->n++;
	}
}

static void print_line(const x3_tensor *t, const char *src, const struct acc *a, const char *xxh)
{
	json_t *o = json_object(), *sh = json_array(), *m = json_object();
	json_object_set_new(o, "name", json_string(t->name));
	json_object_set_new(o, "dtype", json_string(x3_dtype_name(t->dtype)));
	for (int i = 0; i < t->rank; i++)
		json_array_append_new(sh, json_integer(t->shape[i]));
	json_object_set_new(o, "shape", sh);
	json_object_set_new(o, "bytes", json_integer((json_int_t)t->nbytes));
	for (int i = 0; i < t->nmeta; i++)
		json_object_set_new(m, t->meta[i].key, json_string(t->meta[i].val));
	json_object_set_new(o, "meta", m);
	json_object_set_new(o, "source", json_string(src));
	if (xxh)
		json_object_set_new(o, "xxh3", json_string(xxh));
	if (a) {
		json_t *s = json_object();
		json_object_set_new(s, "count", json_integer(a->n + a->nan + a->inf));
		json_object_set_new(s, "min", a->n ? json_real(a->min) : json_null());
		json_object_set_new(s, "max", a->n ? json_real(a->max) : json_null());
		json_object_set_new(s, "mean", a->n ? json_real(a->sum / a->n) : json_null());
		json_object_set_new(s, "rms", a->n ? json_real(sqrt(a->sq / a->n)) : json_null());
		json_object_set_new(s, "nan", json_integer(a->nan));
		json_object_set_new(s, "inf", json_integer(a->inf));
		json_object_set_new(o, "stats", s);
	}
	char *txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
	json_decref(o);
	if (!txt)
		die("cannot encode the line for '%s'", t->name);
	puts(txt);
	free(txt);
}

#define CH (1u << 16)

static void ls_frames(const char *path)
{
	x3_reader *r;
	if (x3_reader_open(path, &r))
		die("%s", x3_errmsg());
	unsigned char *raw = malloc(CH * 8);
	float *f = malloc(CH * sizeof *f);
	for (;;) {
		x3_tensor *t;
		int rc = x3_reader_next_header(r, &t);
		if (rc == X3_EOF)
			break;
		if (rc)
			die("%s", x3_errmsg());
		struct acc a = {0};
		size_t es = x3_dtype_size(t->dtype), n = (size_t)x3_tensor_numel(t);
		XXH3_state_t *h = digest ? XXH3_createState() : NULL;
		if (digest && (!h || XXH3_128bits_reset(h) != XXH_OK))
			die("out of memory");
		for (size_t i = 0; i < n; i += CH) {
			size_t k = n - i < CH ? n - i : CH;
			if (!stats && !digest)
				break;
			if (x3_reader_data(r, raw, k * es))
				die("%s", x3_errmsg());
			if (h)
				XXH3_128bits_update(h, raw, k * es);
			if (stats) {
				x3_convert(f, X3_F32, raw, t->dtype, k);
				acc_add(&a, f, k);
			}
		}
		if (x3_reader_skip(r))   /* verifies the checksum without --stats too */
			die("%s", x3_errmsg());
		char xxh[33];
		if (h) {
			hex128(XXH3_128bits_digest(h), xxh);
			XXH3_freeState(h);
		}
		print_line(t, path, stats ? &a : NULL, h ? xxh : NULL);
		x3_tensor_free(t);
	}
	free(raw);
	free(f);
	x3_reader_close(r);
}

static void ls_st(const char *path)
{
	x3_st *s;
	if (x3_st_open(path, &s))
		die("%s", x3_errmsg());
	float *f = malloc(CH * sizeof *f);
	for (int i = 0; i < x3_st_count(s); i++) {
		const x3_tensor *t = x3_st_get(s, i);
		struct acc a = {0};
		size_t es = x3_dtype_size(t->dtype), n = (size_t)x3_tensor_numel(t);
		for (size_t j = 0; stats && j < n; j += CH) {
			size_t k = n - j < CH ? n - j : CH;
			x3_convert(f, X3_F32, (const char *)t->data + j * es, t->dtype, k);
			acc_add(&a, f, k);
		}
		char xxh[33];
		if (digest)
			hex128(XXH3_128bits(t->data, t->nbytes), xxh);
		print_line(t, x3_st_file(s, i), stats ? &a : NULL, digest ? xxh : NULL);
	}
	free(f);
	x3_st_close(s);
}

/* --digest of a model directory: after its tensors, one line per file a
 * conversion reads beside them (config.json, and the files pack-write
 * copies: tokenizer, generation config, ...), in name order: file, bytes,
 * xxh3 */
static void put_json(json_t *o, const char *what);

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void digest_files(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		die("%s: %s", dir, strerror(errno));
	char **names = NULL;
	size_t n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		const char *why;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (strcmp(e->d_name, "config.json") && !x3_pack_copies(e->d_name, &why))
			continue;
		if (!(names = realloc(names, (n + 1) * sizeof *names)) || !(names[n++] = strdup(e->d_name)))
			die("out of memory");
	}
	closedir(d);
	qsort(names, n, sizeof *names, name_cmp);
	XXH3_state_t *h = XXH3_createState();
	char *buf = malloc(1 << 20);
	if (!h || !buf)
		die("out of memory");
	for (size_t i = 0; i < n; i++) {
		char p[8192];
		struct stat st;
		snprintf(p, sizeof p, "%s/%s", dir, names[i]);
		if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
			free(names[i]);
			continue;   /* not a file pack-write copies (a directory, a FIFO) */
		}
		int fd = open(p, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			die("%s: %s", p, strerror(errno));
		XXH3_128bits_reset(h);
		long long bytes = 0;
		for (;;) {
			ssize_t k = read(fd, buf, 1 << 20);
			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0)
				die("%s: read error: %s", p, strerror(errno));
			if (k == 0)
				break;
			XXH3_128bits_update(h, buf, (size_t)k);
			bytes += k;
		}
		close(fd);
		char xxh[33];
		hex128(XXH3_128bits_digest(h), xxh);
		json_t *o = json_object();
		json_object_set_new(o, "file", json_string(names[i]));
		json_object_set_new(o, "bytes", json_integer(bytes));
		json_object_set_new(o, "xxh3", json_string(xxh));
		put_json(o, names[i]);
		free(names[i]);
	}
	XXH3_freeState(h);
	free(buf);
	free(names);
}

static void help(void)
{
	printf("%s", usage);
	printf("Prints one JSON line per tensor of each SOURCE (frames, - for stdin, the\n"
	       "default; a .safetensors file; a model directory): name, dtype, shape,\n"
	       "bytes, meta, source.\n"
	       "  --stats      add stats: count, min, max, mean, rms, nan, inf\n"
	       "  --digest     add xxh3: the XXH3 128-bit digest of the tensor's bytes\n"
	       "               (32 hex digits); for a model directory, also one line\n"
	       "               per file a conversion reads beside the tensors\n"
	       "               (config.json and the files pack-write copies): file,\n"
	       "               bytes, xxh3\n"
	       "  --linears    the linears of MODEL from its architecture's description:\n"
	       "               key, weight, shape, padded, group, layer, role, hq, bias,\n"
	       "               tied, one line each in model order; rows [first, end)\n"
	       "               when the weight is rows of a fused tensor (Phi3)\n"
	       "  --modules    every module of MODEL (linears, norms, embedding), with\n"
	       "               kind and quantized\n"
	       "  --config     MODEL's config.json as the toolkit reads it, one line\n"
	       "  --vision-bits N\n"
	       "               with --linears, --modules, --config: the vision tower's\n"
	       "               linears are modules of role vision (encoded at N, 1..8;\n"
	       "               16, the default, passes the tower through), as\n"
	       "               exl3-convert --vision-bits N describes the model (a pack\n"
	       "               says it in quantization_config.vision_bits)\n"
	       "  --architectures\n"
	       "               every architecture the toolkit converts: architecture,\n"
	       "               model_type, family, moe, one line each\n"
	       "With --linears or --modules, the tensors of a MODEL that is not EXL3 are\n"
	       "checked against the description (present, float, shape).\n");
}

/* ---- the description of a model (--linears, --modules, --config) ------ */

static void put_json(json_t *o, const char *what)
{
	char *txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(o);
	if (!txt)
		die("cannot encode the line for '%s'", what);
	puts(txt);
	free(txt);
}

static const char *kind_name(int k)
{
	return k == X3_KIND_LINEAR ? "linear" : k == X3_KIND_VECTOR ? "vector" :
	       k == X3_KIND_MATRIX ? "matrix" : k == X3_KIND_CONV ? "conv" : "embedding";
}

/* A module's tensors in a model that is not quantized: its weight (float,
 * the description's shape) and, where the description says, its bias. */
static void check_module(const char *dir, x3_st *st, const x3_module *m)
{
	char key[X3_KEY_MAX + 8];
	int vec = m->d->kind == X3_KIND_VECTOR;
	/* a vector, or a linear or an embedding table: a dense (out, in)
	 * weight; a row slice: the fused source (src_rows, in) */
	const x3_tensor *w = x3_st_find(st, m->weight);
	/* an expert of a fused 3-D (experts, rows, in) tensor: the config's
	 * shapes were checked on load (arch.h x3_arch_fused_scan) */
	if (m->fused && w && w->rank == 3 && w->shape[0] * w->shape[1] == m->src_rows && w->shape[2] == m->in)
		return;
	/* a depthwise conv1d: (channels, 1, kernel) */
	if (m->d->kind == X3_KIND_CONV) {
		char b[64];
		if (!(w && w->rank == 3 && w->shape[0] == m->out && w->shape[1] == 1 && w->shape[2] == m->in &&
		      (w->dtype == X3_F32 || w->dtype == X3_F16 || w->dtype == X3_BF16)))
			die("%s: tensor '%s': %s, config says %lldx1x%lld (channels x 1 x kernel)", dir, m->weight,
			    w ? x3_shape_str(w, b, sizeof b) : "missing", (long long)m->out, (long long)m->in);
		return;
	}
	if (x3_tensor_check_float(w, m->weight, vec ? 1 : 2, m->src_rows, m->in)) {
		if (m->sliced)
			die("%s: %s (a fused tensor: linear '%s' is its rows %lld..%lld)", dir, x3_errmsg(), m->key,
			    (long long)m->row0, (long long)(m->row0 + m->out));
		die("%s: %s", dir, x3_errmsg());
	}
	if (!vec && m->bias && !m->tied) {
		snprintf(key, sizeof key, "%.*s.bias", (int)(strlen(m->weight) - 7), m->weight);
		if (x3_tensor_check_float(x3_st_find(st, key), key, 1, m->src_rows, 0))
			die("%s: %s", dir, x3_errmsg());
	}
}

static void describe(const char *dir, int what)
{
	x3_model_config c;
	if (x3_config_load_as(dir, X3_CONFIG_LAYOUT, &c))
		die("%s", x3_errmsg());
	if (vision_bits != 16 && x3_config_vision(&c, vision_bits))
		die("%s: %s", dir, x3_errmsg());
	x3_module *m;
	int n;
	if (x3_arch_modules(&c, &m, &n))
		die("%s: %s", dir, x3_errmsg());
	if (what == 'c') {
		json_t *o = json_object();
		int nlin = 0;
		for (int i = 0; i < n; i++)
			nlin += m[i].d->kind == X3_KIND_LINEAR;
		json_object_set_new(o, "architecture", json_string(c.arch_name));
		json_object_set_new(o, "model_type", json_string(c.desc->model_type));
		json_object_set_new(o, "layers", json_integer(c.n_layers));
		json_object_set_new(o, "hidden", json_integer(c.hidden));
		json_object_set_new(o, "intermediate", json_integer(c.intermediate));
		json_object_set_new(o, "heads", json_integer(c.n_heads));
		json_object_set_new(o, "kv_heads", json_integer(c.n_kv_heads));
		json_object_set_new(o, "head_size", json_integer(x3_arch_dim(&c, X3_DIM_HEAD_DIM)));
		json_object_set_new(o, "vocab", json_integer(c.vocab));
		json_object_set_new(o, "max_position_embeddings", json_integer(c.max_pos));
		json_object_set_new(o, "forward_chunk", json_integer(x3_config_chunk_tokens(&c)));
		json_object_set_new(o, "experts_per_token", json_integer(c.n_experts > 0 ? c.n_experts_tok : 0));
		json_object_set_new(o, "tied", json_boolean(c.tied));
		json_object_set_new(o, "quantized", json_boolean(c.quantized));
		json_object_set_new(o, "modules", json_integer(n));
		json_object_set_new(o, "linears", json_integer(nlin));
		put_json(o, dir);
		free(m);
		return;
	}
	if (!c.quantized) {
		x3_st *st;
		if (x3_st_open(dir, &st))
			die("%s", x3_errmsg());
		for (int i = 0; i < n; i++)
			check_module(dir, st, &m[i]);
		x3_st_close(st);
	}
	for (int i = 0; i < n; i++) {
		const x3_module *d = &m[i];
		int lin = d->d->kind == X3_KIND_LINEAR;
		if (what == 'l' && !lin)
			continue;
		json_t *o = json_object(), *sh = json_array();
		json_object_set_new(o, "key", json_string(d->key));
		json_object_set_new(o, "weight", json_string(d->weight));
		if (d->sliced) {
			/* the weight is these rows of WEIGHT (a fused checkpoint) */
			json_t *r = json_array();
			json_array_append_new(r, json_integer(d->row0));
			json_array_append_new(r, json_integer(d->row0 + d->out));
			json_object_set_new(o, "rows", r);
		}
		if (what == 'm') {
			json_object_set_new(o, "kind", json_string(kind_name(d->d->kind)));
			json_object_set_new(o, "quantized", json_boolean(lin));
		}
		json_array_append_new(sh, json_integer(d->out));
		if (d->d->kind != X3_KIND_VECTOR)
			json_array_append_new(sh, json_integer(d->in));
		json_object_set_new(o, "shape", sh);
		if (lin) {
			json_t *pd = json_array();
			json_array_append_new(pd, json_integer(x3_pack_pad128(d->out)));
			json_array_append_new(pd, json_integer(x3_pack_pad128(d->in)));
			json_object_set_new(o, "padded", pd);
			json_object_set_new(o, "group", json_string(d->group));
			if (d->tie[0])
				json_object_set_new(o, "tied_group", json_string(d->tie));
		}
		json_object_set_new(o, "layer", json_integer(d->layer));
		json_object_set_new(o, "role", json_string(x3_role_name(d->d->role)));
		if (d->expert >= 0)
			json_object_set_new(o, "expert", json_integer(d->expert));
		if (lin)
			json_object_set_new(o, "hq", json_integer(d->d->hq));
		json_object_set_new(o, "bias", json_boolean(d->bias));
		json_object_set_new(o, "tied", json_boolean(d->tied));
		put_json(o, d->key);
	}
	free(m);
}

/* --architectures: the table itself */
static void architectures(void)
{
	for (int i = 0; i < x3_arch_count(); i++) {
		const x3_arch_desc *a = x3_arch_get(i);
		json_t *o = json_object();
		json_object_set_new(o, "architecture", json_string(a->name));
		json_object_set_new(o, "model_type", json_string(a->model_type));
		json_object_set_new(o, "family", json_string(a->family));
		json_object_set_new(o, "moe", json_boolean(a->flags & X3_AF_MOE));
		put_json(o, a->name);
	}
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	static const struct option lo[] = {{"stats", no_argument, 0, 's'}, {"digest", no_argument, 0, 'd'},
		{"linears", no_argument, 0, 'l'}, {"modules", no_argument, 0, 'm'},
		{"config", no_argument, 0, 'c'}, {"architectures", no_argument, 0, 'a'},
		{"vision-bits", required_argument, 0, 'V'},
		{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int c, what = 0, vb_set = 0;
	while ((c = getopt_long(argc, argv, "sh", lo, NULL)) != -1) {
		switch (c) {
		case 's': stats = 1; break;
		case 'd': digest = 1; break;
		case 'l': case 'm': case 'c': case 'a':
			if (what && what != c)
				usage_error(usage, "--linears, --modules, --config and --architectures exclude each other");
			what = c;
			break;
		case 'V':
			vision_bits = (int)parse_long(usage, "--vision-bits", optarg, 1, 16);
			if (vision_bits > 8 && vision_bits != 16)
				usage_error(usage, "--vision-bits: '%s' is not 1..8 or 16", optarg);
			vb_set = 1;
			break;
		case 'h': help(); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (vb_set && (what == 0 || what == 'a'))
		usage_error(usage, "--vision-bits describes a MODEL (--linears, --modules, --config)");
	if (what == 'a') {
		if (stats || digest || optind != argc)
			usage_error(usage, "--architectures takes no SOURCE and no --stats or --digest");
		architectures();
		check_stdout();
		return 0;
	}
	if (what) {
		if (stats || digest)
			usage_error(usage, "--stats and --digest list tensors, not a model's description");
		if (optind + 1 != argc)
			usage_error(usage, "--linears, --modules and --config take one MODEL directory");
		describe(argv[optind], what);
		check_stdout();
		return 0;
	}
	char *dflt[] = {"-"};
	char **srcs = optind < argc ? argv + optind : dflt;
	int ns = optind < argc ? argc - optind : 1;
	for (int i = 0; i < ns; i++) {
		int kind;
		if (x3_source_kind(srcs[i], &kind))
			die("%s", x3_errmsg());
		if (kind == X3_SRC_FRAMES)
			ls_frames(srcs[i]);
		else
			ls_st(srcs[i]);
		struct stat st;
		if (digest && kind != X3_SRC_FRAMES && stat(srcs[i], &st) == 0 && S_ISDIR(st.st_mode))
			digest_files(srcs[i]);
	}
	check_stdout();
	return 0;
}
