#!/usr/bin/env bash
# convert-plan --sources: what each step of a conversion reads of the model
# (the work directory's src/ identities, by which a resumed conversion
# decides what changed) equals a plain jq reference over tensor-ls
# --modules and --digest, for generated models of several layouts (dense,
# fused MoE experts, MXFP4 experts, a multimodal wrapper with tensors of no
# module, a hybrid with its MTP layer); bad digest lines name the line or the tensor.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
mk=$ROOT/examples/make-tiny-llama
"$mk" dense 2 >/dev/null
"$mk" --arch qwen3-moe --experts 4 --top-k 2 --fused-experts moe 2 >/dev/null
"$mk" --arch gpt_oss --experts 4 --top-k 2 --mxfp4 oss 2 >/dev/null
"$mk" --arch gemma3-mm mm 2 >/dev/null
"$mk" --arch qwen3_5 q35 2 >/dev/null
# the reference: the identities of each module's tensors (those of its
# stem and its weight's stem, and its weight), of each layer's, of the
# tensors of no module, and of the files
ref() {
	{ tensor-ls --modules "$1"; tensor-ls --digest "$1"; } | jq -rs '
	def stem: sub("\\.[^.]*$"; "");
	def line: if .name then "\(.name) \(.dtype) \(.shape | map(tostring) | join("x")) \(.bytes) \(.xxh3)"
		else "\(.file) \(.bytes) \(.xxh3)" end;
	[.[] | select(.xxh3 and .name)] as $ts
	| (INDEX($ts[]; .name)) as $byname
	| (reduce $ts[] as $t ({}; .[$t.name | stem] += [$t.name])) as $bystem
	| [.[] | select(.file)] as $fs
	| [.[] | select(.kind)] as $mods
	| def names($m): ([$m.key, ($m.weight | stem)] | unique | map($bystem[.] // [])) + [[$m.weight]]
		| add | unique | map(select($byname[.]));
	  def ids($n): $n | unique | map($byname[.] | line) | join(" ");
	([$mods[] | names(.)] | add // [] | unique) as $used
	| ($mods[] | select(.quantized) | "\(.key)\t\(ids(names(.)))"),
	  ($mods | group_by(.layer)[] | "layer.\(.[0].layer)\t\(ids([.[] | names(.)] | add))"),
	  "other\t\(ids([$ts[].name] - $used))",
	  "config\t\([$fs[] | select(.file == "config.json") | line] | join(" "))",
	  "tokenizer\t\([$fs[] | select(.file == "tokenizer.json" or .file == "tokenizer_config.json" or .file == "config.json") | line] | join(" "))",
	  "files\t\([$fs[] | line] | join(" "))"'
}
for m in dense moe oss mm q35; do
	ref $m >$m.ref
	tensor-ls --digest $m | convert-plan --sources $m >$m.out 2>$m.err
	check "$m: the same lines as the reference ($(wc -l <$m.ref) lines)" cmp -s $m.ref $m.out
done
check "the multimodal model's vision tensors are listed as of no module" \
	grep -q '^other	.*vision' mm.out
check "a fused expert tensor is among its experts' sources" \
	grep -q '^model.layers.0.mlp.experts.1.gate_proj	.*mlp.experts.gate_up_proj ' moe.out
tensor-ls --digest dense >d.jsonl
{ cat d.jsonl; head -n 1 d.jsonl; } >dup.jsonl
check_fail "a tensor listed twice: exit 1 naming it" 1 "model.embed_tokens.weight' listed twice" \
	convert-plan --sources dense <dup.jsonl
{ head -n 2 d.jsonl; echo '{"name": '; } >bad.jsonl
check_fail "a line that is not JSON: exit 1 naming the line" 1 "stdin: line 3" convert-plan --sources dense <bad.jsonl
check_fail "--sources with --list: a usage error" 2 "--sources takes one MODEL" \
	convert-plan --sources --list meas dense </dev/null
done_testing
