/* tokenize: text -> token-id frames (calibration rows, exl3(5) §10.1), token ids
 * as text lines (--ids), and ids back to text (--decode), with a Hugging
 * Face tokenizer.json (lib/text/tokenizer.h). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "frame.h"
#include "tokenizer.h"
#include "util.h"

static const char usage[] =
	"usage: tokenize -t TOKENIZER [--rows R] [--cols C] [--split whole|lines|blank]\n"
	"                [--pack articles|stream] [--bos|--no-bos] [--eos|--no-eos] [--even-odd]\n"
	"                [--keep-partial] [--pad ID] [--strict] [--name NAME] [-z LEVEL] [-q] [FILE...]\n"
	"       tokenize -t TOKENIZER --ids [--split MODE] [--bos|--no-bos] [--eos|--no-eos] [FILE...]\n"
	"       tokenize -t TOKENIZER --decode [--ids] [--skip-special] [FILE...]\n";

static const char help[] =
	"Text into calibration rows (a tokens frame, I32 rows x cols) with a model's\n"
	"Hugging Face tokenizer.json; --ids prints ids, --decode turns ids back into text.\n"
	"\n"
	"  -t TOKENIZER     tokenizer.json or a model directory (required)\n"
	"  --rows R         rows to write (default: as many as the text fills)\n"
	"  --cols C         tokens per row (default 2048)\n"
	"  --split MODE     documents: whole text, lines (default) or blank-line paragraphs\n"
	"  --pack MODE      articles (default) or stream: how documents become rows\n"
	"  --bos, --no-bos  BOS before every document (default yes)\n"
	"  --eos, --no-eos  EOS after every document (default no)\n"
	"  --even-odd       ExLlamaV3's rule: BOS and EOS on documents starting in even rows\n"
	"  --keep-partial   keep a final incomplete row, filled with --pad\n"
	"  --pad ID         the id that fills a kept partial row (default EOS, else 0)\n"
	"  --strict         fail when the text fills fewer than R rows\n"
	"  --name NAME      frame name (default tokens)\n"
	"  -z LEVEL         zstd-compress the output (1..22)\n"
	"  -q               no warning when the text fills fewer than R rows\n"
	"  --ids            print each document's ids on one line instead of frames\n"
	"  --decode         print each row of id frames (or, with --ids, id lines) as text\n"
	"  --skip-special   with --decode: leave out special tokens\n"
	"  -h               this help\n";

static char *read_all(FILE *f, const char *name, size_t *len)
{
	size_t cap = 1 << 16, n = 0, k;
	char *b = malloc(cap);
	if (!b) die("out of memory");
	while ((k = fread(b + n, 1, cap - n, f)) > 0) {
		n += k;
		if (n == cap && !(b = realloc(b, cap *= 2))) die("out of memory");
	}
	if (ferror(f)) die("%s: read error: %s", name, strerror(errno));
	*len = n;
	return b;
}

/* the whole text of all inputs, concatenated ("-" or none: stdin) */
static char *read_inputs(int n, char **files, size_t *len, char *src, size_t srclen)
{
	char *all = NULL;
	size_t total = 0;
	snprintf(src, srclen, "%s", n ? "" : "stdin");
	for (int i = 0; i < (n ? n : 1); i++) {
		const char *name = n ? files[i] : "-";
		int is_stdin = !strcmp(name, "-");
		FILE *f = is_stdin ? stdin : fopen(name, "rb");
		if (!f) die("%s: %s", name, strerror(errno));
		size_t k;
		char *b = read_all(f, is_stdin ? "stdin" : name, &k);
		if (!is_stdin) fclose(f);
		if (!(all = realloc(all, total + k + 2))) die("out of memory");
		memcpy(all + total, b, k);
		total += k;
		/* files are separate documents in every split mode but "whole" */
		if (k && all[total - 1] != '\n' && i + 1 < n) all[total++] = '\n';
		free(b);
		if (n) {
			size_t l = strlen(src);
			snprintf(src + l, srclen - l, "%s%s", l ? "," : "", is_stdin ? "stdin" : name);
		}
	}
	if (!all && !(all = malloc(1))) die("out of memory");
	*len = total;
	return all;
}

