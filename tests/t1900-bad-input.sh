#!/usr/bin/env bash
# Bad input across programs (review3): each message names the program, the
# file or tensor and the problem once, with exit 1 for data errors and 2 for
# usage errors.
. "$(dirname "$0")/lib.sh"
cd "$TMP"

tensor-gen -s 1 w=64x48 >w.frames
tensor-gen -s 2 -d spd h=48x48 --meta count=100 >h.frames
head -c 300 h.frames >hcut.frames
mkdir adir

# a file named in the library's message is not named twice ("f: f: why")
once() {   # once WHAT FILE cmd...: stderr names FILE exactly once
	local what=$1 f=$2; shift 2
	"$@" >/dev/null 2>err.txt && { notok "$what (exit 0)"; return; }
	if [ "$(grep -o -F -- "$f" err.txt | wc -l)" -eq 1 ]; then ok "$what"
	else notok "$what"; sed 's/^/#   /' err.txt; fi
}
check_fail "had-rotate --hessian: a truncated Hessian file" 1 \
	"^had-rotate: hcut.frames: frame 0 'h': truncated payload" sh -c 'had-rotate --hessian hcut.frames <w.frames'
once "... names the file once" hcut.frames sh -c 'had-rotate --hessian hcut.frames <w.frames'
once "trellis-encode --hessian: a missing file, named once" nosuch.frames \
	sh -c 'trellis-encode -K 2 --hessian nosuch.frames <w.frames'
once "had-rotate --hessian: a directory, named once" adir sh -c 'had-rotate --hessian adir <w.frames'
once "hessian-capture --merge: a truncated file, named once" hcut.frames hessian-capture --merge hcut.frames
once "hessian-capture --activations: a missing file, named once" nosuch.frames hessian-capture --activations nosuch.frames
done_testing
