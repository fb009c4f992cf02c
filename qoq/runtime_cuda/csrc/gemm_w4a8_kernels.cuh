// The two W4A8 GEMM kernels: a tiled multistage kernel for larger M and a split-K "GEMV" kernel
// for small M (memory bound: it streams the INT4 weights once with many loads in flight).
#pragma once

#include "gemm_w4a8.cuh"

namespace qoq_gemm {

// ---------------------------------------------------------------- tiled: BM x 128 x 128 tiles
constexpr int TILED_THREADS = 256;  // 8 warps: 2 along M x 4 along N (32 columns each)
constexpr int TILED_BN = 128;
constexpr int TILED_BK = 128;  // long k-steps: more bytes in flight per barrier
constexpr int TILED_STAGES = 4;
constexpr int A_ROW_BYTES = TILED_BK + 16;  // padding makes ldmatrix's 8 rows hit distinct banks
constexpr int SCALE_SPAN = 64;              // one s2/-z row per 64 k (every group size is a multiple)

template <int BM>
struct TiledSmem {
  static constexpr int A = BM * A_ROW_BYTES;
  static constexpr int B = TILED_BN * TILED_BK / 2;  // 4 n-tiles x 4 k-tiles x 512 bytes
  static constexpr int SCALES = TILED_BK / SCALE_SPAN * 2 * TILED_BN;  // per 64 k: s2 row, -z row
  static constexpr int STAGE = A + B + SCALES;
  static constexpr int TOTAL = TILED_STAGES * STAGE;
};

template <int BM, bool GROUPED>
__device__ __forceinline__ void tiled_load_stage(const GemmParams& p, uint8_t* stage, int kt, int m_base,
                                                 int n_base) {
  using S = TiledSmem<BM>;
  constexpr int CHUNKS_PER_ROW = TILED_BK / 16, K_TILES = TILED_BK / 32;
  const int tid = threadIdx.x;
  const int k_base = kt * TILED_BK;
#pragma unroll
  for (int i = tid; i < BM * CHUNKS_PER_ROW; i += TILED_THREADS) {  // A: BM rows of 16-byte chunks
    const int r = i / CHUNKS_PER_ROW, chunk = i % CHUNKS_PER_ROW;
    const int row = m_base + r, k = k_base + chunk * 16;
    const bool valid = row < p.M && k < p.K;  // rows past M and a K tail read zeros
    const int8_t* src = p.qx + (valid ? static_cast<size_t>(row) * p.K + k : 0);
    cp_async16(stage + r * A_ROW_BYTES + chunk * 16, src, valid);
  }
#pragma unroll
  for (int i = tid; i < 4 * K_TILES * 32; i += TILED_THREADS) {  // B: 4 n-tiles x K_TILES x 32 lanes
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
    const int8_t* src = table + (valid ? static_cast<size_t>(k / p.group) * p.N + n : 0);
    cp_async16(stage + S::A + S::B + tid * 16, src, valid);
  }
}

template <int BM, bool GROUPED>
__global__ void __launch_bounds__(TILED_THREADS, 2) gemm_tiled_kernel(const GemmParams p) {  // 2 blocks/SM
  using S = TiledSmem<BM>;
  constexpr int WM = BM / 2, MT = WM / 16, K_TILES = TILED_BK / 32;
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_m = warp & 1, warp_n = warp >> 1;
  // M varies fastest across blocks: consecutive blocks share one weight tile (read once from HBM).
  const int m_base = blockIdx.x * BM, n_base = blockIdx.y * TILED_BN;
  const int k_steps = (p.K + TILED_BK - 1) / TILED_BK;

  int acc[MT][4][4] = {};
#pragma unroll
  for (int s = 0; s < TILED_STAGES - 1; ++s) {
    if (s < k_steps) tiled_load_stage<BM, GROUPED>(p, smem + s * S::STAGE, s, m_base, n_base);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_steps; ++kt) {
    cp_async_wait<TILED_STAGES - 2>();
    __syncthreads();  // stage kt landed for everyone; stage kt-1 is free to overwrite
    const int next = kt + TILED_STAGES - 1;
    if (next < k_steps) tiled_load_stage<BM, GROUPED>(p, smem + (next % TILED_STAGES) * S::STAGE, next, m_base, n_base);
    cp_async_commit();

    const uint8_t* stage = smem + (kt % TILED_STAGES) * S::STAGE;
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
        for (int j = 0; j < 4; ++j) mma_s8_16832(acc[mt][j], a, b[j][0], b[j][1]);
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
        if (row < p.M && col < p.N) store_pair(p, row, col, acc[mt][j][2 * h], acc[mt][j][2 * h + 1]);
      }
}

// ---------------------------------------------------------------- GEMV: M <= 16*MT, split K
constexpr int GEMV_WARPS = 8;  // one block per 32 output columns; warps take interleaved runs
constexpr int GEMV_RUN = 8;    // consecutive k-tiles (4 KB of weights) a warp loads in one go

template <int MT>
constexpr int gemv_smem_bytes() {
  return GEMV_WARPS * MT * 16 * 32 * 4;
}

__device__ __forceinline__ uint32_t load_act_word(const GemmParams& p, int row, int k) {
  return row < p.M ? __ldg(reinterpret_cast<const uint32_t*>(p.qx + static_cast<size_t>(row) * p.K + k)) : 0u;
}

// One warp's run of GEMV_RUN consecutive k-tiles: the packed weights and the scale words of
// the groups it spans (GROUP = 0: per channel, no scales).
template <int GROUP>
struct GemvRun {
  static constexpr int GROUPS = GROUP > 0 ? GEMV_RUN * 32 / GROUP : 1;
  uint4 packed[GEMV_RUN];
  uint32_t s2[GROUPS], zero[GROUPS];
};

template <int GROUP>
__device__ __forceinline__ void gemv_load_run(const GemmParams& p, GemvRun<GROUP>& run, const uint8_t* tiles,
                                              size_t scale_col, int first, int k_tiles) {
#pragma unroll
  for (int i = 0; i < GEMV_RUN; ++i) {
    const int k0 = first + i;
    run.packed[i] = k0 < k_tiles ? load_stream16(tiles + static_cast<size_t>(k0) * 512) : make_uint4(0, 0, 0, 0);
  }
  if constexpr (GROUP > 0) {
#pragma unroll
    for (int gi = 0; gi < GemvRun<GROUP>::GROUPS; ++gi) {
      const int k = (first + gi * GROUP / 32) * 32;
      const size_t at = static_cast<size_t>(k / GROUP) * p.N + scale_col;
      run.s2[gi] = k < p.K ? __ldg(reinterpret_cast<const uint32_t*>(p.s2 + at)) : 0u;
      run.zero[gi] = k < p.K ? __ldg(reinterpret_cast<const uint32_t*>(p.s2_zeros + at)) : 0u;
    }
  }
}

template <int MT, int GROUP>
__device__ __forceinline__ void gemv_compute_run(const GemmParams& p, const GemvRun<GROUP>& run, int first,
                                                 int k_tiles, int (&acc)[MT][4][4]) {
  constexpr bool GROUPED = GROUP > 0;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  GroupScales gs{};
#pragma unroll
  for (int i = 0; i < GEMV_RUN; ++i) {
    const int k0 = first + i;
    if (k0 >= k_tiles) break;
    if constexpr (GROUPED) {  // unpack each group's scales once, when its first tile comes
      if (i % (GROUP / 32) == 0) gs = unpack_group_scales(run.s2[i * 32 / GROUP], run.zero[i * 32 / GROUP]);
    }
    uint32_t b[4][2];
    dequant_tile<GROUPED>(run.packed[i], gs, b);
    const int k = k0 * 32 + 4 * t;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int row = mt * 16 + g;
      const uint32_t a[4] = {load_act_word(p, row, k), load_act_word(p, row + 8, k),
                             load_act_word(p, row, k + 16), load_act_word(p, row + 8, k + 16)};
#pragma unroll
      for (int j = 0; j < 4; ++j) mma_s8_16832(acc[mt][j], a, b[j][0], b[j][1]);
    }
  }
}

