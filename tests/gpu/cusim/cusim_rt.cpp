/* cusim_rt.cpp: the CUDA runtime API of cusim (device memory is host
 * memory): the functions exl3kit's host code and kernels call, with the
 * runtime's contracts (argument checks, error codes, the last error and
 * sticky errors). One emulated device:
 *   "cusim (emulated sm_90 on the CPU)", 8 SMs, 48 KiB shared memory per
 *   block by default, 227 KiB opt-in, 228 KiB per SM, L2 50 MiB,
 *   16 GiB of memory (X3SIM_MEM=BYTES[K|M|G] caps it, so that
 *   out-of-memory paths can be tested); X3SIM_NODEVICE=1 emulates a
 *   machine without a device.
 * Each allocation ends (16-byte aligned, where a device aligns to 256) at
 * a page boundary followed by an inaccessible page (out-of-bounds accesses
 * past the end fault and are reported), is filled
 * with 0xff bytes (NaN floats: reads of memory never written show), and is
 * unmapped when freed (use after free faults). */
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

#include "cusim_rt.h"

namespace cusim {

#define SMS 8
#define SMEM_DEFAULT (48 * 1024)
#define SMEM_OPTIN (227 * 1024)
#define SMEM_SM (228 * 1024)
#define L2_BYTES (50 * 1024 * 1024)

struct Alloc {
	char *map;
	size_t map_bytes, bytes;
};
static std::map<uintptr_t, Alloc> allocs;   /* by start address */
static size_t used, total;
static int last_error, sticky;
static std::string sticky_msg;
static std::map<const void *, int> func_max_dyn;
static bool inited, nodevice;

std::recursive_mutex &rt_lock()
{
	static std::recursive_mutex m;
	return m;
}
#define LOCK std::lock_guard<std::recursive_mutex> lock_(rt_lock())

static void init()
{
	if (inited)
		return;
	inited = true;
	total = (size_t)16 << 30;
	if (const char *s = getenv("X3SIM_MEM")) {
		char *end;
		double v = strtod(s, &end);
		if (*end == 'K' || *end == 'k')
			v *= 1024;
		else if (*end == 'M' || *end == 'm')
			v *= 1024 * 1024;
		else if (*end == 'G' || *end == 'g')
			v *= 1024.0 * 1024 * 1024;
		if (v > 0)
			total = (size_t)v;
	}
	const char *n = getenv("X3SIM_NODEVICE");
	nodevice = n && *n && strcmp(n, "0");
}

static cudaError_t ret(int e)
{
	if (e)
		last_error = e;
	return (cudaError_t)e;
}

/* the error of a call that needs the device */
static int device_state()
{
	init();
	if (nodevice)
		return cudaErrorNoDevice;
	return sticky;
}

int rt_sticky() { return sticky; }

void rt_set_sticky(int err, const char *msg)
{
	if (!sticky) {
		sticky = err;
		sticky_msg = msg;
	}
	last_error = err;
}

static const Alloc *find(const void *p, uintptr_t *start)
{
	const uintptr_t a = (uintptr_t)p;
	auto it = allocs.upper_bound(a);
	if (it == allocs.begin())
		return NULL;
	--it;
	*start = it->first;
	return &it->second;
}

bool rt_is_device(const void *p, size_t bytes)
{
	LOCK;
	uintptr_t s;
	const Alloc *al = find(p, &s);
	return al && (uintptr_t)p + bytes <= s + al->bytes && (uintptr_t)p <= s + al->bytes;
}

std::string rt_describe_address(const void *a)
{
	char b[200];
	for (const auto &kv : allocs) {
		const Alloc &al = kv.second;
		const char *guard = al.map + al.map_bytes - sysconf(_SC_PAGESIZE);
		if ((const char *)a >= guard && (const char *)a < al.map + al.map_bytes) {
			snprintf(b, sizeof b, "%zu bytes past the end of a %zu-byte device allocation at %p",
			         (size_t)((const char *)a - (const char *)kv.first) - al.bytes, al.bytes,
			         (void *)kv.first);
			return b;
		}
	}
	return "not device memory (a host pointer, a freed allocation or a wild index)";
}

static const Alloc *range_check(const void *p, size_t bytes, const char *what)
{
	uintptr_t s;
	const Alloc *al = find(p, &s);
	if (!al || (uintptr_t)p + bytes > s + al->bytes)
		return NULL;
	(void)what;
	return al;
}

int rt_check_launch(const void *func, dim3 grid, dim3 block, size_t smem, cudaStream_t stream)
{
	int e = device_state();
	if (e)
		return ret(e);
	if (grid.x < 1 || grid.x > 0x7fffffffu || grid.y < 1 || grid.y > 65535 || grid.z < 1 ||
	    grid.z > 65535 || block.x < 1 || block.y < 1 || block.z < 1 || block.x > 1024 ||
	    block.y > 1024 || block.z > 64 || (uint64_t)block.x * block.y * block.z > 1024)
		return ret(cudaErrorInvalidConfiguration);
	auto it = func_max_dyn.find(func);
	const size_t maxdyn = it == func_max_dyn.end() ? SMEM_DEFAULT : (size_t)it->second;
	if (smem > maxdyn)
		return ret(cudaErrorInvalidValue);
	if (stream != NULL && stream != cudaStreamLegacy && stream != cudaStreamPerThread)
		return ret(cudaErrorInvalidResourceHandle);
	return 0;
}

} /* namespace cusim */

