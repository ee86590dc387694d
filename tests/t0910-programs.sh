#!/usr/bin/env bash
# Conventions every program keeps: a man page, -h prints "usage: NAME" to
# stdout with exit 0, an unknown option exits 2 with the usage on stderr,
# and the man page's SYNOPSIS names the same options as the usage text.
. "$(dirname "$0")/lib.sh"
for p in "$ROOT"/bin/*; do
	[ -x "$p" ] && [ -f "$p" ] || continue
	case $p in *.c|*.h|*.o|*.d) continue;; esac
	n=$(basename "$p")
	check "$n has a man page" test -f "$ROOT/man/$n.1"
	out=$("$p" -h 2>/dev/null); rc=$?
	if [ $rc -eq 0 ] && [[ $out == "usage: $n"* ]]; then ok "$n -h"; else notok "$n -h (exit $rc)"; fi
	"$p" --no-such-option </dev/null >/dev/null 2>"$TMP/err"; rc=$?
	if [ $rc -eq 2 ] && grep -q "usage: $n" "$TMP/err"; then ok "$n: bad option exits 2 with usage"
	else notok "$n: bad option (exit $rc)"; fi
	# every long option in the usage appears in the man page
	missing=
	for o in $(echo "$out" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u); do
		grep -qE -- "$(echo "$o" | sed 's/-/\\\\-/g')|$o" "$ROOT/man/$n.1" 2>/dev/null || missing="$missing $o"
	done
	if [ -z "$missing" ]; then ok "$n: man page documents every option of the usage"
	else notok "$n: man page lacks$missing"; fi
done
done_testing
