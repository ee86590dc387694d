/* t0123-mxfp4: MXFP4 weights (GPT-OSS's experts: NAME_blocks, U8 (...,
 * groups, 16), two E2M1 codes a byte, the low nibble first; NAME_scales,
 * U8 (..., groups), E8M0 exponents biased by 127) decode exactly to the
 * values worked out by hand below: x3_mxfp4_decode on a table of bytes,
 * x3_st_mxfp4 on a checkpoint of two experts, and tensor-cat --dtype
 * F32/BF16 (the decoded NAME, no _blocks or _scales left; --rows picks one
 * expert; without --dtype the bytes pass unchanged). A scale 0xFF (E8M0's
 * NaN), a value beyond F32, scales of the wrong shape, blocks not 16 bytes
 * a group, and missing scales are errors naming the tensor; tensor-cat then
 * exits 1 and writes nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "safetensors.h"
#include "test.h"

/* Each group: 16 bytes, its scale, and the 32 values by hand (E2M1 codes
 * 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; 8..15 the same negated) */
static const unsigned char gb[4][16] = {
	/* scale 127 (x1): 0x21 = lo 1, hi 2 -> 0.5, 1; ... 0x87 -> 6, -0;
	 * 0x0F -> -6, +0; eight zero bytes */
	{ 0x21, 0x43, 0x65, 0x87, 0xA9, 0xCB, 0xED, 0x0F },
	/* scale 128 (x2): 0x7F -> -6*2, 6*2; 0x19 -> -0.5*2, 0.5*2; 0x11 -> 1, 1 */
	{ 0x7F, 0x19, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11 },
	/* scale 0 (x 2^-127): 0x31 -> 0.5 * 2^-127 = 2^-128, 1.5 * 2^-127 =
	 * 3 * 2^-128 (F32 subnormals); 0x9A -> -1 * 2^-127, -0.5 * 2^-127 */
	{ 0x31, 0x9A },
	/* scale 254 (x 2^127): 0x03 -> 1.5 * 2^127 (F32's range ends at 2^128), 0 */
	{ 0x03 },
};
static const unsigned char gs[4] = { 127, 128, 0, 254 };
static float gv[4][32];

static void hand_values(void)
{
	static const float a[16] = { 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6, 0 };
	memset(gv, 0, sizeof gv);
	memcpy(gv[0], a, sizeof a);
	gv[1][0] = -12, gv[1][1] = 12, gv[1][2] = -1, gv[1][3] = 1;
	for (int i = 4; i < 32; i++)
		gv[1][i] = 1;
	gv[2][0] = ldexpf(1, -128), gv[2][1] = ldexpf(3, -128), gv[2][2] = -ldexpf(1, -127), gv[2][3] = -ldexpf(1, -128);
	gv[3][0] = ldexpf(3, 126);
}

/* the same bits (so -0 is not +0) */
static int same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof *a); }

/* DIR/model.safetensors: m.down_proj_blocks (2, 3, 2, 16) and
 * m.down_proj_scales SSHAPE (group g of the 12 is hand group g % 4,
 * scale overridden by bad_scale >= 0 in group 5), and an F32 m.norm.weight */
static int write_ck(const char *dir, int blk_w, const int64_t *sshape, int srank, int bad_scale, int bad_code)
{
	mkdir(dir, 0755);
	x3_stw *w;
	int rc = x3_stw_create(dir, 0, &w);
	if (rc)
		return rc;
	int64_t bs[4] = { 2, 3, 2, blk_w };
	x3_tensor *b = x3_tensor_new("m.down_proj_blocks", X3_U8, 4, bs, 1);
	x3_tensor *s = x3_tensor_new("m.down_proj_scales", X3_U8, srank, sshape, 1);
	x3_tensor *n = x3_tensor_new1("m.norm.weight", X3_F32, 4);
	for (int g = 0; g < 12; g++)
		for (int i = 0; i < blk_w && (size_t)(g * blk_w + i) < b->nbytes; i++)
			((unsigned char *)b->data)[g * blk_w + i] = gb[g % 4][i % 16];
	for (size_t g = 0; g < s->nbytes; g++)
		((unsigned char *)s->data)[g] = gs[g % 4];
	if (bad_scale >= 0)
		((unsigned char *)s->data)[5] = (unsigned char)bad_scale;
	if (bad_code >= 0)
		((unsigned char *)b->data)[5 * blk_w] = (unsigned char)bad_code;
	x3_stw_module(w);
	rc = x3_stw_add(w, b);
	if (!rc)
		rc = x3_stw_add(w, s);
	if (!rc)
		rc = x3_stw_add(w, n);
	x3_tensor_free(b), x3_tensor_free(s), x3_tensor_free(n);
	if (rc) {
		x3_stw_abort(w);
		return rc;
	}
	return x3_stw_commit(w);
}

/* the 12 groups' values in order: expert, row, group */
static int all_hand(const float *f, int from_group, int ngroups)
{
	for (int g = 0; g < ngroups; g++)
		if (!same(f + 32 * g, gv[(from_group + g) % 4], 32))
			return 0;
	return 1;
}

