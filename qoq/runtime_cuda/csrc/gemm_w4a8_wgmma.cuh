// The Hopper W4A8 GEMM for larger M: wgmma (sm_90a) with the weights as the register operand.
//
// D^T = W x X^T: the weights are A (64 channels per wgmma, from registers: each warp dequantizes
// compute-order 32x32 tiles, whose lane bytes are exactly m16n8k32-shaped A fragments, rows 0-15
// from the low nibbles and rows 16-31 from the high ones), the int8 activations are B (tokens as
// wgmma's N, K-major in 128-byte swizzled shared memory). A block is one warpgroup: ROWS = 128
// channels (warp w: tile w, both nibble halves, two m64 wgmmas per k32) or 64 (warp w: one nibble
// half of tile w/2, one wgmma), times BT tokens. With KW > 1 warpgroups a block splits its K range
// among them (k-steps wg, wg + KW, ...; each has its own ring of stages) and adds their sums in the
// epilogue: a grid too small to fill the SMs' warp slots then still keeps KW times the wgmmas and
// loads in flight. A grid still under one wave also splits K across the blocks of a cluster, which
// add their sums through distributed shared memory (wgmma_store). The artifact is read as it is.
//
// Pipeline: the warpgroup's first thread fills each stage with two tensor-map copies (the activation
// box with the 128-byte swizzle, the block's weight tiles of the k-step as one box), counted on the
// stage's mbarrier; the warpgroup's wgmmas of step i still run while it waits for stage i+1 and
// dequantizes it into the other of two fragment sets. Per group each lane loads its s2 / -z words of
// the next step from global memory (L2) a step ahead. A stage is refilled once the wgmmas that read
// it are complete (wait_group 1 after the next step's wgmmas are issued): wgmma is
// warpgroup-collective, so every warp has by then also read its fragments from that stage.
//
// Why: an instrumented build of the previous kernel (every thread cp.async-ing its share of each
// stage, each step's wgmmas drained before the next) spent its k-steps issuing copies, dequantizing
// and waiting for its own wgmmas, hardly ever waiting for data. Copying each n-tile and each 64-byte
// s2 / -z row on its own (several bulk copies a step) was slower than that kernel; two copies a step
// with the scale words from L2, and one table row a step where the group allows it, are faster.
#pragma once

#include <cuda.h>  // CUtensorMap

#include "bulk_copy.cuh"
#include "gemm_w4a8.cuh"
#include "grid_dependency.cuh"

// wgmma exists only on sm_90a; elsewhere the kernel compiles to nothing and the host never picks it.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QOQ_HAS_WGMMA 1
#else
#define QOQ_HAS_WGMMA 0
#endif

namespace qoq_gemm {

constexpr int WG_BK = 128;       // k per stage: one 128-byte swizzle row of activations per token
constexpr int WG_THREADS = 128;  // one warpgroup

template <int ROWS, int BT, int STAGES, int KW>
struct WgmmaSmem {
  static constexpr int ACT = BT * WG_BK;                  // [BT tokens][128 k], swizzled
  static constexpr int W = ROWS * WG_BK / 2;              // [ROWS/32 n-tiles][4 k-tiles][512 B]
  static constexpr int STAGE = (ACT + W + 1023) / 1024 * 1024;  // swizzle atoms need 1 KB
  static constexpr int RING = STAGES * STAGE;             // one warpgroup's stages
  static constexpr int BARRIERS = KW * RING;              // then [KW][STAGES] mbarriers
  static constexpr int TOTAL = BARRIERS + KW * STAGES * 8;
  // shared addresses of warpgroup wg's ring and of its mbarriers, from the block's base
  static __device__ __forceinline__ uint32_t ring(const uint8_t* smem, int wg) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + wg * RING;
  }
  static __device__ __forceinline__ uint32_t bars(const uint8_t* smem, int wg) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + BARRIERS + wg * STAGES * 8;
  }
};

