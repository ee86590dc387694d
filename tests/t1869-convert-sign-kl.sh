#!/usr/bin/env bash
# t1869-convert-sign-kl: the sign draws chosen by the KL (convert
# --sign-draws N --sign-metric kl) on the generated 1-layer Llama, and
# had-rotate --sign-draw D, which the encodes use:
#   - had-rotate --sign-draw 0 is the plain rotation, --sign-draw D what the
#     sign search outputs when it picks draw D;
#   - convert: every decoder linear's N draws encoded at floor(B) and
#     measured (draw/KEY.k3.dD.json is model-eval --patch's KL for that encode
#     alone), the pick the draw of the least KL; the encode at floor(B) is
#     the picked draw's file, the other widths are made with that draw;
#     a re-run makes nothing again; with --sensitivity measure too; at
#     another rate the draws are measured at its floor; fanned out by GNU
#     parallel (--gpus) the same pack; the dry run counts the draws; a
#     Qwen3-MoE converts with them (every expert linear drawn);
#   - usage errors: kl without --bits, with --mode sequential, --sample,
#     --sign-strips; --sign-draw with --sign-draws.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 1
cal=(--rows 12 --cols 64)

# had-rotate --sign-draw
tensor-gen -s 1 --scale 0.02 m.weight=172x64 >w.fr
tensor-gen -s 2 -d spd --meta count=1 m.hessian=64x64 >h.fr
had-rotate -q -t 1 --seed 3 --hessian h.fr <w.fr >plain.fr
had-rotate -q -t 1 --seed 3 --hessian h.fr --sign-draw 0 <w.fr >d0.fr
had-rotate -q -t 1 --seed 3 --hessian h.fr --sign-draws 4 -K 3 <w.fr >search.fr
pick=$(tensor-ls search.fr | jq -r 'select(.name == "m.w_reg") | .meta.sign_draw')
had-rotate -q -t 1 --seed 3 --hessian h.fr --sign-draw "$pick" <w.fr >pick.fr
# (a safetensors file holds the payloads, not the frames' metadata)
for f in search pick plain d0; do tensor-cat -q $f.fr -o $f.safetensors; done
check "had-rotate --sign-draw 0 is the plain rotation" cmp -s plain.safetensors d0.safetensors
check "had-rotate --sign-draw $pick gives what the search gives when it picks draw $pick" \
	cmp -s search.safetensors pick.safetensors
check "... and records sign_draw $pick" \
	test "$(tensor-ls pick.fr | jq -r 'select(.name == "m.w_reg") | .meta.sign_draw')" = "$pick"
had-rotate -q -t 1 --seed 3 --hessian h.fr --sign-draw 1 <w.fr | tensor-cat -q - -o d1.safetensors
check "another draw gives other signs" bash -c '! cmp -s plain.safetensors d1.safetensors'
check_fail "had-rotate: --sign-draw with --sign-draws is a usage error" 2 "not both" \
	had-rotate --sign-draw 1 --sign-draws 2 -K 3
check_fail "had-rotate: --sign-draw 64 is out of range" 2 "sign-draw" had-rotate --sign-draw 64
check_fail "had-rotate: --sign-draw needs a Hessian" 1 "needs a Hessian" had-rotate -q --sign-draw 1 <w.fr

# convert --sign-draws 3 --sign-metric kl at 3.5 bpw (widths 3 and 4, draws at 3)
convert m q --bits 3.5 --work w "${cal[@]}" -j 2 -q --sign-draws 3 --sign-metric kl
check "convert --sign-draws 3 --sign-metric kl writes the pack" test -f q/config.json
dec=$(tensor-ls --linears m | jq -r 'select(.role != "head") | .key')
ndec=$(wc -w <<<"$dec")
check "one pick per decoder linear ($ndec), none for the head" \
	test "$(ls w/draw/*.pick | wc -l)" -eq "$ndec" -a ! -e w/draw/lm_head.k3.pick
bad=
for t in $dec; do
	p=$(cat w/draw/$t.k3.pick)
	want=$(jq -rs 'to_entries | min_by([.value.kl, .key]) | .key' w/draw/$t.k3.d0.json w/draw/$t.k3.d1.json w/draw/$t.k3.d2.json)
	[ "$p" = "$want" ] || bad+=" $t(pick $p, least KL $want)"
	cmp -s w/draw/$t.k3.d$p.frames w/enc/$t.h1.k3.frames || bad+=" $t(k3 is not draw $p)"
	d4=$(tensor-ls w/enc/$t.h1.k4.frames | jq -r 'select(.meta.role == "trellis") | .meta.sign_draw')
	[ "$d4" = "$p" ] || bad+=" $t(k4 made with draw $d4)"
done
check "each pick is the draw of the least KL, the K=3 encode its file, K=4 made with it${bad:+:$bad}" test -z "$bad"
check "the draws' picks are not all draw 0 (over $ndec linears)" test "$(cat w/draw/*.pick | sort -u | wc -l)" -gt 1
t=$(head -n 1 <<<"$dec")
tensor-cat -q -o one.safetensors w/draw/$t.k3.d2.frames
model-eval -q --base w/sens/base.zst --quantized m --patch one.safetensors >one.json
check "a draw's KL is model-eval --patch's for its encode alone" \
	test "$(jq .kl_divergence one.json)" = "$(jq .kl w/draw/$t.k3.d2.json)"
