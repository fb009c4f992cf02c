// Eight fp16 values in one 16-byte word, as floats (shared by the GEMM epilogue and quant_act.cu).
#pragma once

#include <cuda_fp16.h>

__device__ __forceinline__ void unpack_half8(const uint4& v, float (&f)[8]) {
  const half2* h = reinterpret_cast<const half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = __half22float2(h[i]);
    f[2 * i] = pair.x;
    f[2 * i + 1] = pair.y;
  }
}
