/* t1600-bitalloc: the allocator against brute force, ExLlamaV3's greedy,
 * and its error cases. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "arch.h"
#include "config.h"
#include "bitalloc.h"

static uint64_t rs = 88172645463325252ull;
static double urand(void)   /* xorshift64, deterministic */
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return (double)(rs >> 11) / 9007199254740992.0;
}

static int64_t used_bits(const x3_ba *ba)
{
	int64_t s = 0;
	for (int i = 0; i < ba->n; i++)
		s += ba->t[i].numel * ba->t[i].K;
	return s;
}

/* minimum error over all assignments of K in [k0, k1] within the budget */
static double brute(const x3_ba *ba, int k0, int k1, int64_t budget)
{
	int n = ba->n, m = k1 - k0 + 1;
	long total = 1;
	for (int i = 0; i < n; i++)
		total *= m;
	double best = INFINITY;
	for (long a = 0; a < total; a++) {
		long x = a;
		int64_t c = 0;
		double v = 0;
		for (int i = 0; i < n; i++) {
			int K = k0 + (int)(x % m);
			x /= m;
			c += ba->t[i].numel * K;
			v += ba->t[i].err[K] * ba->t[i].importance;
		}
		if (c <= budget && v < best)
			best = v;
	}
	return best;
}

static const char *mods[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
	"self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

/* a synthetic model: L layers, measured K in [k0, k1], err ~ a * 4^-K */
static x3_ba *model(int L, int k0, int k1, int64_t hidden, int64_t kv, int64_t inter)
{
	x3_ba *ba = x3_ba_create();
	int64_t numel[7] = {hidden * hidden, hidden * kv, hidden * kv, hidden * hidden,
	                    hidden * inter, hidden * inter, hidden * inter};
	char name[128];
	for (int l = 0; l < L; l++)
		for (int j = 0; j < 7; j++) {
			double a = 0.3 + 3 * urand();
			snprintf(name, sizeof name, "model.layers.%d.%s", l, mods[j]);
			for (int K = k0; K <= k1; K++)
				if (x3_ba_add(ba, name, K, a * pow(4, -K) * (0.85 + 0.3 * urand()), numel[j]))
					printf("# add: %s\n", x3_errmsg());
		}
	return ba;
}

/* The modules of a Mixtral of L layers for ba (x3_ba_set_modules): its
 * attention keys take --hq +2 from them (ExLlamaV3's mixtral.py), where a
 * key alone is read by Llama's rows, which promote nothing; the dense MLP
 * keys of model() are no Mixtral module and keep Llama's rows. Free the
 * result after ba. */
static x3_module *mixtral(x3_ba *ba, int L)
{
	char js[512];
	snprintf(js, sizeof js, "{\"architectures\": [\"MixtralForCausalLM\"], \"num_hidden_layers\": %d, "
	         "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
	         "\"num_key_value_heads\": 2, \"vocab_size\": 258, \"num_local_experts\": 2, "
	         "\"num_experts_per_tok\": 1}", L);
	x3_model_config c;
	x3_module *m = NULL;
	int n = 0;
	if (x3_config_parse_as(js, strlen(js), X3_CONFIG_LAYOUT, &c) || x3_arch_modules(&c, &m, &n)) {
		printf("# mixtral modules: %s\n", x3_errmsg());
		return NULL;
	}
	x3_ba_set_modules(ba, m, n);
	return m;
}

/* a size model for x3_ba_solve_size: FIXED bytes, the trellis bytes
 * (cost * K), and with wobble a few bytes that grow with the plan the way
 * header digits do (not linear in K) */
struct szm { int64_t fixed; int wobble; int calls; };
static int size_model(void *c, const x3_ba *ba, uint64_t *bytes)
{
	struct szm *m = c;
	int64_t b = m->fixed, ks = 0;
	for (int i = 0; i < ba->n; i++) {
		b += ba->t[i].cost * ba->t[i].K;
		ks += ba->t[i].K;
	}
	if (m->wobble)
		b += 3 * ks + (ks % 5) * 7;
	m->calls++;
	*bytes = (uint64_t)b;
	return X3_OK;
}

int main(void)
{
	/* 1. exact DP equals brute force on small cases (6 tensors x 4 K),
	 * including non-convex error curves; Lagrangian is feasible and no
	 * better than the optimum. */
	int bad_dp = 0, bad_budget = 0, bad_lag = 0, cases = 0;
	for (int trial = 0; trial < 60; trial++) {
		x3_ba *ba = x3_ba_create();
		char name[32];
		for (int i = 0; i < 6; i++) {
			snprintf(name, sizeof name, "t%d", i);
			int64_t numel = 256 * (1 + (int64_t)(urand() * 40));
			double e = 1 + urand();
			for (int K = 2; K <= 5; K++) {
				/* every third trial: non-convex, even non-monotone */
				e = trial % 3 == 0 ? urand() : e * (0.15 + 0.4 * urand());
				x3_ba_add(ba, name, K, e, numel);
			}
		}
		double B = 2 + 3 * urand();
		for (int m = 0; m < 2; m++) {
			x3_ba_reset_limits(ba);
			if (x3_ba_solve(ba, B, m ? X3_BA_LAGRANGE : X3_BA_DP, 0)) {
				printf("# solve: %s\n", x3_errmsg());
				bad_dp++;
				continue;
			}
			double opt = brute(ba, 2, 5, ba->budget), got = x3_ba_error(ba);
			if (used_bits(ba) > ba->budget || x3_ba_bits(ba) > B)
				bad_budget++;
			if (m == 0 && fabs(got - opt) > 1e-12 * fabs(opt) + 1e-15) {
				printf("# trial %d B %.3f: dp %.12g brute %.12g\n", trial, B, got, opt);
				bad_dp++;
			}
			if (m == 1 && got < opt - 1e-12 * fabs(opt))
				bad_lag++;
		}
		cases++;
		x3_ba_free(ba);
	}
	CHECK(bad_dp == 0, "DP equals the brute-force optimum (%d cases, %d wrong)", cases, bad_dp);
	CHECK(bad_budget == 0, "bits constraint met by DP and Lagrangian (%d violations)", bad_budget);
	CHECK(bad_lag == 0, "Lagrangian never beats the optimum (sanity)");

	/* 2. On convex curves the Lagrangian + fill is close to the optimum */
	{
		x3_ba *ba = model(6, 1, 8, 256, 128, 688);
		x3_ba_solve(ba, 3.3, X3_BA_DP, 0);
		double e_dp = x3_ba_error(ba);
		x3_ba_solve(ba, 3.3, X3_BA_LAGRANGE, 0);
		double e_lg = x3_ba_error(ba);
		CHECK(e_lg >= e_dp - 1e-9 * e_dp && e_lg <= 1.05 * e_dp,
		      "Lagrangian within 5%% of the DP on convex curves (%.6g vs %.6g)", e_lg, e_dp);
		int64_t keep = x3_ba_dp_max_cells;
		x3_ba_dp_max_cells = 100;
		CHECK(x3_ba_solve(ba, 3.3, X3_BA_DP, 0) == X3_ENOMEM, "DP refuses above the cell limit");
		CHECK_OK(x3_ba_solve(ba, 3.3, X3_BA_AUTO, 0), "auto falls back");
		CHECK(!strcmp(ba->method, "lagrangian") && x3_ba_bits(ba) <= 3.3,
		      "auto uses the Lagrangian solver above the limit (%s, %.4f bpw)", ba->method, x3_ba_bits(ba));
		x3_ba_dp_max_cells = keep;
		x3_ba_free(ba);
	}

	/* 3. optimal <= exllamav3 greedy at the same target, several targets */
	{
		double targets[] = {2.0, 2.5, 3.0, 3.25, 4.1, 5.7, 7.9};
		int worse = 0, over = 0;
		for (size_t k = 0; k < sizeof targets / sizeof *targets; k++) {
			x3_ba *ba = model(8, 1, 8, 512, 128, 1376);
			double B = targets[k];
			CHECK_OK(x3_ba_solve(ba, B, X3_BA_EXL3, 0), "exllamav3 plan at %.2f", B);
			double ee = x3_ba_error(ba);
			if (x3_ba_bits(ba) > B)
				over++;
			x3_ba_reset_limits(ba);
			CHECK_OK(x3_ba_solve(ba, B, X3_BA_AUTO, 0), "optimal plan at %.2f", B);
			double eo = x3_ba_error(ba);
			if (x3_ba_bits(ba) > B)
				over++;
			if (!(eo <= ee))
				worse++;
			printf("# B %.2f: optimal %.6g (%.4f bpw, %s) exllamav3 %.6g\n", B, eo,
			       x3_ba_bits(ba), ba->method, ee);
			x3_ba_free(ba);
		}
		CHECK(worse == 0, "optimal error <= exllamav3 error at every target");
		CHECK(over == 0, "both plans within the target");
	}

	/* 4. ExLlamaV3 greedy on a hand-computed case: 3 layers, every
	 * linear numel 100, B = 3.2: budget 6720, base 6300; order
	 * L0.qkv (+300), L0.o (+100), then nothing fits. */
	{
		x3_ba *ba = x3_ba_create();
		char name[64];
		for (int l = 0; l < 3; l++)
			for (int j = 0; j < 7; j++) {
				snprintf(name, sizeof name, "model.layers.%d.%s", l, mods[j]);
				for (int K = 1; K <= 8; K++)
					x3_ba_add(ba, name, K, 1.0 / K, 100);
			}
		CHECK_OK(x3_ba_solve(ba, 3.2, X3_BA_EXL3, 0), "exllamav3 hand case");
		int ok = 1;
		for (int i = 0; i < ba->n; i++) {
			int want = (i < 4) ? 4 : 3;
			if (ba->t[i].K != want) {
				ok = 0;
				printf("# %s: K %d want %d\n", ba->t[i].name, ba->t[i].K, want);
			}
		}
		CHECK(ok && ba->budget == 6720, "exllamav3: layer 0 attention promoted first, then nothing fits");
		/* B = 3.5: budget 7350, spare 1050: pass 1 L0.qkv 300, L0.o 100,
		 * L2.qkv 300, L2.o 100, L1.qkv no (1100 > 1050), L1.o 100 (900),
		 * L0.gu 200? 1100 no; L0.d 100 (1000); L2.gu no, L2.d no (1100),
		 * ... pass 2: nothing (+100 anywhere > 1050? 1000+100 = 1100). */
		CHECK_OK(x3_ba_solve(ba, 3.5, X3_BA_EXL3, 0), "exllamav3 hand case 2");
		int want2[21] = {4, 4, 4, 4, 3, 3, 4,  3, 3, 3, 4, 3, 3, 3,  4, 4, 4, 4, 3, 3, 3};
		ok = 1;
		for (int i = 0; i < ba->n; i++)
			if (ba->t[i].K != want2[i]) {
				ok = 0;
				printf("# %s: K %d want %d\n", ba->t[i].name, ba->t[i].K, want2[i]);
			}
		CHECK(ok, "exllamav3: round-robin skips groups that do not fit");
		/* --hq on a Llama: nothing promoted, the same plan */
		CHECK_OK(x3_ba_solve(ba, 3.5, X3_BA_EXL3, 1), "exllamav3 --hq on Llama's rows");
		ok = 1;
		for (int i = 0; i < ba->n; i++)
			ok &= ba->t[i].K == want2[i];
		CHECK(ok, "exllamav3 --hq promotes nothing by Llama's rows (ExLlamaV3's llama.py)");
		/* --hq with a Mixtral's rows: attention floored at min(3+2, 8) = 5
		 * after the greedy */
		x3_module *mx = mixtral(ba, 3);
		CHECK_OK(x3_ba_solve(ba, 3.5, X3_BA_EXL3, 1), "exllamav3 --hq");
		ok = 1;
		for (int i = 0; i < ba->n; i++)
			if ((i % 7) < 4 && ba->t[i].K != 5)
				ok = 0;
		CHECK(mx && ok && x3_ba_bits(ba) > 3.5,
		      "exllamav3 --hq floors a Mixtral's attention at 5, exceeding the target as upstream does");
		x3_ba_free(ba);
		free(mx);
	}

	/* 5. only measured K are candidates; head excluded from the budget */
	{
		x3_ba *ba = model(2, 2, 5, 256, 256, 512);
		x3_ba_add(ba, "lm_head", 4, 0.01, 256 * 1000);
		int rc = x3_ba_solve(ba, 7.5, X3_BA_AUTO, 0);
		CHECK(rc == X3_EINVAL && strstr(x3_errmsg(), "above the maximum 5.0000") &&
		      strstr(x3_errmsg(), "reach 2.0000..5.0000 bits"),
		      "target above the measured range: an error naming the range (%s)", x3_errmsg());
		CHECK_OK(x3_ba_solve(ba, 5.0, X3_BA_AUTO, 0), "the top of the measured range");
		int ok = 1;
		for (int i = 0; i < ba->n; i++)
			ok &= ba->t[i].K == 5;
		CHECK(ok && ba->n == 14 && ba->has_head, "all at the largest measured K (5), head kept apart");
		CHECK(ba->total_numel == 2 * (256 * 256 * 4 + 256 * 512 * 3), "head numel not in the budget");
		x3_ba_free(ba);
	}

	/* 6. --set and --hq constraints */
	{
		x3_ba *ba = model(4, 1, 8, 256, 128, 512);
		x3_module *mx = mixtral(ba, 4);
		int nm;
		CHECK_OK(x3_ba_set_fixed(ba, "mlp\\.down_proj$", 6, &nm), "--set down_proj=6");
		CHECK(nm == 4, "regex matched the 4 down_proj (%d)", nm);
		CHECK_OK(x3_ba_solve(ba, 4.0, X3_BA_AUTO, 1), "solve with --set and --hq");
		int ok = 1;
		for (int i = 0; i < ba->n; i++) {
			const x3_ba_tensor *t = &ba->t[i];
			if (strstr(t->name, "down_proj"))
				ok &= t->K == 6;
			else if (strstr(t->name, "attn"))
				ok &= t->K >= 6;
		}
		CHECK(mx && ok && x3_ba_bits(ba) <= 4.0, "fixed K kept, a Mixtral's attention floored at 6, within target (%.4f)",
		      x3_ba_bits(ba));
		x3_ba_free(ba);
		free(mx);
	}

	/* 7. bad input */
	{
		x3_ba *ba = x3_ba_create();
		CHECK(x3_ba_add(ba, "model.layers.0.mlp.up_proj", 3, NAN, 4096) == X3_EFORMAT &&
		      strstr(x3_errmsg(), "NaN") && strstr(x3_errmsg(), "up_proj"), "NaN rejected: %s", x3_errmsg());
		CHECK(x3_ba_add(ba, "model.layers.0.mlp.up_proj", 9, 0.1, 4096) == X3_EFORMAT, "K=9 rejected");
		CHECK(x3_ba_add(ba, "model.embed_tokens", 3, 0.1, 4096) == X3_EFORMAT &&
		      strstr(x3_errmsg(), "embeddings"), "embedding rejected: %s", x3_errmsg());
		x3_ba_add(ba, "model.layers.0.mlp.up_proj", 3, 0.1, 4096);
		CHECK(x3_ba_add(ba, "model.layers.0.mlp.up_proj", 3, 0.2, 4096) == X3_EFORMAT,
		      "conflicting re-measurement rejected");
		CHECK(x3_ba_add(ba, "model.layers.0.mlp.up_proj", 4, 0.05, 8192) == X3_EFORMAT &&
		      strstr(x3_errmsg(), "numel"), "inconsistent numel rejected");
		x3_ba_add(ba, "model.layers.0.mlp.up_proj", 4, 0.05, 4096);
		int rc = x3_ba_solve(ba, 2.5, X3_BA_AUTO, 0);
		CHECK(rc == X3_EINVAL && strstr(x3_errmsg(), "below the minimum"),
		      "target below the minimum measured K: %s", x3_errmsg());
		int nm;
		rc = x3_ba_set_fixed(ba, "self_attn", 4, &nm);
		CHECK(rc == X3_EINVAL && strstr(x3_errmsg(), "matches no"), "--set matching nothing: %s", x3_errmsg());
		rc = x3_ba_set_fixed(ba, "up_proj", 6, &nm);
		CHECK(rc == X3_EINVAL && strstr(x3_errmsg(), "not measured"), "--set with unmeasured K: %s", x3_errmsg());
		rc = x3_ba_set_fixed(ba, "up_(proj", 3, &nm);
		CHECK(rc == X3_EINVAL && strstr(x3_errmsg(), "regex"), "bad regex: %s", x3_errmsg());
		x3_ba_free(ba);
	}

	/* 8. a size target: the budget in bytes, the exact size checked */
	{
		static const char *nm[5] = {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
		                            "model.layers.0.mlp.up_proj", "model.layers.1.mlp.down_proj",
		                            "model.layers.1.self_attn.o_proj"};
		static const int64_t numel[5] = {4096, 1024, 11008, 11008, 4096};
		static const int64_t cost[5] = {2048, 2048, 6144, 6144, 2048};   /* padded */
		x3_ba *ba = x3_ba_create();
		for (int i = 0; i < 5; i++)
			for (int K = 1; K <= 4; K++)
				x3_ba_add(ba, nm[i], K, (1.0 + i) * pow(4.0, -K) * (1 + urand()), numel[i]);
		for (int i = 0; i < 5; i++)
			ba->t[i].cost = cost[i];
		struct szm m = {100000, 0, 0};
		int rc = x3_ba_solve_size(ba, 100000 + 18432 * 2 + 5000, X3_BA_AUTO, size_model, &m);
		CHECK_OK(rc, "size target solved");
		/* brute force over 4^5 plans: least error within the bytes */
		double best = INFINITY;
		for (int c = 0; c < 1024; c++) {
			int64_t b = m.fixed;
			double e = 0;
			for (int i = 0, x = c; i < 5; i++, x /= 4) {
				b += cost[i] * (x % 4 + 1);
				e += ba->t[i].err[x % 4 + 1] * ba->t[i].importance;
			}
			if (b <= 100000 + 18432 * 2 + 5000 && e < best)
				best = e;
		}
		CHECK(fabs(x3_ba_error(ba) - best) <= 1e-12 * best, "size target: the least error in the bytes "
		      "(%.6g, brute force %.6g)", x3_ba_error(ba), best);
		CHECK(ba->size_bytes <= 100000 + 18432 * 2 + 5000 && ba->size_min == 100000 + 18432 &&
		      ba->size_max == 100000 + 18432 * 4, "size target: %llu bytes, range %llu..%llu",
		      (unsigned long long)ba->size_bytes, (unsigned long long)ba->size_min,
		      (unsigned long long)ba->size_max);
		char *js = x3_ba_plan_json(ba);
		CHECK(js && strstr(js, "\"size\"") && strstr(js, "\"budget_bytes\""), "size target: plan JSON has size, bytes");
		free(js);
		/* nonlinear extra bytes: re-solved until the exact size fits */
		struct szm w = {100000, 1, 0};
		for (uint64_t sz = 100000 + 18432 + 100; sz < 100000 + 18432 * 4; sz += 7777) {
			rc = x3_ba_solve_size(ba, sz, X3_BA_AUTO, size_model, &w);
			if (rc || ba->size_bytes > sz)
				break;
		}
		CHECK(rc == X3_OK && w.calls > 0, "size targets with header-like extra bytes: every plan fits");
		rc = x3_ba_solve_size(ba, 1000, X3_BA_AUTO, size_model, &m);
		CHECK(rc == X3_EINVAL && strstr(x3_errmsg(), "below the smallest") && strstr(x3_errmsg(), "118432"),
		      "size below the smallest plan: %s", x3_errmsg());
		rc = x3_ba_solve_size(ba, 10000000, X3_BA_AUTO, size_model, &m);
		CHECK(rc == X3_EINVAL && strstr(x3_errmsg(), "above the largest") && strstr(x3_errmsg(), "173728"),
		      "size above the largest plan: %s", x3_errmsg());
		x3_ba_free(ba);
	}
	/* a tensor name jansson cannot write: no plan (it used to be left out
	 * of "tensors", and pack-write then missed the tensor) */
	{
		x3_ba *ba = x3_ba_create();
		int rc = 0;
		for (int K = 2; K <= 4; K++)
			rc |= x3_ba_add(ba, "model.layers.0.mlp.up_proj", K, pow(4, -K), 4096) |
			      x3_ba_add(ba, "model.layers.0.mlp.\xff" "down_proj", K, pow(4, -K), 4096);
		CHECK(!rc && !x3_ba_solve(ba, 3, X3_BA_DP, 0), "a plan over a tensor name that is not UTF-8: solved");
		char *js = x3_ba_plan_json(ba);
		CHECK(!js && strstr(x3_errmsg(), "plan: cannot write 'model.layers.0.mlp.\xef\xbf\xbd" "down_proj': "
		                    "the key is not UTF-8"), "... no plan JSON, an error naming the tensor (%s)", x3_errmsg());
		free(js);
		x3_ba_free(ba);
	}
	TEST_DONE();
}
