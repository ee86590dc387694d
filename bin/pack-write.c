/* pack-write: assemble an EXL3 model directory (spec §2) from the frames
 * of a conversion on stdin plus the source model directory.
 *
 * The directory is built under OUT.tmp-XXXXXX beside OUT and renamed into
 * place when complete, so OUT never exists half-written. Frames may come
 * in any order: payloads are spooled to a file in the temporary directory
 * and written out in model order at the end. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <jansson.h>
#include "util.h"
#include "codec.h"
#include "frame.h"
#include "pack.h"
#include "safetensors.h"

static const char usage[] =
	"usage: pack-write --model SRC [--passthrough] [--shard-size MB] [--plan PLAN]\n"
	"                  [--bits B] [--head-bits N] [--codebook mul1|mcg|3inst]\n"
	"                  [--cal-rows R] [--cal-cols C] [--out-scales always|never|auto]\n"
	"                  [--force] [-q] OUT < frames\n";

static void help(void)
{
	printf("%s", usage);
	printf("Writes the EXL3 model directory OUT from the frames on stdin (quantized\n"
	       "linears: <key>.trellis/.suh/.svh[/.mcg|.mul1][/.bias]; pass-through\n"
	       "tensors under their own names) and the source model directory SRC.\n"
	       "  --model SRC       source HF model directory (config.json, tokenizer, ...)\n"
	       "  --passthrough     take every tensor missing from the stream that is not a\n"
	       "                    quantized linear (embedding, norms, biases, a 16-bit head)\n"
	       "                    from SRC\n"
	       "  --shard-size MB   maximum shard size (default 8192; 0 = one file)\n"
	       "  --plan PLAN       bitalloc plan: every K must match it; head_bits from it\n"
	       "  --bits B          bits written to the config (default: computed from the\n"
	       "                    trellis widths, numel-weighted over the decoder linears)\n"
	       "  --head-bits N     1..8 or 16; 16 with --passthrough stores SRC's lm_head\n"
	       "                    as F16 .weight (default: from the head in the stream)\n"
	       "  --codebook C      codebook written to the config (default: the most used)\n"
	       "  --cal-rows R      calibration rows for the config (default 250)\n"
	       "  --cal-cols C      calibration columns for the config (default 2048)\n"
	       "  --out-scales S    out_scales for the config (default always)\n"
	       "  --force           replace an existing OUT (atomically)\n"
	       "  -q                no warnings about skipped files\n");
}

/* ---- the temporary directory, removed on any failure ------------------- */

