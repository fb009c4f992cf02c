// The split-K "GEMV" W4A8 kernel for small M: memory bound, each warp streams its runs of INT4
// weight tiles from HBM with a register ping-pong (the next run's loads in flight while this one
// computes). A cp.async ring in shared memory measured slower, with the same bytes in flight and with
// 3-6 runs a warp (more in flight, but each block's first compute waits for its activation rows), and so
// did a persistent kernel feeding a ring with bulk async copies (TMA), which streamed slower even alone.
#pragma once

#include "bulk_copy.cuh"
#include "gemm_w4a8.cuh"
#include "grid_dependency.cuh"

namespace qoq_gemm {

// ---------------------------------------------------------------- GEMV: M <= 16*MT, split K
// One block per 32 output columns; its WARPS warps (8 or 16) take interleaved runs of K. Per group
// the B fragments are the biased u8 W8 + 128 (BiasedScales); the 128 * (the token's code sum, p.qsum)
// that comes off is subtracted once per output, as in the wgmma kernels (an MMA per tile summing it
// here was a fifth of the MMAs). With MT = 1 (M <= 16) and rows given, the block first copies the M
// activation rows into shared memory and reads A fragments by ldmatrix: per-lane 4-byte loads of 16 rows
// cost 8x the L1 wavefronts. Rows >= M point ldmatrix at 16 zero bytes. Given tiles (TILED: the layout
// the quantization kernels write for M <= 16), each lane loads its fragments with its weights instead.
// Consecutive k-tiles a warp loads in one go: 8 (4 KB of weights) with 8 warps a block, 4 with 16 (each
// the faster for its warp count).
__host__ __device__ constexpr int gemv_run(int warps) { return warps == 16 ? 4 : 8; }

// On Hopper the activation rows arrive by bulk copies, and from GEMV_CLUSTER_MIN_M rows on, pairs of
// neighbouring 32-column blocks form a cluster that shares one read of them: block r copies rows r,
// r + 2, ... from L2 and multicasts each to both blocks (an SM-to-SM copy inside the GPU, not NVLink
// multicast). At M = 16 the rows are as many bytes as a block's weights, so each block staging its
// own copy doubled the bytes through L2. Clusters of 4 measured slower than pairs.
constexpr int GEMV_CLUSTER = 2;  // 32-column blocks sharing their activation rows (Hopper, MT = 1)
constexpr int GEMV_CLUSTER_MIN_M = 4;  // fewer rows: the cluster's start-up costs more than it saves
// shared memory header: 16 zero bytes, the activations' mbarrier (8), 8 spare; then [M][K + 16]
// activations (MT = 1), later reused for the warps' partial sums
constexpr int GEMV_HEADER = 32;

__host__ __device__ constexpr int gemv_smem_bytes(int mt, int warps, int m, int k) {
  const int act = mt == 1 ? m * (k + 16) : 0, partial = warps * mt * 16 * 32 * 4;
  return GEMV_HEADER + (act > partial ? act : partial);
}

__device__ __forceinline__ uint32_t load_act_word(const GemmParams& p, int row, int k) {
  return row < p.M ? load_after_wait4(p.qx + static_cast<size_t>(row) * p.K + k) : 0u;  // the kernel ahead wrote them
}

// Each lane's ldmatrix address for k-tile 0 of the rows staged at [M][K + 16] after the header, and its
// step per k-tile; rows >= M read the header's 16 zero bytes.
__device__ __forceinline__ void gemv_row_addresses(const GemmParams& p, uint8_t* smem, uint32_t& a_base,
                                                   uint32_t& a_step) {
  const int lane = threadIdx.x & 31;
  // ldmatrix rows: lane l gives row (l % 8) + 8 ((l / 8) % 2), bytes 16 (l / 16) of a k-tile
  const int row = (lane & 7) + 8 * ((lane >> 3) & 1);
  const bool real = row < p.M;
  a_base = static_cast<uint32_t>(
      __cvta_generic_to_shared(real ? smem + GEMV_HEADER + row * (p.K + 16) + 16 * (lane >> 4) : smem));
  a_step = real ? 32 : 0;
}

// MT = 1: start copying the M activation rows into shared memory ([M][K + 16] after the header; on
// Hopper by bulk copies, multicast to both blocks of a cluster) and zero the header's first 16 bytes.
// Gives each lane's ldmatrix address for k-tile 0 and its step per k-tile; gemv_wait_rows waits.
template <int WARPS>
__device__ __forceinline__ void gemv_copy_rows(const GemmParams& p, uint8_t* smem, uint32_t& a_base,
                                               uint32_t& a_step) {
  uint8_t* act = smem + GEMV_HEADER;
  const int row_bytes = p.K + 16;  // +16: ldmatrix's 8 row addresses fall in distinct banks
#if __CUDA_ARCH__ >= 900
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(smem + 16));
  if (threadIdx.x == 0) {
    mbarrier_init(bar);
    mbarrier_expect_tx(bar, static_cast<uint32_t>(p.M * p.K));
  }
  const uint32_t rank = cluster_rank(), blocks = cluster_size();
  cluster_sync_after_init();  // every block's mbarrier is set up before any row is multicast to it
  for (int row = rank + blocks * threadIdx.x; row < p.M; row += blocks * WARPS * 32)
    bulk_copy(static_cast<uint32_t>(__cvta_generic_to_shared(act + row * row_bytes)),
              p.qx + static_cast<size_t>(row) * p.K, p.K, bar, static_cast<uint16_t>((1u << blocks) - 1));
#else
  const int row_pieces = p.K / 16;
  for (int i = threadIdx.x; i < p.M * row_pieces; i += WARPS * 32) {
    const int row = i / row_pieces, piece = i % row_pieces;
    cp_async16(act + row * row_bytes + piece * 16, p.qx + static_cast<size_t>(row) * p.K + piece * 16, true);
  }
  cp_async_commit();
#endif
  if (threadIdx.x < 4) reinterpret_cast<uint32_t*>(smem)[threadIdx.x] = 0u;
  gemv_row_addresses(p, smem, a_base, a_step);
}

