// Host side of the W4A8 GEMMs: argument checks and launch of the variant gemm.py chose; the module's bindings.
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "gemm_w4a8_kernels.cuh"
#include "quant_act.cuh"

namespace qoq_gemm {

enum Variant { GEMV = 1, TILED64 = 2, TILED128 = 3 };

static void check_cuda_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name, " must be 16-byte aligned");
}

static void check_vector(const c10::optional<at::Tensor>& t, const char* name, at::ScalarType dtype, int64_t n) {
  TORCH_CHECK(t.has_value(), name, " is required");
  check_cuda_tensor(*t, name, dtype);
  TORCH_CHECK(t->numel() == n, name, " must have ", n, " elements, got ", t->numel());
}

template <int BM, bool GROUPED>
static void launch_tiled(const GemmParams& p, cudaStream_t stream) {
  constexpr int smem = TiledSmem<BM>::TOTAL;
  static bool configured = false;  // the >48 KB dynamic shared-memory opt-in, once per kernel
  if (!configured) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(gemm_tiled_kernel<BM, GROUPED>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  const dim3 grid((p.M + BM - 1) / BM, (p.N + TILED_BN - 1) / TILED_BN);
  gemm_tiled_kernel<BM, GROUPED><<<grid, TILED_THREADS, smem, stream>>>(p);
}

template <int MT, int GROUP>
static void launch_gemv(const GemmParams& p, cudaStream_t stream) {
  constexpr int smem = gemv_smem_bytes<MT>();
  static bool configured = false;
  if (!configured) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(gemm_gemv_kernel<MT, GROUP>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  gemm_gemv_kernel<MT, GROUP><<<p.N / 32, GEMV_WARPS * 32, smem, stream>>>(p);
}

template <int GROUP>
static void dispatch_gemv(const GemmParams& p, cudaStream_t stream) {
  TORCH_CHECK(p.M <= 64, "the gemv variant handles M <= 64, got M=", p.M);
  if (p.M <= 16) return launch_gemv<1, GROUP>(p, stream);
  if (p.M <= 32) return launch_gemv<2, GROUP>(p, stream);
  return launch_gemv<4, GROUP>(p, stream);
}

// The variant is chosen by the caller (qoq/runtime_cuda/gemm.py picks one for "auto").
template <bool GROUPED>
static void dispatch(const GemmParams& p, int variant, cudaStream_t stream) {
  switch (variant) {
    case GEMV:
      if (!GROUPED) return dispatch_gemv<0>(p, stream);
      TORCH_CHECK(p.group == 64 || p.group == 128, "the gemv variant handles groups of 64 or 128, got ", p.group);
      return p.group == 64 ? dispatch_gemv<64>(p, stream) : dispatch_gemv<128>(p, stream);
    case TILED64:
      return launch_tiled<64, GROUPED>(p, stream);
    case TILED128:
      return launch_tiled<128, GROUPED>(p, stream);
    default:
      TORCH_CHECK(false, "unknown GEMM variant ", variant, " (1 gemv, 2 tiled64, 3 tiled128)");
  }
}

// Y = epilogue(qx @ W8^T) in fp16 [M, N], or the raw int32 accumulators when want_acc.
static at::Tensor run_gemm(const at::Tensor& qx, const c10::optional<at::Tensor>& s_x, const at::Tensor& qweight,
                           const c10::optional<at::Tensor>& s1, const c10::optional<at::Tensor>& s2,
                           const c10::optional<at::Tensor>& s2_zeros, const c10::optional<at::Tensor>& szero,
                           const c10::optional<at::Tensor>& xsum, const c10::optional<at::Tensor>& bias,
                           c10::optional<at::Tensor> out, int64_t variant, bool want_acc) {
  check_cuda_tensor(qx, "qx", at::kChar);
  check_cuda_tensor(qweight, "qweight", at::kChar);
  TORCH_CHECK(qx.dim() == 2 && qweight.dim() == 2, "qx must be [M, K] and qweight [N, K/2]");
  const int64_t M = qx.size(0), K = qx.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.size(1) * 2 == K, "qweight [N, K/2] does not match K=", K, " of qx");
  TORCH_CHECK(N % 32 == 0 && K % 32 == 0, "N and K must be multiples of 32, got N=", N, " K=", K);
  const bool grouped = s2.has_value();
  TORCH_CHECK(grouped == s2_zeros.has_value(), "s2_scales and s2_zeros come together (per-group weights)");
  TORCH_CHECK(!(grouped && szero.has_value()), "give per-group (s2) or per-channel (szero) terms, not both");

  GemmParams p{};
  p.qx = qx.data_ptr<int8_t>();
  p.qweight = reinterpret_cast<const uint8_t*>(qweight.data_ptr<int8_t>());
  p.M = static_cast<int>(M), p.N = static_cast<int>(N), p.K = static_cast<int>(K), p.group = 0;
  if (grouped) {
    check_cuda_tensor(*s2, "s2_scales", at::kChar);
    check_cuda_tensor(*s2_zeros, "s2_zeros", at::kChar);
    TORCH_CHECK(s2->dim() == 2 && s2->size(1) == N && s2_zeros->sizes() == s2->sizes(),
                "s2_scales and s2_zeros must both be [K/g, N]");
    const int64_t groups = s2->size(0);
    TORCH_CHECK(groups > 0 && K % groups == 0 && (K / groups) % SCALE_SPAN == 0,
                "group size K/groups must be a multiple of 64, got K=", K, " with ", groups, " groups");
    p.group = static_cast<int>(K / groups);
    p.s2 = s2->data_ptr<int8_t>();
    p.s2_zeros = s2_zeros->data_ptr<int8_t>();
  }
  if (!want_acc) {
    check_vector(s_x, "s_x", at::kHalf, M);
    check_vector(s1, "s1_scales", at::kHalf, N);
    p.s_x = reinterpret_cast<const half*>(s_x->data_ptr<at::Half>());
    p.s1 = reinterpret_cast<const half*>(s1->data_ptr<at::Half>());
    if (!grouped) {
      check_vector(szero, "s1_szeros", at::kHalf, N);
      check_vector(xsum, "xsum", at::kFloat, M);
      p.szero = reinterpret_cast<const half*>(szero->data_ptr<at::Half>());
      p.xsum = xsum->data_ptr<float>();
    }
    if (bias.has_value()) {
      check_vector(bias, "bias", at::kHalf, N);
      p.bias = reinterpret_cast<const half*>(bias->data_ptr<at::Half>());
    }
  }
  const auto out_dtype = want_acc ? at::kInt : at::kHalf;
  at::Tensor result = out.has_value() ? *out : at::empty({M, N}, qx.options().dtype(out_dtype));
  check_cuda_tensor(result, "out", out_dtype);
  TORCH_CHECK(result.size(0) == M && result.size(1) == N, "out must be [M, N]");
  if (want_acc) p.acc_out = result.data_ptr<int32_t>();
  else p.out = reinterpret_cast<half*>(result.data_ptr<at::Half>());
  if (M == 0) return result;

  const c10::cuda::CUDAGuard guard(qx.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (grouped) dispatch<true>(p, static_cast<int>(variant), stream);
  else dispatch<false>(p, static_cast<int>(variant), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return result;
}

at::Tensor gemm(const at::Tensor& qx, const at::Tensor& s_x, const at::Tensor& qweight, const at::Tensor& s1,
                const c10::optional<at::Tensor>& s2, const c10::optional<at::Tensor>& s2_zeros,
                const c10::optional<at::Tensor>& szero, const c10::optional<at::Tensor>& xsum,
                const c10::optional<at::Tensor>& bias, c10::optional<at::Tensor> out, int64_t variant) {
  return run_gemm(qx, s_x, qweight, s1, s2, s2_zeros, szero, xsum, bias, out, variant, false);
}

at::Tensor gemm_accumulators(const at::Tensor& qx, const at::Tensor& qweight, const c10::optional<at::Tensor>& s2,
                             const c10::optional<at::Tensor>& s2_zeros, c10::optional<at::Tensor> out,
                             int64_t variant) {
  return run_gemm(qx, c10::nullopt, qweight, c10::nullopt, s2, s2_zeros, c10::nullopt, c10::nullopt,
                  c10::nullopt, out, variant, true);
}

}  // namespace qoq_gemm

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemm", &qoq_gemm::gemm, "W4A8 GEMM -> fp16 [M, N]", py::arg("qx"), py::arg("s_x"), py::arg("qweight"),
        py::arg("s1"), py::arg("s2"), py::arg("s2_zeros"), py::arg("szero"), py::arg("xsum"), py::arg("bias"),
        py::arg("out"), py::arg("variant"));
  m.def("gemm_accumulators", &qoq_gemm::gemm_accumulators, "W4A8 GEMM int32 accumulators [M, N] (debug)",
        py::arg("qx"), py::arg("qweight"), py::arg("s2"), py::arg("s2_zeros"), py::arg("out"), py::arg("variant"));
  m.def("quant_tokens", &qoq_quant::quant_tokens, py::arg("x"), py::arg("with_sum"));
  m.def("rmsnorm_quant", &qoq_quant::rmsnorm_quant, py::arg("x"), py::arg("weight"), py::arg("eps"),
        py::arg("with_sum"));
  m.def("silu_mul_quant", &qoq_quant::silu_mul_quant, py::arg("gate"), py::arg("up"), py::arg("with_sum"));
}
