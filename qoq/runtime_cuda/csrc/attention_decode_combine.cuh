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
  float o[D / 16][4];  // O^T accumulators: m-tile i covers d = grp*D/8 + 2i + {0,1}, g = 2*quad + {0,1}
  float m, l, zsum;    // for query head g = grp (log2 units)
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
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);
  st.zsum += __shfl_xor_sync(0xffffffffu, st.zsum, 1);
  st.zsum += __shfl_xor_sync(0xffffffffu, st.zsum, 2);
  const float z0 = __shfl_sync(0xffffffffu, st.zsum, 8 * quad);
  const float z1 = __shfl_sync(0xffffffffu, st.zsum, 8 * quad + 4);
#pragma unroll
  for (int i = 0; i < D / 16; ++i) {
    const int d = grp * (D / 8) + 2 * i;
    sm_o[warp][2 * quad][d] = st.o[i][0] - z0;
    sm_o[warp][2 * quad + 1][d] = st.o[i][1] - z1;
    sm_o[warp][2 * quad][d + 1] = st.o[i][2] - z0;
    sm_o[warp][2 * quad + 1][d + 1] = st.o[i][3] - z1;
  }
  if (quad == 0) { sm_m[warp][grp] = st.m; sm_l[warp][grp] = st.l; }
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
