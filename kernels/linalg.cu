/* linalg.cu: small elementwise and block kernels around the cuBLAS and
 * cuSOLVER calls of lib/gpu/gpu_quant.c: fp16 conversion, triangle mirroring,
 * diagonal updates, the block-LDL normalization (exl3(5) §9.1 step 7) and the
 * tile gather/scatter of LDLQ (exl3(5) §9.4, tile permutation exl3(5) §4.2). */
#include "common.cuh"
#include "gpu_kern.h"

static unsigned grid_for(int64_t n, int threads)
{
	int64_t b = (n + threads - 1) / threads;
	return (unsigned)(b > (1 << 20) ? (1 << 20) : (b < 1 ? 1 : b));
}

__global__ void f32_to_f16_kernel(const float *x, __half *y, int64_t n)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		y[i] = __float2half_rn(x[i]);
}

extern "C" int x3k_f32_to_f16(const float *x, uint16_t *y, int64_t n, void *stream)
{
	if (n <= 0)
		return 0;
	X3K_LAUNCH(f32_to_f16_kernel, grid_for(n, 256), 256, 0, (cudaStream_t)stream)(x, (__half *)y, n);
	return (int)cudaGetLastError();
}

__global__ void add_kernel(float *y, const float *x, int64_t n)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		y[i] += x[i];
}

extern "C" int x3k_add(float *y, const float *x, int64_t n, void *stream)
{
	if (n <= 0)
		return 0;
	X3K_LAUNCH(add_kernel, grid_for(n, 256), 256, 0, (cudaStream_t)stream)(y, x, n);
	return (int)cudaGetLastError();
}

/* a is column-major (n, n): element (i, j) at a[j*n + i] */
__global__ void symmetrize_kernel(float *a, int64_t n, int lower)
{
	const int64_t total = n * n;
	for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
	     t += (int64_t)gridDim.x * blockDim.x) {
		const int64_t i = t % n, j = t / n;
		if (lower ? i < j : i > j)
			a[j * n + i] = a[i * n + j];
	}
}

extern "C" int x3k_symmetrize(float *a, int64_t n, int lower, void *stream)
{
	if (n <= 0)
		return 0;
	X3K_LAUNCH(symmetrize_kernel, grid_for(n * n, 256), 256, 0, (cudaStream_t)stream)(a, n, lower);
	return (int)cudaGetLastError();
}

__global__ void add_diag_kernel(float *a, int64_t n, float v)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		a[i * n + i] += v;
}

extern "C" int x3k_add_diag(float *a, int64_t n, float v, void *stream)
{
	if (n <= 0)
		return 0;
	X3K_LAUNCH(add_diag_kernel, grid_for(n, 256), 256, 0, (cudaStream_t)stream)(a, n, v);
	return (int)cudaGetLastError();
}

