/* gemv.cu: y (m, n) += x' (m, k) W~ for batch 1 <= m <= 16, decoding the
 * packed trellis inside the loop (spec §5.3 middle step; the input and
 * output Hadamards are separate launches of hadamard.cu).
 *
 * Each warp owns one 16-column tile column nb and a slice of k (blockIdx.y);
 * lane t decodes its 8 states of every tile (rows 2(t%4)+{0,1,8,9},
 * columns t/4+{0,8}, §4.2) and accumulates 2 columns x m rows in fp32. The
 * block's x' slice (m rows, 16*kb_per_split columns) is staged in shared
 * memory. At the end the 4 lanes sharing a column reduce by shuffles and
 * one adds the partial sum to y atomically (k-slices add up). */
#include "common.cuh"
#include "gpu_kern.h"
#include "gemv.cuh"

#define GW 4   /* warps per block */

template <int K, int CB>
__global__ void __launch_bounds__(GW * 32)
gemv_kernel(const uint32_t *__restrict__ trellis /* (k/16, n/16, 8K) */, int64_t tk, int64_t tn,
            const float *__restrict__ x /* (m, k) */, int m, float *y /* (m, n) */, int kbps)
{
	X3K_DYN_SMEM(float, xs);   /* (m, 16 * kbps) */
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t k = tk * 16, n = tn * 16;
	const int64_t kb0 = (int64_t)blockIdx.y * kbps;
	const int nkb = (int)(tk - kb0 < kbps ? tk - kb0 : kbps);
	const int ks = 16 * kbps, len = 16 * nkb;
	for (int i = threadIdx.x; i < m * len; i += blockDim.x) {
		const int mi = i / len, o = i % len;
		xs[mi * ks + o] = x[mi * k + kb0 * 16 + o];
	}
	__syncthreads();
	const int64_t nb = (int64_t)blockIdx.x * GW + warp;
	if (nb >= tn || nkb <= 0)
		return;
	float acc[X3K_GEMV_MAX_M][2];
#pragma unroll
	for (int mi = 0; mi < X3K_GEMV_MAX_M; mi++)
		acc[mi][0] = acc[mi][1] = 0.0f;
	const int r0 = 2 * (lane & 3);
	const uint32_t *U = trellis + (kb0 * tn + nb) * 8 * K;
/* 4 tiles per iteration: more loads in flight per warp */
#pragma unroll 4
	for (int u = 0; u < nkb; u++, U += tn * 8 * K) {
		uint32_t st[8];
		x3k_lane_states<K>(U, lane, st);
		float w[8];
#pragma unroll
		for (int j = 0; j < 8; j++)
			w[j] = __half2float(x3k_cb_from_product<CB>(x3k_cb_product<CB>(st[j])));
		const float *xr = xs + u * 16 + r0;
#pragma unroll
		for (int mi = 0; mi < X3K_GEMV_MAX_M; mi++) {
			if (mi >= m)
				break;
			const float2 a = *(const float2 *)(xr + mi * ks);
			const float2 b = *(const float2 *)(xr + mi * ks + 8);
			acc[mi][0] = fmaf(w[0], a.x, fmaf(w[1], a.y, fmaf(w[2], b.x, fmaf(w[3], b.y, acc[mi][0]))));
			acc[mi][1] = fmaf(w[4], a.x, fmaf(w[5], a.y, fmaf(w[6], b.x, fmaf(w[7], b.y, acc[mi][1]))));
		}
	}
#pragma unroll
	for (int mi = 0; mi < X3K_GEMV_MAX_M; mi++) {
		if (mi >= m)
			break;
#pragma unroll
		for (int h = 0; h < 2; h++) {
			float v = acc[mi][h];
			v += __shfl_xor_sync(0xffffffffu, v, 1);
			v += __shfl_xor_sync(0xffffffffu, v, 2);
			if ((lane & 3) == 0)
				atomicAdd(&y[mi * n + nb * 16 + (lane >> 2) + 8 * h], v);
		}
	}
}

/* D (16x8 f32) += A (16x16 f16, row) B (16x8 f16, col). Fragments (PTX ISA,
 * "Matrix Fragments for mma.m16n8k16"), g = lane/4, q = lane%4:
 * a[0] = A[g][2q..2q+1], a[1] = A[g+8][2q..], a[2] = A[g][2q+8..],
 * a[3] = A[g+8][2q+8..]; b0 = B[2q..2q+1][g], b1 = B[2q+8..2q+9][g];
 * c[0..1] = D[g][2q..2q+1], c[2..3] = D[g+8][2q..2q+1]. */
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
#ifdef X3K_SIM
	cusim::mma_m16n8k16_f16_f32(c, a, b0, b1);
