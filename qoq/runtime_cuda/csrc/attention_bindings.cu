// Python bindings of the attention kernels (KV4; over the fp16 artifact's pages: decode and the RoPE write).
// Shapes and dtypes are checked here too, by TORCH_CHECK, behind the Python wrappers' checks (the errors
// convention: qoq/runtime_cuda/__init__.py); the wrappers in qoq/runtime_cuda/attention.py allocate outputs
// and workspaces.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "attention_kv4.cuh"

namespace {

// The kernels run on `device` (q's or qkv's GPU; the callers' CUDAGuard makes it current) and read t there.
void check(const torch::Tensor& t, const char* name, at::ScalarType dtype, int dim, const c10::Device& device) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.device() == device, name, " is on ", t.device(), ", expected ", device);
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dims, got ", t.dim());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void decode_kv4(const torch::Tensor& q, const torch::Tensor& k_pages, const torch::Tensor& v_pages,
                const torch::Tensor& page_table, const torch::Tensor& seq_lens, torch::Tensor& out,
                torch::Tensor& part_o, torch::Tensor& part_ml, torch::Tensor& counters,
                int64_t num_kv_heads, int64_t num_splits, int64_t pages_per_split, int64_t num_stages,
                double scale, bool enable_pdl, const c10::optional<torch::Tensor>& k_bias,
                const c10::optional<torch::Tensor>& rope_cos, const c10::optional<torch::Tensor>& rope_sin,
                const c10::optional<torch::Tensor>& rope_fragments) {
  const c10::Device device = q.device();
  check(q, "q", at::kHalf, 3, device);
  check(k_pages, "k_pages", at::kByte, 2, device);
  check(v_pages, "v_pages", at::kByte, 2, device);
  check(page_table, "page_table", at::kInt, 2, device);
  check(seq_lens, "seq_lens", at::kInt, 1, device);
  check(out, "out", at::kHalf, 3, device);
  check(part_o, "part_o", at::kFloat, 1, device);
  check(part_ml, "part_ml", at::kFloat, 1, device);
  check(counters, "counters", at::kInt, 1, device);
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  TORCH_CHECK(Hq % num_kv_heads == 0, "num_q_heads ", Hq, " is not a multiple of num_kv_heads ", num_kv_heads);
  const int64_t G = Hq / num_kv_heads;
  TORCH_CHECK(k_pages.sizes() == v_pages.sizes(), "k_pages and v_pages differ in shape");
  TORCH_CHECK(k_pages.size(1) == num_kv_heads * qoq_attn::kPageTokens * (D / 2 + 4),
              "page bytes ", k_pages.size(1), " do not match num_kv_heads ", num_kv_heads, ", head_dim ", D);
  TORCH_CHECK(page_table.size(0) == B && seq_lens.size(0) == B, "page_table/seq_lens batch != q batch");
  TORCH_CHECK(out.sizes() == q.sizes(), "out shape != q shape");
  TORCH_CHECK(num_splits == 1 || (part_o.numel() >= B * num_kv_heads * num_splits * G * D &&
                                  part_ml.numel() >= B * num_kv_heads * num_splits * G * 2 &&
                                  counters.numel() >= B * num_kv_heads),
              "split workspaces too small");
  qoq_attn::DecodeParams p{};
  p.q = reinterpret_cast<const half*>(q.data_ptr<at::Half>());
  p.k_pages = k_pages.data_ptr<uint8_t>();
  p.v_pages = v_pages.data_ptr<uint8_t>();
  p.page_table = page_table.data_ptr<int32_t>();
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.out = reinterpret_cast<half*>(out.data_ptr<at::Half>());
  p.part_o = part_o.data_ptr<float>();
  p.part_ml = part_ml.data_ptr<float>();
  p.counters = counters.data_ptr<int32_t>();
  p.page_bytes = k_pages.size(1);
  p.page_table_stride = page_table.size(1);
  p.batch = B;
  p.num_kv_heads = num_kv_heads;
  p.group = G;
  p.num_splits = num_splits;
  p.pages_per_split = pages_per_split;
  p.num_stages = num_stages;
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.dependent = enable_pdl && at::cuda::getDeviceProperties(q.get_device())->major >= 9;
  if (k_bias.has_value()) {  // the k bias kept outside the cache: attention_decode_k_bias.cuh
    TORCH_CHECK(rope_cos.has_value() && rope_sin.has_value() && rope_fragments.has_value(),
                "k_bias needs rope_cos, rope_sin and rope_fragments");
    check(*k_bias, "k_bias", at::kFloat, 2, device);
    check(*rope_cos, "rope_cos", at::kFloat, 2, device);
    check(*rope_sin, "rope_sin", at::kFloat, 2, device);
    check(*rope_fragments, "rope_fragments", at::kInt, 4, device);
    TORCH_CHECK(k_bias->size(0) == num_kv_heads && k_bias->size(1) == D, "k_bias must be [num_kv_heads, head_dim]");
    TORCH_CHECK(rope_cos->size(1) == D / 2 && rope_sin->sizes() == rope_cos->sizes(), "rope_cos/sin must be [max_pos, D/2]");
    TORCH_CHECK(rope_fragments->numel() == 16 * 256 / D * D / 2, "rope_fragments has the wrong size for head_dim ", D);
    p.k_bias = k_bias->data_ptr<float>();
    p.rope_cos = rope_cos->data_ptr<float>();
    p.rope_sin = rope_sin->data_ptr<float>();
    p.rope_rel = reinterpret_cast<const uint4*>(rope_fragments->data_ptr<int32_t>());
  }
  const c10::cuda::CUDAGuard guard(device);  // launch on q's GPU, in its current stream
  const cudaError_t err = qoq_attn::launch_decode_kv4(p, D, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "decode_kv4 launch failed (head_dim ", D, ", group ", G, ", splits ", num_splits,
              ", stages ", num_stages, "): ", cudaGetErrorString(err));
}