static void decode_ids(x3_tok *tok, const int32_t *ids, size_t n, int skip, const char *what)
{
	char *txt;
	size_t len;
	if (x3_tok_decode(tok, ids, n, skip, &txt, &len)) die_x3("%s", what);
	fwrite(txt, 1, len, stdout);
	putchar('\n');
	free(txt);
}

/* --decode --ids: lines of whitespace-separated ids -> one line of text each */
static void decode_text(x3_tok *tok, const char *name, FILE *f, int skip)
{
	char *line = NULL;
	size_t cap = 0, lineno = 0;
	ssize_t k;
	int32_t *ids = NULL;
	size_t icap = 0;
	while ((k = getline(&line, &cap, f)) >= 0) {
		size_t n = 0;
		char *p = line, *e;
		lineno++;
		for (;;) {
			while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
			if (!*p) break;
			errno = 0;
			long v = strtol(p, &e, 10);
			if (e == p || errno || v < 0 || v > INT32_MAX || (*e && !strchr(" \t\r\n", *e))) {
				size_t w = strcspn(p, " \t\r\n");   /* the word, not the rest of the line */
				die("%s: line %zu: bad token id '%.*s'", name, lineno, (int)(w > 20 ? 20 : w), p);
			}
			if (n == icap && !(ids = realloc(ids, (icap = icap ? 2 * icap : 256) * sizeof *ids))) die("out of memory");
			ids[n++] = (int32_t)v;
			p = e;
		}
		char what[64];
		snprintf(what, sizeof what, "%s: line %zu", name, lineno);
		decode_ids(tok, ids, n, skip, what);
	}
	if (ferror(f)) die("%s: read error: %s", name, strerror(errno));
	free(line);
	free(ids);
}

/* --decode: I32 (or I64) id frames -> one line of text per row */
static void decode_frames(x3_tok *tok, const char *name, int skip)
{
	x3_reader *r;
	x3_tensor *t;
	int rc;
	if (x3_reader_open(name, &r)) die_x3("%s", name);
	while ((rc = x3_reader_next(r, &t)) == X3_OK) {
		if ((t->dtype != X3_I32 && t->dtype != X3_I64) || t->rank < 1 || t->rank > 2)
			die("%s: frame '%s': want I32 or I64 ids of rank 1 or 2, got %s rank %d", name, t->name,
			    x3_dtype_name(t->dtype), t->rank);
		int64_t rows = t->rank == 2 ? t->shape[0] : 1, cols = t->shape[t->rank - 1];
		int32_t *ids = malloc((size_t)(cols ? cols : 1) * sizeof *ids);
		if (!ids) die("out of memory");
		for (int64_t i = 0; i < rows; i++) {
			for (int64_t j = 0; j < cols; j++) {
				int64_t v = t->dtype == X3_I32 ? ((int32_t *)t->data)[i * cols + j] : ((int64_t *)t->data)[i * cols + j];
				if (v < INT32_MIN || v > INT32_MAX) die("%s: frame '%s': id %lld out of range", name, t->name, (long long)v);
				ids[j] = (int32_t)v;
			}
			char what[300];
			snprintf(what, sizeof what, "%s: frame '%s' row %lld", name, t->name, (long long)i);
			decode_ids(tok, ids, (size_t)cols, skip, what);
		}
		free(ids);
		x3_tensor_free(t);
	}
	if (rc != X3_EOF) die_x3("%s", name);
	x3_reader_close(r);
}

static enum x3_tok_split parse_split(const char *s)
{
	if (!strcmp(s, "whole")) return X3_SPLIT_WHOLE;
	if (!strcmp(s, "lines")) return X3_SPLIT_LINES;
	if (!strcmp(s, "blank")) return X3_SPLIT_BLANK;
	usage_error(usage, "--split: want whole, lines or blank, not '%s'", s);
}

