#!/usr/bin/env bash
# model-eval: perplexity, KL divergence and top-1 agreement on synthetic
# models (a model against itself and against its BF16 copy), bad inputs.
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/synth-model.sh"
cd "$TMP"
jqc() { jq -e "$@" >/dev/null; }

synth_model m 32 48 2 4 2 64 1 || notok "synthetic model"
synth_tokens tok 3 24 64 2
mkdir b16 && cp m/config.json b16/ && tensor-cat -q --dtype BF16 m -o b16/model.safetensors
synth_model other 32 48 2 4 2 64 7

check "-h prints usage, exit 0" bash -c 'model-eval -h | grep -q "^usage: model-eval"'
check_fail "no input" 2 "either --text or --tokens" model-eval --model m
check_fail "--prompt without --generate" 2 "go with --generate" model-eval --model m --tokens tok --prompt x

model-eval --model m --tokens tok >one.json
check "perplexity alone: one JSON object" jqc '.rows == 3 and .cols == 24 and .positions == 69 and (.quantized | not)' one.json
check "perplexity = exp(nll), finite, > 1" jqc '(.perplexity - (.nll | exp) | fabs) < 1e-6 * .perplexity and .perplexity > 1' one.json
model-eval --model m --quantized m --tokens tok >self.json
check "model against itself: KL 0, top-1 1, equal perplexities" \
	jqc '.kl_divergence == 0 and .top1_agreement == 1 and .perplexity == .perplexity_quantized' self.json
model-eval --model m --quantized b16 --tokens tok >b16.json
check "against its BF16 copy: small positive KL" jqc '.kl_divergence > 0 and .kl_divergence < 0.01' b16.json
check "against its BF16 copy: mostly the same top-1" jqc '.top1_agreement > 0.8' b16.json
model-eval --model m --quantized other --tokens tok >other.json
check "against another model: larger KL" jqc --slurpfile b b16.json '.kl_divergence > 10 * $b[0].kl_divergence' other.json
check "batching does not change the result" \
	test "$(model-eval --model m --quantized b16 --tokens tok --batch 1 | jq -c 'del(.model, .quantized)')" = "$(jq -c 'del(.model, .quantized)' b16.json)"
check "--rows takes the first rows" jqc '.rows == 2 and .positions == 46' <(model-eval --model m --tokens tok --rows 2)
model-eval --model m --tokens tok --rows 5 >/dev/null 2>err
check "more rows asked than given: warning" grep -q "only 3 rows" err
check_fail "... or an error with --strict" 1 "fewer than the 5 requested" model-eval --model m --tokens tok --rows 5 --strict
synth_model v2 32 48 2 4 2 80 1
check_fail "different vocabularies" 1 "vocabulary of 80" model-eval --model m --quantized v2 --tokens tok
tensor-gen -d constant --value 1 -t I32 tokens=1x4 >short
check_fail "--cols larger than the input, the file named" 1 "^model-eval: short: [0-9]+ tokens, fewer than one row of 8" model-eval --model m --tokens short --cols 8

# KL statistics: consistent with each other and with the old fields
check "KL statistics: mean = kl_divergence, median <= p90 <= p99 <= p99.9 <= max" \
	jqc '.kl.mean == .kl_divergence and .kl.median <= .kl.p90 and .kl.p90 <= .kl.p99 and .kl.p99 <= ."kl"."p99.9" and ."kl"."p99.9" <= .kl.max and .kl.median > 0' other.json
check "ln(PPL(Q)/PPL(base)) = nll_quantized - nll, with an uncertainty" \
	jqc '(.ln_ppl_ratio.value - (.nll_quantized - .nll) | fabs) < 1e-9 and .ln_ppl_ratio.uncertainty > 0' other.json
check "delta-p: percentiles ordered min..max, mean inside" \
	jqc '.delta_p.percentiles as $p | [$p.min, $p["p0.1"], $p.p1, $p.p5, $p.p10, $p.p25, $p.median, $p.p75, $p.p90, $p.p95, $p.p99, $p["p99.9"], $p.max] | . == sort' other.json
check "same top p = top1_agreement, with sqrt(f(1-f)/(n-1))" \
	jqc '.same_top_p.value == .top1_agreement and ((.same_top_p.uncertainty - (.top1_agreement * (1 - .top1_agreement) / (.positions - 1) | sqrt)) | fabs) < 1e-9' other.json
