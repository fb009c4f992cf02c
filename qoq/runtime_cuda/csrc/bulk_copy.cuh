// Hopper (sm_90) bulk async copies completing on shared-memory mbarriers, and the thread-block
// cluster primitives a multicast or a cross-block sum needs (used by the GEMVs, the wgmma kernels and by
// bench/kv4_stream_ceiling.cu).
// Multicast here is an SM-to-SM copy inside one GPU, not NVLink multicast.
#pragma once

#include <cstdint>

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // declared for the host pass, built for sm_90+
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t n;
  asm("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}

// Every thread of every block of the cluster; orders mbarrier inits before multicasts to them.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The same barrier where it only has to publish mbarrier inits (mbarrier_init's fence.mbarrier_init
// releases them cluster-wide): a relaxed arrive. barrier.cluster.arrive's default release semantics
// compile to a GPU-scope MEMBAR and an ERRBAR in every thread, where a cluster GEMV's warps stalled
// at its start.
__device__ __forceinline__ void cluster_sync_after_init() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Four int32 from another block of the cluster's shared memory (`addr`: the same offset in this block).
__device__ __forceinline__ int4 load_cluster_int4(uint32_t addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  int4 v;
  asm volatile("ld.shared::cluster.v4.s32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(remote) : "memory");
  return v;
}

// One thread: an mbarrier for one arrival (plus the bytes it expects), visible cluster-wide.
__device__ __forceinline__ void mbarrier_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The arrival: the current phase completes once `bytes` more have landed.
__device__ __forceinline__ void mbarrier_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// `bytes` (a multiple of 16) from global memory into the same shared-memory offset of every block in
// `mask` (a cluster's block ranks; 1: this block only, no multicast), counted on the mbarrier there.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                          uint16_t mask = 1) {
  if (mask == 1) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "h"(mask) : "memory");
  }
}

// One box of a 2-D tensor map (its swizzle applied; coordinates innermost first, out-of-bounds
// elements read as zeros) into shared memory, counted on the mbarrier.
__device__ __forceinline__ void tensor_copy_2d(uint32_t dst, const void* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

// One box of a 4-D tensor map (no swizzle: the box lands densely, innermost dimension first).
__device__ __forceinline__ void tensor_copy_4d(uint32_t dst, const void* map, int c0, int c1, int c2, int c3,
                                               uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
      ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  }
}
#endif
