// Decode attention over KV4 pages (one query token per sequence), flash-decoding style.
//
// One CTA per (split of the KV length, KV head, sequence); all G <= 8 query heads of the KV head
// share it, so each K/V byte is read once. Each warp walks chunks of 16*256/D tokens through a
// ring of 2 or 3 shared-memory slots (the page's bytes, swizzled) filled by 16-byte cp.async, so
// several chunks' loads are in flight without holding registers. Math runs on the tensor cores, on
// the 4-bit codes themselves read as fp16 subnormals (subnormal_codes8: a mask per 2 codes):
//   S[t, g] = sum_d codeK[t,d] * q[g,d]            (mma: A = codes, 16 tokens; B = q, 8 heads)
//   score   = scaleK[t] * (S - zeroK[t] * sum_d q[g,d])
//   O[d, g] = sum_t codeV[t,d] * w[t,g] - sum_t zeroV[t] * w[t,g],  w = fp16(p) * scaleV[t]
// where w, transposed in registers (movmatrix), is the B operand of the V mma and the second sum is
// one more mma per 16 tokens (A = zeroV in every row); no code ever needs a per-element scale. The
// head_dim order inside the mma is permuted (any order gives the same dot product), and so is the
// token order inside a 16-token block, identically for K and V. Splits are merged in
// attention_decode_combine.cuh.
#include <cmath>

#include "attention_decode_combine.cuh"
#include "attention_decode_k_bias.cuh"
#include "attention_kv4.cuh"
#include "grid_dependency.cuh"
#include "per_device.h"

namespace qoq_attn {
namespace {

constexpr int kWarps = kDecodeWarps;
constexpr int kThreads = kDecodeThreads;
// Shared memory per CTA for the ring: four CTAs (16 warps) must fit an SM, so a D = 128 ring holds
// at most 3 chunks per warp, a D = 64 ring 2.
constexpr int kMaxRingBytes = 52 * 1024;

template <int D>
struct Chunk {
  static constexpr int kBlocks = 256 / D;  // 16-token blocks per chunk (~4 KB of K+V per warp)
  static constexpr int kTokens = 16 * kBlocks;
  static constexpr int kRow = D / 2;        // code bytes per token
  static constexpr int kKWords = D / 32;  // K code words per lane, per block and n-tile
  static constexpr int kVWords = D / 64;  // V code words per lane, per block and token
  // one ring slot: the chunk's K codes and V codes as in the page (kTokens rows of D/2 bytes, 2 KB
  // each, 16-byte pieces XOR-swizzled within 128 bytes so the fragment reads are conflict-free), then
  // its four scale/zero vectors [ks, kz, vs, vz][kTokens] fp16
  static constexpr int kCodeBytes = kTokens * kRow;  // 2048
  static constexpr int kCodePieces = kCodeBytes / 16 / 32;  // 16-byte copies per lane, K or V
  static constexpr int kVOffset = kCodeBytes;
  static constexpr int kSOffset = 2 * kCodeBytes;
  static constexpr int kVecPieces = kTokens * 2 / 16;  // 16-byte pieces per scale/zero vector
  static constexpr int kSlotBytes = kSOffset + 4 * kTokens * 2;
  static_assert(kCodeBytes == 2048 && 4 * kVecPieces <= 32, "one round of copies per lane");
  static_assert(CombineRows<D>::kFloats * 4 <= 2 * kSlotBytes, "a warp's combine state fits its ring (2 slots)");
};

// XOR of the 16-byte piece index within each 128 bytes of a code region, by token row, so that
// every fragment read hits each bank once per phase: K reads rows 2 grp + j (16 B at quad, or 8 B
// for D = 64), V reads rows 4 quad + e (8 B at grp, or 4 B).
template <int D>
__device__ __forceinline__ int swizzle(int row) {
  if constexpr (D == 128) return (2 * ((row >> 2) & 3)) ^ (4 * ((row >> 1) & 1));
  else return 2 * ((row >> 2) & 1) + 4 * ((row >> 3) & 1);
}

template <int D>
__device__ __forceinline__ int code_offset(int row, int byte) {
  const int linear = row * (D / 2) + byte;
  return (linear & ~0x70) | ((((linear >> 4) & 7) ^ swizzle<D>(row)) << 4);
}

// One lane's share of every chunk copy, fixed for the kernel (a warp's chunks all start at the same
// token tok0 of their page, since chunks of one warp are a multiple of 64 tokens apart): code piece i
// (16 bytes; a warp instruction moves 512 contiguous page bytes) goes from page byte src + i * 512 to
// slot byte dst[i & 1] + (i >> 1) * 1024 (pieces two apart are 16 rows apart, which share the
// swizzle); lanes below 4 * kVecPieces also copy one 16-byte piece of the scale/zero vectors.
template <int D>
struct CopyPlan {
  using C = Chunk<D>;
  uint32_t dst[2], vec_dst;  // shared addresses in the warp's ring slot 0
  uint32_t src, vec_src;     // byte offsets in a page
  const uint8_t* vec_pool;   // K or V pages (vector a: 0 ks, 1 kz, 2 vs, 3 vz), null for other lanes

