/* t1604-modix: the module index (lib/arch/modix.c) answers every lookup
 * by name as the plain scans of the module list do (x3_modules_find,
 * owner, slice_of, out_name, src_name), over the modules of descriptions
 * with row slices (Qwen3-Next's fused projections, DeepSeek-V3), renamed
 * modules (Mixtral in Transformers v5's layout) and fused experts, for
 * every name a module reads or writes and for near misses. */
#include <string.h>
#include "test.h"
#include "arch.h"
#include "model.h"

static const char *const cfg[] = {
	/* Mixtral (in Transformers v5's layout: the router renamed) */
	"{\"architectures\": [\"MixtralForCausalLM\"], \"num_hidden_layers\": 3, \"hidden_size\": 64, "
	"\"intermediate_size\": 160, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
	"\"vocab_size\": 258, \"num_local_experts\": 3, \"num_experts_per_tok\": 2}",
	/* DeepSeek-V3 */
	"{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"model_type\":\"deepseek_v3\",\"n_routed_experts\":4"
	",\"num_experts_per_tok\":2,\"moe_intermediate_size\":48,\"n_shared_experts\":1,\"first_k_dense_re"
	"place\":1,\"moe_layer_freq\":1,\"n_group\":2,\"topk_group\":1,\"norm_topk_prob\":true,\"routed_scali"
	"ng_factor\":2.5,\"scoring_func\":\"sigmoid\",\"topk_method\":\"noaux_tc\",\"q_lora_rank\":48,\"kv_lora"
	"_rank\":40,\"qk_nope_head_dim\":16,\"qk_rope_head_dim\":8,\"v_head_dim\":16,\"num_nextn_predict_la"
	"yers\":1,\"attention_bias\":false,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0,\"beta_fast\":32,\""
	"beta_slow\":1,\"mscale\":1.0,\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":128},\"hi"
	"dden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_k"
	"ey_value_heads\":2,\"vocab_size\":258,\"max_position_embeddings\":512,\"rms_norm_eps\":1e-05,\"rop"
	"e_theta\":10000.0,\"tie_word_embeddings\":false,\"hidden_act\":\"silu\",\"bos_token_id\":256,\"eos_t"
	"oken_id\":257,\"torch_dtype\":\"float32\"}",
	/* Qwen3-Next */
	"{\"architectures\":[\"Qwen3NextForCausalLM\"],\"model_type\":\"qwen3_next\",\"num_experts\":4,\"num_e"
	"xperts_per_tok\":2,\"moe_intermediate_size\":48,\"shared_expert_intermediate_size\":96,\"norm_to"
	"pk_prob\":true,\"decoder_sparse_step\":1,\"mlp_only_layers\":[],\"hidden_size\":64,\"intermediate_"
	"size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\""
	":24,\"vocab_size\":258,\"max_position_embeddings\":512,\"rms_norm_eps\":1e-06,\"full_attention_in"
	"terval\":4,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"linear_key_head_dim\":24,\"li"
	"near_value_head_dim\":20,\"linear_conv_kernel_dim\":4,\"hidden_act\":\"silu\",\"attention_bias\":fa"
	"lse,\"mtp_num_hidden_layers\":1,\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000."
	"0,\"partial_rotary_factor\":0.25},\"bos_token_id\":256,\"eos_token_id\":257,\"tie_word_embeddings"
	"\":false,\"torch_dtype\":\"float32\"}",
	/* GPT-OSS */
	"{\"architectures\":[\"GptOssForCausalLM\"],\"model_type\":\"gpt_oss\",\"num_local_experts\":4,\"num_e"
	"xperts_per_tok\":2,\"experts_per_token\":2,\"head_dim\":24,\"sliding_window\":32,\"layer_types\":[\""
	"sliding_attention\",\"full_attention\"],\"attention_bias\":true,\"attention_dropout\":0,\"swiglu_l"
	"imit\":7,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,\"beta_fast\":32,\"beta_slow\":1,\"trunca"
	"te\":false,\"original_max_position_embeddings\":128},\"router_aux_loss_coef\":0.9,\"pad_token_id"
	"\":257,\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\""
	":4,\"num_key_value_heads\":2,\"vocab_size\":258,\"max_position_embeddings\":512,\"rms_norm_eps\":1"
	"e-05,\"rope_theta\":10000,\"tie_word_embeddings\":false,\"hidden_act\":\"silu\",\"bos_token_id\":256"
	",\"eos_token_id\":257,\"torch_dtype\":\"float32\"}",
};

static const char *key_of(const x3_module *m) { return m ? m->key : "(none)"; }

int main(void)
{
	static const char *const sfx[] = {"", ".weight", ".bias", ".trellis", ".suh", ".weight_scale_inv",
	                                   "x", ".", ".input"};
	for (size_t a = 0; a < sizeof cfg / sizeof *cfg; a++) {
		x3_model_config c;
		x3_module *m;
		int n;
		CHECK_OK(x3_config_parse_as(cfg[a], strlen(cfg[a]), X3_CONFIG_LAYOUT, &c), "config %zu", a);
		if (a != 2)   /* the experts fused 3-D, as the hub stores them */
			c.fused_experts = 1;
		CHECK_OK(x3_arch_modules(&c, &m, &n), "%s: its modules", c.arch_name);
		x3_modix *ix;
		CHECK_OK(x3_modix_build(m, n, &ix), "%s: the index of its %d modules", c.arch_name, n);
		int names = 0, bad = 0, sliced = 0, renamed = 0;
		char first[512] = "";
		for (int i = 0; i < n; i++) {
			sliced += m[i].sliced;
			renamed += !m[i].sliced && strcmp(m[i].src, m[i].key) != 0;
			const char *base[] = {m[i].key, m[i].src, m[i].weight};
			for (int b = 0; b < 3; b++)
				for (size_t s = 0; s < sizeof sfx / sizeof *sfx; s++) {
					char nm[600], o1[700], o2[700], s1[700], s2[700];
					snprintf(nm, sizeof nm, "%s%s", base[b], sfx[s]);
					x3_modules_out_name(m, n, nm, o1, sizeof o1);
					x3_modix_out_name(ix, nm, o2, sizeof o2);
					x3_modules_src_name(m, n, nm, s1, sizeof s1);
					x3_modix_src_name(ix, nm, s2, sizeof s2);
					int same = x3_modules_find(m, n, nm) == x3_modix_find(ix, nm) &&
					           x3_modules_owner(m, n, nm) == x3_modix_owner(ix, nm) &&
					           x3_modules_slice_of(m, n, nm) == x3_modix_slice_of(ix, nm) &&
					           !strcmp(o1, o2) && !strcmp(s1, s2);
					names++;
					if (!same && !bad++)
						snprintf(first, sizeof first, "%s: find %s/%s owner %s/%s slice %s/%s out %s/%s",
						         nm, key_of(x3_modules_find(m, n, nm)), key_of(x3_modix_find(ix, nm)),
						         key_of(x3_modules_owner(m, n, nm)), key_of(x3_modix_owner(ix, nm)),
						         key_of(x3_modules_slice_of(m, n, nm)), key_of(x3_modix_slice_of(ix, nm)),
						         o1, o2);
				}
		}
		CHECK(bad == 0, "%s: the index answers as the scans for %d names (%d slices, %d renamed)%s%s",
		      c.arch_name, names, sliced, renamed, bad ? "; first that differs: " : "", first);
		x3_modix_free(ix);
		free(m);
	}
	TEST_DONE();
}