// Pools [num_pages, 64, H_kv, D] fp16 (one layer's K or V of qoq/engine/kv_float.py).
void decode_fp16(const torch::Tensor& q, const torch::Tensor& k_pool, const torch::Tensor& v_pool,
                 const torch::Tensor& page_table, const torch::Tensor& seq_lens, torch::Tensor& out,
                 torch::Tensor& part_o, torch::Tensor& part_ml, torch::Tensor& counters, int64_t num_splits,
                 int64_t pages_per_split, int64_t num_stages, double scale) {
  const c10::Device device = q.device();
  check(q, "q", at::kHalf, 3, device);
  check(k_pool, "k_pool", at::kHalf, 4, device);
  check(v_pool, "v_pool", at::kHalf, 4, device);
  check(page_table, "page_table", at::kInt, 2, device);
  check(seq_lens, "seq_lens", at::kInt, 1, device);
  check(out, "out", at::kHalf, 3, device);
  check(part_o, "part_o", at::kFloat, 1, device);
  check(part_ml, "part_ml", at::kFloat, 1, device);
  check(counters, "counters", at::kInt, 1, device);
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k_pool.size(2);
  TORCH_CHECK(k_pool.sizes() == v_pool.sizes(), "k_pool and v_pool differ in shape");
  TORCH_CHECK(k_pool.size(1) == qoq_attn::kPageTokens && k_pool.size(3) == D,
              "pools must be [num_pages, 64, num_kv_heads, head_dim ", D, "], got ", k_pool.sizes());
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "num_q_heads ", Hq, " is not a multiple of num_kv_heads ", Hkv);
  const int64_t G = Hq / Hkv;
  // 4-byte query loads, 16-byte page copies
  TORCH_CHECK(reinterpret_cast<uintptr_t>(q.data_ptr()) % 4 == 0, "q must be 4-byte aligned");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(k_pool.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(v_pool.data_ptr()) % 16 == 0,
              "k_pool and v_pool must be 16-byte aligned");
  TORCH_CHECK(page_table.size(0) == B && seq_lens.size(0) == B, "page_table/seq_lens batch != q batch");
  TORCH_CHECK(out.sizes() == q.sizes(), "out shape != q shape");
  TORCH_CHECK(num_splits == 1 || (part_o.numel() >= B * Hkv * num_splits * G * D &&
                                  part_ml.numel() >= B * Hkv * num_splits * G * 2 && counters.numel() >= B * Hkv),
              "split workspaces too small");
  qoq_attn::DecodeParams p{};
  p.q = reinterpret_cast<const half*>(q.data_ptr<at::Half>());
  p.k_pages = reinterpret_cast<const uint8_t*>(k_pool.data_ptr<at::Half>());
  p.v_pages = reinterpret_cast<const uint8_t*>(v_pool.data_ptr<at::Half>());
  p.page_table = page_table.data_ptr<int32_t>();
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.out = reinterpret_cast<half*>(out.data_ptr<at::Half>());
  p.part_o = part_o.data_ptr<float>();
  p.part_ml = part_ml.data_ptr<float>();
  p.counters = counters.data_ptr<int32_t>();
  p.page_bytes = k_pool.stride(0) * 2;
  p.page_table_stride = page_table.size(1);
  p.batch = B;
  p.num_kv_heads = Hkv;
  p.group = G;
  p.num_splits = num_splits;
  p.pages_per_split = pages_per_split;
  p.num_stages = num_stages;
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.dependent = false;
  const c10::cuda::CUDAGuard guard(device);  // launch on q's GPU, in its current stream
  const cudaError_t err = qoq_attn::launch_decode_fp16(p, D, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "decode_fp16 launch failed (head_dim ", D, ", group ", G, ", splits ", num_splits,
              ", stages ", num_stages, "): ", cudaGetErrorString(err));
}

