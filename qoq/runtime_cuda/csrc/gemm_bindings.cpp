// Python bindings of the W4A8 GEMM extension, and its own argument checks: a backstop behind the
// Python wrappers' checks (the errors convention: qoq/runtime_cuda/__init__.py). A problem is found as
// text (check_*) and raised by one TORCH_CHECK per entry point.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include <string>

#include "gemm_w4a8_params.h"
#include "quant_act.cuh"

namespace {

using Problem = std::string;  // empty: none
using Opt = c10::optional<at::Tensor>;

std::string piece(const char* s) { return s; }
std::string piece(const c10::Device& d) { return d.str(); }
std::string piece(int64_t v) { return std::to_string(v); }
std::string piece(at::ScalarType t) { return c10::toString(t); }

template <typename... Args>
std::string text(const Args&... args) {
  return (std::string() + ... + piece(args));
}

Problem check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  if (!t.is_cuda()) return text(name, " must be a CUDA tensor");
  if (t.scalar_type() != dtype) return text(name, " must be ", dtype, ", got ", t.scalar_type());
  if (!t.is_contiguous()) return text(name, " must be contiguous");
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16) return text(name, " must be 16-byte aligned");
  return {};
}

Problem check_vector(const Opt& t, const char* name, at::ScalarType dtype, int64_t n) {
  if (!t.has_value()) return text(name, " is required");
  Problem problem = check_tensor(*t, name, dtype);
  if (problem.empty() && t->numel() != n) problem = text(name, " must have ", n, " elements, got ", t->numel());
  return problem;
}

// Every operand on qx's GPU, where launch_gemm runs the kernel.
Problem check_devices(const at::Tensor& qx, const at::Tensor& qweight,
                      std::initializer_list<std::pair<const Opt*, const char*>> optional) {
  if (qweight.device() != qx.device()) return text("qweight is on ", qweight.device(), ", qx on ", qx.device());
  for (const auto& [t, name] : optional)
    if (t->has_value() && (*t)->device() != qx.device())
      return text(name, " is on ", (*t)->device(), ", qx on ", qx.device());
  return {};
}

const __half* half_ptr(const at::Tensor& t) { return reinterpret_cast<const __half*>(t.data_ptr<at::Half>()); }

