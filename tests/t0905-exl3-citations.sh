#!/usr/bin/env bash
# t0905-exl3-citations: the format is documented in the tree (man/exl3.5)
# and cited in one form, "exl3(5) §3.2" (several: "exl3(5) §3.2, §3.3",
# a range "exl3(5) §9.3-§9.5"; in roff \fBexl3\fR(5) \[sc]3.2). Fails on
#   - a "§" in any text file that is not part of such a citation (e.g. the
#     old "spec §N" of the external spec, or a bare "§4.2"),
#   - a cited section, or a "§N" inside man/exl3.5, that the page lacks,
#   - a mention of the external spec file, exl3-format.md.
# The sections are the numbered .SH/.SS headings of man/exl3.5.
#
# The external spec's sections became (spec -> exl3(5)):
#   §1 -> §1 (padding §1.1, the formula §1.2, 1/sqrt(128) §6.1)
#   §2 -> §2, §2.1 -> §2.2, §2.2 -> §2.3, §2.3 -> §2.1 (files), §2.4 (shards),
#   §2.4 -> §2.5, §2.5 -> §2.6, §2.6 -> §2.8, §3.x -> §3.x, §4.x -> §4.x,
#   §5.1 -> §6.1, §5.2 -> §9.2 (same step numbers), §5.3 -> §6.2,
#   §6 -> §5, §6.1-§6.3 -> §5.1-§5.3, §6.4 -> §12.1, §7 -> §7,
#   §8 -> §9, §8.2 -> §9.1 (§8.2.N -> §9.1 step N), §8.3-§8.6 -> §9.3-§9.6,
#   §9 -> §10, §9.1 -> §10.1, §9.2 -> §10.2, §9.3 -> §10.3,
#   §10 -> §11 (step 1 §11.1, steps 3-4 §11.2-§11.3, steps 6-7 §11.4),
#   §11.1 -> §6.3, §14.1-§14.2 -> §12, tile vector §12.2.
. "$(dirname "$0")/lib.sh"
page=$ROOT/man/exl3.5
self=$ROOT/tests/t0905-exl3-citations.sh

awk '/^\.S[HS] "?[0-9]+(\.[0-9]+)* / { s = $2; gsub(/"/, "", s); print s }' "$page" >"$TMP/sections"
check "man/exl3.5 has numbered sections" test "$(wc -l <"$TMP/sections")" -ge 12

# the text files of the tree that contain a section sign or mention the spec
grep -rIl --exclude-dir=.git -e '§' -e '\\\[sc\]' -e '\\(sc' -e 'exl3-format' "$ROOT" |
	grep -vxF -e "$page" -e "$self" | sort >"$TMP/files"

# scan FILE...: one line "FILE:LINE: problem" per bad citation
scan() {
	perl -e '
		open S, "<", shift or die; my %have = map { chomp; ($_ => 1) } <S>;
		my $inpage = shift;
		for my $f (@ARGV) {
			open F, "<", $f or die "$f: $!";
			while (my $l = <F>) {
				$l =~ s/\\\[sc\]|\\\(sc/§/g;         # roff section sign
				$l =~ s/\\f[BIRP]//g; $l =~ s/\\-/-/g; $l =~ s/`//g;
				print "$f:$.: mentions the external spec file\n" if $l =~ /exl3-format/;
				next unless $l =~ /§/;
				my $all = () = $l =~ /§/g;
				my $cited = 0;
				my $chain = $inpage ? qr/()(§\d[\d.]*(?:(?:, |-|\x{e2}\x{80}\x{93}| and | or )§\d[\d.]*)*)/
				                    : qr/(exl3\(5\) )(§\d[\d.]*(?:(?:, |-|\x{e2}\x{80}\x{93}| and | or )§\d[\d.]*)*)/;
				while ($l =~ /$chain/g) {
					for my $s ($2 =~ /§(\d[\d.]*)/g) {
						$cited++;
						$s =~ s/\.+$//;
						print "$f:$.: exl3(5) has no section $s\n" unless $have{$s};
					}
				}
				print "$f:$.: a section sign outside an exl3(5) citation: ", $l =~ s/^\s+//r
					if $cited < $all;
			}
			close F;
		}' "$TMP/sections" "$@"
}

scan 0 $(cat "$TMP/files") >"$TMP/bad" 2>&1
if [ -s "$TMP/bad" ]; then
	notok "every section sign in the tree is an exl3(5) citation of a section the page has"
	sed "s|^$ROOT/|#   |" "$TMP/bad" | head -40
else
	ok "every section sign in the tree is an exl3(5) citation of a section the page has ($(wc -l <"$TMP/files") files)"
fi
scan 1 "$page" >"$TMP/badp" 2>&1
if [ -s "$TMP/badp" ]; then
	notok "man/exl3.5 refers only to its own sections"
	sed "s|^$ROOT/|#   |" "$TMP/badp" | head -20
else
	ok "man/exl3.5 refers only to its own sections"
fi
check "the citation form is used somewhere (the scan is not vacuous)" \
	grep -rqF --exclude-dir=.git 'exl3(5) §' "$ROOT/lib" "$ROOT/kernels" "$ROOT/bin"

# the checker itself: a stale, a bare and a dangling citation are found
printf '/* spec §3.2 */\n/* see §4.2 */\n/* exl3(5) §3.2, §99.1 */\n/* exl3(5) §3.2-§3.3 ok */\n.B x\n\\fBexl3\\fR(5) \\[sc]2.4\n' >"$TMP/probe.c"
scan 0 "$TMP/probe.c" >"$TMP/probe.out" 2>&1
check "the scan finds a stale, a bare and a dangling citation and passes good ones" \
	test "$(sed 's/^[^:]*:\([0-9]*\):.*/\1/' "$TMP/probe.out" | tr '\n' ' ')" = "1 2 3 "
done_testing
