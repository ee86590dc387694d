#!/usr/bin/env bash
# Conventions every program keeps: a man page, -h prints "usage: NAME" to
# stdout with exit 0, an unknown option exits 2 with the usage on stderr,
# the man page's OPTIONS describe every option of the usage's synopsis, and
# every option they describe is one the program's parser has; every page
# lints clean and is ASCII.
. "$(dirname "$0")/lib.sh"
# the options of the usage's synopsis ("usage:" and the lines after it
# indented by 3 or more spaces), and of the man page's OPTIONS items (the
# line after each .TP)
opts_seq() { grep -oE -- '(^|[^a-zA-Z0-9-])--?[a-zA-Z][a-z0-9-]*' | grep -oE -- '--?[a-zA-Z][a-z0-9-]*'; }
opts() { opts_seq | sort -u; }
syn_opts_seq() { awk 'NR == 1 || (!stop && /^   /) { print; next } { stop = 1 }' | opts_seq; }
syn_opts() { syn_opts_seq | sort -u; }
item_opts() {
	awk '/^\.SH OPTIONS/ { o = 1; next } /^\.SH/ { o = 0 } o && prev == ".TP" { print } { prev = $0 }' "$1" |
		sed 's/\\-/-/g; s/\\f[BIRP]//g' | opts
}
# accepts SOURCE OPTION: the option parser of a C main (its getopt string
# or long-option table) or of a shell script (a case pattern) has OPTION
accepts() {
	case $1 in
	*.c) case $2 in
		--*) grep -qF "\"${2#--}\"," "$1" ;;
		*) grep -oE 'getopt_long\([^"]*"[^"]*"' "$1" | sed 's/.*"\(.*\)"/\1/' | grep -qF "${2#-}" ;;
		esac ;;
	*) grep -qE "^[[:space:]]*([^)]*\|)?$2(\|[^)]*)?\)" "$1" ;;
	esac
}
# options_match NAME SOURCE PAGE USAGE: every option of the synopsis has an
# OPTIONS item, and every option of an item is one the program accepts
options_match() {
	local n=$1 src=$2 page=$3 out=$4 o missing= stale=
	missing=$(comm -23 <(syn_opts <<<"$out" | grep -vx -- -h) <(item_opts "$page") | tr '\n' ' ')
	if [ -z "$missing" ]; then ok "$n: the man page's OPTIONS describe every option of the usage"
	else notok "$n: no OPTIONS item for $missing"; fi
	local u m
	u=$(syn_opts_seq <<<"$out" | tr '\n' ' ')
	m=$(awk '/^\.SH SYNOPSIS/ { o = 1; next } /^\.SH/ { o = 0 } o' "$page" | sed 's/\\-/-/g; s/\\f[BIRP]//g' | opts_seq | tr '\n' ' ')
	if [ "$u" = "$m" ]; then ok "$n: the man page's SYNOPSIS has the usage's options in its order"
	else notok "$n: SYNOPSIS options '$m', usage '$u'"; fi
	for o in $(item_opts "$page"); do
		accepts "$src" "$o" || stale="$stale $o"
	done
	if [ -z "$stale" ]; then ok "$n: every option of the man page's OPTIONS is accepted"
	else notok "$n: the man page documents options it does not accept:$stale"; fi
}
for p in "$ROOT"/bin/*; do
	[ -x "$p" ] && [ -f "$p" ] || continue
	[ -L "$p" ] && continue   # bin/exl3-convert and the like: the pipelines, below
	case $p in *.c|*.h|*.o|*.d) continue;; esac
	n=$(basename "$p")
	check "$n has a man page" test -f "$ROOT/man/$n.1"
	out=$("$p" -h 2>/dev/null); rc=$?
	if [ $rc -eq 0 ] && [[ $out == "usage: $n"* ]]; then ok "$n -h"; else notok "$n -h (exit $rc)"; fi
	"$p" --no-such-option </dev/null >/dev/null 2>"$TMP/err"; rc=$?
	if [ $rc -eq 2 ] && grep -q "usage: $n" "$TMP/err"; then ok "$n: bad option exits 2 with usage"
	else notok "$n: bad option (exit $rc)"; fi
	options_match "$n" "$ROOT/bin/$n.c" "$ROOT/man/$n.1" "$out"
	# -h describes every option, not only the usage lines
	undesc=$(for o in $(syn_opts <<<"$out"); do
		grep -qE -- "^[[:space:]]+([^[:space:]]+( [A-Z]+)?, )?$o([][ =,]|$)" <<<"$out" || printf ' %s' "$o"
	done)
	if [ -z "$undesc" ]; then ok "$n -h describes every option"
	else notok "$n -h does not describe:$undesc"; fi
done
for n in convert validate plot-kl; do
	# the tree runs them under their installed names and pages' names
	check "bin/exl3-$n runs pipelines/$n" test "$(readlink -f "$ROOT/bin/exl3-$n")" = "$(readlink -f "$ROOT/pipelines/$n")"
	out=$("$ROOT/bin/exl3-$n" -h 2>/dev/null)
	if [[ $out == "usage: exl3-$n"* ]]; then ok "exl3-$n -h names itself exl3-$n"; else notok "exl3-$n -h: ${out%%$'\n'*}"; fi
	options_match "exl3-$n" "$ROOT/pipelines/$n" "$ROOT/man/exl3-$n.1" "$("$ROOT/pipelines/$n" -h)"
done
# every page renders whole: mandoc drops a line it cannot read (a text line
# that starts with a dot, say) and says ERROR
if command -v mandoc >/dev/null; then
	check "mandoc -Tlint: no error or warning in man/" mandoc -Tlint -Werror "$ROOT"/man/*.[157]
else skip "mandoc -Tlint (no mandoc)"; fi
# every page ASCII: man and groff without -k show other bytes as they can
# (a Greek letter as garbage on a Latin-1 terminal); roff writes them as
# escapes, \(*S for a sigma
ascii_pages() {
	! LC_ALL=C grep -n "$(printf '[\200-\377]')" "$@" | sed 's/^/# not ASCII: /' | grep .
}
fails() { ! "$@" >/dev/null; }
check "man/: every page ASCII (other characters as roff escapes)" ascii_pages "$ROOT"/man/*.[157]
printf '.TH X 1\n.SH NAME\nx \\- \316\243 numel\n' >"$TMP/sigma.1"
check "... a page with a raw UTF-8 sigma is found" fails ascii_pages "$TMP/sigma.1"
# make install: the pipelines under their exl3-* names in BINDIR, convert's
# make rules (convert.mk) in DATADIR, where the installed exl3-convert finds
# them (DESTDIR's tree: beside its bin)
inst=$TMP/inst
if make -s -C "$ROOT" install DESTDIR="$inst" PREFIX=/usr/local >"$TMP/inst.log" 2>&1; then ok "make install DESTDIR=..."
else notok "make install DESTDIR=..."; sed 's/^/#   /' "$TMP/inst.log" | tail -5; fi
check "make install: the pipelines as exl3-*, no .mk among the programs" sh -c \
	'for n in convert validate plot-kl; do test -x "$1/usr/local/bin/exl3-$n" || exit 1; done
	 ! ls "$1/usr/local/bin" | grep -q "\.mk$" && cmp "$1/usr/local/share/exl3kit/convert.mk" "$2/pipelines/convert.mk"' \
	sh "$inst" "$ROOT"
check "make install: exl3-convert names DATADIR" grep -qF "'/usr/local/share/exl3kit/convert.mk'" "$inst/usr/local/bin/exl3-convert"
check "the installed exl3-convert finds its rules" sh -c 'cd "$1" && "$2/examples/make-tiny-llama" tiny >/dev/null &&
	PATH="$3/usr/local/bin:$PATH" exl3-convert tiny out --bits 2 -q --makefile --work wd >/dev/null &&
	cmp wd/convert.mk "$2/pipelines/convert.mk"' sh "$TMP" "$ROOT" "$inst"
done_testing
