// Decode attention over fp16 pages (the fp16 artifact's cache, qoq/engine/kv_float.py): the FP16
// baseline the W4A8KV4 path is measured against, built like the KV4 kernel (attention_decode_kv4.cu).
//
// A layer's K (or V) pool is [num_pages][64][H_kv][D] fp16: one token of one head is a row of 2D
// contiguous bytes, rows of a head H_kv * 2D bytes apart. One CTA per (split of the KV length, KV head,
// sequence); all G <= 8 query heads of the KV head share it, so each K/V byte is read once, by 16-byte
// cp.async into a ring of 2 or 3 shared-memory slots per warp (the copies in flight hold no registers).
// A warp's chunk is 128/D blocks of 16 tokens within one page (8 KB of K and V); warp w takes the
// w-th chunk of every 4, so its chunks all start at one offset in their pages. Math on the tensor
// cores, fp32 accumulation, per 16-token block (ldmatrix from the slot, 16-byte pieces XOR-swizzled by
// row so that every 8-row matrix read hits each bank once):
//   S^T[t, g] = sum_d K[t, d] q[g, d]      (mma: A = K rows, 16 tokens; B = q, 8 heads)
//   O^T[d, g] += sum_t V[t, d] p[t, g]      (mma: A = V^T by ldmatrix.trans; B = fp16(p), transposed
//                                            in registers from the S^T layout by movmatrix)
// with p = exp2(S scale log2(e) - m) against a running max m per head. Warps and splits are merged by
// attention_decode_combine.cuh. Launched plainly (no programmatic dependent launch).
#include <cmath>

#include "attention_decode_combine.cuh"
#include "attention_kv4.cuh"
#include "per_device.h"

namespace qoq_attn {
namespace {

constexpr int kWarps = kDecodeWarps;
constexpr int kThreads = kDecodeThreads;

template <int D>
struct Fp16Chunk {
  static constexpr int kBlocks = 128 / D;                // 16-token mma blocks per chunk
  static constexpr int kTokens = 16 * kBlocks;           // 16 (D = 128) or 32 (D = 64)
  static constexpr int kRowBytes = 2 * D;                // one token's K (or V) of one head
  static constexpr int kPieces = kRowBytes / 16;         // its 16-byte pieces
  static constexpr int kBytes = kTokens * kRowBytes;     // the chunk's K (or V): 4 KB
  static constexpr int kSlotBytes = 2 * kBytes;          // one ring slot: K rows, then V rows
  static constexpr int kCopies = kBytes / 16 / 32;       // 16-byte copies per lane, K or V
  static constexpr int kRowsPerCopy = 32 / kPieces;      // rows one warp-wide copy covers
  static constexpr int kSwizzlePeriod = 8 / kRowsPerCopy;  // copies until a lane's swizzle repeats
  static_assert(kBytes == 4096 && kCopies == 8 && kSwizzlePeriod * kRowsPerCopy == 8, "one layout for D 64, 128");
  static_assert(CombineRows<D>::kFloats * 4 <= 2 * kSlotBytes, "a warp's combine state fits its ring (2 slots)");
};

// Byte offset in a K (or V) region of a slot of 16-byte piece `piece` of row `row`: the piece index is
// XORed with the row's low 3 bits, so the 8 rows of an ldmatrix read (and the 8 pieces of a row one
// copy phase writes) land in 8 distinct 16-byte bank groups; rows are a multiple of 128 bytes.
template <int D>
__device__ __forceinline__ uint32_t piece_offset(int row, int piece) {
  return row * Fp16Chunk<D>::kRowBytes + ((piece ^ (row & 7)) << 4);
}

// One lane's share of every chunk copy, fixed for the kernel: copy i moves piece (lane % kPieces) of
// chunk row r_i = i * kRowsPerCopy + lane / kPieces, from page byte src + i * src_step (rows of a head
// are H_kv * 2D bytes apart) to slot byte dst[i % kSwizzlePeriod] + (i / kSwizzlePeriod) * 8 rows (rows
// 8 apart share the swizzle); V goes kBytes further in the slot.
template <int D>
struct Fp16CopyPlan {
  using C = Fp16Chunk<D>;
  uint32_t dst[C::kSwizzlePeriod];  // shared addresses in the warp's ring slot 0
  uint32_t src, src_step;          // byte offsets in a page