check "model against itself: every statistic 0, same top p 1" \
	jqc '.kl == {"mean": 0, "median": 0, "p90": 0, "p99": 0, "p99.9": 0, "max": 0} and .ln_ppl_ratio.value == 0 and ([.delta_p.percentiles[]] | all(. == 0)) and .same_top_p.value == 1' self.json
model-eval --model m --quantized other --tokens tok --table >other.txt
check "--table: a short table with the KL percentiles" grep -qE '^KL p99\.9 +[0-9.]+$' other.txt
check "--table: same top p as a percentage" grep -qE '^same top p +[0-9.]+% ± [0-9.]+%$' other.txt

# --save-base once, --base for any number of models
model-eval --model m --quantized other --tokens tok --save-base base.zst >saved.json
check "--save-base: a zstd stream of frames (tokens, then logits)" \
	test "$(od -An -tx1 -N4 base.zst | tr -d ' ')" = 28b52ffd
check "... tokens and logits frames" test "$(tensor-ls base.zst | jq -r .name | tr '\n' ' ')" = "tokens logits.0 "
check "--save-base does not change the result" test "$(jq -c . saved.json)" = "$(jq -c . other.json)"
model-eval --base base.zst --quantized other >fromfile.json
check "--base FILE: the same statistics as the forward of the original" \
	test "$(jq -c 'del(.base)' fromfile.json)" = "$(jq -c . other.json)"
check "... names the file and the original" jqc '.base == "base.zst" and .model == "m"' fromfile.json
model-eval --base base.zst --quantized b16 >fromfile16.json
check "--base FILE against a second model" test "$(jq -c 'del(.base)' fromfile16.json)" = "$(jq -c . b16.json)"
model-eval --model m --tokens tok --save-base batched.zst --batch 1 >/dev/null
check "--base from a file saved in batches of one row" \
	test "$(model-eval --base batched.zst --quantized other | jq -c 'del(.base)')" = "$(jq -c . other.json)"
check_fail "--base with --text: usage error" 2 "--base FILE replaces --model and the text" model-eval --base base.zst --quantized m --text x
check_fail "--base without --quantized" 2 "--base needs --quantized" model-eval --base base.zst
head -c 3000 base.zst >trunc.zst
check_fail "--base: a truncated file" 1 "^model-eval: trunc.zst" model-eval --base trunc.zst --quantized other
check_fail "--base: not a --save-base file" 1 "tok: the first frame is not model-eval --save-base's 'tokens'" model-eval --base tok --quantized other
check_fail "--base against another vocabulary" 1 "vocabulary of 80" model-eval --base base.zst --quantized v2

# --generate stops at max_position_embeddings (as --cols is capped there)
mkdir pos8 && ln -s ../m/model.safetensors pos8/ && jq '.max_position_embeddings = 8' m/config.json >pos8/config.json
model-eval --model pos8 --generate 20 --ids >pos8.ids 2>pos8.err
check "--generate stops at max_position_embeddings" test "$(wc -w <pos8.ids)" -le 8 -a "$(wc -w <pos8.ids)" -ge 1
check "... and says so" grep -q "^model-eval: --generate 20: stopping at max_position_embeddings 8 (7 tokens after the prompt)" pos8.err
if have_shared; then
	check_fail "--prompt longer than max_position_embeddings" 1 \
		"^model-eval: --prompt: [0-9]+ tokens, the model's max_position_embeddings 512 leaves no room" \
		model-eval --model "$SHARED/models/stories260K" --generate 3 --prompt "$(printf 'a%.0s' $(seq 600))"
	S=$SHARED/models/stories260K
	ref="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high"
	model-eval --model "$S" --generate 64 >gen.txt
	check "stories260K: greedy text from BOS is llama2.c's sample" grep -qF "$ref" gen.txt
	check "... from the start" test "$(head -c 20 gen.txt)" = "Once upon a time, th"
	check "--prompt continues the prompt" grep -q "^Lily and Tom" <(model-eval --model "$S" --generate 5 --prompt "Lily and Tom")
	check "--ids starts with BOS" grep -q "^1 " <(model-eval --model "$S" --generate 3 --ids)
	printf '%s' "$ref" >ref.txt
	model-eval --model "$S" --text ref.txt --cols 40 >ppl.json
	check "stories260K on its own sample: low perplexity" jqc '.rows == 1 and .perplexity < 3' ppl.json
else
	skip "stories260K not available"
fi
done_testing
