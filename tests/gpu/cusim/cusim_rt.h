/* cusim_rt.h: between the execution core (cusim.cpp) and the emulated
 * CUDA runtime (cusim_rt.cpp) of cusim. Internal. */
#ifndef X3_CUSIM_RT_H
#define X3_CUSIM_RT_H
#include <cuda_runtime.h>
#include <cstddef>
#include <mutex>
#include <string>

namespace cusim {
/* launch configuration check (sets the last error); 0 or a cudaError_t */
int rt_check_launch(const void *func, dim3 grid, dim3 block, size_t smem, cudaStream_t stream);
/* the device's sticky error (0 if none), and setting it */
int rt_sticky();
void rt_set_sticky(int err, const char *msg);
/* what address a is, for an illegal-address report */
std::string rt_describe_address(const void *a);
/* 1 if [p, p + bytes) lies in one live cudaMalloc allocation */
bool rt_is_device(const void *p, size_t bytes);
/* one lock for the emulated device: launches, allocations and the error
 * state (host threads may call the runtime concurrently, as with CUDA) */
std::recursive_mutex &rt_lock();
/* fiber switches so far (for the benchmark line) */
uint64_t switches();
}
#endif
