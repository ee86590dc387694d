/* common.cuh: device helpers shared by the kernels: the three codebooks
 * (exl3(5) §5), state extraction from packed trellis words
 * (exl3(5) §3.3), the tile permutation (exl3(5) §4.2) and the
 * instance-table macro. */
#ifndef X3_COMMON_CUH
#define X3_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* Codebook ids as in codec.h. */
#define X3K_3INST 0
#define X3K_MCG 1
#define X3K_MUL1 2

/* 3INST constants (QTIP's "3inst", exl3(5) §5.1); MCG and MUL1 multipliers
 * (exl3(5) §2.2 marker values, exl3(5) §5.2-§5.3). */
#define X3K_3INST_A 89226354u
#define X3K_3INST_B 64248484u
#define X3K_MCG_M 0xCBAC1FEDu
#define X3K_MUL1_M 0x83DCD12Du

/* fp16 value of the product x = s*M (+B) of a state (exl3(5) §5): 3INST/MCG keep
 * sign and low 12 bits of each half (mask 0x8FFF8FFF), set the exponent
 * pattern (xor 0x3B603B60) and add the two halves with one fp16 rounding;
 * MUL1 sums the four bytes (0..1020) into the fp16 1024+S (0x6400 + S) and
 * takes fma(h, 0x1EEE, 0xC931) with one fp16 rounding. */
template <int CB>
__device__ __forceinline__ __half x3k_cb_from_product(uint32_t x)
{
	if (CB == X3K_MUL1) {
		uint32_t h = __dp4a(x, 0x01010101u, 0x6400u);
		return __hfma(__ushort_as_half((unsigned short)h),
		              __ushort_as_half((unsigned short)0x1EEE),
		              __ushort_as_half((unsigned short)0xC931));
	} else {
		x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
		return __hadd(__ushort_as_half((unsigned short)(x & 0xFFFFu)),
		              __ushort_as_half((unsigned short)(x >> 16)));
	}
}

/* x = s*M (+B) mod 2^32 for codebook CB */
template <int CB>
__device__ __forceinline__ uint32_t x3k_cb_product(uint32_t s)
{
	if (CB == X3K_3INST)
		return s * X3K_3INST_A + X3K_3INST_B;
	if (CB == X3K_MCG)
		return s * X3K_MCG_M;
	return s * X3K_MUL1_M;
}

/* Multiplier of the state (the additive constant of 3INST is in the
 * product of state 0), for incremental products. */
template <int CB>
__device__ __forceinline__ constexpr uint32_t x3k_cb_mult()
{
	return CB == X3K_3INST ? X3K_3INST_A : CB == X3K_MCG ? X3K_MCG_M : X3K_MUL1_M;
}

template <int CB>
__device__ __forceinline__ float x3k_cb(uint32_t s)
{
	return __half2float(x3k_cb_from_product<CB>(x3k_cb_product<CB>(s)));
}

/* Tile permutation (exl3(5) §4.2): trellis position i = 8t + j of lane t holds
 * row r = 2(t%4) + (j&1) + 8((j>>1)&1) and column c = t/4 + 8(j>>2). */
__device__ __forceinline__ int x3k_perm_row(int i)
{
	int t = i >> 3, j = i & 7;
	return 2 * (t & 3) + (j & 1) + 8 * ((j >> 1) & 1);
}
__device__ __forceinline__ int x3k_perm_col(int i)
{
	int t = i >> 3, j = i & 7;
	return (t >> 2) + 8 * (j >> 2);
}

/* read-only cached load in device code; a plain load in host builds of
 * this header (tests/gpu/kernel-sim.cpp) */
#ifdef __CUDA_ARCH__
#define X3K_LDG(p) __ldg(p)
#else
#define X3K_LDG(p) (*(p))
#endif

/* Row and column of value j (0..7) of lane t, i.e. trellis position
 * 8t + j (the same mapping as x3k_perm_row/col) */
__device__ __forceinline__ int x3k_lane_row(int t, int j)
{
	return 2 * (t & 3) + (j & 1) + 8 * ((j >> 1) & 1);
}
__device__ __forceinline__ int x3k_lane_col(int t, int j)
{
	return (t >> 2) + 8 * (j >> 2);
}

/* The 8 states of lane t (trellis positions 8t .. 8t+7) of one tile, from
 * its 8K little-endian uint32 words U (exl3(5) §3.2-§3.3): state i is the 16
 * stream bits ending at bit (i+1)K, circularly over 256K bits, MSB-first
 * across the words. The lane's window starts at bit b0 = (8t+1)K - 16; it
 * is loaded as NW consecutive words, left-aligned with funnel shifts, after
 * which every extraction is a compile-time shift. */
