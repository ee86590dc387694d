/* t1551: config.json parsing: architectures, defaults, rope_scaling,
 * unsupported options (X3_EUNSUP naming them), malformed input. */
#include <math.h>
#include "test.h"
#include "model.h"

static int parse(const char *js, x3_model_config *c)
{
	return x3_config_parse(js, strlen(js), c);
}

#define BASE "\"hidden_size\": 64, \"intermediate_size\": 172, \"num_hidden_layers\": 2, " \
             "\"num_attention_heads\": 8, \"vocab_size\": 100"

int main(void)
{
	x3_model_config c;
	CHECK_OK(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE "}", &c), "minimal llama");
	CHECK(c.arch == X3_ARCH_LLAMA && c.n_kv_heads == 8 && c.head_dim == 8 && !c.tied &&
	      c.rope_theta == 10000.0 && c.rms_eps == 1e-6 && !c.qkv_bias && !c.qk_norm &&
	      c.rope_type == 0 && c.max_pos == 2048, "llama defaults");

	CHECK_OK(parse("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE
	               ", \"num_key_value_heads\": 2, \"tie_word_embeddings\": true, "
	               "\"use_sliding_window\": false, \"sliding_window\": 32768}", &c), "qwen2");
	CHECK(c.arch == X3_ARCH_QWEN2 && c.qkv_bias && !c.o_bias && c.n_kv_heads == 2 && c.tied &&
	      c.sliding_window == 0, "qwen2: q/k/v bias, sliding window off");

	CHECK_OK(parse("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE
	               ", \"head_dim\": 16, \"rope_scaling\": null}", &c), "qwen3");
	CHECK(c.arch == X3_ARCH_QWEN3 && c.qk_norm && c.head_dim == 16 && !c.qkv_bias,
	      "qwen3: q/k norm, head_dim from config");

	CHECK_OK(parse("{\"model_type\": \"mistral\", " BASE ", \"sliding_window\": 4096}", &c),
	         "mistral by model_type");
	CHECK(c.arch == X3_ARCH_MISTRAL && c.sliding_window == 4096, "mistral: sliding window kept");

	CHECK_OK(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
	               ", \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 8.0, "
	               "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
	               "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}}", &c),
	         "llama3 rope_scaling");
	CHECK(c.rope_type == 2 && c.rope_factor == 8.0 && c.rope_orig_max_pos == 8192 &&
	      c.rope_theta == 500000.0, "llama3 rope values");
	CHECK_OK(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
	               ", \"attention_bias\": true, \"mlp_bias\": true}", &c), "llama biases");
	CHECK(c.qkv_bias && c.o_bias && c.mlp_bias, "attention_bias and mlp_bias");

	CHECK_OK(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
	               ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}", &c), "yarn rope_scaling");
	/* Hugging Face's default attention factor: 0.1 ln(factor) + 1 */
	CHECK(c.rope_type == 3 && c.rope_beta_fast == 32 && c.rope_beta_slow == 1 &&
	      fabs(c.rope_attn_factor - (0.1 * log(4.0) + 1)) < 1e-12, "yarn values (beta 32/1, attention factor)");
	int rc = parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
	               ", \"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 4.0}}", &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "longrope needs a 'long_factor'"),
	      "longrope without factor lists -> EFORMAT: %s", x3_errmsg());
	/* partial rotary (Hugging Face's rope init reads it for every
	 * architecture): RoPE on the first head_dim * factor dimensions */
	rc = parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"partial_rotary_factor\": 0.5}", &c);
	CHECK(rc == X3_OK && c.rot_dim == 4 && c.head_dim == 8, "partial rotary 0.5: %lld of %lld dims",
	      (long long)c.rot_dim, (long long)c.head_dim);
	rc = parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"partial_rotary_factor\": 1.5}", &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "partial_rotary_factor"), "partial rotary 1.5: %s",
	      x3_errmsg());
	CHECK_OK(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
	               ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}", &c), "linear rope");
	CHECK(c.rope_type == 1 && c.rope_factor == 2.0, "linear rope values");
	rc = parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
	           ", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}", &c);
	CHECK(rc == X3_EUNSUP && strstr(x3_errmsg(), "dynamic"), "dynamic rope: %s", x3_errmsg());
	rc = parse("{\"architectures\": [\"GPT2LMHeadModel\"], " BASE "}", &c);
	CHECK(rc == X3_EUNSUP && strstr(x3_errmsg(), "GPT2LMHeadModel"), "unknown arch: %s",
	      x3_errmsg());
	rc = parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"hidden_act\": \"gelu\"}", &c);
	CHECK(rc == X3_EUNSUP && strstr(x3_errmsg(), "gelu"), "gelu -> EUNSUP: %s", x3_errmsg());
	rc = parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
	           ", \"quantization_config\": {\"quant_method\": \"gptq\"}}", &c);
	CHECK(rc == X3_EUNSUP && strstr(x3_errmsg(), "gptq"), "gptq -> EUNSUP: %s", x3_errmsg());
	CHECK_OK(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
	               ", \"quantization_config\": {\"quant_method\": \"exl3\", \"bits\": 3.0}}", &c),
	         "exl3 quantization_config");
	CHECK(c.quantized, "exl3 flagged");

	rc = parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, ", &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "config.json"), "truncated JSON: %s",
	      x3_errmsg());
	rc = parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64}", &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "intermediate_size"), "missing key: %s",
	      x3_errmsg());
	rc = parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"num_key_value_heads\": 3}", &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "num_key_value_heads"), "8 heads / 3 kv: %s",
	      x3_errmsg());
	rc = parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64.5, "
	           "\"intermediate_size\": 1, \"num_hidden_layers\": 1, \"num_attention_heads\": 1, "
	           "\"vocab_size\": 1}", &c);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "hidden_size"), "fractional size: %s",
	      x3_errmsg());
	rc = parse("[1, 2]", &c);
	CHECK(rc == X3_EFORMAT, "not an object");
	rc = x3_config_load("/nonexistent-dir", &c);
	CHECK(rc == X3_EIO && strstr(x3_errmsg(), "/nonexistent-dir/config.json"), "missing file: %s",
	      x3_errmsg());
	TEST_DONE();
}
