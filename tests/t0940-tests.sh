#!/usr/bin/env bash
# t0940-tests: the test suite's own conventions (tests/README.md): every
# test file has a number no other has, every number belongs to a family
# tests/README.md describes, tests/fast names only tests that exist, and
# tests/run counts the same at -j 1 and -j 3, takes several patterns, and
# fails a test that reports no check. Each checker is also run on a planted fault.
. "$(dirname "$0")/lib.sh"

# numbers DIR: the numbers of DIR's test files, one a line, sorted
numbers() {
	ls "$1"/tests/unit/t*.c "$1"/tests/t*.sh 2>/dev/null | sed -E 's|.*/t([0-9]+)-[^/]*$|\1|' | sort
}
# unique DIR: no two test files of DIR share a number (names the others)
unique() {
	local d
	d=$(numbers "$1" | uniq -d)
	[ -z "$d" ] && return 0
	for n in $d; do echo "# t$n:" $(cd "$1" && ls tests/unit/t"$n"-*.c tests/t"$n"-*.sh 2>/dev/null); done
	return 1
}
# fails CMD...: CMD fails (a checker on a planted fault)
fails() { ! "$@" >/dev/null; }
check "every test file has its own number" unique "$ROOT"
mkdir -p "$TMP/dup/tests/unit"
cp "$ROOT/tests/t0940-tests.sh" "$TMP/dup/tests/"
: >"$TMP/dup/tests/unit/t0940-planted.c"
check "a number two files share is found" fails unique "$TMP/dup"

# families README: each family (first two digits) has a "tNNxx" in README
families() {
	local f bad=0
	for f in $(numbers "$1" | cut -c1-2 | uniq); do
		grep -q "t${f}xx" "$2" || { echo "# t${f}xx is not in $2"; bad=1; }
	done
	return $bad
}
check "tests/README.md describes every number family in use" families "$ROOT" "$ROOT/tests/README.md"
grep -v 't09xx' "$ROOT/tests/README.md" >"$TMP/readme"
check "a family missing from the README is found" fails families "$ROOT" "$TMP/readme"

# fast LIST: every test LIST names exists
fast() {
	local t bad=0
	while read -r t _; do
		case $t in ''|'#'*) continue ;; esac
		[ -f "$ROOT/$t" ] || [ -f "$ROOT/$t.c" ] || { echo "# $1 names $t, which is no test"; bad=1; }
	done <"$1"
	return $bad
}
check "tests/fast names only tests that exist" fast "$ROOT/tests/fast"
{ cat "$ROOT/tests/fast"; echo "tests/t0941-gone.sh"; } >"$TMP/fast"
check "a test in tests/fast that does not exist is found" fails fast "$TMP/fast"

# the runner on a tree of made-up tests: one slow, one skipping, one
# failing, one dying without a "not ok", one with no check at all
R=$TMP/run
mkdir -p "$R/tests"
cp "$ROOT/tests/run" "$R/tests/"
printf 'sleep 1\necho "ok 1 - slow"\n' >"$R/tests/t0001-slow.sh"
printf 'echo "ok 1 - a"\necho "ok 2 - b # SKIP"\n' >"$R/tests/t0002-skip.sh"
printf 'echo "ok 1 - a"\necho "not ok 2 - b"\nexit 1\n' >"$R/tests/t0003-fail.sh"
printf 'echo "ok 1 - a"\nexit 3\n' >"$R/tests/t0004-die.sh"
printf 'echo "no checks here"\n' >"$R/tests/t0005-none.sh"
printf 'echo "ok 1 - fast"\n' >"$R/tests/t0006-fast.sh"
rc1=0 rc3=0
"$R/tests/run" >"$TMP/j1" 2>&1 || rc1=$?
"$R/tests/run" -j 3 >"$TMP/j3" 2>&1 || rc3=$?
check "tests/run: 5 passed, 3 failed, 1 skipped, exit 1" \
	sh -c 'tail -1 "$1" | grep -qx "5 passed, 3 failed, 1 skipped" && [ "$2" -eq 1 ]' _ "$TMP/j1" "$rc1"
check "tests/run: a test that exits 0 with no check fails" grep -q 'not ok - tests/t0005-none.sh ran no checks' "$TMP/j1"
check "tests/run -j 3: the same lines in the same order and the same status as -j 1" \
	bash -c 'cmp -s <(sed -E "s/ +[0-9]+s\$//" "$1") <(sed -E "s/ +[0-9]+s\$//" "$2") && [ "$3" -eq "$4" ]' _ "$TMP/j1" "$TMP/j3" "$rc1" "$rc3"
check "tests/run @LIST runs the tests LIST names, in its order" \
	sh -c 'printf "tests/t0006-fast.sh\n# a comment\ntests/t0002-skip.sh\n" >"$1/l" && "$1/tests/run" -j 2 "@$1/l" >"$1/o" &&
		awk "{ print \$1 }" "$1/o" | head -2 | tr "\n" " " | grep -qx "tests/t0006-fast.sh tests/t0002-skip.sh " &&
		tail -1 "$1/o" | grep -qx "2 passed, 0 failed, 1 skipped"' _ "$R"
check "tests/run PATTERN...: each pattern's tests in turn, a test two patterns name once" \
	sh -c '"$1/tests/run" t0006 "@$1/l" t0001 t0002 >"$1/o2" &&
		awk "{ print \$1 }" "$1/o2" | head -3 | tr "\n" " " | grep -qx "tests/t0006-fast.sh tests/t0002-skip.sh tests/t0001-slow.sh " &&
		tail -1 "$1/o2" | grep -qx "3 passed, 0 failed, 1 skipped"' _ "$R"
check_fail "tests/run -j 0 is refused" 2 'positive count' "$R/tests/run" -j 0
done_testing
