
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
.DELETE_ON_ERROR:
.SUFFIXES:
all: $(OUT)/config.json $(if $(KEEP),,hessians-done)
ifneq ($(SPLIT),)
include $(W)/parts.mk
endif
# (NOPLAN=1: without the plan: the steps before it, the encodes, the lists)
ifeq ($(NOPLAN),)
include $(W)/plan.mk
endif
# the final encodes (FINAL, FINAL_L<layer>) come with the plan (plan.mk,
# convert-plan --finals); the measurements (MEAS, MEAS_L<layer>) and every
# per-tensor rule with the steps (rules.mk, convert-plan)
# (used by rules.mk: the parts of a capture, see h1part below)
h1parts = $(foreach p,$(PARTS),$(W)/h1/part.$(1).$(p).frames)
define H1PART
$(W)/h1/part.$(1).$(5).frames: $(W)/cal/tokens.frames $(W)/parts.mk $(SRC_L$(1)) $(if $(filter $(1),$(RECAP)),$(if $(2),| $(W)/done/h1cap.$(2) $(if $(3),$(if $(BOUND),$(W)/done/h1.$(3)))))
	$$(call h1part,$(1),$(2),$(4),$(5))
endef
# (the same for hs: see hspart below)
hsparts = $(foreach p,$(PARTS),$(W)/hs/part.$(1).$(p).frames)
define HSPART
$(W)/hs/part.$(1).$(5).frames: $(W)/cal/tokens.frames $(W)/parts.mk $(SRC_L$(1)) $(6) $(if $(3),| $$(if $$(BOUND),$(W)/done/hs.$(3)))
	$$(call hspart,$(1),$(2),$(3),$(4),$(5))
endef
include $(W)/rules.mk

# ---- calibration tokens: text rows (tokenize) + random-token rows --------
$(W)/cal/tokens.frames:
	tokenize -q -t $(MODEL) --rows $(TEXT_ROWS) --cols $(COLS) --split lines --even-odd $(W)/cal/cal.txt >$@.tmp
	# short text: said in terms of --rows (tokenize knows only the text rows)
	got=$$(tensor-ls $@.tmp | jq '.shape[0]'); if [ "$$got" -lt $(TEXT_ROWS) ]; then \
	  echo "convert: warning: the calibration text fills $$got of the $(TEXT_ROWS) text rows of --rows $(ROWS) (the other $(RANDOM_ROWS) are random tokens): $$((got + $(RANDOM_ROWS))) rows of $(COLS) tokens in all" >&2; fi
	if [ $(RANDOM_ROWS) -gt 0 ]; then \
	  tensor-gen -t I32 -d uniform -s 0 --mean $$(( ($(VOCAB) - 1) / 2 )) \
	    --scale $$(( ($(VOCAB) - 1) / 2 )) random=$(RANDOM_ROWS)x$(COLS) >>$@.tmp; fi
	mv -f $@.tmp $@

