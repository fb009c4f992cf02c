// PTX wrappers of the W4A8 GEMMs that need no torch headers: the int8 MMA and the streaming 16-byte
// loads. gemm_w4a8.cuh includes them, and so does bench/gemv_stream_probe.cu (a standalone nvcc build).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace qoq_gemm {

// d += A (s8) x B (s8, or u8 when B_UNSIGNED: the biased per-group fragments W8 + 128, or per-channel
// codes 0..15), s32.
template <bool B_UNSIGNED>
__device__ __forceinline__ void mma_16832(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#define QOQ_MMA_16832(BTYPE)                                                                                  \
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8." BTYPE ".s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])                                                       \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
  if constexpr (B_UNSIGNED) QOQ_MMA_16832("u8");
  else QOQ_MMA_16832("s8");
#undef QOQ_MMA_16832
}

// Streamed once: skip L1 so the activations stay there.
__device__ __forceinline__ uint4 load_stream16(const void* ptr) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr));
  return v;
}

// load_stream16 that the compiler keeps where it is among the other volatile asm (ldmatrix): issued
// only once the registers it fills have been used.
__device__ __forceinline__ uint4 load_stream16_ordered(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

}  // namespace qoq_gemm
