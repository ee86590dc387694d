/* pack_role.c: the role of a tensor or linear of any pack by its key
 * (x3_pack_role, see pack.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pack.h"

/* does name contain the dot-delimited component sequence part ("experts",
 * "shared_expert")? */
static int has_part(const char *name, const char *part)
{
	size_t l = strlen(part);
	for (const char *p = strstr(name, part); p; p = strstr(p + 1, part))
		if ((p == name || p[-1] == '.') && (p[l] == '.' || p[l] == 0))
			return 1;
	return 0;
}

int x3_pack_role(const char *name, int *layer)
{
	/* the model description first: the one place that knows its keys */
	char key[1024];
	snprintf(key, sizeof key, "%s", name);
	char *dot = strrchr(key, '.');
	int tl = -1;
	const x3_module_desc *d = x3_arch_classify(key, &tl);
	if (!d && dot) {
		*dot = 0;   /* "<key>.trellis", "<key>.weight" */
		d = x3_arch_classify(key, &tl);
	}
	if (d) {
		if (layer)
			*layer = tl;
		return d->role;
	}
	/* the first ".N." after a layer container: model.layers.N, h.N, blocks.N */
	static const char *const cont[] = {"layers.", "h.", "blocks.", "layer."};
	if (layer) {
		*layer = -1;
		for (size_t i = 0; i < sizeof cont / sizeof *cont && *layer < 0; i++)
			for (const char *p = strstr(name, cont[i]); p; p = strstr(p + 1, cont[i])) {
				char *end;
				const char *d = p + strlen(cont[i]);
				if ((p != name && p[-1] != '.') || *d < '0' || *d > '9')
					continue;
				long l = strtol(d, &end, 10);
				if (*end == '.' && l < 1000000) {
					*layer = (int)l;
					break;
				}
			}
	}
	if (has_part(name, "shared_expert") || has_part(name, "shared_experts") ||
	    has_part(name, "shared_mlp"))
		return X3_ROLE_SHARED_EXPERT;
	if (has_part(name, "experts"))
		return X3_ROLE_EXPERT;
	if (strstr(name, "embed_tokens") || has_part(name, "wte") || has_part(name, "tok_embeddings") ||
	    has_part(name, "embed") || has_part(name, "embeddings"))
		return X3_ROLE_EMBEDDING;
	if (!strncmp(name, "lm_head", 7) && (name[7] == '.' || !name[7]))
		return X3_ROLE_HEAD;
	if (has_part(name, "lm_head") || !strncmp(name, "output.", 7))
		return X3_ROLE_HEAD;
	if (strstr(name, "norm"))
		return X3_ROLE_NORM;
	/* routers: mlp.gate / block_sparse_moe.gate (a gate that is not gate_proj) */
	if ((has_part(name, "mlp") || has_part(name, "block_sparse_moe") || has_part(name, "moe")) &&
	    (has_part(name, "gate") || has_part(name, "router")))
		return X3_ROLE_ROUTER;
	if (has_part(name, "self_attn") || has_part(name, "attn") || has_part(name, "attention") ||
	    has_part(name, "linear_attn") || has_part(name, "cross_attn"))
		return X3_ROLE_ATTENTION;
	if (has_part(name, "mlp") || has_part(name, "feed_forward") || has_part(name, "ffn") ||
	    has_part(name, "block_sparse_moe"))
		return X3_ROLE_MLP;
	return X3_ROLE_OTHER;
}

int x3_pack_role_of(const x3_module *mods, int n, const char *key, int *layer)
{
	int role = x3_pack_role(key, layer);
	const x3_module *m = mods ? x3_modules_find(mods, n, key) : NULL;
	/* DeepSeek's MTP layer has the keys of a layer: only the model tells */
	return m && m->d->role == X3_ROLE_MTP ? X3_ROLE_MTP : role;
}