// The rows (and, before Hopper, every thread's pieces of them) and the header's zeros are in.
__device__ __forceinline__ void gemv_wait_rows(uint8_t* smem) {
#if __CUDA_ARCH__ >= 900
  mbarrier_wait(static_cast<uint32_t>(__cvta_generic_to_shared(smem + 16)), 0);
#else
  cp_async_wait<0>();
#endif
  __syncthreads();
}

// The persistent GEMV below GEMV_CLUSTER_MIN_M rows: a warp reads only the k-tiles of its own runs
// (first, first + STRIDE, ...; the same in every column block), so it copies just those bytes of the
// rows (per-lane 16-byte cp.async) to their place and waits for nothing else, where gemv_copy_rows makes
// the whole block wait for every row. (At M = 16, without the pairs' multicast, this was slower.)
// Returns the lane's ldmatrix addressing
// as gemv_copy_rows does; gemv_wait_slices waits.
template <int RUN, int STRIDE>
__device__ __forceinline__ void gemv_copy_slices(const GemmParams& p, uint8_t* smem, int first, int k_tiles,
                                                 uint32_t& a_base, uint32_t& a_step) {
  const int lane = threadIdx.x & 31;
  uint8_t* act = smem + GEMV_HEADER;
  constexpr int PIECES = 2 * RUN;  // 16-byte pieces of one row in a run
  for (int f = first; f < k_tiles; f += STRIDE) {
    const int pieces = min(PIECES, 2 * (k_tiles - f));
    for (int i = lane; i < p.M * PIECES; i += 32) {
      const int row = i / PIECES, piece = i % PIECES, off = f * 32 + piece * 16;
      if (piece < pieces) cp_async16(act + row * (p.K + 16) + off, p.qx + static_cast<size_t>(row) * p.K + off, true);
    }
  }
  cp_async_commit();
  if (lane < 4) reinterpret_cast<uint32_t*>(smem)[lane] = 0u;  // every warp writes the zeros it reads
  gemv_row_addresses(p, smem, a_base, a_step);
}

// This warp's row slices have landed, for every lane.
__device__ __forceinline__ void gemv_wait_slices() {
  cp_async_wait<0>();
  __syncwarp();
}

// What the biased per-group fragments added to each output of `row`: 128 * its code sum.
template <int GROUP>
__device__ __forceinline__ int gemv_offset(const GemmParams& p, int row) {
  return GROUP > 0 ? 128 * p.qsum[row] : 0;
}

