/* config_impl.h: what config.c and config_rope.c share (not for other
 * files): the typed readers of config.json's keys, and the rope parser. */
#ifndef X3_CONFIG_IMPL_H
#define X3_CONFIG_IMPL_H
#include <stdint.h>
#include <jansson.h>
#include "config.h"

/* Positive integer key at least lo. required: absent is an error; else *v
 * untouched. */
int x3_cfg_int(json_t *o, const char *key, int required, int64_t lo, int64_t *v);
/* Number key (absent: *v untouched). */
int x3_cfg_num(json_t *o, const char *key, double *v);
/* Boolean key (absent: *v untouched). */
int x3_cfg_bool(json_t *o, const char *key, int *v);
/* rope_scaling (GPT-OSS: rope_parameters where there is none) into c's
 * rope_* fields; c->desc set. */
int x3_config_rope(json_t *root, x3_model_config *c);
/* vision_config's sizes and quantization_config.vision_bits into c's v_*
 * fields (config_vision.c); c->desc and c->quantized set. */
int x3_config_vision_parse(json_t *root, x3_model_config *c);
#endif