  __device__ Fp16CopyPlan(int num_kv_heads, int head, uint32_t ring, int tok0, int lane) {
    const int row0 = lane / C::kPieces, piece = lane % C::kPieces;
#pragma unroll
    for (int i = 0; i < C::kSwizzlePeriod; ++i) dst[i] = ring + piece_offset<D>(i * C::kRowsPerCopy + row0, piece);
    const uint32_t row_stride = static_cast<uint32_t>(num_kv_heads) * C::kRowBytes;
    src = (tok0 + row0) * row_stride + head * C::kRowBytes + piece * 16;
    src_step = C::kRowsPerCopy * row_stride;
  }

  // Start copying a chunk of page `page` into the ring slot at byte slot_off.
  __device__ __forceinline__ void issue(const DecodeParams& p, uint32_t slot_off, int page) const {
    const uint64_t page_off = static_cast<uint64_t>(static_cast<uint32_t>(page)) * static_cast<uint64_t>(p.page_bytes);
    const uint8_t* k_src = p.k_pages + page_off + src;
    const uint8_t* v_src = p.v_pages + page_off + src;
#pragma unroll
    for (int i = 0; i < C::kCopies; ++i) {
      const uint32_t d = dst[i % C::kSwizzlePeriod] + slot_off + (i / C::kSwizzlePeriod) * 8 * C::kRowBytes;
      cp_async<16>(d, k_src + i * src_step);
      cp_async<16>(d + C::kBytes, v_src + i * src_step);
    }
  }
};

// ldmatrix.x4: lane l gives the row address of matrix l / 8; register i gets matrix i, lane (grp, quad)
// holding row grp, elements 2 quad and 2 quad + 1 (with .trans: rows 2 quad, 2 quad + 1 of column grp).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 8x8 fp16 matrix transpose across the warp: lane (r, c) holds elements (r, 2c) and (r, 2c + 1).
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}

// Keep the 16-bit halves of x whose token (lo, hi) is valid.
__device__ __forceinline__ uint32_t keep_halves(uint32_t x, bool lo, bool hi) {
  return x & ((lo ? 0x0000ffffu : 0u) | (hi ? 0xffff0000u : 0u));
}

// The ldmatrix row addresses of one lane for block 0 and head-dim pieces 0/1 of a landed slot; the
// pieces of d = 16 j .. 16 j + 15 are 2 j and 2 j + 1, found by XOR (2 j ^ y == (2 j + hi) ^ row's swizzle).
//   K (A = K, rows tokens): matrix i = lane / 8 is tokens 8 (i & 1) .., d piece 2 j + (i >> 1)
//   V (A = V^T, .trans):    matrix i is tokens 8 (i >> 1) .., d piece 2 j + (i & 1)
template <int D>
struct Fp16SlotReader {
  using C = Fp16Chunk<D>;
  static constexpr uint32_t kBlockBytes = 16 * C::kRowBytes;
  uint32_t k_row, v_row;  // shared address of the lane's row in block 0, K and V regions of ring slot 0
  uint32_t k_y, v_y;      // XOR applied to the piece index 2 j, shifted to bytes