cp -r q q.first
touch stamp   # (plan.json is rewritten after the encodes: no stamp for this)
convert m q --bits 3.5 --work w "${cal[@]}" -j 2 -q --sign-draws 3 --sign-metric kl
check "a re-run makes no draw or encode again" test -z "$(find w/draw w/enc w/sens -newer stamp)"
check "... and writes the same pack" diff -r q.first q
convert m qs --bits 3.5 --work w "${cal[@]}" -j 2 -q --sign-draws 3 --sign-metric kl --sensitivity measure
check "with --sensitivity measure too" jqe '.importance == "measured"' w/plan.json
check "the sensitivity measured the picked draw's encode" \
	test "$(jq -r --arg t $t 'select(.tensor == $t) | .kl' w/sensitivity.jsonl)" = "$(jq .kl w/draw/$t.k3.d$(cat w/draw/$t.k3.pick).json)"
cp w/sensitivity.jsonl saved.jsonl
convert m qf --bits 3.5 --work wf "${cal[@]}" -j 2 -q --sign-draws 2 --sign-metric kl --sensitivity saved.jsonl
check "with --sensitivity FILE (a fresh work directory: the draws' base logits made all the same)" \
	jqe '.importance == "measured"' wf/plan.json
convert m q4 --bits 4 --work w "${cal[@]}" -j 2 -q --sign-draws 3 --sign-metric kl
check "at 4 bpw in the same work directory the draws are measured at K=4" \
	test "$(ls w/draw/*.k4.pick | wc -l)" -eq "$ndec" -a "$(ls w/draw/*.k3.pick | wc -l)" -eq "$ndec"
check "... and the K=4 encodes are made with the K=4 picks" \
	cmp -s w/draw/$t.k4.d$(cat w/draw/$t.k4.pick).frames w/enc/$t.h1.k4.frames

command -v parallel >/dev/null && {
convert m qg --bits 3.5 --work wg "${cal[@]}" -q --gpus 0,1 --device cpu --sign-draws 3 --sign-metric kl
check "fanned out by GNU parallel (--gpus 0,1 --device cpu) the pack is the same" diff -r q qg
} || skip "fanned out by GNU parallel: no GNU parallel"
convert m qn --bits 3.5 -n --json "${cal[@]}" --sign-draws 3 --sign-metric kl >dry.json
convert m qn --bits 3.5 -n --json "${cal[@]}" >dry0.json
check "the dry run counts the draws: 3 encodes and 3 forwards per decoder linear at K=3, 2 more encodes in all" \
	jqe --slurpfile z dry0.json '.draws == {n: 3, k: 3, metric: "kl", measurement_kept: true} and .counts.draw_encodes == 3 * '"$ndec"'
		and .counts.draw_forwards == 3 * '"$ndec"' and .counts.encodes == $z[0].counts.encodes + 2 * '"$ndec"'
		and .disk.encodes > $z[0].disk.encodes' dry.json
# a mixture of experts: every expert linear gets its draws
"$ROOT/examples/make-tiny-llama" --arch qwen3-moe --experts 4 --top-k 2 --moe-inter 48 M 1 64 96 >/dev/null
convert M qm --bits 3 --work wm --rows 40 --cols 128 -j 2 -q --sign-draws 2 --sign-metric kl
check "a Qwen3-MoE converts with --sign-draws 2 --sign-metric kl" test -f qm/config.json
check "... each expert linear with a pick" \
	test "$(ls wm/draw/*experts.*.pick | wc -l)" -eq 12 -a "$(ls wm/draw/*.pick | wc -l)" -eq "$(tensor-ls --linears M | jq -s '[.[] | select(.role != "head")] | length')"

convert m qn --size 150K --sensitivity-k 2 --measure 3,4 -n --json "${cal[@]}" --sign-draws 2 --sign-metric kl >dry2.json
convert m qn --size 150K --sensitivity-k 2 --measure 3,4 -n --json "${cal[@]}" >dry20.json
check "... draws at a K that is not measured: every draw an encode more" \
	jqe --slurpfile z dry20.json '.draws.measurement_kept == false and .counts.encodes == $z[0].counts.encodes + 2 * '"$ndec" dry2.json
check_fail "--sign-metric kl needs --bits, or --sensitivity-k with --size" 2 "needs --bits, or --sensitivity-k" \
	convert m x --size 1M --sign-draws 2 --sign-metric kl
convert m qz --size 150K --sensitivity-k 3 --work wz "${cal[@]}" -j 2 -q --sign-draws 2 --sign-metric kl
check "with --size and --sensitivity-k 3 the draws are measured at K=3" \
	test "$(ls wz/draw/*.k3.pick | wc -l)" -eq "$ndec" -a -f qz/config.json
check_fail "--sign-metric kl is not with --mode sequential" 2 "onepass" \
	convert m x --bits 3 --mode sequential --sign-draws 2 --sign-metric kl
check_fail "--sign-metric kl is not with --sample" 2 "not with --sample" \
	convert m x --bits 3.5 --sample 0.5 --sign-draws 2 --sign-metric kl
check_fail "--sign-strips is not with --sign-metric kl" 2 "sign-strips" \
	convert m x --bits 3 --sign-draws 2 --sign-metric kl --sign-strips 4
done_testing