// What both page formats' RoPE writes check and pass: qkv, positions, slots, the RoPE tables and q_out.
qoq_attn::RopeWriteParams rope_write_params(const torch::Tensor& qkv, const torch::Tensor& positions,
                                            const torch::Tensor& slots, const torch::Tensor& cos,
                                            const torch::Tensor& sin, torch::Tensor& q_out, int64_t num_kv_heads) {
  TORCH_CHECK(qkv.is_cuda() && qkv.scalar_type() == at::kHalf && qkv.dim() == 2 && qkv.stride(1) == 1 &&
                  qkv.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(qkv.data_ptr()) % 16 == 0,
              "qkv must be a 16-byte aligned CUDA fp16 [T, (Hq+2Hkv)*D] tensor with unit column stride and row "
              "stride % 8 == 0");
  const c10::Device device = qkv.device();
  check(positions, "positions", at::kLong, 1, device);
  check(slots, "slot_mapping", at::kLong, 1, device);
  check(cos, "cos", at::kFloat, 2, device);
  check(sin, "sin", at::kFloat, 2, device);
  check(q_out, "q_out", at::kHalf, 3, device);
  const int64_t T = qkv.size(0), Hq = q_out.size(1), D = q_out.size(2);
  TORCH_CHECK(qkv.size(1) == (Hq + 2 * num_kv_heads) * D, "qkv width ", qkv.size(1), " != (Hq + 2 Hkv) * D");
  TORCH_CHECK(positions.size(0) == T && slots.size(0) == T && q_out.size(0) == T, "token counts differ");
  TORCH_CHECK(cos.size(1) == D / 2 && sin.sizes() == cos.sizes(), "cos/sin must be [max_pos, D/2]");
  qoq_attn::RopeWriteParams p{};
  p.qkv = reinterpret_cast<const half*>(qkv.data_ptr<at::Half>());
  p.positions = positions.data_ptr<int64_t>();
  p.slots = slots.data_ptr<int64_t>();
  p.cos = cos.data_ptr<float>();
  p.sin = sin.data_ptr<float>();
  p.q_out = reinterpret_cast<half*>(q_out.data_ptr<at::Half>());
  p.qkv_stride = qkv.stride(0);
  p.tokens = T;
  p.num_q_heads = Hq;
  p.num_kv_heads = num_kv_heads;
  return p;
}

void rope_kv4_write(const torch::Tensor& qkv, const torch::Tensor& positions, const torch::Tensor& slots,
                    const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& q_out,
                    torch::Tensor& k_out, torch::Tensor& k_pages, torch::Tensor& v_pages) {
  const c10::Device device = qkv.device();
  check(k_out, "k_out", at::kHalf, 3, device);
  check(k_pages, "k_pages", at::kByte, 2, device);
  check(v_pages, "v_pages", at::kByte, 2, device);
  const int64_t Hkv = k_out.size(1), D = k_out.size(2);
  qoq_attn::RopeWriteParams p = rope_write_params(qkv, positions, slots, cos, sin, q_out, Hkv);
  TORCH_CHECK(k_out.size(0) == p.tokens && D == q_out.size(2), "k_out must be [T, Hkv, D]");
  TORCH_CHECK(k_pages.sizes() == v_pages.sizes() && k_pages.size(1) == Hkv * qoq_attn::kPageTokens * (D / 2 + 4),
              "page bytes do not match heads/head_dim");
  p.k_out = reinterpret_cast<half*>(k_out.data_ptr<at::Half>());
  p.k_pages = k_pages.data_ptr<uint8_t>();
  p.v_pages = v_pages.data_ptr<uint8_t>();
  p.page_bytes = k_pages.size(1);
  const c10::cuda::CUDAGuard guard(device);  // launch on qkv's GPU, in its current stream
  const cudaError_t err = qoq_attn::launch_rope_kv4_write(p, D, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "rope_kv4_write launch failed (head_dim ", D, "): ", cudaGetErrorString(err));
}