// Shapes, dtypes and the per-group / per-channel terms; fills everything of p but the output. tile_rows:
// 0 for qx [M, K]; M (1..16) for qx in A-fragment tiles [K/32, 32, 16] (GemmParams::tiled).
Problem check_gemm(qoq_gemm::GemmParams& p, const at::Tensor& qx, const Opt& s_x, const at::Tensor& qweight,
                   const Opt& s1, const Opt& s2, const Opt& s2_zeros, const Opt& szero, const Opt& xsum,
                   const Opt& qsum, const Opt& bias, int64_t variant, bool want_acc, int64_t tile_rows) {
  for (const auto& [t, name] : {std::pair{&qx, "qx"}, std::pair{&qweight, "qweight"}}) {
    if (Problem problem = check_tensor(*t, name, at::kChar); !problem.empty()) return problem;
  }
  const bool tiled = tile_rows != 0;
  if (qweight.dim() != 2) return "qweight must be [N, K/2]";
  if (tiled && (qx.dim() != 3 || qx.size(1) != 32 || qx.size(2) != 16))
    return "tiled qx must be [K/32, 32, 16]";
  if (!tiled && qx.dim() != 2) return "qx must be [M, K]";
  if (tiled && (tile_rows < 0 || tile_rows > qoq_gemm::GEMVP_MAX_M))
    return text("tiled qx holds 1 to ", qoq_gemm::GEMVP_MAX_M, " rows, got ", tile_rows);
  if (tiled && variant != qoq_gemm::GEMV16 && variant != qoq_gemm::GEMV16P)
    return "tiled qx is read by the gemv16 and gemv16p variants only";
  const int64_t M = tiled ? tile_rows : qx.size(0), K = tiled ? qx.size(0) * 32 : qx.size(1), N = qweight.size(0);
  if (qweight.size(1) * 2 != K) return text("qweight [N, K/2] does not match K=", K, " of qx");
  if (N % 32 || K % 32 || K == 0) return text("N and K must be multiples of 32 (K > 0), got N=", N, " K=", K);
  const bool grouped = s2.has_value();
  if (grouped != s2_zeros.has_value()) return "s2_scales and s2_zeros come together (per-group weights)";
  if (grouped && szero.has_value()) return "give per-group (s2) or per-channel (szero) terms, not both";
  if (variant < qoq_gemm::GEMV || variant > qoq_gemm::LAST_VARIANT)
    return text("unknown GEMM variant ", variant, " (see qoq/runtime_cuda/gemm.py's VARIANTS)");
  const bool wgmma = variant >= qoq_gemm::WG128X64 && variant <= qoq_gemm::WG64X64_K2;
  if (wgmma && at::cuda::getDeviceProperties(qx.get_device())->major != 9)
    return "the wgmma variants need a Hopper GPU (sm_90)";
  const bool gemv = variant == qoq_gemm::GEMV || variant == qoq_gemm::GEMV16 || variant == qoq_gemm::GEMV16P;
  if (gemv && M > qoq_gemm::GEMV_MAX_M)
    return text("the gemv variant handles M <= ", qoq_gemm::GEMV_MAX_M, ", got M=", M);
  if (variant == qoq_gemm::GEMV16P && M > qoq_gemm::GEMVP_MAX_M)
    return text("the gemv16p variant handles M <= ", qoq_gemm::GEMVP_MAX_M, ", got M=", M);
  if (variant == qoq_gemm::GEMV16P && N * K / 2 >= (int64_t{1} << 32))  // its 32-bit weight offsets
    return text("the gemv16p variant handles packed weights below 4 GiB, got N=", N, " x K=", K);

  p.qx = qx.data_ptr<int8_t>();
  p.tiled = tiled;
  p.qweight = reinterpret_cast<const uint8_t*>(qweight.data_ptr<int8_t>());
  p.M = static_cast<int>(M), p.N = static_cast<int>(N), p.K = static_cast<int>(K), p.group = 0;
  if (grouped) {
    for (const auto& [t, name] : {std::pair{&*s2, "s2_scales"}, std::pair{&*s2_zeros, "s2_zeros"}}) {
      if (Problem problem = check_tensor(*t, name, at::kChar); !problem.empty()) return problem;
    }
    if (s2->dim() != 2 || s2->size(1) != N || s2_zeros->sizes() != s2->sizes())
      return "s2_scales and s2_zeros must both be [K/g, N]";
    const int64_t groups = s2->size(0);
    if (groups == 0 || K % groups || (K / groups) % qoq_gemm::GROUP_MULTIPLE)
      return text("group size K/groups must be a multiple of 64, got K=", K, " with ", groups, " groups");
    p.group = static_cast<int>(K / groups);
    if (gemv && p.group != 64 && p.group != 128)
      return text("the gemv variant handles groups of 64 or 128, got ", p.group);
    p.s2 = s2->data_ptr<int8_t>();
    p.s2_zeros = s2_zeros->data_ptr<int8_t>();
    if (wgmma || gemv) {  // per group the wgmma and GEMV kernels take the code sums
      if (Problem problem = check_vector(qsum, "qsum", at::kInt, M); !problem.empty()) return problem;
      p.qsum = qsum->data_ptr<int32_t>();
    }
  }
  if (want_acc) return {};
  for (const auto& [t, name, dtype, n] : {std::tuple{&s_x, "s_x", at::kHalf, M}, std::tuple{&s1, "s1_scales", at::kHalf, N}}) {
    if (Problem problem = check_vector(*t, name, dtype, n); !problem.empty()) return problem;
  }
  p.s_x = half_ptr(*s_x);
  p.s1 = half_ptr(*s1);
  if (!grouped) {
    if (Problem problem = check_vector(szero, "s1_szeros", at::kHalf, N); !problem.empty()) return problem;
    if (Problem problem = check_vector(xsum, "xsum", at::kFloat, M); !problem.empty()) return problem;
    p.szero = half_ptr(*szero);
    p.xsum = xsum->data_ptr<float>();
  }
  if (bias.has_value()) {
    if (Problem problem = check_vector(bias, "bias", at::kHalf, N); !problem.empty()) return problem;
    p.bias = half_ptr(*bias);
  }
  return {};
}

