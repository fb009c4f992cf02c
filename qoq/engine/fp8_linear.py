"""W8A8 FP8 (e4m3) linears for the CUDA runner's `quantization="fp8"` path, vLLM's `--quantization fp8` on
an fp16 checkpoint: weights quantized once at load, per output channel; activations quantized per token at
every call (dynamic: scale = the row's absmax / 448, no calibration); the GEMM is `torch._scaled_mm` with
row-wise scales (scale_a [M, 1] per token, scale_b [1, N] per channel, applied to the fp32 accumulator)
and an fp16 output, the bias added in its epilogue.

The reference (`kernel=False`: CPU, `ops="reference"`) computes the same numbers in torch: the same e4m3
codes and scales, the codes' products summed in fp32, then both scales and the bias, rounded to fp16.
Every step is a device op of static shape (no host sync), so the linears run inside decode CUDA graphs.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
MIN_SCALE = 1e-12  # an all-zero row or channel: codes 0, no division by zero


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (any float dtype) -> (codes e4m3 [M, K], scales fp32 [M, 1]) with x ≈ codes * scales.

    The cast needs no clamp: |x| / scale <= 448 up to an fp32 rounding, which e4m3 rounds back to 448
    (past 464 torch's casts differ: saturation on some paths, NaN on others)."""
    amax = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True, dtype=torch.float32)
    scale = (amax / E4M3_MAX).clamp_min_(MIN_SCALE)
    return (x / scale).to(E4M3), scale


def reference_scaled_mm(xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor,
                        bias: torch.Tensor | None) -> torch.Tensor:
    """What `torch._scaled_mm(xq, wq.t(), x_scale, w_scale, bias, out_dtype=fp16)` computes: codes [M, K],
    [N, K]; scales fp32 [M, 1], [1, N] -> fp16 [M, N]. e4m3 products are exact in fp32."""
    acc = (xq.float() @ wq.float().t()) * x_scale * w_scale
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(torch.float16)


class Fp8Linear:
    """y = x Wᵀ + b with W in e4m3 per output channel and x quantized per token at each call."""

    def __init__(self, wq: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None, kernel: bool):
        self.wq, self.w_scale, self.bias, self.kernel = wq, w_scale, bias, kernel
        self.out_features, self.in_features = wq.shape

    @classmethod
    def from_fp16(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, kernel: bool | None = None):
        """weight [N, K], bias [N] or None; kernel: torch._scaled_mm (default: on a CUDA device) or the
        torch reference."""
        kernel = weight.is_cuda if kernel is None else kernel
        n, k = weight.shape
        if kernel:
            if not weight.is_cuda:
                raise ValueError(f"fp8 linears: torch._scaled_mm needs a CUDA tensor, got one on {weight.device}")
            cap = torch.cuda.get_device_capability(weight.device)
            if cap < (8, 9):
                raise ValueError(f"fp8 linears need compute capability 8.9+ (FP8 tensor cores), got {cap[0]}.{cap[1]}")
            if n % 16 or k % 16:  # torch._scaled_mm: K and N multiples of 16 (M is free)
                raise ValueError(f"fp8 linears need in and out features multiples of 16, got weight [{n}, {k}]")
        wq, scale = quantize_rows(weight)  # per output channel: a weight row is a channel
        # scale_b [1, N] contiguous (row-wise _scaled_mm's layout); wq stays [N, K] row-major, so wq.t()
        # is the column-major second operand _scaled_mm takes
        return cls(wq, scale.view(1, n).contiguous(), None if bias is None else bias.half(), kernel)

    def dequantized_weight(self) -> torch.Tensor:
        """fp32 [N, K]: the weight this linear multiplies by."""
        return self.wq.float() * self.w_scale.view(-1, 1)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weight as kept: e4m3 codes and fp32 channel scales (an fp16 bias apart)."""
        return fp8_weight_bytes(self.out_features, self.in_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x fp16 [..., K] -> fp16 [..., N]."""
        lead = x.shape[:-1]
        xq, x_scale = quantize_rows(x.reshape(-1, self.in_features))
        if self.kernel:
            y = torch._scaled_mm(xq, self.wq.t(), scale_a=x_scale, scale_b=self.w_scale, bias=self.bias,
                                 out_dtype=torch.float16)
        else:
            y = reference_scaled_mm(xq, x_scale, self.wq, self.w_scale, self.bias)
        return y.view(*lead, self.out_features)


def fp8_weight_bytes(out_features: int, in_features: int) -> int:
    """Bytes of an fp8 weight of this shape: one e4m3 code per element, one fp32 scale per channel."""
    return out_features * in_features + 4 * out_features
