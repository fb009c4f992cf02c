// Device building blocks of the W4A8 GEMMs (docs/design.md §3.1, §3.2, §4).
//
// The artifact's qweight is already in compute order: inside each 32x32 tile (512 bytes), lane
// L = 4c+e owns 16 bytes = words w[2d+b], byte f of w[2d+b] holding
// Q[8b+c, 16d+4e+f] (low nibble) and Q[16+8b+c, same k] (high nibble). These are exactly the
// mma.m16n8k32 B fragments (register d) of the four n8 blocks j = 0..3 (rows 8j+c).
#pragma once

#include <cstdint>
#include <cuda_fp16.h>

#include "gemm_w4a8_params.h"
#include "gemm_w4a8_ptx.cuh"
#include "half8.cuh"

namespace qoq_gemm {

constexpr int SCALE_SPAN = 64;  // staged kernels keep one s2/-z row per 64 k (every group size is a multiple)

// Level-1 scales of the four n8 blocks this lane feeds (rows c, c+8, c+16, c+24): one 32-bit word
// of the interleaved s2 / -z rows, byte j for block j.
struct GroupScales {
  uint32_t s2[4];       // s2 of block j, a multiplier for four packed bytes
  uint32_t zero_lo[4];  // -z of block j in all four bytes, low 7 bits of each byte
  uint32_t zero_hi[4];  // ... and the top bit of each byte
  // codes q of block j (4 bytes) -> W8 = q*s2 + (-z) byte-parallel (q*s2 <= 255 never carries; the
  // sum wraps to the int8 W8): per byte modulo 256, the low 7 bits add and the top bits xor in
  __device__ __forceinline__ uint32_t apply(uint32_t q, int j) const {
    const uint32_t a = q * s2[j];
    return ((a & 0x7f7f7f7fu) + zero_lo[j]) ^ (a & 0x80808080u) ^ zero_hi[j];
  }
};

__device__ __forceinline__ GroupScales unpack_group_scales(uint32_t s2_word, uint32_t zero_word) {
  GroupScales gs;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    gs.s2[j] = (s2_word >> (8 * j)) & 0xffu;
    const uint32_t zero = __byte_perm(zero_word, 0, 0x1111 * j);
    gs.zero_lo[j] = zero & 0x7f7f7f7fu;
    gs.zero_hi[j] = zero & 0x80808080u;
  }
  return gs;
}

// Per group the weight fragments can be W8 + 128 = q*s2 + (128 - z*s2) as u8, one IMAD per 4 weights:
// q*s2 <= 255 and 128 - z*s2 >= 0 per byte, and their sum is W8 + 128 in [9, 247], so no byte
// carries into the next. The MMA then sums (W8 + 128)*x (int32 holds it for K < 68000: 247*127*K);
// 128 * (the token's sum of x over K) comes off before the epilogue (wgmma and GEMV kernels).
template <int BLOCKS>
struct BiasedScales {
  uint32_t s2[BLOCKS];    // s2 of the warp's n8 blocks first, first+1, ...
  uint32_t bias[BLOCKS];  // 128 - z*s2 of each in all four bytes
  // codes q of block j (4 bytes) -> W8 + 128 as u8 bytes
  __device__ __forceinline__ uint32_t apply(uint32_t q, int j) const { return q * s2[j] + bias[j]; }
};

template <int BLOCKS>
__device__ __forceinline__ BiasedScales<BLOCKS> unpack_biased_scales(uint32_t s2_word, uint32_t zero_word, int first) {
  BiasedScales<BLOCKS> bs;
  const uint32_t biases = zero_word ^ 0x80808080u;  // -z*s2 + 128 (mod 256), per byte
#pragma unroll
  for (int jj = 0; jj < BLOCKS; ++jj) {
    const int j = first + jj;
    bs.s2[jj] = __byte_perm(s2_word, 0, 0x4440 + j);  // byte j, zero-extended
    bs.bias[jj] = __byte_perm(biases, 0, 0x1111 * j);  // byte j in all four
  }
  return bs;
}

