// Decode attention, last step: merge the warps' partial softmax states of one CTA, then either
// write the output (one split) or this split's partial state; the last split of a (sequence, KV
// head) to finish (atomic counter) merges all splits, so the whole op is one launch. kSplit is a
// template parameter, not a runtime test: the kernel that never splits carries none of the merge
// code and none of its 2 KB of static shared memory. (That scratch once pushed the ring's base off
// its 128-byte alignment, which slowed the kernel; the ring is now aligned whatever
// comes before it: decode_kv4_kernel.) Shared by the KV4 kernel (combine_warps_and_splits) and the
// fp16 one (attention_decode_fp16.cu), which stores its warps' rows itself and calls
// merge_warps_and_splits.
#pragma once

#include <cmath>

#include "attention_kv4.cuh"

namespace qoq_attn {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kMaxGroup = 8;
constexpr int kMaxSplits = 64;

template <int D>
struct WarpState {
  // O^T accumulators: m-tile i covers d = grp*D/8 + 2i (o[i][0..1]) and d + 1 (o[i][2..3]) for query
  // heads g = 2*quad + {0,1}, as sum_t code * w * 2^-24, and 16x that for the odd d (high nibbles)
  float o[D / 16][4];
  float z[4];     // sum_t zeroV[t] * w[t, g] for g = 2*quad + {0,1} (z[0], z[1]; every row holds it)
  float m[2], l[2];  // for g = 2*quad + {0,1}: running max (log2 units), this lane's sum of p
};

// The warps' o laid out for the cross-warp sum: per (warp, query head) a row of D floats in d order, moved
// in 16-byte chunks (a lane holds D/8 consecutive d of a head: D/32 chunks), then the warp's m and l per
// head. Chunk c of head g sits at chunk(g, c), XOR-swizzled by the head pair g / 2 so that the 8 lanes of
// each phase of a warp's 16-byte store (grp 2k, 2k + 1 x quads 0..3) hit distinct bank groups.
template <int D>
struct CombineRows {
  static constexpr int kChunks = D / 4;
  static constexpr int kM = kMaxGroup * D, kL = kM + kMaxGroup;  // float offsets of m and l in a warp's region
  static constexpr int kFloats = kL + kMaxGroup;  // a warp's region
  __device__ static int chunk(int g, int c) {
    const int pair = g >> 1;
    return c ^ (D == 128 ? pair : (pair & 1) | ((pair >> 1) << 2));
  }
};

// The weight of a partial softmax state with running max m (log2 units) against the max M of all being
// merged: exp2(m - M), and 0 for a state without tokens (m = -inf), which may be all of them.
__device__ __forceinline__ float state_weight(float m, float M) { return m == -INFINITY ? 0.f : exp2f(m - M); }

// The last split of (sequence b, KV head) to arrive merges every split's partial state into out (bh:
// b * H_kv + head). Called by all threads of a CTA once its own partial state is stored.
template <int D>
__device__ __forceinline__ void merge_splits(const DecodeParams& p, int bh) {
  __shared__ float sm_wt[kMaxGroup][kMaxSplits];
  __shared__ int is_last;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = p.group, GD = G * D, S = p.num_splits;
  half* out = p.out + (size_t)bh * GD;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&p.counters[bh], 1) == S - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  const size_t part0 = (size_t)bh * S;
  for (int g = warp; g < G; g += kDecodeWarps) {  // a warp per query head, a lane per split
    float m[2], l[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int s = lane + 32 * h;
      m[h] = s < S ? __ldcg(&p.part_ml[((part0 + s) * G + g) * 2]) : -INFINITY;
      l[h] = s < S ? __ldcg(&p.part_ml[((part0 + s) * G + g) * 2 + 1]) : 0.f;
    }
    float M = fmaxf(m[0], m[1]);
    for (int off = 16; off > 0; off /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
    float wt[2], L = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wt[h] = state_weight(m[h], M);
      L += wt[h] * l[h];
    }
    for (int off = 16; off > 0; off /= 2) L += __shfl_xor_sync(0xffffffffu, L, off);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (lane + 32 * h < S) sm_wt[g][lane + 32 * h] = L > 0.f ? wt[h] / L : 0.f;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < GD; idx += kDecodeThreads) {
    const int g = idx / D;
    float O = 0.f;
#pragma unroll 8
    for (int s = 0; s < S; ++s) O += __ldcg(&p.part_o[(part0 + s) * GD + idx]) * sm_wt[g][s];
    out[idx] = __float2half_rn(O);
  }
  if (threadIdx.x == 0) p.counters[bh] = 0;
}