// Pools [num_pages, 64, H_kv, D] fp16 (one layer's K or V of qoq/engine/kv_float.py).
void rope_kv_write_fp16(const torch::Tensor& qkv, const torch::Tensor& positions, const torch::Tensor& slots,
                        const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& q_out,
                        torch::Tensor& k_pool, torch::Tensor& v_pool, bool enable_pdl) {
  const c10::Device device = qkv.device();
  check(k_pool, "k_pool", at::kHalf, 4, device);
  check(v_pool, "v_pool", at::kHalf, 4, device);
  const int64_t Hkv = k_pool.size(2), D = q_out.size(2);
  TORCH_CHECK(k_pool.sizes() == v_pool.sizes(), "k_pool and v_pool differ in shape");
  TORCH_CHECK(k_pool.size(1) == qoq_attn::kPageTokens && k_pool.size(3) == D,
              "pools must be [num_pages, 64, num_kv_heads, head_dim ", D, "], got ", k_pool.sizes());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(k_pool.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(v_pool.data_ptr()) % 16 == 0,
              "k_pool and v_pool must be 16-byte aligned");
  qoq_attn::RopeWriteParams p = rope_write_params(qkv, positions, slots, cos, sin, q_out, Hkv);
  p.k_pages = reinterpret_cast<uint8_t*>(k_pool.data_ptr<at::Half>());
  p.v_pages = reinterpret_cast<uint8_t*>(v_pool.data_ptr<at::Half>());
  p.page_bytes = k_pool.stride(0) * 2;
  p.dependent = enable_pdl && at::cuda::getDeviceProperties(qkv.get_device())->major >= 9;
  const c10::cuda::CUDAGuard guard(device);  // launch on qkv's GPU, in its current stream
  const cudaError_t err = qoq_attn::launch_rope_kv_write_fp16(p, D, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "rope_kv_write_fp16 launch failed (head_dim ", D, "): ", cudaGetErrorString(err));
}

void kv4_read(const torch::Tensor& k_pages, const torch::Tensor& v_pages, const torch::Tensor& page,
              const torch::Tensor& offset, torch::Tensor& k_out, torch::Tensor& v_out) {
  const c10::Device device = k_out.device();
  check(k_pages, "k_pages", at::kByte, 2, device);
  check(v_pages, "v_pages", at::kByte, 2, device);
  check(page, "page", at::kLong, 1, device);
  check(offset, "offset", at::kLong, 1, device);
  check(k_out, "k_out", at::kHalf, 3, device);
  check(v_out, "v_out", at::kHalf, 3, device);
  const int64_t T = k_out.size(0), Hkv = k_out.size(1), D = k_out.size(2);
  TORCH_CHECK(D % 8 == 0, "head_dim must be a multiple of 8, got ", D);
  TORCH_CHECK(v_out.sizes() == k_out.sizes() && page.size(0) == T && offset.size(0) == T,
              "page/offset [T] and k_out/v_out [T, Hkv, D] disagree");
  TORCH_CHECK(k_pages.sizes() == v_pages.sizes() && k_pages.size(1) == Hkv * qoq_attn::kPageTokens * (D / 2 + 4),
              "page bytes do not match heads/head_dim");
  qoq_attn::KV4ReadParams p{};
  p.k_pages = k_pages.data_ptr<uint8_t>();
  p.v_pages = v_pages.data_ptr<uint8_t>();
  p.page = page.data_ptr<int64_t>();
  p.offset = offset.data_ptr<int64_t>();
  p.k_out = reinterpret_cast<half*>(k_out.data_ptr<at::Half>());
  p.v_out = reinterpret_cast<half*>(v_out.data_ptr<at::Half>());
  p.page_bytes = k_pages.size(1);
  p.tokens = static_cast<int>(T);
  p.num_kv_heads = static_cast<int>(Hkv);
  p.head_dim = static_cast<int>(D);
  const c10::cuda::CUDAGuard guard(device);
  const cudaError_t err = qoq_attn::launch_kv4_read(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "kv4_read launch failed: ", cudaGetErrorString(err));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_kv4", &decode_kv4, "decode attention over KV4 pages");
  m.def("decode_fp16", &decode_fp16, "decode attention over fp16 pages");
  m.def("rope_kv4_write", &rope_kv4_write, "RoPE on q/k + KV4 quantize-and-write of k/v");
  m.def("rope_kv_write_fp16", &rope_kv_write_fp16, "RoPE on q/k + write of k/v to fp16 pools");
  m.def("kv4_read", &kv4_read, "KV4 slots of K and V read back as fp16");
}
