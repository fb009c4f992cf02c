// Decode attention's add-back of a k bias kept outside the KV4 cache (design §3.4): the pages hold
// R(p)·x·W_kᵀ, and every score gets q·R(p)·b back, p the cached key's position (0..seq_len-1).
//
// With rotate-half RoPE on pairs (i, i + D/2) read as complex numbers, Q_i = q_i + i q_{i+D/2},
// B_i = b_i + i b_{i+D/2}, z_i(p) = exp(i p θ_i):
//   q·R(p)·b = Σ_i Re(W_i z_i(p)),  W_i = conj(Q_i) B_i   (fixed for the whole launch)
// and for a chunk starting at p0, z(p0 + t) = z(p0) z(t), so with C_i = W_i z_i(p0) (computed per chunk in
// fp32 from the RoPE table's row p0):
//   q·R(p0 + t)·b = Σ_i C_re,i cos(t θ_i) - C_im,i sin(t θ_i)
// one more tensor-core product per 16-token block: A = [cos, sin](t θ) of the chunk's relative positions
// (the same for every chunk: a small fp16 table in the A fragments' order, attention.py builds it), B =
// (C_re, -C_im) per query head in fp16. W is scaled by a power of two per head so that C fits fp16 with
// room; the fp16 roundings of C and of the table cost what fp16 keys cost (docs/engine.md).
#pragma once

#include <cmath>

#include "attention_kv4.cuh"
#include "grid_dependency.cuh"

namespace qoq_attn {

// Lane (grp, quad) holds query head grp's W for the RoPE pairs i = quad * D/8 + j, j < D/8; in k-step s of
// the bias mma its B fragment is pairs j = 2 s (b0: k = 2 quad, 2 quad + 1 = cos, sin) and 2 s + 1 (b1).
template <int D>
struct KBiasTerm {
  static constexpr int kPairs = D / 8;
  static constexpr int kSteps = D / 16;
  float w_re[kPairs], w_im[kPairs];  // W_i * 2^e (e per head)
  float unit[2];                     // 2^-e * 2^-24 for heads 2 quad + {0, 1}: bias mma -> score "u" units

  // After wait_prior_grids: q comes from the kernel ahead. Heads g >= G (grp >= p.group) get W = 0.
  __device__ __forceinline__ void init(const DecodeParams& p, int b, int head, int lane) {
    const int grp = lane >> 2, quad = lane & 3;
    const int i0 = quad * kPairs;
    float wmax = 0.f;
#pragma unroll
    for (int c = 0; c < kPairs / 8; ++c) {
      uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
      if (grp < p.group) {
        const half* q = p.q + ((size_t)b * p.num_kv_heads * p.group + head * p.group + grp) * D + i0 + 8 * c;
        lo = load_after_wait16(q);
        hi = load_after_wait16(q + D / 2);
      }
      const half* ql = reinterpret_cast<const half*>(&lo);
      const half* qh = reinterpret_cast<const half*>(&hi);
      const float* bias = p.k_bias + (size_t)head * D + i0 + 8 * c;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float q1 = __half2float(ql[j]), q2 = __half2float(qh[j]), b1 = bias[j], b2 = bias[j + D / 2];
        w_re[8 * c + j] = fmaf(q1, b1, q2 * b2);
        w_im[8 * c + j] = fmaf(q1, b2, -q2 * b1);
        wmax = fmaxf(wmax, fmaxf(fabsf(w_re[8 * c + j]), fabsf(w_im[8 * c + j])));
      }
    }
    wmax = fmaxf(wmax, __shfl_xor_sync(0xffffffffu, wmax, 1));
    wmax = fmaxf(wmax, __shfl_xor_sync(0xffffffffu, wmax, 2));
    // |C| <= |W| <= sqrt(2) * wmax: scaled to at most 2^14.5, far inside fp16
    int exp2_max = 0;
    if (wmax > 0.f) frexpf(wmax, &exp2_max);  // wmax < 2^exp2_max
    const float up = ldexpf(1.f, 14 - exp2_max);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      w_re[j] *= up;
      w_im[j] *= up;
    }
    const float own_unit = ldexpf(1.f, exp2_max - 14 - 24);
    unit[0] = __shfl_sync(0xffffffffu, own_unit, 8 * quad);  // head 2 quad sits in lanes grp = 2 quad
    unit[1] = __shfl_sync(0xffffffffu, own_unit, 8 * quad + 4);
  }

  // bias[blk][e] (the C layout of the K mma: token 16 blk + 2 grp + (e >> 1), head 2 quad + (e & 1)) of the
  // chunk starting at position p0, in u units.
  template <int kBlocks>
  __device__ __forceinline__ void chunk(const DecodeParams& p, int p0, int lane, float (&bias)[kBlocks][4]) const {
    const int quad = lane & 3;
    const float* cos_row = p.rope_cos + (size_t)p0 * (D / 2) + quad * kPairs;
    const float* sin_row = p.rope_sin + (size_t)p0 * (D / 2) + quad * kPairs;
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) bias[blk][0] = bias[blk][1] = bias[blk][2] = bias[blk][3] = 0.f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const float2 c = *reinterpret_cast<const float2*>(cos_row + 2 * s);
      const float2 sn = *reinterpret_cast<const float2*>(sin_row + 2 * s);
      uint32_t bf[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = 2 * s + r;
        const float cj = r ? c.y : c.x, sj = r ? sn.y : sn.x;
        const float c_re = fmaf(w_re[j], cj, -w_im[j] * sj), c_im = fmaf(w_re[j], sj, w_im[j] * cj);
        bf[r] = h2_bits(__floats2half2_rn(c_re, -c_im));
      }
#pragma unroll
      for (int blk = 0; blk < kBlocks; ++blk) {
        const uint4 a = p.rope_rel[(blk * kSteps + s) * 32 + lane];
        mma_16816(bias[blk], a.x, a.y, a.z, a.w, bf[0], bf[1]);
      }
    }
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk)
#pragma unroll
      for (int e = 0; e < 4; ++e) bias[blk][e] *= unit[e & 1];
  }
};

}  // namespace qoq_attn