// Row of the per-group tables (s2, -z) that holds k: a shift for the power-of-two groups of the
// recipes (64, 128), a division only otherwise (an integer division per k-step, in the one warp that
// copies the tables, held back the whole block).
__device__ __forceinline__ int group_row(int k, int group) {
  return (group & (group - 1)) == 0 ? k >> (__ffs(group) - 1) : k / group;
}

// 16 packed bytes of one lane -> B fragments b[j][d] of the n8 blocks j: the codes, or per group
// scales.apply of them (GroupScales: the int8 W8; BiasedScales<4>: W8 + 128 for mma_16832<true>).
template <bool GROUPED, class Scales>
__device__ __forceinline__ void dequant_tile(const uint4& packed, const Scales& scales, uint32_t (&b)[4][2]) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int d = 0; d < 2; ++d) {
      const uint32_t q = (words[2 * d + (j & 1)] >> (4 * (j >> 1))) & 0x0f0f0f0fu;
      b[j][d] = GROUPED ? scales.apply(q, j) : q;
    }
  }
}

// Epilogue of one output element: §3.1 (acc*s_x)*s1, or §3.2 minus z*Σx; plus bias. Explicitly
// rounded operations (never contracted into FMAs) in IntegerLinear's order: the same fp32 result.
__device__ __forceinline__ float epilogue(const GemmParams& p, int row, int col, int acc) {
  float y = __fmul_rn(__fmul_rn(static_cast<float>(acc), __half2float(p.s_x[row])), __half2float(p.s1[col]));
  if (p.szero != nullptr) y = __fsub_rn(y, __fmul_rn(p.xsum[row], __half2float(p.szero[col])));
  if (p.bias != nullptr) y = __fadd_rn(y, __half2float(p.bias[col]));
  return y;
}

// Eight neighbouring fp16 column terms (16-byte aligned) as floats.
__device__ __forceinline__ void load_halves8(const __half* src, float (&v)[8]) {
  unpack_half8(*reinterpret_cast<const uint4*>(src), v);
}

// Eight neighbouring columns (col % 8 == 0) of one row: `epilogue`'s arithmetic, its column terms
// read 16 bytes at a time; packed fp16 out.
__device__ __forceinline__ uint4 epilogue8(const GemmParams& p, int row, int col, const int (&acc)[8]) {
  const float sx = __half2float(p.s_x[row]);
  float s1[8], y[8];
  load_halves8(p.s1 + col, s1);
#pragma unroll
  for (int q = 0; q < 8; ++q) y[q] = __fmul_rn(__fmul_rn(static_cast<float>(acc[q]), sx), s1[q]);
  if (p.szero != nullptr) {
    const float xsum = p.xsum[row];
    float szero[8];
    load_halves8(p.szero + col, szero);
#pragma unroll
    for (int q = 0; q < 8; ++q) y[q] = __fsub_rn(y[q], __fmul_rn(xsum, szero[q]));
  }
  if (p.bias != nullptr) {
    float bias[8];
    load_halves8(p.bias + col, bias);
#pragma unroll
    for (int q = 0; q < 8; ++q) y[q] = __fadd_rn(y[q], bias[q]);
  }
  uint4 out;
  __half2* h = reinterpret_cast<__half2*>(&out);
#pragma unroll
  for (int q = 0; q < 4; ++q) h[q] = __floats2half2_rn(y[2 * q], y[2 * q + 1]);
  return out;
}

// Two neighbouring columns (col even) of one row.
__device__ __forceinline__ void store_pair(const GemmParams& p, int row, int col, int acc0, int acc1) {
  const size_t idx = static_cast<size_t>(row) * p.N + col;
  if (p.acc_out != nullptr) {
    *reinterpret_cast<int2*>(p.acc_out + idx) = make_int2(acc0, acc1);
    return;
  }
  *reinterpret_cast<half2*>(p.out + idx) =
      __floats2half2_rn(epilogue(p, row, col, acc0), epilogue(p, row, col + 1, acc1));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// At a shared-memory address already converted (per-lane row addresses).
__device__ __forceinline__ void ldmatrix_x4_at(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  ldmatrix_x4_at(r, static_cast<uint32_t>(__cvta_generic_to_shared(smem)));
}

}  // namespace qoq_gemm
