/* viterbi.cu: tail-biting two-pass Viterbi encoder of 256-value tiles
 * (exl3(5) §9.6), bit-identical to the CPU reference x3_viterbi_encode_ref in
 * lib/codec/viterbi.c:
 *  - E = 2^(16-K) fp32 costs indexed by out-edge e; at trellis position p
 *    with target w, for every e and k = 0 .. 2^K-1 in increasing order:
 *    s = (k << (16-K)) | e, d = cb(s) - w (fp32, __fsub_rn),
 *    c = fmaf(d, d, prev[s >> K]) (__fmaf_rn), keep the minimum with
 *    strict < (ties keep the smallest k). Targets are used as given (fp32).
 *  - Pass 1: positions 128..255, 0..127 from all-zero costs; argmin of the
 *    final costs (lowest e wins ties); trace back to position 0:
 *    pre = s_0 >> K.
 *  - Pass 2: positions 0..255 from costs 0 at e == pre, +inf elsewhere;
 *    trace back from out-edge pre at position 255.
 *  - Targets that are not finite or exceed 1e16 in magnitude are refused
 *    (the tile is skipped and reported), as the CPU does.
 *
 * Layout. One block encodes one tile at a time (persistent grid over the
 * tiles). in(k, q) = (k << (16-2K)) | q, q = e >> K: the 2^K outputs with
 * the same q (a "group") read the same 2^K inputs. For K <= 4 a thread owns
 * whole groups q = g*T + tid (consecutive threads, consecutive q); for
 * K >= 5 a group is shared by 2^K/R threads, each owning R consecutive
 * outputs. Costs are ping-pong buffers in shared memory where 2E floats fit
 * (K >= 3 everywhere, K = 2 on sm_80/sm_90), else in global scratch, at the
 * swizzled address e ^ ((e >> 5) & 31): with it both the strided reads
 * (consecutive q) and the interleaved writes (consecutive q, stride 2^K)
 * hit 32 distinct banks. Back-pointers are K bits per choice, packed
 * floor(32/K) per 32-bit word in each thread's output order, stored
 * [position][word][thread] in global scratch (coalesced). Only positions
 * 0..127 of pass 1 are stored (the trace-back needs no more). */
#include "common.cuh"
#include "gpu_kern.h"

#include "viterbi.cuh"

template <int K, int CB>
__global__ void __launch_bounds__(VCfg<K>::T, K == 4 || VCfg<K>::T > 512 ? 1 : 512 / VCfg<K>::T)
viterbi_kernel(const float *__restrict__ x, int64_t ntiles, uint16_t *states,
               float *values, char *scratch, size_t scratch_per_block,
               int costs_in_smem, unsigned long long *bad)
{
	using C = VCfg<K>;
	X3K_DYN_SMEM(float, smem_costs);
	__shared__ float xs[256];
	__shared__ uint16_t st_s[256];
	__shared__ float red_v[C::T / 32];
	__shared__ int red_e[C::T / 32];
	__shared__ int sh_pre, sh_bad;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	char *mine_scratch = scratch + (size_t)blockIdx.x * scratch_per_block;
	uint32_t *bp = (uint32_t *)mine_scratch;
	float *costs = costs_in_smem ? smem_costs : (float *)(mine_scratch + C::BP_BYTES);

	for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
		if (tid == 0)
			sh_bad = 0;
		__syncthreads();
		for (int i = tid; i < 256; i += C::T) {
			float v = x[tile * 256 + i];
			xs[i] = v;
			if (!(fabsf(v) <= TARGET_MAX)) {
				atomicMin(bad, (unsigned long long)(tile * 256 + i));
				sh_bad = 1;
			}
		}
		for (int e = tid; e < C::E; e += C::T)
			costs[e] = 0.0f;
		__syncthreads();
		const int tile_bad = sh_bad;
		__syncthreads();    /* everyone has read sh_bad before it is reset */
		if (tile_bad)
			continue;

		/* pass 1: anchor */
		float *prev = costs, *next = costs + C::E;
		float minv = INFINITY;
		int mine = 0x7fffffff;
		for (int i = 0; i < 256; i++) {
			const int p = (i + 128) & 255;
			vstep<K, CB>(prev, next, xs[p], p < 128 ? bp + (size_t)p * C::W * C::T + tid : nullptr,
			             i == 255, minv, mine);
			__syncthreads();
			float *t = prev;
			prev = next;
			next = t;
		}
		/* block argmin, lowest e on ties */
#pragma unroll
		for (int off = 16; off; off >>= 1) {
			float ov = __shfl_down_sync(0xffffffffu, minv, off);
			int oe = __shfl_down_sync(0xffffffffu, mine, off);
			if (ov < minv || (ov == minv && oe < mine)) {
				minv = ov;
				mine = oe;
			}
		}
		if (lane == 0) {
			red_v[warp] = minv;
			red_e[warp] = mine;
		}
		__syncthreads();
		if (tid == 0) {
			float bv = red_v[0];
			int be = red_e[0];
			for (int i = 1; i < C::T / 32; i++)
				if (red_v[i] < bv || (red_v[i] == bv && red_e[i] < be)) {
					bv = red_v[i];
					be = red_e[i];
				}
			int e = be;
			for (int p = 127; p >= 0; p--) {
				uint32_t s = (uint32_t)bp_read<K>(bp, p, e) << (16 - K) | (uint32_t)e;
				e = (int)(s >> K);
			}
			sh_pre = e;
		}
		__syncthreads();

		/* pass 2: start and end at edge pre */
		const int pre_a = swz(sh_pre);
		for (int a = tid; a < C::E; a += C::T)
			costs[a] = a == pre_a ? 0.0f : INFINITY;
		__syncthreads();
		prev = costs;
		next = costs + C::E;
		for (int p = 0; p < 256; p++) {
			vstep<K, CB>(prev, next, xs[p], bp + (size_t)p * C::W * C::T + tid, false, minv, mine);
			__syncthreads();
			float *t = prev;
			prev = next;
			next = t;
		}
		if (tid == 0) {
			int e = sh_pre;
			for (int p = 255; p >= 0; p--) {
				uint32_t s = (uint32_t)bp_read<K>(bp, p, e) << (16 - K) | (uint32_t)e;
				st_s[p] = (uint16_t)s;
				e = (int)(s >> K);
			}
		}
		__syncthreads();
		for (int i = tid; i < 256; i += C::T) {
			uint32_t s = st_s[i];
			if (states)
				states[tile * 256 + i] = (uint16_t)s;
			if (values)
				values[tile * 256 + i] = x3k_cb<CB>(s);
		}
		__syncthreads();
	}
}