int main(void)
{
	char dir[] = "/tmp/t0123.XXXXXX", p[512], cmd[2048];
	if (!mkdtemp(dir)) {
		CHECK(0, "mkdtemp");
		TEST_DONE();
	}
	hand_values();

	/* the table of bytes */
	unsigned char blocks[64] = { 0 }, scales[4];
	float out[128];
	size_t bad = 99;
	for (int g = 0; g < 4; g++) {
		memcpy(blocks + 16 * g, gb[g], 16);
		scales[g] = gs[g];
	}
	CHECK_OK(x3_mxfp4_decode(blocks, scales, 4, out, &bad), "decode the 4 hand-worked groups");
	for (int g = 0; g < 4; g++)
		CHECK(same(out + 32 * g, gv[g], 32), "group %d (scale %d): the values worked by hand, bit for bit%s", g,
		      gs[g], g == 0 ? " (-0 included)" : g == 2 ? " (F32 subnormals)" : "");
	unsigned char s2[1] = { 0xFF };
	CHECK(x3_mxfp4_decode(blocks, s2, 1, out, &bad) == X3_EFORMAT && bad == 0 && strstr(x3_errmsg(), "0xFF"),
	      "scale 0xFF (E8M0's NaN): an error, not a number (%s)", x3_errmsg());
	unsigned char b3[16] = { 0x40 }, s3[2] = { 127, 254 };
	memcpy(blocks, gb[0], 16);
	memcpy(blocks + 16, b3, 16);
	CHECK(x3_mxfp4_decode(blocks, s3, 2, out, &bad) == X3_EFORMAT && bad == 1 && strstr(x3_errmsg(), "beyond F32"),
	      "2 x 2^127 (code 4 under scale 254): beyond F32, the group named (%s)", x3_errmsg());

	/* a checkpoint of two experts: (2, 3, 2 groups) -> (2, 3, 64) */
	int64_t ss[3] = { 2, 3, 2 };
	snprintf(p, sizeof p, "%s/ok", dir);
	CHECK_OK(write_ck(p, 16, ss, 3, -1, -1), "write m.down_proj_blocks U8 2x3x2x16 and its scales U8 2x3x2");
	x3_st *st = NULL;
	x3_tensor *t = NULL;
	CHECK_OK(x3_st_open(p, &st), "open it");
	if (st) {
		const x3_tensor *b = x3_st_find(st, "m.down_proj_blocks");
		CHECK(b && x3_st_is_mxfp4(st, b) && !x3_st_is_mxfp4(st, x3_st_find(st, "m.down_proj_scales")) &&
		      !x3_st_is_mxfp4(st, x3_st_find(st, "m.norm.weight")), "the blocks are MXFP4, the scales and the norm not");
		CHECK_OK(b ? x3_st_mxfp4(st, b, &t) : X3_EFORMAT, "x3_st_mxfp4 decodes it");
		char sh[64];
		CHECK(t && !strcmp(t->name, "m.down_proj") && t->dtype == X3_F32 &&
		      !strcmp(x3_shape_str(t, sh, sizeof sh), "2x3x64") && all_hand(t->data, 0, 12),
		      "m.down_proj F32 2x3x64: group g the hand-worked group g %% 4");
		x3_tensor_free(t);
		x3_st_close(st);
	}

	/* tensor-cat --dtype F32: the decoded tensor, nothing of the parts */
	snprintf(cmd, sizeof cmd, "bin/tensor-cat -q --dtype F32 %s 'm.down_proj_*' -o %s/cat.safetensors", p, dir);
	CHECK(system(cmd) == 0, "tensor-cat --dtype F32 of the blocks and scales");
	snprintf(cmd, sizeof cmd, "%s/cat.safetensors", dir);
	st = NULL;
	CHECK_OK(x3_st_open(cmd, &st), "open tensor-cat's output");
	if (st) {
		const x3_tensor *c = x3_st_find(st, "m.down_proj");
		CHECK(x3_st_count(st) == 1 && c && c->dtype == X3_F32 && c->rank == 3 && c->shape[2] == 64 &&
		      all_hand(c->data, 0, 12), "tensor-cat: m.down_proj alone, F32 2x3x64, the hand-worked values");
		x3_st_close(st);
	}
	snprintf(cmd, sizeof cmd, "bin/tensor-cat -q --dtype BF16 --rows 3:6 %s m.down_proj_blocks -o %s/e1.safetensors",
	         p, dir);
	CHECK(system(cmd) == 0, "tensor-cat --dtype BF16 --rows 3:6: expert 1 alone");
	snprintf(cmd, sizeof cmd, "%s/e1.safetensors", dir);
	st = NULL;
	CHECK_OK(x3_st_open(cmd, &st), "open it");
	if (st) {
		const x3_tensor *c = x3_st_find(st, "m.down_proj");
		float *f = c && c->dtype == X3_BF16 && c->rank == 2 && c->shape[0] == 3 ? x3_tensor_f32(c) : NULL;
		CHECK(f && all_hand(f, 6, 6), "expert 1 (groups 6..11), BF16 3x64: the same values, exactly (2 significant bits)");
		free(f);
		x3_st_close(st);
	}
	snprintf(cmd, sizeof cmd, "bin/tensor-cat -q %s 'm.down_proj_*' -o %s/raw.safetensors", p, dir);
	CHECK(system(cmd) == 0, "tensor-cat without --dtype");
	snprintf(cmd, sizeof cmd, "%s/raw.safetensors", dir);
	st = NULL;
	CHECK_OK(x3_st_open(cmd, &st), "open it");
	if (st) {
		const x3_tensor *b = x3_st_find(st, "m.down_proj_blocks"), *s = x3_st_find(st, "m.down_proj_scales");
		CHECK(x3_st_count(st) == 2 && b && s && b->dtype == X3_U8 && b->nbytes == 192 &&
		      !memcmp(b->data, gb[0], 16) && ((const unsigned char *)s->data)[1] == 128,
		      "... the U8 blocks and scales unchanged");
		x3_st_close(st);
	}

	/* bad checkpoints: named */
	struct { const char *name; int w; int64_t sh[3]; int rank, scale, code; const char *want, *what; } bc[] = {
		{ "shape", 16, { 2, 3, 3 }, 3, -1, -1, "must be U8 2x3x2", "scales 2x3x3 for blocks 2x3x2x16" },
		{ "width", 8, { 2, 3, 2 }, 3, -1, -1, "(..., groups, 16)", "blocks of 8 bytes a group" },
		{ "nan", 16, { 2, 3, 2 }, 3, 255, -1, "group 5", "a scale 0xFF in group 5" },
		{ "inf", 16, { 2, 3, 2 }, 3, 254, 0x07, "group 5", "6 x 2^127 in group 5" },
	};
	for (size_t i = 0; i < sizeof bc / sizeof *bc; i++) {
		snprintf(p, sizeof p, "%s/%s", dir, bc[i].name);
		write_ck(p, bc[i].w, bc[i].sh, bc[i].rank, bc[i].scale, bc[i].code);
		st = NULL, t = NULL;
		int rc = x3_st_open(p, &st);
		if (!rc)
			rc = x3_st_mxfp4(st, x3_st_find(st, "m.down_proj_blocks"), &t);
		/* the expected shape said whole: the blocks' leading dims, no more */
		CHECK(rc == X3_EFORMAT && !t && strstr(x3_errmsg(), bc[i].want) && strstr(x3_errmsg(), "m.down_proj") &&
		      !strstr(x3_errmsg(), "must be U8 2x3x2x"),
		      "%s: an error naming the tensor (%s)", bc[i].what, x3_errmsg());
		if (st)
			x3_st_close(st);
		snprintf(cmd, sizeof cmd, "bin/tensor-cat -q --dtype F32 %s 'm.*' -o %s/%s.out.safetensors 2>%s/%s.err",
		         p, dir, bc[i].name, dir, bc[i].name);
		int ex = system(cmd);
		snprintf(cmd, sizeof cmd, "%s/%s.out.safetensors", dir, bc[i].name);
		CHECK(WIFEXITED(ex) && WEXITSTATUS(ex) == 1 && access(cmd, F_OK) != 0,
		      "... tensor-cat --dtype F32: exit 1, nothing written");
	}
	snprintf(p, sizeof p, "%s/noscales", dir);
	mkdir(p, 0755);
	x3_stw *w;
	int64_t bs[4] = { 1, 1, 1, 16 };
	x3_tensor *b = x3_tensor_new("m.x_blocks", X3_U8, 4, bs, 1);
	if (!x3_stw_create(p, 0, &w)) {
		x3_stw_module(w);
		if (x3_stw_add(w, b) || x3_stw_commit(w))
			x3_stw_abort(w);
	}
	x3_tensor_free(b);
	st = NULL, t = NULL;
	int rc = x3_st_open(p, &st);
	CHECK(!rc && !x3_st_is_mxfp4(st, x3_st_find(st, "m.x_blocks")) &&
	      x3_st_mxfp4(st, x3_st_find(st, "m.x_blocks"), &t) == X3_EFORMAT && strstr(x3_errmsg(), "m.x_scales"),
	      "blocks without scales: not MXFP4 to tensor-cat; x3_st_mxfp4 names the missing scales (%s)", x3_errmsg());
	if (st)
		x3_st_close(st);
	snprintf(cmd, sizeof cmd, "mkdir %s/split && bin/tensor-cat -q --dtype F32 --split %s/split %s/ok m.down_proj_blocks",
	         dir, dir, dir);
	int sx = system(cmd);
	snprintf(p, sizeof p, "%s/split/m.down_proj.frames", dir);
	CHECK(sx == 0 && access(p, F_OK) == 0, "tensor-cat --split: the decoded tensor in m.down_proj.frames");
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd)) {}
	TEST_DONE();
}