// fp16 Y [M, N] (or the int32 accumulators when want_acc).
py::object run_gemm(const at::Tensor& qx, const Opt& s_x, const at::Tensor& qweight, const Opt& s1, const Opt& s2,
                    const Opt& s2_zeros, const Opt& szero, const Opt& xsum, const Opt& qsum, const Opt& bias,
                    const Opt& out, int64_t variant, bool want_acc, int64_t tile_rows, bool dependent = false) {
  qoq_gemm::GemmParams p{};
  p.dependent = dependent;
  Problem problem =
      check_gemm(p, qx, s_x, qweight, s1, s2, s2_zeros, szero, xsum, qsum, bias, variant, want_acc, tile_rows);
  if (problem.empty())
    problem = check_devices(qx, qweight, {{&s_x, "s_x"}, {&s1, "s1_scales"}, {&s2, "s2_scales"}, {&s2_zeros, "s2_zeros"},
                                          {&szero, "s1_szeros"}, {&xsum, "xsum"}, {&qsum, "qsum"}, {&bias, "bias"},
                                          {&out, "out"}});
  TORCH_CHECK(problem.empty(), problem);
  const auto out_dtype = want_acc ? at::kInt : at::kHalf;
  at::Tensor result = out.has_value() ? *out : at::empty({p.M, p.N}, qx.options().dtype(out_dtype));
  problem = check_tensor(result, "out", out_dtype);
  if (problem.empty() && (result.dim() != 2 || result.size(0) != p.M || result.size(1) != p.N))
    problem = "out must be [M, N]";
  TORCH_CHECK(problem.empty(), problem);
  if (want_acc) p.acc_out = result.data_ptr<int32_t>();
  else p.out = reinterpret_cast<__half*>(result.data_ptr<at::Half>());
  if (p.M > 0) qoq_gemm::launch_gemm(p, static_cast<qoq_gemm::Variant>(variant), qx);
  return py::cast(result);
}

Problem check_rows(const at::Tensor& t, const char* name) {
  if (!t.is_cuda() || t.scalar_type() != at::kHalf) return text(name, " must be a CUDA fp16 tensor");
  if (t.dim() != 2 || t.stride(1) != 1) return text(name, " must be [T, K] with contiguous rows");
  if (t.size(1) % 8 || t.stride(0) % 8) return text(name, ": K and the row stride must be multiples of 8");
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16) return text(name, " must be 16-byte aligned");
  return {};
}

// The operands of a row op: x (gate for SiluMul), `other` (up, or RMSNorm's weight) and RMSNorm's residual.
Problem check_row_op(qoq_quant::RowOp op, const at::Tensor& x, const at::Tensor& other, const Opt& residual) {
  Problem problem = check_rows(x, op == qoq_quant::RowOp::SiluMul ? "gate" : "x");
  if (problem.empty() && op == qoq_quant::RowOp::SiluMul) {
    problem = check_rows(other, "up");
    if (problem.empty() && other.sizes() != x.sizes()) problem = "gate and up must have one shape";
  }
  if (problem.empty() && op == qoq_quant::RowOp::RmsNorm) {
    problem = check_tensor(other, "weight", at::kHalf);
    if (problem.empty() && other.numel() != x.size(1))
      problem = text("weight has ", other.numel(), " elements, x has K=", x.size(1));
  }
  if (problem.empty() && op != qoq_quant::RowOp::Plain && other.device() != x.device())
    problem = text(op == qoq_quant::RowOp::SiluMul ? "up" : "weight", " is on ", other.device(), ", the activations on ",
                   x.device());
  if (problem.empty() && residual.has_value()) {
    if (op != qoq_quant::RowOp::RmsNorm) problem = "a residual is added by the RMSNorm row op only";
    if (problem.empty()) problem = check_rows(*residual, "residual");
    if (problem.empty() && residual->sizes() != x.sizes()) problem = "residual and x must have one shape";
    if (problem.empty() && residual->device() != x.device())
      problem = text("residual is on ", residual->device(), ", the activations on ", x.device());
  }
  return problem;
}

