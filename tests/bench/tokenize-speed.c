/* tokenize-speed TOKENIZER FILE: load the tokenizer once, encode FILE one
 * line at a time (no special tokens) and print "bytes tokens seconds load_s"
 * (used by tests/bench/tokenize.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "x3.h"
#include "tokenizer.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	if (argc != 3) { fputs("usage: tokenize-speed TOKENIZER FILE\n", stderr); return 2; }
	double t0 = now();
	x3_tok *t;
	if (x3_tok_load(argv[1], &t)) { fprintf(stderr, "tokenize-speed: %s\n", x3_errmsg()); return 1; }
	double t1 = now();
	FILE *f = fopen(argv[2], "rb");
	if (!f) { perror(argv[2]); return 1; }
	char *line = NULL;
	size_t cap = 0, bytes = 0, tokens = 0;
	ssize_t n;
	double enc = 0;
	while ((n = getline(&line, &cap, f)) > 0) {
		int32_t *ids;
		size_t k;
		double a = now();
		if (x3_tok_encode(t, line, (size_t)(line[n - 1] == '\n' ? n - 1 : n), 0, &ids, &k)) {
			fprintf(stderr, "tokenize-speed: %s\n", x3_errmsg());
			return 1;
		}
		enc += now() - a;
		bytes += (size_t)n;
		tokens += k;
		free(ids);
	}
	free(line);
	fclose(f);
	x3_tok_free(t);
	printf("%zu %zu %.6f %.3f\n", bytes, tokens, enc, t1 - t0);
	return 0;
}