  __device__ CopyPlan(const DecodeParams& p, int code_off, int scale_off, int zero_off, uint32_t ring, int tok0,
                      int lane) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int linear = (i * 32 + lane) * 16;
      dst[i] = ring + code_offset<D>(linear / C::kRow, linear % C::kRow);
    }
    vec_dst = ring + C::kSOffset + lane * 16;
    src = code_off + tok0 * C::kRow + lane * 16;
    const int a = lane / C::kVecPieces;
    vec_src = ((a & 1) ? zero_off : scale_off) + tok0 * 2 + (lane % C::kVecPieces) * 16;
    vec_pool = lane >= 4 * C::kVecPieces ? nullptr : a < 2 ? p.k_pages : p.v_pages;
    // opaque to the compiler, which would otherwise recompute them from the lane id in every chunk
    asm volatile("" : "+r"(dst[0]), "+r"(dst[1]), "+r"(vec_dst), "+r"(src), "+r"(vec_src));
  }

  // Start copying a chunk of page `page` into the ring slot at byte slot_off.
  __device__ __forceinline__ void issue(const DecodeParams& p, uint32_t slot_off, int page) const {
    const uint64_t page_off = static_cast<uint64_t>(static_cast<uint32_t>(page)) * static_cast<uint32_t>(p.page_bytes);
    const uint8_t* k_src = p.k_pages + page_off + src;
    const uint8_t* v_src = p.v_pages + page_off + src;
#pragma unroll
    for (int i = 0; i < C::kCodePieces; ++i) {
      const uint32_t d = dst[i & 1] + slot_off + (i >> 1) * 1024;
      cp_async<16>(d, k_src + i * 512);
      cp_async<16>(d + C::kVOffset, v_src + i * 512);
    }
    if (vec_pool != nullptr) cp_async<16>(vec_dst + slot_off, vec_pool + page_off + vec_src);
  }
};

// Reads a landed slot piece by piece right where each piece is used (registers stay free for more
// resident warps). Lane (grp, quad) holds K rows 2 grp and 2 grp + 1 of each block (the mma's rows
// grp and grp + 8) and V rows 4 quad + e. The lane's byte offsets in block 0 are computed once per
// kernel; block blk is 16 rows further, which the swizzle (row bits 1..3) leaves alone.
template <int D>
struct SlotReader {
  using C = Chunk<D>;
  static constexpr int kBlockBytes = 16 * C::kRow;
  const uint8_t* slot = nullptr;  // the landed slot, set per chunk
  int k_off[2], v_off[4], szk_off, szv_off;