  __device__ Fp16SlotReader(uint32_t ring, int lane) {
    const int mat = lane >> 3, r = lane & 7;
    k_row = ring + (r + 8 * (mat & 1)) * C::kRowBytes;
    v_row = ring + C::kBytes + (r + 8 * (mat >> 1)) * C::kRowBytes;
    k_y = static_cast<uint32_t>((mat >> 1) ^ r) << 4;
    v_y = static_cast<uint32_t>((mat & 1) ^ r) << 4;
  }
  // A fragment of K tokens 16 blk .. + 15 x d 16 j .. + 15
  __device__ __forceinline__ void k(uint32_t (&a)[4], uint32_t slot_off, int blk, int j) const {
    ldmatrix_x4(a, k_row + slot_off + blk * kBlockBytes + ((static_cast<uint32_t>(2 * j) << 4) ^ k_y));
  }
  // A fragment of V^T: d 16 j .. + 15 x tokens 16 blk .. + 15
  __device__ __forceinline__ void v(uint32_t (&a)[4], uint32_t slot_off, int blk, int j) const {
    ldmatrix_x4_trans(a, v_row + slot_off + blk * kBlockBytes + ((static_cast<uint32_t>(2 * j) << 4) ^ v_y));
  }
};

template <int D>
struct Fp16WarpState {
  // O^T accumulators: o[j][0..1] is d = 16 j + grp, o[j][2..3] d + 8, for query heads 2 quad + {0, 1}
  float o[D / 16][4];
  float m[2], l[2];  // for heads 2 quad + {0, 1}: running max (log2 units), this lane's sum of p
};

// How far (log2 units) the running max may trail a chunk's scores before the warp rescales: p <= 256,
// which fp16 holds exactly enough (and p * V stays far from fp32's range).
constexpr float kStaleLog2 = 8.f;

// One chunk. Lane (grp, quad) scores tokens 16 blk + grp + 8 i for query heads 2 quad + h:
// s[blk][2 i + h] (the mma's C layout). n_valid: tokens of the chunk below the split's end (>= 1);
// kPartial: fewer than kTokens, only in a sequence's last chunk, whose tail may hold any bits (NaN
// included), which must reach neither a score nor 0 * V.
template <int D, bool kPartial>
__device__ __forceinline__ void attend_chunk(const Fp16SlotReader<D>& c, uint32_t slot_off,
                                             const uint32_t (&qb)[D / 16][2], float scale_log2, int n_valid,
                                             Fp16WarpState<D>& st, int lane) {
  using C = Fp16Chunk<D>;
  constexpr int kBlocks = C::kBlocks;
  const int grp = lane >> 2, quad = lane & 3;
  float s[kBlocks][4];
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    // two accumulators, so that the chain of dependent mmas is half as long
    float acc[4] = {}, acc2[4] = {};
#pragma unroll
    for (int j = 0; j < D / 16; j += 2) {
      uint32_t a[4], a2[4];
      c.k(a, slot_off, blk, j);
      c.k(a2, slot_off, blk, j + 1);
      mma_16816(acc, a[0], a[1], a[2], a[3], qb[j][0], qb[j][1]);
      mma_16816(acc2, a2[0], a2[1], a2[2], a2[3], qb[j + 1][0], qb[j + 1][1]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s[blk][e] = (acc[e] + acc2[e]) * scale_log2;
  }
  if constexpr (kPartial) {
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (16 * blk + grp + 8 * (e >> 1) >= n_valid) s[blk][e] = -INFINITY;
  }
  float mx[2] = {-INFINITY, -INFINITY}, alpha[2] = {1.f, 1.f}, psum[2] = {0.f, 0.f};
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e & 1] = fmaxf(mx[e & 1], s[blk][e]);
  // The running max moves only once some lane's own max passes it by more than kStaleLog2; most chunks
  // after a warp's first leave it and skip the shuffles, alpha's exp2 and the rescale.
  if (__any_sync(0xffffffffu, mx[0] > st.m[0] + kStaleLog2 || mx[1] > st.m[1] + kStaleLog2)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int x = 4; x <= 16; x <<= 1) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], x));
      const float m_new = fmaxf(st.m[h], mx[h]);  // finite: a chunk starts at a valid token
      alpha[h] = exp2f(st.m[h] - m_new);
      st.m[h] = m_new;
    }
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {
      st.o[i][0] *= alpha[0]; st.o[i][1] *= alpha[1]; st.o[i][2] *= alpha[0]; st.o[i][3] *= alpha[1];
    }
  }
  // fp16(p) as the B operand of the V mma: transposing the C layout (tokens grp, grp + 8 x heads
  // 2 quad + {0, 1}) gives lane (grp, quad) head grp at tokens 2 quad + {0, 1} (b0) and + 8 (b1)
  uint32_t pb[kBlocks][2];
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    float pr[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      pr[e] = exp2f(s[blk][e] - st.m[e & 1]);  // 0 for a masked score
      psum[e & 1] += pr[e];
    }
    pb[blk][0] = transpose8x8(h2_bits(__floats2half2_rn(pr[0], pr[1])));
    pb[blk][1] = transpose8x8(h2_bits(__floats2half2_rn(pr[2], pr[3])));
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * alpha[h] + psum[h];
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
      uint32_t a[4];  // V^T: a[0] d grp, tokens 2 quad + {0, 1}; a[1] d + 8; a[2], a[3] tokens + 8
      c.v(a, slot_off, blk, j);
      if constexpr (kPartial) {  // p = 0 past the end, but 0 * NaN is NaN
        const int t = 16 * blk + 2 * quad;
        a[0] = keep_halves(a[0], t < n_valid, t + 1 < n_valid);
        a[1] = keep_halves(a[1], t < n_valid, t + 1 < n_valid);
        a[2] = keep_halves(a[2], t + 8 < n_valid, t + 9 < n_valid);
        a[3] = keep_halves(a[3], t + 8 < n_valid, t + 9 < n_valid);
      }
      mma_16816(st.o[j], a[0], a[1], a[2], a[3], pb[blk][0], pb[blk][1]);
    }
  }
}