// {qx, s_x, sums} of quant_rows.
py::object run_quant(qoq_quant::RowOp op, const at::Tensor& x, const at::Tensor& other, double eps, int64_t sums,
                     bool tiles, const Opt& residual = c10::nullopt) {
  TORCH_CHECK(sums >= 0 && sums <= static_cast<int64_t>(qoq_quant::RowSums::Codes),
              text("unknown row sums ", sums, " (0: none, 1: inputs, 2: codes)"));
  Problem problem = check_row_op(op, x, other, residual);
  if (problem.empty() && tiles && (x.size(0) > qoq_gemm::GEMVP_MAX_M || x.size(1) % 32))
    problem = text("tiled codes need at most ", qoq_gemm::GEMVP_MAX_M, " rows and K a multiple of 32, got ", x.size(0),
                   " x ", x.size(1));
  TORCH_CHECK(problem.empty(), problem);
  return py::cast(qoq_quant::quant_rows(op, x, other, eps, static_cast<qoq_quant::RowSums>(sums), tiles, residual));
}

// fp16 rows of rows_fp16.
at::Tensor run_rows_fp16(qoq_quant::RowOp op, const at::Tensor& x, const at::Tensor& other, double eps,
                         const Opt& residual, bool enable_pdl) {
  const Problem problem = check_row_op(op, x, other, residual);
  TORCH_CHECK(problem.empty(), problem);
  return qoq_quant::rows_fp16(op, x, other, eps, residual, enable_pdl);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemm", [](const at::Tensor& qx, const at::Tensor& s_x, const at::Tensor& qweight, const at::Tensor& s1,
                   const Opt& s2, const Opt& s2_zeros, const Opt& szero, const Opt& xsum, const Opt& qsum,
                   const Opt& bias, const Opt& out, int64_t variant, bool enable_pdl, int64_t tile_rows) {
    return run_gemm(qx, s_x, qweight, s1, s2, s2_zeros, szero, xsum, qsum, bias, out, variant, false, tile_rows,
                    enable_pdl);
  }, "W4A8 GEMM -> fp16 [M, N]");
  m.def("gemm_accumulators", [](const at::Tensor& qx, const at::Tensor& qweight, const Opt& s2, const Opt& s2_zeros,
                                const Opt& qsum, const Opt& out, int64_t variant, int64_t tile_rows) {
    return run_gemm(qx, c10::nullopt, qweight, c10::nullopt, s2, s2_zeros, c10::nullopt, c10::nullopt, qsum,
                    c10::nullopt, out, variant, true, tile_rows);
  }, "W4A8 GEMM int32 accumulators [M, N] (debug)");
  m.def("quant_tokens", [](const at::Tensor& x, int64_t sums, bool tiles) {
    return run_quant(qoq_quant::RowOp::Plain, x, at::Tensor(), 0.0, sums, tiles);
  });
  m.def("rmsnorm_quant", [](const at::Tensor& x, const at::Tensor& weight, double eps, int64_t sums, bool tiles,
                            const Opt& residual) {
    return run_quant(qoq_quant::RowOp::RmsNorm, x, weight, eps, sums, tiles, residual);
  });
  m.def("silu_mul_quant", [](const at::Tensor& gate, const at::Tensor& up, int64_t sums, bool tiles) {
    return run_quant(qoq_quant::RowOp::SiluMul, gate, up, 0.0, sums, tiles);
  });
  m.def("rmsnorm_fp16", [](const at::Tensor& x, const at::Tensor& weight, double eps, const Opt& residual,
                           bool enable_pdl) {
    return run_rows_fp16(qoq_quant::RowOp::RmsNorm, x, weight, eps, residual, enable_pdl);
  }, "RMSNorm (of residual += x with a residual) -> fp16 [T, K]");
  m.def("silu_mul_fp16", [](const at::Tensor& gate, const at::Tensor& up, bool enable_pdl) {
    return run_rows_fp16(qoq_quant::RowOp::SiluMul, gate, up, 0.0, c10::nullopt, enable_pdl);
  }, "fp16(fp16(silu(gate)) * up) -> fp16 [T, K]");
}
