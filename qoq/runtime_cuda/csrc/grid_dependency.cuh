// Programmatic dependent launch (Hopper): a kernel launched with the programmatic stream serialization
// attribute may start while the kernel ahead of it in the stream still runs. It reads what that kernel
// cannot have written (the weights) before wait_prior_grids, and everything else after it. Both are
// no-ops before sm_90 and in a kernel launched without the attribute.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

// Launch `kernel` on `grid` blocks of `threads` with `smem` bytes of dynamic shared memory, in clusters
// of `cluster` blocks (1 x 1 x 1: none) and, with `dependent`, as a programmatic dependent. The one
// launch path of the GEMM and attention kernels that take either attribute.
template <typename... Params, typename... Args>
cudaError_t launch_with_attributes(void (*kernel)(Params...), dim3 grid, int threads, int smem, dim3 cluster,
                                   bool dependent, cudaStream_t stream, const Args&... args) {
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n++].val.clusterDim = {cluster.x, cluster.y, cluster.z};
  }
  if (dependent) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// What a programmatic dependent reads after wait_prior_grids, from a kernel that may still have been
// writing it at launch (activations, q, KV pages): loaded through L2 (.cg) and never as a non-coherent
// load (ld.global.nc, __ldg, const __restrict__). A non-coherent load promises that its bytes do not
// change while the kernel runs, so ptxas may hoist it above griddepcontrol.wait; it did, and the
// persistent GEMV read its activation tiles before the quantization kernel ahead had written them.
// Volatile, so the compiler keeps it after the wait (itself volatile asm).
__device__ __forceinline__ uint4 load_after_wait16(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

__device__ __forceinline__ uint32_t load_after_wait4(const void* ptr) {
  uint32_t v;
  asm volatile("ld.global.cg.u32 %0, [%1];\n" : "=r"(v) : "l"(ptr));
  return v;
}

__device__ __forceinline__ uint64_t load_after_wait8(const void* ptr) {
  uint64_t v;
  asm volatile("ld.global.cg.u64 %0, [%1];\n" : "=l"(v) : "l"(ptr));
  return v;
}

// Until the kernels ahead in the stream have completed and their writes are visible.
__device__ __forceinline__ void wait_prior_grids() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The kernel after this one may start once every block has called this (or exited); a hint only,
// correctness rests on the dependent's wait_prior_grids.
__device__ __forceinline__ void allow_dependent_grids() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