// Once every warp w has stored its partial state at scratch + w * region in the CombineRows layout
// (rows of o relative to the warp's own running max, then m and l per query head) and the CTA has
// passed a barrier: each thread merges 4 d of one head over the warps, weighing each warp's o by
// state_weight against the max M over the warps; with one split it divides by L and writes the output,
// otherwise it stores this split's state and the last split merges them all. kSplit: p.num_splits > 1.
template <int D, bool kSplit>
__device__ __forceinline__ void merge_warps_and_splits(const DecodeParams& p, const float* scratch, int region,
                                                       int split, int head, int b) {
  using Rows = CombineRows<D>;
  const int G = p.group, GD = G * D, S = kSplit ? p.num_splits : 1;
  const int bh = b * p.num_kv_heads + head;
  const size_t part = (size_t)bh * S + split;
  half* out = p.out + (size_t)bh * GD;  // query heads head*G .. head*G+G-1 of sequence b
  for (int idx = threadIdx.x; idx < G * Rows::kChunks; idx += kDecodeThreads) {  // idx: g and 4 d
    const int g = idx / Rows::kChunks, c = idx % Rows::kChunks, at = 4 * Rows::chunk(g, c);
    float m[kDecodeWarps], M = -INFINITY, L = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, m[w] = scratch[w * region + Rows::kM + g]);
    float4 O = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float e = state_weight(m[w], M);
      L += e * scratch[w * region + Rows::kL + g];
      const float4 v = *reinterpret_cast<const float4*>(scratch + w * region + g * D + at);
      O.x += e * v.x, O.y += e * v.y, O.z += e * v.z, O.w += e * v.w;
    }
    if constexpr (!kSplit) {
      const float inv = L > 0.f ? 1.f / L : 0.f;
      const half2 lo = __floats2half2_rn(O.x * inv, O.y * inv), hi = __floats2half2_rn(O.z * inv, O.w * inv);
      uint2 bits;
      bits.x = *reinterpret_cast<const uint32_t*>(&lo);
      bits.y = *reinterpret_cast<const uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(out + g * D + 4 * c) = bits;
    } else {
      *reinterpret_cast<float4*>(p.part_o + part * GD + g * D + 4 * c) = O;
      if (c == 0) {
        p.part_ml[(part * G + g) * 2] = M;
        p.part_ml[(part * G + g) * 2 + 1] = L;
      }
    }
  }
  if constexpr (kSplit) merge_splits<D>(p, bh);
}

// scratch + w * region (region >= CombineRows<D>::kFloats floats): warp w's own ring, which only it has
// read, so each warp writes its partial state there without waiting for the others; one barrier, then
// merge_warps_and_splits. kSplit: p.num_splits > 1.
template <int D, bool kSplit>
__device__ __forceinline__ void combine_warps_and_splits(const DecodeParams& p, WarpState<D>& st, float* scratch,
                                                         int region, int split, int head, int b) {
  using Rows = CombineRows<D>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane & 3, grp = lane >> 2;
  const int G = p.group;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int x = 4; x <= 16; x <<= 1) st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], x);
  float* mine = scratch + warp * region;
  if (grp == 0) {
    mine[Rows::kM + 2 * quad] = st.m[0]; mine[Rows::kL + 2 * quad] = st.l[0];
    mine[Rows::kM + 2 * quad + 1] = st.m[1]; mine[Rows::kL + 2 * quad + 1] = st.l[1];
  }
  constexpr float kEven = 16777216.f, kOdd = 1048576.f;  // 2^24; 2^24 / 16 for the high nibbles
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int g = 2 * quad + h;
    if (g >= G) continue;
    float* row = mine + g * D;
    const auto unscaled = [&](float o, float unit) { return o * unit - st.z[h]; };
#pragma unroll
    for (int j = 0; j < D / 32; ++j) {  // d = grp * D/8 + 4j + {0, 1, 2, 3}: o[2j], o[2j + 1], even and odd d
      const float4 v = make_float4(unscaled(st.o[2 * j][h], kEven), unscaled(st.o[2 * j][2 + h], kOdd),
                                   unscaled(st.o[2 * j + 1][h], kEven), unscaled(st.o[2 * j + 1][2 + h], kOdd));
      *reinterpret_cast<float4*>(row + 4 * Rows::chunk(g, grp * (D / 32) + j)) = v;
    }
  }
  __syncthreads();
  merge_warps_and_splits<D, kSplit>(p, scratch, region, split, head, b);
}

}  // namespace qoq_attn
