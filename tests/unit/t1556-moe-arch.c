/* t1556-moe-arch: the mixture-of-experts descriptions (lib/arch/arch_tables.c) and
 * their config keys (lib/arch/config.c): Mixtral's block_sparse_moe, Qwen3-MoE
 * with dense layers (mlp_only_layers, decoder_sparse_step), Qwen2-MoE's
 * shared expert; per-expert modules and Hessian groups, the router kept
 * unquantized, model order, and configs whose expert counts contradict
 * each other refused naming the key. Mixtral in Transformers v5's layout
 * (fused experts, the router as mlp.gate) under the same keys. */
#include <string.h>
#include "test.h"
#include "arch.h"
#include "model.h"

static int parse(const char *s, x3_model_config *c)
{
	return x3_config_parse_as(s, strlen(s), X3_CONFIG_LAYOUT, c);
}

static const x3_module *find(const x3_module *m, int n, const char *key)
{
	return x3_modules_find(m, n, key);
}

#define BASE "\"num_hidden_layers\": 4, \"hidden_size\": 64, \"intermediate_size\": 160, " \
	"\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 258"

int main(void)
{
	x3_model_config c;
	x3_module *m;
	int n;

	/* Mixtral: 4 layers x (2 norms, 4 attention, router, 3 experts x 3) */
	CHECK_OK(parse("{\"architectures\": [\"MixtralForCausalLM\"], " BASE ", \"num_local_experts\": 3, "
	               "\"num_experts_per_tok\": 2}", &c), "Mixtral config");
	CHECK(c.n_experts == 3 && c.n_experts_tok == 2 && c.moe_inter == 160 && c.norm_topk == 1,
	      "Mixtral: 3 experts, top 2, intermediate_size wide, renormalized");
	CHECK_OK(x3_arch_modules(&c, &m, &n), "Mixtral modules");
	CHECK(n == 1 + 4 * (2 + 4 + 1 + 9) + 2, "Mixtral: %d modules", n);
	const x3_module *r = find(m, n, "model.layers.1.block_sparse_moe.gate");
	CHECK(r && r->d->kind == X3_KIND_MATRIX && r->d->role == X3_ROLE_ROUTER && r->out == 3 && r->in == 64,
	      "router: an unquantized 3x64 matrix");
	const x3_module *w2 = find(m, n, "model.layers.2.block_sparse_moe.experts.1.w2");
	CHECK(w2 && w2->d->kind == X3_KIND_LINEAR && w2->d->role == X3_ROLE_EXPERT && w2->expert == 1 &&
	      w2->in == 160 && w2->out == 64 && w2->layer == 2 &&
	      !strcmp(w2->group, "model.layers.2.block_sparse_moe.experts.1.w2.input"),
	      "expert 1's w2: 160 -> 64, its own down group");
	char mb[1024];
	CHECK_OK(x3_modules_members(m, n, "model.layers.0.block_sparse_moe.experts.2.input", mb, sizeof mb),
	         "members");
	CHECK(!strcmp(mb, "model.layers.0.block_sparse_moe.experts.2.w1.weight,"
	                  "model.layers.0.block_sparse_moe.experts.2.w3.weight"), "expert 2 reads: %s", mb);
	/* model order: router, expert 0 (w1 w3 w2), expert 1, ..., then the next layer */
	long mo[4], rk[4];
	const char *ord[4] = {"model.layers.0.block_sparse_moe.gate.weight",
		"model.layers.0.block_sparse_moe.experts.0.w2.trellis",
		"model.layers.0.block_sparse_moe.experts.1.w1.trellis",
		"model.layers.0.block_sparse_moe.experts.2.w2.trellis"};
	for (int i = 0; i < 4; i++)
		x3_arch_order(&c, ord[i], &mo[i], &rk[i]);
	CHECK(mo[0] == 1 && mo[3] == 1 && rk[0] < rk[1] && rk[1] < rk[2] && rk[2] < rk[3],
	      "model order: router, expert 0, 1, 2");
	int lay = -1;
	const x3_module_desc *d = x3_arch_classify("model.layers.17.block_sparse_moe.experts.5.w3", &lay);
	CHECK(d && d->role == X3_ROLE_EXPERT && lay == 17, "classify an expert key");
	CHECK(!x3_arch_classify("model.layers.1.block_sparse_moe.experts.05.w3", &lay),
	      "an expert number with a leading zero is no expert");
	CHECK(!x3_modules_renamed(m, n, "model.layers.1.block_sparse_moe.gate.weight") &&
	      !strcmp(r->src, r->key), "per-expert keys: nothing renamed");
	free(m);

	/* Mixtral in Transformers v5's layout: the router read from mlp.gate,
	 * the experts rows of the fused tensors, the keys unchanged */
	c.fused_experts = 1;
	CHECK_OK(x3_arch_modules(&c, &m, &n), "Mixtral v5 modules");
	CHECK(n == 1 + 4 * (2 + 4 + 1 + 9) + 2, "Mixtral v5: the same %d modules", n);
	r = find(m, n, "model.layers.1.block_sparse_moe.gate");
	CHECK(r && !r->sliced && !strcmp(r->src, "model.layers.1.mlp.gate") &&
	      !strcmp(r->weight, "model.layers.1.mlp.gate.weight"), "router: read from %s", r ? r->weight : "-");
	const x3_module *w3 = find(m, n, "model.layers.1.block_sparse_moe.experts.1.w3");
	CHECK(w3 && w3->fused && !strcmp(w3->weight, "model.layers.1.mlp.experts.gate_up_proj") &&
	      w3->row0 == 320 + 160 && w3->src_rows == 3 * 320, "expert 1's w3: rows 480.. of gate_up_proj");
	char nb[160];
	CHECK(x3_modules_renamed(m, n, "model.layers.1.mlp.gate.weight") == r &&
	      !x3_modules_renamed(m, n, "model.layers.1.mlp.gate_x.weight") &&
	      !x3_modules_renamed(m, n, "model.layers.1.block_sparse_moe.gate.weight"), "renamed: by source name");
	x3_modules_out_name(m, n, "model.layers.1.mlp.gate.weight", nb, sizeof nb);
	CHECK(!strcmp(nb, "model.layers.1.block_sparse_moe.gate.weight"), "output name: %s", nb);
	x3_modules_src_name(m, n, "model.layers.1.block_sparse_moe.gate.weight", nb, sizeof nb);
	CHECK(!strcmp(nb, "model.layers.1.mlp.gate.weight"), "source name: %s", nb);
	x3_modules_out_name(m, n, "model.layers.1.input_layernorm.weight", nb, sizeof nb);
	CHECK(!strcmp(nb, "model.layers.1.input_layernorm.weight"), "others keep their names");
	CHECK(x3_modules_slice_of(m, n, "model.layers.0.mlp.experts.down_proj") &&
	      !x3_modules_slice_of(m, n, "model.layers.0.mlp.gate.weight"),
	      "the fused tensors are the experts', the router no slice");
	free(m);

	/* Qwen3-MoE: layer 0 dense (mlp_only_layers), layers 1 and 3 sparse
	 * (decoder_sparse_step 2), layer 2 dense */
	CHECK_OK(parse("{\"architectures\": [\"Qwen3MoeForCausalLM\"], " BASE ", \"num_experts\": 4, "
	               "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 48, \"norm_topk_prob\": true, "
	               "\"decoder_sparse_step\": 2, \"mlp_only_layers\": [0]}", &c), "Qwen3-MoE config");
	CHECK(c.moe_inter == 48 && c.norm_topk && !x3_arch_sparse_layer(&c, 0) && x3_arch_sparse_layer(&c, 1) &&
	      !x3_arch_sparse_layer(&c, 2) && x3_arch_sparse_layer(&c, 3), "sparse layers 1 and 3");
	CHECK_OK(x3_arch_modules(&c, &m, &n), "Qwen3-MoE modules");
	CHECK(find(m, n, "model.layers.0.mlp.gate_proj") && !find(m, n, "model.layers.0.mlp.gate") &&
	      find(m, n, "model.layers.1.mlp.gate") && !find(m, n, "model.layers.1.mlp.gate_proj") &&
	      find(m, n, "model.layers.3.mlp.experts.3.down_proj") && !find(m, n, "model.layers.3.mlp.experts.4.up_proj"),
	      "dense layers have mlp.*_proj, sparse ones the router and 4 experts");
	CHECK(n == 1 + 4 * (2 + 6) + 2 * 3 + 2 * (1 + 12) + 2, "Qwen3-MoE: %d modules", n);
	const x3_module *up = find(m, n, "model.layers.1.mlp.experts.2.up_proj");
	CHECK(up && up->out == 48 && !strcmp(up->group, "model.layers.1.mlp.experts.2.input"), "expert width 48");
	free(m);

	/* Qwen2-MoE: the shared expert and its sigmoid gate (1 x hidden) */
	CHECK_OK(parse("{\"architectures\": [\"Qwen2MoeForCausalLM\"], " BASE ", \"num_experts\": 2, "
	               "\"num_experts_per_tok\": 1, \"moe_intermediate_size\": 32, "
	               "\"shared_expert_intermediate_size\": 96}", &c), "Qwen2-MoE config");
	CHECK(!c.norm_topk && c.qkv_bias, "Qwen2-MoE: norm_topk_prob defaults to false, q/k/v biases");
	CHECK_OK(x3_arch_modules(&c, &m, &n), "Qwen2-MoE modules");
	const x3_module *sg = find(m, n, "model.layers.0.mlp.shared_expert_gate");
	const x3_module *sd = find(m, n, "model.layers.3.mlp.shared_expert.down_proj");
	CHECK(sg && sg->d->kind == X3_KIND_MATRIX && sg->out == 1 && sg->in == 64 &&
	      sd && sd->d->role == X3_ROLE_SHARED_EXPERT && sd->in == 96 && sd->d->hq == 2,
	      "shared expert (96 wide, --hq +2 as ExLlamaV3's Qwen MoE files) and its 1x64 gate");
	free(m);

	/* bad configs name the key */
	CHECK(parse("{\"architectures\": [\"Qwen3MoeForCausalLM\"], " BASE ", \"num_experts\": 4, "
	            "\"num_experts_per_tok\": 5, \"moe_intermediate_size\": 48}", &c) == X3_EFORMAT &&
	      strstr(x3_errmsg(), "'num_experts_per_tok' = 5 is more than 'num_experts' = 4"),
	      "top k above the expert count: %s", x3_errmsg());
	CHECK(parse("{\"architectures\": [\"MixtralForCausalLM\"], " BASE ", \"num_local_experts\": 4}", &c) ==
	      X3_EFORMAT && strstr(x3_errmsg(), "\"num_experts_per_tok\""), "no top k: %s", x3_errmsg());
	CHECK(parse("{\"architectures\": [\"Qwen3MoeForCausalLM\"], " BASE ", \"num_experts\": 4, "
	            "\"num_experts_per_tok\": 2}", &c) == X3_EFORMAT &&
	      strstr(x3_errmsg(), "\"moe_intermediate_size\""), "no expert width: %s", x3_errmsg());
	CHECK(parse("{\"architectures\": [\"MixtralForCausalLM\"], " BASE ", \"num_experts\": 4, "
	            "\"num_local_experts\": 4, \"num_experts_per_tok\": 2}", &c) == X3_EUNSUP &&
	      strstr(x3_errmsg(), "\"num_experts\""), "a second expert count key: %s", x3_errmsg());
	CHECK(parse("{\"architectures\": [\"Qwen3MoeForCausalLM\"], " BASE ", \"num_experts\": 4, "
	            "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"mlp_only_layers\": [4]}", &c) ==
	      X3_EFORMAT && strstr(x3_errmsg(), "'mlp_only_layers'"), "mlp_only_layers past the layers: %s",
	      x3_errmsg());
	CHECK(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"num_local_experts\": 4}", &c) ==
	      X3_EUNSUP && strstr(x3_errmsg(), "num_local_experts"), "experts in a dense config: %s", x3_errmsg());
	TEST_DONE();
}