# ---- Hessians ------------------------------------------------------------
# Each capture streams its Hessians into one file per group (tensor-cat
# --split, each file written atomically); rules.mk has a rule per capture,
# whose target is its stamp (done/h1cap.i, done/hscap.i), and the encodes
# are made from the stamp (hneed: a Hessian file deleted and needed again).
# h1: the groups of the original model, one capture per layer: layer i's
# starts from the hidden states entering it, saved by layer i-1's
# (--hidden-next: its output, h1/hidden.i-1.frames, deleted once read; so
# each capture runs its own layer alone; where missing, a resumed
# conversion, it runs layers 0..i), and ends with its stamp done/h1cap.i.
# (The sequential captures, hs, save the states entering their own layer,
# --hidden-out: the next one runs this layer again, quantized.)
# The Hessians are those of one forward pass over every layer.
# The hidden states are saved only for a next layer this run captures too
# (RECAP), so that none is left behind.
# $(1) layer, $(2) layer - 1, $(3) layer + 1 (empty for the last)
# $(4): the layer's experts' Hessian files, whose metadata (routed tokens,
# fallback) is kept in experts/h1.i.jsonl (exrec) before they are deleted
h1cap = $(if $(PARTS),$(call h1merge,$(1),$(4)),$(call h1one,$(1),$(2),$(3),$(4)))
# stale FILES: remove what a killed run left of FILES being written (each
# program writes FILE.tmp-XXXXXX and renames it when whole; a recipe
# FILE.tmp): convert removes them all when it starts, a make of the work
# directory run by hand before each step that writes FILES, so that no
# hidden states or F64 sums of a killed step stay behind
stale = rm -f $(foreach f,$(1),$(f).tmp $(f).tmp-??????) &&
h1one = $(call stale,$(W)/h1/hidden.$(1).frames $(W)/timing/h1.$(1).json) hin=$(if $(2),$(W)/h1/hidden.$(2).frames) && { [ -n "$$hin" ] && [ -f "$$hin" ] || hin=; } && \
  hessian-capture -q $(CAPOPT) --spill $(W)/tmp --model $(MODEL) --tokens $(W)/cal/tokens.frames --cols $(COLS) \
    --layers $(1)-$(1) $${hin:+--hidden-in "$$hin"} $(if $(filter $(3),$(RECAP)),--hidden-next $(W)/h1/hidden.$(1).frames) \
    --timing $(W)/timing/h1.$(1).json | tensor-cat -q --split $(W)/h1 - && $(call exrec,h1.$(1),$(4)) rm -f $${hin:+"$$hin"} && \
  $(call tkeep,h1,$(1),h1.$(1).json) $(stamp)
# stamp: a capture's stamp (done/h1cap.i, done/hscap.i), dated as the
# newest of what the capture is made from, not now: its prerequisites
# but the parts (made by this run, then deleted), and what the parts are
# made from (parts.mk). The capture run again from the same inputs
# (RECAP, hneed) makes the same Hessians, and the encodes made from them
# before stay up to date (only the new widths are encoded).
stamp = touch -r "$$(ls -td -- $(filter-out %.frames,$^) $(W)/cal/tokens.frames $(if $(PARTS),$(W)/parts.mk) | head -n 1)" $@
# tkeep SET,LAYER,NAMES: delete the other capture timing files of SET (h1
# or hs) and LAYER in WORK/timing, those of a capture that ran in parts or
# in other parts before (a changed --chunk-rows or -j), so that the time
# report counts each capture once; NAMES are this capture's (SET.LAYER.json,
# or SET.LAYER.pP.json for every P of PARTS)
tkeep = keep=" $(addprefix $(W)/timing/,$(3)) " && for f in $(W)/timing/$(1).$(2).*json; do \
    case "$$keep" in *" $$f "*) ;; *) rm -f "$$f" ;; esac; done &&
# exrec NAME FILES: one JSON line per expert Hessian group of FILES (layer,
# expert, routed tokens, fallback: hessian-capture's metadata) in
# experts/NAME.jsonl, for convert's summary; nothing without FILES
exrec = $(if $(2),mkdir -p $(W)/experts && tensor-ls $(2) | jq -c '$(EXREC_JQ)' >$(W)/experts/$(1).jsonl.tmp && \
  mv -f $(W)/experts/$(1).jsonl.tmp $(W)/experts/$(1).jsonl &&)
