#!/usr/bin/env bash
# The pictures: pipelines/validate --plot (exl3-info's bits per layer and
# role, and every linear's decode error) and pipelines/plot-kl (KL against
# bits from a set of validate reports). Each SVG must parse and hold the
# expected number of series.
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/lib-pack.sh"
cd "$TMP"
if ! command -v gnuplot >/dev/null || ! command -v xmllint >/dev/null; then skip "gnuplot or xmllint not installed (make deps)"; done_testing; fi
# svg_series FILE: the number of plotted series (gnuplot's <g id="NAME_plot_N">)
svg_series() { xmllint --xpath "count(//*[local-name()='g'][contains(@id, '_plot_')])" "$1"; }

gen_model src 2 false 0
{ gen_quant 2 3 mul1; gen_linear lm_head 64 256 6 mul1
  tensor-cat -q src model.embed_tokens.weight model.norm.weight '*layernorm*'; } |
	pack-write -q --model src --passthrough p 2>/dev/null
validate p --plot v.svg -q >v.json
check "validate --plot without --model: the report names the plot" jqt '.ok and .plot == "v.svg"' v.json
check "... bits by role: 3 series (attention, mlp, head)" test "$(svg_series v.svg)" = 3
validate p --model src --no-eval --plot vc.svg -q >vc.json
# random trellis codes are no quantization of src: every linear is above
# the decode error bound, and the plot is drawn all the same
check "validate --model --plot: decode checks ran (random codes: above the bound, not ok)" \
	jqt '(.ok | not) and .check.tensors == 15 and .plot == "vc.svg" and (.errors | length == 15 and all(test("above the bound")))' vc.json
check "... bits (3 series) and decode errors (3 series)" test "$(svg_series vc.svg)" = 6
check "... the errors panel says rel_fro_err" grep -q "per-tensor rel_fro_err" vc.svg
check_fail "validate --plot needs an argument" 2 "option '--plot' needs an argument" validate p --plot

# plot-kl: the results table of exl3-quantize(7) (stories260K), drawn
rep() { jq -n --argjson b "$1" --argjson k "$2" '{ok: true, bits: $b, eval: {kl_divergence: $k}}' >"$3"; }
rep 2.495 0.297 o25.json; rep 3.000 0.122 o3.json; rep 4.000 0.0323 o4.json; rep 5.000 0.0084 o5.json
rep 3.000 0.117 s3.json
plot-kl -o kl.svg onepass=o25.json onepass=o3.json onepass=o4.json onepass=o5.json sequential=s3.json
check "plot-kl: two series (onepass, sequential)" test "$(svg_series kl.svg)" = 2
check "... the labels in the SVG" grep -q ">onepass<" kl.svg
plot-kl -o kl1.svg o3.json o4.json
check "plot-kl: unlabelled reports are one series" test "$(svg_series kl1.svg)" = 1
check_fail "plot-kl: a report without KL" 1 "v.json: not an exl3-validate --model report" plot-kl -o x.svg v.json
check "... and no SVG left behind" test ! -e x.svg
check_fail "plot-kl: no -o" 2 "-o FILE.svg is required" plot-kl o3.json
if command -v rsvg-convert >/dev/null; then
	check "the SVGs render (rsvg-convert)" rsvg-convert -o kl.png kl.svg
else
	skip "rsvg-convert not installed"
fi
done_testing
