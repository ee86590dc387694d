#!/usr/bin/env bash
# convert-plan: the Makefile of a fresh work directory under every
# combination of the quality options (--sensitivity, --ldlq-passes,
# --sign-draws and --sign-metric, --sample, --mode) at rates from 1.5 to
# 7.5 bpw: make's dry run of the steps before the plan and of the whole
# conversion ends (a timeout of 20 s detects a hang: make exploring the
# chains of missing secondary files), and its rules hold an encode only
# for the widths the options measure. A generated 2-layer Llama.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 2
i=0 bad=0 slow=
for b in 1.5 2.03 3 7.5; do
for mode in onepass sequential; do
for smp in full 0.3; do
for sens in off measure; do
for sd in 1 3proxy 3kl; do
	passes=$((i % 2))
	o=(--bits "$b" --mode "$mode" --sample "$smp" --sensitivity "$sens" --ldlq-passes "$passes" --rows 8 --cols 16 -q)
	case $sd in 3proxy) o+=(--sign-draws 3) ;; 3kl) o+=(--sign-draws 3 --sign-metric kl) ;; esac
	[ "$sd" != 3kl ] || [ "$mode" = onepass ] || continue
	[ "$sd" != 3kl ] || [ "$smp" = full ] || continue
	[ "$smp" = full ] || [ "$mode" = sequential ] || o+=(--keep-hessians)
	i=$((i + 1))
	w=w$i
	if ! convert m "o$i" --work "$w" "${o[@]}" --makefile >/dev/null 2>"e$i"; then
		bad=$((bad + 1)); echo "# convert --makefile ${o[*]}: $(head -n 2 "e$i")"; continue
	fi
	for t in "NOPLAN=1 plan.mk" "NOPLAN=1 RECAP= all"; do
		if ! timeout 20 make -r -s -n -C "$w" -f Makefile --no-print-directory $t >/dev/null 2>"e$i"; then
			bad=$((bad + 1)); slow="$slow [${o[*]}: make -n $t: $(head -c 200 "e$i")]"
		fi
	done
	rm -rf "$w" "o$i"
done; done; done; done; done
check "make -n ends on a fresh work directory for all $i combinations of the quality options${slow:+:$slow}" test "$bad" -eq 0

# the rules name only the widths measured: at 3.5 bpw onepass, K=3 and 4
# for the decoder linears, the head's 6, no other
convert m o --work w --bits 3.5 --rows 8 --cols 16 -q --makefile >/dev/null
ks=$(grep -o '^$(W)/enc/[^:]*' w/rules.mk | sed 's/.*\.k\([0-9]\)\.frames$/\1/' | sort -u | paste -sd,)
check "rules.mk has encodes at K=3,4,6 only (got $ks)" test "$ks" = 3,4,6
check "rules.mk has no \$(eval) per tensor" test "$(grep -c 'eval' w/rules.mk)" -le "$((2 * 3 + 2))"
# GNU make 4.3 at hundreds of experts a layer: a grouped target keeps, for
# each of its files, a list of all the others (gigabytes), and a blanket
# .SECONDARY makes it check the chains of missing files again for each
# dependent (minutes): no grouped rule, and only the capture parts secondary
check "rules.mk has no grouped target (&:)" test "$(grep -c '&:' w/rules.mk)" -eq 0
check "make's database has no .SECONDARY (no capture parts here)" \
	sh -c '! make -r -s -n -p -C w -f Makefile --no-print-directory NOPLAN=1 h1-parts-0 2>/dev/null | grep -q "^\.SECONDARY"'
# a fresh work directory captures every layer; one whose measurements are
# made and Hessians dropped, none (the recapture set from the files' times)
check "the recapture set of a fresh work directory is every layer" test "$(grep '^RECAP ?=' w/rules.mk)" = "RECAP ?= 0 1 2"
done_testing