EXREC_JQ := select(.meta.expert != null) | {group: .name, layer: (.meta.layer | tonumber), \
  expert: (.meta.expert | tonumber), capture: .meta.capture, routed_tokens: (.meta.routed_tokens | tonumber), \
  fallback: (.meta.expert_fallback == "1"), fallback_tokens: (.meta.fallback_tokens // "0" | tonumber)}
# SPLIT: part P of layer i, h1/part.i.P.frames (F64 partial sums), from the
# hidden states of its rows that part P of layer i-1 saved
# (h1/hidden.i-1.P.frames); the capture of layer i merges the parts in
# chunk order and deletes them. A part waits as the whole capture would.
# $(1) layer, $(2) layer - 1, $(3) layer - 2, $(4) layer + 1, $(5) part
h1part = $(call stale,$@ $@.tmp $(W)/h1/hidden.$(1).$(4).frames $(W)/timing/h1.$(1).p$(4).json) hin=$(if $(2),$(W)/h1/hidden.$(2).$(4).frames) && { [ -n "$$hin" ] && [ -f "$$hin" ] || hin=; } && \
  OMP_NUM_THREADS=$(THREADS) OPENBLAS_NUM_THREADS=$(THREADS) \
  hessian-capture -q $(CAPOPT) --model $(MODEL) --tokens $(W)/cal/tokens.frames --cols $(COLS) --part $(4) \
    --layers $(1)-$(1) $${hin:+--hidden-in "$$hin"} $(if $(filter $(3),$(RECAP)),--hidden-next $(W)/h1/hidden.$(1).$(4).frames) \
    --timing $(W)/timing/h1.$(1).p$(4).json -o $@.tmp && mv -f $@.tmp $@ && rm -f $${hin:+"$$hin"}
h1merge = hessian-capture -q --merge $(call h1parts,$(1)) | tensor-cat -q --split $(W)/h1 - && \
  $(call exrec,h1.$(1),$(2)) rm -f $(call h1parts,$(1)) && \
  $(call tkeep,h1,$(1),$(foreach p,$(PARTS),h1.$(1).p$(p).json)) $(stamp)
# the chunks of the calibration (more than one, else no parts)
# (every make of a fan-out includes it, so several may remake it at once:
# each writes a temporary file of its own, and the renames are atomic)
$(W)/parts.mk: $(W)/cal/tokens.frames $(W)/params/capture
	p=$$(hessian-capture -q --model $(MODEL) --tokens $< --cols $(COLS) --chunk-rows $(CHUNK_ROWS) --list-parts | paste -sd' ') && \
	t=$$(mktemp $@.tmp-XXXXXX) && \
	{ echo "# parts.mk: the calibration chunks (hessian-capture --list-parts), written by make"; \
	  case $$p in *' '*) echo "PARTS := $$p" ;; *) echo "PARTS :=" ;; esac; } >$$t && mv -f $$t $@

# done/h1.i, done/hs.i: layer i's encodes from those Hessians are made;
# its Hessian files are deleted (unless KEEP). The encodes are made from
# the capture's stamp, which stays, so a resumed conversion does not
# capture a finished layer again. (No other target is .SECONDARY but the
# capture parts, deleted once merged: make checks a missing secondary
# file's prerequisites again for each dependent, which at hundreds of
# experts a layer takes minutes when every file is secondary.)
# $(1) the stamp, $(2) the layer's Hessian files
hdone = $(if $(KEEP),,rm -f $(2) &&) touch $(1)
hessians-done: $(HDONE)

# hs (sequential): layer i captured with layers < i taken from the EXL3
# tensors encoded so far (q/layer.j.safetensors: a layer's encoded frames and
# its norms), through an overlay directory of links ov/i (hessian-capture
# --quantized); layer NLAYERS is the head. The capture of layer i saves the
# hidden states entering it (hs/hidden.i.frames); the capture of layer i+1
# starts from them and runs layers i and i+1 only, then deletes them. Where
# they are missing (a conversion resumed or changed), it runs layers
# 0..i+1; the Hessians are the same either way (make CARRY= : always).
# $(1) layer, $(2) layers before it, $(3) layer - 1, $(4) non-empty: save,
# $(5) the layer's experts' Hessian files (exrec)
seqcap = $(call stale,$(W)/hs/hidden.$(1).frames $(W)/timing/hs.$(1).json) rm -rf $(W)/ov/$(1) && mkdir -p $(W)/ov/$(1) && \
  for j in $(2); do ln -s ../../q/layer.$$j.safetensors $(W)/ov/$(1)/; done && \
  hin=$(if $(CARRY),$(if $(3),$(W)/hs/hidden.$(3).frames)) && { [ -n "$$hin" ] && [ -f "$$hin" ] || hin=; } && \
  hessian-capture -q $(CAPOPT) --spill $(W)/tmp --model $(MODEL) --tokens $(W)/cal/tokens.frames --cols $(COLS) \
    --layers $(1)-$(1) $(if $(2),--quantized $(W)/ov/$(1)) $${hin:+--hidden-in "$$hin"} \
    $(if $(CARRY),$(if $(4),--hidden-out $(W)/hs/hidden.$(1).frames)) --timing $(W)/timing/hs.$(1).json \
  | tensor-cat -q --split $(W)/hs - && \
  $(call exrec,hs.$(1),$(5)) $(call tkeep,hs,$(1),hs.$(1).json) rm -f $${hin:+"$$hin"}
