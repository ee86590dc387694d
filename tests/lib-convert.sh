# tests/lib-convert.sh: helpers of the conversion tests (t18xx), sourced
# after tests/lib.sh.

# tiny_model DIR [LAYERS HIDDEN INTER]: the generated Llama (examples/)
tiny_model() { "$ROOT/examples/make-tiny-llama" "$@" >/dev/null; }

# build_rtn: compile tests/helpers/rtn.c with the project's flags into
# $TMP/rtn (the round-to-nearest baseline)
build_rtn() {
	make -s --no-print-directory -C "$ROOT" -f Makefile -f - RTN="$TMP/rtn" "$TMP/rtn" <<'MK'
$(RTN): tests/helpers/rtn.c $(LIB)
	$(CC) $(CPPFLAGS) $(X3_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)
MK
}

# rtn_model SRC DST B [HEAD_BITS]: SRC with every decoder linear rounded to
# floor(2^B) levels per output channel (absmax scale, no rotation) and the
# head to HEAD_BITS (default 6); a tied head becomes a separate
# lm_head.weight (the embedding stays exact), as in the EXL3 model
rtn_model() {
	local src=$1 dst=$2 b=$3 hb=${4:-6} tied
	mkdir -p "$dst"
	tied=$(jq -r 'if .tie_word_embeddings == true then 1 else 0 end' "$src/config.json")
	jq '.tie_word_embeddings = false' "$src/config.json" >"$dst/config.json"
	cp "$src"/tokenizer*.json "$dst/"
	{
		tensor-cat -q --regex "$src" 'embed_tokens|norm'
		tensor-cat -q --regex "$src" 'layers\..*_proj\.weight$' | "$TMP/rtn" "$b"
		if [ "$tied" = 1 ]; then tensor-cat -q "$src" model.embed_tokens.weight | "$TMP/rtn" "$hb" lm_head.weight
		else tensor-cat -q "$src" lm_head.weight | "$TMP/rtn" "$hb"; fi
	} | tensor-cat -q -o "$dst/model.safetensors" -
}

# num_lt A B: A < B as numbers
num_lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
# num_near A B TOL: |A - B| <= TOL
num_near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; }
# jqe FILTER FILE: jq -e, quietly (for check)
jqe() { jq -e "$@" >/dev/null; }
