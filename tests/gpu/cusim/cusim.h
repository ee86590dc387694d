/* cusim.h: the device side of cusim, a small CUDA-on-CPU emulator. It is
 * force-included into the kernels (kernels/NAME.cu) compiled as host C++:
 *   g++ -std=c++17 -x c++ -DX3K_SIM -include tests/gpu/cusim/cusim.h ...
 * so that the real kernel bodies run on the CPU, one emulated thread per
 * fiber (tests/gpu/cusim/cusim.cpp has the scheduler, the CUDA runtime,
 * cuBLAS and cuSOLVER on the CPU; tests/gpu/README.md describes the model).
 *
 * Types and host declarations come from the real CUDA headers
 * (cuda_runtime.h, cuda_fp16.h with its host implementations of the half
 * operations); this file adds what exists only in device code: threadIdx
 * and friends (per emulated thread), __syncthreads, warp collectives
 * (__shfl_*_sync, __syncwarp, __ballot_sync, __any_sync, __all_sync),
 * atomics, __shared__ (static storage shared by the block: blocks run one
 * at a time), the dynamic shared memory and launch macros of common.cuh
 * (X3K_DYN_SMEM, X3K_LAUNCH), and the intrinsics the kernels use, each
 * with the device's rounding (__fmaf_rn, __fsub_rn, __hfma with one
 * rounding, __dp4a, __funnelshift_l, __ldg, ...). */
#ifndef X3_CUSIM_H
#define X3_CUSIM_H

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>   /* before the fp16 macros below (cuBLAS includes it) */
#include <cmath>
#include <math.h>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#ifndef X3K_SIM
#define X3K_SIM 1
#endif

/* ---- fp16 ---------------------------------------------------------------- *
 * The host implementations of cuda_fp16.h convert in software (tens of ns,
 * too slow for the Viterbi's 2^25 fp16 operations per tile); these give the
 * same IEEE results, with F16C where the build enables it (-mf16c). Sums,
 * differences and products of two fp16 values rounded once to fp32 and
 * then to fp16 are correctly rounded (fp32 has 24 >= 2*11+2 bits). */
