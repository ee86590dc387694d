/* hadamard.cu: blockwise normalized Hadamard-128 with elementwise pre- and
 * post-multiplies (exl3(5) §6.1, §6.2), fp32 throughout.
 *   rows: y[r][128b + .] = (H128 (x[r][128b + .] (.) pre) * scale) (.) post + add
 *         one warp per 128-chunk, element e = lane + 32i, coalesced;
 *   cols: the same down each column's 128-chunks of rows, through a
 *         shared (128, 33) panel of 32 columns (conflict-free: bank of
 *         (lane + 32i)*33 + c is lane + i + c mod 32). */
#include "common.cuh"
#include "gpu_kern.h"

__global__ void had_rows_kernel(const float *x, float *y, int64_t rows, int64_t cols,
                                const float *__restrict__ pre, const float *__restrict__ post,
                                const float *__restrict__ add, float scale)
{
	const int lane = threadIdx.x & 31;
	const int64_t chunks = rows * (cols / 128);
	const int64_t nwarps = (int64_t)gridDim.x * (blockDim.x >> 5);
	for (int64_t ch = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); ch < chunks;
	     ch += nwarps) {
		const int64_t r = ch / (cols / 128), c0 = (ch % (cols / 128)) * 128;
		const float *xr = x + r * cols + c0;
		float v[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			v[i] = xr[lane + 32 * i];
			if (pre)
				v[i] *= pre[c0 + lane + 32 * i];
		}
		x3k_warp_had128(v);
		float *yr = y + r * cols + c0;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int64_t c = c0 + lane + 32 * i;
			float t = v[i] * scale;
			if (post)
				t *= post[c];
			if (add)
				t += add[c];
			yr[lane + 32 * i] = t;
		}
	}
}

__global__ void __launch_bounds__(256)
had_cols_kernel(float *x, int64_t rows, int64_t cols, const float *__restrict__ pre,
                const float *__restrict__ post, float scale)
{
	__shared__ float pan[128 * 33];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t r0 = (int64_t)blockIdx.y * 128, c0 = (int64_t)blockIdx.x * 32;
	const int64_t c = c0 + lane;
	for (int r = warp; r < 128; r += 8) {
		float v = 0.0f;
		if (c < cols) {
			v = x[(r0 + r) * cols + c];
			if (pre)
				v *= pre[r0 + r];
		}
		pan[r * 33 + lane] = v;
	}
	__syncthreads();
	for (int cc = warp; cc < 32; cc += 8) {
		float v[4];
#pragma unroll
		for (int i = 0; i < 4; i++)
			v[i] = pan[(lane + 32 * i) * 33 + cc];
		x3k_warp_had128(v);
#pragma unroll
		for (int i = 0; i < 4; i++)
			pan[(lane + 32 * i) * 33 + cc] = v[i] * scale;
	}
	__syncthreads();
	if (c < cols)
		for (int r = warp; r < 128; r += 8) {
			float v = pan[r * 33 + lane];
			if (post)
				v *= post[r0 + r];
			x[(r0 + r) * cols + c] = v;
		}
}

extern "C" int x3k_had128_rows(const float *x, float *y, int64_t rows, int64_t cols,
                               const float *pre, const float *post, const float *add, float scale,
                               void *stream)
{
	if (rows < 0 || cols < 0 || cols % 128)
		return (int)cudaErrorInvalidValue;
	const int64_t chunks = rows * (cols / 128);
	if (chunks == 0)
		return 0;
	int64_t blocks = (chunks + 7) / 8;
	if (blocks > 1 << 20)
		blocks = 1 << 20;
	X3K_LAUNCH(had_rows_kernel, (unsigned)blocks, 256, 0, (cudaStream_t)stream)(x, y, rows, cols, pre,
	                                                                    post, add, scale);
	return (int)cudaGetLastError();
}

extern "C" int x3k_had128_cols(float *x, int64_t rows, int64_t cols, const float *pre,
                               const float *post, float scale, void *stream)
{
	if (rows < 0 || cols < 0 || rows % 128 || rows / 128 > 65535)
		return (int)cudaErrorInvalidValue;
	if (rows == 0 || cols == 0)
		return 0;
	dim3 grid((unsigned)((cols + 31) / 32), (unsigned)(rows / 128));
	X3K_LAUNCH(had_cols_kernel, grid, 256, 0, (cudaStream_t)stream)(x, rows, cols, pre, post, scale);
	return (int)cudaGetLastError();
}
