// The persistent GEMV (M <= 16): one block of 16 warps per SM stages the activation rows once, then
// takes the 32-column blocks blockIdx.x, + gridDim.x, ... Its warps' ping-pong runs go on across
// column blocks without draining, so a grid of more column blocks than SMs (qkv_proj, gate_up_proj)
// pays the row copies and the wait for them once per SM, not once per column block, and has no
// second, partly filled wave of blocks (qkv: 384 column blocks over 132 SMs is 3 or 2 per SM, where
// 2 staged blocks per SM left a wave of 120 blocks running alone). With tiled activations (TILED) nothing
// is staged: each warp reads its A fragments into registers with its runs' weights, as the staged GEMV's
// tiled kernel does.
#pragma once

#include "gemm_w4a8_gemv.cuh"

namespace qoq_gemm {

constexpr int GEMVP_WARPS = 16;
constexpr int GEMVP_RUN = 8;  // k-tiles a warp run (runs of 4 were slower)
// With tiled activations a run's registers hold its A fragments too: runs of 8 spilled 0.7-3 KB a thread.
constexpr int GEMVP_TILED_RUN = 4;
constexpr int GEMVP_SUMS = 2 * 16 * 32 * 4;  // two [16 accumulator slots][32 lanes] int32 buffers

// Shared memory: the header, the [M][K + 16] activation rows (none when tiled: m = 0), then the column
// sums' two buffers.
__host__ __device__ constexpr int gemvp_smem_bytes(int m, int k) { return GEMV_HEADER + m * (k + 16) + GEMVP_SUMS; }

// The end of a column block: every warp adds its K slices' sums into `sums` (shared-memory atomics,
// exact in any order), then 256 threads store the 32 columns x M rows and zero the buffer again. The
// caller alternates two buffers, so the next column block's adds never meet this one's reads: they
// come after the next barrier, which every thread reaches only after its reads here.
template <int GROUP>
__device__ __forceinline__ void gemvp_store_columns(const GemmParams& p, int n0, int* sums, int (&acc)[1][4][4]) {
  const int lane = threadIdx.x & 31;
  const int slots = p.M > 8 ? 4 : 2;  // slots 2, 3 of each column group hold rows 8..15
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if (r < slots) atomicAdd(&sums[(j * 4 + r) * 32 + lane], acc[0][j][r]);
      acc[0][j][r] = 0;
    }
  __syncthreads();
  if (threadIdx.x < 256) {  // pair (r, r+1) of one lane: neighbouring columns of one row
    const int slot_lane = threadIdx.x & 31, pair = threadIdx.x >> 5;  // pair = j * 2 + h
    const int j = pair >> 1, h = pair & 1;
    int* at = sums + (j * 4 + 2 * h) * 32 + slot_lane;
    const int row = (slot_lane >> 2) + 8 * h, col = n0 * 32 + j * 8 + 2 * (slot_lane & 3);
    if (row < p.M) {
      const int offset = gemv_offset<GROUP>(p, row);
      store_pair(p, row, col, at[0] - offset, at[32] - offset);
      at[0] = 0, at[32] = 0;
    }
  }
}

