#!/usr/bin/env bash
# Resume by content: a re-run redoes the steps whose inputs changed (the
# model's tensors and files, by their digests; the calibration; the
# options), whatever the file times say. The model's weights replaced in
# place by others with an older time (what rsync -a, cp -p and tar x do):
# the re-run gives the pack of a fresh conversion of the new weights. One
# tensor of layer 1 changed: layer 0's capture and encodes are kept, the
# rest redone, the pack again a fresh conversion's. The model touched (new
# times, the same bytes): nothing redone.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 2
opts=(--bits 3 --rows 8 --cols 64 -q)
# reweigh SRC DST REGEX SEED: DST a copy of SRC whose 2-D tensors matching
# REGEX have other (seeded) weights of the same shape
reweigh() {
	mkdir -p "$2" && cp "$1"/*.json "$2"/
	tensor-ls "$1" | jq -r --arg re "$3" '[.name, (.shape | map(tostring) | join("x")),
		(if (.shape | length) == 2 and (.name | test($re)) then 1 else 0 end)] | @tsv' |
	while IFS=$'\t' read -r name shape new; do
		if [ "$new" = 1 ]; then tensor-gen -s "$4" --scale 0.05 "$name=$shape"
		else tensor-cat -q "$1" "$name"; fi
	done | tensor-cat -q -o "$2/model.safetensors" -
}
stamp() { (cd "$1" && find . -type f ! -name lock -printf '%p %i %T@\n' | sort); }

check "convert" convert m out "${opts[@]}"
# the weights replaced in place, with an older time than everything made
reweigh m new '' 7
check "new weights: every tensor other than the old" \
	test -z "$(comm -12 <(tensor-ls --digest m | jq -r 'select(.name) | .xxh3' | sort) <(tensor-ls --digest new | jq -r 'select(.name and (.shape | length) == 2) | .xxh3' | sort))"
check "a fresh conversion of the new weights" convert new fresh "${opts[@]}"
cp new/model.safetensors m/model.safetensors
touch -d 2000-01-01 m/model.safetensors
check "re-run over the old work directory after the weights changed (older times)" convert m out "${opts[@]}"
check "... the pack of a fresh conversion of the new weights" diff -r fresh out

# one tensor of layer 1 changed: layer 0's steps kept
stamp out.work/enc | grep '/model\.layers\.0\.' >l0.before
stamp out.work/timing | grep '/h1\.0\.' >c0.before
reweigh m one 'model\.layers\.1\.mlp\.down_proj' 11
check "a fresh conversion with layer 1's down_proj changed" convert one fresh1 "${opts[@]}"
cp one/model.safetensors m/model.safetensors
touch -d 2000-01-01 m/model.safetensors
stamp out.work/enc >all.before
check "re-run after layer 1's down_proj changed" convert m out "${opts[@]}"
check "... the pack of a fresh conversion" diff -r fresh1 out
check "... layer 0's encodes kept (the same files, not rewritten)" \
	test "$(stamp out.work/enc | grep '/model\.layers\.0\.')" = "$(cat l0.before)"
check "... layer 0's capture not run again" test "$(stamp out.work/timing | grep '/h1\.0\.')" = "$(cat c0.before)"
redone=$(stamp out.work/enc | grep -E '/(model\.layers\.1\.mlp\.down_proj|lm_head)\.')
check "... layer 1's down_proj and the head encoded again (new files)" \
	test -n "$redone" -a -z "$(comm -12 <(echo "$redone") all.before)"

# the model's times changed, not its bytes: nothing redone
# (the steps' files: the Makefile and its includes are written each run)
made() { stamp out.work/enc; stamp out.work/cal; stamp out.work/timing; stamp out.work/done
	stat -c '%n %i %Y' out.work/plan.json out.work/measure.jsonl out/config.json; }
before=$(made)
touch m/*
check "re-run after touching the model (the same bytes)" convert m out "${opts[@]}"
check "... nothing redone, the pack not rewritten" test "$(made)" = "$before"
done_testing