  __device__ explicit SlotReader(int lane) {
    const int grp = lane >> 2, quad = lane & 3;
#pragma unroll
    for (int j = 0; j < 2; ++j) k_off[j] = code_offset<D>(2 * grp + j, quad * (D / 8));  // D/8 bytes
#pragma unroll
    for (int e = 0; e < 4; ++e) v_off[e] = C::kVOffset + code_offset<D>(4 * quad + e, grp * (D / 16));  // D/16 bytes
    szk_off = C::kSOffset + 2 * grp * 2;
    szv_off = C::kSOffset + 4 * quad * 2;
    // opaque to the compiler, which would otherwise recompute them from the lane id in every chunk
    asm volatile("" : "+r"(k_off[0]), "+r"(k_off[1]), "+r"(v_off[0]), "+r"(v_off[1]), "+r"(v_off[2]),
                 "+r"(v_off[3]), "+r"(szk_off), "+r"(szv_off));
  }
  // K codes of token 16 blk + 2 grp + j
  __device__ __forceinline__ void k(uint32_t (&w)[C::kKWords], int blk, int j) const {
    read_words(w, slot + k_off[j] + blk * kBlockBytes);
  }
  // V codes of token 16 blk + 4 quad + e
  __device__ __forceinline__ void v(uint32_t (&w)[C::kVWords], int blk, int e) const {
    read_words(w, slot + v_off[e] + blk * kBlockBytes);
  }
  // scale/zero vector a (0 ks, 1 kz, 2 vs, 3 vz) of tokens 16 blk + 2 grp + {0, 1}
  __device__ __forceinline__ uint32_t sz_k(int blk, int a) const {
    return *reinterpret_cast<const uint32_t*>(slot + szk_off + (a * C::kTokens + 16 * blk) * 2);
  }
  // ... of tokens 16 blk + 4 quad + {0..3}
  __device__ __forceinline__ uint2 sz_v(int blk, int a) const {
    return *reinterpret_cast<const uint2*>(slot + szv_off + (a * C::kTokens + 16 * blk) * 2);
  }
};

// How far (log2 units) the running max may trail a chunk's scores before the warp rescales: p <= 256.
constexpr float kStaleLog2 = 8.f;

// Keep the 16-bit halves of x whose token (lo, hi) is valid.
__device__ __forceinline__ uint32_t keep_halves(uint32_t x, bool lo, bool hi) {
  return x & ((lo ? 0x0000ffffu : 0u) | (hi ? 0xffff0000u : 0u));
}

// 8x8 fp16 matrix transpose across the warp: lane (r, c) holds elements (r, 2c) and (r, 2c + 1).
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}

