// Decode attention over KV4 pages (one query token per sequence), flash-decoding style.
//
// One CTA per (split of the KV length, KV head, sequence); all G <= 8 query heads of the KV head
// share it, so each K/V byte is read once. Each warp walks chunks of 16*256/D tokens through a
// ring of kStages shared-memory slots (the page's bytes, swizzled) filled by 16-byte cp.async, so
// several chunks' loads are in flight without holding registers. Math runs on the tensor cores:
//   S[g, t] = sum_d q[g,d] * codeK[t,d]            (mma: A = Q rows g, B = exact fp16 codes)
//   score   = scaleK[t] * (S - zeroK[t] * sum_d q[g,d])
//   O[d, g] = sum_t codeV[t,d] * w[g,t] - sum_t w[g,t] * zeroV[t],  w = fp16(p * scaleV[t])
// so the codes never need a per-element scale: dequantization is a few integer ops per 8 codes.
// The head_dim order inside the mma is permuted (any order gives the same dot product); the token
// order inside a 16-token block is permuted identically for K and V. Splits are merged in
// attention_decode_combine.cuh.
#include <cmath>

#include "attention_decode_combine.cuh"
#include "attention_kv4.cuh"

namespace qoq_attn {
namespace {

constexpr int kWarps = kDecodeWarps;
constexpr int kThreads = kDecodeThreads;
// per CTA, so that four CTAs (16 warps: enough to keep the issue slots busy) fit an SM
constexpr int kRingBytes = 52 * 1024;

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
  static constexpr int kStages = kRingBytes / (kWarps * kSlotBytes);  // 3 (D=128) or 2 (D=64)
  static_assert(kCodeBytes == 2048 && 4 * kVecPieces <= 32, "one round of copies per lane");
  static_assert(kStages >= 2, "the ring needs two slots per warp");
  static_assert(kWarps * kMaxGroup * D * 4 <= kRingBytes, "the combine reuses the ring");
};

// XOR of the 16-byte piece index within each 128 bytes of a code region, by token row: the
// fragment reads (K: 8 rows x 16 B, or 4 rows x 8 B; V: rows 4q+e for q = 0..3) then hit 8
// distinct pieces, i.e. all 32 banks, per phase.
template <int D>
__device__ __forceinline__ int swizzle(int row) {
  if constexpr (D == 128) return 2 * ((row >> 2) & 3);
  else return 4 * ((row >> 2) & 1) + 2 * ((row >> 3) & 1);
}

template <int D>
__device__ __forceinline__ int code_offset(int row, int byte) {
  const int linear = row * (D / 2) + byte;
  return (linear & ~0x70) | ((((linear >> 4) & 7) ^ swizzle<D>(row)) << 4);
}

// Start copying one chunk into a ring slot: every copy is 16 bytes, each warp instruction 512
// contiguous bytes of the page.
template <int D>
__device__ __forceinline__ void issue_chunk(uint32_t slot, const uint8_t* k_page, const uint8_t* v_page,
                                            int code_off, int scale_off, int zero_off, int tok0, int lane) {
  using C = Chunk<D>;
  const uint8_t* k_codes = k_page + code_off + tok0 * C::kRow;
  const uint8_t* v_codes = v_page + code_off + tok0 * C::kRow;
#pragma unroll
  for (int i = 0; i < C::kCodePieces; ++i) {
    const int linear = (i * 32 + lane) * 16;
    const uint32_t dst = code_offset<D>(linear / C::kRow, linear % C::kRow);
    cp_async<16>(slot + dst, k_codes + linear);
    cp_async<16>(slot + C::kVOffset + dst, v_codes + linear);
  }
  if (lane < 4 * C::kVecPieces) {
    const int a = lane / C::kVecPieces, piece = lane % C::kVecPieces;  // a: 0 ks, 1 kz, 2 vs, 3 vz
    const uint8_t* src = (a < 2 ? k_page : v_page) + ((a & 1) ? zero_off : scale_off) + tok0 * 2 + piece * 16;
    cp_async<16>(slot + C::kSOffset + lane * 16, src);
  }
}

// A landed slot, read piece by piece right where each piece is used (registers stay free for
// more resident warps).
template <int D>
struct SlotReader {
  using C = Chunk<D>;
  const uint8_t* slot;
  int lane;
  // K fragment: token row 4*(grp/2) + grp%2 + 2j of block blk, D/8 bytes at quad*D/8
  __device__ __forceinline__ void k(uint32_t (&w)[C::kKWords], int blk, int j) const {
    const int grp = lane >> 2, quad = lane & 3;
    const int row = 16 * blk + 4 * (grp >> 1) + (grp & 1) + 2 * j;
    read_words(w, slot + code_offset<D>(row, quad * (D / 8)));
  }
  // V fragment: token row 4*quad + e of block blk, D/16 bytes at grp*D/16
  __device__ __forceinline__ void v(uint32_t (&w)[C::kVWords], int blk, int e) const {
    const int grp = lane >> 2, quad = lane & 3;
    read_words(w, slot + C::kVOffset + code_offset<D>(16 * blk + 4 * quad + e, grp * (D / 16)));
  }
  // scale/zero vector a (0 ks, 1 kz, 2 vs, 3 vz): 4 fp16 for tokens 4*quad + e of block blk
  __device__ __forceinline__ uint2 sz(int blk, int a) const {
    return *reinterpret_cast<const uint2*>(slot + C::kSOffset + a * C::kTokens * 2 + (16 * blk + 4 * (lane & 3)) * 2);
  }
};

__device__ __forceinline__ float half_at(uint2 v, int e) {
  const half2 h = bits_h2(e < 2 ? v.x : v.y);
  return (e & 1) ? __high2float(h) : __low2float(h);
}

template <int D>
__device__ __forceinline__ void attend_chunk(const SlotReader<D>& c, const uint32_t (&qa)[D / 16][2],
                                             float qsum, float bias, float scale_log2, int tok_base,
                                             int seq_len, WarpState<D>& st, int lane) {
  constexpr int kBlocks = Chunk<D>::kBlocks;
  const int quad = lane & 3;
  float s[kBlocks][4];
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    float acc[2][4] = {};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t kw[Chunk<D>::kKWords];
      c.k(kw, blk, j);
#pragma unroll
      for (int w = 0; w < Chunk<D>::kKWords; ++w) {
        uint32_t b[4];
        biased_codes8(kw[w], b);  // odd d meet q/16 (load_query): every product is q * (1024 + n)
        mma_16816(acc[j], qa[2 * w][0], 0u, qa[2 * w][1], 0u, b[0], b[1]);
        mma_16816(acc[j], qa[2 * w + 1][0], 0u, qa[2 * w + 1][1], 0u, b[2], b[3]);
      }
    }
    const uint2 ks = c.sz(blk, 0), kz = c.sz(blk, 1);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float raw = acc[e >> 1][e & 1];
      const float sc = ((raw - bias) - half_at(kz, e) * qsum) * half_at(ks, e) * scale_log2;
      const bool valid = tok_base + 16 * blk + 4 * quad + e < seq_len;
      s[blk][e] = valid ? sc : -INFINITY;
    }
  }
  float mx = -INFINITY;
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx = fmaxf(mx, s[blk][e]);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(st.m, mx);  // finite: a chunk starts at a valid token
  const float alpha = exp2f(st.m - m_new);
  st.m = m_new;
  float psum = 0.f, zs = 0.f;
  uint32_t pb[kBlocks][2];
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    half w[4];
    const uint2 vs = c.sz(blk, 2), vz = c.sz(blk, 3);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2f(s[blk][e] - m_new);
      const bool valid = s[blk][e] != -INFINITY;  // masked tokens may hold garbage scales
      psum += p;
      w[e] = valid ? __float2half_rn(p * half_at(vs, e)) : __float2half_rn(0.f);
      zs += valid ? __half2float(w[e]) * half_at(vz, e) : 0.f;
    }
    pb[blk][0] = h2_bits(__halves2half2(w[0], w[1]));
    pb[blk][1] = h2_bits(__halves2half2(w[2], w[3]));
  }
  st.l = st.l * alpha + psum;
  st.zsum = st.zsum * alpha + zs;
  if (__any_sync(0xffffffffu, alpha != 1.f)) {  // once the maxima settle, most chunks skip this
    const float a0 = __shfl_sync(0xffffffffu, alpha, 8 * quad);  // columns g = 2*quad + {0,1}
    const float a1 = __shfl_sync(0xffffffffu, alpha, 8 * quad + 4);
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {
      st.o[i][0] *= a0; st.o[i][1] *= a1; st.o[i][2] *= a0; st.o[i][3] *= a1;
    }
  }
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    uint32_t vw[4][Chunk<D>::kVWords];
#pragma unroll
    for (int e = 0; e < 4; ++e) c.v(vw[e], blk, e);
