/* kernel-sim.cpp: runs device code of the kernels on the CPU, thread by
 * thread, and compares it with the C references of the library:
 *  - codebooks (common.cuh x3k_cb_*) for all 65536 states x 3 codebooks
 *    against x3_codebook (the fp16 intrinsics use cuda_fp16.h's host
 *    versions);
 *  - per-lane state extraction (x3k_lane_states) against
 *    x3_trellis_unpack, K = 1..8;
 *  - the tensor-core GEMV's fragments (gemv.cuh) through an emulated
 *    mma.m16n8k16 with the PTX fragment layout, against a float64 product
 *    with the decoded W~, K = 1..8 x 3 codebooks;
 *  - the Viterbi kernel's schedule (viterbi.cuh: thread/group mapping,
 *    swizzled costs, packed back-pointers, argmin and trace-back as the
 *    kernel does them) against x3_viterbi_encode, K = 1..8 x 3 codebooks.
 * The kernel body has no communication inside a step (only barriers
 * between steps), so running threads 0..T-1 in turn is exact. What this
 * cannot check: the hardware's fp16/fp32 rounding, shuffles, races,
 * launch configuration. Build and run: tests/gpu/sim (no GPU needed).
 * Output: TAP lines like the unit tests. */
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __global__
#define __restrict__

#include <cuda_fp16.h>

struct sim_dim { unsigned x, y, z; };
static sim_dim threadIdx;

static inline unsigned __dp4a(unsigned a, unsigned b, unsigned c)
{
	for (int i = 0; i < 4; i++)
		c += ((a >> (8 * i)) & 255) * ((b >> (8 * i)) & 255);
	return c;
}
static inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned sh)
{
	unsigned long long v = ((unsigned long long)hi << 32) | lo;
	return (unsigned)((v << (sh & 31)) >> 32);
}
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
/* device-only fp16 fma: exact in double, then one rounding to fp16 */
static inline __half __hfma(__half a, __half b, __half c)
{
	return __double2half((double)__half2float(a) * (double)__half2float(b) +
	                     (double)__half2float(c));
}
static inline float __shfl_xor_sync(unsigned, float v, int) { return v; }

#include "common.cuh"
#include "viterbi.cuh"
#include "gemv.cuh"

extern "C" {
#include "codec.h"
}

static int n_test, n_fail;
static void check(bool ok, const char *what, int a, int b)
{
	n_test++;
	if (!ok)
		n_fail++;
	printf("%s %d - %s (%d, %d)\n", ok ? "ok" : "not ok", n_test, what, a, b);
}

template <int CB>
static int sim_codebook()
{
	int bad = 0;
	for (uint32_t s = 0; s < 65536; s++) {
		__half h = x3k_cb_from_product<CB>(x3k_cb_product<CB>(s));
		unsigned short hb;
		memcpy(&hb, &h, 2);
		if (hb != x3_codebook_f16(CB, s)) {
			if (bad < 3)
				printf("#   cb %d state %04x: sim %04x ref %04x\n", CB, s, hb,
				       x3_codebook_f16(CB, s));
			bad++;
		}
	}
	return bad;
}

template <int K>
static int sim_lanes(x3_rng *r)
{
	int bad = 0;
	for (int rep = 0; rep < 20; rep++) {
		uint16_t words[128], ref[256];
		for (int i = 0; i < 16 * K; i++)
			words[i] = (uint16_t)x3_rng_u64(r);
		x3_trellis_unpack(K, words, ref);
		uint32_t U[64];
		for (int j = 0; j < 8 * K; j++)
			U[j] = (uint32_t)words[2 * j] | (uint32_t)words[2 * j + 1] << 16;
		for (int t = 0; t < 32; t++) {
			uint32_t st[8];
			x3k_lane_states<K>(U, t, st);
			for (int i = 0; i < 8; i++)
				bad += st[i] != ref[8 * t + i];
		}
	}
	return bad;
}

/* mma.m16n8k16 (f16 A row, B col, f32 accumulate) for a warp, from each
 * lane's registers, with the PTX ISA fragment layout */
static void mma_emul(const uint32_t a[32][4], const uint32_t b0[32], const uint32_t b1[32],
                     float c[32][4])
{
	float A[16][16], B[16][8];
	auto h = [](uint32_t r, int hi) {
		unsigned short v = (unsigned short)(hi ? r >> 16 : r & 0xFFFF);
		__half x;
		memcpy(&x, &v, 2);
		return __half2float(x);
	};
	for (int l = 0; l < 32; l++) {
		const int g = l >> 2, q = l & 3;
		for (int e = 0; e < 2; e++) {
			A[g][2 * q + e] = h(a[l][0], e);
			A[g + 8][2 * q + e] = h(a[l][1], e);
			A[g][2 * q + 8 + e] = h(a[l][2], e);
			A[g + 8][2 * q + 8 + e] = h(a[l][3], e);
			B[2 * q + e][g] = h(b0[l], e);
			B[2 * q + 8 + e][g] = h(b1[l], e);
		}
	}
	for (int l = 0; l < 32; l++) {
		const int g = l >> 2, q = l & 3;
		for (int i = 0; i < 4; i++) {
			const int r = g + 8 * (i >> 1), col = 2 * q + (i & 1);
			float d = 0;
			for (int kk = 0; kk < 16; kk++)
				d += A[r][kk] * B[kk][col];
			c[l][i] += d;
		}
	}
}