// One chunk. Lane (grp, quad) scores tokens ta = 16 blk + 2 grp, tb = ta + 1 for query heads
// g = 2 quad + {0, 1}: s[blk][2 i + h] is token ta + i, head 2 quad + h. n_valid: tokens of the
// chunk below the split's end (>= 1); kPartial: fewer than kTokens, only in a sequence's last chunk,
// whose tail may hold garbage, NaN scales included (a separate instantiation, so full chunks carry
// no bounds checks). qs[h]: sum_d q[g,d] * 2^-24 (scores are kept in "u" units,
// (sum_d q code - zeroK sum_d q) 2^-24 scaleK); u_log2: u -> log2 units. kBias: the scores get bias
// (KBiasTerm::chunk) added.
template <int D, bool kPartial, bool kBias>
__device__ __forceinline__ void attend_chunk(const SlotReader<D>& c, const uint32_t (&qb)[D / 16][2],
                                             const float (&qs)[2], const float (&bias)[Chunk<D>::kBlocks][4],
                                             float u_log2, int n_valid, WarpState<D>& st, int lane) {
  using C = Chunk<D>;
  constexpr int kBlocks = C::kBlocks;
  const int grp = lane >> 2, quad = lane & 3;
  float s[kBlocks][4];
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    // two accumulators, so that the chain of dependent mmas (what a warp's last chunk waits on) is half
    // as long
    float acc[4] = {}, acc2[4] = {};
    uint32_t ka[C::kKWords], kb[C::kKWords];
    c.k(ka, blk, 0);
    c.k(kb, blk, 1);
#pragma unroll
    for (int w = 0; w < C::kKWords; ++w) {
      uint32_t a[4], b[4];
      subnormal_codes8(ka[w], a);  // odd d meet q/16 (load_query): every product is q * code * 2^-24
      subnormal_codes8(kb[w], b);
      mma_16816(acc, a[0], b[0], a[1], b[1], qb[2 * w][0], qb[2 * w][1]);
      mma_16816(acc2, a[2], b[2], a[3], b[3], qb[2 * w + 1][0], qb[2 * w + 1][1]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] += acc2[e];
    const half2 ks = bits_h2(c.sz_k(blk, 0)), kz = bits_h2(c.sz_k(blk, 1));
    const float ks_a = __low2float(ks), ks_b = __high2float(ks), kz_a = __low2float(kz), kz_b = __high2float(kz);
    s[blk][0] = fmaf(-kz_a, qs[0], acc[0]) * ks_a;
    s[blk][1] = fmaf(-kz_a, qs[1], acc[1]) * ks_a;
    s[blk][2] = fmaf(-kz_b, qs[0], acc[2]) * ks_b;
    s[blk][3] = fmaf(-kz_b, qs[1], acc[3]) * ks_b;
    if constexpr (kBias) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[blk][e] += bias[blk][e];
    }
  }
  if constexpr (kPartial) {
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (16 * blk + 2 * grp + (e >> 1) >= n_valid) s[blk][e] = -INFINITY;
  }
  float mx[2] = {-INFINITY, -INFINITY}, alpha[2] = {1.f, 1.f}, psum[2] = {0.f, 0.f};
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e & 1] = fmaxf(mx[e & 1], s[blk][e]);
  // The running max moves only once some lane's own max passes it by more than kStaleLog2; most chunks
  // after a warp's first leave it and skip the shuffles, alpha's exp2 and the rescale. A stale max lets
  // p reach 2^kStaleLog2, so w = fp16(p) * scaleV stays finite only for scales <= 255: a lane holding a
  // larger scale (a V row spanning > 3825) keeps p <= 1 for the chunk.
  half2 vs[kBlocks];  // scaleV of tokens ta, tb
  uint32_t big_scale = 0;
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    vs[blk] = bits_h2(c.sz_k(blk, 2));
    big_scale |= __hgt2_mask(vs[blk], __float2half2_rn(255.f));
  }
  const float slack = big_scale ? 0.f : kStaleLog2;
  if (__any_sync(0xffffffffu, mx[0] * u_log2 > st.m[0] + slack || mx[1] * u_log2 > st.m[1] + slack)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int x = 4; x <= 16; x <<= 1) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], x));
      const float m_new = fmaxf(st.m[h], mx[h] * u_log2);  // finite: a chunk starts at a valid token
      alpha[h] = exp2f(st.m[h] - m_new);
      st.m[h] = m_new;
    }
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {
      st.o[i][0] *= alpha[0]; st.o[i][1] *= alpha[1]; st.o[i][2] *= alpha[0]; st.o[i][3] *= alpha[1];
    }
    st.z[0] *= alpha[0]; st.z[1] *= alpha[1]; st.z[2] *= alpha[0]; st.z[3] *= alpha[1];
  }
  // w = fp16(p) * scaleV as the B operand of the V mma: transposing the C layout (tokens ta, tb x
  // heads) gives lane (grp, quad) head grp at tokens 4 quad + {0, 2} (from ta) and + {1, 3} (tb)
  uint32_t wb[kBlocks][2];
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    float pr[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      pr[e] = exp2f(fmaf(s[blk][e], u_log2, -st.m[e & 1]));
      psum[e & 1] += pr[e];
    }
    uint32_t wa = h2_bits(__hmul2(__floats2half2_rn(pr[0], pr[1]), __low2half2(vs[blk])));
    uint32_t wt = h2_bits(__hmul2(__floats2half2_rn(pr[2], pr[3]), __high2half2(vs[blk])));
    if constexpr (kPartial) {  // p = 0 past the end, but 0 * a garbage scale may be NaN
      const int t = 16 * blk + 2 * grp;
      wa = t < n_valid ? wa : 0u;
      wt = t + 1 < n_valid ? wt : 0u;
    }
    wb[blk][0] = transpose8x8(wa);
    wb[blk][1] = transpose8x8(wt);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * alpha[h] + psum[h];
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    uint2 vz = c.sz_v(blk, 3);
    if constexpr (kPartial) {  // w = 0 there, but 0 * a garbage zero may be NaN
      const int t = 16 * blk + 4 * quad;
      vz.x = keep_halves(vz.x, t < n_valid, t + 1 < n_valid);
      vz.y = keep_halves(vz.y, t + 2 < n_valid, t + 3 < n_valid);
    }
    const uint32_t z02 = prmt(vz.x, vz.y, 0x5410), z13 = prmt(vz.x, vz.y, 0x7632);
    mma_16816(st.z, z02, z02, z13, z13, wb[blk][0], wb[blk][1]);
    uint32_t vw[4][C::kVWords];
