/* pack-write: assemble an EXL3 model directory (exl3(5) §2) from the frames
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
#include "reader.h"
#include "safetensors.h"

static const char usage[] =
	"usage: pack-write --model SRC [--passthrough] [--shard-size MB] [--plan PLAN]\n"
	"                  [--bits B] [--head-bits N] [--codebook mul1|mcg|3inst]\n"
	"                  [--cal-rows R] [--cal-cols C] [--out-scales always|never|auto]\n"
	"                  [--vision-bits N] [--check READER] [--force] [-q] OUT < frames\n";

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
	       "  --vision-bits N   the vision tower's linears are EXL3 in the stream, all at\n"
	       "                    K=N (1..8; quantization_config.vision_bits N); 16, the\n"
	       "                    default, passes the tower through from SRC\n"
	       "  --check READER    before OUT is put in place, check it against what READER\n"
	       "                    requires to load it (exllamav3, gptqmodel, strict; auto:\n"
	       "                    exllamav3 where it loads the architecture; none): a\n"
	       "                    violation fails, naming the tensor and rule, and writes\n"
	       "                    nothing (default none; exl3-info --check)\n"
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

/* Write a file inside the temporary directory (fsynced). */
static void put_file(const char *name, const void *buf, size_t n)
{
	int fd = openat(tmpdir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
	if (fd < 0)
		die("%s/%s: %s", tmpdir, name, strerror(errno));
	if (x3_write_full(fd, buf, n) || fsync(fd) || close(fd))
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

/* Copy the non-weight files of SRC (exl3(5) §2.1). */
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
		const char *why;
		if (!x3_pack_copies(n, &why)) {
			if (why && !quiet)
				warnx("warning: not copying '%s' (%s)", n, why);
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
			if (x3_write_full(out, buf, (size_t)k))
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

/* dtypes ExLlamaV3's safetensors reader accepts (convert_dtype) */
static int exllamav3_dtype(x3_dtype t)
{
	return t == X3_F32 || t == X3_F16 || t == X3_BF16 || t == X3_I32 || t == X3_I16;
}

static int ent_cmp(const void *a, const void *b)
{
	const struct ent *x = a, *y = b;
	return x3_pack_cmp(x->module, x->rank, x->t->name, y->module, y->rank, y->t->name);
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
	if (e->src && e->src->scale_inv) {   /* FP8 block-scaled: dequantized */
		float *f = x3_tensor_f32(e->src);
		if (!f || x3_convert(buf, e->t->dtype, f, X3_F32, (size_t)n))
			die_x3("tensor '%s'", e->t->name);
		free(f);
	} else if (st == X3_F64 && e->t->dtype != X3_F32) {   /* via F32 */
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

/* Legal EXL3, but what the loaders of exl3(5) §8 trip over: warnings
 * only. */
static void loader_warnings(const char *cfg_text, const char *path, const x3_module *mods, int nmods)
{
	json_t *o = json_loads(cfg_text, 0, NULL);
	json_t *a = o ? json_object_get(o, "architectures") : NULL;
	if (!json_is_array(a) || json_array_size(a) != 1 || !json_is_string(json_array_get(a, 0)))
		warnx("warning: %s: no single \"architectures\" entry; ExLlamaV3 "
		      "(Config.from_directory) and transformers need one", path);
	json_decref(o);
	int odd = 0, first = -1;
	for (int j = 0; j < nmods; j++)
		if (mods[j].d->kind == X3_KIND_LINEAR && (mods[j].in % 128 || mods[j].out % 128)) {
			odd++;
			if (first < 0)
				first = j;
		}
	if (odd)
		warnx("warning: %d linear%s not a multiple of 128 (first '%s', %lldx%lld), stored padded: "
		      "GPTQModel cannot run %s (pack-write(1), COMPATIBILITY)", odd, odd > 1 ? "s" : "",
		      mods[first].key, (long long)mods[first].out, (long long)mods[first].in,
		      odd > 1 ? "them" : "it");
}

static const char *cb_name(int cb)
{
	return cb == X3_CB_MUL1 ? "mul1" : cb == X3_CB_MCG ? "mcg" : "3inst";
}

/* ---- the steps of main ------------------------------------------------- */

/* OUT split into its directory and base name */
struct outname {
	char out[4096], dir[4096], base[1024];
	int exists;
};

static void out_vs_source(const struct outname *o, const char *src);

static void out_name(const char *arg, const char *src, int force, struct outname *o)
{
	snprintf(o->out, sizeof o->out, "%s", arg);
	for (size_t l = strlen(o->out); l > 1 && o->out[l - 1] == '/'; l--)
		o->out[l - 1] = 0;
	const char *sl = strrchr(o->out, '/');
	if (sl) {
		snprintf(o->dir, sizeof o->dir, "%.*s", sl == o->out ? 1 : (int)(sl - o->out), o->out);
		snprintf(o->base, sizeof o->base, "%s", sl + 1);
	} else {
		snprintf(o->dir, sizeof o->dir, ".");
		snprintf(o->base, sizeof o->base, "%s", o->out);
	}
	if (!*o->base || !strcmp(o->base, ".") || !strcmp(o->base, ".."))
		usage_error(usage, "OUT '%s' is not a usable directory name", o->out);
	out_vs_source(o, src);
	struct stat st;
	o->exists = lstat(o->out, &st) == 0;
	if (o->exists && !force)
		die("%s: exists (use --force to replace it)", o->out);
}

/* OUT is never the source model, a directory inside it or one that holds
 * it (--force would replace the model with the pack, or delete it with the
 * old OUT): compared by device and inode along both paths, whatever their
 * spelling (symbolic links, "..", a bind mount). A usage error, exit 2. */
static int same_file(const char *p, const struct stat *b)
{
	struct stat st;
	return stat(p, &st) == 0 && st.st_dev == b->st_dev && st.st_ino == b->st_ino;
}

/* does PATH or one of its ancestors (by its real path) name B? */
static int at_or_below(const char *path, const struct stat *b)
{
	char *r = realpath(path, NULL);
	if (!r)
		return 0;
	int hit = 0;
	for (char *sl;;) {
		if ((hit = same_file(r, b)))
			break;
		if (!(sl = strrchr(r, '/')) || (sl == r && !r[1]))
			break;
		sl[sl == r] = 0;   /* "/a" -> "/", "/a/b" -> "/a" */
	}
	free(r);
	return hit;
}

static void out_vs_source(const struct outname *o, const char *src)
{
	struct stat ss, os;
	if (stat(src, &ss) != 0)
		return;   /* reading the model says what is wrong with it */
	const char *what = NULL;
	if (stat(o->out, &os) == 0 && same_file(src, &os))
		what = "is";
	else if (at_or_below(stat(o->out, &os) == 0 ? o->out : o->dir, &ss))
		what = "is inside";
	else if (stat(o->out, &os) == 0 && at_or_below(src, &os))
		what = "holds";
	if (what) {
		warnx("OUT %s %s the source model %s: refused (write the pack elsewhere)", o->out, what, src);
		exit(2);
	}
}

/* The temporary directory beside OUT, removed on any failure or signal,
 * with a pid file that marks it as ours while we run. */
static void open_tmpdir(const struct outname *o)
{
	remove_stale(o->dir, o->base);
	if (snprintf(tmpdir, sizeof tmpdir, "%s/%s.tmp-XXXXXX", o->dir, o->base) >= (int)sizeof tmpdir)
		die("%s: path too long", o->out);
	if (!mkdtemp(tmpdir)) {
		int e = errno;
		tmpdir[0] = 0;
		die("%s: cannot create a temporary directory: %s", o->dir, strerror(e));
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
	char pid[32];
	int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
	put_file(".pack-write.pid", pid, (size_t)n);
}

/* the stream's tensors: headers, and their payloads at spool_map + inoff */
static x3_tensor **in;
static uint64_t *inoff, spool_len;
static int nin, spool_fd = -1;

/* 1. Spool the stream: frames come in any order, so their payloads wait in
 * the temporary directory (written once) until the layout is known. */
static void read_stream(void)
{
	spool_fd = openat(tmpdir_fd, ".pack-spool", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (spool_fd < 0)
		die("%s/.pack-spool: %s", tmpdir, strerror(errno));
	x3_reader *rd;
	if (x3_reader_open_fd(STDIN_FILENO, "stdin", 0, &rd))
		die_x3("stdin");
	int capin = 0, rc;
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
			if (x3_write_full(spool_fd, buf, k))
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
		spool_map = mmap(NULL, spool_len, PROT_READ, MAP_SHARED, spool_fd, 0);
		if (spool_map == MAP_FAILED)
			die("mmap of the spool: %s", strerror(errno));
	}
	/* payloads of the marker scalars, for their check */
	for (int i = 0; i < nin; i++)
		if (in[i]->nbytes <= 8 && in[i]->nbytes)
			in[i]->data = spool_map + inoff[i];
}

/* 2.-4. Classify the stream's tensors, check the linears, add the
 * pass-through tensors (x3_pack_classify, the model description's job):
 * the entries of the output, or every problem listed and exit 1. */
static void classify(const x3_pack_in *pin, const char *out, x3_pack_layout *lay)
{
	if (x3_pack_classify(pin, lay))
		die_x3("%s", out);
	for (int i = 0; i < lay->nprob && i < 200; i++)
		warnx("%s", lay->prob[i]);
	nprob = lay->nprob;
	if (lay->skipped && !quiet && pin->cfg->n_mtp)
		warnx("note: %d tensors of %s's multi-token prediction layer left out (copies of the "
		      "embedding and the head)", lay->skipped, pin->src_name);
	else if (lay->skipped && !quiet && pin->cfg->hybrid)
		warnx("note: %d tensors of %s's multi-token prediction layer (mtp.*) left out", lay->skipped,
		      pin->src_name);
	else if (lay->skipped && !quiet)
		warnx("note: %d tensors of %s's layers from %lld on (multi-token prediction) left out",
		      lay->skipped, pin->src_name, (long long)pin->cfg->n_layers);
	for (int i = 0; i < lay->nent; i++) {
		const x3_pack_ent *le = &lay->ent[i];
		struct ent *e = new_ent();
		e->t = le->t;
		e->src = le->src;
		if (le->in >= 0) {
			e->in = in[le->in];
			e->off = inoff[le->in];
		}
		lay->ent[i].t = NULL;   /* now ents[]'s */
	}
	if (!quiet) {
		for (int i = 0; i < lay->nfallback; i++)
			warnx("warning: linear '%s' was quantized without error feedback (fallback): %s",
			      lay->fallback_key[i], lay->fallback_why[i]);
		/* what the loaders would trip over, but EXL3 allows: warnings */
		for (int i = 0; i < nent; i++)
			if (!exllamav3_dtype(ents[i].t->dtype))
				warnx("warning: tensor '%s': dtype %s, which ExLlamaV3 cannot read (F32, F16, "
				      "BF16, I32, I16)", ents[i].t->name, x3_dtype_name(ents[i].t->dtype));
	}
}

/* 5. The config's values: bits, head bits, codebook; a mismatch with the
 * options or the plan is a problem (then nothing is written). */
struct values {
	double bits;
	int head_bits;
	const char *codebook;
};

static void config_values(const x3_pack_layout *lay, long head_opt, double bits_opt,
                          const x3_pack_plan *plan, const char *plan_path, const char *codebook,
                          struct values *v)
{
	v->head_bits = lay->head_bits;
	if (head_opt && v->head_bits && head_opt != v->head_bits)
		problem("head: %d bits in the stream, but %s says %ld", v->head_bits,
		        plan_path ? "the plan/--head-bits" : "--head-bits", head_opt);
	if (!v->head_bits)
		v->head_bits = head_opt ? (int)head_opt : 16;   /* tied, no head stored */
	if (nprob)
		die("%d problem%s; nothing written", nprob, nprob > 1 ? "s" : "");
	v->bits = lay->sum_n > 0 ? lay->sum_k / lay->sum_n : 0;
	if (!isnan(bits_opt)) {
		if (fabs(bits_opt - v->bits) > 0.005)
			warnx("warning: --bits %g, but the trellis widths give %.4f", bits_opt, v->bits);
		v->bits = bits_opt;
	} else if (!isnan(plan->bits) && fabs(plan->bits - v->bits) > 0.005) {
		warnx("warning: the plan says %.4f bits, the trellis widths give %.4f", plan->bits, v->bits);
	}
	if (!codebook) {
		int best = X3_CB_MUL1;
		for (int k = 0; k < X3_CB_COUNT; k++)
			if (lay->cb_count[k] > lay->cb_count[best])
				best = k;
		codebook = cb_name(best);
	}
	v->codebook = codebook;
	int mixed = 0;
	for (int k = 0; k < X3_CB_COUNT; k++)
		mixed += lay->cb_count[k] > 0;
	if (mixed > 1 && !quiet)
		warnx("note: the linears use %d different codebooks (legal); config says '%s'", mixed, codebook);
}

/* the payload of ents[i], for x3_stw_commit_direct; the spool space of
 * the tensor before it is given back (its bytes are in the shard now) */
static int ent_payload(void *ctx, int i, const void **p, void **owned)
{
	(void)ctx;
#ifdef FALLOC_FL_PUNCH_HOLE
	const struct ent *d = i > 0 ? &ents[i - 1] : NULL;
	if (d && d->in && d->in->nbytes > (1 << 20)) {
		int later = 0;   /* unless a later tensor copies it too (a tied head) */
		for (int j = i; j < nent && !later; j++)
			later = ents[j].in == d->in;
		if (!later)
			fallocate(spool_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)d->off,
			          (off_t)d->in->nbytes);
	}
#endif
	int own;
	*p = materialize(&ents[i], &own);
	*owned = own ? (void *)*p : NULL;
	return X3_OK;
}

/* 6. The tensors in model order, written straight into the shards: every
 * header is known now, so each payload byte is written once. */
static void write_tensors(const x3_model_config *cfg, double shard_mb, const char *out)
{
	for (int i = 0; i < nent; i++)
		x3_pack_order(cfg, ents[i].t->name, &ents[i].module, &ents[i].rank);
	qsort(ents, (size_t)nent, sizeof *ents, ent_cmp);
	x3_stw *w;
	uint64_t shard_bytes = (uint64_t)(shard_mb * 1024 * 1024);
	if (shard_mb > 0 && shard_bytes == 0)
		shard_bytes = 1;
	if (x3_stw_create(tmpdir, shard_bytes, &w))
		die_x3("%s", out);
	long module = -1;
	for (int i = 0; i < nent; i++) {
		if (ents[i].module != module) {
			x3_stw_module(w);
			module = ents[i].module;
		}
		if (x3_stw_declare(w, ents[i].t)) {
			x3_stw_abort(w);
			die("%s: %s", out, x3_errmsg());
		}
	}
	if (x3_stw_commit_direct(w, ent_payload, NULL))
		die("%s: %s", out, x3_errmsg());
	if (spool_map)
		munmap(spool_map, spool_len);
	spool_map = NULL;
	close(spool_fd);
	unlinkat(tmpdir_fd, ".pack-spool", 0);
}

/* 7. config.json, quantization_config.json, quantize_config.json and the
 * other files of SRC */
static void write_configs(const x3_pack_qcfg *q, const char *cfg_text, const char *path,
                          const char *src)
{
	char *txt;
	if (x3_pack_config_json(cfg_text, q, &txt))
		die("%s: %s", path, x3_errmsg());
	put_file("config.json", txt, strlen(txt));
	free(txt);
	x3_tensor **hdr = malloc((size_t)(nent ? nent : 1) * sizeof *hdr);
	if (!hdr)
		die("out of memory");
	for (int i = 0; i < nent; i++)
		hdr[i] = ents[i].t;
	if (x3_pack_qconfig_json(q, hdr, nent, &txt))
		die_x3("quantization_config.json");
	put_file("quantization_config.json", txt, strlen(txt));
	free(txt);
	if (x3_pack_gptqmodel_json(q, hdr, nent, &txt))
		die_x3("quantize_config.json");
	put_file("quantize_config.json", txt, strlen(txt));
	free(txt);
	free(hdr);
	copy_files(src);
	unlinkat(tmpdir_fd, ".pack-write.pid", 0);
	if (fsync(tmpdir_fd))
		die("fsync %s: %s", tmpdir, strerror(errno));
}

/* 7b. What the reader requires (reader.h), on the finished temporary
 * directory: a pack it would not load is never put in place. */
static void check_reader(int reader, const char *out)
{
	x3_reader_violation *v;
	int n;
	if (x3_reader_check(reader, tmpdir, &v, &n))
		die("%s: checking what %s requires: %s", out, x3_reader_name(reader), x3_errmsg());
	for (int i = 0; i < n; i++)
		fprintf(stderr, "%s: %s would not load %s: %s: %s: %s\n", progname, x3_reader_name(reader), out,
		        v[i].what, v[i].rule, v[i].msg);
	free(v);
	if (n)
		die("%s: %d violations of what %s requires: nothing written", out, n, x3_reader_name(reader));
}

/* 8. Into place: exchange with an existing OUT, or a no-replace rename;
 * then the directory's fsync makes the rename durable. */
static void install(const struct outname *o)
{
	const char *out = o->out;
	if (o->exists) {
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
	/* a failure is an error: OUT is complete, but may not survive a crash */
	int rc = x3_fsync_dir(o->dir, out);
	cleanup();
	if (rc)
		die("%s", x3_errmsg());
}

/* the command line */
struct opts {
	const char *src, *plan_path, *codebook, *out_scales;
	int passthrough, force;
	int reader;                  /* X3_READER_*; -1: none, -2: auto */
	double shard_mb, bits_opt;
	long head_opt, cal_rows, cal_cols;
	int vision_bits;             /* 1..8, or 16 */
};

/* the options into o (exits on a bad one, and after --help), then the
 * checks of the operands */
static void parse_options(int argc, char **argv, struct opts *o)
{
	enum { O_MODEL = 256, O_PASS, O_SHARD, O_PLAN, O_BITS, O_HEAD, O_CB, O_CR, O_CC, O_OS, O_FORCE, O_CHECK, O_VB };
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
		{"check", required_argument, 0, O_CHECK},
		{"vision-bits", required_argument, 0, O_VB},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	*o = (struct opts){
		.out_scales = "always", .reader = -1, .shard_mb = X3_PACK_SHARD_MB, .bits_opt = NAN,
		.cal_rows = 250, .cal_cols = 2048, .vision_bits = 16,
	};
	int c;
	while ((c = getopt_long(argc, argv, "hq", lo, NULL)) != -1) {
		switch (c) {
		case 'h': help(); exit(0);
		case 'q': quiet = 1; break;
		case O_MODEL: o->src = optarg; break;
		case O_PASS: o->passthrough = 1; break;
		case O_SHARD: o->shard_mb = parse_double(usage, "--shard-size", optarg, 0, 1e9); break;
		case O_PLAN: o->plan_path = optarg; break;
		case O_BITS: o->bits_opt = parse_double(usage, "--bits", optarg, 1, 16); break;
		case O_HEAD:
			o->head_opt = parse_long(usage, "--head-bits", optarg, 1, 16);
			if (o->head_opt > 8 && o->head_opt != 16)
				usage_error(usage, "--head-bits: %ld is not 1..8 or 16", o->head_opt);
			break;
		case O_CB:
			if (strcmp(optarg, "mul1") && strcmp(optarg, "mcg") && strcmp(optarg, "3inst"))
				usage_error(usage, "--codebook: '%s' is not mul1, mcg or 3inst", optarg);
			o->codebook = optarg;
			break;
		case O_CR: o->cal_rows = parse_long(usage, "--cal-rows", optarg, 0, 1L << 30); break;
		case O_CC: o->cal_cols = parse_long(usage, "--cal-cols", optarg, 0, 1L << 30); break;
		case O_OS:
			if (strcmp(optarg, "always") && strcmp(optarg, "never") && strcmp(optarg, "auto"))
				usage_error(usage, "--out-scales: '%s' is not always, never or auto", optarg);
			o->out_scales = optarg;
			break;
		case O_FORCE: o->force = 1; break;
		case O_VB:
			o->vision_bits = (int)parse_long(usage, "--vision-bits", optarg, 1, 16);
			if (o->vision_bits > 8 && o->vision_bits != 16)
				usage_error(usage, "--vision-bits: '%s' is not 1..8 or 16", optarg);
			break;
		case O_CHECK:
			if (!strcmp(optarg, "none"))
				o->reader = -1;
			else if (!strcmp(optarg, "auto"))
				o->reader = -2;
			else if ((o->reader = x3_reader_lookup(optarg)) < 0)
				usage_error(usage, "--check: '%s' is not auto, none, %s", optarg, x3_reader_names());
			break;
		default: usage_error(usage, "bad option");
		}
	}
	if (!o->src)
		usage_error(usage, "--model SRC is required");
	if (optind + 1 != argc)
		usage_error(usage, optind == argc ? "missing OUT" : "more than one OUT");
	if (isatty(STDIN_FILENO))
		usage_error(usage, "expects the frames of a conversion on stdin");
}

/* the source model: its config (and its path), the description of its
 * modules, its tensors */
struct source {
	char path[8192];             /* SRC/config.json */
	char *cfg_text;
	x3_model_config cfg;
	x3_st *sst;
	x3_module *mods;
	int nmods;
};

static void open_source(const char *src, int vision_bits, struct source *s)
{
	snprintf(s->path, sizeof s->path, "%s/config.json", src);
	s->cfg_text = slurp(s->path, NULL);
	if (x3_config_parse_as(s->cfg_text, strlen(s->cfg_text), X3_CONFIG_LAYOUT, &s->cfg))
		die("%s: %s", src, x3_errmsg());   /* "SRC: config.json: ..." */
	if (x3_st_open(src, &s->sst))
		die_x3("%s", src);
	/* experts fused in 3-D tensors: read from them, written per expert */
	if (x3_arch_fused_scan(&s->cfg, s->sst) || x3_arch_mtp_scan(&s->cfg, s->sst))
		die_x3("%s", src);
	if (x3_config_vision(&s->cfg, vision_bits))
		die_x3("%s", src);
	if (x3_arch_modules(&s->cfg, &s->mods, &s->nmods))
		die_x3("%s", s->path);
}

/* --plan into plan, and head_bits from it into o->head_opt (unless given),
 * except for a tied model whose plan has no entry for the head (then no
 * head is stored) */
static void read_plan(struct opts *o, const struct source *s, x3_pack_plan *plan)
{
	*plan = (x3_pack_plan){.K = NULL, .head_bits = 0, .bits = NAN, .measurement = NULL};
	if (!o->plan_path)
		return;
	/* slurp: a missing file or a directory says so, not "line -1" */
	char *pt = slurp(o->plan_path, NULL);
	if (x3_pack_plan_parse(pt, o->plan_path, s->mods, s->nmods, plan))
		die("%s (in %s)", x3_errmsg(), o->src);
	free(pt);
	const x3_module *headm = NULL;
	for (int j = 0; j < s->nmods; j++)
		if (s->mods[j].d->role == X3_ROLE_HEAD)
			headm = &s->mods[j];
	if (!o->head_opt && plan->head_bits && (!headm || !headm->tied || plan->K[headm - s->mods]))
		o->head_opt = plan->head_bits;
}

/* the reader whose contract --check checks (-1: none); auto is
 * ExLlamaV3's, unless it refuses the architecture */
static int resolve_reader(int reader, const x3_model_config *cfg)
{
	if (reader != -2)
		return reader;
	char why[256];
	reader = X3_READER_EXLLAMAV3;
	if (x3_reader_refuses(reader, cfg, why, sizeof why)) {
		reader = -1;
		if (!quiet)
			fprintf(stderr, "%s: note: %s; no reader's contract checked (--check gptqmodel or "
			        "strict checks one)\n", progname, why);
	}
	return reader;
}

int main(int argc, char **argv)
{
	prog_init(argc, argv);
	struct opts op;
	parse_options(argc, argv, &op);
	struct outname o;
	out_name(argv[optind], op.src, op.force, &o);
	struct source s;
	open_source(op.src, op.vision_bits, &s);
	x3_pack_plan plan;
	read_plan(&op, &s, &plan);

	open_tmpdir(&o);
	read_stream();
	x3_pack_in pin = {
		.cfg = &s.cfg, .mods = s.mods, .nmods = s.nmods, .in = in, .nin = nin, .src = s.sst,
		.src_name = op.src, .passthrough = op.passthrough, .head_bits = (int)op.head_opt,
		.plan = op.plan_path ? &plan : NULL,
	};
	x3_pack_layout lay;
	classify(&pin, o.out, &lay);
	struct values v;
	config_values(&lay, op.head_opt, op.bits_opt, &plan, op.plan_path, op.codebook, &v);
	if (!quiet)   /* only for a pack that will be written */
		loader_warnings(s.cfg_text, s.path, s.mods, s.nmods);
	write_tensors(&s.cfg, op.shard_mb, o.out);
	x3_pack_qcfg q = {
		.bits = v.bits, .head_bits = v.head_bits, .mtp_bits = lay.mtp_bits, .vision_bits = lay.vision_bits,
		.cal_rows = (int)op.cal_rows,
		.cal_cols = (int)op.cal_cols, .out_scales = op.out_scales, .codebook = v.codebook,
		.version = "1.4.1", .nfallback = lay.nfallback,
		.fallback_key = (const char *const *)lay.fallback_key,
		.fallback_why = (const char *const *)lay.fallback_why,
		.measurement = plan.measurement,
	};
	write_configs(&q, s.cfg_text, s.path, op.src);
	int reader = resolve_reader(op.reader, &s.cfg);
	if (reader >= 0)
		check_reader(reader, o.out);
	install(&o);
	if (!quiet)
		fprintf(stderr, "%s: wrote %s: %d tensors, %.4f bits (head %d), codebook %s\n",
		        progname, o.out, nent, v.bits, v.head_bits, v.codebook);
	for (int i = 0; i < nent; i++)
		x3_tensor_free(ents[i].t);
	free(ents);
	for (int i = 0; i < nin; i++) {
		in[i]->data = NULL;
		x3_tensor_free(in[i]);
	}
	free(in); free(inoff); free(s.mods); free(s.cfg_text);
	x3_pack_layout_free(&lay);
	x3_pack_plan_free(&plan);
	x3_st_close(s.sst);
	return 0;
}
