// The Hopper W4A8 GEMM for larger M: wgmma (sm_90a) with the weights as the register operand.
//
// D^T = W x X^T: the weights are A (64 channels per wgmma, from registers: each warp dequantizes
// compute-order 32x32 tiles, whose lane bytes are exactly m16n8k32-shaped A fragments, rows 0-15
// from the low nibbles and rows 16-31 from the high ones), the int8 activations are B (tokens as
// wgmma's N, K-major in 128-byte swizzled shared memory, staged by cp.async). A block is one
// warpgroup: ROWS = 128 channels (warp w: tile w, both nibble halves, two m64 wgmmas per k32) or
// 64 (warp w: one nibble half of tile w/2, one wgmma), times BT tokens. With KW > 1 warpgroups a
// block splits its K range among them (k-steps wg, wg + KW, ...; each has its own ring of stages)
// and adds their sums in the epilogue: a grid too small to fill the SMs' warp slots then still keeps
// KW times the wgmmas and loads in flight, without the atomics of a split across blocks. The
// artifact is read as it is: no repacking.
#pragma once

#include "gemm_w4a8.cuh"

// wgmma exists only on sm_90a; elsewhere the kernel compiles to nothing and the host never picks it.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QOQ_HAS_WGMMA 1
#else
#define QOQ_HAS_WGMMA 0
#endif

namespace qoq_gemm {

constexpr int WG_BK = 128;       // k per stage: one 128-byte swizzle row of activations per token
constexpr int WG_THREADS = 128;  // one warpgroup

template <int ROWS, int BT, int STAGES, int KW = 1>
struct WgmmaSmem {
  static constexpr int ACT = BT * WG_BK;                        // [BT tokens][128 k], swizzled
  static constexpr int W = ROWS * WG_BK / 2;                    // ROWS/32 n-tiles x 4 k-tiles x 512 B
  static constexpr int SCALES = WG_BK / SCALE_SPAN * 2 * ROWS;  // per 64 k: s2 row, -z row
  static constexpr int STAGE = (ACT + W + SCALES + 1023) / 1024 * 1024;  // swizzle atoms need 1 KB
  static constexpr int RING = STAGES * STAGE;                    // one warpgroup's stages
  static constexpr int TOTAL = KW * RING + 1024;                 // + slack to align the base
};

#if QOQ_HAS_WGMMA

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}
// cp.async wrote the tiles through the generic proxy; wgmma reads them through the async one.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving accumulators across the asynchronous wgmma window.
template <int R>
__device__ __forceinline__ void fence_operands(int (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// Descriptor of a K-major operand in 128-byte swizzled rows: 8-row atoms 1024 bytes apart.
__device__ __forceinline__ uint64_t sw128_desc(const void* smem) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// D[64 x N] (+)= A (registers; s8, or u8 when A_UNSIGNED) x B (shared memory, s8, K-major), s32;
// N = 64 here and 128 below: the accumulator array's size picks the overload.
template <bool A_UNSIGNED>
__device__ __forceinline__ void wgmma_m64k32(int (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
#define QOQ_WGMMA_N64(ATYPE)                                                                          \
  asm volatile(                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n64k32.s32." ATYPE ".s8 {"                                   \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"  \
      "}, {%32, %33, %34, %35}, %36, p;\n}\n"                                                             \
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), \
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), \
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), \
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
  if constexpr (A_UNSIGNED) QOQ_WGMMA_N64("u8");
  else QOQ_WGMMA_N64("s8");
#undef QOQ_WGMMA_N64
}

template <bool A_UNSIGNED>
__device__ __forceinline__ void wgmma_m64k32(int (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
#define QOQ_WGMMA_N128(ATYPE)                                                                          \
  asm volatile(                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n128k32.s32." ATYPE ".s8 {"                                   \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"  \
      "}, {%64, %65, %66, %67}, %68, p;\n}\n"                                                             \
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), \
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), \
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), \
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), \
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), \
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), \
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), \
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
  if constexpr (A_UNSIGNED) QOQ_WGMMA_N128("u8");
  else QOQ_WGMMA_N128("s8");
#undef QOQ_WGMMA_N128
}

#endif  // QOQ_HAS_WGMMA