template <int GROUP, bool TILED = false>
__global__ void __launch_bounds__(GEMVP_WARPS * 32, 1) gemm_gemv_persistent_kernel(const GemmParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int RUN = TILED ? GEMVP_TILED_RUN : GEMVP_RUN, STRIDE = GEMVP_WARPS * RUN;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int k_tiles = p.K / 32, col_blocks = p.N / 32;
  int* sums = reinterpret_cast<int*>(smem + GEMV_HEADER + (TILED ? 0 : p.M * (p.K + 16)));  // [2][16][32]
  for (int i = threadIdx.x; i < GEMVP_SUMS / 4; i += GEMVP_WARPS * 32) sums[i] = 0;  // seen after the wait

  // A run: column block n0, k-tiles first .. first + RUN - 1. Each warp has >= 1 run per column block
  // (an empty one where warp * RUN >= k_tiles), so every warp reaches every column block's barrier.
  // run_at: where this lane reads it (the block's tiles and scale column). Offsets in 32 bits (the weights
  // are < 4 GB: gemm_bindings.cpp): with 64-bit ones the per-group kernel spilled more in its run loops,
  // and was slower.
  const auto run_at = [&](int n0, int first) {
    return GemvRefill{p.qweight + (static_cast<uint32_t>(n0) * k_tiles * 512 + lane * 16),
                      static_cast<uint32_t>(n0) * 32 + 4 * (lane >> 2), first};
  };
  const auto load = [&](GemvRun<GROUP, RUN>& run, int n0, int first) {
    const GemvRefill at = run_at(n0, first);
    gemv_load_run<GROUP, RUN, TILED>(p, run, at.tiles, at.scale_col, first, k_tiles);
  };
  const auto next = [&](int& n0, int& first) {
    first += STRIDE;
    if (first >= k_tiles) n0 += gridDim.x, first = warp * RUN;
  };

  // Rows first (faster in one-wave grids), unless launched as a programmatic dependent: then the first
  // weights go out before the wait for the kernel ahead, which writes the rows.
  uint32_t a_base = 0, a_step = 0;
  GemvRun<GROUP, RUN> ping, pong;
  int n0 = blockIdx.x, first = warp * RUN, buffer = 0;
  int n_second = n0, first_second = first;
  next(n_second, first_second);
  const bool second = n_second < col_blocks;
  if constexpr (TILED) {  // the first run's weights may go out before the wait, its fragments not
    const GemvRefill at = run_at(n0, first);
    gemv_load_run<GROUP, RUN>(p, ping, at.tiles, at.scale_col, first, k_tiles);
    wait_prior_grids();
    gemv_load_fragments<GROUP, RUN>(p, ping, first, k_tiles);
    if (second) load(pong, n_second, first_second);
    __syncthreads();  // the zeroed sums, before any warp adds into them
  } else {
    if (p.dependent) load(ping, n0, first);
    wait_prior_grids();
    const bool slices = p.M < GEMV_CLUSTER_MIN_M;  // no pairs to share the rows: each warp copies its own
    if (slices) gemv_copy_slices<RUN, STRIDE>(p, smem, first, k_tiles, a_base, a_step);
    else gemv_copy_rows<GEMVP_WARPS>(p, smem, a_base, a_step);
    if (!p.dependent) load(ping, n0, first);
    // The second run, into the other buffer. With the pair's rows (M >= 4) its loads go out before the
    // wait for them, so that the weights keep streaming while the rows land (faster at M = 4..16 as
    // programmatic dependents). The staged GEMVs measured slower so.
    if (!slices && second) load(pong, n_second, first_second);
    if (slices) {
      __syncthreads();  // the zeroed sums, before any warp adds into them
      gemv_wait_slices();
      if (second) load(pong, n_second, first_second);
    } else {
      gemv_wait_rows(smem);
    }
  }

  int acc[1][4][4] = {};
  // One run: computed while the run two ahead is loaded into its registers; false after the last.
  const auto step = [&](GemvRun<GROUP, RUN>& run) {
    int n1 = n0, first1 = first;
    next(n1, first1);
    int n2 = n1, first2 = first1;
    next(n2, first2);
    if constexpr (GROUP == 128 || TILED) {  // runs wholly below K (every one at K = 4096) skip the per-tile
      // checks, which is faster; with tiled activations' shorter runs no kernel spills so
      const bool whole = first + RUN <= k_tiles;
      if (n2 < col_blocks) {
        const GemvRefill refill = run_at(n2, first2);
        if (whole && first2 + RUN <= k_tiles)
          gemv_compute_run<1, GROUP, RUN, true, true, false, TILED>(p, run, first, k_tiles, a_base, a_step, acc, refill);
        else
          gemv_compute_run<1, GROUP, RUN, true, false, false, TILED>(p, run, first, k_tiles, a_base, a_step, acc, refill);
      } else {
        allow_dependent_grids();  // this warp's weight loads are done: the next kernel's may go out
        if (whole) gemv_compute_run<1, GROUP, RUN, false, true, false, TILED>(p, run, first, k_tiles, a_base, a_step, acc);
        else gemv_compute_run<1, GROUP, RUN, false, false, false, TILED>(p, run, first, k_tiles, a_base, a_step, acc);
      }
    } else {  // per channel and g64 the unchecked copies spill, which is slower. The refill is spelled out:
      // through run_at these kernels compile to other register allocations, and they spill readily.
      GemvRefill refill{nullptr, static_cast<uint32_t>(n2) * 32 + 4 * (lane >> 2), first2};
      if (n2 < col_blocks) refill.tiles = p.qweight + static_cast<size_t>(n2) * k_tiles * 512 + lane * 16;
      gemv_compute_run<1, GROUP, RUN, true, false, true, TILED>(p, run, first, k_tiles, a_base, a_step, acc, refill);
      if (refill.tiles == nullptr) allow_dependent_grids();  // this warp's weight loads are done
    }
    if (n1 != n0) gemvp_store_columns<GROUP>(p, n0, sums + buffer * 512, acc), buffer ^= 1;
    n0 = n1, first = first1;
    return n0 < col_blocks;
  };
  while (step(ping) && step(pong)) {
  }
}

}  // namespace qoq_gemm
