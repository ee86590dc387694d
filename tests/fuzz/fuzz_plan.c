/* libFuzzer target: the bitalloc plan as pack-write reads it
 * (x3_pack_plan_parse), for the linears of a two-layer model. Every input
 * is parsed or rejected; a parsed plan has K 1..8 and head_bits 0, 1..8
 * or 16. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static x3_module *mods;
	static int nmods;
	if (!mods) {
		x3_model_config c;
		const char *cfg = "{\"architectures\": [\"LlamaForCausalLM\"], \"num_hidden_layers\": 2,"
		                  " \"hidden_size\": 64, \"intermediate_size\": 96, \"num_attention_heads\": 4,"
		                  " \"num_key_value_heads\": 2, \"vocab_size\": 256}";
		if (x3_config_parse_as(cfg, strlen(cfg), X3_CONFIG_LAYOUT, &c) || x3_arch_modules(&c, &mods, &nmods))
			abort();
	}
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = 0;
	x3_pack_plan p;
	if (x3_pack_plan_parse(text, "fuzz", mods, nmods, &p) == X3_OK) {
		for (int i = 0; i < nmods; i++)
			if (p.K[i] < 0 || p.K[i] > 8 || (p.K[i] && mods[i].d->kind != X3_KIND_LINEAR))
				abort();
		if (p.head_bits < 0 || (p.head_bits > 8 && p.head_bits != 16))
			abort();
		x3_pack_plan_free(&p);
	}
	free(text);
	return 0;
}