namespace cusim {
inline float h2f(__half h)
{
	const unsigned short b = __half_as_ushort(h);
#if defined(__F16C__)
	return _cvtsh_ss(b);
#else
	const uint32_t s = (uint32_t)(b & 0x8000u) << 16, e = (b >> 10) & 31u, m = b & 0x3ffu;
	float f;
	if (e == 31) {
		const uint32_t u = s | 0x7f800000u | (m << 13);
		memcpy(&f, &u, 4);
	} else if (e == 0) {
		f = std::ldexp((float)m, -24);
		if (s)
			f = -f;
	} else {
		const uint32_t u = s | ((e + 112) << 23) | (m << 13);
		memcpy(&f, &u, 4);
	}
	return f;
#endif
}
/* s + e (e: a rounding error, |e| <= ulp(s) / 2) rounded once to fp16 */
inline __half round_half(double s, double e)
{
	if (s == 0 || !std::isfinite(s))
		return __ushort_as_half((unsigned short)(s != s ? 0x7e00u : std::signbit(s) ?
		                        (s == 0 ? 0x8000u : 0xfc00u) : (s == 0 ? 0u : 0x7c00u)));
	uint64_t bits;
	memcpy(&bits, &s, 8);
	int ex = (int)((bits >> 52) & 0x7ff) - 1023;   /* floor(log2 |s|) for normal doubles */
	if (ex < -14)
		ex = -14;                                  /* fp16 subnormals: quantum 2^-24 */
	const uint64_t qb = (uint64_t)(ex - 10 + 1023) << 52;
	double q;
	memcpy(&q, &qb, 8);
	const double t = s / q, fl = std::floor(t);
	double r;
	if (t - fl == 0.5 && e != 0)                   /* s is halfway, the exact value is not */
		r = e > 0 ? fl + 1 : fl;
	else
		r = std::nearbyint(t);
	r *= q;
	if (std::fabs(r) > 65504.0)
		return __ushort_as_half((unsigned short)(r < 0 ? 0xfc00u : 0x7c00u));
#if defined(__F16C__)
	return __ushort_as_half((unsigned short)_cvtss_sh((float)r, 0));   /* exact */
#else
	const float f = (float)r;   /* exact */
	uint32_t fu;
	memcpy(&fu, &f, 4);
	const uint32_t sg = (fu >> 16) & 0x8000u;
	const int fe = (int)((fu >> 23) & 0xff) - 127;
	if (fe < -14)   /* subnormal: r / 2^-24 is an integer */
		return __ushort_as_half((unsigned short)(sg | (uint32_t)std::ldexp(std::fabs(r), 24)));
	return __ushort_as_half((unsigned short)(sg | (uint32_t)(fe + 15) << 10 | ((fu >> 13) & 0x3ffu)));
#endif
}
inline __half f2h(float f)
{
#if defined(__F16C__)
	return __ushort_as_half((unsigned short)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
	return round_half((double)f, 0);
#endif
}
} /* namespace cusim */
#define __half2float(h) cusim::h2f(h)
#define __float2half(f) cusim::f2h(f)
#define __float2half_rn(f) cusim::f2h(f)
#define __double2half(d) cusim::round_half((double)(d), 0)
#define __hadd(a, b) cusim::f2h(cusim::h2f(a) + cusim::h2f(b))
#define __hsub(a, b) cusim::f2h(cusim::h2f(a) - cusim::h2f(b))
#define __hmul(a, b) cusim::f2h(cusim::h2f(a) * cusim::h2f(b))

namespace cusim {

/* one emulated thread (the part device code sees) */
struct Thread {
	uint3 tid;        /* threadIdx */
	int lin;          /* linear thread index in the block */
	int lane, warp;
	unsigned wseq;    /* warp collectives executed (slot parity) */
};
extern Thread *cur;           /* the running emulated thread */
extern uint3 cur_block;       /* blockIdx */
extern dim3 cur_bdim, cur_gdim;
extern void *dyn_smem;        /* dynamic shared memory of the running launch */

/* block barrier; warp barrier with data exchange (returns the 32 lanes'
 * deposited values) */
void bar_sync(const char *file, int line);
const uint64_t *warp_exchange(unsigned mask, uint64_t mine, const char *what, const char *file,
                              int line);
/* thread order between barriers: "fwd", "rev", "rand" or "rand:SEED"
 * (X3SIM_ORDER sets it at the first launch); false if not one of those */
bool set_order(const char *order);
[[noreturn]] void fail(int cuda_error, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* launch: runs body(ctx) for every thread of every block; returns the
 * launch's cudaError_t (configuration errors; execution errors become the
 * device's pending error) */
int launch(const void *func, const char *name, dim3 grid, dim3 block, size_t smem,
           cudaStream_t stream, void (*body)(void *), void *ctx);
/* a kernel argument that is a pointer must point into device memory */
bool arg_ok(const void *p);
void arg_error(const char *name, int i, const void *p);
template <class T> inline bool arg_check(T *p) { return !p || arg_ok((const void *)p); }
template <class T> inline bool arg_check(const T &) { return true; }

template <class F, class Tup>
struct Call {
	F f;
	Tup args;
	static void run(void *p)
	{
		Call *c = (Call *)p;
		Tup copy = c->args;   /* kernel parameters are per-thread values */
		std::apply(c->f, copy);
	}
};

template <class... P>
struct Launcher {
	void (*f)(P...);
	dim3 grid, block;
	size_t smem;
	cudaStream_t stream;
	const char *name;
	template <class... A>
	void operator()(A &&...a) const
	{
		static_assert(sizeof...(A) == sizeof...(P), "kernel launched with a wrong argument count");
		Call<void (*)(P...), std::tuple<P...>> c{f, std::tuple<P...>(std::forward<A>(a)...)};
		int i = 0, bad = -1;
		const void *bp = nullptr;
		std::apply([&](const auto &...x) {
			((bad < 0 && !arg_check(x) ? (bad = i, bp = (const void *)&x) : nullptr, i++), ...);
		}, c.args);
		if (bad >= 0)
			arg_error(name, bad, *(const void *const *)bp);
		else
			launch((const void *)f, name, grid, block, smem, stream, &decltype(c)::run, &c);
	}
};
/* kernel<<<grid, block, smem, stream>>>(args) is
 * cusim::launcher(kernel, grid, block, smem, stream, "kernel at file:line")(args) */
template <class... P>
Launcher<P...> launcher(void (*f)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        const char *name)
{
	return Launcher<P...>{f, grid, block, smem, stream, name};
}

template <class T>
inline uint64_t to_bits(T v)
{
	static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
	uint64_t b = 0;
	memcpy(&b, &v, sizeof v);
	return b;
}
template <class T>
inline T from_bits(uint64_t b)
{
	T v;
	memcpy(&v, &b, sizeof v);
	return v;
}

} /* namespace cusim */

/* the C++ overloads of cuda_runtime.h that exist only under nvcc */
template <class T>
inline cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, T *f)
{
	return ::cudaFuncGetAttributes(a, (const void *)f);
}
template <class T>
inline cudaError_t cudaFuncSetAttribute(T *f, enum cudaFuncAttribute a, int v)
{
	return ::cudaFuncSetAttribute((const void *)f, a, v);
}

/* ---- built-in variables ------------------------------------------------ */
#define threadIdx (cusim::cur->tid)
#define blockIdx (cusim::cur_block)
#define blockDim (cusim::cur_bdim)
#define gridDim (cusim::cur_gdim)
#define warpSize 32

/* ---- storage ------------------------------------------------------------ */
/* Static shared variables: one copy per kernel instance, shared by the
 * emulated threads of the running block (blocks run one at a time). They
 * live in their own section, which the emulator fills with a poison
 * pattern before each block (shared memory is not initialized). */
#undef __shared__
#define __shared__ static __attribute__((section("x3sim_shared")))
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __constant__
#define __constant__

/* ---- barriers and warp collectives ------------------------------------- */
inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	cusim::bar_sync(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
                       int line = __builtin_LINE())
{
	(void)cusim::warp_exchange(mask, 0, "__syncwarp", file, line);
}

template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32,
                     const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	const uint64_t *s = cusim::warp_exchange(mask, cusim::to_bits(v), "__shfl_sync", file, line);
	const int lane = cusim::cur->lane, base = lane & ~(width - 1);
	return cusim::from_bits<T>(s[base + (src & (width - 1))]);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lm, int width = 32,
                         const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	const uint64_t *s = cusim::warp_exchange(mask, cusim::to_bits(v), "__shfl_xor_sync", file, line);
	const int lane = cusim::cur->lane, src = lane ^ lm;
	/* a source outside the lane's width segment returns its own value */
	return cusim::from_bits<T>(s[(src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane]);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32,
                          const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	const uint64_t *s = cusim::warp_exchange(mask, cusim::to_bits(v), "__shfl_down_sync", file, line);
	const int lane = cusim::cur->lane, src = lane + (int)d;
	return cusim::from_bits<T>(s[(src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane]);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32,
                        const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	const uint64_t *s = cusim::warp_exchange(mask, cusim::to_bits(v), "__shfl_up_sync", file, line);
	const int lane = cusim::cur->lane, src = lane - (int)d;
	return cusim::from_bits<T>(s[src >= 0 && (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane]);
}
inline unsigned __ballot_sync(unsigned mask, int p, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE())
{
	const uint64_t *s = cusim::warp_exchange(mask, p != 0, "__ballot_sync", file, line);
	unsigned b = 0;
	for (int i = 0; i < 32; i++)
		if ((mask >> i & 1) && s[i])
			b |= 1u << i;
	return b;
}
inline int __any_sync(unsigned mask, int p, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE())
{
	return __ballot_sync(mask, p, file, line) != 0;
}
inline int __all_sync(unsigned mask, int p, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE())
{
	return __ballot_sync(mask, p, file, line) == mask;
}
inline unsigned __activemask() { return 0xffffffffu; }

/* ---- atomics: emulated threads are fibers of one OS thread, so a plain
 * read-modify-write between two switch points is atomic ---------------- */
template <class T> inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T> inline T atomicSub(T *p, T v) { T o = *p; *p = o - v; return o; }
template <class T> inline T atomicMin(T *p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <class T> inline T atomicMax(T *p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <class T> inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <class T> inline T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }
template <class T> inline T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }
template <class T> inline T atomicCAS(T *p, T c, T v) { T o = *p; if (o == c) *p = v; return o; }
inline void __threadfence() {}
inline void __threadfence_block() {}

/* ---- intrinsics ---------------------------------------------------------- */
template <class T> inline T __ldg(const T *p) { return *p; }
/* cache-hint loads and stores (L2 only, streaming, volatile-like): plain
 * accesses here, memory is coherent (one OS thread) */
template <class T> inline T __ldcg(const T *p) { return *(const volatile T *)p; }
template <class T> inline T __ldcs(const T *p) { return *(const volatile T *)p; }
template <class T> inline T __ldcv(const T *p) { return *(const volatile T *)p; }
template <class T> inline void __stcg(T *p, T v) { *(volatile T *)p = v; }
template <class T> inline void __stcs(T *p, T v) { *(volatile T *)p = v; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c)
{
	for (int i = 0; i < 4; i++)
		c += ((a >> (8 * i)) & 255u) * ((b >> (8 * i)) & 255u);
	return c;
}
inline int __dp4a(int a, int b, int c)
{
	for (int i = 0; i < 4; i++)
		c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
	return c;
}
/* funnel shift left: the high 32 bits of (hi:lo) << (s & 31) */
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s)
{
	const uint64_t v = ((uint64_t)hi << 32) | lo;
	return (unsigned)((v << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s)
{
	const uint64_t v = ((uint64_t)hi << 32) | lo;
	return (unsigned)(v >> (s & 31));
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x)
{
	unsigned r = 0;
	for (int i = 0; i < 32; i++)
		r |= ((x >> i) & 1u) << (31 - i);
	return r;
}
/* a * b + c with one fp16 rounding (the host half library has no fma):
 * the product is exact in double, s = p + c rounds once and TwoSum gives
 * its error, so that a halfway s rounds toward the exact value. */
inline __half __hfma(__half a, __half b, __half c)
{
	const double p = (double)__half2float(a) * (double)__half2float(b);   /* exact */
	const double cc = (double)__half2float(c), s = p + cc;
	const double bp = s - cc, e = (p - bp) + (cc - (s - bp));   /* TwoSum: s + e exact */
	if (e == 0 && (double)(float)s == s)   /* exact in fp32: one rounding to fp16 */
		return cusim::f2h((float)s);
	return cusim::round_half(s, e);
}

/* ---- tensor cores ----------------------------------------------------------- */
namespace cusim {
/* mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, a warp collective:
 * D (16x8, fp32) = A (16x16, fp16, row) B (16x8, fp16, col) + C, with the
 * PTX ISA fragment layout (g = lane/4, q = lane%4, two halves per 32-bit
 * register, the lower index in the low half):
 *   a[0] = A[g][2q..2q+1], a[1] = A[g+8][2q..2q+1], a[2] = A[g][2q+8..2q+9],
 *   a[3] = A[g+8][2q+8..2q+9]; b0 = B[2q..2q+1][g], b1 = B[2q+8..2q+9][g];
 *   c[0..1] = D[g][2q..2q+1], c[2..3] = D[g+8][2q..2q+1].
 * The products are exact; they are accumulated in fp32 in k order onto C
 * (the hardware's internal accumulation order and rounding are not
 * specified; the emulation cannot reproduce them). */
inline void mma_m16n8k16_f16_f32(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1,
                                 const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	const uint64_t *s;
	uint32_t ra[32][4], rb[32][2];
	s = warp_exchange(0xffffffffu, (uint64_t)a[0] | (uint64_t)a[1] << 32, "mma.sync", file, line);
	for (int l = 0; l < 32; l++)
		ra[l][0] = (uint32_t)s[l], ra[l][1] = (uint32_t)(s[l] >> 32);
	s = warp_exchange(0xffffffffu, (uint64_t)a[2] | (uint64_t)a[3] << 32, "mma.sync", file, line);
	for (int l = 0; l < 32; l++)
		ra[l][2] = (uint32_t)s[l], ra[l][3] = (uint32_t)(s[l] >> 32);
	s = warp_exchange(0xffffffffu, (uint64_t)b0 | (uint64_t)b1 << 32, "mma.sync", file, line);
	for (int l = 0; l < 32; l++)
		rb[l][0] = (uint32_t)s[l], rb[l][1] = (uint32_t)(s[l] >> 32);
	auto h = [](uint32_t r, int hi) {
		return __half2float(__ushort_as_half((unsigned short)(hi ? r >> 16 : r & 0xffffu)));
	};
	float A[16][16], B[16][8];
	for (int l = 0; l < 32; l++) {
		const int g = l >> 2, q = l & 3;
		for (int e = 0; e < 2; e++) {
			A[g][2 * q + e] = h(ra[l][0], e);
			A[g + 8][2 * q + e] = h(ra[l][1], e);
			A[g][2 * q + 8 + e] = h(ra[l][2], e);
			A[g + 8][2 * q + 8 + e] = h(ra[l][3], e);
			B[2 * q + e][g] = h(rb[l][0], e);
			B[2 * q + 8 + e][g] = h(rb[l][1], e);
		}
	}
	const int lane = cur->lane, g = lane >> 2, q = lane & 3;
	for (int i = 0; i < 4; i++) {
		const int row = g + 8 * (i >> 1), col = 2 * q + (i & 1);
		float acc = c[i];
		for (int kk = 0; kk < 16; kk++)
			acc = std::fma(A[row][kk], B[kk][col], acc);
		c[i] = acc;
	}
}
} /* namespace cusim */

#endif
