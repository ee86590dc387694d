/* t1603-pack-role: the role and layer of a tensor from its key name alone
 * (x3_pack_role), over the names of dense and MoE architectures. */
#include "test.h"
#include "pack.h"

int main(void)
{
	static const struct { const char *name; int role, layer; } c[] = {
		{"model.layers.0.self_attn.q_proj", X3_ROLE_ATTENTION, 0},
		{"model.layers.12.self_attn.o_proj.trellis", X3_ROLE_ATTENTION, 12},
		{"model.layers.3.linear_attn.in_proj_qkvz", X3_ROLE_ATTENTION, 3},
		{"transformer.h.7.attn.c_attn", X3_ROLE_ATTENTION, 7},
		{"model.layers.1.mlp.down_proj", X3_ROLE_MLP, 1},
		{"model.layers.1.feed_forward.w2", X3_ROLE_MLP, 1},
		{"model.layers.2.mlp.experts.17.gate_proj", X3_ROLE_EXPERT, 2},
		{"model.layers.4.block_sparse_moe.experts.3.w1", X3_ROLE_EXPERT, 4},
		{"model.layers.5.mlp.shared_expert.up_proj", X3_ROLE_SHARED_EXPERT, 5},
		{"model.layers.5.mlp.shared_experts.down_proj", X3_ROLE_SHARED_EXPERT, 5},
		{"model.layers.5.mlp.gate.weight", X3_ROLE_ROUTER, 5},
		{"model.layers.4.block_sparse_moe.gate.weight", X3_ROLE_ROUTER, 4},
		{"model.layers.5.mlp.gate_proj", X3_ROLE_MLP, 5},
		{"lm_head", X3_ROLE_HEAD, -1},
		{"lm_head.weight", X3_ROLE_HEAD, -1},
		{"model.embed_tokens.weight", X3_ROLE_EMBEDDING, -1},
		{"transformer.wte.weight", X3_ROLE_EMBEDDING, -1},
		{"model.norm.weight", X3_ROLE_NORM, -1},
		{"model.layers.9.input_layernorm.weight", X3_ROLE_NORM, 9},
		{"model.rotary_emb.inv_freq", X3_ROLE_OTHER, -1},
		{"model.layersX.1.mlp.up_proj", X3_ROLE_MLP, -1},
	};
	for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
		int layer = -7, r = x3_pack_role(c[i].name, &layer);
		CHECK(r == c[i].role && layer == c[i].layer, "%s: %s, layer %d (got %s, %d)", c[i].name,
		      x3_role_name(c[i].role), c[i].layer, x3_role_name(r), layer);
	}
	CHECK(x3_pack_role("model.layers.0.mlp.up_proj", NULL) == X3_ROLE_MLP, "layer pointer may be NULL");
	TEST_DONE();
}
