/* viterbi_scalar.c: the Viterbi encoder's portable kernels (plain C, any
 * CPU), in the fast path's layout A with masks (K < HIST_K) or in
 * recompute mode; also the defaults the other instruction sets start
 * from (x3_vit_kernels_scalar). viterbi.c describes the scheme. */
#include <string.h>
#include "viterbi_impl.h"

static void step_scalar(int K, const struct vit_step *s)
{
	const int NK = 1 << K;
	const float w = s->w;
	const size_t ks = s->ks;
	uint16_t *bp = s->bp;
	float *out = s->out;
	if (bp)
		bp += (size_t)s->g0 * (NK - 1) * 4;
	for (int g = s->g0; g < s->g1; g++, out += 64) {
		const float *c = s->cbo + (size_t)g * NK * 64;
		const float *p = s->pb - s->poff;
		float m[64];
		for (int l = 0; l < 64; l++) {
			float d = c[l] - w;
			m[l] = fmaf(d, d, p[(64 * g + l) >> K]);
		}
		c += 64;
		for (int k = 1; k < NK; k++, c += 64, bp = bp ? bp + 4 : bp)
			for (int u = 0; u < 4; u++) {
				unsigned mask = 0;
				const float *pv = p + k * ks;
				for (int l = 0; l < 16; l++) {
					float d = c[16 * u + l] - w;
					float v = fmaf(d, d, pv[(64 * g + 16 * u + l) >> K]);
					if (v < m[16 * u + l]) {
						m[16 * u + l] = v;
						mask |= 1u << l;
					}
				}
				if (bp)
					bp[u] = (uint16_t)mask;
			}
		memcpy(out, m, sizeof m);
	}
}

static int tb_scalar(int K, const float *cbt, const float *h, float w, int e)
{
	return tb_body(K, cbt, h, w, e);
}

static int tbr_scalar(int K, int S, const float *cbt, const float *hist, size_t hs,
                      const float *x, int p, int e)
{
	return tbr_body(K, S, cbt, hist, hs, x, p, e);
}

void x3_vit_kernels_scalar(int K, struct vit_kernels *k)
{
	*k = (struct vit_kernels){
		.lb = 0,
		.S = K >= HIST_K,
		.stage = K <= STAGE_MAX_K,
		.step = step_scalar,
		.tb = tb_scalar,
		.tbr = tbr_scalar,
	};
}