// 16 packed bytes of one lane -> A fragments of the warp's H wgmmas (GROUPED: W8 + 128 as u8).
// H = 2: both nibble halves (blocks 0-3); H = 1: the half `half` (blocks 2*half, 2*half + 1).
template <bool GROUPED, int H>
__device__ __forceinline__ void dequant_fragments(const uint4& packed, const BiasedScales<2 * H>& bs, int half,
                                                  uint32_t (&a)[H][4]) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int hh = 0; hh < H; ++hh) {
    const int shift = 4 * (H == 2 ? hh : half);  // low / high nibbles: tile rows 0-15 / 16-31
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // fragment r: row g + 8*(r & 1) (n8 block 2*half + (r & 1)), k half r >> 1
      const uint32_t q = (words[2 * (r >> 1) + (r & 1)] >> shift) & 0x0f0f0f0fu;
      a[hh][r] = GROUPED ? bs.apply(q, 2 * hh + (r & 1)) : q;
    }
  }
}

// What one thread copies into each stage, addresses worked out once (per k-step only k moves):
// activation chunks of token rows 16 apart at one 16-byte column (chunk c of row r lands at chunk
// c ^ (r % 8), the 128-byte swizzle), the block's n-tiles at one k-tile and lane, and for the first
// threads one 16-byte chunk of an s2 / -z table row.
template <int ROWS, int BT, bool GROUPED, int KW>
struct StageLoader {
  using S = WgmmaSmem<ROWS, BT, 1>;
  static constexpr int K_TILES = WG_BK / 32, ROW_STEP = WG_THREADS / 8, ACT_CHUNKS = BT / ROW_STEP;
  static constexpr int N_TILES = ROWS / 32;             // one chunk of each per thread
  static constexpr int TABLE_CHUNKS = ROWS / 16;        // per table row
  static constexpr int TABLE_THREADS = WG_BK / SCALE_SPAN * 2 * TABLE_CHUNKS;  // [span][s2 | -z][ROWS]

  const int8_t* act;  // chunk 0 at k = 0
  const uint8_t* w;   // n-tile 0 at k-step 0
  size_t act_stride, w_stride;      // bytes from chunk j to j+1
  int act_rows_left, w_tiles_left;  // chunk j is a real token / n-tile while j*step < these
  int act_k, w_k_tile;
  uint32_t act_dst, w_dst;

  // tid: the thread's index in its warpgroup, spelled out in each function as it is (a shared helper
  // or a signed/unsigned change here altered ptxas's schedule of the main loop and made wg128x128 per
  // group 10% slower at K = 11008 and wg64x64k2 4% slower on the H200, same-call A/B)
  __device__ __forceinline__ StageLoader(const GemmParams& p, int m_base, int n_base) {
    const int tid = KW == 1 ? threadIdx.x : threadIdx.x % WG_THREADS, r0 = tid >> 3, k_tiles = p.K / 32;
    act_k = (tid & 7) * 16;
    w_k_tile = (tid >> 5) % K_TILES;
    act_rows_left = p.M - m_base - r0;
    w_tiles_left = p.N / 32 - n_base / 32;
    act = p.qx + (static_cast<size_t>(m_base + r0) * p.K + act_k);
    act_stride = static_cast<size_t>(ROW_STEP) * p.K;
    w = p.qweight + ((static_cast<size_t>(n_base / 32) * k_tiles + w_k_tile) * 512 + (tid & 31) * 16);
    w_stride = static_cast<size_t>(k_tiles) * 512;
    act_dst = r0 * WG_BK + (((tid & 7) ^ (r0 & 7)) << 4);  // ROW_STEP is a multiple of 8: same swizzle
    w_dst = S::ACT + w_k_tile * 512 + (tid & 31) * 16;
  }

  __device__ __forceinline__ void load(const GemmParams& p, uint8_t* stage, int kt, int n_base) const {
    const int tid = KW == 1 ? threadIdx.x : threadIdx.x % WG_THREADS;
    const bool act_k_ok = kt * WG_BK + act_k < p.K, w_k_ok = kt * K_TILES + w_k_tile < p.K / 32;
#pragma unroll
    for (int j = 0; j < ACT_CHUNKS; ++j) {  // tokens past M and a K tail read zeros
      const bool valid = act_k_ok && j * ROW_STEP < act_rows_left;
      cp_async16(stage + act_dst + j * ROW_STEP * WG_BK, valid ? act + j * act_stride + kt * WG_BK : p.qx, valid);
    }
#pragma unroll
    for (int j = 0; j < N_TILES; ++j) {
      const bool valid = w_k_ok && j < w_tiles_left;
      cp_async16(stage + w_dst + j * K_TILES * 512,
                 valid ? w + j * w_stride + static_cast<size_t>(kt) * K_TILES * 512 : p.qweight, valid);
    }
    if (GROUPED && tid < TABLE_THREADS) {
      const int span = tid / (2 * TABLE_CHUNKS), table_id = (tid / TABLE_CHUNKS) % 2;
      const int8_t* table = table_id == 0 ? p.s2 : p.s2_zeros;
      const int n = n_base + (tid % TABLE_CHUNKS) * 16, k = kt * WG_BK + span * SCALE_SPAN;
      const bool valid = n < p.N && k < p.K;
      cp_async16(stage + S::ACT + S::W + tid * 16,
                 table + (valid ? static_cast<size_t>(group_row(k, p.group)) * p.N + n : 0), valid);
    }
  }
};

