#!/usr/bin/env bash
# t0960-readme: README.md stays a front door (exl3kit(7) is the guide,
# exl3-quantize(7) the quantizer's results): at most 300 lines, no issue or
# pull-request numbers ("issue 12", "#12"), the quick start's two commands as
# tests/t1830 and CI run them, and every page it points to exists. Each
# checker is also run on a planted fault.
. "$(dirname "$0")/lib.sh"
readme=$ROOT/README.md

# short FILE: at most 300 lines
short() {
	local n
	n=$(wc -l <"$1")
	[ "$n" -le 300 ] || { echo "# $1: $n lines (at most 300; the rest goes to man/exl3kit.7 or a program's page)"; return 1; }
}
# no_issues FILE: no "issue 12", "issues 12 and 14", "#12", "PR 12"
no_issues() {
	local hits
	hits=$(grep -nEi '\b(issues?|pr|pull request)[[:space:]]+#?[0-9]+|(^|[^&[:alnum:]_#/])#[0-9]+\b' "$1")
	[ -z "$hits" ] || { printf '# %s\n' "$hits"; return 1; }
}
# quickstart FILE: the two commands of the quick start, as they are typed
quickstart() {
	grep -qxF '    make deps && make -j"$(nproc)" && examples/quickstart' "$1" &&
		grep -qxF '    make test' "$1"
}
# pages FILE: every "man -l man/PAGE" and "PAGE(N)" it names is a file of man/
pages() {
	local p bad=0
	for p in $(grep -oE 'man -l man/[a-z0-9.-]+' "$1" | sed 's|.*man/||' | grep -v '^NAME\.'; \
	           grep -oE '\b[a-z][a-z0-9-]*\([1578]\)' "$1" | sed -E 's/\((.)\)/.\1/'); do
		[ -f "$ROOT/man/$p" ] || { echo "# $1 names $p, which man/ does not have"; bad=1; }
	done
	return $bad
}
fails() { ! "$@" >/dev/null; }

check "README.md is at most 300 lines" short "$readme"
{ cat "$readme"; seq 300; } >"$TMP/long"
check "a README of $(wc -l <"$TMP/long") lines is found" fails short "$TMP/long"

check "README.md names no issue or pull-request number" no_issues "$readme"
for planted in 'as issue 12 asked' 'see #12' '(#152)' 'Issues 14 and 16' 'PR 7'; do
	{ cat "$readme"; echo "$planted"; } >"$TMP/iss"
	check "'$planted' is found" fails no_issues "$TMP/iss"
done
printf '%s\n' '## Quick start' 'C# code, 16#ff, &#8212; x86-64' >"$TMP/noiss"
check "headings, C#, HTML entities are not issue numbers" no_issues "$TMP/noiss"

check "README.md has the quick start's two commands" quickstart "$readme"
sed 's/examples\/quickstart$/examples\/quick-start/' "$readme" >"$TMP/qs"
check "a changed quick start command is found" fails quickstart "$TMP/qs"
check "the quick start's command is the one tests/t1830 runs" grep -qF 'examples/quickstart' "$ROOT/tests/t1830-examples.sh"

check "every man page README.md names exists" pages "$readme"
{ cat "$readme"; echo 'see `man -l man/convert.1` and exl3-guide(7)'; } >"$TMP/pg"
check "a page that does not exist is found" fails pages "$TMP/pg"
done_testing
