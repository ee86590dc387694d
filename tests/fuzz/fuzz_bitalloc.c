/* libFuzzer target: bitalloc's inputs (measurement lines, then after a
 * line "--" importance lines) and the plan it writes. The first byte picks
 * the target bits and the solver. Every input must be read, prepared and
 * solved or rejected with an error, never crash; a solved plan must be
 * JSON that jansson reads back, with every K in the allowed range and the
 * average within the target (except the ExLlamaV3 greedy, which may
 * exceed it by design). */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bitalloc.h"
#include "x3.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	unsigned sel = data[0];
	double bits = 1 + (sel & 31) * (7.0 / 31);       /* 1..8 */
	int method = (sel >> 5) & 3;                     /* X3_BA_AUTO..EXL3 */
	int hq = (sel >> 7) & 1;
	x3_ba_dp_max_cells = 1 << 20;                    /* keep one run short */
	char *text = malloc(size);
	if (!text)
		return 0;
	memcpy(text, data + 1, size - 1);
	text[size - 1] = 0;
	size_t n = size - 1;
	/* split at a line "--" */
	char *imp = NULL;
	for (char *p = text; (p = strstr(p, "--\n")); p++)
		if (p == text || p[-1] == '\n') {
			*p = 0;
			imp = p + 3;
			break;
		}
	x3_ba *ba = x3_ba_create();
	FILE *f = fmemopen(text, imp ? strlen(text) : n, "r");
	int rc = ba && f ? x3_ba_read(ba, f, "fuzz") : X3_EINVAL;
	if (f)
		fclose(f);
	if (!rc && imp && (f = fmemopen(imp, strlen(imp), "r"))) {
		rc = x3_ba_read_importance(ba, f, "fuzz-importance");
		fclose(f);
	}
	if (!rc && hq)
		x3_ba_apply_hq(ba, bits);
	if (!rc)
		rc = x3_ba_prepare(ba, bits);
	if (!rc)
		rc = x3_ba_solve(ba, bits, method, hq);
	if (!rc) {
		for (int i = 0; i < ba->n; i++)
			if (ba->t[i].K < 1 || ba->t[i].K > X3_BA_KMAX ||
			    (method != X3_BA_EXL3 && (ba->t[i].K < ba->t[i].lo || ba->t[i].K > ba->t[i].hi)))
				abort();
		double got = x3_ba_bits(ba);
		if (method != X3_BA_EXL3 && ba->n && !(got <= bits + 1e-9))
			abort();
		char *js = x3_ba_plan_json(ba);
		if (js) {
			json_error_t je;
			json_t *o = json_loads(js, 0, &je);
			if (!o || !json_is_object(json_object_get(o, "tensors")))
				abort();
			json_decref(o);
			free(js);
		}
	}
	x3_ba_free(ba);
	free(text);
	return 0;
}