/* one block, fixed order: deterministic */
__global__ void diag_sum_kernel(const float *a, int64_t n, double *out)
{
	__shared__ double part[256];
	double s = 0;
	for (int64_t i = threadIdx.x; i < n; i += 256)
		s += (double)a[i * n + i];
	part[threadIdx.x] = s;
	__syncthreads();
	for (int h = 128; h; h >>= 1) {
		if ((int)threadIdx.x < h)
			part[threadIdx.x] += part[threadIdx.x + h];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		*out = part[0];
}

extern "C" int x3k_diag_sum(const float *a, int64_t n, double *out, void *stream)
{
	X3K_LAUNCH(diag_sum_kernel, 1, 256, 0, (cudaStream_t)stream)(a, n, out);
	return (int)cudaGetLastError();
}

/* L row-major (k, k) lower. Block (b) handles rows [16(b+1), k) against
 * the 16x16 diagonal block D_b: each thread solves one row r:
 * x D_b = L[r, B], D_b lower, by back substitution from column 15 down. */
__global__ void ldl_norm_kernel(float *L, int64_t k, int *bad)
{
	__shared__ float D[16][17];
	const int64_t b0 = (int64_t)blockIdx.y * 16;
	const int t = threadIdx.x;
	if (t < 256) {
		const int r = t >> 4, c = t & 15;
		D[r][c] = c <= r ? L[(b0 + r) * k + b0 + c] : 0.0f;
	}
	__syncthreads();
	if (blockIdx.x == 0 && t < 16) {
		const float p = D[t][t];
		if (!(isfinite(p) && p > 0.0f))
			atomicExch(bad, 1);
	}
	for (int64_t r = b0 + 16 + (int64_t)blockIdx.x * blockDim.x + t; r < k;
	     r += (int64_t)gridDim.x * blockDim.x) {
		float l[16], xv[16];
#pragma unroll
		for (int c = 0; c < 16; c++)
			l[c] = L[r * k + b0 + c];
#pragma unroll
		for (int j = 15; j >= 0; j--) {
			float s = l[j];
#pragma unroll
			for (int i = j + 1; i < 16; i++)
				s -= xv[i] * D[i][j];
			xv[j] = s / D[j][j];
		}
#pragma unroll
		for (int c = 0; c < 16; c++)
			L[r * k + b0 + c] = xv[c];
	}
}

/* zero the diagonal blocks and everything above them */
__global__ void ldl_zero_kernel(float *L, int64_t k)
{
	const int64_t total = k * k;
	for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
	     t += (int64_t)gridDim.x * blockDim.x) {
		const int64_t r = t / k, c = t % k;
		if (c >= r / 16 * 16)
			L[t] = 0.0f;
	}
}

extern "C" int x3k_block_ldl_normalize(float *L, int64_t k, int *bad, void *stream)
{
	if (k <= 0 || k % 16 || k / 16 > 65535)
		return (int)cudaErrorInvalidValue;
	const int64_t rows = k - 16;
	unsigned gx = (unsigned)((rows + 255) / 256);
	if (gx < 1)
		gx = 1;
	dim3 grid(gx, (unsigned)(k / 16));
	X3K_LAUNCH(ldl_norm_kernel, grid, 256, 0, (cudaStream_t)stream)(L, k, bad);
	X3K_CUDA_OK(cudaGetLastError());
	X3K_LAUNCH(ldl_zero_kernel, grid_for(k * k, 256), 256, 0, (cudaStream_t)stream)(L, k);
	return (int)cudaGetLastError();
}

/* X (16, n) -> tiles (n/16, 256) in trellis order */
__global__ void tiles_gather_kernel(const float *X, int64_t n, float *tiles)
{
	const int64_t total = n * 16;
	for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
	     t += (int64_t)gridDim.x * blockDim.x) {
		const int64_t tile = t / 256;
		const int i = (int)(t % 256);
		tiles[t] = X[(int64_t)x3k_perm_row(i) * n + tile * 16 + x3k_perm_col(i)];
	}
}

extern "C" int x3k_tiles_gather(const float *X, int64_t n, float *tiles, void *stream)
{
	if (n <= 0 || n % 16)
		return (int)cudaErrorInvalidValue;
	X3K_LAUNCH(tiles_gather_kernel, grid_for(n * 16, 256), 256, 0, (cudaStream_t)stream)(X, n, tiles);
	return (int)cudaGetLastError();
}

__global__ void tiles_scatter_kernel(const float *vals, const float *W, int64_t n, float *Q,
                                     float *E)
{
	const int64_t total = n * 16;
	for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
	     t += (int64_t)gridDim.x * blockDim.x) {
		const int64_t tile = t / 256;
		const int i = (int)(t % 256);
		const int64_t o = (int64_t)x3k_perm_row(i) * n + tile * 16 + x3k_perm_col(i);
		const float v = vals[t];
		Q[o] = v;
		if (E)
			E[o] = W[o] - v;
	}
}

extern "C" int x3k_tiles_scatter(const float *vals, const float *W, int64_t n, float *Q, float *E,
                                 void *stream)
{
	if (n <= 0 || n % 16)
		return (int)cudaErrorInvalidValue;
	X3K_LAUNCH(tiles_scatter_kernel, grid_for(n * 16, 256), 256, 0, (cudaStream_t)stream)(vals, W, n, Q,
	                                                                              E);
	return (int)cudaGetLastError();
}
