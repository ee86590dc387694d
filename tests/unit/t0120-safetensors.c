/* safetensors: writer (single file, sharded by module, index) and reader
 * round trip, unaligned offsets, and the real stories260K model. */
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include "safetensors.h"
#include "test.h"

static int count_files(const char *dir, const char *suffix)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		size_t l = strlen(e->d_name), sl = strlen(suffix);
		if (l >= sl && !strcmp(e->d_name + l - sl, suffix))
			n++;
	}
	if (d)
		closedir(d);
	return n;
}

/* x3_stw_payload of the test's tensors: ctx is their array */
static int payload_of(void *ctx, int i, const void **p, void **owned)
{
	x3_tensor **ts = ctx;
	*p = ts[i]->data;
	*owned = NULL;
	return X3_OK;
}

/* 1 when files a and b hold the same bytes */
static int same_bytes(const char *a, const char *b)
{
	FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
	int same = fa && fb;
	while (same) {
		int ca = getc(fa), cb = getc(fb);
		same = ca == cb;
		if (ca == EOF)
			break;
	}
	if (fa) fclose(fa);
	if (fb) fclose(fb);
	return same;
}

int main(void)
{
	char dir[] = "/tmp/x3stXXXXXX";
	CHECK(mkdtemp(dir) != NULL, "temp dir %s", dir);
	/* 6 modules of 3 tensors; odd sizes so offsets are unaligned */
	x3_stw *w;
	CHECK_OK(x3_stw_create(dir, 3000, &w), "create sharded writer");
	x3_tensor *ts[18];
	for (int m = 0, k = 0; m < 6; m++) {
		x3_stw_module(w);
		for (int j = 0; j < 3; j++, k++) {
			char nm[64];
			snprintf(nm, sizeof nm, "model.layers.%d.t%d", m, j);
			ts[k] = x3_tensor_new1(nm, j == 1 ? X3_U8 : X3_F16, 101 + 7 * k);
			for (size_t i = 0; i < ts[k]->nbytes; i++)
				((unsigned char *)ts[k]->data)[i] = (unsigned char)(i * 31 + k);
			CHECK_OK(x3_stw_add(w, ts[k]), "add %s", nm);
		}
	}
	CHECK(x3_stw_add(w, ts[0]) == X3_EINVAL, "duplicate name refused");
	CHECK_OK(x3_stw_commit(w), "commit");
	int nsh = count_files(dir, ".safetensors");
	CHECK(nsh > 1, "sharded into %d files", nsh);
	CHECK(count_files(dir, ".json") == 1, "index written");
	CHECK(count_files(dir, "XXXXXX") == 0 && count_files(dir, "") == nsh + 1 + 2, "no temporary files left");
	x3_st *s;
	CHECK_OK(x3_st_open(dir, &s), "open the sharded directory");
	int ok = s && x3_st_count(s) == 18;
	for (int k = 0; ok && k < 18; k++) {
		const x3_tensor *t = x3_st_find(s, ts[k]->name);
		ok = t && t->dtype == ts[k]->dtype && t->nbytes == ts[k]->nbytes &&
		     !memcmp(t->data, ts[k]->data, t->nbytes);
	}
	CHECK(ok, "all 18 tensors read back identical");
	/* a module is never split: all tensors of a layer share a file */
	int split = 0;
	for (int i = 0; s && i < 18; i += 3)
		if (strcmp(x3_st_file(s, i), x3_st_file(s, i + 2)))
			split++;
	CHECK(split == 0, "no module split across shards");
	CHECK(s && x3_st_find(s, "nope") == NULL, "unknown name not found");
	x3_st_close(s);

	/* the sizer: the same headers without data give the bytes written */
	{
		uint64_t files = 0, sized = 0;
		DIR *d = opendir(dir);
		struct dirent *e;
		while (d && (e = readdir(d))) {
			char p[512];
			struct stat st;
			snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
			if (stat(p, &st) == 0 && S_ISREG(st.st_mode))
				files += (uint64_t)st.st_size;
		}
		if (d)
			closedir(d);
		int nsz = 0, arc = 0;
		CHECK_OK(x3_stw_create_sizer(3000, 0, &w), "create a sizer");
		for (int m = 0, k = 0; m < 6; m++) {
			x3_stw_module(w);
			for (int j = 0; j < 3; j++, k++) {
				x3_tensor h = *ts[k];
				h.data = NULL;   /* headers only */
				arc |= x3_stw_add(w, &h);
			}
		}
		CHECK(arc == X3_OK, "sizer: the 18 headers added without data");
		CHECK_OK(x3_stw_size(w, &sized, &nsz), "sizer: size");
		CHECK(sized == files && nsz == nsh, "sizer: %llu bytes in %d shards, the writer wrote %llu in %d",
		      (unsigned long long)sized, nsz, (unsigned long long)files, nsh);
	}

	/* direct writing (x3_stw_declare, x3_stw_commit_direct): the same
	 * files, byte for byte, as the spooled writer's (so the sizer's too) */
	{
		char dd[] = "/tmp/x3stdXXXXXX";
		CHECK(mkdtemp(dd) != NULL, "temp dir %s", dd);
		int arc = 0;
		CHECK_OK(x3_stw_create(dd, 3000, &w), "direct: create");
		for (int m = 0, k = 0; m < 6; m++) {
			x3_stw_module(w);
			for (int j = 0; j < 3; j++, k++) {
				x3_tensor h = *ts[k];
				h.data = NULL;   /* headers only; payloads at commit */
				arc |= x3_stw_declare(w, &h);
			}
		}
		CHECK(arc == X3_OK, "direct: the 18 headers declared");
		CHECK(x3_stw_add(w, ts[0]) == X3_EINVAL, "direct: x3_stw_add after x3_stw_declare refused");
		CHECK_OK(x3_stw_commit_direct(w, payload_of, ts), "direct: commit");
		int same = count_files(dd, "") == count_files(dir, "");
		DIR *d = opendir(dir);
		struct dirent *e;
		while (d && (e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			char a[512], b[512];
			snprintf(a, sizeof a, "%s/%s", dir, e->d_name);
			snprintf(b, sizeof b, "%s/%s", dd, e->d_name);
			same &= same_bytes(a, b);
		}
		if (d)
			closedir(d);
		CHECK(same, "direct: every file identical to the spooled writer's");
		char cmd[600];
		snprintf(cmd, sizeof cmd, "rm -rf %s", dd);
		(void)!system(cmd);
	}

	/* single file */
	char fp[256];
	snprintf(fp, sizeof fp, "%s/one.safetensors", dir);
	CHECK_OK(x3_stw_create(fp, 0, &w), "create single-file writer");
	x3_stw_meta(w, "format", "pt");
	for (int k = 0; k < 4; k++)
		x3_stw_add(w, ts[k]);
	CHECK_OK(x3_stw_commit(w), "commit single file");
	CHECK_OK(x3_st_open(fp, &s), "reopen");
	CHECK(s && x3_st_count(s) == 4 && x3_st_meta(s, "format") && !strcmp(x3_st_meta(s, "format"), "pt"),
	      "metadata and count");
	x3_st_close(s);

	/* abort leaves nothing */
	int before = count_files(dir, "");
	CHECK_OK(x3_stw_create(dir, 0, &w), "writer to abort");
	x3_stw_add(w, ts[0]);
	x3_stw_abort(w);
	CHECK(count_files(dir, "") == before, "abort leaves no files");

	/* missing shard */
	char victim[512];
	snprintf(victim, sizeof victim, "%s/model-00002-of-%05d.safetensors", dir, nsh);
	unlink(victim);
	CHECK(x3_st_open(dir, &s) == X3_EIO && strstr(x3_errmsg(), "missing shard"), "missing shard: %s", x3_errmsg());

	/* the real model */
	char mp[512];
	snprintf(mp, sizeof mp, "%s/models/stories260K/model.safetensors", test_shared());
	if (access(mp, R_OK) != 0) {
		SKIP("stories260K: %s not present", mp);
	} else {
		CHECK_OK(x3_st_open(mp, &s), "open stories260K");
		CHECK(x3_st_count(s) == 47, "47 tensors");
		const x3_tensor *e = x3_st_find(s, "model.embed_tokens.weight");
		CHECK(e && e->dtype == X3_F32 && e->rank == 2 && e->shape[0] == 512 && e->shape[1] == 64, "embedding 512x64 F32");
		const x3_tensor *g = x3_st_find(s, "model.layers.4.mlp.gate_proj.weight");
		CHECK(g && g->shape[0] == 172 && g->shape[1] == 64, "gate_proj 172x64");
		const x3_tensor *k = x3_st_find(s, "model.layers.0.self_attn.k_proj.weight");
		CHECK(k && k->shape[0] == 32 && k->shape[1] == 64, "k_proj 32x64 (4 KV heads of 8)");
		const x3_tensor *nrm = x3_st_find(s, "model.norm.weight");
		float mx = 0, mn = 1e9;
		for (int i = 0; nrm && i < 64; i++) {
			float v = ((const float *)nrm->data)[i];
			if (v > mx) mx = v;
			if (v < mn) mn = v;
		}
		CHECK(nrm && mn > 0 && mx < 20, "final norm weights positive and modest (%g..%g)", mn, mx);
		float *ef = e ? x3_tensor_f32(e) : NULL;
		double ss = 0;
		for (int i = 0; ef && i < 512 * 64; i++)
			ss += ef[i] * ef[i];
		CHECK(ef && ss > 1 && ss < 1e6, "embedding values finite and nonzero (sum sq %g)", ss);
		free(ef);
		x3_st_close(s);
	}
	for (int k = 0; k < 18; k++)
		x3_tensor_free(ts[k]);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	(void)!system(cmd);
	TEST_DONE();
}