#else
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
	             "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}


template <int K, int CB>
__global__ void __launch_bounds__(GW * 32)
gemv_mma_kernel(const uint32_t *__restrict__ trellis /* (k/16, n/16, 8K) */, int64_t tk,
                int64_t tn, const float *__restrict__ x /* (m, k) */, int m,
                float *y /* (m, n) */, int kbps)
{
	X3K_DYN_SMEM(__half, xh);   /* (m, 16 * kbps + XPAD) */
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t k = tk * 16, n = tn * 16;
	const int64_t kb0 = (int64_t)blockIdx.y * kbps;
	const int nkb = (int)(tk - kb0 < kbps ? tk - kb0 : kbps);
	const int ks = 16 * kbps + XPAD, len = 16 * nkb;
	for (int i = threadIdx.x; i < m * len; i += blockDim.x) {
		const int mi = i / len, o = i % len;
		xh[mi * ks + o] = __float2half_rn(x[mi * k + kb0 * 16 + o]);
	}
	__syncthreads();
	const int64_t nb = (int64_t)blockIdx.x * GW + warp;
	if (nb >= tn || nkb <= 0)
		return;
	float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
	const uint32_t *U = trellis + (kb0 * tn + nb) * 8 * K;
/* 4 tiles per iteration: more loads in flight per warp */
#pragma unroll 4
	for (int u = 0; u < nkb; u++, U += tn * 8 * K) {
		uint32_t a[4], b[4];
		gemv_b_frags<K, CB>(U, lane, b);
		gemv_a_frags(xh, ks, m, lane, u, a);
		mma16816(c[0], a, b[0], b[1]);
		mma16816(c[1], a, b[2], b[3]);
	}
#pragma unroll
	for (int h = 0; h < 2; h++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			int row, col;
			gemv_c_pos(lane, h, i, &row, &col);
			if (row < m)
				atomicAdd(&y[row * n + nb * 16 + col], c[h][i]);
		}
}

typedef void (*gkern_t)(const uint32_t *, int64_t, int64_t, const float *, int, float *, int);
#define GK(K, CB) gemv_kernel<K, CB>
#define GKM(K, CB) gemv_mma_kernel<K, CB>
static const gkern_t gkern[24] = {X3K_TABLE_KCB(GK)};
static const gkern_t gkern_mma[24] = {X3K_TABLE_KCB(GKM)};

extern "C" int x3k_gemv_ksplit(int64_t k, int64_t n)
{
	int dev = 0, sms = 1;
	if (cudaGetDevice(&dev) != cudaSuccess ||
	    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
		sms = 1;
	const int64_t tk = k / 16, tn = n / 16 > 0 ? n / 16 : 1;
	/* enough warps (one per tile column and k-slice) for ~64 per SM */
	int64_t ks = ((int64_t)sms * 64 + tn - 1) / tn;
	if (ks > tk)
		ks = tk;
	return ks < 1 ? 1 : (int)ks;
}

extern "C" int x3k_gemv(int K, int cb, const uint16_t *trellis, int64_t k, int64_t n,
                        const float *x, int m, float *y, int ksplit, int use_mma, void *stream)
{
	if (K < 1 || K > 8 || cb < 0 || cb > 2 || k % 16 || n % 16 || m < 1 ||
	    m > X3K_GEMV_MAX_M || ksplit < 1)
		return (int)cudaErrorInvalidValue;
	const int64_t tk = k / 16, tn = n / 16;
	if (tk == 0 || tn == 0)
		return 0;
	int64_t kbps = (tk + ksplit - 1) / ksplit;
	/* keep the staged x' slice within 32 KB */
	const int64_t cap = use_mma ? (32 * 1024 / (2 * (int64_t)m) - XPAD) / 16
	                            : 32 * 1024 / (4 * 16 * (int64_t)m);
	if (kbps > cap)
		kbps = cap;
	const int64_t splits = (tk + kbps - 1) / kbps;
	if (splits > 65535)
		return (int)cudaErrorInvalidValue;
	dim3 grid((unsigned)((tn + GW - 1) / GW), (unsigned)splits);
	const size_t smem = use_mma ? (size_t)m * (16 * kbps + XPAD) * 2
	                            : (size_t)m * 16 * kbps * sizeof(float);
	X3K_LAUNCH((use_mma ? gkern_mma : gkern)[(K - 1) * 3 + cb], grid, GW * 32, smem, (cudaStream_t)stream)(
		(const uint32_t *)trellis, tk, tn, x, m, y, (int)kbps);
	return (int)cudaGetLastError();
}
