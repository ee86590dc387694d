/* util-check.h: exl3-info --check READER (bin/util-check.c; linked only
 * into exl3-info): the reader contract (reader.h) run on a directory and
 * reported. */
#ifndef X3_BIN_UTIL_CHECK_H
#define X3_BIN_UTIL_CHECK_H

/* Check DIR against reader NAME (auto: exllamav3 where ExLlamaV3 loads the
 * model, else none; an unknown name is a usage error naming USAGE's
 * program): one line per violation (reader, tensor, rule, message) and a
 * verdict on stdout, or with as_json one JSON object. 1 when a rule is
 * violated, else 0. */
int check_reader(const char *usage, const char *name, const char *dir, int as_json);
#endif
