// KV4 slots read back as fp16 K and V for prefill attention (attention_reference.read_kv4_slots, then
// qoq.quant.kv.dequantize_kv): x = (q - zero) * scale in fp32, rounded once to fp16, so the values equal the
// reference's bit for bit. One thread per (token, KV head, 8 elements) of K or V (blockIdx.y): a 4-byte load
// of codes, the token's scale and zero, a 16-byte store. Launched plainly: its inputs come from the RoPE
// write and the host's index copies ahead of it in the stream.
#include <cuda_fp16.h>

#include <cstdint>

#include "attention_kv4.cuh"

namespace qoq_attn {
namespace {

__global__ void kv4_read_kernel(KV4ReadParams p) {
  const int per_token = p.num_kv_heads * p.head_dim / 8;  // threads per token
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(p.tokens) * per_token) return;
  const int t = int(i / per_token);
  const int rem = int(i % per_token);
  const int h = rem / (p.head_dim / 8), part = rem % (p.head_dim / 8);
  const uint8_t* pages = blockIdx.y == 0 ? p.k_pages : p.v_pages;
  half* out = blockIdx.y == 0 ? p.k_out : p.v_out;
  const int64_t page = p.page[t];
  const int off = int(p.offset[t]);
  const uint8_t* base = pages + page * p.page_bytes;
  const int slot = h * kPageTokens + off;  // (head, token) row within the page
  const int64_t code_bytes = int64_t(p.num_kv_heads) * kPageTokens * (p.head_dim / 2);
  const uint32_t codes = *reinterpret_cast<const uint32_t*>(base + int64_t(slot) * (p.head_dim / 2) + part * 4);
  const float scale = __half2float(reinterpret_cast<const half*>(base + code_bytes)[slot]);
  const float zero = __half2float(
      reinterpret_cast<const half*>(base + code_bytes + 2 * int64_t(p.num_kv_heads) * kPageTokens)[slot]);
  __align__(16) half x[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float q = float((codes >> (4 * j)) & 0xF);  // element 2b in byte b's low nibble
    x[j] = __float2half_rn(__fmul_rn(__fsub_rn(q, zero), scale));
  }
  *reinterpret_cast<uint4*>(out + (int64_t(t) * p.num_kv_heads + h) * p.head_dim + part * 8) =
      *reinterpret_cast<const uint4*>(x);
}

}  // namespace

cudaError_t launch_kv4_read(const KV4ReadParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t total = int64_t(p.tokens) * p.num_kv_heads * p.head_dim / 8;
  const dim3 grid(unsigned((total + threads - 1) / threads), 2);
  kv4_read_kernel<<<grid, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace qoq_attn
