/* plan.c: the plan of a conversion: explicit make rules for the files the
 * options need, and the recapture set (plan.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "plan.h"
#include "plan_impl.h"
#include "config.h"
#include "pack.h"

/* ---- the work directory's names ------------------------------------------ */
/* Every name below is relative to the work directory; the rules write
 * them as $(W)/NAME. */
#define N_TOKENS "cal/tokens.frames"
#define N_BASE "sens/base.json"
#define N_PLAN "plan.json"
#define N_MEASURE "measure.jsonl"

static int has_k(const x3_plan_opts *o, int k)
{
	for (int i = 0; i < o->nmeasure; i++)
		if (o->measure[i] == k)
			return 1;
	return 0;
}

int x3_plan_build(const char *dir, const x3_plan_opts *o, x3_plan *p)
{
	memset(p, 0, sizeof *p);
	p->o = *o;
	if (!p->o.mtp_bits)
		p->o.mtp_bits = 4;
	x3_model_config c;
	if (x3_config_load_as(dir, X3_CONFIG_LAYOUT, &c))
		return -1;
	if (o->vision_bits && x3_config_vision(&c, o->vision_bits))
		return x3_errprefix(X3_EUNSUP, "%s", dir);
	if (x3_arch_modules(&c, &p->mods, &p->nmods))
		return x3_errprefix(X3_EFORMAT, "%s", dir);
	p->nlayers = c.n_layers;
	p->last = o->head_bits == 16 ? c.n_layers - 1 : c.n_layers;
	p->lin = calloc(p->nmods ? p->nmods : 1, sizeof *p->lin);
	if (!p->lin)
		return x3_err(X3_ENOMEM, "out of memory");
	for (int i = 0; i < p->nmods; i++) {
		const x3_module *m = &p->mods[i];
		if (m->d->kind != X3_KIND_LINEAR)
			continue;
		int head = m->d->role == X3_ROLE_HEAD;
		if (head && o->head_bits == 16)
			continue;
		x3_plan_lin *l = &p->lin[p->nlin++];
		l->m = m;
		l->head = head;
		l->vision = m->d->role == X3_ROLE_VISION;
		l->mtp = m->d->role == X3_ROLE_MTP || l->vision;
		if (m->sliced)
			snprintf(l->rows, sizeof l->rows, "%lld:%lld", (long long)m->row0,
			         (long long)(m->row0 + m->out));
	}
	if (!p->nlin)
		return x3_err(X3_EFORMAT, "%s: no linears to encode", dir);
	return 0;
}

void x3_plan_free(x3_plan *p)
{
	free(p->mods);
	free(p->lin);
	memset(p, 0, sizeof *p);
}

/* ---- the file names of one linear ---------------------------------------- */
static int draws_of(const x3_plan *p, const x3_plan_lin *l)
{
	return p->o.draws > 0 && !l->head && !l->mtp;
}

/* the encodes from Hessian set SET ("h1", "hs") at K that the plan has a
 * rule for: the measurements (the head at its width), the sensitivity's
 * encodes at its K, and the sequential finals at every measured width */
static int enc_needed(const x3_plan *p, const x3_plan_lin *l, int seq, int k)
{
	const x3_plan_opts *o = &p->o;
	if (l->mtp)
		return 0;
	if (seq && !o->sequential)
		return 0;
	if (l->head)
		return k == o->head_bits;
	if (seq)
		return has_k(o, k);
	if (!o->sample[0] && has_k(o, k))
		return 1;
	return o->sens == X3_SENS_MEASURE && k == o->sens_k;
}

/* ---- the rules ------------------------------------------------------------- */
/* The text goes to f (may be NULL) and the steps before the plan to the
 * graph (may be NULL). */
typedef struct {
	const x3_plan *p;
	FILE *f;
	graph *g;
	int err;
} emit;

