/* plan.h: the plan of a conversion (pipelines/convert, convert-plan(1)):
 * which files the work directory gets, made from what, as explicit make
 * rules over the recipes of pipelines/convert.mk, and which layers' Hessians
 * a run captures (the recapture set), decided from the files' times the way
 * make decides, without running make.
 *
 * The linears come from the model's description (arch.h
 * x3_arch_modules); the options are those of convert that change which
 * files exist. Every work-directory file name of the per-tensor steps is
 * spelled here. */
#ifndef X3_PLAN_H
#define X3_PLAN_H

#include <stdio.h>
#include "arch.h"

enum { X3_SENS_OFF, X3_SENS_MEASURE, X3_SENS_FILE };
enum { X3_SENS_BY_TENSOR, X3_SENS_BY_GROUP, X3_SENS_BY_LAYER };

typedef struct {
	int head_bits;          /* 1..8 or 16 (the head not encoded) */
	int mtp_bits;           /* the MTP layer's linears: 1..8 (0: 4) */
	int vision_bits;        /* the vision tower's linears: 1..8, or 0 or 16
	                           (the tower passed through: no linears) */
	int sequential;         /* --mode sequential */
	char sample[32];        /* --sample F as convert spells it, "" for full */
	int measure[8], nmeasure; /* the measured widths, ascending */
	int draws;              /* --sign-metric kl: draws per linear, else 0 */
	int sens;               /* X3_SENS_* */
	int sens_by;            /* X3_SENS_BY_* */
	int sens_k;             /* the K of the measurement and of the draws (0: none) */
	char sens_file[64];     /* with X3_SENS_FILE: its name in the work directory */
} x3_plan_opts;

typedef struct {
	const x3_module *m;     /* the module (key, weight, group, layer, bias) */
	int head;               /* the head (encoded at head_bits, not measured) */
	int mtp;                /* a linear encoded without a Hessian at a
	                           fixed width, not measured: the MTP layer's
	                           (mtp_bits) or the vision tower's */
	int vision;             /* ... the vision tower's (vision_bits) */
	char rows[48];          /* "A:B" for a row slice of a fused tensor, else "" */
} x3_plan_lin;

typedef struct {
	x3_plan_opts o;
	x3_module *mods;        /* every module (malloc'd) */
	int nmods;
	x3_plan_lin *lin;       /* the linears encoded, model order */
	int nlin;
	int nlayers;            /* the config's layers (the head's layer) */
	int last;               /* the last layer with a capture */
} x3_plan;

/* The plan of the model in DIR under O (the config and its description;
 * no tensor read). 0, or -1 with x3_errmsg. */
int x3_plan_build(const char *dir, const x3_plan_opts *o, x3_plan *p);
void x3_plan_free(x3_plan *p);

/* The layers whose h1 Hessians a run in the work directory WORK captures:
 * those make would remake on its way to the plan (the steps before the
 * plan, without the order-only edges between captures), from the times of
 * the files there, each file a secondary target as in the Makefile.
 * recap[l] set for each layer 0..p->last. 0, or -1 with x3_errmsg. */
int x3_plan_recap(const x3_plan *p, const char *work, unsigned char *recap);

/* Write the rules of the work directory (rules.mk: the captures, every
 * encode, draw and sampled measurement the plan needs, the sensitivity's
 * and the plan's steps, the lists) with RECAP's layers getting the
 * order-only edges. 0, or -1 with x3_errmsg. */
int x3_plan_write_rules(const x3_plan *p, const unsigned char *recap, FILE *f);

/* The groups of the sensitivity measurement, one "GROUP|MEMBER ..." line
 * each (tmp/sens-groups). */
int x3_plan_write_sens_groups(const x3_plan *p, FILE *f);

/* The fan-out lists: the measurement encodes (LIST "meas") or the draws'
 * encodes ("draws"), one file a line, relative to the work directory. */
int x3_plan_write_list(const x3_plan *p, const char *list, FILE *f);

/* plan.mk from a bitalloc plan (PLAN_JSON): K.<key> of every linear, the
 * final encodes FINAL and FINAL_L<layer>. 0, or -1 with x3_errmsg naming
 * the file or the linear. */
int x3_plan_write_finals(const x3_plan *p, const char *plan_json, FILE *f);

/* What each step reads of the model, one "KEY<tab>IDS" line each: KEY a
 * linear's key (its module's and its weight's tensors), layer.L (the
 * tensors of layer L's modules), other (of no module), config, tokenizer
 * (the files the tokenizer reads) and files (every file); IDS the
 * identities, space-separated, of those tensors by name ("NAME DTYPE
 * SHAPE BYTES XXH3", SHAPE joined by x) or files in DIGESTS' order
 * ("FILE BYTES XXH3"). DIGESTS: the lines of tensor-ls --digest (LABEL
 * names it in errors). 0, or -1 with x3_errmsg. */
int x3_plan_sources(const x3_module *m, int n, FILE *digests, const char *label, FILE *out);

#endif