/* the command line */
struct opts {
	const char *tpath, *name;
	long rows, cols, pad, zlevel;     /* rows, pad: -1 when not given */
	int bos, eos;                     /* -1: the tokenizer's default */
	int even_odd, partial, strict, ids_mode, decode, skip;
	enum x3_tok_split split;
	enum x3_tok_pack_mode pack;
};

/* the options into o (exits on a bad one, and after --help), checked */
static void parse_options(int argc, char **argv, struct opts *o)
{
	enum { O_ROWS = 256, O_COLS, O_SPLIT, O_PACK, O_BOS, O_NOBOS, O_EOS, O_NOEOS, O_EVENODD, O_PARTIAL, O_PAD,
	       O_STRICT, O_NAME, O_IDS, O_DECODE, O_SKIP };
	static const struct option lo[] = {
		{ "tokenizer", required_argument, 0, 't' }, { "rows", required_argument, 0, O_ROWS },
		{ "cols", required_argument, 0, O_COLS }, { "split", required_argument, 0, O_SPLIT },
		{ "pack", required_argument, 0, O_PACK }, { "bos", no_argument, 0, O_BOS },
		{ "no-bos", no_argument, 0, O_NOBOS }, { "eos", no_argument, 0, O_EOS },
		{ "no-eos", no_argument, 0, O_NOEOS }, { "even-odd", no_argument, 0, O_EVENODD },
		{ "keep-partial", no_argument, 0, O_PARTIAL }, { "pad", required_argument, 0, O_PAD },
		{ "strict", no_argument, 0, O_STRICT }, { "name", required_argument, 0, O_NAME },
		{ "ids", no_argument, 0, O_IDS }, { "decode", no_argument, 0, O_DECODE },
		{ "skip-special", no_argument, 0, O_SKIP }, { "zstd", required_argument, 0, 'z' },
		{ "quiet", no_argument, 0, 'q' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 }
	};
	*o = (struct opts){
		.name = "tokens", .rows = -1, .cols = 2048, .pad = -1, .bos = -1, .eos = -1,
		.split = X3_SPLIT_LINES, .pack = X3_PACK_ARTICLES,
	};
	int c;
	while ((c = getopt_long(argc, argv, "t:z:qh", lo, NULL)) != -1) {
		switch (c) {
		case 't': o->tpath = optarg; break;
		case O_ROWS: o->rows = parse_long(usage, "--rows", optarg, 1, 1L << 24); break;
		case O_COLS: o->cols = parse_long(usage, "--cols", optarg, 1, 1L << 24); break;
		case O_SPLIT: o->split = parse_split(optarg); break;
		case O_PACK:
			if (!strcmp(optarg, "articles")) o->pack = X3_PACK_ARTICLES;
			else if (!strcmp(optarg, "stream")) o->pack = X3_PACK_STREAM;
			else usage_error(usage, "--pack: want articles or stream, not '%s'", optarg);
			break;
		case O_BOS: o->bos = 1; break;
		case O_NOBOS: o->bos = 0; break;
		case O_EOS: o->eos = 1; break;
		case O_NOEOS: o->eos = 0; break;
		case O_EVENODD: o->even_odd = 1; break;
		case O_PARTIAL: o->partial = 1; break;
		case O_PAD: o->pad = parse_long(usage, "--pad", optarg, 0, INT32_MAX); break;
		case O_STRICT: o->strict = 1; break;
		case O_NAME: o->name = optarg; break;
		case O_IDS: o->ids_mode = 1; break;
		case O_DECODE: o->decode = 1; break;
		case O_SKIP: o->skip = 1; break;
		case 'z': o->zlevel = parse_long(usage, "-z", optarg, 0, 22); break;
		case 'q': quiet = 1; break;
		case 'h': printf("%s\n%s", usage, help); exit(0);
		default: usage_error(usage, "bad option");
		}
	}
	if (!o->tpath) usage_error(usage, "no tokenizer: give -t tokenizer.json or a model directory");
	if (!*o->name) usage_error(usage, "--name: empty name");
	if (o->even_odd && (o->bos >= 0 || o->eos >= 0))
		usage_error(usage, "--even-odd decides BOS/EOS: drop --bos/--eos");
	int packing = o->rows >= 0 || o->even_odd || o->partial || o->strict || o->pad >= 0;
	if (o->decode && (packing || o->bos >= 0 || o->eos >= 0))
		usage_error(usage, "--decode takes only --ids and --skip-special");
	if (o->ids_mode && !o->decode && packing)
		usage_error(usage, "--ids writes whole documents: packing options do not apply");
	if (o->skip && !o->decode) usage_error(usage, "--skip-special applies to --decode");
}

