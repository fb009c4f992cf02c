// The tiled multistage W4A8 GEMM kernel for larger M (mma.m16n8k32 on cp.async-staged tiles),
// with an optional K split whose int32 partial sums are added atomically.
#pragma once

#include "gemm_w4a8.cuh"

namespace qoq_gemm {

// ---------------------------------------------------------------- tiled: BM x 128 x 128 tiles
constexpr int TILED_BN = 128;
constexpr int TILED_BK = 128;  // long k-steps: more bytes in flight per barrier
constexpr int TILED_STAGES = 4;
constexpr int A_ROW_BYTES = TILED_BK + 16;  // padding makes ldmatrix's 8 rows hit distinct banks

template <int BM>
struct TiledSmem {
  static constexpr int A = BM * A_ROW_BYTES;
  static constexpr int B = TILED_BN * TILED_BK / 2;  // 4 n-tiles x 4 k-tiles x 512 bytes
  static constexpr int SCALES = TILED_BK / SCALE_SPAN * 2 * TILED_BN;  // per 64 k: s2 row, -z row
  static constexpr int STAGE = A + B + SCALES;
  static constexpr int TOTAL = TILED_STAGES * STAGE;
};

// THREADS: 4 warps along N (32 columns each) times WARPS_M along M.
template <int BM, int THREADS, bool GROUPED>
__device__ __forceinline__ void tiled_load_stage(const GemmParams& p, uint8_t* stage, int kt, int m_base,
                                                 int n_base) {
  using S = TiledSmem<BM>;
  constexpr int CHUNKS_PER_ROW = TILED_BK / 16, K_TILES = TILED_BK / 32;
  const int tid = threadIdx.x;
  const int k_base = kt * TILED_BK;
#pragma unroll
  for (int i = tid; i < BM * CHUNKS_PER_ROW; i += THREADS) {  // A: BM rows of 16-byte chunks
    const int r = i / CHUNKS_PER_ROW, chunk = i % CHUNKS_PER_ROW;
    const int row = m_base + r, k = k_base + chunk * 16;
    const bool valid = row < p.M && k < p.K;  // rows past M and a K tail read zeros
    const int8_t* src = p.qx + (valid ? static_cast<size_t>(row) * p.K + k : 0);
    cp_async16(stage + r * A_ROW_BYTES + chunk * 16, src, valid);
  }
#pragma unroll
  for (int i = tid; i < 4 * K_TILES * 32; i += THREADS) {  // B: 4 n-tiles x K_TILES x 32 lanes
    const int n_tile = i / (K_TILES * 32), k_tile = (i / 32) % K_TILES, lane = i % 32;
    const int n0 = n_base / 32 + n_tile, k0 = kt * K_TILES + k_tile, k_tiles = p.K / 32;
    const bool valid = n0 < p.N / 32 && k0 < k_tiles;
    const uint8_t* src = p.qweight + (valid ? (static_cast<size_t>(n0) * k_tiles + k0) * 512 + lane * 16 : 0);
    cp_async16(stage + S::A + (n_tile * K_TILES + k_tile) * 512 + lane * 16, src, valid);
  }
  if (GROUPED && tid < TILED_BK / SCALE_SPAN * 16) {  // per 64 k: 8 chunks of s2, then 8 of -z
    const int span = tid / 16, table_id = (tid / 8) % 2;
    const int8_t* table = table_id == 0 ? p.s2 : p.s2_zeros;
    const int n = n_base + (tid % 8) * 16, k = k_base + span * SCALE_SPAN;
    const bool valid = n < p.N && k < p.K;
    const int8_t* src = table + (valid ? static_cast<size_t>(group_row(k, p.group)) * p.N + n : 0);
    cp_async16(stage + S::A + S::B + tid * 16, src, valid);
  }
}

// WARPS_M = 2: warp tiles (BM/2) x 32; WARPS_M = 1: 4 warps with (BM x 32) tiles, so each weight
// fragment is dequantized once per block instead of once per warp row.
template <int BM, int WARPS_M, bool GROUPED>
__global__ void __launch_bounds__(WARPS_M * 128, 2) gemm_tiled_kernel(const GemmParams p) {  // 2 blocks/SM
  using S = TiledSmem<BM>;
  constexpr int THREADS = WARPS_M * 128, WM = BM / WARPS_M, MT = WM / 16, K_TILES = TILED_BK / 32;
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
  // M varies fastest across blocks: consecutive blocks share one weight tile (read once from HBM).
  const int m_base = blockIdx.x * BM, n_base = blockIdx.y * TILED_BN;
  // Split K (blockIdx.z): this block's k-steps [kt0, kt0 + steps).
  const int kt0 = blockIdx.z * p.split_steps;
  const int steps = min(p.split_steps, (p.K + TILED_BK - 1) / TILED_BK - kt0);

  int acc[MT][4][4] = {};
#pragma unroll
  for (int s = 0; s < TILED_STAGES - 1; ++s) {
    if (s < steps) tiled_load_stage<BM, THREADS, GROUPED>(p, smem + s * S::STAGE, kt0 + s, m_base, n_base);
    cp_async_commit();
  }
  for (int i = 0; i < steps; ++i) {
    cp_async_wait<TILED_STAGES - 2>();
    __syncthreads();  // stage i landed for everyone; stage i-1 is free to overwrite
    const int next = i + TILED_STAGES - 1;
    if (next < steps)
      tiled_load_stage<BM, THREADS, GROUPED>(p, smem + (next % TILED_STAGES) * S::STAGE, kt0 + next, m_base, n_base);
    cp_async_commit();

    const uint8_t* stage = smem + (i % TILED_STAGES) * S::STAGE;
    GroupScales gs[TILED_BK / SCALE_SPAN] = {};
    if constexpr (GROUPED) {
#pragma unroll
      for (int span = 0; span < TILED_BK / SCALE_SPAN; ++span) {
        const uint8_t* scales = stage + S::A + S::B + span * 2 * TILED_BN + warp_n * 32 + 4 * (lane >> 2);
        gs[span] = unpack_group_scales(*reinterpret_cast<const uint32_t*>(scales),
                                       *reinterpret_cast<const uint32_t*>(scales + TILED_BN));
      }
    }
#pragma unroll
    for (int kk = 0; kk < K_TILES; ++kk) {
      const uint4 packed = *reinterpret_cast<const uint4*>(stage + S::A + (warp_n * K_TILES + kk) * 512 + lane * 16);
      uint32_t b[4][2];
      dequant_tile<GROUPED>(packed, gs[kk * 32 / SCALE_SPAN], b);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t a[4];
        const int row = warp_m * WM + mt * 16 + (lane & 15);
        ldmatrix_x4(a, stage + row * A_ROW_BYTES + kk * 32 + (lane >> 4) * 16);
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_16832<false>(acc[mt][j], a, b[j][0], b[j][1]);
      }
    }
  }

  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m_base + warp_m * WM + mt * 16 + g + 8 * h;
        const int col = n_base + warp_n * 32 + j * 8 + 2 * t;
        if (row >= p.M || col >= p.N) continue;
        if (p.split_acc == nullptr) {
          store_pair(p, row, col, acc[mt][j][2 * h], acc[mt][j][2 * h + 1]);
        } else {  // integer sums are exact in any order
          int* sums = p.split_acc + static_cast<size_t>(row) * p.N + col;
          atomicAdd(sums, acc[mt][j][2 * h]);
          atomicAdd(sums + 1, acc[mt][j][2 * h + 1]);
        }
      }
}

// After a split-K tiled kernel: the epilogue of the summed accumulators, two columns per thread.
__global__ void split_epilogue_kernel(const GemmParams p) {
  const size_t pair = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (pair * 2 >= static_cast<size_t>(p.M) * p.N) return;
  const int row = static_cast<int>(pair * 2 / p.N), col = static_cast<int>(pair * 2 % p.N);
  const int2 sums = reinterpret_cast<const int2*>(p.split_acc)[pair];
  store_pair(p, row, col, sums.x, sums.y);
}

}  // namespace qoq_gemm
