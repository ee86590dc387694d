#!/usr/bin/env bash
# kill -9 during the capture parts (issue 12 part 4, issue 15 part 4): a
# small conversion with --capture-parts on (two layers, 3 calibration chunks:
# parts 0-2 of each layer, layer 1's from the hidden states layer 0's parts
# saved, then a merge per layer), its process group killed at 5 moments
# inside the parts and merges, each run resuming what the killed one before
# left (make -j 1, so that the order of the parts is make's and no part
# after the stop can finish before the kill), then a re-run: the output
# byte-identical to an uninterrupted -j 2 run,
# and nothing left of the killed runs in the work directory (no part, hidden
# state or temporary file). Then the same with 2 kills of a sequential
# conversion (hs captures in parts too) whose parts GNU parallel fans out
# (--gpus: each job in a process group of its own).
#
# The moments are made deterministic by a hessian-capture earlier on PATH
# that, in the one call STOP names (h1/part.L.P, hs/part.L.P, h1/merge.L
# or hs/merge.L), stops (sleeps until killed) before the real program
# runs, after it, or in the middle:
# a part's output cut at half as a real kill leaves it (the program's
# temporary file, never renamed), a merge's stream cut at half.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 2 16 16
opts=(--bits 2 --head-bits 16 --rows 3 --cols 16 --chunk-rows 1 --capture-parts on -j 2 -q)
mkdir shim
cat >shim/hessian-capture <<EOF
#!/usr/bin/env bash
real=$ROOT/bin/hessian-capture
a=" \$* " tag=
# the call's tag: h1/part.L.P or hs/part.L.P (sequential) from the file a
# part writes, h1/merge.L or hs/merge.L from the first part a merge reads
for f in "\$@"; do
	case \$f in
	*/part.*.frames.tmp) d=\${f%/*}; f=\${f##*/}; tag=\${d##*/}/\${f%.frames.tmp}; break ;;
	*/part.*.frames) d=\${f%/*}; f=\${f##*/part.}; tag=\${d##*/}/merge.\${f%%.*}; break ;;
	esac
done
if [ -n "\${STOP:-}" ] && [ "\${STOP#*:}" = "\$tag" ] && mkdir "$TMP/stopped" 2>/dev/null; then
	echo "\$*" >"$TMP/stopped/args"
	case \${STOP%%:*} in
	after) "\$real" "\$@" || exit ;;
	mid) if [[ \$tag == */part.* ]]; then
		o=\${a#* -o }; o=\${o%% *}
		"\$real" "\$@" || exit
		head -c \$((\$(stat -c %s "\$o") / 2)) "\$o" >"\$o.tmp-KILLED" && rm -f "\$o"
	else
		"\$real" "\$@" >"$TMP/stopped/stream" || exit
		head -c \$((\$(stat -c %s "$TMP/stopped/stream") / 2)) "$TMP/stopped/stream"
	fi ;;
	esac
	touch "$TMP/stopped/now"
	exec sleep 300
fi
exec "\$real" "\$@"
EOF
chmod +x shim/hessian-capture
export PATH="$TMP/shim:$PATH"
# wait_for SECONDS CMD...: poll until CMD succeeds
wait_for() { local n=$(($1 * 20)); shift; while ! "$@"; do n=$((n - 1)); [ $n -gt 0 ] || return 1; sleep 0.05; done; }
# no process is left that runs a recipe of work directory $1
gone() { ! pgrep -f -- "$1/" >/dev/null; }
# what a killed run may leave that a finished one must not: parts, hidden
# states, temporary files (of make recipes and of the programs)
leftovers() { find "$1" -name 'part.*' -o -name 'hidden.*' -o -name '*.tmp' -o -name '*.tmp-*' | sed "s|^$1/||"; }

check "uninterrupted conversion" convert m ref "${opts[@]}"
check "... leaves no part, hidden state or temporary file" test -z "$(leftovers ref.work)"

# kill_at STOP CONVERT-ARGS...: run the conversion into r with STOP, wait
# for the stop, kill -9 its process group, wait for its programs to end
kill_at() {
	local stop=$1 pid; shift
	rm -rf stopped
	STOP=$stop setsid convert m r "$@" & pid=$!
	if wait_for 60 test -e stopped/now; then
		kill -9 -- -"$pid" 2>/dev/null; wait "$pid" 2>/dev/null
		check "$stop: killed there, before any output" test ! -e r/config.json
		check "$stop: ... no program of it left running" wait_for 30 gone "$TMP/r.work"
	else
		notok "$stop: the conversion never got there"
		kill -9 -- -"$pid" 2>/dev/null; wait "$pid" 2>/dev/null
	fi
}
# rerun WHAT CONVERT-ARGS...: the conversion into r, uninterrupted: the
# output of the uninterrupted run, nothing of a killed run left
rerun() {
	local what=$1 left; shift
	check "$what: the re-run completes" convert m r "$@"
	check "$what: ... byte-identical to the uninterrupted run" diff -r ref r
	left=$(leftovers r.work)
	check "$what: ... nothing of the killed runs left${left:+ (left: $(echo $left))}" test -z "$left"
}

# 5 kills in a row, each run resuming what the one before left, in the
# order make reaches them at -j 1 (parts 0, 1, 2 and the merge of layer 0,
# then of layer 1; at -j 2 a part of the same layer could run to its end
# in the other job slot before the kill, and the next stop would never be
# reached, as happened on a CI machine): inside
# layer 0's part 1, in the middle of layer 0's merge, after layer 1's part
# 0 (its file whole but not renamed), in the middle of layer 1's part 2
# (from the hidden states layer 0's part 2 saved), after layer 1's merge
o1=("${opts[@]}" -j 1)
for stop in before:h1/part.0.1 mid:h1/merge.0 after:h1/part.1.0 mid:h1/part.1.2 after:h1/merge.1; do
	kill_at "$stop" "${o1[@]}"
done
rerun "after 5 kills" "${o1[@]}"

# sequential, the parts fanned out by GNU parallel (--gpus: one job slot
# per GPU, here on the CPU): killed inside an h1 part of layer 1 and an hs
# part of layer 1 (from the quantized layer 0); the output that of -j 2
if command -v parallel >/dev/null; then
	rm -rf ref r r.work r.lock
	so=("${opts[@]}" --mode sequential)
	check "uninterrupted sequential conversion (-j 2)" convert m ref "${so[@]}"
	fo=("${so[@]}" --gpus 0,1 --device cpu)
	for stop in before:h1/part.1.1 mid:hs/part.1.1; do
		kill_at "$stop" "${fo[@]}"
	done
	rerun "sequential --gpus, after 2 kills" "${fo[@]}"
else
	skip "--gpus: no GNU parallel"
fi
done_testing
