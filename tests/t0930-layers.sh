#!/usr/bin/env bash
# t0930-layers: the library's folders are its layers (lib/README.md), and
# every #include keeps to them: tests/layers-check passes on this tree and
# fails, naming the file and the header, on copies of it with one bad
# include or one misplaced file planted; it fails on a .c file over 1,000
# lines and on two .c files of lib/ with one base name, and warns (without
# failing) of a function over 150 lines.
. "$(dirname "$0")/lib.sh"
chk=$ROOT/tests/layers-check

# passes "what" DIR: the checker accepts DIR, silently
passes() {
	if "$chk" "$2" >/dev/null 2>"$TMP/p.err" && [ ! -s "$TMP/p.err" ]; then ok "$1"
	else notok "$1"; sed 's/^/#   /' "$TMP/p.err" | head -20; fi
}
passes "this tree keeps to lib/layers" "$ROOT"
# the long functions it warns of, as diagnostics
"$chk" "$ROOT" 2>/dev/null | sed 's/^/# /' || true

# a fresh copy of the sources lib/ and bin/ hold (no build outputs)
copy() {
	rm -rf "$TMP/t"; mkdir -p "$TMP/t"
	(cd "$ROOT" && find lib bin \( -name '*.[ch]' -o -path lib/layers \) -exec cp --parents -t "$TMP/t" {} +)
}
# plant FILE LINE: append LINE to the copy's FILE
plant() { copy; mkdir -p "$(dirname "$TMP/t/$1")"; printf '%s\n' "$2" >> "$TMP/t/$1"; }

plant lib/common/x3.c '#include "model.h"'
check_fail "up a layer: common includes model.h" 1 'lib/common/x3\.c:[0-9]+: includes "model\.h" of lib/model/: common may include its own folder only' "$chk" "$TMP/t"
plant lib/format/frame.c '#include "codec.h"'
check_fail "up a layer: format includes codec.h" 1 'lib/format/frame\.c:[0-9]+: includes "codec\.h" of lib/codec/: format may include common and its own folder only' "$chk" "$TMP/t"
plant lib/quant/quant.h '#include "linear.h"'
check_fail "beside it: quant includes model's linear.h" 1 'lib/quant/quant\.h:[0-9]+: includes "linear\.h" of lib/model/: quant may include' "$chk" "$TMP/t"
plant lib/codec/viterbi.c '#include "gpu_kern.h"'
check_fail "into the backend: codec includes gpu_kern.h" 1 'lib/codec/viterbi\.c:[0-9]+: includes "gpu_kern\.h" of lib/gpu/' "$chk" "$TMP/t"
plant lib/model/linear.c '#include "exl3_impl.h"'
check_fail "another folder's internals: model includes exl3_impl.h" 1 'lib/model/linear\.c:[0-9]+: includes "exl3_impl\.h": internal to lib/codec/' "$chk" "$TMP/t"
plant bin/exl3-matmul.c '#include "exl3_impl.h"'
check_fail "bin/ includes a library-internal header (exl3_impl.h)" 1 'bin/exl3-matmul\.c:[0-9]+: includes "exl3_impl\.h": internal to lib/codec/' "$chk" "$TMP/t"
plant bin/trellis-encode.c '#include "gpu_kern.h"'
check_fail "bin/ includes the backend's header (gpu_kern.h)" 1 'bin/trellis-encode\.c:[0-9]+: includes "gpu_kern\.h" of lib/gpu/: the programs use the headers of common, format' "$chk" "$TMP/t"
plant lib/arch/pack.c '#include "../codec/codec.h"'
check_fail "a path instead of a flat name" 1 'lib/arch/pack\.c:[0-9]+: includes "\.\./codec/codec\.h": headers are included by flat name' "$chk" "$TMP/t"
plant lib/text/tokenizer.c '#include "nosuch.h"'
check_fail "a header that is nowhere" 1 'lib/text/tokenizer\.c:[0-9]+: includes "nosuch\.h": no such header' "$chk" "$TMP/t"
plant lib/newfile.c '#include "x3.h"'
check_fail "a file in lib/ itself" 1 'lib/newfile\.c: not in a layer folder' "$chk" "$TMP/t"
plant lib/extra/extra.c '#include "x3.h"'
check_fail "a folder that is not a layer" 1 "lib/extra: a folder that lib/layers does not list" "$chk" "$TMP/t"
plant lib/model/frame.h '/* a second frame.h */'
check_fail "one header name in two layers" 1 'lib/(format|model)/frame\.h: header name also in lib/(model|format)/' "$chk" "$TMP/t"
# file and function sizes
copy; seq 1001 | sed 's|^|/* line |; s|$| */|' > "$TMP/t/lib/text/big.c"
check_fail "a .c file of 1001 lines" 1 'lib/text/big\.c: 1001 lines, over 1000' "$chk" "$TMP/t"
copy; seq 1001 | sed 's|^|/* line |; s|$| */|' > "$TMP/t/bin/big.c"
check_fail "a program's .c file of 1001 lines" 1 'bin/big\.c: 1001 lines, over 1000' "$chk" "$TMP/t"
copy; printf '/* a second quant.c */\n' > "$TMP/t/lib/model/quant.c"
check_fail "two .c files of lib/ with one base name" 1 'lib/(model|quant)/quant\.c: base name also of lib/(quant|model)/quant\.c' "$chk" "$TMP/t"
copy; { printf 'int longfn(void)\n{\n\tint x = 0;\n'; seq 148 | sed 's/.*/\tx++;/'; printf '}\n'; } >> "$TMP/t/lib/common/x3.c"
passes "a function of 151 lines only warns" "$TMP/t"
check "  the warning names the file, the line and the function" \
	sh -c '"$1" "$2" 2>/dev/null | grep -Eq "^warning: lib/common/x3\.c:[0-9]+: longfn\(\) is 151 lines \(over 150\)"' - "$chk" "$TMP/t"
