/* util.c: helpers for program mains. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
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

double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t peak_rss_bytes(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (uint64_t)ru.ru_maxrss * 1024;
}