template <int MT, int GROUP>
__global__ void __launch_bounds__(GEMV_WARPS * 32, MT == 1 ? 2 : 1) gemm_gemv_kernel(const GemmParams p) {
  extern __shared__ int partial[];  // [GEMV_WARPS][MT*16 accumulator slots][32 lanes]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x, k_tiles = p.K / 32;
  const uint8_t* tiles = p.qweight + static_cast<size_t>(n0) * k_tiles * 512 + lane * 16;
  const size_t scale_col = static_cast<size_t>(n0) * 32 + 4 * (lane >> 2);
  constexpr int STRIDE = GEMV_WARPS * GEMV_RUN;

  // Ping-pong between two runs: the next run's loads are in flight while this one computes.
  int acc[MT][4][4] = {};
  GemvRun<GROUP> ping, pong;
  int first = warp * GEMV_RUN;
  gemv_load_run<GROUP>(p, ping, tiles, scale_col, first, k_tiles);
  for (; first < k_tiles; first += 2 * STRIDE) {
    gemv_load_run<GROUP>(p, pong, tiles, scale_col, first + STRIDE, k_tiles);
    gemv_compute_run<MT, GROUP>(p, ping, first, k_tiles, acc);
    gemv_load_run<GROUP>(p, ping, tiles, scale_col, first + 2 * STRIDE, k_tiles);
    gemv_compute_run<MT, GROUP>(p, pong, first + STRIDE, k_tiles, acc);
  }

  // Integer partial sums are exact in any order: reduce the warps' K slices through shared memory.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) partial[((warp * MT + mt) * 16 + j * 4 + r) * 32 + lane] = acc[mt][j][r];
  __syncthreads();
  constexpr int SLOTS = MT * 16 * 32;
  for (int i = threadIdx.x; i < SLOTS / 2; i += GEMV_WARPS * 32) {
    // pair (r, r+1) of one lane: neighbouring columns of one row
    const int slot_lane = i & 31, pair = i >> 5;  // pair = (mt*4 + j)*2 + h
    const int mt = pair >> 3, j = (pair >> 1) & 3, h = pair & 1;
    int sum0 = 0, sum1 = 0;
#pragma unroll
    for (int w = 0; w < GEMV_WARPS; ++w) {
      const int base = ((w * MT + mt) * 16 + j * 4 + 2 * h) * 32 + slot_lane;
      sum0 += partial[base];
      sum1 += partial[base + 32];
    }
    const int row = mt * 16 + (slot_lane >> 2) + 8 * h;
    const int col = n0 * 32 + j * 8 + 2 * (slot_lane & 3);
    if (row < p.M) store_pair(p, row, col, sum0, sum1);
  }
}

}  // namespace qoq_gemm
