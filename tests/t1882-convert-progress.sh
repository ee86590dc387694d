#!/usr/bin/env bash
# pipelines/convert's progress, end summary and --validate, and the names
# and point types of the plots:
#   - stderr not a terminal (a file): a line per kind of step done and at a
#     bounded rate, with counts done/total and an ETA; the last line's
#     counts are the totals, and those are the dry run's captures and
#     encodes; the same lines in WORK/convert.log; with -q none on stderr;
#   - the summary, on stderr and in WORK/summary.json: wall time, bits,
#     bytes, the overrides, the reader check and, with --validate, the KL of
#     exl3-validate's report (a finite number), kept in WORK; a failed
#     validation fails the conversion after the summary;
#   - exl3-info --plot names every linear in its per-tensor panel, and the
#     series of its panels use a point type each where they coincide;
#     plot-kl's series likewise.
# On a generated two-layer Llama (no ../shared needed).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 2
# the --set regex holds what a shell or make would read: $ # % ' " \ and a
# space (it matches the down projections alone)
set_re='mlp\.down_proj( |[#%'"'"'"])?$'
opts=(--head-bits 16 --rows 16 --cols 64 --work w --set "$set_re=3")
# at_totals LINE: every done/total of a progress line at its total (N of them at least)
at_totals() { awk -v l="$1" -v want="$2" 'BEGIN { n = split(l, a, /[ ,;]+/); for (i = 1; i <= n; i++) if (a[i] ~ /^[0-9]+\/[0-9]+$/) { split(a[i], d, "/"); k++; if (d[1] != d[2]) exit 1 } exit !(k >= want) }'; }

convert m o --bits 3 "${opts[@]}" -n --json >dry.json
rc=0; convert m o --bits 3 "${opts[@]}" --validate 2>err.txt || rc=$?
check "convert --validate, stderr to a file: exit 0, OUT written" sh -c "[ $rc -eq 0 ] && test -f o/config.json"
[ "$rc" -eq 0 ] || sed 's/^/#   /' err.txt | tail -5
grep -E '^convert: captures [0-9]+/[0-9]+, encodes [0-9]+/[0-9]+, pack [01]/1; [0-9]+/[0-9]+ steps done, [0-9hms]+ elapsed, ETA ([0-9hms]+|\?)$' err.txt >lines.txt || true
check "progress lines on stderr (per kind: done/total, steps, elapsed, ETA): $(wc -l <lines.txt)" test "$(wc -l <lines.txt)" -ge 2
check "... no carriage returns (no bar) when stderr is not a terminal" sh -c "! grep -q \$(printf '\r') err.txt"
check "... at a bounded rate: fewer lines than steps" test "$(wc -l <lines.txt)" -lt "$(jq '.counts.captures + .counts.encodes + 1' dry.json)"
last=$(tail -n 1 lines.txt)
check "the last line: every count at its total ($last)" at_totals "$last" 4
check "... the totals are the dry run's captures and encodes" \
	grep -q "^convert: captures $(jq .counts.captures dry.json)/$(jq .counts.captures dry.json), encodes $(jq .counts.encodes dry.json)/$(jq .counts.encodes dry.json), pack 1/1; " <<<"$last"
check "... the ETA of the last line is 0s" grep -q 'ETA 0s$' <<<"$last"
check "the progress lines are in WORK/convert.log too" sh -c 'test -s lines.txt && grep "^convert: captures" w/convert.log | cmp -s lines.txt -' 
check "... after the run's command line" grep -q "^20.*Z convert: m o --bits 3 .* --validate $" w/convert.log

# the summary
check "summary.json: wall time, bits 3, the bytes of OUT, the --set, the head bits" \
	jqe --argjson b "$(find o -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')" --arg s "$set_re=3" \
	'.wall_seconds > 0 and .bits == 3 and .bytes == $b and .overrides.set == [$s] and .overrides.head_bits == 16
	 and .steps.captures.done == .steps.captures.total and .steps.pack.done == 1' w/summary.json
check "... the reader check passed (exllamav3)" jqe '.reader.check.reader == "exllamav3" and .reader.check.ok' w/summary.json
check "... the KL of the validation (a finite number > 0), its report kept in WORK" \
	jqe --slurpfile v w/validate.json '(.validate.eval.kl_divergence | type == "number" and . > 0 and . < 1e300)
	 and .validate.eval.kl_divergence == $v[0].eval.kl_divergence and .validate.ok' w/summary.json
check "stderr: the wall time" grep -Eq '^convert: summary: .*, wall time [0-9.hms]+$' err.txt
check "stderr: the overrides" grep -qF "convert: overrides: effort default; --hq off; head bits 16; --set $set_re=3; sensitivity off" err.txt
check "the plan: both down projections at K=3 (the --set)" jqe \
	'[.tensors | to_entries[] | select(.key | test("down_proj")) | .value] == [3, 3]' w/plan.json
check "stderr: the reader check" grep -q '^convert: reader check: exllamav3: passed$' err.txt
check "stderr: the KL to the original" grep -Eq "^convert: KL divergence to the original: $(jq .eval.kl_divergence w/validate.json) " err.txt
check "the summary lines are in the log" grep -q '^convert: KL divergence to the original: ' w/convert.log

