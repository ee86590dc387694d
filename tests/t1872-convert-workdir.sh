#!/usr/bin/env bash
# A work directory is a work directory: convert takes a new or empty one
# (and marks it), or one it marked, and refuses any other directory with
# files before touching anything (exit 2); in its own it deletes only the
# files its steps write. OUT is never the model, inside it or holding it
# (not even with --force), and an existing directory that is not this work
# directory's EXL3 output is replaced only with --force.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"
tiny_model m 1
opts=(--bits 3 --rows 8 --cols 64 -q)
snap() { (cd "$1" && find . -printf '%p %s %T@\n' | sort); }

# the issue's reproducer: a directory of the user's as --work
mkdir -p scratch/notes
echo d >scratch/thesis.tmp
echo x >scratch/notes/a.tmp
snap scratch >scratch.before
check_fail "--work DIR holding the user's files: refused" 2 "scratch: not a work directory of convert" \
	convert m out --work scratch "${opts[@]}"
check_fail "... convert -n says so too" 2 "scratch: not a work directory of convert" \
	convert -n m out --work scratch "${opts[@]}"
check "... every file of it kept, nothing added" test "$(snap scratch)" = "$(cat scratch.before)"
check "... no OUT" test ! -e out -a ! -e out.lock
mkdir cwd && cp -r scratch/. cwd/ && snap cwd >cwd.before
check_fail "--work . (the current directory, with files): refused" 2 "not a work directory of convert" \
	sh -c 'cd cwd && convert ../m ../out --work . --bits 3 --rows 8 --cols 64 -q'
check "... nothing of it touched" test "$(snap cwd)" = "$(cat cwd.before)"
echo x >afile
check_fail "--work FILE: refused" 2 "afile: exists and is not a directory" convert m out --work afile "${opts[@]}"

# an empty directory is taken, and marked
mkdir w
check "--work EMPTY_DIR: converts" convert m out --work w "${opts[@]}"
check "... and marks it as a work directory" test -f w/.exl3-convert-work
# in its own work directory convert deletes its temporary files only
echo mine >w/thesis.tmp
mkdir w/notes && echo mine >w/notes/a.tmp
echo mine >w/enc/notes.txt
echo part >w/enc/model.layers.0.mlp.up_proj.h1.k3.frames.tmp
echo part >w/h1/model.layers.0.mlp.input.frames.tmp-Ab12Cd
check "re-run in its work directory" convert m out --work w "${opts[@]}"
check "... the user's files in it kept" test -f w/thesis.tmp -a -f w/notes/a.tmp -a -f w/enc/notes.txt
check "... a killed step's temporary files removed" \
	test ! -e w/enc/model.layers.0.mlp.up_proj.h1.k3.frames.tmp -a ! -e w/h1/model.layers.0.mlp.input.frames.tmp-Ab12Cd

# OUT and the model
snap m >m.before
check_fail "OUT = MODEL: refused" 2 "OUT .*/m is the model .*/m or inside it" convert m m --work w2 "${opts[@]}"
check_fail "OUT = MODEL with --force: refused" 2 "is the model" convert m m --work w2 --force "${opts[@]}"
ln -s m mlink
check_fail "OUT = a link to MODEL with --force: refused" 2 "is the model" convert m mlink --work w2 --force "${opts[@]}"
check_fail "OUT inside MODEL: refused" 2 "OUT .*/m/exl3 is the model .*/m or inside it" convert m m/exl3 "${opts[@]}"
mkdir -p top/src && cp m/* top/src/ && snap top >top.before
check_fail "OUT holding MODEL with --force: refused" 2 "OUT .*/top holds the model .*/top/src" \
	convert top/src top --work w2 --force "${opts[@]}"
check "... the model and its parent untouched" test "$(snap top)" = "$(cat top.before)"
check "... MODEL untouched" test "$(snap m)" = "$(cat m.before)"
check "... no work directory made" test ! -e w2 -a ! -e m/exl3.work -a ! -e m.lock
check_fail "the work directory inside OUT: refused" 2 "the work directory .*/out/w is OUT .*/out or inside it" \
	convert m out --work out/w "${opts[@]}"

# an existing OUT that is not this work directory's
mkdir mine && echo keep >mine/notes.txt
check_fail "OUT an existing directory of the user's: refused" 1 "mine exists and .* is not its work directory" \
	convert m mine --work w "${opts[@]}"
check "... kept" test -f mine/notes.txt
echo "someone's" >out2.lock
check_fail "OUT.lock not convert's: refused" 2 "out2.lock: exists and is not a lock file of convert" \
	convert m out2 --work w "${opts[@]}"
check "... kept" test "$(cat out2.lock)" = "someone's"
check "--force replaces the user's directory with the pack" convert m mine --work w --force "${opts[@]}"
check "... the pack, the same bytes as OUT's" diff -r out mine
done_testing
