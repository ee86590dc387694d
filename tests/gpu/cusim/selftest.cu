/* selftest.cu: checks of cusim itself (built by `make cusim`, run by
 * t1706): warp collectives, barriers, the thread orders and the race they
 * expose, the errors a device reports (divergence, deadlock, out-of-bounds
 * global and shared accesses, stack overflow, host pointers, launch
 * configuration), the fp16 intrinsics against exact arithmetic, the memory
 * API, and cuBLAS/cuSOLVER against plain loops. Output: TAP lines. Compiled
 * like the kernels (g++ -DX3K_SIM -include cusim.h). */
#include <cublas_v2.h>
#include <cusolverDn.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "common.cuh"

static int n_test, n_fail;
#define CHECK(c, ...) do { n_test++; bool ok_ = (c); if (!ok_) n_fail++; \
	printf("%s %d - ", ok_ ? "ok" : "not ok", n_test); printf(__VA_ARGS__); printf("\n"); } while (0)

/* the error a kernel left (sticky in cusim as on a device), then cleared */
static cudaError_t outcome()
{
	cudaError_t e = cudaDeviceSynchronize();
	if (e == cudaSuccess)
		e = cudaGetLastError();
	cudaDeviceReset();
	return e;
}

__global__ void shfl_kernel(int *out)
{
	const int l = threadIdx.x;
	out[l] = __shfl_xor_sync(0xffffffffu, l * 10, 5);
	out[32 + l] = __shfl_down_sync(0xffffffffu, l, 3);
	out[64 + l] = __shfl_up_sync(0xffffffffu, l, 2);
	out[96 + l] = __shfl_sync(0xffffffffu, l + 100, 7);
	out[128 + l] = (int)__ballot_sync(0xffffffffu, l & 1);
}

