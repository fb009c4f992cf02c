// What the host passes to the W4A8 GEMM kernels; shared by gemm_bindings.cpp (host compiler, where
// every argument is checked) and gemm_w4a8.cu (nvcc, which only launches).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

struct __half;  // cuda_fp16.h's fp16 type

namespace qoq_gemm {

enum Variant {
  GEMV = 1, TILED64 = 2, TILED128 = 3, TILED128_WIDE = 4, TILED64_WIDE = 5, GEMV16 = 6,
  // Hopper wgmma kernels, named by block: channels x tokens; K2: two warpgroups split the block's K range
  WG128X64 = 7, WG128X128 = 8, WG64X64 = 9, WG64X64_K2 = 10,
  GEMV16P = 11,  // persistent GEMV: one 16-warp block per SM, M <= 16
};
constexpr int LAST_VARIANT = GEMV16P;
constexpr int GEMV_MAX_M = 64;
constexpr int GEMVP_MAX_M = 16;
constexpr int GROUP_MULTIPLE = 64;  // the tiled kernels read one s2/-z row per 64 k

struct GemmParams {
  const int8_t* qx;          // [M, K] per-token int8 activations, row-major; tiled: [K/32][32][16] (below)
  const __half* s_x;         // [M] activation scales
  const uint8_t* qweight;    // [N, K/2] packed codes, compute-order 32x32 tiles
  const __half* s1;          // [N] level-0 (or per-channel) scales
  const int8_t* s2;          // [K/g, N] interleaved level-1 scales (per group)
  const int8_t* s2_zeros;    // [K/g, N] interleaved -z (per group)
  const __half* szero;       // [N] scaled zeros (per channel)
  const float* xsum;         // [M] per-token sums of the unquantized activation (per channel)
  const int32_t* qsum;       // [M] per-token sums of qx (per group, wgmma kernels: the u8 weights' offset)
  const __half* bias;        // [N] or nullptr
  __half* out;               // [M, N]
  int32_t* acc_out;          // [M, N] debug: raw int32 accumulators instead of `out`
  int32_t* split_acc;        // [M, N] zeroed sums of the K splits (split-K tiled grids), or nullptr
  int M, N, K, group;        // group 0: per channel
  int split_steps;           // tiled and wgmma: k-steps per K split (blockIdx.z; wgmma: a cluster's rank)
  bool dependent;            // Hopper GEMV / wgmma: launched as a programmatic dependent of the kernel
                             // ahead (grid_dependency.cuh), which must not write the weights or scales
  bool early_trigger;        // staged GEMV launched as a dependent, its grid over one wave: it lets the
                             // next kernel launch before its own wait (gemm_w4a8.cu launch_gemv)
  bool tiled;                // qx in A-fragment tiles (M <= 16; the gemv16 and gemv16p variants): 512 bytes
                             // per 32 k, lane l = 4g + t's 16 of them its mma.m16n8k32 A fragment, the words
                             // row g at k 4t..4t+3, row g + 8 there, row g at k 16+4t..19+4t, row g + 8 there;
                             // rows >= M are never stored, whatever they hold (reference.py rows_to_tiles)
};

// Launch `variant` on the current stream of `like`'s device; the arguments are already checked.
void launch_gemm(GemmParams p, Variant variant, const at::Tensor& like);

}  // namespace qoq_gemm