copy; { printf 'int shortfn(void)\n{\n\tint x = 0;\n'; seq 147 | sed 's/.*/\tx++;/'; printf '}\n'; } >> "$TMP/t/lib/common/x3.c"
check "  and not of one of 150" sh -c '! "$1" "$2" 2>/dev/null | grep -q shortfn' - "$chk" "$TMP/t"

# the rule comes from lib/layers: with model allowed in common the first plant passes
plant lib/common/x3.c '#include "model.h"'
sed -i 's/^common.*/common	model/' "$TMP/t/lib/layers"
passes "the order is read from lib/layers" "$TMP/t"

# the built objects keep to the same rows (a call that bypasses the
# headers): this build's, and a copy with one object that calls up
if ls "$ROOT"/lib/common/*.o >/dev/null 2>&1 && command -v nm >/dev/null && command -v "${CC:-cc}" >/dev/null; then
	if "$chk" --objects "$ROOT" 2>"$TMP/p.err" && [ ! -s "$TMP/p.err" ]; then ok "the objects use only the layers their rows allow"
	else notok "the objects use only the layers their rows allow"; sed 's/^/#   /' "$TMP/p.err" | head -20; fi
	rm -rf "$TMP/o"; mkdir -p "$TMP/o"
	(cd "$ROOT" && cp --parents -t "$TMP/o" lib/layers lib/*/*.o)
	printf 'extern int x3_model_open(const char *, const void *, void **);\nint bad(void) { return x3_model_open(0, 0, 0); }\n' |
		"${CC:-cc}" -x c -c -o "$TMP/o/lib/codec/bad.o" -
	check_fail "an object of codec that calls x3_model_open (model)" 1 \
		'lib/codec/bad\.o: uses x3_model_open, defined in lib/model/ \(codec may not use model' "$chk" --objects "$TMP/o"
else
	skip "the objects' symbols (no build here, or no nm/cc)"
	skip "an object that calls up"
fi

# the Makefile builds every layer of lib/layers: one -I per folder
if command -v make >/dev/null; then
	inc=$(make -s -C "$ROOT" -f Makefile -f - print-layers CUDA=0 <<'EOF' 2>/dev/null
print-layers: ; @echo $(LAYERS)
EOF
)
	want=$(awk '/^[a-z]/ && $1 != "bin" { printf "%s%s", s, $1; s = " " }' "$ROOT/lib/layers")
	check "the Makefile's layers are lib/layers' ($want)" [ "$inc" = "$want" ]
fi
done_testing