#pragma unroll
    for (int e = 0; e < 4; ++e) c.v(vw[e], blk, e);
#pragma unroll
    for (int w = 0; w < C::kVWords; ++w) {
      // pair tokens (0,2) and (1,3) so each half2 holds one d of two tokens (the A layout); rows
      // grp + 8 of each m-tile get the high nibbles (16x, removed in the combine)
      uint32_t d02[4], d02h[4], d13[4], d13h[4];
      subnormal_codes8(prmt(vw[0][w], vw[2][w], 0x5410), d02);
      subnormal_codes8(prmt(vw[0][w], vw[2][w], 0x7632), d02h);
      subnormal_codes8(prmt(vw[1][w], vw[3][w], 0x5410), d13);
      subnormal_codes8(prmt(vw[1][w], vw[3][w], 0x7632), d13h);
      mma_16816(st.o[4 * w + 0], d02[0], d02[1], d13[0], d13[1], wb[blk][0], wb[blk][1]);
      mma_16816(st.o[4 * w + 1], d02[2], d02[3], d13[2], d13[3], wb[blk][0], wb[blk][1]);
      mma_16816(st.o[4 * w + 2], d02h[0], d02h[1], d13h[0], d13h[1], wb[blk][0], wb[blk][1]);
      mma_16816(st.o[4 * w + 3], d02h[2], d02h[3], d13h[2], d13h[3], wb[blk][0], wb[blk][1]);
    }
  }
}

// Query fragments (B operand of the K mma, column g = grp; zero for g >= G) in the permuted d order;
// the odd d (which meet high nibbles, 16 n) are divided by 16, exactly. Returns sum_d q[g, d].
template <int D>
__device__ __forceinline__ float load_query(const DecodeParams& p, int b, int head, int lane,
                                            uint32_t (&qb)[D / 16][2]) {
  const int quad = lane & 3, grp = lane >> 2;
  const half2 sixteenth = __float2half2_rn(0.0625f);
  float qsum = 0.f;
#pragma unroll
  for (int w = 0; w < D / 32; ++w) {
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (grp < p.group) {
      const int hq = head * p.group + grp;
      const half* src = p.q + ((size_t)b * p.num_kv_heads * p.group + hq) * D + quad * (D / 4) + 8 * w;
      raw = load_after_wait16(src);  // q comes from the kernel ahead (rope_kv4_write)
    }
    const half* h = reinterpret_cast<const half*>(&raw);
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      qb[2 * w + t][0] = h2_bits(__halves2half2(h[2 * t], h[2 * t + 4]));
      qb[2 * w + t][1] = h2_bits(__hmul2(__halves2half2(h[2 * t + 1], h[2 * t + 5]), sixteenth));
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) qsum += __half2float(h[i]);
  }
  qsum += __shfl_xor_sync(0xffffffffu, qsum, 1);
  qsum += __shfl_xor_sync(0xffffffffu, qsum, 2);
  return qsum;
}