/* one warp of gemv_mma_kernel on a (64 x 16) weight: 4 tiles down k */
template <int K, int CB>
static bool sim_gemv(x3_rng *r, int m)
{
	const int tk = 4, k = 64, n = 16, kbps = tk, ks = 16 * kbps + XPAD;
	std::vector<uint16_t> tr(tk * 16 * K);
	for (auto &w : tr)
		w = (uint16_t)x3_rng_u64(r);
	std::vector<float> wt(k * n), x(m * k);
	x3_trellis_decode(K, CB, tr.data(), k, n, wt.data());
	std::vector<__half> xh(m * ks);
	for (int i = 0; i < m * k; i++) {
		x[i] = (float)x3_rng_normal(r);
		xh[(i / k) * ks + i % k] = __float2half_rn(x[i]);
	}
	float c[2][32][4] = {};
	for (int u = 0; u < tk; u++) {
		uint32_t a[32][4], b[32][4], b0[32], b1[32], b2[32], b3[32];
		const uint32_t *U = (const uint32_t *)(tr.data() + u * 16 * K);
		for (int l = 0; l < 32; l++) {
			gemv_b_frags<K, CB>(U, l, b[l]);
			gemv_a_frags(xh.data(), ks, m, l, u, a[l]);
			b0[l] = b[l][0], b1[l] = b[l][1], b2[l] = b[l][2], b3[l] = b[l][3];
		}
		mma_emul(a, b0, b1, c[0]);
		mma_emul(a, b2, b3, c[1]);
	}
	std::vector<double> y(m * n, 0.0);
	for (int l = 0; l < 32; l++)
		for (int hh = 0; hh < 2; hh++)
			for (int i = 0; i < 4; i++) {
				int row, col;
				gemv_c_pos(l, hh, i, &row, &col);
				if (row < m)
					y[row * n + col] += c[hh][l][i];
			}
	double num = 0, den = 0;
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++) {
			double s = 0;
			for (int kk = 0; kk < k; kk++)
				s += (double)__half2float(xh[i * ks + kk]) * wt[kk * n + j];
			num += (y[i * n + j] - s) * (y[i * n + j] - s);
			den += s * s;
		}
	return sqrt(num / den) < 1e-5;
}

template <int K>
static void sim_gemv_k(x3_rng *r)
{
	bool ok = sim_gemv<K, 0>(r, 1) && sim_gemv<K, 1>(r, 9) && sim_gemv<K, 2>(r, 16) &&
	          sim_gemv<K, (K % 3)>(r, 5);
	check(ok, "gemv fragments (K, -) through an emulated mma equal x' W~ (m = 1, 5, 9, 16)", K, 0);
}

/* the kernel's tile loop, threads in turn */
template <int K, int CB>
static void sim_tile(const float *xs, uint16_t *st_out)
{
	using C = VCfg<K>;
	std::vector<float> costs(2 * C::E);
	std::vector<uint32_t> bp((size_t)256 * C::W * C::T);
	std::vector<float> minv(C::T, INFINITY);
	std::vector<int> mine(C::T, INT_MAX);
	for (int e = 0; e < C::E; e++)
		costs[e] = 0.0f;
	float *prev = costs.data(), *next = prev + C::E;
	for (int i = 0; i < 256; i++) {
		const int p = (i + 128) & 255;
		for (int tid = 0; tid < C::T; tid++) {
			threadIdx.x = tid;
			vstep<K, CB>(prev, next, xs[p],
			             p < 128 ? bp.data() + (size_t)p * C::W * C::T + tid : nullptr, i == 255,
			             minv[tid], mine[tid]);
		}
		std::swap(prev, next);
	}
	/* the shuffle tree and the warp-result scan select the same element:
	 * the lowest e among the minimal costs */
	float bv = minv[0];
	int be = mine[0];
	for (int t = 1; t < C::T; t++)
		if (minv[t] < bv || (minv[t] == bv && mine[t] < be)) {
			bv = minv[t];
			be = mine[t];
		}
	int e = be;
	for (int p = 127; p >= 0; p--) {
		uint32_t s = (uint32_t)bp_read<K>(bp.data(), p, e) << (16 - K) | (uint32_t)e;
		e = (int)(s >> K);
	}
	const int pre = e, pre_a = swz(pre);
	for (int a = 0; a < C::E; a++)
		costs[a] = a == pre_a ? 0.0f : INFINITY;
	prev = costs.data();
	next = prev + C::E;
	for (int p = 0; p < 256; p++) {
		for (int tid = 0; tid < C::T; tid++) {
			threadIdx.x = tid;
			vstep<K, CB>(prev, next, xs[p], bp.data() + (size_t)p * C::W * C::T + tid, false,
			             minv[tid], mine[tid]);
		}
		std::swap(prev, next);
	}
	e = pre;
	for (int p = 255; p >= 0; p--) {
		uint32_t s = (uint32_t)bp_read<K>(bp.data(), p, e) << (16 - K) | (uint32_t)e;
		st_out[p] = (uint16_t)s;
		e = (int)(s >> K);
	}
}