// One warp's run of RUN consecutive k-tiles: the packed weights, the scale words of the groups it spans
// (GROUP = 0: per channel, no scales) and, with tiled activations, this lane's A fragments (unused, and
// so never in registers, otherwise).
template <int GROUP, int RUN>
struct GemvRun {
  static constexpr int GROUPS = GROUP > 0 ? RUN * 32 / GROUP : 1;
  uint4 packed[RUN];
  uint32_t s2[GROUPS], zero[GROUPS];
  uint4 act[RUN];
};

// Tiled activations (GemmParams::tiled): k-tile k0's 512 bytes hold each lane's 16-byte mma A fragment in
// lane order, so a warp reads a k-tile's fragments of all 16 rows with one coalesced 16-byte load a lane,
// straight into registers alongside the run's weights. Against the rows staged in shared memory (copied,
// waited for, read by ldmatrix) this is faster, most of all as a programmatic dependent; the same
// fragments staged per lane in shared memory, or prefetched to L1 and read at use, gained little or lost.
__device__ __forceinline__ uint4 load_fragment16(const GemmParams& p, int k0) {
  return load_after_wait16(p.qx + static_cast<size_t>(k0) * 512 + (threadIdx.x & 31) * 16);
}

// This lane's A fragments of the run at k-tile `first` (tiled activations).
template <int GROUP, int RUN>
__device__ __forceinline__ void gemv_load_fragments(const GemmParams& p, GemvRun<GROUP, RUN>& run, int first,
                                                    int k_tiles) {
#pragma unroll
  for (int i = 0; i < RUN; ++i) run.act[i] = first + i < k_tiles ? load_fragment16(p, first + i) : make_uint4(0, 0, 0, 0);
}

// The scale words of group gi of the run that starts at k-tile `first` (WHOLE: the run lies below K).
template <int GROUP, int RUN, bool WHOLE = false>
__device__ __forceinline__ void gemv_load_scales(const GemmParams& p, GemvRun<GROUP, RUN>& run, uint32_t scale_col,
                                                 int first, int gi) {
  const int k = (first + gi * GROUP / 32) * 32;
  const uint32_t at = static_cast<uint32_t>(k / GROUP) * p.N + scale_col;  // < 2^32: the tables are [K/g][N] bytes
  run.s2[gi] = WHOLE || k < p.K ? __ldg(reinterpret_cast<const uint32_t*>(p.s2 + at)) : 0u;
  run.zero[gi] = WHOLE || k < p.K ? __ldg(reinterpret_cast<const uint32_t*>(p.s2_zeros + at)) : 0u;
}

// The run's weights and scale words (and with TILED its A fragments: only once the kernel ahead, which
// writes them, is waited for).
template <int GROUP, int RUN, bool TILED = false>
__device__ __forceinline__ void gemv_load_run(const GemmParams& p, GemvRun<GROUP, RUN>& run, const uint8_t* tiles,
                                              uint32_t scale_col, int first, int k_tiles) {
#pragma unroll
  for (int i = 0; i < RUN; ++i) {
    const int k0 = first + i;
    run.packed[i] = k0 < k_tiles ? load_stream16(tiles + static_cast<size_t>(k0) * 512) : make_uint4(0, 0, 0, 0);
  }
  if constexpr (GROUP > 0) {
#pragma unroll
    for (int gi = 0; gi < GemvRun<GROUP, RUN>::GROUPS; ++gi) gemv_load_scales<GROUP, RUN>(p, run, scale_col, first, gi);
  }
  if constexpr (TILED) gemv_load_fragments<GROUP, RUN>(p, run, first, k_tiles);
}

// Where a run lies (the persistent GEMV's loads and tile-by-tile refills): k-tile `first` of the column
// block whose tiles (this lane's 16 bytes of them) start at `tiles`, its scale words at `scale_col`.
struct GemvRefill {
  const uint8_t* tiles;
  uint32_t scale_col;
  int first;
};