# -q: nothing on stderr, the log and summary written all the same
n0=$(grep -c ' steps done, ' w/convert.log)
# (at 3.5 bits: the encodes at K=4 and the captures they need, some seconds)
rc=0; convert m o2 --bits 3.5 "${opts[@]}" -q 2>errq.txt || rc=$?
check "convert -q (the work directory at another rate): exit 0, stderr empty" sh -c "[ $rc -eq 0 ] && ! test -s errq.txt"
last=$(grep ' steps done, ' w/convert.log | tail -n 1)
check "... its progress lines in the log, the last at the totals ($last)" \
	sh -c '[ "$(grep -c " steps done, " w/convert.log)" -gt "$1" ] && [ "$2" != "$(tail -n 1 lines.txt)" ]' - "$n0" "$last"
check "... ... at the totals" at_totals "$last" 2
check "... its summary (no validation)" jqe '.validate == null and .bits > 3' w/summary.json

# a validation that fails (here an exl3-validate whose report is not ok)
# fails the conversion after the summary; OUT is kept
mkdir fake && printf '%s\n' '#!/bin/sh' 'echo "{\"ok\": false, \"bits\": 3, \"eval\": null, \"errors\": [\"planted\"]}"' 'exit 1' >fake/exl3-validate &&
	chmod +x fake/exl3-validate
rc=0; PATH="$TMP/fake:$PATH" convert m o --bits 3 "${opts[@]}" --validate 2>errv.txt || rc=$?
check "--validate, the validation fails: exit 1 naming the report, OUT kept" \
	sh -c "[ $rc -eq 1 ] && grep -q '^convert: --validate: .* failed its validation .*validate.json' errv.txt && test -f o/config.json"
check "... after the summary, which says so" sh -c 'jq -e ".validate.ok == false" w/summary.json >/dev/null && grep -q "^convert: validation: no evaluation" errv.txt'
if command -v gnuplot >/dev/null; then
	# svg_pts FILE GROUP: the point types (gnuplot's #gpPtN) of a series,
	# and its points' sizes (scale(S))
	svg_pts() { awk -v g="$2" '/<g id="/ { cur = ($0 ~ "id=\"" g "\"") } cur && match($0, /#gpPt[0-9]+/) { print substr($0, RSTART + 1, RLENGTH - 1) }' "$1" | sort -u | paste -sd' '; }
	svg_size() { awk -v g="$2" '/<g id="/ { cur = ($0 ~ "id=\"" g "\"") } cur && match($0, /#gpPt[0-9]+.*scale\([0-9.]+\)/) { s = substr($0, RSTART, RLENGTH); sub(/.*scale\(/, "", s); sub(/\)/, "", s); print s }' "$1" | sort -u | paste -sd' '; }
	# apart: two series' point types differ, and the later's points are smaller
	apart() { [ -n "$1" ] && [ -n "$2" ] && [ "$1" != "$2" ] && [[ $3 =~ ^[0-9.]+$ ]] && [[ $4 =~ ^[0-9.]+$ ]] && awk -v a="$3" -v b="$4" 'BEGIN { exit !(b < a) }'; }
	# every linear's decode error (exl3-validate's check, as the plot of validate --plot)
	validate o --model m --no-eval -q >v.json || true
	jq -c '.tensors[]' v.json >errors.jsonl
	exl3-info -q --plot p.svg --errors errors.jsonl o >/dev/null
	check "exl3-info --plot: the SVG is written" test -s p.svg
	miss=$(jq -r '.tensor | sub("^model\\."; "") | sub("^layers\\."; "")' errors.jsonl |
		while read -r n; do grep -qF ">$n<" p.svg || echo "$n"; done)
	check "... the per-tensor panel names every linear ($(wc -l <errors.jsonl) of $(jq .counts.linears dry.json)) on its x axis${miss:+; missing: $miss}" \
		sh -c "[ $(wc -l <errors.jsonl) -eq $(jq .counts.linears dry.json) ] && [ -z '$miss' ]"
	# every role at K=3: the attention and mlp series coincide in the bits panel
	for g in a b; do
		p1=$(svg_pts p.svg exl3info_plot_1$g) p2=$(svg_pts p.svg exl3info_plot_2$g)
		s1=$(svg_size p.svg exl3info_plot_1$g) s2=$(svg_size p.svg exl3info_plot_2$g)
		check "... $( [ $g = a ] && echo "the bits panel's series (coinciding: every K is 3)" || echo "the error panel's series"): distinct point types ($p1, $p2), the later smaller ($s1, $s2)" \
			apart "$p1" "$p2" "$s1" "$s2"
	done
	jq -n '{ok: true, bits: 3, eval: {kl_divergence: 0.12}}' >r3.json
	jq -n '{ok: true, bits: 4, eval: {kl_divergence: 0.03}}' >r4.json
	plot-kl -o kl.svg one=r3.json one=r4.json two=r3.json two=r4.json
	p1=$(svg_pts kl.svg plotkl_plot_1) p2=$(svg_pts kl.svg plotkl_plot_2)
	s1=$(svg_size kl.svg plotkl_plot_1) s2=$(svg_size kl.svg plotkl_plot_2)
	check "plot-kl: two series on the same points: distinct point types ($p1, $p2), the later smaller ($s1, $s2)" \
		apart "$p1" "$p2" "$s1" "$s2"
else
	skip "gnuplot not installed (make deps)"
fi
done_testing