typedef void (*vkern_t)(const float *, int64_t, uint16_t *, float *, char *, size_t, int,
                        unsigned long long *);
#define VK(K, CB) viterbi_kernel<K, CB>
static const vkern_t vkern[24] = {X3K_TABLE_KCB(VK)};
static const int vthreads[9] = {0, VCfg<1>::T, VCfg<2>::T, VCfg<3>::T, VCfg<4>::T,
                                VCfg<5>::T, VCfg<6>::T, VCfg<7>::T, VCfg<8>::T};
static const size_t vbp[9] = {0, VCfg<1>::BP_BYTES, VCfg<2>::BP_BYTES, VCfg<3>::BP_BYTES,
                              VCfg<4>::BP_BYTES, VCfg<5>::BP_BYTES, VCfg<6>::BP_BYTES,
                              VCfg<7>::BP_BYTES, VCfg<8>::BP_BYTES};

extern "C" int x3k_viterbi_plan(int K, int cb, struct x3k_viterbi_plan *p)
{
	if (K < 1 || K > 8 || cb < 0 || cb > 2)
		return (int)cudaErrorInvalidValue;
	int dev;
	X3K_CUDA_OK(cudaGetDevice(&dev));
	int optin = 0;
	X3K_CUDA_OK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
	vkern_t f = vkern[(K - 1) * 3 + cb];
	cudaFuncAttributes fa;
	X3K_CUDA_OK(cudaFuncGetAttributes(&fa, f));
	const size_t cost_bytes = (size_t)2 * ((size_t)1 << (16 - K)) * 4;
	p->threads = vthreads[K];
	p->costs_in_smem = cost_bytes + fa.sharedSizeBytes <= (size_t)optin;
	p->smem_bytes = p->costs_in_smem ? (int)cost_bytes : 0;
	if (p->smem_bytes > 48 * 1024)
		X3K_CUDA_OK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
		                                 p->smem_bytes));
	X3K_CUDA_OK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&p->blocks_per_sm, f, p->threads,
	                                                          p->smem_bytes));
	if (p->blocks_per_sm < 1)
		return (int)cudaErrorInvalidConfiguration;
	if (!p->costs_in_smem) {
		/* costs in global memory: keep all resident blocks' costs within
		 * half of the L2, else every step goes to DRAM */
		int l2 = 0, sms = 1;
		X3K_CUDA_OK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
		X3K_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
		const size_t fit = (size_t)l2 / 2 / (cost_bytes * (size_t)sms);
		if ((size_t)p->blocks_per_sm > fit)
			p->blocks_per_sm = fit > 0 ? (int)fit : 1;
	}
	size_t s = vbp[K] + (p->costs_in_smem ? 0 : cost_bytes);
	p->scratch_per_block = (s + 255) & ~(size_t)255;
	return 0;
}

extern "C" int x3k_viterbi(int K, int cb, const float *x, int64_t ntiles, uint16_t *states,
                           float *values, void *scratch, int nblocks,
                           unsigned long long *bad, void *stream)
{
	struct x3k_viterbi_plan p;
	int rc = x3k_viterbi_plan(K, cb, &p);
	if (rc)
		return rc;
	if (ntiles <= 0)
		return 0;
	X3K_LAUNCH(vkern[(K - 1) * 3 + cb], nblocks, p.threads, p.smem_bytes, (cudaStream_t)stream)(
		x, ntiles, states, values, (char *)scratch, p.scratch_per_block, p.costs_in_smem, bad);
	return (int)cudaGetLastError();
}
