/* reader.h: what the programs that load EXL3 directories require of one,
 * beyond "the keys and shapes are right" (exl3(5) §8): the reader
 * contract. Each reader is a set of named rules; x3_reader_check runs them
 * on a directory and reports every violation with the tensor (or file, or
 * config key) and the rule. Which architectures a reader loads is the
 * model description's (x3_arch_desc.readers); which linears it fuses is
 * the description's too (x3_module_desc.tie, kind X3_KIND_MATRIX for what
 * it reads as a plain tensor).
 *
 *   exllamav3  ExLlamaV3 v1.4.1's loader (its architecture files, modules/
 *              multilinear.py, block_sparse_mlp.py, mla_attn.py)
 *   gptqmodel  GPTQModel's EXL3 path (quantize_config.json's
 *              tensor_storage, nn.Linear modules of the unpadded model)
 *   strict     a generic strict reader: every rule of the two above that
 *              does not depend on the family, every size a multiple of
 *              128, and a complete model.safetensors.index.json */
#ifndef X3_READER_H
#define X3_READER_H

#include "x3.h"
#include "config.h"

enum { X3_READER_EXLLAMAV3, X3_READER_GPTQMODEL, X3_READER_STRICT, X3_READER_COUNT };
/* x3_arch_desc.readers: the readers that load an architecture */
#define X3_RD(r) (1u << (r))

/* "exllamav3", "gptqmodel", "strict" */
const char *x3_reader_name(int reader);
/* By name; -1 if unknown. */
int x3_reader_lookup(const char *name);
/* The readers' names, "exllamav3, gptqmodel, strict" (static). */
const char *x3_reader_names(void);
/* Does the reader load this model (the config of a model or pack): its
 * architecture, and the options of it the reader runs (ExLlamaV3 refuses
 * DeepSeek-V3's grouped routing)? */
int x3_reader_loads(int reader, const x3_model_config *c);
/* ... and if not, why (into buf): 1, else 0. */
int x3_reader_refuses(int reader, const x3_model_config *c, char *buf, size_t n);

/* One violation: the tensor, file or config key it concerns, the rule's
 * name, and a message saying what the reader does with it. */
typedef struct {
	char what[160];
	const char *rule;
	char msg[512];
} x3_reader_violation;

/* Check the EXL3 directory DIR against the reader's rules. *out gets the
 * violations (malloc'd, *n of them; none: *out NULL, *n 0). X3_OK when
 * the directory could be read (whatever the violations), else an error
 * (no config.json, unreadable safetensors: the message names it). */
int x3_reader_check(int reader, const char *dir, x3_reader_violation **out, int *n);

#endif
