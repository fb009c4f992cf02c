// RoPE (rotate-half / neox) on Q and K fused with the paged-cache write of K and V, in one of two page
// formats: KV4, quantized per token and head (docs/design.md §3.4, §3.5, §5), or the fp16 artifact's
// pools [P][64][H_kv][D] (qoq/engine/kv_float.py). One CTA per token; D/8 lanes per head, 8 elements
// (16 bytes) per lane. Prefill (many tokens per sequence) and decode (one) are the same launch: the slot
// mapping says where each token goes. Rounding follows the torch reference op for op (fp32,
// round-to-nearest, no fused multiply-add), so q, fp16 K and KV4 codes match it exactly.
#include "attention_kv4.cuh"
#include "grid_dependency.cuh"

namespace qoq_attn {
namespace {

constexpr int kThreads = 128;

// KV4 page: the 8 codes of this lane's elements, and per (token, head) the fp16 scale and zero (lane 0).
struct Kv4Pages {
  template <int D>
  __device__ static void write(uint8_t* page, int off, int hk, int num_kv_heads, int li, unsigned mask,
                               const float (&x)[8]) {
    constexpr int kLanes = D / 8;
    float mn = x[0], mx = x[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) { mn = fminf(mn, x[i]); mx = fmaxf(mx, x[i]); }
#pragma unroll
    for (int o = kLanes / 2; o > 0; o /= 2) {
      mn = fminf(mn, __shfl_xor_sync(mask, mn, o, kLanes));
      mx = fmaxf(mx, __shfl_xor_sync(mask, mx, o, kLanes));
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
    *reinterpret_cast<uint32_t*>(page + (hk * kPageTokens + off) * (D / 2) + 4 * li) = packed;
    if (li == 0) {
      half* scales = reinterpret_cast<half*>(page + num_kv_heads * kPageTokens * (D / 2));
      scales[hk * kPageTokens + off] = scale;
      scales[num_kv_heads * kPageTokens + hk * kPageTokens + off] = zero;
    }
  }
};

// fp16 pool page [64][H_kv][D]: the 8 values as they are (each x[i] is an fp16 value, so exact).
struct Fp16Pages {
  template <int D>
  __device__ static void write(uint8_t* page, int off, int hk, int num_kv_heads, int li, unsigned,
                               const float (&x)[8]) {
    half y[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = __float2half_rn(x[i]);
    half* row = reinterpret_cast<half*>(page) + ((int64_t)off * num_kv_heads + hk) * D;
    *reinterpret_cast<uint4*>(row + 8 * li) = *reinterpret_cast<const uint4*>(y);
  }
};

// A programmatic dependent (p.dependent) reads nothing before its wait: q/k/v come from the GEMM ahead,
// and positions and slots are read after it too, so no load here may be non-coherent (design.md §5.5).
template <class Pages, int D>
__global__ void __launch_bounds__(kThreads) rope_kv_write_kernel(const RopeWriteParams p) {
  constexpr int kLanes = D / 8;
  constexpr int kHeadsPerPass = kThreads / kLanes;
  const int t = blockIdx.x;
  const int li = threadIdx.x % kLanes, hs = threadIdx.x / kLanes;
  allow_dependent_grids();  // decode attention launched as a programmatic dependent may start its copies
  wait_prior_grids();       // a no-op unless launched as a programmatic dependent
  // shuffles stay inside one head's lanes: heads of a warp may run different trip counts
  const unsigned mask = ((kLanes == 32) ? 0xffffffffu : ((1u << kLanes) - 1u))
                        << ((threadIdx.x % 32) / kLanes * kLanes);
  const int64_t pos = static_cast<int64_t>(load_after_wait8(p.positions + t));
  const int64_t slot = static_cast<int64_t>(load_after_wait8(p.slots + t));
  const int Hq = p.num_q_heads, Hkv = p.num_kv_heads;
  for (int h = hs; h < Hq + 2 * Hkv; h += kHeadsPerPass) {
    const uint4 raw = load_after_wait16(p.qkv + t * p.qkv_stride + h * D + 8 * li);
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
      half* dst = h < Hq ? p.q_out + ((int64_t)t * Hq + h) * D
                         : (p.k_out == nullptr ? nullptr : p.k_out + ((int64_t)t * Hkv + h - Hq) * D);
      if (dst != nullptr) *reinterpret_cast<uint4*>(dst + 8 * li) = *reinterpret_cast<const uint4*>(y);
    }
    if (h < Hq || slot < 0) continue;  // slot is one per CTA: a head's lanes all skip together
    const bool is_k = h < Hq + Hkv;
    const int hk = h - Hq - (is_k ? 0 : Hkv);
    uint8_t* page = (is_k ? p.k_pages : p.v_pages) + (slot / kPageTokens) * p.page_bytes;
    Pages::template write<D>(page, (int)(slot % kPageTokens), hk, Hkv, li, mask, x);
  }
}

template <class Pages>
cudaError_t launch(const RopeWriteParams& p, int head_dim, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  void (*kernel)(RopeWriteParams);
  if (head_dim == 128) kernel = rope_kv_write_kernel<Pages, 128>;
  else if (head_dim == 64) kernel = rope_kv_write_kernel<Pages, 64>;
  else return cudaErrorInvalidValue;
  return launch_with_attributes(kernel, dim3(p.tokens), kThreads, 0, dim3(1, 1, 1), p.dependent, stream, p);
}

}  // namespace

cudaError_t launch_rope_kv4_write(const RopeWriteParams& p, int head_dim, cudaStream_t stream) {
  return launch<Kv4Pages>(p, head_dim, stream);
}

cudaError_t launch_rope_kv_write_fp16(const RopeWriteParams& p, int head_dim, cudaStream_t stream) {
  return launch<Fp16Pages>(p, head_dim, stream);
}

}  // namespace qoq_attn
