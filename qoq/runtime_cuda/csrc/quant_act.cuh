// Host entry points of the fused activation-quantization kernels (quant_act.cu), bound in gemm_w4a8.cu.
// Each returns {qx int8 [T, K], s_x fp16 [T, 1], xsum fp32 [T] (empty unless with_sum)}.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace qoq_quant {

// DESIGN §3.3 per-token symmetric INT8 of x [T, K].
std::vector<at::Tensor> quant_tokens(const at::Tensor& x, bool with_sum);

// §3.5 RMSNorm (fp32 math, fp16 result) of x [T, K] with weight [K], then §3.3.
std::vector<at::Tensor> rmsnorm_quant(const at::Tensor& x, const at::Tensor& weight, double eps, bool with_sum);

// fp16(fp16(silu(gate)) * up) of gate, up [T, K] (rows may be strided views), then §3.3.
std::vector<at::Tensor> silu_mul_quant(const at::Tensor& gate, const at::Tensor& up, bool with_sum);

}  // namespace qoq_quant
