/* gemv.cuh: the per-lane parts of the tensor-core GEMV (gemv.cu): B and A
 * fragments of mma.m16n8k16 and the position of each accumulator. Kept
 * apart so tests/gpu/kernel-sim.cpp can run them with an emulated mma.
 *
 * Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16", f16 A/B, f32
 * C/D), g = lane/4, q = lane%4, two halves per 32-bit register, the lower
 * index in the low half:
 *   A (16x16, row): a[0] = A[g][2q..2q+1], a[1] = A[g+8][2q..2q+1],
 *                   a[2] = A[g][2q+8..2q+9], a[3] = A[g+8][2q+8..2q+9];
 *   B (16x8, col):  b0 = B[2q..2q+1][g], b1 = B[2q+8..2q+9][g];
 *   C/D (16x8):     c[0..1] = D[g][2q..2q+1], c[2..3] = D[g+8][2q..2q+1].
 * A trellis tile (16 input rows x 16 output columns) is B for two mmas:
 * lane t's values j = 0..3 sit at rows 2(t%4) + {0, 1, 8, 9} of column t/4
 * (exl3(5) §4.2), i.e. exactly b0, b1 of columns 0..7; values 4..7 the same for
 * columns 8..15. */
#ifndef X3_GEMV_CUH
#define X3_GEMV_CUH

/* shared x' rows are padded by 8 halves so rows g = 0..7 hit distinct banks */
#define XPAD 8

__device__ __forceinline__ uint32_t pack_h2(__half lo, __half hi)
{
	return (uint32_t)__half_as_ushort(lo) | (uint32_t)__half_as_ushort(hi) << 16;
}

/* b[0], b[1]: columns 0..7 of the tile; b[2], b[3]: columns 8..15 */
template <int K, int CB>
__device__ __forceinline__ void gemv_b_frags(const uint32_t *U, int lane, uint32_t b[4])
{
	uint32_t st[8];
	x3k_lane_states<K>(U, lane, st);
#pragma unroll
	for (int i = 0; i < 4; i++)
		b[i] = pack_h2(x3k_cb_from_product<CB>(x3k_cb_product<CB>(st[2 * i])),
		               x3k_cb_from_product<CB>(x3k_cb_product<CB>(st[2 * i + 1])));
}

/* A fragments of tile u from the staged x' (m rows of ks halves; rows >= m
 * are zero) */
__device__ __forceinline__ void gemv_a_frags(const __half *xh, int ks, int m, int lane, int u,
                                             uint32_t a[4])
{
	const int g = lane >> 2, q = lane & 3;
	const __half *xa = xh + g * ks + 16 * u + 2 * q, *xb = xa + 8 * ks;
	a[0] = g < m ? *(const uint32_t *)xa : 0u;
	a[1] = g + 8 < m ? *(const uint32_t *)xb : 0u;
	a[2] = g < m ? *(const uint32_t *)(xa + 8) : 0u;
	a[3] = g + 8 < m ? *(const uint32_t *)(xb + 8) : 0u;
}

/* batch row and tile column of accumulator i (0..3) of n8 half h */
__device__ __forceinline__ void gemv_c_pos(int lane, int h, int i, int *row, int *col)
{
	*row = (lane >> 2) + 8 * (i >> 1);
	*col = 8 * h + 2 * (lane & 3) + (i & 1);
}

#endif
