/* bench/bitalloc: time and quality of the allocators on synthetic
 * measurements shaped like Llama-3 8B and 70B (K 1..8, err ~ a * 4^-K
 * with per-tensor a and noise). Prints a table and one JSON line per row;
 * exits 1 if the optimal plan is ever worse than ExLlamaV3's greedy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "x3.h"
#include "bitalloc.h"

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return (double)(rs >> 11) / 9007199254740992.0;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static x3_ba *model(int L, int64_t h, int64_t kv, int64_t inter)
{
	static const char *m[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
		"self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
	int64_t n[7] = {h * h, h * kv, h * kv, h * h, h * inter, h * inter, h * inter};
	x3_ba *ba = x3_ba_create();
	char name[128];
	rs = 0x9E3779B97F4A7C15ull;
	for (int l = 0; l < L; l++)
		for (int j = 0; j < 7; j++) {
			/* layers near the ends and v/down matter more, as measured in practice */
			double a = (0.5 + urand()) * (l == 0 || l == L - 1 ? 3 : 1) * (j == 2 || j == 6 ? 2 : 1);
			snprintf(name, sizeof name, "model.layers.%d.%s", l, m[j]);
			for (int K = 1; K <= 8; K++)
				x3_ba_add(ba, name, K, a * pow(4, -K) * (0.9 + 0.2 * urand()), n[j]);
		}
	return ba;
}

int main(void)
{
	struct { const char *name; int L; int64_t h, kv, inter; } cfg[2] = {
		{"llama3-8b-like", 32, 4096, 1024, 14336},
		{"llama3-70b-like", 80, 8192, 1024, 28672},
	};
	double targets[] = {2.5, 3.0, 3.5, 4.0, 5.0};
	int worse = 0;
	printf("%-16s %6s %9s %9s %9s %12s %12s %12s\n", "model", "bits", "dp_ms", "lagr_ms", "exl3_ms",
	       "dp_err", "lagr/dp", "exl3/dp");
	for (int c = 0; c < 2; c++) {
		x3_ba *ba = model(cfg[c].L, cfg[c].h, cfg[c].kv, cfg[c].inter);
		for (size_t t = 0; t < sizeof targets / sizeof *targets; t++) {
			double B = targets[t], t0, tdp, tlg, tex, edp, elg, eex, bdp;
			t0 = now();
			if (x3_ba_solve(ba, B, X3_BA_DP, 0)) {
				fprintf(stderr, "dp: %s\n", x3_errmsg());
				return 1;
			}
			tdp = now() - t0;
			edp = x3_ba_error(ba);
			bdp = x3_ba_bits(ba);
			t0 = now();
			x3_ba_solve(ba, B, X3_BA_LAGRANGE, 0);
			tlg = now() - t0;
			elg = x3_ba_error(ba);
			t0 = now();
			x3_ba_solve(ba, B, X3_BA_EXL3, 0);
			tex = now() - t0;
			eex = x3_ba_error(ba);
			if (edp > eex)
				worse++;
			printf("%-16s %6.2f %9.2f %9.2f %9.2f %12.6g %12.6f %12.4f\n", cfg[c].name, B, tdp * 1e3,
			       tlg * 1e3, tex * 1e3, edp, elg / edp, eex / edp);
			printf("{\"bench\": \"bitalloc\", \"model\": \"%s\", \"tensors\": %d, \"target\": %.2f, "
			       "\"bits\": %.6f, \"dp_ms\": %.3f, \"lagrangian_ms\": %.3f, \"exllamav3_ms\": %.3f, "
			       "\"lagrangian_over_dp\": %.8f, \"exllamav3_over_dp\": %.6f}\n", cfg[c].name, ba->n, B,
			       bdp, tdp * 1e3, tlg * 1e3, tex * 1e3, elg / edp, eex / edp);
		}
		x3_ba_free(ba);
	}
	return worse ? 1 : 0;
}