#if QOQ_HAS_WGMMA
// Waits for every thread of warpgroup wg: barrier 1 + wg (0 is __syncthreads, which a block of one
// warpgroup uses). Immediate ids: a register id makes ptxas reserve all 16 barriers.
template <int KW>
__device__ __forceinline__ void warpgroup_sync(int wg) {
  static_assert(KW <= 2, "barrier ids for two warpgroups");
  if constexpr (KW == 1) __syncthreads();
  else if (wg == 0) asm volatile("bar.sync 1, %0;\n" ::"n"(WG_THREADS) : "memory");
  else asm volatile("bar.sync 2, %0;\n" ::"n"(WG_THREADS) : "memory");
}

// The warpgroup's k-step i (block k-step kt_first + i * KW) in its ring: refill the buffer of step
// i-1, dequantize all of this warp's fragments, issue its wgmmas and wait for them. (Dequantizing the
// next k32 step while this one's wgmmas ran, waiting for all but the latest group, once computed wrong
// sums, most likely because that refill overwrote the stage the last wgmmas of step i-1 still read.
// Refilling step i-2's stage instead was correct but measured 3-14% slower for 64x64 tiles and at
// most 6% faster for 128x128 on the H200, so each step drains.)
template <int ROWS, int BT, int STAGES, bool GROUPED, int KW, int H, int ACC>
__device__ __forceinline__ void wgmma_step(const GemmParams& p, const StageLoader<ROWS, BT, GROUPED, KW>& loader,
                                           uint8_t* ring, int i, int steps, int kt_first, int n_base,
                                           int (&acc)[H][ACC]) {
  using S = WgmmaSmem<ROWS, BT, STAGES>;
  constexpr int K_TILES = WG_BK / 32;
  const int lane = threadIdx.x & 31, warp = KW == 1 ? threadIdx.x >> 5 : (threadIdx.x >> 5) % 4;
  const int wg = KW == 1 ? 0 : threadIdx.x / WG_THREADS;
  const int tile = H == 2 ? warp : warp >> 1, half = warp & 1;  // half: only for H = 1
  cp_async_wait<STAGES - 2>();
  fence_proxy_async();
  warpgroup_sync<KW>(wg);  // stage i landed for all; every wgmma of step i-1 is done
  const int next = i + STAGES - 1;
  if (next < steps) loader.load(p, ring + (next % STAGES) * S::STAGE, kt_first + next * KW, n_base);
  cp_async_commit();

  const uint8_t* stage = ring + (i % STAGES) * S::STAGE;
  BiasedScales<2 * H> bs[WG_BK / SCALE_SPAN] = {};
  if constexpr (GROUPED) {
#pragma unroll
    for (int span = 0; span < WG_BK / SCALE_SPAN; ++span) {
      const uint8_t* scales = stage + S::ACT + S::W + span * 2 * ROWS + tile * 32 + 4 * (lane >> 2);
      bs[span] = unpack_biased_scales<2 * H>(*reinterpret_cast<const uint32_t*>(scales),
                                             *reinterpret_cast<const uint32_t*>(scales + ROWS), H == 2 ? 0 : 2 * half);
    }
  }
  uint32_t a[K_TILES][H][4];  // [k32 step][wgmma]: rows g, g+8 x k 0-15, 16-31
#pragma unroll
  for (int kk = 0; kk < K_TILES; ++kk) {
    const uint4 packed = *reinterpret_cast<const uint4*>(stage + S::ACT + (tile * K_TILES + kk) * 512 + lane * 16);
    dequant_fragments<GROUPED, H>(packed, bs[kk * 32 / SCALE_SPAN], half, a[kk]);
  }
  const uint64_t desc = sw128_desc(stage);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K_TILES; ++kk)
#pragma unroll
    for (int hh = 0; hh < H; ++hh)
      wgmma_m64k32<GROUPED>(acc[hh], a[kk][hh], desc + 2 * kk, i > 0 || kk > 0);  // +32 B of k; N = BT
  wgmma_commit();
  wgmma_wait<0>();
}
#endif  // QOQ_HAS_WGMMA