# SPLIT: part P of layer i, hs/part.i.P.frames (F64 partial sums), as
# seqcap over the rows of chunk P (the overlay ov/i.P its own), from the
# hidden states part P of layer i-1 saved (hs/hidden.i-1.P.frames); the
# capture of layer i merges the parts in chunk order and deletes them.
# $(1) layer, $(2) layers before it, $(3) layer - 1, $(4) non-empty: save,
# $(5) part
hscap = $(if $(PARTS),$(call hsmerge,$(1),$(5)),$(call seqcap,$(1),$(2),$(3),$(4),$(5)))
hspart = $(call stale,$@ $@.tmp $(W)/hs/hidden.$(1).$(5).frames $(W)/timing/hs.$(1).p$(5).json) rm -rf $(W)/ov/$(1).$(5) && mkdir -p $(W)/ov/$(1).$(5) && \
  for j in $(2); do ln -s ../../q/layer.$$j.safetensors $(W)/ov/$(1).$(5)/; done && \
  hin=$(if $(CARRY),$(if $(3),$(W)/hs/hidden.$(3).$(5).frames)) && { [ -n "$$hin" ] && [ -f "$$hin" ] || hin=; } && \
  OMP_NUM_THREADS=$(THREADS) OPENBLAS_NUM_THREADS=$(THREADS) \
  hessian-capture -q $(CAPOPT) --model $(MODEL) --tokens $(W)/cal/tokens.frames --cols $(COLS) --part $(5) \
    --layers $(1)-$(1) $(if $(2),--quantized $(W)/ov/$(1).$(5)) $${hin:+--hidden-in "$$hin"} \
    $(if $(CARRY),$(if $(4),--hidden-out $(W)/hs/hidden.$(1).$(5).frames)) \
    --timing $(W)/timing/hs.$(1).p$(5).json -o $@.tmp && \
  mv -f $@.tmp $@ && rm -f $${hin:+"$$hin"}
hsmerge = hessian-capture -q --merge $(call hsparts,$(1)) | tensor-cat -q --split $(W)/hs - && \
  $(call exrec,hs.$(1),$(2)) $(call tkeep,hs,$(1),$(foreach p,$(PARTS),hs.$(1).p$(p).json)) rm -f $(call hsparts,$(1))
qlayer = $(call stale,$(2)) { cat $(3); $(if $(PASS_L$(1)),tensor-cat -q $(MODEL) $(PASS_L$(1));) } | tensor-cat -q -o $(2) -

# wread KEY,WEIGHT,HAS_BIAS,ROWS: a linear's weight frame (and its bias
# when HAS_BIAS is 1), rows A:B of a fused tensor when ROWS is given
wread = { tensor-cat -q --meta key=$(1) $(if $(4),--rows $(4)) $(MODEL) '$(2)'; \
  $(if $(filter 1,$(3)),$(if $(4),tensor-cat -q --meta key=$(1) --rows $(4) $(MODEL) '$(2:.weight=.bias)',tensor-cat -q $(MODEL) '$(1).bias');) }
# ---- encodes: tensor-cat | had-rotate | trellis-encode, one file per
# (tensor, Hessian set, K); the trellis frame's metadata is the measurement.
# rules.mk has a rule per file the plan needs, its recipe one of these.
# signopt K: had-rotate's sign search (SIGN_DRAWS), its estimate at K
signopt = $(if $(SIGN_DRAWS),--sign-draws $(SIGN_DRAWS) -K $(1) --codebook $(CODEBOOK) $(if $(SIGN_STRIPS),--sign-strips $(SIGN_STRIPS)) $(if $(SIGN_METRIC),--sign-metric $(SIGN_METRIC)))
# hneed SET,LAYER,GROUP: the Hessian file GROUP of SET (h1, hs) and LAYER,
# made by the layer's capture (its stamp done/SETcap.LAYER) and deleted
# once the layer's encodes are done. Where an encode needs it again (a
# width the plan asks for that was not made before: a work directory
# reused or resumed at another rate) the capture runs again, once for all
# of the layer's files however many encodes ask at once: its stamp removed
# and made by a make of its own, without the order-only edges. (For the h1
# captures that convert-plan foresees, convert removes the stamps first.)
hneed = { [ -f $(W)/$(1)/$(3).frames ] || flock $(W)/tmp/$(1)cap.$(2).lock $(SHELL) -eo pipefail -c \
  '[ -f $(W)/$(1)/$(3).frames ] || { rm -f $(W)/done/$(1)cap.$(2) && \
  MAKEFLAGS= make -r -s -f Makefile --no-print-directory NOPLAN=1 RECAP= BOUND= $(W)/done/$(1)cap.$(2); }'; } &&