// Query fragments: the B operand of the K mma (k = d, n = head), lane (grp, quad) holding head grp at
// d = 16 j + 2 quad + {0, 1} and + 8; zero for heads >= G.
template <int D>
__device__ __forceinline__ void load_query(const DecodeParams& p, int b, int head, int lane,
                                           uint32_t (&qb)[D / 16][2]) {
  const int quad = lane & 3, grp = lane >> 2;
  const bool real = grp < p.group;
  const half* src = p.q + ((size_t)b * p.num_kv_heads * p.group + head * p.group + (real ? grp : 0)) * D + 2 * quad;
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    qb[j][0] = real ? *reinterpret_cast<const uint32_t*>(src + 16 * j) : 0u;
    qb[j][1] = real ? *reinterpret_cast<const uint32_t*>(src + 16 * j + 8) : 0u;
  }
}

// kStages: ring slots per warp (chunks in flight + 1); attention.py's plan_stages_fp16 picks. kSplit:
// p.num_splits > 1 (attention_decode_combine.cuh says why that is a template parameter).
template <int D, int kStages, bool kSplit>
__global__ void __launch_bounds__(kThreads, kStages == 2 ? 3 : 2) decode_fp16_kernel(const DecodeParams p) {
  using C = Fp16Chunk<D>;
  static_assert(kStages >= 2, "a slot to compute on and one filling");
  constexpr int kStride = kWarps * C::kTokens;  // tokens from one of a warp's chunks to its next
  static_assert(kStride % kPageTokens == 0 && kPageTokens % C::kTokens == 0, "chunks tile pages");
  // 128-byte aligned so the swizzle's 8 pieces of a row land in distinct bank groups
  extern __shared__ __align__(128) uint8_t smem[];
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

  uint8_t* ring_ptr = smem + warp * kStages * C::kSlotBytes;  // this warp's ring
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(ring_ptr));
  const Fp16CopyPlan<D> plan(p.num_kv_heads, head, ring, t % kPageTokens, lane);
  // The warp's chunks start at tokens t, t + kStride, ... below tok_end; one commit group each (empty
  // past the end), in ring slots 0, 1, .., kStages - 1, 0, ... (byte offsets in the ring).
  auto issue = [&](int tok, int page_id, uint32_t slot_off) {
    if (tok < tok_end) plan.issue(p, slot_off, page_id);
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(t + i * kStride, page[i], i * C::kSlotBytes);
  int next_page = page[kStages - 1];  // read one iteration before the copy that needs it

  uint32_t qb[D / 16][2];
  load_query<D>(p, b, head, lane, qb);
  Fp16WarpState<D> st;
#pragma unroll
  for (int i = 0; i < D / 16; ++i) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.f;
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;

  const Fp16SlotReader<D> reader(ring, lane);
  constexpr uint32_t kLastSlot = (kStages - 1) * C::kSlotBytes;
  uint32_t slot = 0, free_slot = kLastSlot;  // the slot read now, the one read in the previous iteration
  for (; t < tok_end; t += kStride) {
    cp_async_wait<kStages - 2>();  // this chunk has landed (groups complete in order)
    __syncwarp();  // ... for every lane, each lane having copied pieces that others read; and every
                   // lane is done reading free_slot
    const int t_issue = t + (kStages - 1) * kStride, t_next = t_issue + kStride;
    issue(t_issue, next_page, free_slot);
    next_page = t_next < tok_end ? table[static_cast<uint32_t>(t_next) / kPageTokens] : 0;
    if (tok_end - t >= C::kTokens)  // split ends are page-aligned: only a sequence's end cuts a chunk
      attend_chunk<D, false>(reader, slot, qb, p.scale_log2, C::kTokens, st, lane);
    else
      attend_chunk<D, true>(reader, slot, qb, p.scale_log2, tok_end - t, st, lane);
    free_slot = slot;
    slot = slot == kLastSlot ? 0 : slot + C::kSlotBytes;
  }
  cp_async_wait<0>();
  __syncwarp();  // every lane's copies into this warp's ring have landed and been read: it becomes scratch

  // This warp's partial state in the CombineRows layout, in its own ring (attention_decode_combine.cuh).
  using Rows = CombineRows<D>;
  const int grp = lane >> 2, quad = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int x = 4; x <= 16; x <<= 1) st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], x);
  const int region = kStages * C::kSlotBytes / 4;  // floats
  float* scratch = reinterpret_cast<float*>(smem);
  float* mine = scratch + warp * region;
  if (grp == 0) {
    mine[Rows::kM + 2 * quad] = st.m[0]; mine[Rows::kL + 2 * quad] = st.l[0];
    mine[Rows::kM + 2 * quad + 1] = st.m[1]; mine[Rows::kL + 2 * quad + 1] = st.l[1];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int g = 2 * quad + h;
    if (g >= p.group) continue;
    float* row = mine + g * D;
#pragma unroll
    for (int j = 0; j < D / 16; ++j)
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int d = 16 * j + grp + 8 * hi;
        row[4 * Rows::chunk(g, d >> 2) + (d & 3)] = st.o[j][2 * hi + h];
      }
  }
  __syncthreads();
  merge_warps_and_splits<D, kSplit>(p, scratch, region, split, head, b);
}

