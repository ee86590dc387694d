/* util.h: helpers shared by the programs' mains (not part of the library:
 * only mains print and exit). */
#ifndef X3_BIN_UTIL_H
#define X3_BIN_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include "x3.h"
#include "io.h"

extern const char *progname;
/* Set progname from argv[0]; leaves SIGPIPE at its default. */
void prog_init(int argc, char **argv);
/* "prog: msg\n" to stderr */
void warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* warnx then exit(1) */
_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "prog: <what>: <x3_errmsg()>" then exit(1) */
_Noreturn void die_x3(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* print "prog: msg" and the usage line to stderr, exit 2 */
_Noreturn void usage_error(const char *usage, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Range-checked number parsing; on failure usage_error names the option. */
long parse_long(const char *usage, const char *opt, const char *s, long lo, long hi);
double parse_double(const char *usage, const char *opt, const char *s, double lo, double hi);
/* A size in bytes: a number (a fraction allowed) with no unit or B, K/KB,
 * M/MB, G/GB, T/TB (powers of 1000) or KiB, MiB, GiB, TiB (of 1024),
 * rounded down to whole bytes, at least 1. */
uint64_t parse_size(const char *usage, const char *opt, const char *s);
/* B bytes as "512 B", "1.50 KiB", ... (powers of 1024) into buf */
const char *human_bytes(double b, char *buf, size_t n);

/* Check a --meta KEY=VALUE argument (a key, valid UTF-8: a frame header is
 * JSON); a usage error naming the key otherwise. */
void meta_arg_check(const char *usage, const char *arg);
/* A tensor name from the command line: valid UTF-8, else a usage error. */
void name_arg_check(const char *usage, const char *name);

/* Refuse to write binary frames to a terminal (exit 2). */
void refuse_tty_stdout(void);
/* Flush and check stdout; exit(1) with a message on error. */
void check_stdout(void);
/* The program's output: stdout (refusing a terminal) when path is NULL or
 * "-", else FILE written under a temporary name beside it, removed at exit
 * unless output_commit renamed it into place: a failed run never leaves a
 * half-written FILE or a stray temporary. Returns the fd to write to. One
 * output at a time: the next output_open comes after output_commit. */
int output_open(const char *path);
/* Flush to disk and rename into place (or check stdout); exits on error. */
void output_commit(void);
/* A further output file, same contract (output_open's FILE is one): open
 * under a temporary name, removed at exit unless committed. */
struct outfile {
	x3_afile f;              /* the library's atomic file (io.h) */
	struct outfile *next;
};
int outfile_open(struct outfile *o, const char *path);
void outfile_commit(struct outfile *o);

/* Progress on stderr when it is a terminal and not quiet. */
extern int quiet;
void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void progress_done(void);
/* Peak resident set size in bytes (from getrusage). */
uint64_t peak_rss_bytes(void);

#endif