# enc KEY,WEIGHT,HAS_BIAS,ROWS,SET,GROUP,K,PICK,LAYER: KEY at K from the
# Hessians of SET (h1, hs); ROWS: rows A:B of a fused weight (and of its
# bias), else empty; PICK non-empty: with the draw of the least KL (DRAWS)
define enc
$(call hneed,$(5),$(9),$(6)) $(call wread,$(1),$(2),$(3),$(4)) \
	| had-rotate -q $(ROTOPT) -t $(THREADS) --seed $(SEED) --hessian $(W)/$(5)/$(6).frames --out-scales always \
	  $(if $(8),--sign-draw $$(cat $(W)/draw/$(1).k$(SENS_K).pick)) \
	  $(call signopt,$(7)) \
	| trellis-encode -q -t $(THREADS) -K $(7) --codebook $(CODEBOOK) $(ENCOPT) >$@.tmp
mv -f $@.tmp $@
endef
# encu KEY,WEIGHT,HAS_BIAS,ROWS,K: KEY at K without a Hessian (the
# multi-token prediction layer's linears, as ExLlamaV3 encodes them)
define encu
$(call wread,$(1),$(2),$(3),$(4)) \
	| had-rotate -q $(ROTOPT) -t $(THREADS) --seed $(SEED) --out-scales always \
	| trellis-encode -q -t $(THREADS) -K $(5) --codebook $(CODEBOOK) $(ENCOPT) >$@.tmp
mv -f $@.tmp $@
endef
# encpick KEY: the encode at SENS_K with DRAWS: a copy of the picked draw
define encpick
cp $(W)/draw/$(1).k$(SENS_K).d$$(cat $(W)/draw/$(1).k$(SENS_K).pick).frames $@.tmp
mv -f $@.tmp $@
endef
# DRAWS: the draws of a decoder linear (h1 only: onepass), the one its
# encodes use; draw/<key>.k<SENS_K>.d<D>.frames, its KL (draw/<key>.k<SENS_K>.d<D>.json,
# against sens/base.json as the sensitivity's), and draw/<key>.k<SENS_K>.pick, the
# draw of the least KL (the first on a tie); the encode at SENS_K is a copy
# (params/draw names SENS_K, so that the encodes made with the picks of
# another K are out of date)
# draw KEY,WEIGHT,HAS_BIAS,ROWS,GROUP,D,LAYER
define draw
$(call hneed,h1,$(7),$(5)) $(call wread,$(1),$(2),$(3),$(4)) \
	| had-rotate -q $(ROTOPT) -t $(THREADS) --seed $(SEED) --hessian $(W)/h1/$(5).frames --out-scales always --sign-draw $(6) \
	| trellis-encode -q -t $(THREADS) -K $(SENS_K) --codebook $(CODEBOOK) $(ENCOPT) >$@.tmp
mv -f $@.tmp $@
endef
define pick
jq -rs 'to_entries | min_by([.value.kl, .key]) | .key' $^ >$@.tmp && mv -f $@.tmp $@
endef
# sampled measurements (SAMPLE): trellis-encode --measure K --sample F on
# the same rotated weight, one JSON line (the bias plays no part)
# smeas KEY,WEIGHT,ROWS,GROUP,K,LAYER
define smeas
$(call hneed,h1,$(6),$(4)) tensor-cat -q --meta key=$(1) $(if $(3),--rows $(3)) $(MODEL) '$(2)' \
	| had-rotate -q $(ROTOPT) -t $(THREADS) --seed $(SEED) --hessian $(W)/h1/$(4).frames --out-scales always \
	  $(call signopt,$(5)) \
	| trellis-encode -q -t $(THREADS) --measure $(5) --sample $(SAMPLE) --codebook $(CODEBOOK) $(ENCOPT) >$@.tmp
