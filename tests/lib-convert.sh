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
# head to HEAD_BITS (default 6); a tied head becomes a separate weight under
# the head's key (the embedding stays exact), as in the EXL3 model. Which
# tensors those are comes from the model description (tensor-ls --linears):
# any architecture; a fused tensor (Phi3) is rounded whole, which per
# output row is rounding each of its slices. Every other tensor (norms,
# biases, routers, a vision tower) is copied as it is.
rtn_model() {
	local src=$1 dst=$2 b=$3 hb=${4:-6} lin hkey hw tied
	mkdir -p "$dst"
	lin=$(tensor-ls --linears "$src")
	hkey=$(jq -r 'select(.role == "head") | .key' <<<"$lin")
	hw=$(jq -r 'select(.role == "head") | .weight' <<<"$lin")
	tied=$(jq -r 'select(.role == "head") | .tied' <<<"$lin")
	jq '.tie_word_embeddings = false' "$src/config.json" >"$dst/config.json"
	cp "$src"/tokenizer*.json "$dst/"
	jq -r 'select(.role != "head") | .weight' <<<"$lin" | sort -u >"$dst.lin"
	{ cat "$dst.lin"; [ "$tied" = true ] || echo "$hw"; } | sort >"$dst.q"
	{
		tensor-cat -q "$src" $(tensor-ls "$src" | jq -r .name | sort | comm -23 - "$dst.q")
		tensor-cat -q "$src" $(cat "$dst.lin") | "$TMP/rtn" "$b"
		if [ "$tied" = true ]; then tensor-cat -q "$src" "$hw" | "$TMP/rtn" "$hb" "$hkey.weight"
		else tensor-cat -q "$src" "$hw" | "$TMP/rtn" "$hb"; fi
	} | tensor-cat -q -o "$dst/model.safetensors" -
	rm -f "$dst.lin" "$dst.q"
}

# rtn_take DST Q REGEX: the tensors of DST whose names match REGEX replaced
# by Q's (e.g. a MoE's routers as the EXL3 model stores them, F16); fails
# unless DST then holds exactly Q's tensors of that name, dtype for dtype
rtn_take() {
	local dst=$1 q=$2 re=$3
	{
		tensor-ls "$dst" | jq -r .name | grep -Ev "$re" | xargs tensor-cat -q "$dst"
		tensor-cat -q --regex "$q" "$re"
	} >"$dst.frames" && tensor-cat -q -o "$dst/model.safetensors" "$dst.frames" || return 1
	rm -f "$dst.frames"
	test "$(tensor-ls "$dst" | jq -c --arg re "$re" 'select(.name | test($re)) | [.name, .dtype]' | sort)" = \
	     "$(tensor-ls "$q" | jq -c --arg re "$re" 'select(.name | test($re)) | [.name, .dtype]' | sort)"
}

# kl_vs_rtn LABEL SRC Q B V [TAKE]: the EXL3 model Q of SRC at B bits,
# whose validate report is V, against round to nearest at B bits
# (rtn_model SRC into Q.rtn; with TAKE, a regex, those tensors taken from Q
# as Q stores them: rtn_take, checked) on the held-out text "${ev[@]}"
# (model-eval's report: Q.rtn.json). Checks, each named after LABEL, that
# Q's KL is below RTN's and below the previous call's (kl_prev at
# kl_prev_b bits: set kl_prev= to start a series); then sets both.
kl_vs_rtn() {
	local label=$1 src=$2 q=$3 b=$4 v=$5 take=${6:-} kl
	rtn_model "$src" "$q.rtn" "$b"
	[ -z "$take" ] || check "$label: RTN takes the EXL3 model's tensors matching '$take'" rtn_take "$q.rtn" "$q" "$take"
	model-eval -q --model "$src" --quantized "$q.rtn" "${ev[@]}" >"$q.rtn.json"
	kl=$(jq .eval.kl_divergence "$v")
	check "$label: KL $kl below RTN's $(jq .kl_divergence "$q.rtn.json")" num_lt "$kl" "$(jq .kl_divergence "$q.rtn.json")"
	[ -z "${kl_prev:-}" ] || check "$label: KL falls from $kl_prev_b to $b bpw ($kl_prev -> $kl)" num_lt "$kl" "$kl_prev"
	kl_prev=$kl kl_prev_b=$b
}

# num_lt A B: A < B as numbers
num_lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
# num_near A B TOL: |A - B| <= TOL
num_near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; }
# jqe FILTER FILE: jq -e, quietly (for check)
jqe() { jq -e "$@" >/dev/null; }
