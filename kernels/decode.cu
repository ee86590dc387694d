/* decode.cu: EXL3 trellis tensor -> W~ (exl3(5) §7), bit-exact with
 * x3_trellis_decode, and the fused original-basis reconstruction
 * W = diag(suh) Hb_k W~ Hb_n diag(svh) (exl3(5) §1.2, §6.3 "reconstruct_had").
 *
 * Decode: one warp per 16x16 tile; lane t extracts its 8 states
 * (positions 8t..8t+7, exl3(5) §4.2: rows 2(t%4)+{0,1,8,9}, columns t/4+{0,8})
 * and writes their fp16 codebook values in place.
 * Reconstruct: one 256-thread block per 128x128 block of W: 8 warps decode
 * its 64 tiles into shared memory (fp32, rows padded to 129 floats so the
 * column pass is conflict-free), transform the columns (Hb_k) and then the
 * rows (Hb_n) with warp Hadamards in fp32, scale and store. */
#include "common.cuh"
#include "gpu_kern.h"

template <int K, int CB>
__global__ void decode_kernel(const uint32_t *__restrict__ trellis /* (k/16, n/16, 8K) */,
                              int64_t tk, int64_t tn, void *out /* (k, n) */, int out_f16)
{
	const int lane = threadIdx.x & 31;
	const int64_t nwarps = (int64_t)gridDim.x * (blockDim.x >> 5);
	const int64_t n = tn * 16;
	for (int64_t tile = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	     tile < tk * tn; tile += nwarps) {
		const int64_t kb = tile / tn, nb = tile % tn;
		uint32_t st[8];
		x3k_lane_states<K>(trellis + tile * 8 * K, lane, st);
#pragma unroll
		for (int j = 0; j < 8; j++) {
			const int r = x3k_lane_row(lane, j), c = x3k_lane_col(lane, j);
			const __half h = x3k_cb_from_product<CB>(x3k_cb_product<CB>(st[j]));
			const int64_t o = (kb * 16 + r) * n + nb * 16 + c;
			if (out_f16)
				((__half *)out)[o] = h;
			else
				((float *)out)[o] = __half2float(h);
		}
	}
}

#define RP 129   /* padded row length of the shared 128x128 block */

template <int K, int CB>
__global__ void __launch_bounds__(256)
reconstruct_kernel(const uint32_t *__restrict__ trellis, const float *__restrict__ suh,
                   const float *__restrict__ svh, int64_t k, int64_t n, void *out, int out_f16)
{
	X3K_DYN_SMEM(float, blk);   /* (128, RP) */
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t tn = n / 16;
	const int64_t k0 = (int64_t)blockIdx.y * 128, n0 = (int64_t)blockIdx.x * 128;
	/* decode the 8x8 tiles */
	for (int u = 0; u < 8; u++) {
		const int ti = warp * 8 + u, kb = ti >> 3, nb = ti & 7;
		const int64_t tile = (k0 / 16 + kb) * tn + n0 / 16 + nb;
		uint32_t st[8];
		x3k_lane_states<K>(trellis + tile * 8 * K, lane, st);
#pragma unroll
		for (int j = 0; j < 8; j++) {
			const int r = x3k_lane_row(lane, j), c = x3k_lane_col(lane, j);
			blk[(kb * 16 + r) * RP + nb * 16 + c] =
				__half2float(x3k_cb_from_product<CB>(x3k_cb_product<CB>(st[j])));
		}
	}
	__syncthreads();
	/* columns: Hb_k W~ */
	for (int c = warp; c < 128; c += 8) {
		float v[4];
#pragma unroll
		for (int i = 0; i < 4; i++)
			v[i] = blk[(lane + 32 * i) * RP + c];
		x3k_warp_had128(v);
#pragma unroll
		for (int i = 0; i < 4; i++)
			blk[(lane + 32 * i) * RP + c] = v[i] * X3K_RSQRT128;
	}
	__syncthreads();
	/* rows: (.) Hb_n, then the scales */
	for (int r = warp; r < 128; r += 8) {
		float v[4];
#pragma unroll
		for (int i = 0; i < 4; i++)
			v[i] = blk[r * RP + lane + 32 * i];
		x3k_warp_had128(v);
		const float a = suh[k0 + r];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int64_t c = n0 + lane + 32 * i;
			const float y = v[i] * X3K_RSQRT128 * a * svh[c];
			const int64_t o = (k0 + r) * n + c;
			if (out_f16)
				((__half *)out)[o] = __float2half_rn(y);
			else
				((float *)out)[o] = y;
		}
	}
}

typedef void (*dkern_t)(const uint32_t *, int64_t, int64_t, void *, int);
typedef void (*rkern_t)(const uint32_t *, const float *, const float *, int64_t, int64_t,
                        void *, int);
#define DK(K, CB) decode_kernel<K, CB>
#define RK(K, CB) reconstruct_kernel<K, CB>
static const dkern_t dkern[24] = {X3K_TABLE_KCB(DK)};
static const rkern_t rkern[24] = {X3K_TABLE_KCB(RK)};

extern "C" int x3k_decode(int K, int cb, const uint16_t *trellis, int64_t k, int64_t n,
                          void *w, int out_f16, void *stream)
{
	if (K < 1 || K > 8 || cb < 0 || cb > 2 || k % 16 || n % 16)
		return (int)cudaErrorInvalidValue;
	const int64_t tiles = (k / 16) * (n / 16);
	if (tiles == 0)
		return 0;
	int64_t blocks = (tiles + 7) / 8;
	if (blocks > 65536)
		blocks = 65536;
	X3K_LAUNCH(dkern[(K - 1) * 3 + cb], (unsigned)blocks, 256, 0, (cudaStream_t)stream)(
		(const uint32_t *)trellis, k / 16, n / 16, w, out_f16);
	return (int)cudaGetLastError();
}

extern "C" int x3k_reconstruct(int K, int cb, const uint16_t *trellis, const float *suh,
                               const float *svh, int64_t k, int64_t n, void *w, int out_f16,
                               void *stream)
{
	if (K < 1 || K > 8 || cb < 0 || cb > 2 || k % 128 || n % 128 || k / 128 > 65535)
		return (int)cudaErrorInvalidValue;
	if (k == 0 || n == 0)
		return 0;
	rkern_t f = rkern[(K - 1) * 3 + cb];
	const int smem = 128 * RP * (int)sizeof(float);
	X3K_CUDA_OK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
	dim3 grid((unsigned)(n / 128), (unsigned)(k / 128));
	X3K_LAUNCH(f, grid, 256, smem, (cudaStream_t)stream)((const uint32_t *)trellis, suh, svh, k, n, w,
	                                             out_f16);
	return (int)cudaGetLastError();
}