// Computes `run` (k-tiles first ..). REFILL: each tile's registers are loaded from `refill` (the run
// two ahead) as soon as the tile is dequantized (volatile loads: they stay there), so a warp keeps
// 2 RUN - 1 tiles in flight through its math instead of RUN (faster for the persistent GEMV). The 8- and
// 16-warp GEMVs measured slower so and issue the next run's loads whole, between runs.
// WHOLE: this run and the refill (whose tiles are then never null) lie below k_tiles, so no tile needs a
// bounds check; the per-tile checks, the branches and the register moves around them took a third of the
// persistent GEMV's instructions.
// NULLABLE: the refill's tiles may be null (nothing more to load), checked at run time; the per-channel
// and g64 persistent GEMVs take that one copy for all their runs (see gemm_w4a8_gemv_persistent.cuh).
// TILED (MT = 1): the A fragments come from run.act (refilled like the weights), not shared memory.
template <int MT, int GROUP, int RUN, bool REFILL = false, bool WHOLE = false, bool NULLABLE = false,
          bool TILED = false>
__device__ __forceinline__ void gemv_compute_run(const GemmParams& p, GemvRun<GROUP, RUN>& run, int first,
                                                 int k_tiles, uint32_t a_base, uint32_t a_step,
                                                 int (&acc)[MT][4][4], const GemvRefill& refill = {}) {
  static_assert(!TILED || MT == 1, "tiled activations: one 16-row tile");
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  BiasedScales<4> bs{};
  const bool refilling = REFILL && (!NULLABLE || refill.tiles != nullptr);
#pragma unroll
  for (int i = 0; i < RUN; ++i) {
    const int k0 = first + i;
    if (!WHOLE && !REFILL && k0 >= k_tiles) break;
    if constexpr (GROUP > 0) {  // unpack each group's scales once, when its first tile comes
      if (i % (GROUP / 32) == 0) {
        constexpr int TILES = GROUP / 32;
        bs = unpack_biased_scales<4>(run.s2[i / TILES], run.zero[i / TILES], 0);
        if (refilling) gemv_load_scales<GROUP, RUN, WHOLE>(p, run, refill.scale_col, refill.first, i / TILES);
      }
    }
    uint32_t b[4][2];
    dequant_tile<(GROUP > 0)>(run.packed[i], bs, b);
    if (refilling) {
      const int r0 = refill.first + i;
      run.packed[i] = WHOLE || r0 < k_tiles ? load_stream16_ordered(refill.tiles + static_cast<size_t>(r0) * 512)
                                            : make_uint4(0, 0, 0, 0);
    }
    // Past K: with tiled activations the tile's A fragments are zeros, so its MMAs add nothing, and its
    // slot must still be refilled (the run two ahead, a persistent warp's next column block, may have it
    // below K).
    if (!TILED && !WHOLE && REFILL && k0 >= k_tiles) continue;
    const int k = k0 * 32 + 4 * t;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint32_t a[4];
      if constexpr (TILED) {
        a[0] = run.act[i].x, a[1] = run.act[i].y, a[2] = run.act[i].z, a[3] = run.act[i].w;
        if (refilling) {
          const int r0 = refill.first + i;
          run.act[i] = WHOLE || r0 < k_tiles ? load_fragment16(p, r0) : make_uint4(0, 0, 0, 0);
        }
      } else if constexpr (MT == 1) {
        ldmatrix_x4_at(a, a_base + k0 * a_step);
      } else {
        const int row = mt * 16 + g;
        a[0] = load_act_word(p, row, k), a[1] = load_act_word(p, row + 8, k);
        a[2] = load_act_word(p, row, k + 16), a[3] = load_act_word(p, row + 8, k + 16);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) mma_16832<true>(acc[mt][j], a, b[j][0], b[j][1]);
    }
  }
}

