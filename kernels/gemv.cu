/* gemv.cu: the decode-in-the-loop GEMV for batch 1 <= m <= 16 (exl3(5) §6.2),
 * two kernels (fp32 FMAs, gemv_kernel; tensor cores with x' in fp16,
 * gemv_mma_kernel), each in two forms:
 *
 * FUSED (x3k_gemv_fused, the default forward): the whole exl3(5) §6.2 formula in
 * ONE launch. y = Hb(Hb(x (.) suh)/sqrt128 W~)/sqrt128 (.) svh (+ bias).
 *   - Input side: each block stages its k-slice of x' in shared memory.
 *     The slice is whole 128-column chunks (kbps is a multiple of 8
 *     tiles), so a warp per (row, chunk) reads x and suh from global
 *     memory, runs the Hadamard-128 in registers (x3k_warp_had128), scales
 *     by 1/sqrt(128) and stores x' (fp32, or rounded once to fp16 for the
 *     mma: the same rounding point as the unfused path, whose
 *     had_rows_kernel computes the same fp32 x' bit for bit).
 *   - Output side: partial sums are added atomically into the fp32
 *     scratch y1 (16, n), zero on entry. A block (GW = 4 warps x 16
 *     columns) covers half of a 128-column group g, so blocks 2g and 2g+1
 *     of every k-slice contribute to g: 2 * gridDim.y arrivals, counted in
 *     cnt[g] (the threadfence-reduction pattern: every thread fences its
 *     y1 atomics, the block synchronizes, thread 0 increments the counter;
 *     the block that sees 2 * gridDim.y - 1 is the last and fences again).
 *     The last block reads the group's sums from L2 (__ldcg), does the
 *     Hadamard-128, * 1/sqrt(128), * svh, + bias, writes y, zeroes its y1
 *     group and resets cnt[g]: the next launch needs no memset. Nothing
 *     depends on the order in which blocks run or finish.
 *     Block shape: GW = 4 is kept (rather than 8 warps covering a whole
 *     group, which would count gridDim.y arrivals) so that the fused and
 *     unfused kernels run the same decode loop in the same block shape and
 *     compare like for like, and 128-thread blocks keep a fine occupancy
 *     granularity; the price is that both halves of a group stage (and
 *     rotate) the same x' slice. Rounding kbps up to 8 tiles also means
 *     fewer k-slices than x3k_gemv_ksplit asks for on narrow layers
 *     (n <= ~2048 on a large GPU), i.e. fewer warps in flight there.
 *   y1 and cnt belong to one x3_gpu_linear; two launches on them must not
 *   run concurrently (not reentrant across streams). A launch that dies
 *   half way (an error) leaves them dirty: the caller re-zeroes them
 *   (lib/gpu/gpu.c does, after any failed forward). y must not overlap x
 *   (finishing blocks write y while others still stage x).
 *
 * UNFUSED (x3k_gemv): y += x' W~ only; the caller runs the Hadamards
 * (hadamard.cu) and zeroes y (4 launches in all: the old path, kept to
 * compare).
 *
 * Each warp owns one 16-column tile column nb and a slice of k (blockIdx.y);
 * fp32 kernel: lane t decodes its 8 states of every tile (rows
 * 2(t%4)+{0,1,8,9}, columns t/4+{0,8}, exl3(5) §4.2) and accumulates 2 columns x m
 * rows in fp32; the 4 lanes sharing a column reduce by shuffles and one
 * adds the partial sum to y atomically (k-slices add up). mma kernel: the
 * tile is the B operand of two m16n8k16 mmas (gemv.cuh). */
#include "common.cuh"
#include "gpu_kern.h"
#include "gemv.cuh"

#define GW 4   /* warps per block: 64 columns, half a 128-column group */
static_assert(GW * 16 * 2 == 128, "two blocks per 128-column group");

/* The fused form's extra arguments (all NULL in the unfused form). */
struct gemv_fuse {
	const float *suh, *svh, *bias;   /* (k), (n), (n) or NULL */
	float *y;                        /* (m, n) */
	int *cnt;                        /* (n / 128) arrival counters, zero */
};

__device__ __forceinline__ void gemv_put(float *p, float v) { *p = v; }
__device__ __forceinline__ void gemv_put(__half *p, float v) { *p = __float2half_rn(v); }

/* Stage the block's slice of x' (m rows, len = 16 nkb columns from column
 * c0) at xs with row stride ks. Unfused: x is x' already. Fused: x' =
 * H128(x (.) suh) / sqrt(128) per 128-chunk (len is a multiple of 128),
 * one warp per (row, chunk), coalesced. */
