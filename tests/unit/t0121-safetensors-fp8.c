/* t0121-safetensors-fp8: block-scaled FP8 weights (DeepSeek V3's
 * checkpoints: F8_E4M3 with NAME_scale_inv, F32 per 128x128 block) are
 * dequantized on read: a hand-made 130x200 tensor of known E4M3 bytes
 * (1, 2, -1, 448, 2^-9, 0) and scales (0.5, 3, 0.25, -2 over its 2x2
 * blocks) reads back as value x scale exactly (x3_tensor_f32, a BF16 copy,
 * and tensor-cat's frames/safetensors); the same weight with F8_E8M0
 * scales (DeepSeek's "ue8m0" format: bytes 0x7E 0x80 0x7D 0x85, worked by
 * hand to 2^-1, 2^1, 2^-2, 2^6) likewise, and E8M0's ends (0x00 2^-127,
 * 0xFE 2^127, 0xFF NaN) decode as such; a weight without its scales, or
 * with scales of the wrong shape or dtype, fails at open naming them; the
 * config's quantization_config fp8 is accepted with 128x128 blocks. */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "model.h"
#include "safetensors.h"
#include "test.h"

enum { R = 130, C = 200 };
static const unsigned char bytes[6] = { 0x38, 0x40, 0xB8, 0x7E, 0x01, 0x00 };
static const double vals[6] = { 1.0, 2.0, -1.0, 448.0, 1.0 / 512, 0.0 };
static const float f32_scales[4] = { 0.5f, 3.0f, 0.25f, -2.0f };
static const unsigned char e8m0_bytes[4] = { 0x7E, 0x80, 0x7D, 0x85 };
static const float e8m0_scales[4] = { 0.5f, 2.0f, 0.25f, 64.0f };
static const float *scales = f32_scales;

static double expect(int i, int j)
{
	return vals[(i * 7 + j) % 6] * scales[(i / 128) * 2 + j / 128];
}

/* DIR/model.safetensors with the F8 weight and (when sr > 0) its scales
 * (sr, sc) of dtype sdt */
static int write_ck(const char *dir, int sr, int sc, x3_dtype sdt)
{
	mkdir(dir, 0755);
	x3_stw *w;
	int rc = x3_stw_create(dir, 0, &w);
	if (rc)
		return rc;
	x3_tensor *t = x3_tensor_new2("m.w.weight", X3_F8_E4M3, R, C);
	for (int i = 0; i < R; i++)
		for (int j = 0; j < C; j++)
			((unsigned char *)t->data)[i * C + j] = bytes[(i * 7 + j) % 6];
	x3_stw_module(w);
	rc = x3_stw_add(w, t);
	x3_tensor_free(t);
	if (!rc && sr > 0) {
		x3_tensor *s = x3_tensor_new2("m.w.weight_scale_inv", sdt, sr, sc);
		float f[16];
		for (int k = 0; k < sr * sc && k < 16; k++)
			f[k] = scales[k % 4];
		if (sdt == X3_F8_E8M0)   /* the bytes themselves: no conversion to E8M0 */
			for (int k = 0; k < sr * sc && k < 16; k++)
				((unsigned char *)s->data)[k] = e8m0_bytes[k % 4];
		else
			x3_convert(s->data, sdt, f, X3_F32, (size_t)(sr * sc));
		rc = x3_stw_add(w, s);
		x3_tensor_free(s);
	}
	if (rc) {
		x3_stw_abort(w);
		return rc;
	}
	return x3_stw_commit(w);
}

static int all_exact(const float *f, int bf16)
{
	for (int i = 0; i < R; i++)
		for (int j = 0; j < C; j++) {
			float e = (float)expect(i, j);
			if (bf16)
				e = x3_bf16_to_f32(x3_f32_to_bf16(e));
			if (f[i * C + j] != e)
				return 0;
		}
	return 1;
}

