#!/usr/bin/env bash
# pipelines/convert --sample F|full (issue 12 part 1): at a fractional rate the
# widths are measured on a sample of output strips (trellis-encode --measure
# K --sample F, one JSON line per linear and width) and every linear is then
# encoded once at its planned K, the scale search's fine grid centred on the
# measurement's scale (--g-refine); a tensor given the same K by both plans
# has the same svh. The plan and quantization_config.json say how
# it was measured, the byte model still gives the pack's size to the byte,
# -n counts the sampled measurements, --sample full is the old behaviour, an
# integer rate measures nothing, and bad values are usage errors. A
# generated 2-layer Llama, few calibration rows.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 2
# sampled finals are encoded after the plan, from Hessians the default disk
# bound would have deleted: the sampled runs keep them
opts=(--rows 8 --cols 32 -q --keep-hessians)
files_bytes() { find "$1" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }'; }

check_fail "--sample 0 is a usage error" 2 "--sample: '0' is not full or a fraction in \\(0, 1\\]" \
	convert m x --bits 3.5 --sample 0 "${opts[@]}"
check_fail "--sample 1.5 is a usage error" 2 "is not full or a fraction" convert m x --bits 3.5 --sample 1.5 "${opts[@]}"
check_fail "--sample abc is a usage error" 2 "is not full or a fraction" convert m x --bits 3.5 --sample abc "${opts[@]}"
check "... nothing written" test ! -e x -a ! -e x.work

# ---- the dry run --------------------------------------------------------------
convert m d --bits 3.5 --sample 0.1 -n --json "${opts[@]}" >n.json
nl=$(jq '[.tensors[] | select(.role != "head")] | length' n.json)
check "-n --sample 0.1: 2 widths x $nl linears sampled, $nl finals, the head's one encode" \
	jqe --argjson n "$nl" '.sample == 0.1 and .counts.sampled_measurements == 2 * $n and
	  .counts.final_encodes == $n and .counts.measurement_encodes == {"6": 1}' n.json
convert m d --bits 3.5 -n --json "${opts[@]}" >f.json
check "-n by default (--sample full): every linear encoded at both widths, onepass packs them" \
	jqe --argjson n "$nl" '.sample == "full" and .counts.sampled_measurements == 0 and
	  .counts.final_encodes == 0 and .counts.measurement_encodes["3"] == $n' f.json
convert m d --bits 3 -n --json "${opts[@]}" >i.json
check "-n at an integer rate: one width, nothing sampled" \
	jqe '.sample == "full" and .counts.sampled_measurements == 0' i.json

# ---- sampled and full conversions, one work directory -------------------------
check_fail "-n --sample without --keep-hessians: a note, whole measurements" 0 "needs --keep-hessians in onepass mode" \
	convert m d --bits 3.5 --sample 0.1 -n --rows 8 --cols 32
check "convert --bits 3.5 (sampled, 1/2 of the strips)" convert m qs --bits 3.5 --sample 0.5 --work w "${opts[@]}"
cp w/plan.json ps.json
check "the sampled measurements are JSON lines with the strips" \
	sh -c 'test "$(ls w/enc/*.s0.5.json | wc -l)" = $((2 * '"$nl"')) && cat w/enc/*.s0.5.json | jq -es "all(.sample == 0.5 and .strips >= 1 and .strips < .strips_total and .search_tiles > 0)" >/dev/null'
check "the plan says how it was measured, with the work" \
	jqe '.measurement == {"method": "sample", "sample": 0.5, "unit": "16-column output strips", "widths": [3, 4]} and
	  .measurement_work.viterbi_tiles.ldlq > 0 and .measurement_work.strips < .measurement_work.strips_total' ps.json
check "quantization_config.json says so too" \
	jqe '.measurement.method == "sample" and .measurement.sample == 0.5' qs/quantization_config.json
check "the byte model counts it: plan bytes = the pack's files" test "$(jq .bytes ps.json)" = "$(files_bytes qs)"
check "the bits target is met" jqe '.bits <= 3.5 and .bits > 3.2' ps.json

check "convert --bits 3.5 --sample full in the same work directory" convert m qf --bits 3.5 --sample full --work w "${opts[@]}"
cp w/plan.json pf.json
check "the full plan has no measurement record, its config neither" \
	jqe '(has("measurement") | not) and (has("measurement_work") | not)' pf.json