mv -f $@.tmp $@
endef
# the final encode at a sampled width: enc's, with the scale search's fine
# grid centred on the global scale the sampled measurement found
# (trellis-encode --g-refine; no coarse grid)
# sfin KEY,WEIGHT,HAS_BIAS,ROWS,GROUP,K,LAYER
define sfin
$(call hneed,h1,$(7),$(5)) $(call wread,$(1),$(2),$(3),$(4)) \
	| had-rotate -q $(ROTOPT) -t $(THREADS) --seed $(SEED) --hessian $(W)/h1/$(5).frames --out-scales always \
	  $(call signopt,$(6)) \
	| trellis-encode -q -t $(THREADS) -K $(6) --codebook $(CODEBOOK) $(ENCOPT) \
	  $$(jq -r 'if .g_scale > 0 then "--g-refine \(.g_scale)" else "" end' $(W)/enc/$(1).h1.k$(6).s$(SAMPLE).json) >$@.tmp
mv -f $@.tmp $@
endef

# ---- plan ----------------------------------------------------------------
# (the names go through a file: a command line holds about 128 KiB)
$(W)/measure.jsonl:
	$(file >$@.tmp.list,$(MEAS))xargs -a $@.tmp.list bitalloc --lines >$@.tmp
	rm -f $@.tmp.list && mv -f $@.tmp $@

# the plan (bitalloc): with --sample, "measurement" says how the widths
# were measured (pack-write copies it into quantization_config.json) and
# "measurement_work" sums the sampled measurements' strips and tiles
$(W)/plan.json:
	bitalloc -q $(if $(SIZE),--size $(SIZE),--bits $(BITS)) --head-bits $(HEAD_BITS) --mtp-bits $(MTP_BITS) --vision-bits $(VISION_BITS) $(SETS) $(HQ) \
	  $(if $(SHARD),--shard-size $(SHARD)) \
	  --model $(MODEL) --codebook $(CODEBOOK) --cal-rows $(ROWS) --cal-cols $(COLS) \
	  $(if $(SENS_FILE),--importance $(W)/importance.jsonl) $(MEASOPT) -o $@.tmp $<
	mv -f $@.tmp $@

# sensitivity (--sensitivity measure|FILE): rules.mk has one rule per
# group. base.json: the original's logits over SENS_ROWS calibration text
# rows (base.zst, model-eval --save-base); a group's KL: the original with
# the group's linears taken from their encodes at SENS_K (model-eval
# --patch); the file: one header line, then one line per decoder linear,
# importance = numel * KL(group) / sum over the group of numel * proxy_err
# (the KL per unit of numel-weighted proxy error: bitalloc minimizes
# sum importance * proxy_err, to first order the KL)
$(W)/sens/base.json:
	t0=$$(date +%s.%N) && \
	OMP_NUM_THREADS=$(THREADS) model-eval -q --model $(MODEL) --tokens $< --rows $(SENS_ROWS) --cols $(COLS) --save-base $(W)/sens/base.zst | \
	  jq -c --arg t0 "$$t0" '{rows, cols, seconds: ((now - ($$t0 | tonumber)) * 1000 | round / 1000)}' >$@.tmp
	mv -f $@.tmp $@
sensg = t0=$$(date +%s.%N) && rm -f $@.tmp.safetensors && \
  cat $(filter %.frames,$^) | tensor-cat -q -o $@.tmp.safetensors - && \
  OMP_NUM_THREADS=$(THREADS) model-eval -q --base $(W)/sens/base.zst --quantized $(MODEL) --patch $@.tmp.safetensors | \
  jq -c --arg g '$(1)' --arg t0 "$$t0" '{group: $$g, kl: .kl_divergence, \
    seconds: ((now - ($$t0 | tonumber)) * 1000 | round / 1000)}' >$@.tmp && \
  rm -f $@.tmp.safetensors && mv -f $@.tmp $@
