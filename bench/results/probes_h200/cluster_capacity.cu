// How many thread-block clusters of 2, 4 or 8 blocks the GPU holds at once, for blocks of which an SM
// holds 1, 2 or 4 (set by dynamic shared memory): whether a one-wave GEMV grid of 128 single-block-per-SM
// blocks can run as 32 clusters of 4 (seventeenth session, ../ab_h200/ab_gemv16_k_parts4_*.json).
//   nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a cluster_capacity.cu -o cluster_capacity
//   ./cluster_capacity > cluster_capacity.jsonl
#include <cstdio>

#include <cuda_runtime.h>

__global__ void probe_kernel(int* out) {
  extern __shared__ int smem[];
  smem[threadIdx.x] = threadIdx.x;
  if (threadIdx.x == 0 && out != nullptr) out[blockIdx.x] = smem[0];
}

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  const int threads[] = {256, 512};
  const int smem_kb[] = {150, 100, 50};  // 1, 2, 4 blocks an SM by shared memory
  const int clusters[] = {1, 2, 4, 8, 16};
  for (int t : threads)
    for (int kb : smem_kb) {
      int per_sm = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, probe_kernel, t, kb * 1024);
      for (int c : clusters) {
        cudaLaunchConfig_t config{};
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim = {static_cast<unsigned>(c), 1, 1};
        config.gridDim = dim3(c * 64);
        config.blockDim = dim3(t);
        config.dynamicSmemBytes = kb * 1024;
        config.attrs = &attr;
        config.numAttrs = 1;
        int active = 0;
        const cudaError_t err = cudaOccupancyMaxActiveClusters(&active, probe_kernel, &config);
        std::printf("{\"gpu\": \"%s\", \"sms\": %d, \"threads\": %d, \"smem_kb\": %d, \"blocks_per_sm\": %d, "
                    "\"cluster\": %d, \"max_active_clusters\": %d, \"blocks\": %d, \"error\": \"%s\"}\n",
                    prop.name, prop.multiProcessorCount, t, kb, per_sm, c, active, active * c,
                    cudaGetErrorString(err));
      }
    }
  return 0;
}