template <int K>
__device__ __forceinline__ void x3k_lane_states(const uint32_t *U, int t,
                                                uint32_t st[8])
{
	constexpr int NWORDS = 8 * K;                 /* words per tile */
	constexpr int NA = (7 * K + 15) / 32 + 1;     /* aligned words needed */
	int b0 = (8 * t + 1) * K - 16 + 256 * K;      /* >= 0 */
	int w0 = (b0 >> 5) % NWORDS;
	int sh = b0 & 31;
	uint32_t win[NA + 1];
#pragma unroll
	for (int j = 0; j <= NA; j++) {
		int w = w0 + j;
		if (w >= NWORDS)
			w -= NWORDS;
		win[j] = X3K_LDG(U + w);
	}
	uint32_t a[NA];
#pragma unroll
	for (int j = 0; j < NA; j++)
		a[j] = __funnelshift_l(win[j + 1], win[j], sh);
#pragma unroll
	for (int i = 0; i < 8; i++) {
		const int q = i * K, j = q >> 5, o = q & 31;
		uint32_t v;
		if (o + 16 <= 32)
			v = a[j] >> (16 - o);
		else
			v = (a[j] << (o - 16)) | (a[j + 1] >> (48 - o));
		st[i] = v & 0xFFFFu;
	}
}

/* 1/sqrt(128), the normalization of each Hadamard-128 (exl3(5) §6.1) */
#define X3K_RSQRT128 0.08838834764831845f

/* Unnormalized natural-order H128 of the 128 values v[i] = x[lane + 32i]
 * held by a warp: index bits 5-6 are in registers, bits 0-4 in lanes;
 * H128 is the tensor product of H2 over the 7 bits, so the stages may run
 * in any order. A lane whose stage bit is set holds the "high" element and
 * computes partner - own. */
__device__ __forceinline__ void x3k_warp_had128(float v[4])
{
	const int lane = threadIdx.x & 31;
	float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
	v[0] = a0 + a2;
	v[2] = a0 - a2;
	v[1] = a1 + a3;
	v[3] = a1 - a3;
#pragma unroll
	for (int m = 1; m < 32; m <<= 1) {
#pragma unroll
		for (int i = 0; i < 4; i++) {
			float p = __shfl_xor_sync(0xffffffffu, v[i], m);
			v[i] = (lane & m) ? p - v[i] : v[i] + p;
		}
	}
}

/* Dynamic shared memory and kernel launches, spelled so that the kernels
 * also build for cusim, the CPU emulator of tests/gpu/cusim (X3K_SIM):
 *   X3K_DYN_SMEM(float, buf);  is  extern __shared__ float buf[];
 *   X3K_LAUNCH(f, grid, block, smem, stream)(args);
 *                              is  f<<<grid, block, smem, stream>>>(args); */
#ifdef X3K_SIM
#define X3K_DYN_SMEM(type, name) type *const name = (type *)cusim::dyn_smem
#define X3K_LAUNCH(f, grid, block, smem, stream) \
	cusim::launcher(f, grid, block, smem, stream, #f " at " __FILE__ ":" X3K_STR(__LINE__))
#define X3K_STR(x) X3K_STR2(x)
#define X3K_STR2(x) #x
#else
#define X3K_DYN_SMEM(type, name) extern __shared__ type name[]
#define X3K_LAUNCH(f, grid, block, smem, stream) f<<<grid, block, smem, stream>>>
#endif

#define X3K_CUDA_OK(expr) do { cudaError_t e_ = (expr); if (e_ != cudaSuccess) return (int)e_; } while (0)

/* Instance table: TABLE_KCB(F) expands F(K, CB) for K 1..8 x CB 0..2 as
 * array initializers, indexed [(K-1)*3 + CB]. */
#define X3K_TABLE_CB(F, K) F(K, 0), F(K, 1), F(K, 2)
#define X3K_TABLE_KCB(F) \
	X3K_TABLE_CB(F, 1), X3K_TABLE_CB(F, 2), X3K_TABLE_CB(F, 3), X3K_TABLE_CB(F, 4), \
	X3K_TABLE_CB(F, 5), X3K_TABLE_CB(F, 6), X3K_TABLE_CB(F, 7), X3K_TABLE_CB(F, 8)

#endif
