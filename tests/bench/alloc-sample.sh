#!/usr/bin/env bash
# tests/bench/alloc-sample.sh: allocation without encoding everything twice
# (issue 12 part 1). For each model (stories260K from ../shared when
# present, and a generated Llama: examples/make-tiny-llama, 2 layers, hidden
# 128, intermediate 384), each rate of BENCH_RATES (default 2.5 3.5 4.5) and
# each sign seed of BENCH_SEEDS (default 0 1 2), converts twice: with the
# widths measured on a sample of output strips (convert --sample, default
# BENCH_SAMPLE=0.1) and with every linear encoded whole at every width
# (--sample full). Prints per (model, rate):
#   - plan agreement: decoder linears given the same K by both plans;
#   - the expected error sum(numel * proxy_err) of each plan under the full
#     measurements (the sampled plan's excess over the full plan's);
#   - KL to the original on held-out text (pipelines/validate) of both
#     conversions, mean ± sample sd over the seeds;
#   - the encode work of a sampled conversion against an integer-bpw one at
#     floor(rate) and at ceil(rate): Viterbi tiles (the encoder's own count:
#     scale search + LDLQ, trellis-encode's summaries) and CPU seconds
#     (user + sys) of the trellis-encode processes, each file counted once
#     for every conversion that uses it (its measurements and finals), so
#     the conversions can share one work directory per seed. The full
#     measurement's work is printed beside it.
# Target (exit 1 when missed): the sampled conversion's Viterbi tiles at
# most 1.25x the integer-bpw conversion's at floor and at ceil, on every
# model and rate. KL within 2% is read off the table (it needs the spread).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export ROOT=$root LC_ALL=C
if [ -n "${BENCH_DIR:-}" ]; then TMP=$(mkdir -p "$BENCH_DIR" && cd "$BENCH_DIR" && pwd)
else TMP=$(mktemp -d "${TMPDIR:-/tmp}/x3alloc.XXXXXX"); trap '[ -n "${BENCH_KEEP:-}" ] || rm -rf "$TMP"' EXIT; fi
cd "$TMP"
rates=${BENCH_RATES:-2.5 3.5 4.5} seeds=${BENCH_SEEDS:-0 1 2} smp=${BENCH_SAMPLE:-0.1}
shared=${X3_SHARED:-$root/../shared}

# trellis-encode counted: every run appends {file, cpu, search_tiles,
# ldlq_tiles} to work.jsonl (the file its standard output goes to; the
# tiles from --json's summaries, or the --measure lines themselves)
mkdir -p shim
cat >shim/trellis-encode <<EOF
#!/usr/bin/env bash
set -o pipefail
out=\$(readlink -f /proc/\$\$/fd/1); out=\${out%.tmp}
t=\$(mktemp) j=\$(mktemp)
measure=0; for a in "\$@"; do [ "\$a" != --measure ] || measure=1; done
if [ \$measure = 1 ]; then
	/usr/bin/time -f '%U %S' -o "\$t" "$root/bin/trellis-encode" "\$@" | tee "\$j"; rc=\${PIPESTATUS[0]}
else
	/usr/bin/time -f '%U %S' -o "\$t" "$root/bin/trellis-encode" --json "\$@" 2>"\$j"; rc=\$?
	grep -v '^{' "\$j" >&2 || true
fi
[ \$rc -ne 0 ] || grep '^{' "\$j" | jq -sc --arg f "\$out" --arg cpu "\$(tail -n 1 "\$t")" \
	'{file: \$f, cpu: (\$cpu | split(" ") | map(tonumber) | add),
	  search_tiles: (map(.search_tiles) | add), ldlq_tiles: (map(.ldlq_tiles) | add)}' >>"$TMP/work.jsonl"
rm -f "\$t" "\$j"
exit \$rc
EOF
chmod +x shim/trellis-encode
export PATH="$TMP/shim:$root/bin:$root/pipelines:$PATH"
# (kept when BENCH_DIR is reused: the files made before keep their records)
[ -f work.jsonl ] || : >work.jsonl