check "... quantization_config.json neither" jqe 'has("measurement") | not' qf/quantization_config.json
# the final encodes of the sampled conversion refine the sampled
# measurement's global scale (the fine grid around it, no coarse grid):
# their own files, a g_scale within the grid's reach of the measurement's
# (2 steps of 0.075, X3_SCALE_WALK = 8 more, the parabola's half step), the
# bytes trellis-encode --g-refine gives by hand; svh (no g in it) as the
# whole's
same=$(jq -nr --slurpfile a ps.json --slurpfile b pf.json '$a[0].tensors | to_entries[] | select(.value == $b[0].tensors[.key]) | .key')
check "the plans agree on some tensors" test -n "$same"
nfin=$(ls w/enc/*.h1.k[34].s0.5.frames | wc -l)
check "one final encode per decoder linear at its sampled width ($nfin of $nl)" test "$nfin" = "$nl"
bad=0
for f in w/enc/*.h1.k[34].s0.5.frames; do
	j=${f%.frames}.json
	g=$(tensor-ls "$f" | jq -r 'select(.meta.role == "trellis") | .meta.g_scale')
	awk -v a="$g" -v b="$(jq .g_scale "$j")" 'BEGIN { d = a - b; exit !(a > 0 && d * d <= (0.7875 + 1e-9)^2) }' || bad=$((bad + 1))
done
check "each final encode's g_scale is within the refine's reach of its sampled measurement's" test "$bad" = 0
f=$(ls w/enc/*.h1.k[34].s0.5.frames | head -1)
key=$(basename "$f" | sed 's/\.h1\.k[34]\.s0\.5\.frames$//') K=$(basename "$f" | sed 's/.*\.h1\.k\([34]\)\..*/\1/')
grp=$(tensor-ls --linears m | jq -r --arg k "$key" 'select(.key == $k) | .group')
tensor-cat -q --meta key="$key" m "$key.weight" |
	had-rotate -q --seed 0 --hessian "w/h1/$grp.frames" --out-scales always |
	trellis-encode -q -K "$K" --g-refine "$(jq .g_scale "${f%.frames}.json")" --json >byhand.frames 2>byhand.json
# (but the seconds it took, in the metadata)
tensor-cat -q --meta seconds=0 --meta timing=0 "$f" >a.fr && tensor-cat -q --meta seconds=0 --meta timing=0 byhand.frames >b.fr
check "$key at K=$K: the final = trellis-encode --g-refine by hand, byte for byte" cmp a.fr b.fr
tensor-cat -q m "$key.weight" | had-rotate -q --seed 0 --hessian "w/h1/$grp.frames" --out-scales always |
	trellis-encode -q -K "$K" --json 2>searched.json >/dev/null
check "... its search encoded fewer tiles than a whole search's, and some" \
	jqe --slurpfile s searched.json '.search_tiles > 0 and .search_tiles < $s[0].search_tiles' byhand.json
diffs=0
for k in $same; do
	tensor-cat -q qs "$k.svh" >a.fr && tensor-cat -q qf "$k.svh" >b.fr && test -s a.fr && cmp -s a.fr b.fr || diffs=$((diffs + 1))
done
check "a tensor with the same K in both plans has the whole encode's svh" test "$diffs" = 0
# trellis-encode --g-scale: the LDLQ at that scale, no search
check_fail "trellis-encode --g-scale 0 is a usage error" 2 "--g-scale: '0' is not a positive number" trellis-encode -K 3 --g-scale 0
check_fail "trellis-encode --g-scale with --measure is a usage error" 2 "--g-scale goes with -K" trellis-encode --measure 3 --g-scale 1
check_fail "trellis-encode --g-refine 0 is a usage error" 2 "--g-refine: '0' is not a positive number" trellis-encode -K 3 --g-refine 0
check_fail "trellis-encode --g-refine with --measure is a usage error" 2 "--g-refine goes with -K" trellis-encode --measure 3 --g-refine 1
check_fail "trellis-encode --g-scale and --g-refine together are a usage error" 2 "only one of --g-scale and --g-refine, once" \
	trellis-encode -K 3 --g-scale 1 --g-refine 1

# ---- the --gpus fan-out (GNU parallel) takes the same steps -------------------
if command -v parallel >/dev/null; then
	check "the fan-out (--gpus 0,1 --device cpu) gives the same pack" sh -c \
		'convert m qg --bits 3.5 --sample 0.5 --work w --gpus 0,1 --device cpu --rows 8 --cols 32 -q --keep-hessians && diff -r qs qg'
fi

# ---- an integer rate samples nothing -------------------------------------------
check "convert --bits 3 --sample 0.1 (one width: no measurement beyond the encodes)" convert m q3 --bits 3 --sample 0.1 --work w "${opts[@]}"
check "... no measurement record" jqe 'has("measurement") | not' w/plan.json
done_testing