// kStages: ring slots per warp (chunks in flight + 1). Three cover the memory latency better in long
// runs of chunks, two start faster (a smaller first burst of copies); attention.py picks. kSplit:
// p.num_splits > 1 (attention_decode_combine.cuh says why that is a template parameter).
template <int D, int kStages, bool kSplit, bool kBias>
__global__ void __launch_bounds__(kThreads, kBias ? 3 : 4) decode_kv4_kernel(const DecodeParams p) {
  using C = Chunk<D>;
  static_assert(kStages >= 2 && kStages * kWarps * C::kSlotBytes <= kMaxRingBytes, "2 or more slots that fit");
  constexpr int kStride = kWarps * C::kTokens;  // tokens from one of a warp's chunks to its next
  // The ring's swizzle is laid out for 128-byte lines, so its base must be 128-byte aligned. The
  // dynamic window starts after the static __shared__ variables: with 2320 bytes of them (the split
  // kernel's merge scratch) or 272, the ring sat 16 bytes off, nearly doubling the shared-memory
  // wavefronts.
  // Declared so, trusted by the compiler, and checked once.
  extern __shared__ __align__(128) uint8_t smem[];
  if (threadIdx.x == 0 && (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) & 127) != 0) __trap();
  const int split = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tok_begin = split * p.pages_per_split * kPageTokens;
  const int32_t* table = p.page_table + (size_t)b * p.page_table_stride;
  const int table_tokens = p.page_table_stride * kPageTokens;
  // Loads that do not wait for seq_len go first, so their latencies overlap: the page ids of the
  // warp's first kStages chunks (within the table row; ids past the sequence are never used).
  int t = tok_begin + warp * C::kTokens;  // first token of the warp's next chunk to compute
  int page[kStages];
#pragma unroll
  for (int i = 0; i < kStages; ++i) {
    const int tok = t + i * kStride;
    page[i] = tok < table_tokens ? table[static_cast<uint32_t>(tok) / kPageTokens] : 0;
  }
  const int seq_len = p.seq_lens[b];
  const int tok_end = min(seq_len, tok_begin + p.pages_per_split * kPageTokens);

  constexpr int kRow = C::kRow;
  const int H = p.num_kv_heads;
  const int scale_off = H * kPageTokens * kRow + head * kPageTokens * 2;
  uint8_t* ring_ptr = smem + warp * kStages * C::kSlotBytes;  // this warp's ring
  static_assert(kStride % kPageTokens == 0, "a warp's chunks start at one offset in their pages");
  const CopyPlan<D> plan(p, head * kPageTokens * kRow, scale_off, scale_off + H * kPageTokens * 2,
                         static_cast<uint32_t>(__cvta_generic_to_shared(ring_ptr)), t % kPageTokens, lane);
  // The warp's chunks start at tokens t, t + kStride, ... below tok_end; one commit group each (empty
  // past the end), in ring slots 0, 1, .., kStages - 1, 0, ... (byte offsets in the ring).
  auto issue = [&](int tok, int page_id, uint32_t slot_off) {
    if (tok < tok_end) plan.issue(p, slot_off, page_id);
    cp_async_commit();
  };
  // A programmatic dependent (grid_dependency.cuh) copies the first chunks that end before the
  // sequence's last token while the kernel ahead, which may write that token and q, still runs.
  const int settled_end = p.dependent ? seq_len - 1 : 0;
  int early = 0;  // first chunks already issued, in slot order
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i)
    if (early == i && t + i * kStride + C::kTokens <= min(settled_end, tok_end)) {
      issue(t + i * kStride, page[i], i * C::kSlotBytes);
      ++early;
    }
  wait_prior_grids();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i)
    if (i >= early) issue(t + i * kStride, page[i], i * C::kSlotBytes);
  int next_page = page[kStages - 1];  // read one iteration before the copy that needs it

  uint32_t qb[D / 16][2];
  const float qsum = load_query<D>(p, b, head, lane, qb);
  const int quad = lane & 3;
  const float qs[2] = {__shfl_sync(0xffffffffu, qsum, 8 * quad) * 0x1p-24f,  // heads 2 quad + {0, 1}
                       __shfl_sync(0xffffffffu, qsum, 8 * quad + 4) * 0x1p-24f};
  const float u_log2 = p.scale_log2 * 0x1p24f;
  KBiasTerm<D> k_bias;
  if constexpr (kBias) k_bias.init(p, b, head, lane);
  float bias[C::kBlocks][4];
  WarpState<D> st;