template <int K, int CB>
static void sim_viterbi(int ntiles)
{
	x3_rng r;
	x3_rng_seed(&r, 4242 + 10 * K + CB, 7);
	std::vector<float> x(256 * ntiles);
	for (int i = 0; i < 256 * ntiles; i++)
		x[i] = (float)(x3_rng_normal(&r) * 1.2);
	/* tile 0: positions 128..191 constant, 192..255 huge (d^2 ~ 1e13 has
	 * an ulp of ~1e6, so most candidate costs tie exactly): the tie rules
	 * decide the path */
	for (int i = 128; i < 192; i++)
		x[i] = 0.5f;
	for (int i = 192; i < 256; i++)
		x[i] = 3e6f;
	std::vector<uint16_t> ref(256 * ntiles), sim(256 * ntiles);
	x3_viterbi_encode(K, CB, x.data(), ntiles, ref.data(), NULL, 0);
	for (int t = 0; t < ntiles; t++)
		sim_tile<K, CB>(x.data() + 256 * t, sim.data() + 256 * t);
	int diff = 0;
	for (int i = 0; i < 256 * ntiles; i++)
		diff += ref[i] != sim[i];
	check(diff == 0, "viterbi (K, cb): kernel schedule gives the CPU's states", K, CB);
	if (diff)
		printf("#   %d of %d states differ\n", diff, 256 * ntiles);
}

/* all codebooks, or only cb = K % 3 (quick) */
template <int K>
static void sim_k(int ntiles, bool all)
{
	if (all || K % 3 == 0)
		sim_viterbi<K, 0>(ntiles);
	if (all || K % 3 == 1)
		sim_viterbi<K, 1>(ntiles);
	if (all || K % 3 == 2)
		sim_viterbi<K, 2>(ntiles);
}

int main(int argc, char **argv)
{
	/* usage: kernel-sim [NTILES [all]] */
	const int ntiles = argc > 1 ? atoi(argv[1]) : 1;
	const bool all = argc > 2 && !strcmp(argv[2], "all");
	check(sim_codebook<0>() == 0, "codebook (id, -) 3inst: all states bit-exact", 0, 0);
	check(sim_codebook<1>() == 0, "codebook (id, -) mcg: all states bit-exact", 1, 0);
	check(sim_codebook<2>() == 0, "codebook (id, -) mul1: all states bit-exact", 2, 0);
	int pbad = 0;
	for (int t = 0; t < 32; t++)
		for (int j = 0; j < 8; j++)
			pbad += 16 * x3k_lane_row(t, j) + x3k_lane_col(t, j) != x3_tile_perm[8 * t + j] ||
			        16 * x3k_perm_row(8 * t + j) + x3k_perm_col(8 * t + j) != x3_tile_perm[8 * t + j];
	check(pbad == 0, "lane row/col and perm row/col equal x3_tile_perm", pbad, 0);
	x3_rng r;
	x3_rng_seed(&r, 99, 0);
	check(sim_lanes<1>(&r) == 0, "lane states (K, -) match x3_trellis_unpack", 1, 0);
	check(sim_lanes<2>(&r) == 0, "lane states (K, -) match x3_trellis_unpack", 2, 0);
	check(sim_lanes<3>(&r) == 0, "lane states (K, -) match x3_trellis_unpack", 3, 0);
	check(sim_lanes<4>(&r) == 0, "lane states (K, -) match x3_trellis_unpack", 4, 0);
	check(sim_lanes<5>(&r) == 0, "lane states (K, -) match x3_trellis_unpack", 5, 0);
	check(sim_lanes<6>(&r) == 0, "lane states (K, -) match x3_trellis_unpack", 6, 0);
	check(sim_lanes<7>(&r) == 0, "lane states (K, -) match x3_trellis_unpack", 7, 0);
	check(sim_lanes<8>(&r) == 0, "lane states (K, -) match x3_trellis_unpack", 8, 0);
	sim_gemv_k<1>(&r);
	sim_gemv_k<2>(&r);
	sim_gemv_k<3>(&r);
	sim_gemv_k<4>(&r);
	sim_gemv_k<5>(&r);
	sim_gemv_k<6>(&r);
	sim_gemv_k<7>(&r);
	sim_gemv_k<8>(&r);
	if (ntiles < 1)   /* 0: skip the Viterbi */
		goto done;
	sim_k<1>(ntiles, all);
	sim_k<2>(ntiles, all);
	sim_k<3>(ntiles, all);
	sim_k<4>(ntiles, all);
	sim_k<5>(ntiles, all);
	sim_k<6>(ntiles, all);
	sim_k<7>(ntiles, all);
	sim_k<8>(ntiles, all);
done:
	printf("# %d checks, %d failed\n", n_test, n_fail);
	return n_fail ? 1 : 0;
}
