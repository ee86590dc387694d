#!/usr/bin/env bash
# t1613-pack-write-source: OUT is never the source model, inside it or
# holding it, with or without --force, however the path is spelled (a
# symbolic link, "..", a relative name): exit 2 naming both, the model
# untouched, nothing written.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-pack.sh"
cd "$TMP" || exit 1

mkdir top
gen_model top/src 2 false 0
gen_quant 2 3 mul1 >q.frames
(cd top/src && ls -l --time-style=+%s . | sort) >before.txt
PW=(pack-write -q --model top/src --passthrough --head-bits 16)
unchanged() { test "$(cd top/src && ls -l --time-style=+%s . | sort)" = "$(cat before.txt)"; }
refused() {   # refused "what" OUT [--force]
	check_fail "$1" 2 "OUT .* (is|is inside|holds) the source model top/src: refused" "${PW[@]}" "${@:3}" "$2" <q.frames
	check "$1: the model untouched, nothing beside it" sh -c 'test -z "$(ls -d top/src.tmp-* top/src/*.tmp-* top.tmp-* 2>/dev/null)"'
	check "$1: the model's files as they were" unchanged
}
refused "--force OUT = the model" top/src --force
refused "OUT = the model, without --force" top/src
refused "--force OUT = the model spelled with .." top/src/../src --force
ln -s top/src link
refused "--force OUT = a symbolic link to the model" link --force
ln -s top/src/.. uplink
refused "--force OUT = the model's parent through a link (it holds the model)" uplink --force
refused "--force OUT = the model's parent" top --force
refused "OUT inside the model" top/src/exl3
mkdir top/src/sub
(cd top/src && ls -l --time-style=+%s . | sort) >before.txt
refused "--force OUT = a directory inside the model" top/src/sub --force
rmdir top/src/sub
(cd top/src && ls -l --time-style=+%s . | sort) >before.txt
check "the model still converts: OUT beside it" "${PW[@]}" top/out <q.frames
check "... a whole pack" test -f top/out/config.json -a -f top/out/model.safetensors
check "--force over that pack (not the model): replaced" "${PW[@]}" --force top/out <q.frames
check "the model's files as they were" unchanged
done_testing