/* --decode: the text of each FILE (stdin without any): frames of ids, or
 * with --ids lines of ids */
static void decode_files(x3_tok *tok, const struct opts *o, int nfiles, char **files)
{
	for (int i = 0; i < (nfiles ? nfiles : 1); i++) {
		const char *f = nfiles ? files[i] : "-";
		if (o->ids_mode) {
			FILE *fp = strcmp(f, "-") ? fopen(f, "rb") : stdin;
			if (!fp) die("%s: %s", f, strerror(errno));
			decode_text(tok, strcmp(f, "-") ? f : "stdin", fp, o->skip);
			if (fp != stdin) fclose(fp);
		} else
			decode_frames(tok, f, o->skip);
	}
}

/* the input text split into documents: the text at off[d], lens[d] long */
struct docs {
	char *text;
	size_t len, *off, *lens, n;
	char src[4096];                   /* the inputs' name, in messages */
};

/* --ids: each document's ids on a line (by default with the special
 * tokens the tokenizer adds itself) */
static void print_ids(x3_tok *tok, const struct opts *o, const struct docs *D)
{
	int bos = o->bos, eos = o->eos;
	for (size_t d = 0; d < D->n; d++) {
		int32_t *ids;
		size_t n;
		int plain = bos >= 0 || eos >= 0;
		if (x3_tok_encode(tok, D->text + D->off[d], D->lens[d], !plain, &ids, &n))
			die_x3("%s: document %zu", D->src, d + 1);
		if (bos > 0 && x3_tok_bos(tok) >= 0) printf("%d%s", (int)x3_tok_bos(tok), n || eos > 0 ? " " : "");
		for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
		if (eos > 0 && x3_tok_eos(tok) >= 0) printf("%s%d", n || bos > 0 ? " " : "", (int)x3_tok_eos(tok));
		putchar('\n');
		free(ids);
	}
}

/* The documents packed into rows of cols tokens (--rows of them, else as
 * many as the text fills), written as one frame with its metadata. */