static char tmpdir[4096];
static int tmpdir_fd = -1;

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb; (void)ftw;
	return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static int rm_tree(const char *p)
{
	return nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void cleanup(void)
{
	if (tmpdir[0]) {
		rm_tree(tmpdir);
		tmpdir[0] = 0;
	}
}

/* Async-signal-safe removal of the (flat) temporary directory. */
struct linux_dirent64 {
	unsigned long long d_ino;
	long long d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

static void on_signal(int sig)
{
	if (tmpdir[0] && tmpdir_fd >= 0) {
		char buf[4096];
		for (int pass = 0; pass < 64; pass++) {
			long n = syscall(SYS_getdents64, tmpdir_fd, buf, sizeof buf);
			if (n <= 0)
				break;
			for (long o = 0; o < n;) {
				struct linux_dirent64 *d = (struct linux_dirent64 *)(buf + o);
				if (strcmp(d->d_name, ".") && strcmp(d->d_name, ".."))
					unlinkat(tmpdir_fd, d->d_name, 0);
				o += d->d_reclen;
			}
			lseek(tmpdir_fd, 0, SEEK_SET);
		}
		rmdir(tmpdir);
	}
	signal(sig, SIG_DFL);
	raise(sig);
}

static int full_write(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t k = write(fd, c, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -1;
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

/* Write a file inside the temporary directory (fsynced). */
static void put_file(const char *name, const void *buf, size_t n)
{
	int fd = openat(tmpdir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
	if (fd < 0)
		die("%s/%s: %s", tmpdir, name, strerror(errno));
	if (full_write(fd, buf, n) || fsync(fd) || close(fd))
		die("writing %s/%s: %s", tmpdir, name, strerror(errno));
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		die("%s: %s", path, strerror(errno));
	char *buf = NULL;
	size_t cap = 0, n = 0;
	for (;;) {
		if (n + 65536 + 1 > cap) {
			cap = 2 * cap + 65536 + 1;
			if (!(buf = realloc(buf, cap)))
				die("out of memory");
		}
		size_t k = fread(buf + n, 1, cap - n - 1, f);
		n += k;
		if (k == 0)
			break;
	}
	if (ferror(f))
		die("%s: read error: %s", path, strerror(errno));
	fclose(f);
	buf[n] = 0;
	if (len)
		*len = n;
	return buf;
}

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

/* Copy the non-weight files of SRC (spec §2.3). */
static void copy_files(const char *src)
{
	DIR *d = opendir(src);
	if (!d)
		die("%s: %s", src, strerror(errno));
	struct dirent *e;
	while ((e = readdir(d))) {
		const char *n = e->d_name;
		char p[4096];
		struct stat st;
		if (!strcmp(n, ".") || !strcmp(n, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", src, n);
		if (stat(p, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		if (ends_with(n, ".safetensors") || !strcmp(n, "config.json") ||
		    !strcmp(n, "model.safetensors.index.json") || !strcmp(n, "quantization_config.json"))
			continue;
		/* a quantized source's own quantization config: GPTQModel reads
		 * quantize_config.json, then quant_config.json, before config.json;
		 * ours replaces the first, the second would describe weights that
		 * are no longer there (config.json nests it as
		 * original_quantization_config) */
		if (!strcmp(n, "quantize_config.json") || !strcmp(n, "quant_config.json")) {
			if (!quiet)
				warnx("warning: not copying '%s' (the source's quantization config)", n);
			continue;
		}
		if (ends_with(n, ".bin") || ends_with(n, ".ckpt") || ends_with(n, ".pth") || ends_with(n, ".pt")) {
			if (!quiet)
				warnx("warning: not copying '%s' (weights in another format)", n);
			continue;
		}
		int in = open(p, O_RDONLY | O_CLOEXEC);
		if (in < 0)
			die("%s: %s", p, strerror(errno));
		int out = openat(tmpdir_fd, n, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
		if (out < 0)
			die("%s/%s: %s", tmpdir, n, strerror(errno));
		char buf[1 << 16];
		for (;;) {
			ssize_t k = read(in, buf, sizeof buf);
			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0)
				die("%s: read error: %s", p, strerror(errno));
			if (k == 0)
				break;
			if (full_write(out, buf, (size_t)k))
				die("writing %s/%s: %s", tmpdir, n, strerror(errno));
		}
		if (fsync(out) || close(out))
			die("writing %s/%s: %s", tmpdir, n, strerror(errno));
		close(in);
	}
	closedir(d);
}

/* Remove OUT.tmp-* directories beside OUT left by a pack-write that died
 * (kill -9): they hold a pid file naming a process that no longer runs. */
static void remove_stale(const char *dir, const char *base)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	char pre[4096];
	snprintf(pre, sizeof pre, "%s.tmp-", base);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, pre, strlen(pre)))
			continue;
		char p[8192];
		snprintf(p, sizeof p, "%s/%s/.pack-write.pid", dir, e->d_name);
		FILE *f = fopen(p, "r");
		long pid = 0;
		if (!f)
			continue;
		if (fscanf(f, "%ld", &pid) != 1)
			pid = 0;
		fclose(f);
		if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
			snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
			if (rm_tree(p) == 0 && !quiet)
				warnx("removed '%s' left by an interrupted run", p);
		}
	}
	closedir(d);
}

/* ---- tensors ------------------------------------------------------------ */

enum { P_TRELLIS, P_SUH, P_SVH, P_MCG, P_MUL1, P_BIAS, P_WEIGHT, P_COUNT };
static const char *const part_name[P_COUNT] = {"trellis", "suh", "svh", "mcg", "mul1", "bias", "weight"};

struct ent {
	x3_tensor *t;            /* output header (name, dtype, shape, nbytes) */
	const x3_tensor *src;    /* SRC tensor (pass-through), or NULL */
	x3_tensor *in;           /* stream header, or NULL */
	uint64_t off;            /* spool offset of a stream payload */
	long module, rank;
};

static struct ent *ents;
static int nent, cap_ent;
static unsigned char *spool_map;

static struct ent *new_ent(void)
{
	if (nent == cap_ent) {
		cap_ent = cap_ent ? 2 * cap_ent : 256;
		if (!(ents = realloc(ents, (size_t)cap_ent * sizeof *ents)))
			die("out of memory");
	}
	memset(&ents[nent], 0, sizeof *ents);
	return &ents[nent++];
}

/* Output header of dtype dt and shape (rank, shape). */
static x3_tensor *out_header(const char *name, x3_dtype dt, int rank, const int64_t *shape)
{
	x3_tensor *t = x3_tensor_new(name, dt, rank, shape, 0);
	if (!t)
		die_x3("tensor '%s'", name);
	return t;
}

/* Problems found by the completeness check: all are listed, then exit 1. */
static int nprob;
static void problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void problem(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (nprob < 200)
		warnx("%s", buf);
	nprob++;
}

static int is_float(x3_dtype t)
{
	return t == X3_F64 || t == X3_F32 || t == X3_F16 || t == X3_BF16;
}

/* Stored dtype of a pass-through tensor: F32 and F64 become F16 (ExLlamaV3
 * loads floats as F16 anyway, and its safetensors reader knows only F32,
 * F16, BF16, I32 and I16: loader/safetensors.py, convert_dtype). */
static x3_dtype passthrough_dtype(x3_dtype t)
{
	return t == X3_F32 || t == X3_F64 ? X3_F16 : t;
}

/* dtypes ExLlamaV3's safetensors reader accepts (convert_dtype) */
static int exllamav3_dtype(x3_dtype t)
{
	return t == X3_F32 || t == X3_F16 || t == X3_BF16 || t == X3_I32 || t == X3_I16;
}

static int ent_cmp(const void *a, const void *b)
{
	const struct ent *x = a, *y = b;
	if (x->module != y->module)
		return x->module < y->module ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return strcmp(x->t->name, y->t->name);
}

/* The payload of e in its output dtype/shape; *owned set when allocated. */
static void *materialize(const struct ent *e, int *owned)
{
	const void *p;
	x3_dtype st;
	int64_t n;
	if (e->src) {
		p = e->src->data;
		st = e->src->dtype;
		n = x3_tensor_numel(e->src);
	} else {
		p = spool_map + e->off;
		st = e->in->dtype;
		n = x3_tensor_numel(e->in);
	}
	*owned = 0;
	if (st == e->t->dtype && (size_t)n * x3_dtype_size(st) == e->t->nbytes)
		return (void *)p;
	/* dtype conversion and/or zero padding (bias to n) */
	unsigned char *buf = calloc(1, e->t->nbytes ? e->t->nbytes : 1);
	if (!buf)
		die("tensor '%s': out of memory", e->t->name);
	if (st == X3_F64 && e->t->dtype != X3_F32) {   /* via F32 */
		float *f = malloc((size_t)n * sizeof *f + 1);
		if (!f)
			die("tensor '%s': out of memory", e->t->name);
		if (x3_convert(f, X3_F32, p, st, (size_t)n) || x3_convert(buf, e->t->dtype, f, X3_F32, (size_t)n))
			die_x3("tensor '%s'", e->t->name);
		free(f);
	} else if (x3_convert(buf, e->t->dtype, p, st, (size_t)n))
		die_x3("tensor '%s'", e->t->name);
	*owned = 1;
	return buf;
}

/* Legal by the spec, but what the loaders checked in pack-write(1),
 * COMPATIBILITY, trip over: warnings only. */
static void loader_warnings(const char *cfg_text, const char *path, const x3_pack_linear *lin, int nlin)
{
	json_t *o = json_loads(cfg_text, 0, NULL);
	json_t *a = o ? json_object_get(o, "architectures") : NULL;
	if (!json_is_array(a) || json_array_size(a) != 1 || !json_is_string(json_array_get(a, 0)))
		warnx("warning: %s: no single \"architectures\" entry; ExLlamaV3 "
		      "(Config.from_directory) and transformers need one", path);
	json_decref(o);
	int odd = 0, first = -1;
	for (int j = 0; j < nlin; j++)
		if (lin[j].in % 128 || lin[j].out % 128) {
			odd++;
			if (first < 0)
				first = j;
		}
	if (odd)
		warnx("warning: %d linear%s with a size that is not a multiple of 128 (first '%s', "
		      "%lldx%lld): stored zero-padded to 128 as the format requires; GPTQModel sizes its "
		      "EXL3 modules from the unpadded model and cannot run %s; older ExLlamaV3 "
		      "versions refuse padded inputs except in down_proj", odd, odd > 1 ? "s" : "", lin[first].key,
		      (long long)lin[first].out, (long long)lin[first].in, odd > 1 ? "them" : "it");
}

static const char *cb_name(int cb)
{
	return cb == X3_CB_MUL1 ? "mul1" : cb == X3_CB_MCG ? "mcg" : "3inst";
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	enum { O_MODEL = 256, O_PASS, O_SHARD, O_PLAN, O_BITS, O_HEAD, O_CB, O_CR, O_CC, O_OS, O_FORCE };
	static const struct option lo[] = {
		{"model", required_argument, 0, O_MODEL},
		{"passthrough", no_argument, 0, O_PASS},
		{"shard-size", required_argument, 0, O_SHARD},
		{"plan", required_argument, 0, O_PLAN},
		{"bits", required_argument, 0, O_BITS},
		{"head-bits", required_argument, 0, O_HEAD},
		{"codebook", required_argument, 0, O_CB},
		{"cal-rows", required_argument, 0, O_CR},
		{"cal-cols", required_argument, 0, O_CC},
		{"out-scales", required_argument, 0, O_OS},
		{"force", no_argument, 0, O_FORCE},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	const char *src = NULL, *plan_path = NULL, *codebook = NULL, *out_scales = "always";
	int passthrough = 0, force = 0;
	double shard_mb = 8192, bits_opt = NAN;
	long head_opt = 0, cal_rows = 250, cal_cols = 2048;
	int c;
	while ((c = getopt_long(argc, argv, "hq", lo, NULL)) != -1) {
		switch (c) {
		case 'h': help(); return 0;
		case 'q': quiet = 1; break;
		case O_MODEL: src = optarg; break;
		case O_PASS: passthrough = 1; break;
		case O_SHARD: shard_mb = parse_double(usage, "--shard-size", optarg, 0, 1e9); break;
		case O_PLAN: plan_path = optarg; break;
		case O_BITS: bits_opt = parse_double(usage, "--bits", optarg, 1, 16); break;
		case O_HEAD:
			head_opt = parse_long(usage, "--head-bits", optarg, 1, 16);
			if (head_opt > 8 && head_opt != 16)
				usage_error(usage, "--head-bits: %ld is not 1..8 or 16", head_opt);
			break;
		case O_CB:
			if (strcmp(optarg, "mul1") && strcmp(optarg, "mcg") && strcmp(optarg, "3inst"))
				usage_error(usage, "--codebook: '%s' is not mul1, mcg or 3inst", optarg);
			codebook = optarg;
			break;
		case O_CR: cal_rows = parse_long(usage, "--cal-rows", optarg, 0, 1L << 30); break;
		case O_CC: cal_cols = parse_long(usage, "--cal-cols", optarg, 0, 1L << 30); break;
		case O_OS:
			if (strcmp(optarg, "always") && strcmp(optarg, "never") && strcmp(optarg, "auto"))
				usage_error(usage, "--out-scales: '%s' is not always, never or auto", optarg);
			out_scales = optarg;
			break;
		case O_FORCE: force = 1; break;
		default: usage_error(usage, "bad option");
		}
	}
	if (!src)
		usage_error(usage, "--model SRC is required");
	if (optind + 1 != argc)
		usage_error(usage, optind == argc ? "missing OUT" : "more than one OUT");
	if (isatty(STDIN_FILENO))
		usage_error(usage, "expects the frames of a conversion on stdin");

	/* OUT, its directory and base name */
	char out[4096], dir[4096], base[1024];
	snprintf(out, sizeof out, "%s", argv[optind]);
	for (size_t l = strlen(out); l > 1 && out[l - 1] == '/'; l--)
		out[l - 1] = 0;
	const char *sl = strrchr(out, '/');
	if (sl) {
		snprintf(dir, sizeof dir, "%.*s", sl == out ? 1 : (int)(sl - out), out);
		snprintf(base, sizeof base, "%s", sl + 1);
	} else {
		snprintf(dir, sizeof dir, ".");
		snprintf(base, sizeof base, "%s", out);
	}
	if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
		usage_error(usage, "OUT '%s' is not a usable directory name", out);
	struct stat st;
	int out_exists = lstat(out, &st) == 0;
	if (out_exists && !force)
		die("%s: exists (use --force to replace it)", out);

	/* source model */
	char path[8192];
	snprintf(path, sizeof path, "%s/config.json", src);
	char *cfg_text = slurp(path, NULL);
	x3_pack_arch arch;
	if (x3_pack_arch_parse(cfg_text, &arch))
		die("%s: %s", path, x3_errmsg());
	x3_pack_linear *lin;
	int nlin;
	if (x3_pack_linears(&arch, &lin, &nlin))
		die_x3("architecture");
	if (!quiet)
		loader_warnings(cfg_text, path, lin, nlin);
	x3_st *sst;
	if (x3_st_open(src, &sst))
		die_x3("%s", src);

	/* plan */
	x3_pack_plan plan = {.K = NULL, .head_bits = 0, .bits = NAN};
	if (plan_path) {
		/* slurp: a missing file or a directory says so, not "line -1" */
		char *pt = slurp(plan_path, NULL);
		if (x3_pack_plan_parse(pt, plan_path, lin, nlin, &plan))
			die("%s (in %s)", x3_errmsg(), src);
		free(pt);
		/* the plan's head_bits, except for a tied model whose plan has
		 * no lm_head entry (then no head is stored) */
		int has_head = 0;
		for (int j = 0; j < nlin; j++)
			has_head |= lin[j].layer < 0 && plan.K[j];
		if (!head_opt && plan.head_bits && (!arch.tied || has_head))
			head_opt = plan.head_bits;
	}

	/* temporary directory beside OUT */
	remove_stale(dir, base);
	if (snprintf(tmpdir, sizeof tmpdir, "%s/%s.tmp-XXXXXX", dir, base) >= (int)sizeof tmpdir)
		die("%s: path too long", out);
	if (!mkdtemp(tmpdir)) {
		int e = errno;
		tmpdir[0] = 0;
		die("%s: cannot create a temporary directory: %s", dir, strerror(e));
	}
	atexit(cleanup);
	{
		/* mkdtemp makes 0700; the finished directory gets 0777 & ~umask */
		mode_t um = umask(022);
		umask(um);
		chmod(tmpdir, 0777 & ~um);
	}
	if ((tmpdir_fd = open(tmpdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		die("%s: %s", tmpdir, strerror(errno));
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESETHAND;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	{
		char pid[32];
		int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
		put_file(".pack-write.pid", pid, (size_t)n);
	}

	/* 1. spool the stream */
	int spool = openat(tmpdir_fd, ".pack-spool", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (spool < 0)
		die("%s/.pack-spool: %s", tmpdir, strerror(errno));
	x3_reader *rd;
	if (x3_reader_open_fd(STDIN_FILENO, "stdin", 0, &rd))
		die_x3("stdin");
	x3_tensor **in = NULL;
	uint64_t *inoff = NULL, spool_len = 0;
	int nin = 0, capin = 0, rc;
	size_t bufsz = 1 << 20;
	unsigned char *buf = malloc(bufsz);
	if (!buf)
		die("out of memory");
	x3_tensor *t;
	while ((rc = x3_reader_next_header(rd, &t)) == X3_OK) {
		for (int i = 0; i < nin; i++)
			if (!strcmp(in[i]->name, t->name))
				die("stdin: frame %ld: tensor '%s' appears twice", x3_reader_index(rd), t->name);
		if (nin == capin) {
			capin = capin ? 2 * capin : 256;
			in = realloc(in, (size_t)capin * sizeof *in);
			inoff = realloc(inoff, (size_t)capin * sizeof *inoff);
			if (!in || !inoff)
				die("out of memory");
		}
		in[nin] = t;
		inoff[nin++] = spool_len;
		for (size_t left = t->nbytes; left;) {
			size_t k = left < bufsz ? left : bufsz;
			if (x3_reader_data(rd, buf, k))
				die("%s", x3_errmsg());   /* names stdin, frame and tensor */
			if (full_write(spool, buf, k))
				die("spooling tensor '%s' to %s: %s", t->name, tmpdir, strerror(errno));
			left -= k;
		}
		spool_len += t->nbytes;
		progress("%d frames read", nin);
	}
	if (rc != X3_EOF)
		die("%s", x3_errmsg());
	x3_reader_close(rd);
	free(buf);
	progress_done();
	if (spool_len) {
		spool_map = mmap(NULL, spool_len, PROT_READ, MAP_SHARED, spool, 0);
		if (spool_map == MAP_FAILED)
			die("mmap of the spool: %s", strerror(errno));
	}

	/* 2. classify the stream's tensors */
	const x3_tensor *(*part)[P_COUNT] = calloc((size_t)nlin, sizeof *part);
	int *used = calloc((size_t)(nin ? nin : 1), sizeof *used);
	if (!part || !used)
		die("out of memory");
	int head = nlin - 1;
	for (int i = 0; i < nin; i++) {
		const char *name = in[i]->name, *dot = strrchr(name, '.');
		if (!dot)
			continue;
		for (int j = 0; j < nlin; j++) {
			size_t kl = strlen(lin[j].key);
			if (strncmp(name, lin[j].key, kl) || name + kl != dot)
				continue;
			int p;
			for (p = 0; p < P_COUNT; p++)
				if (!strcmp(dot + 1, part_name[p]))
					break;
			if (p == P_COUNT)
				problem("tensor '%s': not a tensor of an EXL3 linear (trellis, suh, svh, mcg, "
				        "mul1, bias; legacy su/sv are not written)", name);
			else
				part[j][p] = in[i];
			used[i] = 1;
			break;
		}
	}
	/* payloads of the marker scalars, for their check */
	for (int i = 0; i < nin; i++)
		if (used[i] && in[i]->nbytes <= 8 && in[i]->nbytes)
			in[i]->data = spool_map + inoff[i];

	/* 3. linears */
	double sum_k = 0, sum_n = 0;
	int cb_count[X3_CB_COUNT] = {0}, head_bits = 0, any_q = 0;
#define STREAM_ENT(tensor) do { \
	int ii_; for (ii_ = 0; ii_ < nin && in[ii_] != (tensor); ii_++) ; \
	e->in = in[ii_]; e->off = inoff[ii_]; } while (0)
	for (int j = 0; j < nlin; j++) {
		const x3_pack_linear *L = &lin[j];
		const x3_tensor **P = part[j];
		int is_head = j == head;
		int has_q = P[P_TRELLIS] || P[P_SUH] || P[P_SVH] || P[P_MCG] || P[P_MUL1];
		char bname[160];
		snprintf(bname, sizeof bname, "%s.bias", L->key);
		const x3_tensor *sbias = x3_st_find(sst, bname);
		int64_t bias_len = 0;
		if (has_q && P[P_WEIGHT]) {
			problem("linear '%s': both quantized tensors and an unquantized .weight", L->key);
			continue;
		}
		if (has_q) {
			int K, cb;
			if (x3_pack_check_exl3(L->key, L->in, L->out, P[P_TRELLIS], P[P_SUH], P[P_SVH],
			                       P[P_MCG], P[P_MUL1], &K, &cb)) {
				problem("%s", x3_errmsg());
				continue;
			}
			int64_t mk;
			if (x3_meta_get_i64(P[P_TRELLIS], "K", &mk) == X3_OK && mk != K)
				problem("tensor '%s': metadata K=%lld but the shape says K=%d",
				        P[P_TRELLIS]->name, (long long)mk, K);
			/* a missing marker would silently decode as 3INST */
			const char *mcb = x3_meta_get(P[P_TRELLIS], "codebook");
			if (mcb && strcmp(mcb, cb_name(cb)))
				problem("linear '%s': the trellis metadata says codebook %s, the stream has %s",
				        L->key, mcb, cb == X3_CB_3INST ? "no marker (3inst)" : cb_name(cb));
			if (plan.K && plan.K[j] && plan.K[j] != K)
				problem("linear '%s': K=%d in the stream, the plan says %d", L->key, K, plan.K[j]);
			if (is_head) {
				head_bits = K;
			} else {
				sum_k += (double)L->in * (double)L->out * K;
				sum_n += (double)L->in * (double)L->out;
				cb_count[cb]++;
				any_q = 1;
			}
			const int parts[5] = {P_TRELLIS, P_SUH, P_SVH, P_MCG, P_MUL1};
			for (int q = 0; q < 5; q++) {
				const x3_tensor *s = P[parts[q]];
				if (!s)
					continue;
				struct ent *e = new_ent();
				e->t = out_header(s->name, s->dtype, s->rank, s->shape);
				STREAM_ENT(s);
			}
			bias_len = x3_pack_pad128(L->out);
		} else if (P[P_WEIGHT]) {
			const x3_tensor *w = P[P_WEIGHT];
			if (!is_head) {
				problem("linear '%s': stored unquantized (.weight); only the head may be 16-bit",
				        L->key);
				continue;
			}
			int64_t shp[2] = {L->out, L->in};
			if (w->rank != 2 || w->shape[0] != L->out || w->shape[1] != L->in || !is_float(w->dtype)) {
				char s[64];
				problem("tensor '%s': %s %s, expected a float %lldx%lld", w->name,
				        x3_dtype_name(w->dtype), x3_shape_str(w, s, sizeof s),
				        (long long)L->out, (long long)L->in);
				continue;
			}
			struct ent *e = new_ent();
			e->t = out_header(w->name, X3_F16, 2, shp);
			STREAM_ENT(w);
			head_bits = 16;
			bias_len = L->out;
		} else if (is_head && arch.tied && (head_opt == 0 || head_opt == 16)) {
			/* Tied, no quantized head: store lm_head.weight, an F16 copy of
			 * the embedding, as ExLlamaV3's converter does (it clones the
			 * head from model.embed_tokens). Its own loader would fall back
			 * to the embedding, but its transformers integration unties the
			 * embeddings and would leave a missing head random. */
			static const char en[] = "model.embed_tokens.weight";
			const x3_tensor *emb = NULL;
			int ii;
			for (ii = 0; ii < nin && strcmp(in[ii]->name, en); ii++)
				;
			if (ii < nin)
				emb = in[ii];
			else if (passthrough)
				emb = x3_st_find(sst, en);
			if (!emb)
				continue;   /* reported missing with the pass-through tensors */
			if (emb->rank != 2 || emb->shape[0] != L->out || emb->shape[1] != L->in || !is_float(emb->dtype)) {
				char sh[64];
				problem("tensor '%s': %s %s, expected a float %lldx%lld (it is also the tied head)", en,
				        x3_dtype_name(emb->dtype), x3_shape_str(emb, sh, sizeof sh),
				        (long long)L->out, (long long)L->in);
				continue;
			}
			int64_t shp[2] = {L->out, L->in};
			struct ent *e = new_ent();
			e->t = out_header("lm_head.weight", X3_F16, 2, shp);
			if (ii < nin) {
				e->in = in[ii];
				e->off = inoff[ii];
			} else {
				e->src = emb;
			}
			head_bits = 16;
			bias_len = L->out;
		} else if (is_head && head_opt == 16) {
			char wn[160];
			snprintf(wn, sizeof wn, "%s.weight", L->key);
			const x3_tensor *w = x3_st_find(sst, wn);
			if (!passthrough || !w) {
				problem("missing tensor '%s' (--head-bits 16: give it on stdin%s)", wn,
				        w ? " or use --passthrough" : "");
				continue;
			}
			int64_t shp[2] = {L->out, L->in};
			if (w->rank != 2 || w->shape[0] != L->out || w->shape[1] != L->in || !is_float(w->dtype)) {
				problem("tensor '%s' in %s: not a float %lldx%lld", wn, src,
				        (long long)L->out, (long long)L->in);
				continue;
			}
			struct ent *e = new_ent();
			e->t = out_header(wn, X3_F16, 2, shp);
			e->src = w;
			head_bits = 16;
			bias_len = L->out;
		} else {
			problem("missing linear '%s' (%s.trellis, .suh, .svh)%s", L->key, L->key,
			        is_head ? "; for an unquantized head use --head-bits 16 --passthrough" : "");
			continue;
		}
		/* bias: present in SRC => required; stream bias without one in SRC is stray */
		if (P[P_BIAS]) {
			const x3_tensor *b = P[P_BIAS];
			if (!sbias)
				problem("tensor '%s': %s has no such bias", b->name, src);
			else if (b->rank != 1 || !is_float(b->dtype) ||
			         (b->shape[0] != L->out && b->shape[0] != bias_len))
				problem("tensor '%s': expected a float vector of %lld", b->name, (long long)bias_len);
			else {
				struct ent *e = new_ent();
				e->t = out_header(b->name, X3_F16, 1, &bias_len);
				STREAM_ENT(b);
			}
		} else if (sbias) {
			if (!passthrough)
				problem("missing tensor '%s' (in %s; give it on stdin or use --passthrough)", bname, src);
			else if (sbias->rank != 1 || sbias->shape[0] != L->out || !is_float(sbias->dtype))
				problem("tensor '%s' in %s: expected a float vector of %lld", bname, src, (long long)L->out);
			else {
				struct ent *e = new_ent();
				e->t = out_header(bname, X3_F16, 1, &bias_len);
				e->src = sbias;
			}
		}
	}

	/* 4. pass-through tensors: every SRC tensor that is not a linear's */
	for (int i = 0; i < nin; i++) {
		if (used[i])
			continue;
		const x3_tensor *s = x3_st_find(sst, in[i]->name);
		if (!s) {
			problem("stray tensor '%s' (not a linear of the architecture and not in %s)",
			        in[i]->name, src);
			continue;
		}
		int same = s->rank == in[i]->rank;
		for (int d = 0; same && d < s->rank; d++)
			same = s->shape[d] == in[i]->shape[d];
		if (!same) {
			char a[64], b[64];
			problem("tensor '%s': shape %s, but %s in %s", in[i]->name,
			        x3_shape_str(in[i], a, sizeof a), x3_shape_str(s, b, sizeof b), src);
			continue;
		}
		struct ent *e = new_ent();
		x3_dtype dt = passthrough_dtype(in[i]->dtype);
		e->t = out_header(in[i]->name, dt, in[i]->rank, in[i]->shape);
		e->in = in[i];
		e->off = inoff[i];
		used[i] = 1;
	}
	for (int i = 0; i < x3_st_count(sst); i++) {
		const x3_tensor *s = x3_st_get(sst, i);
		const char *name = s->name, *dot = strrchr(name, '.');
		int is_lin = 0;
		for (int j = 0; j < nlin && dot && !is_lin; j++) {
			size_t kl = strlen(lin[j].key);
			is_lin = !strncmp(name, lin[j].key, kl) && name + kl == dot;
		}
		if (is_lin || ends_with(name, "rotary_emb.inv_freq"))
			continue;
		int have = 0;
		for (int k = 0; k < nin && !have; k++)
			have = !strcmp(in[k]->name, name);
		if (have)
			continue;
		if (!passthrough) {
			problem("missing tensor '%s' (in %s; give it on stdin or use --passthrough)", name, src);
			continue;
		}
		struct ent *e = new_ent();
		x3_dtype dt = passthrough_dtype(s->dtype);
		e->t = out_header(name, dt, s->rank, s->shape);
		e->src = s;
	}

	/* what the loaders would trip over, but the spec allows: warnings */
	for (int i = 0; i < nent && !quiet; i++)
		if (!exllamav3_dtype(ents[i].t->dtype))
			warnx("warning: tensor '%s': dtype %s, which ExLlamaV3 cannot read (F32, F16, BF16, "
			      "I32, I16)", ents[i].t->name, x3_dtype_name(ents[i].t->dtype));

	/* 5. config values */
	if (head_opt && head_bits && head_opt != head_bits)
		problem("head: %d bits in the stream, but %s says %ld", head_bits,
		        plan_path ? "the plan/--head-bits" : "--head-bits", head_opt);
	if (!head_bits)
		head_bits = head_opt ? (int)head_opt : 16;   /* tied, no head stored */
	if (nprob)
		die("%d problem%s; nothing written", nprob, nprob > 1 ? "s" : "");
	double bits = sum_n > 0 ? sum_k / sum_n : 0;
	if (!isnan(bits_opt)) {
		if (fabs(bits_opt - bits) > 0.005)
			warnx("warning: --bits %g, but the trellis widths give %.4f", bits_opt, bits);
		bits = bits_opt;
	} else if (!isnan(plan.bits) && fabs(plan.bits - bits) > 0.005) {
		warnx("warning: the plan says %.4f bits, the trellis widths give %.4f", plan.bits, bits);
	}
	if (!codebook) {
		int best = X3_CB_MUL1;
		for (int k = 0; k < X3_CB_COUNT; k++)
			if (cb_count[k] > cb_count[best])
				best = k;
		codebook = cb_name(best);
	}
	int mixed = 0;
	for (int k = 0; k < X3_CB_COUNT; k++)
		mixed += cb_count[k] > 0;
	if (mixed > 1 && !quiet)
		warnx("note: the linears use %d different codebooks (legal); config says '%s'", mixed, codebook);
	(void)any_q;

	/* 6. write the tensors in model order */
	for (int i = 0; i < nent; i++)
		x3_pack_order(ents[i].t->name, &ents[i].module, &ents[i].rank);
	qsort(ents, (size_t)nent, sizeof *ents, ent_cmp);
	x3_stw *w;
	uint64_t shard_bytes = (uint64_t)(shard_mb * 1024 * 1024);
	if (shard_mb > 0 && shard_bytes == 0)
		shard_bytes = 1;
	if (x3_stw_create(tmpdir, shard_bytes, &w))
		die_x3("%s", out);
	long module = -1;
	for (int i = 0; i < nent; i++) {
		struct ent *e = &ents[i];
		if (e->module != module) {
			x3_stw_module(w);
			module = e->module;
		}
		int owned;
		e->t->data = materialize(e, &owned);
		rc = x3_stw_add(w, e->t);
		if (owned)
			free(e->t->data);
		e->t->data = NULL;
		if (rc) {
			x3_stw_abort(w);
			die("%s: %s", out, x3_errmsg());
		}
#ifdef FALLOC_FL_PUNCH_HOLE
		if (e->in && e->in->nbytes > (1 << 20)) {   /* copied: give the spool space back */
			int later = 0;   /* unless a later tensor copies it too (a tied head) */
			for (int j = i + 1; j < nent && !later; j++)
				later = ents[j].in == e->in;
			if (!later)
				fallocate(spool, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)e->off,
				          (off_t)e->in->nbytes);
		}
#endif
	}
	if (spool_map)
		munmap(spool_map, spool_len);
	close(spool);
	unlinkat(tmpdir_fd, ".pack-spool", 0);
	if (x3_stw_commit(w))
		die("%s: %s", out, x3_errmsg());

	/* 7. config.json, quantization_config.json, other files */
	x3_pack_qcfg q = {
		.bits = bits, .head_bits = head_bits, .cal_rows = (int)cal_rows, .cal_cols = (int)cal_cols,
		.out_scales = out_scales, .codebook = codebook, .version = "1.4.1",
	};
	char *txt;
	if (x3_pack_config_json(cfg_text, &q, &txt))
		die("%s: %s", path, x3_errmsg());
	put_file("config.json", txt, strlen(txt));
	free(txt);
	x3_tensor **hdr = malloc((size_t)(nent ? nent : 1) * sizeof *hdr);
	if (!hdr)
		die("out of memory");
	for (int i = 0; i < nent; i++)
		hdr[i] = ents[i].t;
	if (x3_pack_qconfig_json(&q, hdr, nent, &txt))
		die_x3("quantization_config.json");
	put_file("quantization_config.json", txt, strlen(txt));
	free(txt);
	if (x3_pack_gptqmodel_json(&q, hdr, nent, &txt))
		die_x3("quantize_config.json");
	put_file("quantize_config.json", txt, strlen(txt));
	free(txt);
	free(hdr);
	copy_files(src);
	unlinkat(tmpdir_fd, ".pack-write.pid", 0);
	if (fsync(tmpdir_fd))
		die("fsync %s: %s", tmpdir, strerror(errno));

	/* 8. into place: exchange with an existing OUT, or a no-replace rename */
	if (out_exists) {
		if (renameat2(AT_FDCWD, tmpdir, AT_FDCWD, out, RENAME_EXCHANGE) != 0) {
			/* filesystem without exchange: move the old one aside first */
			char old[4200];
			snprintf(old, sizeof old, "%s.old-%ld", out, (long)getpid());
			if (rename(out, old) != 0)
				die("%s: cannot move the old directory aside: %s", out, strerror(errno));
			if (rename(tmpdir, out) != 0) {
				int e = errno;
				rename(old, out);
				die("%s: rename: %s", out, strerror(e));
			}
			snprintf(tmpdir, sizeof tmpdir, "%s", old);
		}
		/* tmpdir now names the old OUT; cleanup() removes it */
	} else {
		if (renameat2(AT_FDCWD, tmpdir, AT_FDCWD, out, RENAME_NOREPLACE) != 0) {
			if (errno != EINVAL && errno != ENOSYS)
				die("%s: rename: %s", out, strerror(errno));
			if (rename(tmpdir, out) != 0)
				die("%s: rename: %s", out, strerror(errno));
		}
		tmpdir[0] = 0;
	}
	close(tmpdir_fd);
	tmpdir_fd = -1;
	/* the rename is durable only once the directory is synced: a failure
	 * is an error (OUT is complete, but may not survive a crash) */
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		if (fsync(dfd) && errno != EINVAL) {
			int e = errno;
			cleanup();
			die("fsync %s: %s (%s is written, but may not survive a crash)", dir, strerror(e), out);
		}
		close(dfd);
	}
	cleanup();
	if (!quiet)
		fprintf(stderr, "%s: wrote %s: %d tensors, %.4f bits (head %d), codebook %s\n",
		        progname, out, nent, bits, head_bits, codebook);
	for (int i = 0; i < nent; i++)
		x3_tensor_free(ents[i].t);
	free(ents);
	for (int i = 0; i < nin; i++) {
		in[i]->data = NULL;
		x3_tensor_free(in[i]);
	}
	free(in); free(inoff); free(part); free(used); free(lin); free(cfg_text);
	x3_pack_plan_free(&plan);
	x3_st_close(sst);
	return 0;
}
