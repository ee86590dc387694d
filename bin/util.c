/* util.c: helpers for program mains. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include "util.h"

const char *progname = "exl3kit";
int quiet;
static int progress_shown;

void prog_init(int argc, char **argv)
{
	(void)argc;
	if (argv && argv[0]) {
		const char *s = strrchr(argv[0], '/');
		progname = s ? s + 1 : argv[0];
	}
}

static void vmsg(const char *fmt, va_list ap)
{
	progress_done();
	fprintf(stderr, "%s: ", progname);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

void warnx(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmsg(fmt, ap);
	va_end(ap);
}

void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmsg(fmt, ap);
	va_end(ap);
	exit(1);
}

void die_x3(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	const char *m = x3_errmsg();
	size_t bl = strlen(buf);
	/* library messages often name the file already: "f: f: why" says it twice */
	if (m && bl && !strncmp(m, buf, bl) && m[bl] == ':')
		die("%s", m);
	if (m && *m)
		die("%s: %s", buf, m);
	die("%s", buf);
}

void usage_error(const char *usage, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmsg(fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s", usage);
	exit(2);
}

long parse_long(const char *usage, const char *opt, const char *s, long lo, long hi)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 0);
	if (errno || end == s || *end || v < lo || v > hi)
		usage_error(usage, "%s: '%s' is not an integer in %ld..%ld", opt, s, lo, hi);
	return v;
}

double parse_double(const char *usage, const char *opt, const char *s, double lo, double hi)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= lo && v <= hi))
		usage_error(usage, "%s: '%s' is not a number in %g..%g", opt, s, lo, hi);
	return v;
}

uint64_t parse_size(const char *usage, const char *opt, const char *s)
{
	static const struct { const char *suf; double mul; } sfx[] = {
		{"", 1}, {"B", 1},
		{"K", 1e3}, {"KB", 1e3}, {"M", 1e6}, {"MB", 1e6},
		{"G", 1e9}, {"GB", 1e9}, {"T", 1e12}, {"TB", 1e12},
		{"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
	};
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !(v >= 0) || !isfinite(v) || !(*s >= '0' && *s <= '9'))
		usage_error(usage, "%s: '%s' is not a size (bytes, or a number with K, M, G, T "
		            "(powers of 1000) or KiB, MiB, GiB, TiB (of 1024))", opt, s);
	for (size_t i = 0; i < sizeof sfx / sizeof *sfx; i++)
		if (!strcmp(end, sfx[i].suf)) {
			double b = floor(v * sfx[i].mul);
			if (b < 1 || b > 9.0e18)
				usage_error(usage, "%s: '%s' is out of range", opt, s);
			return (uint64_t)b;
		}
	usage_error(usage, "%s: '%s': unknown unit '%s' (K, KB, M, MB, G, GB, T, TB: powers of "
	            "1000; KiB, MiB, GiB, TiB: of 1024)", opt, s, end);
}

void meta_arg_check(const char *usage, const char *arg)
{
	const char *eq = strchr(arg, '=');
	char *key;
	if (!eq || eq == arg)
		usage_error(usage, "--meta: expected KEY=VALUE, got '%s'", arg);
	if (!(key = strndup(arg, (size_t)(eq - arg))))
		die("out of memory");
	if (x3_check_utf8("key", key))
		usage_error(usage, "--meta: %s", x3_errmsg());
	if (x3_check_utf8("value", eq + 1))
		usage_error(usage, "--meta '%s': %s", key, x3_errmsg());
	free(key);
}

void name_arg_check(const char *usage, const char *name)
{
	if (x3_check_utf8("tensor name", name))
		usage_error(usage, "%s", x3_errmsg());
}

void refuse_tty_stdout(void)
{
	if (isatty(STDOUT_FILENO)) {
		fprintf(stderr, "%s: refusing to write binary frames to a terminal "
		        "(redirect stdout or pipe it)\n", progname);
		exit(2);
	}
}

void check_stdout(void)
{
	if (fflush(stdout) != 0 || ferror(stdout))
		die("write error on standard output: %s", strerror(errno));
	if (fclose(stdout) != 0 && errno != EBADF)
		die("write error on standard output: %s", strerror(errno));
}

/* files being written under a temporary name: removed at exit unless
 * committed */
static struct outfile *outfiles;

static void outfiles_cleanup(void)
{
	for (struct outfile *o = outfiles; o; o = o->next)
		x3_afile_abort(&o->f);
}

int outfile_open(struct outfile *o, const char *path)
{
	static int registered;
	if (x3_afile_open(&o->f, path))
		die("%s", x3_errmsg());
	if (!registered++)
		atexit(outfiles_cleanup);
	o->next = outfiles;
	outfiles = o;
	return o->f.fd;
}

void outfile_commit(struct outfile *o)
{
	if (x3_afile_commit(&o->f))
		die("%s", x3_errmsg());
	for (struct outfile **p = &outfiles; *p; p = &(*p)->next)
		if (*p == o) {
			*p = o->next;
			break;
		}
}

static struct outfile out_main;
static int out_file;

int output_open(const char *path)
{
	if (!path || !strcmp(path, "-")) {
		refuse_tty_stdout();
		out_file = 0;
		return STDOUT_FILENO;
	}
	out_file = 1;
	return outfile_open(&out_main, path);
}

void output_commit(void)
{
	if (!out_file) {
		check_stdout();
		return;
	}
	outfile_commit(&out_main);
}

void progress(const char *fmt, ...)
{
	static int tty = -1;
	if (quiet)
		return;
	if (tty < 0)
		tty = isatty(STDERR_FILENO);
	if (!tty)
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "\r%s: ", progname);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\033[K");
	va_end(ap);
	progress_shown = 1;
}

void progress_done(void)
{
	if (progress_shown) {
		fputc('\n', stderr);
		progress_shown = 0;
	}
}

uint64_t peak_rss_bytes(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (uint64_t)ru.ru_maxrss * 1024;
}

const char *human_bytes(double b, char *buf, size_t n)
{
	static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int i = 0;
	while (b >= 1024 && i < 4)
		b /= 1024, i++;
	snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
	return buf;
}