template <int D, int kStages, bool kSplit>
cudaError_t launch(const DecodeParams& p, cudaStream_t stream) {
  constexpr int kRingBytes = kStages * kWarps * Fp16Chunk<D>::kSlotBytes;
  static qoq_cuda::PerDevice<cudaError_t> opt_in;  // the shared memory opt-in, once per GPU
  const cudaError_t attr = opt_in.get([] {
    return cudaFuncSetAttribute(decode_fp16_kernel<D, kStages, kSplit>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kRingBytes);
  });
  if (attr != cudaSuccess) return attr;
  const dim3 grid(p.num_splits, p.num_kv_heads, p.batch);
  decode_fp16_kernel<D, kStages, kSplit><<<grid, kThreads, kRingBytes, stream>>>(p);
  return cudaGetLastError();
}

template <int D, int kStages>
cudaError_t launch(const DecodeParams& p, cudaStream_t stream) {
  return p.num_splits > 1 ? launch<D, kStages, true>(p, stream) : launch<D, kStages, false>(p, stream);
}

}  // namespace

cudaError_t launch_decode_fp16(const DecodeParams& p, int head_dim, cudaStream_t stream) {
  if (p.group < 1 || p.group > kMaxGroup || p.num_splits < 1 || p.num_splits > kMaxSplits || p.dependent)
    return cudaErrorInvalidValue;
  if (head_dim == 128 && p.num_stages == 2) return launch<128, 2>(p, stream);
  if (head_dim == 128 && p.num_stages == 3) return launch<128, 3>(p, stream);
  if (head_dim == 64 && p.num_stages == 2) return launch<64, 2>(p, stream);
  if (head_dim == 64 && p.num_stages == 3) return launch<64, 3>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace qoq_attn