static void write_rows(x3_tok *tok, const struct opts *o, const struct docs *D)
{
	refuse_tty_stdout();
	struct x3_tok_pack_opts po;
	x3_tok_pack_defaults(tok, &po);
	po.mode = o->pack;
	if (o->bos >= 0) po.bos = o->bos;
	if (o->eos >= 0) po.eos = o->eos;
	po.even_odd = o->even_odd;
	po.keep_partial = o->partial;
	if (o->pad >= 0) {
		if ((size_t)o->pad >= x3_tok_vocab_size(tok)) usage_error(usage, "--pad %ld: not a token id", o->pad);
		po.pad_id = (int32_t)o->pad;
	}
	long rows = o->rows, cols = o->cols;
	const char *src = D->src, *name = o->name;
	size_t ndocs = D->n;

	/* without --rows: as many rows as the text fills */
	size_t want = rows > 0 ? (size_t)rows : 0, got;
	int32_t *m;
	if (!want) {
		/* an upper bound: every byte a token, plus BOS/EOS per document */
		size_t bound = (2 * D->len + 4 * ndocs) / (size_t)cols + 2;
		want = o->pack == X3_PACK_ARTICLES && ndocs + 1 < bound ? ndocs + 1 : bound;
	}
	const char **docs = malloc((ndocs ? ndocs : 1) * sizeof *docs);
	if (!docs) die("out of memory");
	for (size_t d = 0; d < ndocs; d++) docs[d] = D->text + D->off[d];
	if (x3_tok_pack_rows(tok, docs, D->lens, ndocs, want, (size_t)cols, &po, &m, &got)) die_x3("%s", src);
	if (!got) die("%s: the text fills no row of %ld tokens (%zu documents)", src, cols, ndocs);
	if (rows > 0 && got < (size_t)rows) {
		if (o->strict) die("%s: the text fills only %zu of %ld rows of %ld tokens", src, got, rows, cols);
		if (!quiet)
			warnx("%s: the text fills only %zu of %ld rows of %ld tokens: writing %zu rows", src, got, rows, cols, got);
	}

	/* what was added: a tokenizer without BOS (Qwen) gets none by default */
	int hb = po.bos && x3_tok_bos(tok) >= 0, he = po.eos && x3_tok_eos(tok) >= 0;
	x3_tensor *t = x3_tensor_new2(name, X3_I32, (int64_t)got, cols);
	if (!t) die_x3("frame '%s'", name);
	memcpy(t->data, m, got * (size_t)cols * sizeof *m);
	static const char *splits[] = { "whole", "lines", "blank" };
	if (x3_meta_set(t, "role", "tokens") || x3_meta_setf(t, "rows", "%zu", got) ||
	    x3_meta_setf(t, "cols", "%ld", cols) || x3_meta_set(t, "tokenizer", o->tpath) ||
	    x3_meta_set(t, "tokenizer_kind", x3_tok_describe(tok)) || x3_meta_set(t, "source", src) ||
	    x3_meta_set(t, "split", splits[o->split]) ||
	    x3_meta_set(t, "pack", o->pack == X3_PACK_ARTICLES ? "articles" : "stream") ||
	    x3_meta_set(t, "special", o->even_odd ? "even-odd" : hb && he ? "bos,eos" : hb ? "bos" : he ? "eos" : "none") ||
	    x3_meta_setf(t, "bos_id", "%d", (int)x3_tok_bos(tok)) || x3_meta_setf(t, "eos_id", "%d", (int)x3_tok_eos(tok)) ||
	    x3_meta_setf(t, "documents", "%zu", ndocs))
		die_x3("frame '%s'", name);
	x3_writer *w;
	if (x3_writer_open_fd(1, (int)o->zlevel, &w) || x3_writer_put(w, t) || x3_writer_close(w))
		die_x3("frame '%s'", name);
	x3_tensor_free(t);
	free(m); free(docs);
}

int main(int argc, char **argv)
{
	struct opts o;
	prog_init(argc, argv);
	parse_options(argc, argv, &o);
	x3_tok *tok;
	if (x3_tok_load(o.tpath, &tok)) die("%s", x3_errmsg());

	int nfiles = argc - optind;
	char **files = argv + optind;
	if (o.decode) {
		decode_files(tok, &o, nfiles, files);
		x3_tok_free(tok);
		check_stdout();
		return 0;
	}

	struct docs D;
	D.text = read_inputs(nfiles, files, &D.len, D.src, sizeof D.src);
	if (x3_tok_split_docs(D.text, D.len, o.split, &D.off, &D.lens, &D.n)) die_x3("%s", D.src);
	if ((o.bos > 0 && x3_tok_bos(tok) < 0) || (o.eos > 0 && x3_tok_eos(tok) < 0))
		die("%s: the tokenizer has no %s token", o.tpath, o.eos > 0 && x3_tok_eos(tok) < 0 ? "EOS" : "BOS");
	if (o.ids_mode)
		print_ids(tok, &o, &D);
	else
		write_rows(tok, &o, &D);
	free(D.text); free(D.off); free(D.lens);
	x3_tok_free(tok);
	check_stdout();
	return 0;
}
