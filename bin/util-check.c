/* util-check.c: exl3-info --check READER (util-check.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "util.h"
#include "util-check.h"
#include "config.h"
#include "reader.h"

int check_reader(const char *usage, const char *name, const char *dir, int as_json)
{
	int r = x3_reader_lookup(name);
	if (r < 0 && strcmp(name, "auto"))
		usage_error(usage, "--check: unknown reader (auto, exllamav3, gptqmodel, strict)");
	x3_model_config c;
	if (r < 0) {
		if (x3_config_load_as(dir, X3_CONFIG_LAYOUT, &c))
			die_x3("%s", dir);
		r = x3_reader_loads(X3_READER_EXLLAMAV3, &c) ? X3_READER_EXLLAMAV3 : -1;
	}
	x3_reader_violation *v = NULL;
	int n = 0;
	if (r >= 0 && x3_reader_check(r, dir, &v, &n))
		die_x3("%s", dir);
	if (as_json) {
		json_t *o = json_object(), *a = json_array();
		for (int i = 0; i < n; i++)
			json_array_append_new(a, json_pack("{s:s, s:s, s:s}", "tensor", v[i].what, "rule", v[i].rule,
			                                   "message", v[i].msg));
		json_object_set_new(o, "source", json_string(dir));
		json_object_set_new(o, "reader", r >= 0 ? json_string(x3_reader_name(r)) : json_null());
		json_object_set_new(o, "ok", json_boolean(n == 0));
		json_object_set_new(o, "violations", a);
		json_dumpf(o, stdout, JSON_PRESERVE_ORDER);
		printf("\n");
		json_decref(o);
	} else if (r < 0) {
		char why[256];
		x3_reader_refuses(X3_READER_EXLLAMAV3, &c, why, sizeof why);
		printf("%s: auto: no reader checked (%s)\n", dir, why);
	} else {
		for (int i = 0; i < n; i++)
			printf("%s: %s: %s: %s\n", x3_reader_name(r), v[i].what, v[i].rule, v[i].msg);
		printf("%s: %s: %s\n", dir, x3_reader_name(r), n ? "violations found" : "ok");
		if (n)
			printf("%d violations\n", n);
	}
	check_stdout();
	free(v);
	return n ? 1 : 0;
}