// ACT_FIRST (MT = 1): the activation copies go out before the first run's weight loads, not after
// (gemm_w4a8.cu's gemv_act_first says where that measured faster). The copies wait for the kernel ahead
// (a programmatic dependent's launch, grid_dependency.cuh); weight loads issued first do not.
// TILED (MT = 1, not ACT_FIRST): tiled activations, read into registers with each run; nothing is staged.
template <int MT, int GROUP, int WARPS, bool ACT_FIRST, bool TILED = false>
__global__ void __launch_bounds__(WARPS * 32, MT == 1 ? 16 / WARPS : 1) gemm_gemv_kernel(const GemmParams p) {
  static_assert(!TILED || (MT == 1 && !ACT_FIRST), "tiled activations: M <= 16, weights first");
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x, k_tiles = p.K / 32;
  const uint8_t* tiles = p.qweight + static_cast<size_t>(n0) * k_tiles * 512 + lane * 16;
  const uint32_t scale_col = static_cast<uint32_t>(n0) * 32 + 4 * (lane >> 2);
  constexpr int RUN = gemv_run(WARPS), STRIDE = WARPS * RUN;

  // The first run's weight loads and the activation rows' copies go out together, in the order
  // ACT_FIRST says; the second run's loads wait for the activations (issuing them earlier was slower).
  int acc[MT][4][4] = {};
  GemvRun<GROUP, RUN> ping, pong;
  int first = warp * RUN;
  constexpr bool ACT_COPY_FIRST = MT == 1 && ACT_FIRST;
  if constexpr (!ACT_COPY_FIRST) gemv_load_run<GROUP, RUN>(p, ping, tiles, scale_col, first, k_tiles);
  // Over one wave, the next kernel's blocks may take the slots the last wave leaves free, and wait there
  // (faster for multi-wave grids; in one-wave grids it was slower).
  if (p.early_trigger) allow_dependent_grids();
  wait_prior_grids();  // the activations (and the epilogue's terms) come from the kernel ahead
  uint32_t a_base = 0, a_step = 0;
  if constexpr (TILED) {
    gemv_load_fragments<GROUP, RUN>(p, ping, first, k_tiles);
  } else if constexpr (MT == 1) {
    gemv_copy_rows<WARPS>(p, smem, a_base, a_step);
    if constexpr (ACT_COPY_FIRST) gemv_load_run<GROUP, RUN>(p, ping, tiles, scale_col, first, k_tiles);
    gemv_wait_rows(smem);
  }

  // Ping-pong between two runs: the next run's loads are in flight while this one computes.
  for (; first < k_tiles; first += 2 * STRIDE) {
    gemv_load_run<GROUP, RUN, TILED>(p, pong, tiles, scale_col, first + STRIDE, k_tiles);
    gemv_compute_run<MT, GROUP, RUN, false, false, false, TILED>(p, ping, first, k_tiles, a_base, a_step, acc);
    gemv_load_run<GROUP, RUN, TILED>(p, ping, tiles, scale_col, first + 2 * STRIDE, k_tiles);
    gemv_compute_run<MT, GROUP, RUN, false, false, false, TILED>(p, pong, first + STRIDE, k_tiles, a_base, a_step, acc);
  }

  if (!p.early_trigger) allow_dependent_grids();  // every weight load is done: the next kernel's may go out
  // Integer partial sums are exact in any order: reduce the warps' K slices through shared memory.
  if constexpr (MT == 1 && !TILED) __syncthreads();  // every warp is done with the activations: partials reuse them
  int* partial = reinterpret_cast<int*>(smem + GEMV_HEADER);  // [WARPS][MT*16 accumulator slots][32 lanes]
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        partial[((warp * MT + mt) * 16 + j * 4 + r) * 32 + lane] = acc[mt][j][r];
  __syncthreads();
  constexpr int SLOTS = MT * 16 * 32;
  for (int i = threadIdx.x; i < SLOTS / 2; i += WARPS * 32) {
    // pair (r, r+1) of one lane: neighbouring columns of one row
    const int slot_lane = i & 31, pair = i >> 5;  // pair = (mt*4 + j)*2 + h
    const int mt = pair >> 3, j = (pair >> 1) & 3, h = pair & 1;
    int sum0 = 0, sum1 = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const int base = ((w * MT + mt) * 16 + j * 4 + 2 * h) * 32 + slot_lane;
      sum0 += partial[base];
      sum1 += partial[base + 32];
    }
    const int row = mt * 16 + (slot_lane >> 2) + 8 * h;
    const int col = n0 * 32 + j * 8 + 2 * (slot_lane & 3);
    if (row < p.M) {
      const int offset = gemv_offset<GROUP>(p, row);
      store_pair(p, row, col, sum0 - offset, sum1 - offset);
    }
  }
}

}  // namespace qoq_gemm