int main(void)
{
	char dir[] = "/tmp/x3fp8XXXXXX", p[256], cmd[768];
	if (!mkdtemp(dir)) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	snprintf(p, sizeof p, "%s/ok", dir);
	CHECK_OK(write_ck(p, 2, 2, X3_F32), "write a 130x200 F8_E4M3 weight with 2x2 F32 block scales");
	x3_st *st = NULL;
	CHECK_OK(x3_st_open(p, &st), "open it");
	const x3_tensor *t = st ? x3_st_find(st, "m.w.weight") : NULL;
	CHECK(t && t->dtype == X3_F8_E4M3 && t->scale_inv && !strcmp(t->scale_inv->name, "m.w.weight_scale_inv"),
	      "the weight stays F8_E4M3, linked to its scales");
	float *f = t ? x3_tensor_f32(t) : NULL;
	CHECK(f && all_exact(f, 0), "x3_tensor_f32: every element = E4M3 value x its block's scale, exactly");
	CHECK(f && f[0] == 0.5f && f[3 * C + 0] == 224.0f && f[128 * C + 1] == 112.0f && f[129 * C + 199] == -1.0f / 256,
	      "spot values: 1 x 0.5, 448 x 0.5, 448 x 0.25, 2^-9 x -2");
	free(f);
	x3_tensor *b = t ? x3_tensor_copy(t, X3_BF16) : NULL;
	float *bf = b ? x3_tensor_f32(b) : NULL;
	CHECK(b && !b->scale_inv && bf && all_exact(bf, 1), "a BF16 copy is the dequantized weight rounded to BF16");
	free(bf);
	x3_tensor_free(b);
	if (st)
		x3_st_close(st);

	/* tensor-cat (how the conversion reads weights): dequantized F32 */
	snprintf(cmd, sizeof cmd, "bin/tensor-cat -q %s m.w.weight -o %s/cat.safetensors", p, dir);
	CHECK(system(cmd) == 0, "tensor-cat writes the weight");
	snprintf(cmd, sizeof cmd, "%s/cat.safetensors", dir);
	st = NULL;
	CHECK_OK(x3_st_open(cmd, &st), "open tensor-cat's output");
	t = st ? x3_st_find(st, "m.w.weight") : NULL;
	f = t && t->dtype == X3_F32 ? x3_tensor_f32(t) : NULL;
	CHECK(f && all_exact(f, 0), "tensor-cat: an F32 weight = the dequantized values, exactly");
	free(f);
	if (st)
		x3_st_close(st);

	/* the ue8m0 scale format: F8_E8M0 scales */
	static const unsigned char ends[3] = { 0x00, 0xFE, 0xFF };
	float ev[3];
	CHECK_OK(x3_convert(ev, X3_F32, ends, X3_F8_E8M0, 3), "F8_E8M0 -> F32");
	CHECK(ev[0] == ldexpf(1, -127) && ev[0] > 0 && ev[1] == ldexpf(1, 127) && isnan(ev[2]),
	      "F8_E8M0 0x00, 0xFE, 0xFF: 2^-127, 2^127, NaN");
	scales = e8m0_scales;
	snprintf(p, sizeof p, "%s/e8m0", dir);
	CHECK_OK(write_ck(p, 2, 2, X3_F8_E8M0), "write the weight with 2x2 F8_E8M0 block scales 0x7E 0x80 0x7D 0x85");
	CHECK_OK(x3_st_open(p, &st), "open it");
	t = st ? x3_st_find(st, "m.w.weight") : NULL;
	f = t && t->scale_inv ? x3_tensor_f32(t) : NULL;
	CHECK(f && all_exact(f, 0) && f[0] == 0.5f && f[128 * C + 1] == 448.0f / 4 && f[129 * C + 199] == 64.0f / 512 &&
	      f[3 * C + 130] == 2.0f * 2,
	      "x3_tensor_f32: every element = E4M3 value x 2^(byte - 127) of its block, exactly");
	free(f);
	if (st)
		x3_st_close(st);
	scales = f32_scales;

	/* bad checkpoints: named at open */
	snprintf(p, sizeof p, "%s/noscale", dir);
	write_ck(p, 0, 0, X3_F32);
	int rc = x3_st_open(p, &st);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "'m.w.weight'") && strstr(x3_errmsg(), "m.w.weight_scale_inv"),
	      "F8 without its scales: error naming the tensor and the missing scales (%s)", x3_errmsg());
	snprintf(p, sizeof p, "%s/shape", dir);
	write_ck(p, 1, 2, X3_F32);
	rc = x3_st_open(p, &st);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "m.w.weight_scale_inv") && strstr(x3_errmsg(), "2x2"),
	      "scales of the wrong shape: named, with the shape expected (%s)", x3_errmsg());
	snprintf(p, sizeof p, "%s/dtype", dir);
	write_ck(p, 2, 2, X3_BF16);
	rc = x3_st_open(p, &st);
	CHECK(rc == X3_EFORMAT && strstr(x3_errmsg(), "BF16"), "scales not F32 or F8_E8M0: named (%s)", x3_errmsg());

	/* the config of an FP8 checkpoint */
	x3_model_config c;
	const char *base = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 32, "
	                   "\"intermediate_size\": 48, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
	                   "\"vocab_size\": 64, \"quantization_config\": {\"quant_method\": \"fp8\", "
	                   "\"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": [%d, 128]}}";
	char js[512];
	snprintf(js, sizeof js, base, 128);
	CHECK_OK(x3_config_parse(js, strlen(js), &c), "quantization_config fp8, 128x128 blocks: read");
	snprintf(js, sizeof js, base, 64);
	rc = x3_config_parse(js, strlen(js), &c);
	CHECK(rc == X3_EUNSUP && strstr(x3_errmsg(), "weight_block_size"), "64x128 blocks: refused (%s)", x3_errmsg());
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd)) {}
	TEST_DONE();
}
