// Host entry points of the fused row kernels (quant_act.cu). The arguments are checked in gemm_bindings.cpp.
// quant_rows returns {qx int8 [T, K] (or tiles), s_x fp16 [T, 1], sums [T]}: per `sums`, the fp32 sums of
// the fp16 GEMM inputs (what per-channel GEMMs subtract, §3.2), the int32 sums of the codes (what the
// per-group wgmma GEMMs subtract for their biased u8 weights), or empty. rows_fp16 returns the fp16 rows
// themselves [T, K] (the fp16 path's RMSNorm and SiLU·mul).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace qoq_quant {

// The fp16 GEMM input of each row of x [T, K] (rows x.stride(0) apart):
// Plain: x; RmsNorm: §3.5 RMSNorm with weight `other` [K], with a `residual` [T, K] first residual += x in
// place (fp16 sum) and then the RMSNorm of the sum (vLLM's fused_add_rms_norm); SiluMul: fp16(fp16(silu(x)) *
// other) with `other` the up rows [T, K]. Then §3.3 per-token symmetric INT8. tiles: qx in the GEMV's
// A-fragment tiles [K/32, 32, 16] (T <= 16, K % 32 == 0: gemm_w4a8_params.h GemmParams::tiled) instead of
// [T, K].
enum class RowOp { Plain, RmsNorm, SiluMul };
enum class RowSums { None = 0, Inputs = 1, Codes = 2 };

std::vector<at::Tensor> quant_rows(RowOp op, const at::Tensor& x, const at::Tensor& other, double eps, RowSums sums,
                                   bool tiles, const c10::optional<at::Tensor>& residual);

// RmsNorm or SiluMul rows as above, not quantized. enable_pdl (Hopper): launched as a programmatic dependent of
// the kernel ahead, reading nothing before its wait.
at::Tensor rows_fp16(RowOp op, const at::Tensor& x, const at::Tensor& other, double eps,
                     const c10::optional<at::Tensor>& residual, bool enable_pdl);

}  // namespace qoq_quant
