#!/usr/bin/env bash
# Every man page's EXAMPLES run as tests: each .EX/.EE block becomes one
# bash -e -o pipefail script of its "$ " lines, run in an empty directory
# with bin/ on PATH, as after make install: the pipelines by their installed
# names (exl3-convert), not pipelines/ (whose convert is also ImageMagick's).
. "$(dirname "$0")/lib.sh"
PATH=${PATH//"$ROOT/pipelines:"/}
for page in "$ROOT"/man/*.[157]; do
	name=$(basename "$page")
	awk -v out="$TMP/$name" '
		/^\.SH EXAMPLES/ { inex = 1; next }
		/^\.SH / { inex = 0 }
		inex && /^\.EX/ { n++; f = out "." n ".sh"; printf "" > f; next }
		inex && /^\.EE/ { close(f); f = ""; next }
		inex && f != "" && /^\$ / { line = substr($0, 3); gsub(/\\-/, "-", line); gsub(/\\\\/, "\\", line); print line >> f }
	' "$page"
	found=0
	for s in "$TMP/$name".*.sh; do
		[ -e "$s" ] || continue
		found=1
		d=$(mktemp -d "$TMP/ex.XXXXXX")
		# exl3-validate(1) shows a broken pack being rejected: not one for info_sweep
		[ "$name" != exl3-validate.1 ] || NO_INFO="$NO_INFO ${d#"$TMP"/}"
		# (a hang fails; the limit is 120 s a command, so a longer example
		# on a loaded host is not cut short)
		limit=$((120 * $(grep -c . "$s")))
		if (cd "$d" && timeout "$limit" bash -e -o pipefail "$s" >"$d/.out" 2>&1); then
			ok "$name: example $(basename "$s" .sh | sed 's/.*\.//')"
		else
			notok "$name: example $(basename "$s" .sh | sed 's/.*\.//')"
			sed 's/^/#   /' "$s"; sed 's/^/#   > /' "$d/.out" | tail -8
		fi
	done
	[ $found -eq 1 ] || notok "$name has no runnable EXAMPLES"
done
done_testing
