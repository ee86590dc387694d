/* viterbi.cuh: the per-step work of the Viterbi kernel (viterbi.cu):
 * configuration per K, cost addressing, one trellis step, back-pointer
 * reads. Kept apart so a host harness can run the same code thread by
 * thread (tests/gpu/kernel-sim.cpp). */
#ifndef X3_VITERBI_CUH
#define X3_VITERBI_CUH

#define TARGET_MAX 1e16f

template <int K>
struct VCfg {
	static constexpr int E = 1 << (16 - K);
	static constexpr int NK = 1 << K;
	static constexpr int T = K == 1 ? 1024 : K == 2 ? 512 : K == 8 ? 64 : K == 7 ? 128 : 256;
	static constexpr int R = E / T;                  /* outputs per thread */
	static constexpr int CPW = 32 / K;               /* choices per word */
	static constexpr int W = (R + CPW - 1) / CPW;    /* words per thread */
	static constexpr bool GROUPED = K <= 4;
	static constexpr int G = GROUPED ? R / NK : 1;   /* groups per thread */
	static constexpr int J = GROUPED ? NK : R;       /* outputs per group */
	static constexpr int SH = 16 - 2 * K;
	static constexpr size_t BP_BYTES = (size_t)256 * W * T * 4;
	static constexpr size_t COST_BYTES = (size_t)2 * E * 4;
};

__device__ __forceinline__ int swz(int e) { return e ^ ((e >> 5) & 31); }

/* One trellis step: prev -> next. bpw: this thread's first back-pointer
 * word of the position (stride T), NULL to skip storing. With track, the
 * thread's lowest (cost, e) of the new costs goes to minv/mine. */
template <int K, int CB>
__device__ __forceinline__ void vstep(const float *prev, float *next, float w,
                                      uint32_t *bpw, bool track, float &minv,
                                      int &mine)
{
	using C = VCfg<K>;
	const int tid = threadIdx.x;
	constexpr uint32_t M = x3k_cb_mult<CB>();
	constexpr uint32_t KSTEP = M << (16 - K);   /* product step of k */
	uint32_t cur = 0;
	int cnt = 0, wi = 0;
#pragma unroll(C::GROUPED && C::G <= 4 ? C::G : 1)
	for (int g = 0; g < C::G; g++) {
		const int q = C::GROUPED ? g * C::T + tid : (tid * C::R) >> K;
		const int e0 = C::GROUPED ? q * C::NK : tid * C::R;
		const uint32_t px0 = x3k_cb_product<CB>((uint32_t)e0);
		float best[C::J];
		int bk[C::J];
		{       /* k = 0 */
			const float pk = prev[swz(q)];
#pragma unroll
			for (int j = 0; j < C::J; j++) {
				float v = __half2float(x3k_cb_from_product<CB>(px0 + (uint32_t)j * M));
				float d = __fsub_rn(v, w);
				best[j] = __fmaf_rn(d, d, pk);
				bk[j] = 0;
			}
		}
		uint32_t pxk = px0;
#pragma unroll(C::NK <= 16 ? C::NK - 1 : 4)
		for (int k = 1; k < C::NK; k++) {
			pxk += KSTEP;
			const float pk = prev[swz((k << C::SH) | q)];
#pragma unroll
			for (int j = 0; j < C::J; j++) {
				float v = __half2float(x3k_cb_from_product<CB>(pxk + (uint32_t)j * M));
				float d = __fsub_rn(v, w);
				float c = __fmaf_rn(d, d, pk);
				if (c < best[j]) {
					best[j] = c;
					bk[j] = k;
				}
			}
		}
#pragma unroll
		for (int j = 0; j < C::J; j++) {
			next[swz(e0 + j)] = best[j];
			if (track && best[j] < minv) {
				minv = best[j];
				mine = e0 + j;
			}
			if (bpw) {
				cur |= (uint32_t)bk[j] << (cnt * K);
				if (++cnt == C::CPW) {
					bpw[wi * C::T] = cur;
					wi++;
					cur = 0;
					cnt = 0;
				}
			}
		}
	}
	if (bpw && cnt)
		bpw[wi * C::T] = cur;
}

/* k of the winner at (position p, out-edge e) */
template <int K>
__device__ __forceinline__ int bp_read(const uint32_t *bp, int p, int e)
{
	using C = VCfg<K>;
	int t, r;
	if (C::GROUPED) {
		int q = e >> K;
		t = q % C::T;
		r = (q / C::T) * C::NK + (e & (C::NK - 1));
	} else {
		t = e / C::R;
		r = e % C::R;
	}
	uint32_t word = bp[((size_t)p * C::W + r / C::CPW) * C::T + t];
	return (int)((word >> ((r % C::CPW) * K)) & (uint32_t)(C::NK - 1));
}

#endif