template <bool F, typename T>
__device__ __forceinline__ void gemv_stage(T *xs, int ks, const float *__restrict__ x, int64_t k,
                                           int m, int64_t c0, int len,
                                           const float *__restrict__ suh)
{
	if (!F) {
		for (int i = threadIdx.x; i < m * len; i += blockDim.x) {
			const int mi = i / len, o = i % len;
			gemv_put(xs + mi * ks + o, x[mi * k + c0 + o]);
		}
		return;
	}
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, cpr = len / 128;
	for (int ch = warp; ch < m * cpr; ch += GW) {   /* warp-uniform */
		const int mi = ch / cpr, o = (ch % cpr) * 128;
		const float *xr = x + mi * k + c0 + o, *sr = suh + c0 + o;
		float v[4];
#pragma unroll
		for (int i = 0; i < 4; i++)
			v[i] = xr[lane + 32 * i] * sr[lane + 32 * i];
		x3k_warp_had128(v);
#pragma unroll
		for (int i = 0; i < 4; i++)
			gemv_put(xs + mi * ks + o + lane + 32 * i, v[i] * X3K_RSQRT128);
	}
}

/* Fused form, after the block's atomics into y1: count the arrival at the
 * block's 128-column group; the last of its 2 * gridDim.y blocks finishes
 * the group (output Hadamard, svh, bias -> y) and leaves y1 and the
 * counter zero. Every thread of the block must call it. */
__device__ __forceinline__ void gemv_finish(float *y1, int64_t n, int m, const gemv_fuse &f)
{
	__shared__ int last;
	const int64_t g = blockIdx.x / 2;
	__threadfence();   /* this thread's y1 atomics before the count */
	__syncthreads();
	if (threadIdx.x == 0) {
		__threadfence();   /* cumulative: the block's sums, ordered by the barrier */
		last = atomicAdd(f.cnt + g, 1) == 2 * (int)gridDim.y - 1;
		__threadfence();   /* acquire side, for the last block */
	}
	__syncthreads();
	if (!last)
		return;
	__threadfence();   /* the count before reading the others' sums */
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	for (int mi = warp; mi < m; mi += GW) {   /* warp-uniform */
		float *yr = y1 + mi * n + g * 128;
		float v[4];
#pragma unroll
		for (int i = 0; i < 4; i++)
			v[i] = __ldcg(yr + lane + 32 * i);   /* from L2, where the atomics are */
		x3k_warp_had128(v);
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int64_t c = g * 128 + lane + 32 * i;
			float t = v[i] * X3K_RSQRT128;
			t *= f.svh[c];
			if (f.bias)
				t += f.bias[c];
			f.y[mi * n + c] = t;
			yr[lane + 32 * i] = 0.0f;
		}
	}
	if (threadIdx.x == 0)
		f.cnt[g] = 0;
}