models=()
if [ -f "$shared/models/stories260K/model.safetensors" ]; then models+=(stories260K); fi
models+=(tiny-llama)
# BENCH_MODELS: a subset, e.g. "tiny-llama"
[ -z "${BENCH_MODELS:-}" ] || read -r -a models <<<"$BENCH_MODELS"
"$root/examples/make-tiny-llama" tiny-llama 2 128 384 >/dev/null

missed=0
printf '%-12s %4s %-9s %-17s %-10s %-22s %-22s %-13s %-13s %-9s\n' model rate "same K" "exp. err s/f-1" "" \
	"KL sampled mean±sd" "KL full mean±sd" "tiles/int" "cpu/int" "full/int"
for name in "${models[@]}"; do
	if [ "$name" = stories260K ]; then
		M=$shared/models/stories260K cal=(--rows 24 --cols 256)
		zstd -dcq "$shared/data/sotu.txt.zst" |
			awk '/^Mr\. Speaker, Mr\. Vice President, Members of Congress: It.s a great privilege/ { go = 1 } go' >eval.txt
		ev=(--text eval.txt --rows 16 --cols 256)
	else
		M=tiny-llama cal=(--rows 16 --cols 128)
		for i in $(seq 1 30); do echo "Held-out text number $i: the quick brown fox jumps over the lazy dog."; done >eval.txt
		ev=(--text eval.txt --rows 8 --cols 128)
	fi
	for b in $rates; do
		lo=$(awk -v b="$b" 'BEGIN { print int(b) }') hi=$(awk -v b="$b" 'BEGIN { print (b > int(b)) ? int(b) + 1 : int(b) }')
		: >rows.$name.$b.jsonl
		for s in $seeds; do
			w=w.$name.$s
			for m in "$smp" full; do
				convert "$M" "q.$name.$b.$s.$m" --bits "$b" --seed "$s" --work "$w" "${cal[@]}" --sample "$m" --keep-hessians -j 2 -q
				cp "$w/plan.json" "plan.$name.$b.$s.$m.json"
				validate "q.$name.$b.$s.$m" --model "$M" "${ev[@]}" -q >"v.$name.$b.$s.$m.json"
			done
			# the full measurements at lo and hi (the full run made them)
			for k in $lo $hi; do for f in "$w"/enc/*.h1.k$k.frames; do tensor-ls "$f"; done; done |
				jq -c 'select(.meta.role == "trellis") | .meta | {tensor: .key, K: (.K | tonumber), proxy_err: (.proxy_err | tonumber),
				       numel: ((.in_features | tonumber) * (.out_features | tonumber))}' >"full.$name.$s.jsonl"
			jq -nc --slurpfile ps "plan.$name.$b.$s.$smp.json" --slurpfile pf "plan.$name.$b.$s.full.json" \
				--slurpfile meas "full.$name.$s.jsonl" --slurpfile vs "v.$name.$b.$s.$smp.json" \
				--slurpfile vf "v.$name.$b.$s.full.json" --slurpfile work <(cat work.jsonl) \
				--arg smp "$smp" --argjson lo "$lo" --argjson hi "$hi" --argjson s "$s" --arg dir "$TMP/$w/enc/" '
				($meas | map({key: "\(.tensor)/\(.K)", value: .}) | from_entries) as $e
				| ($work | map(select(.file | startswith($dir))) | map({key: (.file | ltrimstr($dir)), value: .}) | from_entries) as $wk
				| [$meas[] | .tensor] | unique as $dec
				| def experr($p): [$dec[] | . as $t | $e["\($t)/\($p.tensors[$t])"] | .numel * .proxy_err] | add;
				  def w($files; f): [$files[] | $wk[.] | f] | add;
				  ($ps[0].tensors | to_entries | map(select(.key | IN($dec[]) | not)) | map("\(.key).h1.k\(.value).frames")) as $head
				| ($dec | map("\(.).h1.k\($lo).frames") + $head) as $ilo
				| ($dec | map("\(.).h1.k\($hi).frames") + $head) as $ihi
				| ($dec | map(. as $t | [$lo, $hi] | unique[] | "\($t).h1.k\(.).s\($smp).json")
				   + ($dec | map("\(.).h1.k\($ps[0].tensors[.]).s\($smp).frames")) + $head) as $fs
				| ($dec | map(. as $t | [$lo, $hi] | unique[] | "\($t).h1.k\(.).frames") + $head) as $ff
				| {seed: $s, linears: ($dec | length),
				   same: ([$dec[] | select($ps[0].tensors[.] == $pf[0].tensors[.])] | length),
				   err_sampled: experr($ps[0]), err_full: experr($pf[0]),
				   kl_sampled: $vs[0].eval.kl_divergence, kl_full: $vf[0].eval.kl_divergence,
				   bits_sampled: $ps[0].bits, bits_full: $pf[0].bits,
				   tiles: {sampled: w($fs; .search_tiles + .ldlq_tiles), full: w($ff; .search_tiles + .ldlq_tiles),
				           int_lo: w($ilo; .search_tiles + .ldlq_tiles), int_hi: w($ihi; .search_tiles + .ldlq_tiles)},
				   cpu: {sampled: w($fs; .cpu), full: w($ff; .cpu), int_lo: w($ilo; .cpu), int_hi: w($ihi; .cpu)}}' \
				>>rows.$name.$b.jsonl
		done
		r=$(jq -sc --arg n "$name" --argjson b "$b" --arg smp "$smp" '
			def ms(f): (map(f)) as $v | ($v | add / length) as $m |
				{mean: $m, sd: (if ($v | length) > 1 then ([$v[] | (. - $m) * (. - $m)] | add / (length - 1) | sqrt) else 0 end)};
			{bench: "alloc-sample", model: $n, rate: $b, sample: ($smp | tonumber), seeds: length, linears: .[0].linears,
			 same_k: ms(.same), err_excess: ms(.err_sampled / .err_full - 1),
			 kl_sampled: ms(.kl_sampled), kl_full: ms(.kl_full), kl_ratio: ms(.kl_sampled / .kl_full),
			 tiles_vs_int: ms(.tiles.sampled / ([.tiles.int_lo, .tiles.int_hi] | min)),
			 tiles_vs_int_lo: ms(.tiles.sampled / .tiles.int_lo), tiles_vs_int_hi: ms(.tiles.sampled / .tiles.int_hi),
			 cpu_vs_int: ms(.cpu.sampled / ([.cpu.int_lo, .cpu.int_hi] | min)),
			 full_tiles_vs_int: ms(.tiles.full / ([.tiles.int_lo, .tiles.int_hi] | min)),
			 target: 1.25} | . + {pass: (([.tiles_vs_int_lo.mean, .tiles_vs_int_hi.mean] | max) <= .target)}' rows.$name.$b.jsonl)
		jq -r 'def f(x; d): (x * d | round) / d | tostring;
			def pm(x; d): f(x.mean; d) + "±" + f(x.sd; d);
			def pad($n): tostring | . + " " * ([0, $n - length] | max);
			(.model | pad(12)) + " " + (.rate | pad(4)) + " " + ("\(f(.same_k.mean; 10))/\(.linears)" | pad(9)) + " " +
			(("+" + f(.err_excess.mean * 100; 100) + "%±" + f(.err_excess.sd * 100; 100)) | sub("\\+-"; "-") | pad(17)) + " " + ("" | pad(10)) + " " +
			(pm(.kl_sampled; 1e5) | pad(22)) + " " + (pm(.kl_full; 1e5) | pad(22)) + " " +
			(pm(.tiles_vs_int; 1000) | pad(13)) + " " + (pm(.cpu_vs_int; 1000) | pad(13)) + " " + f(.full_tiles_vs_int.mean; 1000)' <<<"$r"
		echo "$r"
		jq -e .pass <<<"$r" >/dev/null || missed=1
	done
done
echo "same K: decoder linears with the same width in both plans; exp. err: the sampled plan's expected error under the full measurements over the full plan's, -1"
echo "tiles/int, cpu/int: the sampled conversion's Viterbi tiles and trellis-encode CPU seconds over the integer conversion's at floor or ceil, the smaller (target <= 1.25); full/int: the same for --sample full"
exit $missed
