/* libFuzzer target: config.json parsing (x3_config_parse) on arbitrary
 * bytes. Every input must give X3_OK or an error, never a crash; a config
 * that parses has sane dimensions. */
#include <stdint.h>
#include <stdlib.h>
#include "model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	x3_model_config c;
	if (x3_config_parse((const char *)data, size, &c) == X3_OK) {
		if (c.hidden < 1 || c.n_heads < 1 || c.n_kv_heads < 1 || c.head_dim < 2 ||
		    c.head_dim % 2 || c.n_heads % c.n_kv_heads || c.vocab < 1 || c.n_layers < 1)
			abort();
	}
	return 0;
}
