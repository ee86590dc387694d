#!/usr/bin/env bash
# t1557-moe-checkpoint: the seeded tiny mixture-of-experts checkpoints of
# examples/make-tiny-llama --arch (Mixtral, Qwen3-MoE with a dense layer,
# Qwen2-MoE with its shared expert; expert widths not multiples of 128)
# match the library's descriptions (tensor-ls --modules checks every
# tensor), the router stays unquantized, and bad checkpoints (a missing
# expert, an expert of the wrong shape, contradicting expert counts) fail
# naming the tensor or the key, before pipelines/convert writes anything.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
mk() { "$ROOT/examples/make-tiny-llama" "$@" >/dev/null; }
mk --arch mixtral --experts 3 --top-k 2 mx 2 64 96
mk --arch qwen3-moe --experts 4 --top-k 2 --moe-inter 48 --dense-layers 0 q3 2 64 96
mk --arch qwen2-moe --experts 2 --top-k 1 --moe-inter 40 --shared-inter 80 q2 2 64 96
for m in mx q3 q2; do
	check "$m: every module of the description is in the checkpoint" sh -c "tensor-ls --modules $m >/dev/null"
done
# modules: embedding, head, final norm + per layer 2 norms, 4 attention,
# then the MLP (dense: 3; Mixtral: router + 3 x 3; Qwen3 also q/k norms)
check "Mixtral: 2 layers x (6 + 1 + 9) + 3 modules, 2 x 13 + 1 linears" \
	test "$(tensor-ls --config mx | jq -c '[.modules, .linears]')" = "[35,27]"
check "Qwen3-MoE: layer 0 dense (mlp_only_layers), layer 1 with 4 experts" \
	test "$(tensor-ls --config q3 | jq -c '[.modules, .linears]')" = "[35,24]"
check "Qwen3-MoE: the experts are 48 wide (moe_intermediate_size)" \
	test "$(tensor-ls --linears q3 | jq -c 'select(.key == "model.layers.1.mlp.experts.3.down_proj") | [.shape, .padded, .role]')" = '[[64,48],[128,128],"expert"]'
check "Qwen2-MoE: a shared expert (role shared_expert, --hq 2 as ExLlamaV3's Qwen MoE files) and its 1-row gate" \
	test "$(tensor-ls --modules q2 | jq -sc '[.[] | select(.layer == 1 and (.role == "shared_expert" or .role == "router")) | [.kind, .hq]]')" = '[["matrix",null],["linear",2],["linear",2],["linear",2],["matrix",null]]'
check "routers are passed through, not quantized" \
	test "$(tensor-ls --modules mx | jq -r 'select(.role == "router") | .quantized' | sort -u)" = false
check "each expert reads its own Hessian group (its routed tokens)" \
	test "$(tensor-ls --linears mx | jq -r 'select(.role == "expert") | .group' | sort -u | wc -l)" -eq $((2 * 3 * 2))
check "make-tiny-llama --arch: the same bytes every time" \
	sh -c "'$ROOT/examples/make-tiny-llama' --arch qwen3-moe --experts 4 --top-k 2 --moe-inter 48 --dense-layers 0 q3b 2 64 96 >/dev/null && cmp -s q3/model.safetensors q3b/model.safetensors"

# the forward: model-eval runs each; hessian-capture gives each expert the
# Hessian of the tokens routed to it (counts: top k per token in all)
tensor-gen -s 1 -d uniform -t I32 --mean 128 --scale 127 tokens=4x32 >tok.frames
for m in mx q3 q2; do
	check "$m: model-eval gives a finite NLL" sh -c "model-eval -q --model $m --tokens tok.frames | jq -e '.nll > 0 and .nll < 20' >/dev/null"
done
hessian-capture -q --model q3 --tokens tok.frames --cols 32 | tensor-ls >q3.h
check "Qwen3-MoE: the dense layer's MLP Hessian sees all 128 tokens" \
	test "$(jq -r 'select(.name == "model.layers.0.mlp.input") | .meta.count' q3.h)" = 128
check "Qwen3-MoE: the experts' Hessians record the routed tokens (routed_tokens), 2 per token (top 2)" \
	test "$(jq -s '[.[] | select(.name | test("layers\\.1\\.mlp\\.experts\\.[0-9]+\\.input$")) | .meta.routed_tokens | tonumber] | add' q3.h)" = 256
hessian-capture -q --model q2 --tokens tok.frames --cols 32 | tensor-ls >q2.h
check "Qwen2-MoE: the shared expert's Hessian sees every token" \
	test "$(jq -r 'select(.name == "model.layers.1.mlp.shared_expert.input") | .meta.count' q2.h)" = 128

# bad checkpoints
mkdir miss shape count
cp mx/config.json mx/tokenizer.json miss/
# the checkpoint without one tensor: every other name as a pattern
without() { tensor-ls "$1" | jq -r .name | grep -vxF "$2"; }
tensor-cat -q -o miss/model.safetensors mx $(without mx model.layers.1.block_sparse_moe.experts.2.w3.weight)
check_fail "a missing expert: exit 1 naming it" 1 "model.layers.1.block_sparse_moe.experts.2.w3" \
	tensor-ls --modules miss
check_fail "pipelines/convert refuses it before writing" 1 "experts.2.w3" \
	"$ROOT/pipelines/convert" -q miss miss.out --bits 3
check "nothing written for it" test ! -e miss.out
cp q3/config.json q3/tokenizer.json shape/
{ tensor-cat -q q3 $(without q3 model.layers.1.mlp.experts.0.up_proj.weight)
  tensor-gen -s 9 model.layers.1.mlp.experts.0.up_proj.weight=64x64; } | tensor-cat -q -o shape/model.safetensors -
check_fail "an expert of the wrong shape: exit 1 naming it" 1 "model.layers.1.mlp.experts.0.up_proj.*64x64" \
	tensor-ls --modules shape
cp q3/model.safetensors q3/tokenizer.json count/
jq '.num_experts_per_tok = 5' q3/config.json >count/config.json
check_fail "more experts per token than experts: exit 1 naming the keys" 1 \
	"'num_experts_per_tok' = 5 is more than 'num_experts' = 4" tensor-ls --modules count
jq '.num_experts = 3' q3/config.json >count/config.json
check_fail "fewer experts in the config than in the checkpoint: the extra one is not listed, the count is checked by shape" 1 \
	"model.layers.1.mlp.gate.weight" tensor-ls --modules count
# the attention heads of any family (tests/bench/layer.sh makes an 8B's layer)
mk --arch mixtral --experts 2 --top-k 1 --heads 4 --kv-heads 1 gqa 1 64 96
check "--heads 4 --kv-heads 1: k_proj 16 x 64 (head size 16), every module present" \
	test "$(tensor-ls --modules gqa | jq -c 'select(.key | endswith("k_proj")) | .shape')" = "[16,64]"
check_fail "--kv-heads must divide --heads" 2 "--kv-heads must divide --heads" "$ROOT/examples/make-tiny-llama" --heads 4 --kv-heads 3 bad 1 64 96
done_testing
