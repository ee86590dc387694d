#!/usr/bin/env bash
# t0950-comments: comments explain the code, not its history (the charter):
# tests/comments-check passes, silently, on this tree's lib/, bin/,
# pipelines/ and Makefile, fails naming the file, line and reason on a tree
# with one issue number, was/now narration or fence marker planted, and
# passes on lines that only look alike ("no longer runs", "issues a").
. "$(dirname "$0")/lib.sh"
chk=$ROOT/tests/comments-check

if "$chk" "$ROOT" 2>"$TMP/p.err" && [ ! -s "$TMP/p.err" ]; then ok "this tree's comments carry no history"
else notok "this tree's comments carry no history"; sed 's/^/#   /' "$TMP/p.err" | head -20; fi

# plant FILE LINE: a tree of one file, FILE, holding LINE (after a clean line)
plant() {
	rm -rf "$TMP/t"; mkdir -p "$(dirname "$TMP/t/$1")"
	printf '/* a clean comment */\n%s\n' "$2" >"$TMP/t/$1"
}
plant lib/quant/quant.c '/* ---- sign search (issue 14 part 1) ---- */'
check_fail "an issue number in lib/" 1 '^lib/quant/quant\.c:2: issue number:' "$chk" "$TMP/t"
plant lib/quant/quant.h ' * the scale found (see issue #12), else'
check_fail "an issue number with # in a header" 1 '^lib/quant/quant\.h:2: issue number:' "$chk" "$TMP/t"
plant bin/tokenize.c '	/* no BOS for Qwen (#36) */'
check_fail "a (#N) reference in bin/" 1 '^bin/tokenize\.c:2: issue number:' "$chk" "$TMP/t"
plant bin/pack-write.c '/* the exchange fallback, PR #7 */'
check_fail "a pull-request number" 1 '^bin/pack-write\.c:2: pull-request number:' "$chk" "$TMP/t"
plant lib/codec/viterbi.c '/* the block was 1024 edges, now 512 */'
check_fail "was X, now Y narration" 1 '^lib/codec/viterbi\.c:2: was/now narration:' "$chk" "$TMP/t"
plant lib/model/linear.h '/* keeps no F32 weight of its own from now on */'
check_fail "\"from now on\" narration" 1 '^lib/model/linear\.h:2: history narration:' "$chk" "$TMP/t"
plant Makefile '# previously built with -O3'
check_fail "\"previously\" in the Makefile" 1 '^Makefile:2: history narration:' "$chk" "$TMP/t"
plant pipelines/convert '# >>> slurm: options'
check_fail "a '# >>>' fence marker in pipelines/" 1 '^pipelines/convert:2: fence marker:' "$chk" "$TMP/t"
plant pipelines/convert '	# <<< slurm'
check_fail "an indented '# <<<' fence marker" 1 '^pipelines/convert:2: fence marker:' "$chk" "$TMP/t"

# lines that only look alike pass
rm -rf "$TMP/t"; mkdir -p "$TMP/t/bin" "$TMP/t/pipelines"
printf '%s\n' '/* a pid file naming a process that no longer runs */' \
	'/* issues a warning when 12 bytes remain; the weight was quantized' \
	' * without error feedback; its bytes are in the shard now */' >"$TMP/t/bin/a.c"
printf '%s\n' 'while [ $# -gt 0 ]; do n=${#a[@]}; done   # the count, now' \
	'cat <<<"$x" >>"$y"   # >>> and <<< as operators' >"$TMP/t/pipelines/b"
check "lines that only look like history pass" "$chk" "$TMP/t"
done_testing