// Block: ROWS channels x BT tokens, KW warpgroups sharing its K range. KW = 2 asks for two blocks per
// SM (at most 128 registers a thread); KW = 1 keeps the compiler's own register choice.
template <int ROWS, int BT, int STAGES, bool GROUPED, int KW>
__global__ void __launch_bounds__(KW * WG_THREADS, KW == 1 ? 0 : 2) gemm_wgmma_kernel(const GemmParams p) {
#if QOQ_HAS_WGMMA
  using S = WgmmaSmem<ROWS, BT, STAGES, KW>;
  constexpr int H = ROWS / 64, ACC = BT / 2;
  extern __shared__ uint8_t smem_raw[];
  // Offset (not an integer-to-pointer cast): the compiler then still knows these are shared loads.
  uint8_t* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  const int lane = threadIdx.x & 31, warp = KW == 1 ? threadIdx.x >> 5 : (threadIdx.x >> 5) % 4;
  const int wg = KW == 1 ? 0 : threadIdx.x / WG_THREADS;
  const int m_base = blockIdx.x * BT, n_base = blockIdx.y * ROWS;
  const int kt0 = blockIdx.z * p.split_steps;
  const int steps = min(p.split_steps, (p.K + WG_BK - 1) / WG_BK - kt0);  // >= 1 (K > 0)
  const int my_steps = (steps - wg + KW - 1) / KW;  // this warpgroup's: k-steps wg, wg + KW, ... (maybe none)
  uint8_t* ring = smem + wg * S::RING;

  int acc[H][ACC];  // the first wgmma overwrites them (accumulate = 0): no other instruction writes them

  // Stages are loaded STAGES - 1 steps ahead.
  const StageLoader<ROWS, BT, GROUPED, KW> loader(p, m_base, n_base);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < my_steps) loader.load(p, ring + s * S::STAGE, kt0 + wg + s * KW, n_base);
    cp_async_commit();
  }
  for (int i = 0; i < my_steps; ++i)
    wgmma_step<ROWS, BT, STAGES, GROUPED, KW, H>(p, loader, ring, i, my_steps, kt0 + wg, n_base, acc);
#pragma unroll
  for (int hh = 0; hh < H; ++hh) fence_operands(acc[hh]);  // no read of them moves above the last wait

  // Each warpgroup's accumulators go through shared memory ([BT tokens][ROWS channels] int32, rows
  // padded by 4 words: conflict-free; one such tile per warpgroup), so that each thread then writes 8
  // consecutive channels of a token, the warpgroups' sums added.
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages
  constexpr int ROW = ROWS + 4;
  static_assert(BT * ROW * 4 <= S::RING, "epilogue tiles");
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
      for (int hh = 0; hh < H; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // channel 32*tile + 16*half + 8e + g
          const int channel = (H == 2 ? 32 * warp + 16 * hh : 16 * warp) + 8 * e + g;
          tile[token * ROW + channel] = (live ? acc[hh][4 * j + 2 * e + x] : 0) - offset;
        }
    }
  __syncthreads();
  for (int item = threadIdx.x; item < BT * ROWS / 8; item += KW * WG_THREADS) {
    const int r = item / (ROWS / 8), c8 = (item % (ROWS / 8)) * 8;
    const int row = m_base + r, col = n_base + c8;
    if (row >= p.M || col >= p.N) continue;  // N is a multiple of 32: all 8 columns or none
    int4 lo = *reinterpret_cast<const int4*>(tiles + r * ROW + c8);
    int4 hi = *reinterpret_cast<const int4*>(tiles + r * ROW + c8 + 4);
#pragma unroll
    for (int w = 1; w < KW; ++w) {
      const int4 lo_w = *reinterpret_cast<const int4*>(tiles + w * BT * ROW + r * ROW + c8);
      const int4 hi_w = *reinterpret_cast<const int4*>(tiles + w * BT * ROW + r * ROW + c8 + 4);
      lo = make_int4(lo.x + lo_w.x, lo.y + lo_w.y, lo.z + lo_w.z, lo.w + lo_w.w);
      hi = make_int4(hi.x + hi_w.x, hi.y + hi_w.y, hi.z + hi_w.z, hi.w + hi_w.w);
    }
    const int v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const size_t idx = static_cast<size_t>(row) * p.N + col;
    if (p.split_acc != nullptr) {  // integer sums are exact in any order
#pragma unroll
      for (int q = 0; q < 8; ++q) atomicAdd(p.split_acc + idx + q, v[q]);
    } else if (p.acc_out != nullptr) {
      *reinterpret_cast<int4*>(p.acc_out + idx) = lo;
      *reinterpret_cast<int4*>(p.acc_out + idx + 4) = hi;
    } else {
      *reinterpret_cast<uint4*>(p.out + idx) = epilogue8(p, row, col, v);
    }
  }
#endif
}

}  // namespace qoq_gemm