#pragma unroll
    for (int w = 0; w < Chunk<D>::kVWords; ++w) {
      // pair tokens (0,1) and (2,3) so each half2 holds one d of two tokens (the A layout)
      uint32_t d01[4], d01h[4], d23[4], d23h[4];
      dequant8(prmt(vw[0][w], vw[1][w], 0x5410), d01);
      dequant8(prmt(vw[0][w], vw[1][w], 0x7632), d01h);
      dequant8(prmt(vw[2][w], vw[3][w], 0x5410), d23);
      dequant8(prmt(vw[2][w], vw[3][w], 0x7632), d23h);
      mma_16816(st.o[4 * w + 0], d01[0], d01[1], d23[0], d23[1], pb[blk][0], pb[blk][1]);
      mma_16816(st.o[4 * w + 1], d01[2], d01[3], d23[2], d23[3], pb[blk][0], pb[blk][1]);
      mma_16816(st.o[4 * w + 2], d01h[0], d01h[1], d23h[0], d23h[1], pb[blk][0], pb[blk][1]);
      mma_16816(st.o[4 * w + 3], d01h[2], d01h[3], d23h[2], d23h[3], pb[blk][0], pb[blk][1]);
    }
  }
}

// Query fragments (A operand, rows g = grp; rows 8..15 are zero) in the permuted d order; the odd d
// (which meet high nibbles, 1024 + 16 n) are divided by 16, exactly. Returns sum_d q_d; bias gets
// sum_d q_d * 1024 over even d plus sum_d q_d * 64 over odd d, the biased codes' extra score.
template <int D>
__device__ __forceinline__ float load_query(const DecodeParams& p, int b, int head, int lane,
                                            uint32_t (&qa)[D / 16][2], float& bias) {
  const int quad = lane & 3, grp = lane >> 2;
  const half2 sixteenth = __float2half2_rn(0.0625f);
  float qsum = 0.f, even = 0.f, odd = 0.f;
#pragma unroll
  for (int w = 0; w < D / 32; ++w) {
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (grp < p.group) {
      const int hq = head * p.group + grp;
      const half* src = p.q + ((size_t)b * p.num_kv_heads * p.group + hq) * D + quad * (D / 4) + 8 * w;
      raw = __ldg(reinterpret_cast<const uint4*>(src));
    }
    const half* h = reinterpret_cast<const half*>(&raw);
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      qa[2 * w + t][0] = h2_bits(__halves2half2(h[2 * t], h[2 * t + 4]));
      qa[2 * w + t][1] = h2_bits(__hmul2(__halves2half2(h[2 * t + 1], h[2 * t + 5]), sixteenth));
    }
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      even += __half2float(h[i]);
      odd += __half2float(h[i + 1]);
    }
  }
  qsum = even + odd;
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    qsum += __shfl_xor_sync(0xffffffffu, qsum, x);
    even += __shfl_xor_sync(0xffffffffu, even, x);
    odd += __shfl_xor_sync(0xffffffffu, odd, x);
  }
  bias = 1024.f * even + 64.f * odd;
  return qsum;
}