using namespace cusim;

extern "C" {

cudaError_t cudaGetLastError(void)
{
	LOCK;
	int e = sticky ? sticky : last_error;
	last_error = 0;
	return (cudaError_t)e;
}

cudaError_t cudaPeekAtLastError(void)
{
	return (cudaError_t)(sticky ? sticky : last_error);
}

const char *cudaGetErrorName(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "cudaSuccess";
	case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
	case cudaErrorInitializationError: return "cudaErrorInitializationError";
	case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
	case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
	case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
	case cudaErrorNoDevice: return "cudaErrorNoDevice";
	case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
	case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
	case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
	case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
	default: return "cudaErrorUnknown";
	}
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInitializationError: return "initialization error";
	case cudaErrorLaunchFailure: return "unspecified launch failure";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorInvalidDevicePointer: return "invalid device pointer";
	case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
	default: return "unknown error";
	}
}

cudaError_t cudaGetDeviceCount(int *n)
{
	init();
	if (!n)
		return ret(cudaErrorInvalidValue);
	if (nodevice) {
		*n = 0;
		return ret(cudaErrorNoDevice);
	}
	*n = 1;
	return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
	int e = device_state();
	if (e == cudaErrorNoDevice)
		return ret(e);
	if (!d)
		return ret(cudaErrorInvalidValue);
	*d = 0;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
	int e = device_state();
	if (e == cudaErrorNoDevice)
		return ret(e);
	return d == 0 ? cudaSuccess : ret(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
	int e = device_state();
	if (e == cudaErrorNoDevice)
		return ret(e);
	if (!p)
		return ret(cudaErrorInvalidValue);
	if (d != 0)
		return ret(cudaErrorInvalidDevice);
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "cusim (emulated sm_90 on the CPU)");
	p->totalGlobalMem = total;
	p->sharedMemPerBlock = SMEM_DEFAULT;
	p->sharedMemPerBlockOptin = SMEM_OPTIN;
	p->sharedMemPerMultiprocessor = SMEM_SM;
	p->reservedSharedMemPerBlock = 1024;
	p->regsPerBlock = 65536;
	p->regsPerMultiprocessor = 65536;
	p->warpSize = 32;
	p->maxThreadsPerBlock = 1024;
	p->maxThreadsDim[0] = 1024;
	p->maxThreadsDim[1] = 1024;
	p->maxThreadsDim[2] = 64;
	p->maxGridSize[0] = 0x7fffffff;
	p->maxGridSize[1] = 65535;
	p->maxGridSize[2] = 65535;
	p->totalConstMem = 65536;
	p->major = 9;
	p->minor = 0;
	p->multiProcessorCount = SMS;
	p->l2CacheSize = L2_BYTES;
	p->maxThreadsPerMultiProcessor = 2048;
	p->maxBlocksPerMultiProcessor = 32;
	p->unifiedAddressing = 1;
	p->concurrentKernels = 1;
	p->memoryBusWidth = 5120;
	return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d)
{
	int e = device_state();
	if (e == cudaErrorNoDevice)
		return ret(e);
	if (!v)
		return ret(cudaErrorInvalidValue);
	if (d != 0)
		return ret(cudaErrorInvalidDevice);
	switch (a) {
	case cudaDevAttrMultiProcessorCount: *v = SMS; break;
	case cudaDevAttrMaxSharedMemoryPerBlock: *v = SMEM_DEFAULT; break;
	case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = SMEM_OPTIN; break;
	case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = SMEM_SM; break;
	case cudaDevAttrL2CacheSize: *v = L2_BYTES; break;
	case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
	case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
	case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
	case cudaDevAttrMaxThreadsPerMultiProcessor: *v = 2048; break;
	case cudaDevAttrMaxBlocksPerMultiprocessor: *v = 32; break;
	case cudaDevAttrWarpSize: *v = 32; break;
	case cudaDevAttrMaxRegistersPerBlock: *v = 65536; break;
	case cudaDevAttrMaxGridDimX: *v = 0x7fffffff; break;
	case cudaDevAttrMaxGridDimY: *v = 65535; break;
	case cudaDevAttrMaxGridDimZ: *v = 65535; break;
	case cudaDevAttrMaxBlockDimX: *v = 1024; break;
	case cudaDevAttrMaxBlockDimY: *v = 1024; break;
	case cudaDevAttrMaxBlockDimZ: *v = 64; break;
	default: return ret(cudaErrorInvalidValue);
	}
	return cudaSuccess;
}