__global__ void reduce_kernel(const float *x, int n, float *out)
{
	__shared__ float part[256];
	float s = 0;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		s += x[i];
	part[threadIdx.x] = s;
	__syncthreads();
	for (int h = blockDim.x / 2; h; h >>= 1) {
		if ((int)threadIdx.x < h)
			part[threadIdx.x] += part[threadIdx.x + h];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		out[blockIdx.x] = part[0];
}

/* block order: each block takes a ticket (the last-block pattern's
 * counter, with the fence and the L2 load it uses) */
__global__ void ticket_kernel(int *cnt, int *out)
{
	if (threadIdx.x == 0) {
		__threadfence();
		const int t = atomicAdd(cnt, 1);
		out[blockIdx.y * gridDim.x + blockIdx.x] = t + 100 * (__ldcg(cnt) - t - 1);
	}
}

/* the tickets of a (3, 2) grid under X3SIM_BLOCKS=order */
static std::vector<int> tickets(const char *order)
{
	setenv("X3SIM_BLOCKS", order, 1);
	int *d = NULL, h[7];
	cudaMalloc((void **)&d, 7 * 4);
	cudaMemset(d, 0, 7 * 4);
	X3K_LAUNCH(ticket_kernel, dim3(3, 2), 32, 0, 0)(d, d + 1);
	cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
	cudaFree(d);
	unsetenv("X3SIM_BLOCKS");
	return std::vector<int>(h + 1, h + 7);
}

/* a race: every thread writes, no order between them */
__global__ void race_kernel(int *out)
{
	__shared__ int last;
	last = threadIdx.x;
	__syncthreads();
	if (threadIdx.x == 0)
		*out = last;
}

__global__ void diverge_kernel(int *out)
{
	if (threadIdx.x < 16)
		__syncthreads();
	else
		__syncthreads();
	out[threadIdx.x] = 1;
}

__global__ void exited_lane_kernel(int *out)
{
	if (threadIdx.x < 16)
		return;
	out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void deadlock_kernel(int *out)
{
	if (threadIdx.x < 16)
		__syncthreads();
	else
		out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void oob_kernel(float *x, int n)
{
	x[n + threadIdx.x] = 1.0f;
}

__global__ void smem_kernel(int n)
{
	X3K_DYN_SMEM(float, buf);
	buf[n] = 1.0f;
}

__device__ __attribute__((noinline)) int deep(int d)
{
	volatile char pad[4096];
	pad[0] = (char)d;
	return d ? deep(d - 1) + pad[0] : 0;
}

__global__ void stack_kernel(int *out, int d)
{
	*out = deep(d);
}

__global__ void exit_ok_kernel(int *out)
{
	/* threads that exit before a barrier count as arrived (sm_70+) */
	if (threadIdx.x >= 8)
		return;
	__syncthreads();
	out[threadIdx.x] = 2;
}

static int run_race(const char *order)
{
	cusim::set_order(order);
	int *d, v = -1;
	cudaMalloc((void **)&d, 4);
	X3K_LAUNCH(race_kernel, 1, 64, 0, 0)(d);
	cudaMemcpy(&v, d, 4, cudaMemcpyDeviceToHost);
	cudaFree(d);
	return v;
}

/* exact value of a*b + c for fp16 a, b, c, and whether h is its correct
 * round-to-nearest-even fp16 rounding */
static bool hfma_ok(__half a, __half b, __half c, __half h)
{
	const __float128 v = (__float128)__half2float(a) * __half2float(b) + __half2float(c);
	const unsigned short hb = __half_as_ushort(h);
	if ((hb & 0x7c00) == 0x7c00)   /* inf: |v| >= 65520 */
		return (v >= 65520 && hb == 0x7c00) || (v <= -65520 && hb == 0xfc00);
	const __float128 got = __half2float(h);
	/* neighbours of got */
	const __half up = __ushort_as_half((unsigned short)(hb == 0x8000 ? 1 : hb & 0x8000 ? hb - 1 : hb + 1));
	const __half dn = __ushort_as_half((unsigned short)(hb == 0 ? 0x8001 : hb & 0x8000 ? hb + 1 : hb - 1));
	const __float128 u = (__half_as_ushort(up) & 0x7c00) == 0x7c00 ? 65536 : __half2float(up);
	const __float128 w = (__half_as_ushort(dn) & 0x7c00) == 0x7c00 ? -65536 : __half2float(dn);
	const __float128 d = v > got ? v - got : got - v;
	const __float128 du = u > v ? u - v : v - u, dd = w > v ? w - v : v - w;
	if (d < du && d < dd)
		return true;
	if (d == du || d == dd)   /* a tie: got must be even */
		return (hb & 1) == 0;
	return false;
}

int main()
{
	/* ---- collectives and barriers ---- */
	int *d = NULL;
	cudaMalloc((void **)&d, 1024 * 4);
	X3K_LAUNCH(shfl_kernel, 1, 32, 0, 0)(d);
	int h[160];
	cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
	bool ok = true;
	for (int l = 0; l < 32; l++)
		ok = ok && h[l] == (l ^ 5) * 10 && h[32 + l] == (l + 3 < 32 ? l + 3 : l) &&
		     h[64 + l] == (l >= 2 ? l - 2 : l) && h[96 + l] == 107 && h[128 + l] == (int)0xaaaaaaaau;
	CHECK(ok && cudaGetLastError() == cudaSuccess, "shfl xor/down/up/idx and ballot");

	std::vector<float> x(1000);
	double ref = 0;
	for (int i = 0; i < 1000; i++)
		ref += x[i] = (float)(i % 7) - 2.5f;
	float *xd, *od, o[3];
	cudaMalloc((void **)&xd, 4000);
	cudaMalloc((void **)&od, 12);
	cudaMemcpy(xd, x.data(), 4000, cudaMemcpyHostToDevice);
	const char *orders[3] = {"fwd", "rev", "rand:5"};
	for (int i = 0; i < 3; i++) {
		cusim::set_order(orders[i]);
		X3K_LAUNCH(reduce_kernel, 3, 256, 0, 0)(xd, 1000, od);
		cudaMemcpy(o, od, 12, cudaMemcpyDeviceToHost);
		CHECK(o[0] == (float)ref && o[2] == (float)ref && cudaGetLastError() == cudaSuccess,
		      "block reduction through shared memory, order %s: %g (want %g)", orders[i],
		      (double)o[0], ref);
	}
	const int rf = run_race("fwd"), rr = run_race("rev");
	CHECK(rf == 63 && rr == 0, "an unordered shared write: last writer %d (fwd) vs %d (rev)", rf, rr);

	{
		const std::vector<int> f = tickets("fwd"), r = tickets("rev"), q = tickets("rand:9");
		bool fo = true, ro = true, perm = true, ident = true;
		int seen = 0;
		for (int i = 0; i < 6; i++) {
			fo = fo && f[i] == i;
			ro = ro && r[i] == 5 - i;
			perm = perm && q[i] >= 0 && q[i] < 6 && !(seen >> q[i] & 1);
			if (q[i] >= 0 && q[i] < 6)
				seen |= 1 << q[i];
			ident = ident && q[i] == i;
		}
		CHECK(fo && ro && perm && !ident && cudaGetLastError() == cudaSuccess,
		      "X3SIM_BLOCKS fwd/rev/rand: blocks in index order, reversed, shuffled "
		      "(%d %d %d %d %d %d)", q[0], q[1], q[2], q[3], q[4], q[5]);
	}

	cusim::set_order("rand:3");
	X3K_LAUNCH(exit_ok_kernel, 1, 64, 0, 0)(d);
	CHECK(outcome() == cudaSuccess, "threads that exited count as arrived at __syncthreads");

	/* ---- errors ---- */
	cusim::set_order("fwd");
	X3K_LAUNCH(diverge_kernel, 1, 64, 0, 0)(d);
	CHECK(outcome() == cudaErrorLaunchFailure, "barrier divergence -> unspecified launch failure");
	X3K_LAUNCH(exited_lane_kernel, 1, 32, 0, 0)(d);
	CHECK(outcome() == cudaErrorLaunchFailure, "shuffle naming an exited lane -> launch failure");
	X3K_LAUNCH(deadlock_kernel, 1, 32, 0, 0)(d);
	CHECK(outcome() == cudaErrorLaunchFailure, "lanes at a shuffle and at __syncthreads: deadlock");
	X3K_LAUNCH(oob_kernel, 1, 32, 0, 0)(xd, 1000);
	CHECK(outcome() == cudaErrorIllegalAddress, "write past a cudaMalloc allocation -> illegal address");
	X3K_LAUNCH(oob_kernel, 1, 32, 0, 0)(xd, 990);
	CHECK(outcome() == cudaErrorIllegalAddress, "write straddling the end -> illegal address");
	X3K_LAUNCH(oob_kernel, 1, 8, 0, 0)(xd, 990);
	CHECK(outcome() == cudaSuccess, "write inside the allocation is fine");
	X3K_LAUNCH(smem_kernel, 1, 1, 4096, 0)(1023);
	CHECK(outcome() == cudaSuccess, "last element of the dynamic shared memory");
	X3K_LAUNCH(smem_kernel, 1, 1, 4096, 0)(1024);
	CHECK(outcome() == cudaErrorIllegalAddress, "one past the dynamic shared memory -> illegal address");
	X3K_LAUNCH(stack_kernel, 1, 2, 0, 0)(d, 1000);
	CHECK(outcome() == cudaErrorIllegalAddress, "stack overflow -> illegal address");
	int host_int = 0;
	X3K_LAUNCH(stack_kernel, 1, 1, 0, 0)(&host_int, 1);
	CHECK(outcome() == cudaErrorIllegalAddress, "host pointer as a kernel argument -> illegal address");
	X3K_LAUNCH(shfl_kernel, 1, 2048, 0, 0)(d);
	CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration && cudaGetLastError() == cudaSuccess,
	      "2048 threads per block: invalid configuration, not sticky");
	X3K_LAUNCH(smem_kernel, 1, 1, 64 * 1024, 0)(0);
	CHECK(cudaGetLastError() == cudaErrorInvalidValue, "64 KiB dynamic shared memory without the attribute");
	CHECK(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) ==
	      cudaSuccess, "raise the limit to 64 KiB");
	X3K_LAUNCH(smem_kernel, 1, 1, 64 * 1024, 0)(16383);
	CHECK(outcome() == cudaSuccess, "64 KiB dynamic shared memory with the attribute");
	CHECK(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 300 * 1024) ==
	      cudaErrorInvalidValue, "300 KiB is above the opt-in limit");
	(void)cudaGetLastError();

	/* ---- memory API ---- */
	size_t fr0, tot, fr1;
	cudaMemGetInfo(&fr0, &tot);
	void *big = NULL;
	CHECK(cudaMalloc(&big, tot + 1) == cudaErrorMemoryAllocation && cudaGetLastError() ==
	      cudaErrorMemoryAllocation && cudaGetLastError() == cudaSuccess,
	      "allocation beyond the device's memory: out of memory, not sticky");
	CHECK(cudaMalloc(&big, 1 << 20) == cudaSuccess && cudaMemGetInfo(&fr1, &tot) == cudaSuccess &&
	      fr0 - fr1 == 1 << 20, "cudaMemGetInfo tracks allocations");
	cudaFree(big);
	CHECK(cudaMemcpy(h, x.data(), 16, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
	      "host-to-device copy into host memory refused");
	CHECK(cudaMemcpy(xd, h, 4096 * 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
	      "copy past the end of an allocation refused");
	CHECK(cudaFree((char *)xd + 4) == cudaErrorInvalidValue, "cudaFree of an inner pointer refused");
	(void)cudaGetLastError();

	/* ---- fp16 ---- */
	bool same = true;
	for (unsigned u = 0; u < 65536; u++) {
		const __half hv = __ushort_as_half((unsigned short)u);
		const float a = __half2float(hv), b = (__half2float)(hv);
		same = same && (memcmp(&a, &b, 4) == 0 || (a != a && b != b));
	}
	CHECK(same, "__half2float equals cuda_fp16.h's for all 65536 values");
	uint64_t s = 12345;
	auto rnd = [&]() { s = s * 6364136223846793005ull + 1442695040888963407ull; return (uint32_t)(s >> 32); };
	same = true;
	for (int i = 0; i < 200000 && same; i++) {
		uint32_t u = rnd();
		float f;
		memcpy(&f, &u, 4);
		if (i & 1)   /* near the fp16 range */
			f = std::ldexp((float)(int)(u >> 8) / (1 << 23), (int)(u & 31) - 20);
		const __half a = __float2half_rn(f), b = (__float2half_rn)(f);
		same = same && (__half_as_ushort(a) == __half_as_ushort(b) || (f != f));
	}
	CHECK(same, "__float2half_rn equals cuda_fp16.h's on 200000 floats");
	int bad = 0;
	for (int i = 0; i < 300000; i++) {
		const uint32_t u = rnd(), v = rnd();
		__half a = __ushort_as_half((unsigned short)u), b = __ushort_as_half((unsigned short)(u >> 16)),
		       c = __ushort_as_half((unsigned short)v);
		if (i & 1)   /* products near c: long sums, many ties */
			c = __ushort_as_half((unsigned short)((__half_as_ushort(a) & 0x83ff) | (v & 0x7c00)));
		if ((__half_as_ushort(a) & 0x7c00) == 0x7c00 || (__half_as_ushort(b) & 0x7c00) == 0x7c00 ||
		    (__half_as_ushort(c) & 0x7c00) == 0x7c00)
			continue;
		if (!hfma_ok(a, b, c, __hfma(a, b, c)) && bad++ < 3)
			printf("#   hfma %04x %04x %04x -> %04x\n", __half_as_ushort(a), __half_as_ushort(b),
			       __half_as_ushort(c), __half_as_ushort(__hfma(a, b, c)));
	}
	CHECK(bad == 0, "__hfma correctly rounded on 300000 random operands (%d wrong)", bad);

	/* ---- cuBLAS / cuSOLVER ---- */
	cublasHandle_t bl;
	CHECK(cublasCreate(&bl) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
	const int m = 37, n = 23, k = 19, lda = 41, ldb = 29, ldc = 40;
	std::vector<float> A((size_t)lda * 40), B((size_t)ldb * 40), C((size_t)ldc * n), C0;
	for (auto &v : A) v = (float)((int)(rnd() % 17) - 8) / 4;
	for (auto &v : B) v = (float)((int)(rnd() % 13) - 6) / 8;
	for (auto &v : C) v = (float)((int)(rnd() % 9) - 4);
	C0 = C;
	float *Ad, *Bd, *Cd;
	cudaMalloc((void **)&Ad, A.size() * 4);
	cudaMalloc((void **)&Bd, B.size() * 4);
	cudaMalloc((void **)&Cd, C.size() * 4);
	cudaMemcpy(Ad, A.data(), A.size() * 4, cudaMemcpyHostToDevice);
	cudaMemcpy(Bd, B.data(), B.size() * 4, cudaMemcpyHostToDevice);
	for (int t = 0; t < 4; t++) {
		const cublasOperation_t ta = t & 1 ? CUBLAS_OP_T : CUBLAS_OP_N, tb = t & 2 ? CUBLAS_OP_T : CUBLAS_OP_N;
		const float al = 0.5f, be = t == 3 ? 0.0f : 2.0f;
		std::vector<float> Cn = C0;
		if (be == 0)
			for (auto &v : Cn) v = NAN;   /* beta 0 must not read C */
		cudaMemcpy(Cd, Cn.data(), C.size() * 4, cudaMemcpyHostToDevice);
		cublasStatus_t st = cublasSgemm(bl, ta, tb, m, n, k, &al, Ad, ta ? lda : lda, Bd, ldb, &be, Cd, ldc);
		cudaMemcpy(C.data(), Cd, C.size() * 4, cudaMemcpyDeviceToHost);
		double err = 0;
		for (int j = 0; j < n; j++)
			for (int i = 0; i < m; i++) {
				double r = be ? be * C0[(size_t)j * ldc + i] : 0;
				for (int q = 0; q < k; q++)
					r += al * (double)(ta ? A[(size_t)i * lda + q] : A[(size_t)q * lda + i]) *
					     (tb ? B[(size_t)q * ldb + j] : B[(size_t)j * ldb + q]);
				err = std::fmax(err, std::fabs(r - C[(size_t)j * ldc + i]));
			}
		CHECK(st == CUBLAS_STATUS_SUCCESS && err == 0, "cublasSgemm %c%c column-major (max error %g)",
		      ta ? 'T' : 'N', tb ? 'T' : 'N', err);
	}
	const float one = 1, zero = 0;
	CHECK(cublasSgemm(bl, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, Ad, m - 1, Bd, ldb, &zero, Cd, ldc) ==
	      CUBLAS_STATUS_INVALID_VALUE, "lda < m refused");
	CHECK(cublasSgemm(bl, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A.data(), lda, Bd, ldb, &zero, Cd, ldc) ==
	      CUBLAS_STATUS_EXECUTION_FAILED && outcome() == cudaErrorIllegalAddress,
	      "host matrix -> execution failed, illegal address");
	/* GemmEx fp16 x fp16 -> fp32 */
	std::vector<__half> Ah((size_t)m * k), Bh((size_t)k * n);
	for (size_t i = 0; i < Ah.size(); i++) Ah[i] = __float2half_rn(A[i] * 1.37f);
	for (size_t i = 0; i < Bh.size(); i++) Bh[i] = __float2half_rn(B[i] * 0.61f);
	__half *Ahd, *Bhd;
	cudaMalloc((void **)&Ahd, Ah.size() * 2);
	cudaMalloc((void **)&Bhd, Bh.size() * 2);
	cudaMemcpy(Ahd, Ah.data(), Ah.size() * 2, cudaMemcpyHostToDevice);
	cudaMemcpy(Bhd, Bh.data(), Bh.size() * 2, cudaMemcpyHostToDevice);
	cublasStatus_t st = cublasGemmEx(bl, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, Ahd, CUDA_R_16F, m, Bhd,
	                                 CUDA_R_16F, k, &zero, Cd, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
	                                 CUBLAS_GEMM_DEFAULT);
	cudaMemcpy(C.data(), Cd, (size_t)m * n * 4, cudaMemcpyDeviceToHost);
	double err = 0;
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			double r = 0;
			for (int q = 0; q < k; q++)
				r += (double)__half2float(Ah[(size_t)q * m + i]) * __half2float(Bh[(size_t)j * k + q]);
			err = std::fmax(err, std::fabs(r - C[(size_t)j * m + i]));
		}
	CHECK(st == CUBLAS_STATUS_SUCCESS && err < 1e-4, "cublasGemmEx fp16 inputs, fp32 output (max error %g)", err);
	/* SSYRK lower: C (n x n) += A A^T, upper untouched */
	std::vector<float> S((size_t)n * n, 7.0f);
	cudaMemcpy(Cd, S.data(), S.size() * 4, cudaMemcpyHostToDevice);
	st = cublasSsyrk(bl, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, n, k, &one, Ad, lda, &one, Cd, n);
	cudaMemcpy(S.data(), Cd, S.size() * 4, cudaMemcpyDeviceToHost);
	err = 0;
	bool upper = true;
	for (int j = 0; j < n; j++)
		for (int i = 0; i < n; i++) {
			if (i < j) {
				upper = upper && S[(size_t)j * n + i] == 7.0f;
				continue;
			}
			double r = 7;
			for (int q = 0; q < k; q++)
				r += (double)A[(size_t)q * lda + i] * A[(size_t)q * lda + j];
			err = std::fmax(err, std::fabs(r - S[(size_t)j * n + i]));
		}
	CHECK(st == CUBLAS_STATUS_SUCCESS && err == 0 && upper, "cublasSsyrk lower (error %g, upper untouched %d)",
	      err, upper);
	cublasDestroy(bl);
	/* SPOTRF: identity with a -1 pivot at 3 -> info 4 */
	cusolverDnHandle_t so;
	CHECK(cusolverDnCreate(&so) == CUSOLVER_STATUS_SUCCESS, "cusolverDnCreate");
	std::vector<float> P(64 * 64, 0.0f);
	for (int i = 0; i < 64; i++)
		P[i * 64 + i] = i == 3 ? -1.0f : 4.0f;
	int lw = 0, info = -9, *infod;
	float *Pd, *wd;
	cudaMalloc((void **)&Pd, P.size() * 4);
	cudaMalloc((void **)&infod, 4);
	cudaMemcpy(Pd, P.data(), P.size() * 4, cudaMemcpyHostToDevice);
	cusolverDnSpotrf_bufferSize(so, CUBLAS_FILL_MODE_UPPER, 64, Pd, 64, &lw);
	cudaMalloc((void **)&wd, (size_t)lw * 4);
	CHECK(cusolverDnSpotrf(so, CUBLAS_FILL_MODE_UPPER, 64, Pd, 64, wd, lw - 1, infod) ==
	      CUSOLVER_STATUS_INVALID_VALUE, "spotrf with a short workspace refused");
	cusolverStatus_t ss = cusolverDnSpotrf(so, CUBLAS_FILL_MODE_UPPER, 64, Pd, 64, wd, lw, infod);
	cudaMemcpy(&info, infod, 4, cudaMemcpyDeviceToHost);
	CHECK(ss == CUSOLVER_STATUS_SUCCESS && info == 4, "spotrf of an indefinite matrix: info %d", info);
	P[3 * 64 + 3] = 9.0f;
	cudaMemcpy(Pd, P.data(), P.size() * 4, cudaMemcpyHostToDevice);
	ss = cusolverDnSpotrf(so, CUBLAS_FILL_MODE_UPPER, 64, Pd, 64, wd, lw, infod);
	cudaMemcpy(&info, infod, 4, cudaMemcpyDeviceToHost);
	cudaMemcpy(P.data(), Pd, P.size() * 4, cudaMemcpyDeviceToHost);
	CHECK(ss == CUSOLVER_STATUS_SUCCESS && info == 0 && P[3 * 64 + 3] == 3.0f && P[0] == 2.0f,
	      "spotrf of a diagonal matrix: sqrt on the diagonal");
	cusolverDnDestroy(so);
	cudaFree(d), cudaFree(xd), cudaFree(od), cudaFree(Ad), cudaFree(Bd), cudaFree(Cd);
	cudaFree(Ahd), cudaFree(Bhd), cudaFree(Pd), cudaFree(infod), cudaFree(wd);
	printf("# %d checks, %d failed\n", n_test, n_fail);
	return n_fail != 0;
}