#pragma unroll
  for (int i = 0; i < D / 16; ++i) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.f;
  st.z[0] = st.z[1] = st.z[2] = st.z[3] = 0.f;
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;

  SlotReader<D> c(lane);
  constexpr uint32_t kLastSlot = (kStages - 1) * C::kSlotBytes;
  uint32_t slot = 0, free_slot = kLastSlot;  // the slot read now, the one read in the previous iteration
  for (; t < tok_end; t += kStride) {
    cp_async_wait<kStages - 2>();  // this chunk has landed (groups complete in order)
    __syncwarp();  // ... for every lane: each lane copied pieces that other lanes read
    const int t_issue = t + (kStages - 1) * kStride, t_next = t_issue + kStride;
    issue(t_issue, next_page, free_slot);
    next_page = t_next < tok_end ? table[static_cast<uint32_t>(t_next) / kPageTokens] : 0;
    c.slot = ring_ptr + slot;
    if constexpr (kBias) k_bias.chunk(p, t, lane, bias);  // a sequence's token t sits at position t
    if (tok_end - t >= C::kTokens)  // split ends are page-aligned: only a sequence's end cuts a chunk
      attend_chunk<D, false, kBias>(c, qb, qs, bias, u_log2, C::kTokens, st, lane);
    else
      attend_chunk<D, true, kBias>(c, qb, qs, bias, u_log2, tok_end - t, st, lane);
    free_slot = slot;
    slot = slot == kLastSlot ? 0 : slot + C::kSlotBytes;
  }
  allow_dependent_grids();  // every copy of this CTA is issued: the next kernel may start
  cp_async_wait<0>();
  __syncwarp();  // every lane's copies into this warp's ring have landed: the combine reuses it
  combine_warps_and_splits<D, kSplit>(p, st, reinterpret_cast<float*>(smem), kStages * C::kSlotBytes / 4, split, head,
                                      b);
}

template <int D, int kStages, bool kSplit, bool kBias>
cudaError_t launch(const DecodeParams& p, cudaStream_t stream) {
  constexpr int kRingBytes = kStages * kWarps * Chunk<D>::kSlotBytes;
  static qoq_cuda::PerDevice<cudaError_t> opt_in;  // the shared memory opt-in, once per GPU
  const cudaError_t attr = opt_in.get([] {
    return cudaFuncSetAttribute(decode_kv4_kernel<D, kStages, kSplit, kBias>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, kRingBytes);
  });
  if (attr != cudaSuccess) return attr;
  return launch_with_attributes(decode_kv4_kernel<D, kStages, kSplit, kBias>,
                                dim3(p.num_splits, p.num_kv_heads, p.batch), kThreads, kRingBytes, dim3(1, 1, 1),
                                p.dependent, stream, p);
}

template <int D, int kStages, bool kBias>
cudaError_t launch(const DecodeParams& p, cudaStream_t stream) {
  return p.num_splits > 1 ? launch<D, kStages, true, kBias>(p, stream) : launch<D, kStages, false, kBias>(p, stream);
}

template <int D, int kStages>
cudaError_t launch(const DecodeParams& p, cudaStream_t stream) {
  return p.k_bias != nullptr ? launch<D, kStages, true>(p, stream) : launch<D, kStages, false>(p, stream);
}

}  // namespace

cudaError_t launch_decode_kv4(const DecodeParams& p, int head_dim, cudaStream_t stream) {
  if (p.group < 1 || p.group > kMaxGroup || p.num_splits < 1 || p.num_splits > kMaxSplits)
    return cudaErrorInvalidValue;
  if (head_dim == 128 && p.num_stages == 3) return launch<128, 3>(p, stream);
  if (head_dim == 128 && p.num_stages == 2) return launch<128, 2>(p, stream);
  if (head_dim == 64 && p.num_stages == 2) return launch<64, 2>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace qoq_attn