template <int K, int CB, bool F>
__global__ void __launch_bounds__(GW * 32)
gemv_kernel(const uint32_t *__restrict__ trellis /* (k/16, n/16, 8K) */, int64_t tk, int64_t tn,
            const float *__restrict__ x /* (m, k) */, int m, float *y /* (m, n) */, int kbps,
            gemv_fuse f)
{
	X3K_DYN_SMEM(float, xs);   /* (m, 16 * kbps) */
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t k = tk * 16, n = tn * 16;
	const int64_t kb0 = (int64_t)blockIdx.y * kbps;
	const int nkb = (int)(tk - kb0 < kbps ? tk - kb0 : kbps);
	const int ks = 16 * kbps;
	gemv_stage<F>(xs, ks, x, k, m, kb0 * 16, 16 * nkb, f.suh);
	__syncthreads();
	const int64_t nb = (int64_t)blockIdx.x * GW + warp;
	if (nb < tn && nkb > 0) {
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
	if constexpr (F)
		gemv_finish(y, n, m, f);
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


template <int K, int CB, bool F>
__global__ void __launch_bounds__(GW * 32)
gemv_mma_kernel(const uint32_t *__restrict__ trellis /* (k/16, n/16, 8K) */, int64_t tk,
                int64_t tn, const float *__restrict__ x /* (m, k) */, int m,
                float *y /* (m, n) */, int kbps, gemv_fuse f)
{
	X3K_DYN_SMEM(__half, xh);   /* (m, 16 * kbps + XPAD) */
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t k = tk * 16, n = tn * 16;
	const int64_t kb0 = (int64_t)blockIdx.y * kbps;
	const int nkb = (int)(tk - kb0 < kbps ? tk - kb0 : kbps);
	const int ks = 16 * kbps + XPAD;
	gemv_stage<F>(xh, ks, x, k, m, kb0 * 16, 16 * nkb, f.suh);
	__syncthreads();
	const int64_t nb = (int64_t)blockIdx.x * GW + warp;
	if (nb < tn && nkb > 0) {
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
	if constexpr (F)
		gemv_finish(y, n, m, f);
}

typedef void (*gkern_t)(const uint32_t *, int64_t, int64_t, const float *, int, float *, int,
                        gemv_fuse);
#define GK(K, CB) gemv_kernel<K, CB, false>
#define GKM(K, CB) gemv_mma_kernel<K, CB, false>
#define GKF(K, CB) gemv_kernel<K, CB, true>
#define GKMF(K, CB) gemv_mma_kernel<K, CB, true>
static const gkern_t gkern[2][2][24] = {
	{{X3K_TABLE_KCB(GK)}, {X3K_TABLE_KCB(GKM)}},     /* [0][use_mma]: unfused */
	{{X3K_TABLE_KCB(GKF)}, {X3K_TABLE_KCB(GKMF)}},   /* [1][use_mma]: fused */
};

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

/* Tiles per k-slice for ksplit slices, within the 32 KB cap of the staged
 * x' slice; fused: whole 128-column chunks (a multiple of 8 tiles). */
static int64_t gemv_kbps(int64_t tk, int m, int ksplit, int use_mma, int fused)
{
	int64_t kbps = (tk + ksplit - 1) / ksplit;
	int64_t cap = use_mma ? (32 * 1024 / (2 * (int64_t)m) - XPAD) / 16
	                      : 32 * 1024 / (4 * 16 * (int64_t)m);
	if (fused) {
		kbps = (kbps + 7) / 8 * 8;
		cap = cap / 8 * 8;   /* >= 32 for m <= 16 */
	}
	return kbps > cap ? cap : kbps;
}

static int gemv_launch(int K, int cb, const uint16_t *trellis, int64_t k, int64_t n,
                       const float *x, int m, float *y, int ksplit, int use_mma,
                       const gemv_fuse &f, int fused, void *stream)
{
	const int64_t tk = k / 16, tn = n / 16;
	if (tk == 0 || tn == 0)
		return 0;
	const int64_t kbps = gemv_kbps(tk, m, ksplit, use_mma, fused);
	const int64_t splits = (tk + kbps - 1) / kbps;
	if (splits > 65535)
		return (int)cudaErrorInvalidValue;
	dim3 grid((unsigned)((tn + GW - 1) / GW), (unsigned)splits);
	const size_t smem = use_mma ? (size_t)m * (16 * kbps + XPAD) * 2
	                            : (size_t)m * 16 * kbps * sizeof(float);
	X3K_LAUNCH(gkern[fused != 0][use_mma != 0][(K - 1) * 3 + cb], grid, GW * 32, smem,
	           (cudaStream_t)stream)((const uint32_t *)trellis, tk, tn, x, m, y, (int)kbps, f);
	return (int)cudaGetLastError();
}

extern "C" int x3k_gemv(int K, int cb, const uint16_t *trellis, int64_t k, int64_t n,
                        const float *x, int m, float *y, int ksplit, int use_mma, void *stream)
{
	if (K < 1 || K > 8 || cb < 0 || cb > 2 || k % 16 || n % 16 || m < 1 ||
	    m > X3K_GEMV_MAX_M || ksplit < 1)
		return (int)cudaErrorInvalidValue;
	const gemv_fuse f = {NULL, NULL, NULL, NULL, NULL};
	return gemv_launch(K, cb, trellis, k, n, x, m, y, ksplit, use_mma, f, 0, stream);
}

extern "C" int x3k_gemv_fused(int K, int cb, const uint16_t *trellis, int64_t k, int64_t n,
                              const float *x, int m, const float *suh, const float *svh,
                              const float *bias, float *y, float *y1, int *cnt, int ksplit,
                              int use_mma, void *stream)
{
	if (K < 1 || K > 8 || cb < 0 || cb > 2 || k % 128 || n % 128 || m < 1 ||
	    m > X3K_GEMV_MAX_M || ksplit < 1 || !suh || !svh || !y || !y1 || !cnt)
		return (int)cudaErrorInvalidValue;
	const gemv_fuse f = {suh, svh, bias, y, cnt};
	return gemv_launch(K, cb, trellis, k, n, x, m, y1, ksplit, use_mma, f, 1, stream);
}
