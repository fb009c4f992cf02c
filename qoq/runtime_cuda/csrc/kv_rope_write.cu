// RoPE (rotate-half / neox) on Q and K fused with the KV4 quantize-and-write of K and V
// (docs/design.md §3.4, §3.5, §5). One CTA per token; D/8 lanes per head, 8 elements (16 bytes) per lane. Prefill
// (many tokens per sequence) and decode (one) are the same launch: the slot mapping says where
// each token goes. Rounding follows the torch reference op for op (fp32, round-to-nearest, no
// fused multiply-add), so codes match exactly.
#include "attention_kv4.cuh"
#include "grid_dependency.cuh"

namespace qoq_attn {
namespace {

constexpr int kThreads = 128;

template <int D>
__global__ void __launch_bounds__(kThreads) rope_kv4_write_kernel(const RopeWriteParams p) {
  constexpr int kLanes = D / 8;
  constexpr int kHeadsPerPass = kThreads / kLanes;
  const int t = blockIdx.x;
  const int li = threadIdx.x % kLanes, hs = threadIdx.x / kLanes;
  allow_dependent_grids();  // decode attention launched as a programmatic dependent may start its copies
  // shuffles stay inside one head's lanes: heads of a warp may run different trip counts
  const unsigned mask = ((kLanes == 32) ? 0xffffffffu : ((1u << kLanes) - 1u))
                        << ((threadIdx.x % 32) / kLanes * kLanes);
  const int64_t pos = p.positions[t];
  const int64_t slot = p.slots[t];
  const int Hq = p.num_q_heads, Hkv = p.num_kv_heads;
  for (int h = hs; h < Hq + 2 * Hkv; h += kHeadsPerPass) {
    uint4 raw = __ldg(reinterpret_cast<const uint4*>(p.qkv + t * p.qkv_stride + h * D + 8 * li));
    float x[8];
    {
      const half* hv = reinterpret_cast<const half*>(&raw);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = __half2float(hv[i]);
    }
    if (h < Hq + Hkv) {
      uint4 other;  // the lane holding d +- D/2
      other.x = __shfl_xor_sync(mask, raw.x, kLanes / 2, kLanes);
      other.y = __shfl_xor_sync(mask, raw.y, kLanes / 2, kLanes);
      other.z = __shfl_xor_sync(mask, raw.z, kLanes / 2, kLanes);
      other.w = __shfl_xor_sync(mask, raw.w, kLanes / 2, kLanes);
      const half* ov = reinterpret_cast<const half*>(&other);
      const bool first_half = li < kLanes / 2;
      const int i0 = (8 * li) % (D / 2);
      const float4* cp = reinterpret_cast<const float4*>(p.cos + pos * (D / 2) + i0);
      const float4* sp = reinterpret_cast<const float4*>(p.sin + pos * (D / 2) + i0);
      const float4 c4[2] = {__ldg(cp), __ldg(cp + 1)}, s4[2] = {__ldg(sp), __ldg(sp + 1)};
      const float* c = reinterpret_cast<const float*>(c4);
      const float* s = reinterpret_cast<const float*>(s4);
      half y[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float xc = __fmul_rn(x[i], c[i]), os = __fmul_rn(__half2float(ov[i]), s[i]);
        y[i] = __float2half_rn(first_half ? __fsub_rn(xc, os) : __fadd_rn(xc, os));
        x[i] = __half2float(y[i]);
      }
      half* dst = h < Hq ? p.q_out + ((int64_t)t * Hq + h) * D : p.k_out + ((int64_t)t * Hkv + h - Hq) * D;
      *reinterpret_cast<uint4*>(dst + 8 * li) = *reinterpret_cast<const uint4*>(y);
    }
    if (h < Hq) continue;
    float mn = x[0], mx = x[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) { mn = fminf(mn, x[i]); mx = fmaxf(mx, x[i]); }
#pragma unroll
    for (int off = kLanes / 2; off > 0; off /= 2) {
      mn = fminf(mn, __shfl_xor_sync(mask, mn, off, kLanes));
      mx = fmaxf(mx, __shfl_xor_sync(mask, mx, off, kLanes));
    }
    half scale = __float2half_rn(__fdiv_rn(__fsub_rn(mx, mn), 15.f));
    half zero = __float2half_rn(__fdiv_rn(-mn, __half2float(scale)));
    if (__half2float(scale) == 0.f || __hisinf(zero) || __hisnan(zero)) {  // flat head: x̂ = min
      scale = __float2half_rn(1.f);
      zero = __float2half_rn(-mn);
    }
    const float sf = __half2float(scale), zf = __half2float(zero);
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float code = fminf(fmaxf(rintf(__fadd_rn(__fdiv_rn(x[i], sf), zf)), 0.f), 15.f);
      packed |= (uint32_t)code << (4 * i);
    }
    if (slot < 0) continue;
    const bool is_k = h < Hq + Hkv;
    const int hk = h - Hq - (is_k ? 0 : Hkv);
    uint8_t* page = (is_k ? p.k_pages : p.v_pages) + (slot / kPageTokens) * p.page_bytes;
    const int off = (int)(slot % kPageTokens);
    *reinterpret_cast<uint32_t*>(page + (hk * kPageTokens + off) * (D / 2) + 4 * li) = packed;
    if (li == 0) {
      half* scales = reinterpret_cast<half*>(page + Hkv * kPageTokens * (D / 2));
      scales[hk * kPageTokens + off] = scale;
      scales[Hkv * kPageTokens + hk * kPageTokens + off] = zero;
    }
  }
}

}  // namespace

cudaError_t launch_rope_kv4_write(const RopeWriteParams& p, int head_dim, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (head_dim == 128) rope_kv4_write_kernel<128><<<p.tokens, kThreads, 0, stream>>>(p);
  else if (head_dim == 64) rope_kv4_write_kernel<64><<<p.tokens, kThreads, 0, stream>>>(p);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace qoq_attn