static void out(emit *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(emit *e, const char *fmt, ...)
{
	if (!e->f)
		return;
	va_list ap;
	va_start(ap, fmt);
	if (vfprintf(e->f, fmt, ap) < 0)
		e->err = 1;
	va_end(ap);
}

/* a growing string */
typedef struct {
	char *s;
	size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (k < 0)
		return;
	if (b->n + k + 1 > b->cap) {
		size_t nc = (b->n + k + 1) * 2;
		char *ns = realloc(b->s, nc);
		if (!ns)
			abort();
		b->s = ns;
		b->cap = nc;
	}
	va_start(ap, fmt);
	vsnprintf(b->s + b->n, k + 1, fmt, ap);
	va_end(ap);
	b->n += k;
}

static const char *sb(const sbuf *b)
{
	return b->s ? b->s : "";
}

/* $(W)/A $(W)/B ... from "A B ..." */
static void sb_w(sbuf *b, const char *names)
{
	const char *s = names, *w;
	size_t k;
	while ((w = x3_word(&s, &k)))
		sb_add(b, " $(W)/%.*s", (int)k, w);
}

/* a rule: TARGET: DEPS (names relative to the work directory), its recipe
 * RECIPE (one line, may be empty); in the graph when PRE (a step before the
 * plan) */
static void rule(emit *e, int pre, const char *target, const char *deps, const char *recipe)
{
	sbuf d = {0};
	sb_w(&d, deps);
	out(e, "$(W)/%s:%s\n", target, sb(&d));
	if (recipe && *recipe)
		out(e, "\t%s\n", recipe);
	if (pre && e->g && x3_graph_rule(e->g, target, deps) < 0)
		e->err = 1;
	free(d.s);
}

/* a rule made from the Hessian file GROUP of SET (h1, hs) of LAYER and
 * DEPS: in the Makefile, made from the stamp of the layer's capture
 * (done/<set>cap.<layer>; the recipe captures again where the file is gone:
 * hneed in convert.mk), in the graph from the file itself, a secondary
 * target made from that stamp */
static void rule_h(emit *e, int pre, const char *target, const char *set, const char *group, int layer,
                   const char *deps, const char *recipe)
{
	sbuf d = {0}, gd = {0};
	sb_w(&d, deps);
	out(e, "$(W)/%s: $(W)/done/%scap.%d%s\n", target, set, layer, sb(&d));
	if (recipe && *recipe)
		out(e, "\t%s\n", recipe);
	if (pre && e->g) {
		sb_add(&gd, "%s/%s.frames %s", set, group, deps);
		if (x3_graph_rule(e->g, target, sb(&gd)) < 0)
			e->err = 1;
	}
	free(d.s);
	free(gd.s);
}

static void enc_name(sbuf *b, const x3_plan_lin *l, const char *set, int k)
{
	sb_add(b, "enc/%s.%s.k%d.frames", l->m->key, set, k);
}

/* the measurements of a linear: the head at its width; a decoder linear at
 * every measured width, whole or sampled */
static void meas_names(const x3_plan *p, const x3_plan_lin *l, sbuf *b)
{
	if (l->mtp)
		return;
	if (l->head) {
		sb_add(b, " ");
		enc_name(b, l, "h1", p->o.head_bits);
		return;
	}
	for (int i = 0; i < p->o.nmeasure; i++) {
		if (p->o.sample[0])
			sb_add(b, " enc/%s.h1.k%d.s%s.json", l->m->key, p->o.measure[i], p->o.sample);
		else {
			sb_add(b, " ");
			enc_name(b, l, "h1", p->o.measure[i]);
		}
	}
}

/* the sensitivity's groups: names and members (decoder linears) */
static void sens_group_name(const x3_plan *p, const x3_plan_lin *l, char *buf, size_t n)
{
	if (p->o.sens_by == X3_SENS_BY_TENSOR)
		snprintf(buf, n, "%s", l->m->key);
	else if (p->o.sens_by == X3_SENS_BY_GROUP)
		snprintf(buf, n, "%s", l->m->group);
	else
		snprintf(buf, n, "layer.%d.%s", l->m->layer, x3_role_name(l->m->d->role));
}

typedef struct {
	char name[X3_KEY_MAX + 32];
	sbuf members;        /* "A B C" */
} sgroup;

static void sens_groups_free(sgroup *g, int n)
{
	for (int i = 0; i < n; i++)
		free(g[i].members.s);
	free(g);
}

static int sens_groups(const x3_plan *p, sgroup **out, int *n)
{
	sgroup *g = calloc(p->nlin, sizeof *g);
	if (!g)
		return x3_err(X3_ENOMEM, "out of memory");
	int ng = 0;
	/* the groups in the order of their first linear; a name's group by
	 * hash (node j of the set is group j) */
	graph set = {0};
	for (int i = 0; i < p->nlin; i++) {
		const x3_plan_lin *l = &p->lin[i];
		if (l->head || l->mtp)
			continue;
		char name[sizeof g->name];
		sens_group_name(p, l, name, sizeof name);
		int j = x3_graph_find(&set, name, 1);
		if (j < 0) {
			x3_graph_free(&set);
			sens_groups_free(g, ng);
			return x3_err(X3_ENOMEM, "out of memory");
		}
		if (j == ng) {
			ng++;
			snprintf(g[j].name, sizeof g[j].name, "%s", name);
		}
		sb_add(&g[j].members, "%s%s", g[j].members.n ? " " : "", l->m->key);
	}
	x3_graph_free(&set);
	*out = g;
	*n = ng;
	return 0;
}


/* the rule of an encode of L at K from the Hessians of h1 (SEQ 0) or hs */
static void enc_rule(emit *e, const x3_plan_lin *l, int seq, int k)
{
	const x3_plan *p = e->p;
	const x3_module *m = l->m;
	const char *set = seq ? "hs" : "h1";
	int sk = p->o.sens_k, pick = draws_of(p, l) && !seq;
	sbuf t = {0}, d = {0};
	if (l->mtp) {
		/* without a Hessian (ExLlamaV3 encodes these uncalibrated) */
		enc_name(&t, l, "u", k);
		sb_add(&d, "params/quant src/%s", m->key);
		char rec[2048];
		snprintf(rec, sizeof rec, "$(call encu,%s,%s,%d,%s,%d)", m->key, m->weight, m->bias, l->rows, k);
		rule(e, 0, sb(&t), sb(&d), rec);
		free(t.s);
		free(d.s);
		return;
	}
	enc_name(&t, l, set, k);
	sb_add(&d, "params/quant src/%s", m->key);
	if (pick)
		sb_add(&d, " draw/%s.k%d.pick params/draw", m->key, sk);
	char rec[2048];
	if (pick && k == sk)
		snprintf(rec, sizeof rec, "$(call encpick,%s)", m->key);
	else
		snprintf(rec, sizeof rec, "$(call enc,%s,%s,%d,%s,%s,%s,%d,%s,%d)", m->key, m->weight,
		         m->bias, l->rows, set, m->group, k, pick ? "1" : "", m->layer);
	rule_h(e, !seq, sb(&t), set, m->group, m->layer, sb(&d), rec);
	free(t.s);
	free(d.s);
}

/* the variables: RECAP (the layers whose h1 Hessians this run captures),
 * SRC_L<l>, SRC_ALL, PASS_L<l>, DECODER, HEAD; SRCALL gets what the steps
 * over the whole model read (names relative to the work directory) */
static void write_vars(emit *e, const unsigned char *recap, sbuf *srcall)
{
	const x3_plan *p = e->p;
	int nl = p->nlayers, last = p->last;

	out(e, "# rules.mk: the conversion's steps, written by convert-plan from the\n"
	       "# model's description and the options (man convert-plan); the recipes\n"
	       "# are pipelines/convert.mk's\n");
	out(e, "RECAP ?=");
	for (int l = 0; l <= last; l++)
		if (recap && recap[l])
			out(e, " %d", l);
	out(e, "\n");
	/* SRC_L<l>: what the captures of layer l read of the model */
	sbuf srcl = {0};
	sb_add(&srcl, "src/config src/layer.-1");
	for (int l = 0; l <= nl; l++) {
		sb_add(&srcl, " src/layer.%d", l);
		sbuf v = {0};
		sb_w(&v, sb(&srcl));
		out(e, "SRC_L%d :=%s\n", l, sb(&v));
		free(v.s);
	}
	sb_add(srcall, "%s src/other", sb(&srcl));
	{
		sbuf v = {0};
		sb_w(&v, sb(srcall));
		out(e, "SRC_ALL :=%s\n", sb(&v));
		free(v.s);
	}
	/* PASS_L<l>: the tensors of layer l that are passed through */
	for (int l = 0; l < nl; l++) {
		int any = 0;
		for (int i = 0; i < p->nmods; i++) {
			const x3_module *m = &p->mods[i];
			if (m->d->kind == X3_KIND_LINEAR || m->layer != l)
				continue;
			if (!any)
				out(e, "PASS_L%d :=", l);
			out(e, " %s", m->weight);
			any = 1;
		}
		if (any)
			out(e, "\n");
	}
	/* the keys */
	out(e, "DECODER :=");
	for (int i = 0; i < p->nlin; i++)
		if (!p->lin[i].head && !p->lin[i].mtp)
			out(e, " %s", p->lin[i].m->key);
	out(e, "\nHEAD :=");
	for (int i = 0; i < p->nlin; i++)
		if (p->lin[i].head)
			out(e, " %s", p->lin[i].m->key);
	out(e, "\n");
	free(srcl.s);
}

/* MEAS, MEAS_L<l>: the measurements (and with SAMPLE and the
 * sensitivity, its encodes: they need the same Hessians); MEAS gets their
 * names */
static void write_meas(emit *e, sbuf *meas)
{
	const x3_plan *p = e->p;
	const x3_plan_opts *o = &p->o;
	int nl = p->nlayers, sk = o->sens_k;

	for (int i = 0; i < p->nlin; i++)
		meas_names(p, &p->lin[i], meas);
	{
		sbuf v = {0};
		sb_w(&v, sb(meas));
		out(e, "MEAS :=%s\n", sb(&v));
		free(v.s);
	}
	for (int l = -1; l <= nl; l++) {
		sbuf ml = {0};
		for (int i = 0; i < p->nlin; i++) {
			const x3_plan_lin *li = &p->lin[i];
			if (li->m->layer != l)
				continue;
			meas_names(p, li, &ml);
			if (o->sample[0] && o->sens == X3_SENS_MEASURE && !li->head) {
				sb_add(&ml, " ");
				enc_name(&ml, li, "h1", sk);
			}
		}
		if (ml.n) {
			sbuf v = {0};
			sb_w(&v, sb(&ml));
			out(e, "MEAS_L%d :=%s\n", l, sb(&v));
			free(v.s);
		}
		free(ml.s);
	}
}

/* ---- captures: one rule per layer and Hessian set, its stamp ------- */

/* a layer's Hessian files: h1 and hs ($(W)/SET/GROUP.frames), those of its
 * experts (ex1, exs), and the h1 names relative to the work directory */
typedef struct {
	sbuf h1, hs, ex1, exs, h1n;
} layer_files;

static void layer_files_free(layer_files *f)
{
	free(f->h1.s);
	free(f->hs.s);
	free(f->ex1.s);
	free(f->exs.s);
	free(f->h1n.s);
}

/* the Hessian groups of layer L, each once (FIRST: the first linear of
 * each group), in model order */
static void layer_groups(const x3_plan *p, const unsigned char *first, int l, layer_files *f)
{
	for (int i = 0; i < p->nlin; i++) {
		const x3_module *m = p->lin[i].m;
		if (m->layer != l || !first[i])
			continue;
		sb_add(&f->h1, "%s$(W)/h1/%s.frames", f->h1.n ? " " : "", m->group);
		sb_add(&f->h1n, " h1/%s.frames", m->group);
		sb_add(&f->hs, "%s$(W)/hs/%s.frames", f->hs.n ? " " : "", m->group);
		if (m->d->role == X3_ROLE_EXPERT) {
			sb_add(&f->ex1, "%s$(W)/h1/%s.frames", f->ex1.n ? " " : "", m->group);
			sb_add(&f->exs, "%s$(W)/hs/%s.frames", f->exs.n ? " " : "", m->group);
		}
	}
}

/* in the graph, layer L's h1 capture: its stamp made from the tokens and
 * the layers read (without the parts and the order-only edges), each
 * Hessian file (H1N) a secondary target made from the stamp */
static void graph_h1(emit *e, int l, const char *h1n)
{
	graph *g = e->g;
	char stamp[32];
	snprintf(stamp, sizeof stamp, "done/h1cap.%d", l);
	sbuf deps = {0};
	sb_add(&deps, N_TOKENS " src/config src/layer.-1");
	for (int j = 0; j <= l; j++)
		sb_add(&deps, " src/layer.%d", j);
	int si = x3_graph_rule(g, stamp, sb(&deps));
	if (si < 0)
		e->err = 1;
	else
		g->n[si].layer1 = l + 1;
	free(deps.s);
	const char *s = h1n, *w;
	size_t k;
	while ((w = x3_word(&s, &k))) {
		char name[1024];
		snprintf(name, sizeof name, "%.*s", (int)k, w);
		int gi = x3_graph_rule(g, name, stamp);
		if (gi < 0)
			e->err = 1;
		else {
			g->n[gi].layer1 = l + 1;
			g->n[gi].secondary = 1;
		}
	}
}

/* layer L's h1 capture: one per layer, its stamp done/h1cap.L (the Hessian
 * files are made with it). It starts from the hidden states that layer
 * L-1's saved (order-only on its stamp); with BOUND, only once the
 * Hessians of layer L-2 are deleted: at most two layers' at a time; those
 * edges only for the layers of RECAP. Then done/h1.L, the stamp of its
 * measurement encodes done and the Hessians deleted (unless KEEP). */
static void write_h1_layer(emit *e, int l, const layer_files *f)
{
	int last = e->p->last;
	sbuf after = {0};
	if (l > 0)
		sb_add(&after, " $(W)/done/h1cap.%d", l - 1);
	if (l >= 2)
		sb_add(&after, " $(if $(BOUND),$(W)/done/h1.%d)", l - 2);
	char pl[16] = "", nx[16] = "", l2[16] = "";
	if (l > 0)
		snprintf(pl, sizeof pl, "%d", l - 1);
	if (l != last)
		snprintf(nx, sizeof nx, "%d", l + 1);
	if (l >= 2)
		snprintf(l2, sizeof l2, "%d", l - 2);
	out(e, "$(W)/done/h1cap.%d: $(W)/" N_TOKENS " $(SRC_L%d) $(call h1parts,%d)", l, l, l);
	if (after.n)
		out(e, " $(if $(filter %d,$(RECAP)),|%s)", l, sb(&after));
	out(e, "\n\t$(call stale,$(H1_L%d)) $(call h1cap,%d,%s,%s,$(XH1_L%d))\n", l, l, pl, nx, l);
	if (e->g)
		graph_h1(e, l, sb(&f->h1n));
	out(e, "$(foreach p,$(PARTS),$(eval $(call H1PART,%d,%s,%s,%s,$(p))))\n", l, pl, l2, nx);
	out(e, "h1-parts-%d: ; @printf '%%s\\n' $(call h1parts,%d)\n", l, l);
	out(e, "h1-groups-%d: $(W)/done/h1cap.%d\n", l, l);
	out(e, "$(W)/done/h1.%d: $(MEAS_L%d)\n\t$(call hdone,$@,$(H1_L%d))\n", l, l, l);
	free(after.s);
}

/* layer L's hs capture (sequential): its stamp done/hscap.L, made from the
 * quantized layers before it (PREV: their numbers); with SPLIT its parts
 * from the parts of the layer before (hspart), merged in chunk order
 * (hscap). Then done/hs.L (its final encodes done, the Hessians deleted)
 * and q/L, the layer's quantized tensors. */
static void write_hs_layer(emit *e, int l, const char *prev)
{
	int nl = e->p->nlayers, last = e->p->last;
	char pl[16] = "", sv[4] = "";
	if (l > 0)
		snprintf(pl, sizeof pl, "%d", l - 1);
	if (l != last)
		strcpy(sv, "1");
	sbuf ql = {0};
	const char *s = prev, *w;
	size_t k;
	while ((w = x3_word(&s, &k)))
		sb_add(&ql, " $(W)/q/layer.%.*s.safetensors", (int)k, w);
	out(e, "$(W)/done/hscap.%d: $(W)/" N_TOKENS " $(SRC_L%d)%s $(call hsparts,%d)", l, l, sb(&ql), l);
	if (l > 0)
		out(e, " | $(if $(BOUND),$(W)/done/hs.%d)", l - 1);
	out(e, "\n\t$(call stale,$(HS_L%d)) $(call hscap,%d,%s,%s,%s,$(XHS_L%d)) && $(stamp)\n", l, l,
	    prev, pl, sv, l);
	out(e, "$(foreach p,$(PARTS),$(eval $(call HSPART,%d,%s,%s,%s,$(p),%s)))\n", l, prev, pl, sv, sb(&ql));
	out(e, "hs-parts-%d: ; @printf '%%s\\n' $(call hsparts,%d)\n", l, l);
	out(e, "hs-groups-%d: $(W)/done/hscap.%d\n", l, l);
	out(e, "$(W)/done/hs.%d: $(FINAL_L%d)\n\t$(call hdone,$@,$(HS_L%d))\n", l, l, l);
	if (l < nl)
		out(e, "$(W)/q/layer.%d.safetensors: $(FINAL_L%d) $(W)/src/layer.%d\n"
		       "\t$(call qlayer,%d,$@,$(filter %%.frames,$^))\n", l, l, l, l);
	free(ql.s);
}

/* every layer's captures, the lists of their stamps and parts */
static int write_captures(emit *e)
{
	const x3_plan *p = e->p;
	int nl = p->nlayers, last = p->last;
	/* (the first linear of each Hessian group) */
	unsigned char *first = calloc(p->nlin, 1);
	graph gs = {0};
	if (!first)
		return x3_err(X3_ENOMEM, "out of memory");
	for (int i = 0; i < p->nlin; i++)
		if (!p->lin[i].mtp && x3_graph_find(&gs, p->lin[i].m->group, 0) == -2) {
			if (x3_graph_find(&gs, p->lin[i].m->group, 1) < 0)
				e->err = 1;
			first[i] = 1;
		}
	x3_graph_free(&gs);
	sbuf prev = {0}, h1all = {0};
	for (int l = 0; l <= last; l++) {
		layer_files f = {0};
		layer_groups(p, first, l, &f);
		sb_add(&h1all, " $(W)/done/h1cap.%d", l);
		/* the layer's Hessian files (H1_L, HS_L) and its experts' (XH1_L,
		 * XHS_L, exrec) */
		out(e, "H1_L%d := %s\nHS_L%d := %s\nXH1_L%d := %s\nXHS_L%d := %s\n", l, sb(&f.h1), l, sb(&f.hs),
		    l, sb(&f.ex1), l, sb(&f.exs));
		write_h1_layer(e, l, &f);
		write_hs_layer(e, l, sb(&prev));
		sb_add(&prev, "%s%d", prev.n ? " " : "", l);
		layer_files_free(&f);
	}
	out(e, "h1-groups:%s\n", sb(&h1all));
	/* the capture parts are deleted once merged: secondary, so that the
	 * stamps made from them are kept (only those: make checks a missing
	 * secondary file's prerequisites again for each dependent) */
	out(e, "ifneq ($(PARTS),)\n.SECONDARY: $(foreach l,");
	for (int l = 0; l <= last; l++)
		out(e, "%s%d", l ? " " : "", l);
	out(e, ",$(call h1parts,$(l)) $(call hsparts,$(l)))\nendif\n");
	out(e, "HDONE := ");
	for (int l = 0; l <= last; l++)
		out(e, " $(W)/done/h1.%d $(if $(filter sequential,$(MODE)),$(W)/done/hs.%d)", l, l);
	out(e, "\n.PHONY: h1-groups");
	for (int l = 0; l <= nl; l++)
		out(e, " h1-parts-%d hs-parts-%d", l, l);
	for (int l = 0; l <= nl; l++)
		out(e, " h1-groups-%d hs-groups-%d", l, l);
	out(e, "\n");
	free(prev.s);
	free(h1all.s);
	free(first);
	return 0;
}

/* ---- per linear: encodes, draws, sampled measurements ---------------- */
static void write_linears(emit *e)
{
	const x3_plan *p = e->p;
	const x3_plan_opts *o = &p->o;
	int sk = o->sens_k;
	sbuf drawf = {0}, drawp = {0};
	for (int i = 0; i < p->nlin; i++) {
		const x3_plan_lin *l = &p->lin[i];
		const x3_module *m = l->m;
		int dr = draws_of(p, l);
		for (int seq = 0; seq < 2; seq++)
			for (int k = 1; k <= 8; k++)
				if (enc_needed(p, l, seq, k))
					enc_rule(e, l, seq, k);
		if (dr) {
			sbuf js = {0};
			for (int dd = 0; dd < o->draws; dd++) {
				char tg[X3_KEY_MAX + 64], dp[3 * X3_KEY_MAX], rec[2048];
				snprintf(tg, sizeof tg, "draw/%s.k%d.d%d.frames", m->key, sk, dd);
				snprintf(dp, sizeof dp, "params/quant src/%s", m->key);
				snprintf(rec, sizeof rec, "$(call draw,%s,%s,%d,%s,%s,%d,%d)", m->key, m->weight, m->bias,
				         l->rows, m->group, dd, m->layer);
				rule_h(e, 1, tg, "h1", m->group, m->layer, dp, rec);
				sb_add(&drawf, " $(W)/%s", tg);
				char tj[X3_KEY_MAX + 64];
				snprintf(tj, sizeof tj, "draw/%s.k%d.d%d.json", m->key, sk, dd);
				snprintf(dp, sizeof dp, "%s " N_BASE, tg);
				snprintf(rec, sizeof rec, "$(call sensg,%s.k%d.d%d)", m->key, sk, dd);
				rule(e, 1, tj, dp, rec);
				sb_add(&js, " %s", tj);
			}
			char tp[X3_KEY_MAX + 64];
			snprintf(tp, sizeof tp, "draw/%s.k%d.pick", m->key, sk);
			rule(e, 1, tp, sb(&js), "$(pick)");
			sb_add(&drawp, " $(W)/%s", tp);
			free(js.s);
		}
		if (o->sample[0] && !l->head && !l->mtp)
			for (int j = 0; j < o->nmeasure; j++) {
				int k = o->measure[j];
				char tg[X3_KEY_MAX + 64], dp[3 * X3_KEY_MAX], rec[2048];
				snprintf(tg, sizeof tg, "enc/%s.h1.k%d.s%s.json", m->key, k, o->sample);
				snprintf(dp, sizeof dp, "params/quant src/%s", m->key);
				snprintf(rec, sizeof rec, "$(call smeas,%s,%s,%s,%s,%d,%d)", m->key, m->weight, l->rows,
				         m->group, k, m->layer);
				rule_h(e, 1, tg, "h1", m->group, m->layer, dp, rec);
				if (o->sequential)
					continue;
				/* the final encode at a sampled width */
				char tf[X3_KEY_MAX + 64];
				snprintf(tf, sizeof tf, "enc/%s.h1.k%d.s%s.frames", m->key, k, o->sample);
				snprintf(dp, sizeof dp, "params/quant src/%s %s", m->key, tg);
				snprintf(rec, sizeof rec, "$(call sfin,%s,%s,%d,%s,%s,%d,%d)", m->key, m->weight, m->bias,
				         l->rows, m->group, k, m->layer);
				rule_h(e, 0, tf, "h1", m->group, m->layer, dp, rec);
			}
	}
	out(e, "DRAWF :=%s\nDRAWP :=%s\n", sb(&drawf), sb(&drawp));
	free(drawf.s);
	free(drawp.s);
}

/* ---- the sensitivity: a KL per group (SRCALL: what the base logits are
 * made from) ------------------------------------------------------------ */
static int write_sens(emit *e, const char *srcall)
{
	const x3_plan *p = e->p;
	const x3_plan_opts *o = &p->o;
	int sk = o->sens_k;
	sbuf sensg = {0}, senserr = {0};
	if (o->sens == X3_SENS_MEASURE) {
		sgroup *sg;
		int ng;
		if (sens_groups(p, &sg, &ng))
			return -1;
		sbuf all = {0};
		for (int j = 0; j < ng; j++) {
			sbuf fr = {0};
			const char *s = sb(&sg[j].members), *w;
			size_t k;
			while ((w = x3_word(&s, &k)))
				sb_add(&fr, " enc/%.*s.h1.k%d.frames", (int)k, w, sk);
			char tg[X3_KEY_MAX + 64];
			snprintf(tg, sizeof tg, "sens/%s.k%d.json", sg[j].name, sk);
			if (o->draws > 0 && o->sens_by == X3_SENS_BY_TENSOR) {
				/* the picked draw's KL is this measurement already */
				char dp[X3_KEY_MAX + 64], rec[2 * X3_KEY_MAX + 128];
				snprintf(dp, sizeof dp, "draw/%s.k%d.pick", sg[j].name, sk);
				snprintf(rec, sizeof rec, "$(call senspick,%s)", sg[j].name);
				rule(e, 1, tg, dp, rec);
			} else {
				sbuf dp = {0};
				sb_add(&dp, "%s " N_BASE, sb(&fr));
				char rec[X3_KEY_MAX + 64];
				snprintf(rec, sizeof rec, "$(call sensg,%s)", sg[j].name);
				rule(e, 1, tg, sb(&dp), rec);
				free(dp.s);
			}
			sb_add(&sensg, " %s", tg);
			sb_add(&all, "%s", sb(&fr));
			free(fr.s);
		}
		char tg[64];
		snprintf(tg, sizeof tg, "sens/all.k%d.json", sk);
		sb_add(&all, " " N_BASE);
		rule(e, 1, tg, sb(&all), "$(call sensg,all)");
		free(all.s);
		sens_groups_free(sg, ng);
		{
			sbuf v = {0};
			sb_w(&v, sb(&sensg));
			out(e, "SENS_GROUPS :=%s\n", sb(&v));
			free(v.s);
		}
		rule(e, 1, "sens/groups.jsonl", "params/sens", "$(sens_groups_jsonl)");
		for (int i = 0; i < p->nlin; i++)
			if (!p->lin[i].head && !p->lin[i].mtp)
				sb_add(&senserr, " enc/%s.h1.k%d.frames", p->lin[i].m->key, sk);
		{
			sbuf v = {0};
			sb_w(&v, sb(&senserr));
			out(e, "SENS_ERR :=%s\n", sb(&v));
			free(v.s);
		}
		sbuf dp = {0};
		sb_add(&dp, "%s sens/all.k%d.json sens/groups.jsonl%s", sb(&sensg), sk, sb(&senserr));
		char tm[64];
		snprintf(tm, sizeof tm, "sens/measured.k%d.jsonl", sk);
		rule(e, 1, tm, sb(&dp), NULL);
		free(dp.s);
	}
	if (o->sens != X3_SENS_OFF)
		out(e, "SENS_FILE := %s\n", o->sens_file);
	if (o->sens != X3_SENS_OFF || o->draws > 0) {
		char dp[256];
		snprintf(dp, sizeof dp, N_TOKENS " params/sens %s", srcall);
		rule(e, 1, N_BASE, dp, NULL);
	}
	if (o->sens != X3_SENS_OFF) {
		char dp[128];
		snprintf(dp, sizeof dp, "%s params/sensfile", o->sens_file);
		rule(e, 1, "sensitivity.jsonl", dp, NULL);
		rule(e, 1, "importance.jsonl", "sensitivity.jsonl", NULL);
	}
	free(sensg.s);
	free(senserr.s);
	return 0;
}

/* ---- the steps of the plan (MEAS: the measurements' names) ------------ */
static void write_plan_steps(emit *e, const char *meas)
{
	const x3_plan_opts *o = &e->p->o;
	rule(e, 1, N_TOKENS, "cal/cal.txt params/capture src/tokenizer", NULL);
	{
		/* (written with $(MEAS), in the graph with its names) */
		sbuf dp = {0};
		sb_add(&dp, "%s params/plan", meas);
		out(e, "$(W)/" N_MEASURE ": $(MEAS) $(W)/params/plan\n");
		if (e->g && x3_graph_rule(e->g, N_MEASURE, sb(&dp)) < 0)
			e->err = 1;
		free(dp.s);
	}
	rule(e, 1, N_PLAN, o->sens != X3_SENS_OFF ? N_MEASURE " src/config importance.jsonl" :
	                                              N_MEASURE " src/config", NULL);
	rule(e, 1, "plan.mk", N_PLAN " Makefile convert.mk", NULL);
}

static int write_all(const x3_plan *p, const unsigned char *recap, FILE *f, graph *g)
{
	emit e = {p, f, g, 0};
	sbuf srcall = {0}, meas = {0};
	write_vars(&e, recap, &srcall);
	write_meas(&e, &meas);
	int rc = write_captures(&e);
	if (!rc) {
		write_linears(&e);
		rc = write_sens(&e, sb(&srcall));
	}
	if (!rc)
		write_plan_steps(&e, sb(&meas));
	free(srcall.s);
	free(meas.s);
	if (rc)
		return rc;
	if (e.err)
		return x3_err(X3_EIO, "cannot write the rules");
	return 0;
}

int x3_plan_write_rules(const x3_plan *p, const unsigned char *recap, FILE *f)
{
	return write_all(p, recap, f, NULL);
}

int x3_plan_recap(const x3_plan *p, const char *work, unsigned char *recap)
{
	graph g = {0};
	g.work = work;
	int rc = write_all(p, NULL, NULL, &g);
	if (!rc) {
		int top = x3_graph_find(&g, "plan.mk", 0);
		if (top >= 0)
			x3_graph_made(&g, top);
		memset(recap, 0, p->last + 1);
		for (int i = 0; i < g.nn; i++) {
			gnode *n = &g.n[i];
			if (!n->made || !n->layer1)
				continue;
			int l = n->layer1 - 1;
			if (l <= p->last)
				recap[l] = 1;
		}
	}
	x3_graph_free(&g);
	return rc;
}

int x3_plan_write_sens_groups(const x3_plan *p, FILE *f)
{
	sgroup *g;
	int n;
	if (sens_groups(p, &g, &n))
		return -1;
	int err = 0;
	for (int i = 0; i < n; i++)
		err |= fprintf(f, "%s|%s\n", g[i].name, sb(&g[i].members)) < 0;
	sens_groups_free(g, n);
	return err ? x3_err(X3_EIO, "cannot write the groups") : 0;
}

int x3_plan_write_list(const x3_plan *p, const char *list, FILE *f)
{
	int err = 0;
	if (!strcmp(list, "meas")) {
		sbuf b = {0};
		for (int i = 0; i < p->nlin; i++)
			meas_names(p, &p->lin[i], &b);
		const char *s = sb(&b), *w;
		size_t k;
		while ((w = x3_word(&s, &k)))
			err |= fprintf(f, "%.*s\n", (int)k, w) < 0;
		free(b.s);
	} else if (!strcmp(list, "draws")) {
		for (int i = 0; i < p->nlin; i++)
			if (draws_of(p, &p->lin[i]))
				for (int dd = 0; dd < p->o.draws; dd++)
					err |= fprintf(f, "draw/%s.k%d.d%d.frames\n", p->lin[i].m->key, p->o.sens_k, dd) < 0;
	} else
		return x3_err(X3_EINVAL, "no list '%s' (meas, draws)", list);
	return err ? x3_err(X3_EIO, "cannot write the list") : 0;
}

int x3_plan_write_finals(const x3_plan *p, const char *plan_json, FILE *f)
{
	const x3_plan_opts *o = &p->o;
	FILE *in = fopen(plan_json, "rb");
	if (!in)
		return x3_err(X3_EIO, "%s: %s", plan_json, strerror(errno));
	sbuf txt = {0};
	char buf[65536];
	size_t k;
	while ((k = fread(buf, 1, sizeof buf, in)) > 0)
		sb_add(&txt, "%.*s", (int)k, buf);
	int rerr = ferror(in);
	fclose(in);
	if (rerr) {
		free(txt.s);
		return x3_err(X3_EIO, "%s: read error", plan_json);
	}
	emit e = {p, f, NULL, 0};
	x3_pack_plan pl;
	if (x3_pack_plan_parse(sb(&txt), plan_json, p->mods, p->nmods, &pl)) {
		free(txt.s);
		return -1;
	}
	free(txt.s);
	int rc = 0, err = 0;
	sbuf *byl = calloc(p->nlayers + 2, sizeof *byl);
	sbuf all = {0};
	if (!byl) {
		x3_pack_plan_free(&pl);
		return x3_err(X3_ENOMEM, "out of memory");
	}
	err |= fprintf(f, "# plan.mk: the planned K of every linear and the final encodes,\n"
	                  "# written by convert-plan --finals from %s\n", plan_json) < 0;
	for (int i = 0; i < p->nlin && !rc; i++) {
		const x3_plan_lin *l = &p->lin[i];
		int K = l->vision ? o->vision_bits : l->mtp ? o->mtp_bits : pl.K[l->m - p->mods];
		if (!K)
			continue;
		err |= fprintf(f, "K.%s := %d\n", l->m->key, K) < 0;
		sbuf nm = {0};
		if (l->mtp) {
			enc_name(&nm, l, "u", K);
			enc_rule(&e, l, 0, K);
		} else if (o->sample[0] && !o->sequential && !l->head && has_k(o, K))
			sb_add(&nm, "enc/%s.h1.k%d.s%s.frames", l->m->key, K, o->sample);
		else {
			/* a width outside the measured set (the plan's own): its rule
			 * here, for rules.mk has none */
			enc_name(&nm, l, o->sequential ? "hs" : "h1", K);
			if (!enc_needed(p, l, o->sequential, K))
				enc_rule(&e, l, o->sequential, K);
		}
		if (!rc) {
			int li = l->m->layer;
			sb_add(&byl[li < 0 ? 0 : li > p->nlayers ? p->nlayers + 1 : li], " $(W)/%s", sb(&nm));
			sb_add(&all, " $(W)/%s", sb(&nm));
		}
		free(nm.s);
	}
	if (!rc) {
		err |= fprintf(f, "FINAL :=%s\n", sb(&all)) < 0;
		for (int l = 0; l <= p->nlayers; l++)
			if (byl[l].n)
				err |= fprintf(f, "FINAL_L%d :=%s\n", l, sb(&byl[l])) < 0;
		if (err || e.err)
			rc = x3_err(X3_EIO, "cannot write plan.mk");
	}
	for (int l = 0; l <= p->nlayers + 1; l++)
		free(byl[l].s);
	free(byl);
	free(all.s);
	x3_pack_plan_free(&pl);
	return rc;
}