$(W)/sens/measured.k$(SENS_K).jsonl:
	$(file >$@.tmp.list,$(SENS_ERR))xargs -a $@.tmp.list bitalloc --lines >$@.err && rm -f $@.tmp.list
	jq -nc --slurpfile h $(W)/params/sens --slurpfile g $(W)/sens/groups.jsonl \
	  --slurpfile kl <(cat $(SENS_GROUPS)) --slurpfile all $(W)/sens/all.k$(SENS_K).json \
	  --slurpfile e $@.err --slurpfile b $(W)/sens/base.json --argjson K $(SENS_K) '$(SENS_JQ)' >$@.tmp
	rm -f $@.err && mv -f $@.tmp $@
SENS_JQ := ($$e | map({(.tensor): .}) | add) as $$err | ($$kl | map({(.group): .}) | add) as $$klg | \
  ($$kl | map(.kl) | add) as $$sum | \
  {sensitivity: ($$h[0] + {K: $$K, groups: ($$g | length), forwards: (($$g | length) + 2), \
    kl_all: $$all[0].kl, kl_sum: $$sum, \
    seconds: ((([$$kl[].seconds] | add) + $$all[0].seconds + $$b[0].seconds) * 1000 | round / 1000)})}, \
  ($$g[] | .group as $$n | $$klg[$$n].kl as $$k | \
   ([.members[] | $$err[.] | .numel * .proxy_err] | add) as $$d | \
   .members[] | $$err[.] as $$t | \
   {tensor: ., importance: (if $$d > 0 then $$t.numel * $$k / $$d else 0 end), group: $$n, kl: $$k, \
    proxy_err: $$t.proxy_err, numel: $$t.numel})
# (params/sensfile names the file and K, so that a copy of another file
# is out of date)
$(W)/sensitivity.jsonl:
	cp $(SENS_FILE) $@.tmp && mv -f $@.tmp $@
$(W)/importance.jsonl:
	jq -c 'select(.tensor) | {tensor, importance}' $< >$@.tmp
	mv -f $@.tmp $@

# plan.mk: the planned K of every tensor, K.<key> (included, so make builds
# it first and restarts with it)
$(W)/plan.mk:
	convert-plan --finals $(W)/plan.json $(PLANOPT) $(MODEL) >$@.tmp
	mv -f $@.tmp $@

# ---- pack ----------------------------------------------------------------
$(OUT)/config.json: $(FINAL) $(W)/plan.json $(W)/params/pack $(SRC_ALL) $(W)/src/files
	o=$$(readlink $(OLINK) && echo .) && o=$${o%??} && \
	cat $(FINAL) | pack-write -q --model $(MODEL) --passthrough --plan $(W)/plan.json \
	  --codebook $(CODEBOOK) --cal-rows $(ROWS) --cal-cols $(COLS) --out-scales always --vision-bits $(VISION_BITS) \
	  $(if $(SHARD_MB),--shard-size $(SHARD_MB)) \
	  --check $(READER) --force $(if $(filter $(OLINK),$(OUT)),"$$o",$(OUT))

# lists for pipelines/convert (fan-out with GNU parallel, progress)
list-meas: ; @printf '%s\n' $(MEAS)
# the draws' encodes (--gpus/--hosts fan them out), then their picks (the
# forwards, here: they share the base logits)
list-draws: ; @printf '%s\n' $(DRAWF)
draw-picks: $(DRAWP)
list-final: ; @printf '%s\n' $(FINAL)
list-layer-%: ; @printf '%s\n' $(FINAL_L$*)
.PHONY: all list-meas list-final list-draws draw-picks hessians-done

# the sensitivity's groups (tmp/sens-groups: convert-plan --sens-groups)
define sens_groups_jsonl
jq -Rc 'split("|") | {group: .[0], members: (.[1] | split(" "))}' tmp/sens-groups >$@.tmp && mv -f $@.tmp $@
endef
# senspick KEY: with DRAWS by tensor, the KL of KEY's picked draw is its
# sensitivity measurement
define senspick
jq -c --arg g $(1) '.group = $$g' $(W)/draw/$(1).k$(SENS_K).d$$(cat $<).json >$@.tmp && mv -f $@.tmp $@
endef