#if QOQ_HAS_WGMMA

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}
// Keeps the compiler from moving accumulators across the asynchronous wgmma window.
template <int R>
__device__ __forceinline__ void fence_operands(int (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// Descriptor of a K-major operand in 128-byte swizzled rows (8-row atoms 1024 bytes apart) at shared
// address `addr`: its low word, which alone changes with the address (k32 step kk of a stage is + 2 * kk,
// 32 bytes, never carrying out of the 14-bit address field), then the whole descriptor.
__device__ __forceinline__ uint32_t sw128_desc_lo(uint32_t addr) { return ((addr & 0x3ffff) >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t sw128_desc(uint32_t lo) {
  constexpr uint32_t HI = (1024 >> 4) | (1u << 30);  // stride 1024 bytes; swizzle mode 128 B (bit 62)
  uint64_t desc;
  asm("mov.b64 %0, {%1, %2};\n" : "=l"(desc) : "r"(lo), "r"(HI));
  return desc;
}

// D[64 x N] (+)= A (registers, u8) x B (shared memory, s8, K-major), s32; N = 64 here and 128 below:
// the accumulator array's size picks the overload.
__device__ __forceinline__ void wgmma_m64k32(int (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_m64k32(int (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// Which copies of a stage fill_stage issues: a programmatic dependent's prologue issues the weights'
// before waiting for the kernel ahead and the activations' after it (grid_dependency.cuh).
enum class Fill { Both, Weights, Activations };

// A warpgroup's step i (its k-step first + i * KW) into its ring slot i % STAGES: the activations
// [BT tokens][128 k] and the weight tiles [ROWS/32 n-tiles][4 k-tiles][512 B], counted on the slot's
// mbarrier (Fill::Weights counts both); zeros past M, N and K, so a K tail multiplies zeros.
template <int ROWS, int BT, int STAGES, int KW, Fill WHAT = Fill::Both>
__device__ __forceinline__ void fill_stage(const CUtensorMap& act_map, const CUtensorMap& w_map, uint32_t ring,
                                           uint32_t bars, int i, int first, int m_base, int n_base) {
  using S = WgmmaSmem<ROWS, BT, STAGES, KW>;
  const uint32_t stage = ring + (i % STAGES) * S::STAGE, bar = bars + (i % STAGES) * 8;
  const int kt = first + i * KW;
  if constexpr (WHAT != Fill::Activations) mbarrier_expect_tx(bar, S::ACT + S::W);
  if constexpr (WHAT != Fill::Weights) tensor_copy_2d(stage, &act_map, kt * WG_BK, m_base, bar);
  if constexpr (WHAT != Fill::Activations)
    tensor_copy_4d(stage + S::ACT, &w_map, 0, 0, kt * (WG_BK / 32), n_base / 32, bar);
}

// Per group: where a lane's s2 and -z words (its 4 channels of its n-tile) lie in every table row.
struct ScaleColumn {
  int col;     // row r's words are at byte r * N + col of each table
  bool valid;  // the channels exist (past N: those fragments are never stored)
  __device__ __forceinline__ ScaleColumn(const GemmParams& p, int c) : col(c), valid(c < p.N) {}
};

// Per group: the s2 and -z words of the TABLE_ROWS table rows of block k-step kt (one per
// WG_BK / TABLE_ROWS k); zero past N and K (those fragments multiply zero activations or are never stored).
template <int TABLE_ROWS>
__device__ __forceinline__ void load_step_scales(const GemmParams& p, const ScaleColumn& c, int kt,
                                                 uint32_t (&s2)[TABLE_ROWS], uint32_t (&zeros)[TABLE_ROWS]) {
#pragma unroll
  for (int r = 0; r < TABLE_ROWS; ++r) {
    const int k = kt * WG_BK + r * (WG_BK / TABLE_ROWS);
    const bool valid = c.valid && k < p.K;
    // row * N + col < N * K / 64, a 32nd of the packed weights' bytes: int32 holds it
    const uint32_t at = static_cast<uint32_t>(group_row(k, p.group) * p.N + c.col);
    s2[r] = valid ? __ldg(reinterpret_cast<const uint32_t*>(p.s2 + at)) : 0;
    zeros[r] = valid ? __ldg(reinterpret_cast<const uint32_t*>(p.s2_zeros + at)) : 0;
  }
}

__device__ __forceinline__ void add_int4(int4& a, const int4& b) {
  a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
}

// The sums of 8 consecutive channels of one token: raw (acc_out) or through the epilogue.
__device__ __forceinline__ void store_sums8(const GemmParams& p, int row, int col, const int4& lo, const int4& hi) {
  const size_t idx = static_cast<size_t>(row) * p.N + col;
  if (p.acc_out != nullptr) {
    *reinterpret_cast<int4*>(p.acc_out + idx) = lo;
    *reinterpret_cast<int4*>(p.acc_out + idx + 4) = hi;
  } else {
    const int v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    *reinterpret_cast<uint4*>(p.out + idx) = epilogue8(p, row, col, v);
  }
}

// The epilogue: each warpgroup's accumulators go through shared memory ([BT tokens][ROWS channels]
// int32, rows padded by 4 words: conflict-free; one such tile per warpgroup), so that each thread then
// writes 8 consecutive channels of a token, the warpgroups' sums added. A grid split over K runs each
// tile's splits as one cluster (blockIdx.z = its rank): every block then adds the tiles of all the
// cluster's blocks for 1/splits of the items through distributed shared memory, so the partial sums
// never leave the SMs (no zeroed workspace, atomics or second kernel). The stages' loads have all landed.
template <int ROWS, int BT, bool GROUPED, int KW, int H, int ACC>
__device__ __forceinline__ void wgmma_store(const GemmParams& p, uint8_t* smem, const int (&acc)[H][ACC], int my_steps,
                                            int m_base, int n_base, int lane, int warp, int wg) {
  __syncthreads();  // every warp is done with the stages
  constexpr int ROW = ROWS + 4;
  int* tiles = reinterpret_cast<int*>(smem);
  int* tile = tiles + wg * BT * ROW;
  const bool live = KW == 1 || my_steps > 0;  // a warpgroup without k-steps adds zeros
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < BT / 8; ++j)
#pragma unroll
    for (int x = 0; x < 2; ++x) {  // acc[hh][4j + 2e + x]: token 8j + 2t + x
      const int token = 8 * j + 2 * t + x;
      // GROUPED: the fragments held W8 + 128, so 128 * (the token's sum of qx over K) comes off,
      // once: by the first warpgroup of the first K split
      const bool offset_here = GROUPED && blockIdx.z == 0 && wg == 0 && m_base + token < p.M;
      const int offset = offset_here ? 128 * p.qsum[m_base + token] : 0;
#pragma unroll
      for (int hh = 0; hh < H; ++hh) {
        // per channel the high-nibble rows (tile rows 16-31) summed 16q: exact multiples of 16
        const int shift = !GROUPED && (H == 2 ? hh == 1 : (warp & 1) == 1) ? 4 : 0;
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // channel 32*tile + 16*half + 8e + g
          const int channel = (H == 2 ? 32 * warp + 16 * hh : 16 * warp) + 8 * e + g;
          tile[token * ROW + channel] = (live ? acc[hh][4 * j + 2 * e + x] >> shift : 0) - offset;
        }
      }
    }
  constexpr int ITEMS = BT * ROWS / 8;  // 8 consecutive channels of a token
  const int splits = gridDim.z;          // the blocks of this tile's cluster
  if (splits == 1) {  // kept apart: one loop for both was slower at large M
    __syncthreads();
    for (int item = threadIdx.x; item < ITEMS; item += KW * WG_THREADS) {
      const int r = item / (ROWS / 8), c8 = (item % (ROWS / 8)) * 8;
      if (m_base + r >= p.M || n_base + c8 >= p.N) continue;  // N is a multiple of 32: all 8 columns or none
      int4 lo = *reinterpret_cast<const int4*>(tiles + r * ROW + c8);
      int4 hi = *reinterpret_cast<const int4*>(tiles + r * ROW + c8 + 4);
#pragma unroll
      for (int w = 1; w < KW; ++w) {
        add_int4(lo, *reinterpret_cast<const int4*>(tiles + w * BT * ROW + r * ROW + c8));
        add_int4(hi, *reinterpret_cast<const int4*>(tiles + w * BT * ROW + r * ROW + c8 + 4));
      }
      store_sums8(p, m_base + r, n_base + c8, lo, hi);
    }
    return;
  }
  cluster_sync();  // every block's tiles are written (and visible cluster-wide)
  const uint32_t tiles_addr = static_cast<uint32_t>(__cvta_generic_to_shared(tiles));
  for (int item = blockIdx.z * KW * WG_THREADS + threadIdx.x; item < ITEMS; item += splits * KW * WG_THREADS) {
    const int r = item / (ROWS / 8), c8 = (item % (ROWS / 8)) * 8;
    if (m_base + r >= p.M || n_base + c8 >= p.N) continue;
    int4 lo = make_int4(0, 0, 0, 0), hi = lo;
    for (int z = 0; z < splits; ++z)
#pragma unroll
      for (int w = 0; w < KW; ++w) {
        const int at = w * BT * ROW + r * ROW + c8;
        add_int4(lo, load_cluster_int4(tiles_addr + 4 * at, z));
        add_int4(hi, load_cluster_int4(tiles_addr + 4 * (at + 4), z));
      }
    store_sums8(p, m_base + r, n_base + c8, lo, hi);
  }
  cluster_sync();  // no block leaves while another still reads its tiles
}
#endif  // QOQ_HAS_WGMMA

// 16 packed bytes of one lane -> u8 A fragments of the warp's H wgmmas. H = 2: both nibble halves
// (blocks 0-3); H = 1: the half `half` (blocks 2*half, 2*half + 1). Per channel a fragment is the codes
// with the high nibbles left in place: 16q, so that those rows' sums come out 16 times too large and
// wgmma_store shifts them back (exact), one LOP3 per register instead of a shift and a LOP3. Per group
// it is W8 + 128 = q*s2 + bias (shift, LOP3, IMAD). Per group, taking the high nibbles as
// hi32((16q) * (s2 << 28) + ...) in one IMAD.HI instead of the shift was slower.
template <bool GROUPED, int H>
__device__ __forceinline__ void dequant_fragments(const uint4& packed, const BiasedScales<2 * H>& bs, int half,
                                                  uint32_t (&a)[H][4]) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
  const bool high_half = H == 1 && half == 1;  // H = 1: this warp's rows are the tile's rows 16-31
#pragma unroll
  for (int hh = 0; hh < H; ++hh) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // fragment r: row g + 8*(r & 1) (n8 block 2*half + (r & 1)), k half r >> 1
      const uint32_t w = words[2 * (r >> 1) + (r & 1)];
      const int block = 2 * hh + (r & 1);
      const bool high = hh == 1 || high_half;
      if constexpr (GROUPED) a[hh][r] = bs.apply((w >> (high ? 4 : 0)) & 0x0f0f0f0fu, block);
      else a[hh][r] = w & (high ? 0xf0f0f0f0u : 0x0f0f0f0fu);
    }
  }
}

// The k-loop of one warpgroup of a block: its k-steps wg, wg + KW, ... of the block's K range, through its
// own ring, whose first stages its first thread (the ring's producer) has already requested. The
// warpgroup index is warp-uniform to the compiler (a constant, or a shuffle from lane 0: derived from
// threadIdx.x it is not, even under a branch on it), so everything but the lane's own offsets (stage and
// barrier addresses, phases, descriptors, scale rows) stays in uniform registers; with wg read from
// threadIdx.x, ptxas recomputed it per lane every step and moved each descriptor by R2UR: more
// instructions per k-step, and slower.
template <int ROWS, int BT, int STAGES, int SCALE_ROWS, int KW, int H, int ACC>
__device__ __forceinline__ void wgmma_k_loop(const CUtensorMap& act_map, const CUtensorMap& w_map, const GemmParams& p,
                                             uint8_t* smem, int steps, int kt0, int m_base, int n_base,
                                             int (&acc)[H][ACC]) {
#if QOQ_HAS_WGMMA
  using S = WgmmaSmem<ROWS, BT, STAGES, KW>;
  constexpr bool GROUPED = SCALE_ROWS > 0;
  constexpr int K_TILES = WG_BK / 32, TABLE_ROWS = GROUPED ? SCALE_ROWS : 1;
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % 4;
  const int tile = H == 2 ? warp : warp >> 1, half = warp & 1;  // half: only for H = 1
  const int wg = KW == 1 ? 0 : __shfl_sync(0xffffffffu, threadIdx.x / WG_THREADS, 0);
  const int my_steps = (steps - wg + KW - 1) / KW;  // maybe none
  const uint32_t ring = S::ring(smem, wg), bars = S::bars(smem, wg);
  // the lane's offset in a stage's weight tiles, opaque so that ptxas keeps it instead of recomputing it
  // from threadIdx.x every step
  uint32_t lane_w = S::ACT + tile * K_TILES * 512 + lane * 16;  // + stage, + 512 kk
  asm volatile("" : "+r"(lane_w));
  const uint8_t* ring_ptr = smem + wg * S::RING;
  const bool producer = threadIdx.x == wg * WG_THREADS;  // its first STAGES steps are already on their way
  uint32_t a0[K_TILES][H][4], a1[K_TILES][H][4];  // [k32 step][wgmma]; steps alternate between the two
  const ScaleColumn scales(p, n_base + tile * 32 + 4 * (lane >> 2));
  uint32_t s2_next[TABLE_ROWS] = {}, zeros_next[TABLE_ROWS] = {};  // per group: the next step's scale words
  if (GROUPED && my_steps > 0) load_step_scales(p, scales, kt0 + wg, s2_next, zeros_next);
  const auto step = [&](int i, uint32_t (&a)[K_TILES][H][4]) {
    const int stage = (i % STAGES) * S::STAGE;
    BiasedScales<2 * H> bs[TABLE_ROWS] = {};
    if constexpr (GROUPED) {
#pragma unroll
      for (int r = 0; r < TABLE_ROWS; ++r)
        bs[r] = unpack_biased_scales<2 * H>(s2_next[r], zeros_next[r], H == 2 ? 0 : 2 * half);
      if (i + 1 < my_steps) load_step_scales(p, scales, kt0 + wg + (i + 1) * KW, s2_next, zeros_next);
    }
    mbarrier_wait(bars + (i % STAGES) * 8, (i / STAGES) & 1);
#pragma unroll
    for (int kk = 0; kk < K_TILES; ++kk) {
      const uint4 packed = *reinterpret_cast<const uint4*>(ring_ptr + stage + lane_w + kk * 512);
      dequant_fragments<GROUPED, H>(packed, bs[kk * TABLE_ROWS / K_TILES], half, a[kk]);
    }
    const uint32_t desc = sw128_desc_lo(ring + stage);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < K_TILES; ++kk)
#pragma unroll
      for (int hh = 0; hh < H; ++hh)
        wgmma_m64k32(acc[hh], a[kk][hh], sw128_desc(desc + 2 * kk), i > 0 || kk > 0);
    wgmma_commit();
    wgmma_wait<1>();  // step i-1's wgmmas are complete: its slot takes step i-1 + STAGES
    if (producer && i > 0 && i - 1 + STAGES < my_steps)
      fill_stage<ROWS, BT, STAGES, KW>(act_map, w_map, ring, bars, i - 1 + STAGES, kt0 + wg, m_base, n_base);
  };
  // Pairs, then an odd last step outside the loop: a conditional second step inside it would give
  // ptxas a path that redefines a0 while its wgmmas may still run, and it serializes every wgmma.
  int i = 0;
  for (; i + 1 < my_steps; i += 2) {
    step(i, a0);
    step(i + 1, a1);
  }
  if (i < my_steps) step(i, a0);
  wgmma_wait<0>();
#pragma unroll
  for (int hh = 0; hh < H; ++hh) fence_operands(acc[hh]);  // no read of them moves above the last wait
#endif
}

// Block: ROWS channels x BT tokens, KW warpgroups taking alternate k-steps of its K range (wgmma_k_loop).
// KW = 2 asks for two blocks per SM (at most 128 registers a thread); KW = 1 keeps the compiler's own
// register choice. SCALE_ROWS: 0 per channel, else the s2 / -z rows a k-step spans (1 for groups that
// are multiples of 128, 2 for other multiples of 64): one row a step saves a warp ~20 instructions.
template <int ROWS, int BT, int STAGES, int SCALE_ROWS, int KW>
__global__ void __launch_bounds__(KW * WG_THREADS, KW == 1 ? 0 : 2)
    gemm_wgmma_kernel(const __grid_constant__ CUtensorMap act_map, const __grid_constant__ CUtensorMap w_map,
                      const GemmParams p) {
#if QOQ_HAS_WGMMA
  using S = WgmmaSmem<ROWS, BT, STAGES, KW>;
  constexpr int H = ROWS / 64, ACC = BT / 2;
  static_assert(BT * (ROWS + 4) * 4 <= S::RING, "epilogue tiles");
  // 1024-byte aligned for the swizzle atoms (the dynamic window starts past the 1 KB the driver keeps);
  // trusted by the compiler, so that no step recomputes an alignment, and checked once
  extern __shared__ __align__(1024) uint8_t wgmma_smem[];
  uint8_t* smem = wgmma_smem;
  if (threadIdx.x == 0 && (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) & 1023) != 0) __trap();
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % 4, wg = threadIdx.x / WG_THREADS;
  const int m_base = blockIdx.x * BT, n_base = blockIdx.y * ROWS;
  const int kt0 = blockIdx.z * p.split_steps;
  const int steps = min(p.split_steps, (p.K + WG_BK - 1) / WG_BK - kt0);  // >= 1 (K > 0)
  const int my_steps = (steps - wg + KW - 1) / KW;  // this warpgroup's: k-steps wg, wg + KW, ... (maybe none)
  // Each warpgroup's producer: its barriers and first stages. A programmatic dependent issues their
  // weight copies before waiting for the kernel ahead, which writes the activations (and the epilogue's
  // terms: every thread waits).
  const bool producer = threadIdx.x % WG_THREADS == 0;
  const uint32_t ring = S::ring(smem, wg), bars = S::bars(smem, wg);
  const int first_stages = min(STAGES, my_steps);
  if (producer) {
    for (int s = 0; s < STAGES; ++s) mbarrier_init(bars + s * 8);
    for (int s = 0; s < first_stages; ++s) {
      if (p.dependent)
        fill_stage<ROWS, BT, STAGES, KW, Fill::Weights>(act_map, w_map, ring, bars, s, kt0 + wg, m_base, n_base);
      else
        fill_stage<ROWS, BT, STAGES, KW>(act_map, w_map, ring, bars, s, kt0 + wg, m_base, n_base);
    }
  }
  wait_prior_grids();
  if (producer && p.dependent) {
    for (int s = 0; s < first_stages; ++s)
      fill_stage<ROWS, BT, STAGES, KW, Fill::Activations>(act_map, w_map, ring, bars, s, kt0 + wg, m_base, n_base);
  }
  __syncthreads();  // the barriers are initialized before anyone waits on them
  int acc[H][ACC];  // the first wgmma overwrites them (accumulate = 0): no other instruction writes them
  wgmma_k_loop<ROWS, BT, STAGES, SCALE_ROWS, KW>(act_map, w_map, p, smem, steps, kt0, m_base, n_base, acc);
  allow_dependent_grids();  // every weight copy is done: the next kernel's may go out
  wgmma_store<ROWS, BT, SCALE_ROWS != 0, KW, H, ACC>(p, smem, acc, my_steps, m_base, n_base, lane, warp, wg);
#endif
}

}  // namespace qoq_gemm
