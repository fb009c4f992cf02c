// KV4 paged attention: page layout (docs/design.md §5), launch parameters and device helpers shared by
// kv_rope_write.cu, attention_decode_kv4.cu and attention_bindings.cu.
//
// Page (64 tokens, one layer, K or V): [H_kv][64][D/2] nibble codes (element d in the low nibble
// when d is even), then fp16 scale [H_kv][64], then fp16 zero [H_kv][64].
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace qoq_attn {

constexpr int kPageTokens = 64;

struct DecodeParams {
  const half* q;              // [B, H_q, D]
  const uint8_t* k_pages;     // [P, page_bytes]
  const uint8_t* v_pages;     // [P, page_bytes]
  const int32_t* page_table;  // [B, page_table_stride]
  const int32_t* seq_lens;    // [B], each >= 1
  half* out;                  // [B, H_q, D]
  float* part_o;              // [B, H_kv, splits, G, D]  (splits > 1 only)
  float* part_ml;             // [B, H_kv, splits, G, 2]  running max (log2 units) and sum
  int32_t* counters;          // [B * H_kv], zero on entry, left zero on exit
  int64_t page_bytes;
  int page_table_stride, batch, num_kv_heads, group, num_splits, pages_per_split;
  int num_stages;             // ring slots per warp: 2, or 3 (head_dim 128 only)
  // the k bias kept outside the cache (design §3.4; attention_decode_k_bias.cuh), else k_bias null: b
  // [H_kv, D] fp32, the RoPE tables [max_pos, D/2] fp32 and their first chunk's rows as the bias mma's A
  // fragments (attention.py: rope_fragments)
  const float* k_bias;
  const float* rope_cos;
  const float* rope_sin;
  const uint4* rope_rel;
  float scale_log2;  // softmax scale * log2(e)
  bool dependent;    // Hopper: launched as a programmatic dependent of the kernel ahead, which may write
                     // q and each sequence's last token, not the page table, seq_lens or older tokens
};

// kv_rope_write.cu: the KV4 launcher writes KV4 pages [P, page_bytes]; the fp16 one the fp16 artifact's pools
// [P][64][H_kv][D] (page_bytes = 64 * H_kv * D * 2).
struct RopeWriteParams {
  const half* qkv;            // [T, (H_q + 2 H_kv) * D], row stride qkv_stride
  const int64_t* positions;   // [T]
  const int64_t* slots;       // [T] page * 64 + offset; < 0 skips the cache write
  const float* cos;           // [max_pos, D/2]
  const float* sin;           // [max_pos, D/2]
  half* q_out;                // [T, H_q, D]
  half* k_out;                // [T, H_kv, D] post-RoPE K in fp16 (for prefill attention), or nullptr
  uint8_t* k_pages;
  uint8_t* v_pages;
  int64_t qkv_stride, page_bytes;
  int tokens, num_q_heads, num_kv_heads;
  bool dependent;  // Hopper: launched as a programmatic dependent of the kernel ahead (it reads nothing
                   // before its wait)
};

// kv4_read.cu: the KV4 slots page * 64 + offset of K and V read back as fp16 [T, H_kv, D] (prefill attention's
// context; attention_reference.read_kv4_slots + dequantize_kv). head_dim a multiple of 8.
struct KV4ReadParams {
  const uint8_t* k_pages;
  const uint8_t* v_pages;
  const int64_t* page;    // [T]
  const int64_t* offset;  // [T] in 0..63
  half* k_out;            // [T, H_kv, D]
  half* v_out;
  int64_t page_bytes;
  int tokens, num_kv_heads, head_dim;
};

// Host launchers (return the launch error, cudaSuccess when fine). launch_decode_fp16 takes the same
// DecodeParams over fp16 pools [P][64][H_kv][D] (page_bytes = 64 * H_kv * D * 2; plain launch: no
// `dependent`): attention_decode_fp16.cu.
cudaError_t launch_decode_kv4(const DecodeParams& p, int head_dim, cudaStream_t stream);
cudaError_t launch_decode_fp16(const DecodeParams& p, int head_dim, cudaStream_t stream);
cudaError_t launch_rope_kv4_write(const RopeWriteParams& p, int head_dim, cudaStream_t stream);
cudaError_t launch_rope_kv_write_fp16(const RopeWriteParams& p, int head_dim, cudaStream_t stream);
cudaError_t launch_kv4_read(const KV4ReadParams& p, cudaStream_t stream);

// ---- device helpers ---------------------------------------------------------------------------

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

__device__ __forceinline__ uint32_t h2_bits(half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ half2 bits_h2(uint32_t u) { return *reinterpret_cast<half2*>(&u); }

// 8 nibbles n0..n7 of x (n0 lowest) -> out[i] = half2 of two codes as exact fp16 subnormals (value
// bits * 2^-24): masking is the whole dequantization, one logic op per 2 codes plus a shift. A nibble
// at bits 4..7 reads 16 n; the caller divides its partner (q) or its output row by 16, and removes
// the 2^-24 in fp32. Tensor-core products of subnormal fp16 are exact, so nothing is lost.
//   out[0] = (n0, n4)   out[1] = 16 (n1, n5)   out[2] = (n2, n6)   out[3] = 16 (n3, n7)   (times 2^-24)
__device__ __forceinline__ void subnormal_codes8(uint32_t x, uint32_t (&out)[4]) {
  out[0] = x & 0x000f000fu;
  out[1] = x & 0x00f000f0u;
  x >>= 8;
  out[2] = x & 0x000f000fu;
  out[3] = x & 0x00f000f0u;
}

// d[4] += A(16x16, fp16, 4 regs) * B(16x8, fp16, 2 regs), fp32 accumulate.
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Asynchronous global -> shared copies (sm_80+): loads in flight without holding registers.
template <int kBytes>
__device__ __forceinline__ void cp_async(uint32_t smem_dst, const void* src) {
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_dst), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(smem_dst), "l"(src), "n"(kBytes) : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Read 1, 2 or 4 words (4, 8 or 16 bytes, aligned) into registers in one access.
template <int kWords>
__device__ __forceinline__ void read_words(uint32_t (&dst)[kWords], const uint8_t* src) {
  if constexpr (kWords == 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(src);
    dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
  } else if constexpr (kWords == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(src);
    dst[0] = v.x; dst[1] = v.y;
  } else {
    static_assert(kWords == 1, "1, 2 or 4 words");
    dst[0] = *reinterpret_cast<const uint32_t*>(src);
  }
}

}  // namespace qoq_attn