/* static __shared__ variables are not measured: sharedSizeBytes is 0 */
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *fa, const void *f)
{
	LOCK;
	int e = device_state();
	if (e)
		return ret(e);
	if (!fa || !f)
		return ret(cudaErrorInvalidDeviceFunction);
	memset(fa, 0, sizeof *fa);
	auto it = func_max_dyn.find(f);
	fa->maxDynamicSharedSizeBytes = it == func_max_dyn.end() ? SMEM_DEFAULT : it->second;
	fa->maxThreadsPerBlock = 1024;
	fa->numRegs = 32;
	fa->ptxVersion = 90;
	fa->binaryVersion = 90;
	fa->preferredShmemCarveout = -1;
	return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *f, enum cudaFuncAttribute a, int v)
{
	LOCK;
	int e = device_state();
	if (e)
		return ret(e);
	if (!f)
		return ret(cudaErrorInvalidDeviceFunction);
	switch (a) {
	case cudaFuncAttributeMaxDynamicSharedMemorySize:
		if (v < 0 || v > SMEM_OPTIN)
			return ret(cudaErrorInvalidValue);
		func_max_dyn[f] = v;
		return cudaSuccess;
	case cudaFuncAttributePreferredSharedMemoryCarveout:
		return v < -1 || v > 100 ? ret(cudaErrorInvalidValue) : cudaSuccess;
	default:
		return ret(cudaErrorInvalidValue);
	}
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, const void *f, int threads,
                                                                  size_t smem, unsigned flags)
{
	int e = device_state();
	if (e)
		return ret(e);
	if (!n || !f || threads < 1 || threads > 1024)
		return ret(cudaErrorInvalidValue);
	auto it = func_max_dyn.find(f);
	const size_t maxdyn = it == func_max_dyn.end() ? SMEM_DEFAULT : (size_t)it->second;
	if (smem > maxdyn) {
		*n = 0;
		return cudaSuccess;
	}
	int b = 2048 / (((threads + 31) / 32) * 32);
	if (b > 32)
		b = 32;
	const int bs = (int)(SMEM_SM / (smem + 1024));
	*n = b < bs ? b : bs;
	return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
	LOCK;
	int e = device_state();
	if (e)
		return ret(e);
	if (!p)
		return ret(cudaErrorInvalidValue);
	if (bytes == 0) {
		*p = NULL;
		return cudaSuccess;
	}
	const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	const size_t r = (bytes + 255) / 256 * 256;
	if (r < bytes || r > total - used)
		return ret(cudaErrorMemoryAllocation);
	/* the end of the allocation (16-byte aligned: a device aligns to 256,
	 * which would leave up to 255 unchecked bytes) touches the guard page */
	const size_t r16 = (bytes + 15) / 16 * 16;
	const size_t mb = (r16 + pg - 1) / pg * pg + pg;
	char *m = (char *)mmap(NULL, mb, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return ret(cudaErrorMemoryAllocation);
	mprotect(m + mb - pg, pg, PROT_NONE);
	char *q = m + mb - pg - r16;
	memset(q, 0xff, r16);
	allocs[(uintptr_t)q] = Alloc{m, mb, bytes};
	used += r;
	*p = q;
	return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
	LOCK;
	if (!p)
		return cudaSuccess;
	auto it = allocs.find((uintptr_t)p);
	if (it == allocs.end())
		return ret(cudaErrorInvalidValue);
	munmap(it->second.map, it->second.map_bytes);
	used -= (it->second.bytes + 255) / 256 * 256;
	allocs.erase(it);
	return (cudaError_t)sticky;
}

cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot)
{
	LOCK;
	int e = device_state();
	if (e)
		return ret(e);
	if (!fr || !tot)
		return ret(cudaErrorInvalidValue);
	*fr = total - used;
	*tot = total;
	return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	LOCK;
	int e = device_state();
	if (e)
		return ret(e);
	if (n == 0)
		return cudaSuccess;
	if (!dst || !src)
		return ret(cudaErrorInvalidValue);
	const bool dd = range_check(dst, n, "dst"), sd = range_check(src, n, "src");
	switch (kind) {
	case cudaMemcpyHostToDevice:
		if (!dd || sd)
			return ret(cudaErrorInvalidValue);
		break;
	case cudaMemcpyDeviceToHost:
		if (!sd || dd)
			return ret(cudaErrorInvalidValue);
		break;
	case cudaMemcpyDeviceToDevice:
		if (!sd || !dd)
			return ret(cudaErrorInvalidValue);
		break;
	case cudaMemcpyHostToHost:
	case cudaMemcpyDefault:
		break;
	default:
		return ret(cudaErrorInvalidMemcpyDirection);
	}
	memmove(dst, src, n);
	return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
	if (s != NULL)
		return ret(cudaErrorInvalidResourceHandle);
	return cudaMemcpy(dst, src, n, kind);
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
	LOCK;
	int e = device_state();
	if (e)
		return ret(e);
	if (n == 0)
		return cudaSuccess;
	if (!range_check(p, n, "memset"))
		return ret(cudaErrorInvalidValue);
	memset(p, v, n);
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
	if (s != NULL)
		return ret(cudaErrorInvalidResourceHandle);
	return cudaMemset(p, v, n);
}

/* work runs at launch: synchronizing returns the device's sticky error */
cudaError_t cudaDeviceSynchronize(void)
{
	int e = device_state();
	return e ? ret(e) : cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	int e = device_state();
	if (e)
		return ret(e);
	return s == NULL ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

/* clears a sticky error (the allocations stay valid: unlike a device, the
 * emulator does not lose them) */
cudaError_t cudaDeviceReset(void)
{
	LOCK;
	sticky = 0;
	last_error = 0;
	sticky_msg.clear();
	func_max_dyn.clear();
	return cudaSuccess;
}

} /* extern "C" */