template <int D>
__global__ void __launch_bounds__(kThreads, 4) decode_kv4_kernel(const DecodeParams p) {
  using C = Chunk<D>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int split = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int seq_len = p.seq_lens[b];
  const int tok_begin = split * p.pages_per_split * kPageTokens;
  const int tok_end = min(seq_len, tok_begin + p.pages_per_split * kPageTokens);
  const int n_chunks = tok_end > tok_begin ? (tok_end - tok_begin + C::kTokens - 1) / C::kTokens : 0;

  constexpr int kRow = C::kRow;
  const int H = p.num_kv_heads;
  const int code_off = head * kPageTokens * kRow;
  const int scale_off = H * kPageTokens * kRow + head * kPageTokens * 2;
  const int zero_off = scale_off + H * kPageTokens * 2;
  const int32_t* table = p.page_table + (size_t)b * p.page_table_stride;
  uint8_t* ring = smem + warp * C::kStages * C::kSlotBytes;
  const uint32_t ring_addr = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  // the warp's i-th chunk is chunk warp + i*kWarps, in slot i % kStages; one commit group each
  auto issue = [&](int i) {
    const int chunk = warp + i * kWarps;
    if (chunk < n_chunks) {
      const int tok = tok_begin + chunk * C::kTokens;
      const int64_t page = table[tok / kPageTokens];
      issue_chunk<D>(ring_addr + (i % C::kStages) * C::kSlotBytes, p.k_pages + page * p.page_bytes,
                     p.v_pages + page * p.page_bytes, code_off, scale_off, zero_off, tok % kPageTokens, lane);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < C::kStages - 1; ++i) issue(i);

  uint32_t qa[D / 16][2];
  float bias;  // sum over d of q_d * (the bias of K code d), removed from every score
  const float qsum = load_query<D>(p, b, head, lane, qa, bias);
  WarpState<D> st;
#pragma unroll
  for (int i = 0; i < D / 16; ++i) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.f;
  st.m = -INFINITY; st.l = 0.f; st.zsum = 0.f;

  for (int i = 0; warp + i * kWarps < n_chunks; ++i) {
    cp_async_wait<C::kStages - 2>();  // chunk i has landed (groups complete in order)
    __syncwarp();  // ... for every lane: each lane copied pieces that other lanes read
    issue(i + C::kStages - 1);  // refills the slot read in the previous iteration
    const SlotReader<D> c{ring + (i % C::kStages) * C::kSlotBytes, lane};
    attend_chunk<D>(c, qa, qsum, bias, p.scale_log2, tok_begin + (warp + i * kWarps) * C::kTokens, seq_len, st, lane);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the combine's scratch
  combine_warps_and_splits<D>(p, st, reinterpret_cast<float*>(smem), split, head, b);
}

template <int D>
cudaError_t launch(const DecodeParams& p, cudaStream_t stream) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(decode_kv4_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingBytes);
  if (attr != cudaSuccess) return attr;
  const dim3 grid(p.num_splits, p.num_kv_heads, p.batch);
  decode_kv4_kernel<D><<<grid, kThreads, kRingBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_decode_kv4(const DecodeParams& p, int head_dim, cudaStream_t stream) {
  if (p.group < 1 || p.group > kMaxGroup || p.num_splits < 1 || p.num_splits > kMaxSplits)
    return cudaErrorInvalidValue;
  if (head_dim == 128) return launch<128>(p, stream);
  if (head_dim == 64) return launch<64>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace qoq_attn
