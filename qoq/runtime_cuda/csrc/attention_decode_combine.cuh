// Decode attention, last step: merge the warps' partial softmax states of one CTA, then either
// write the output (one split) or this split's partial state; the last split of a (sequence, KV
// head) to finish (atomic counter) merges all splits, so the whole op is one launch.
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

// scratch: >= kDecodeWarps * kMaxGroup * D floats of shared memory no longer used by the caller.
template <int D>
__device__ __forceinline__ void combine_warps_and_splits(const DecodeParams& p, WarpState<D>& st, float* scratch,
                                                         int split, int head, int b) {
  __shared__ float sm_m[kDecodeWarps][kMaxGroup], sm_l[kDecodeWarps][kMaxGroup];
  __shared__ float sm_wt[kMaxGroup][kMaxSplits];
  __shared__ int is_last;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane & 3, grp = lane >> 2;
  float (*sm_o)[kMaxGroup][D] = reinterpret_cast<float (*)[kMaxGroup][D]>(scratch);
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int x = 4; x <= 16; x <<= 1) st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], x);
  const float z0 = st.z[0], z1 = st.z[1];
  constexpr float kEven = 16777216.f, kOdd = 1048576.f;  // 2^24; 2^24 / 16 for the high nibbles
#pragma unroll
  for (int i = 0; i < D / 16; ++i) {
    const int d = grp * (D / 8) + 2 * i;
    sm_o[warp][2 * quad][d] = st.o[i][0] * kEven - z0;
    sm_o[warp][2 * quad + 1][d] = st.o[i][1] * kEven - z1;
    sm_o[warp][2 * quad][d + 1] = st.o[i][2] * kOdd - z0;
    sm_o[warp][2 * quad + 1][d + 1] = st.o[i][3] * kOdd - z1;
  }
  if (grp == 0) {
    sm_m[warp][2 * quad] = st.m[0]; sm_l[warp][2 * quad] = st.l[0];
    sm_m[warp][2 * quad + 1] = st.m[1]; sm_l[warp][2 * quad + 1] = st.l[1];
  }
  __syncthreads();

  const int G = p.group, GD = G * D, S = p.num_splits;
  const int bh = b * p.num_kv_heads + head;
  const size_t part = (size_t)bh * S + split;
  half* out = p.out + (size_t)bh * GD;  // query heads head*G .. head*G+G-1 of sequence b
  for (int idx = threadIdx.x; idx < GD; idx += kDecodeThreads) {
    const int g = idx / D, d = idx % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.f, O = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float wt = sm_m[w][g] == -INFINITY ? 0.f : exp2f(sm_m[w][g] - M);
      L += sm_l[w][g] * wt;
      O += sm_o[w][g][d] * wt;
    }
    if (S == 1) {
      out[idx] = __float2half_rn(L > 0.f ? O / L : 0.f);
    } else {
      p.part_o[part * GD + idx] = O;
      if (d == 0) { p.part_ml[(part * G + g) * 2] = M; p.part_ml[(part * G + g) * 2 + 1] = L; }
    }
  }
  if (S == 1) return;
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
      wt[h] = m[h] == -INFINITY ? 0.f : exp2f(m[h] - M);
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

}  // namespace qoq_attn
