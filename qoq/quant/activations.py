"""Dynamic per-token symmetric INT8 activations (docs/design.md §3.3); math in fp32 whatever x's dtype."""

from __future__ import annotations

import torch

ABS_MAX_FLOOR = 1e-6
# 1e-6 / 127 underflows fp16 to 0: a token that small gets the smallest positive fp16 scale
# instead, so nothing divides by zero (its codes stay exact: |x| / 2^-24 <= 127).
SMALLEST_FP16_SCALE = 2.0**-24


def quantize_tokens(x: torch.Tensor, codes_dtype: torch.dtype = torch.int8) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (qx [..., K] in -127..127, s_x fp16 [..., 1]). `codes_dtype` float32 keeps the
    (exact, integer-valued) codes in fp32 for CPU matmuls, skipping two conversions."""
    xf = x.float()
    abs_max = xf.abs().amax(dim=-1, keepdim=True).clamp_min(ABS_MAX_FLOOR)  # [..., 1]
    s_x = (abs_max / 127).half().clamp_min(SMALLEST_FP16_SCALE)
    return codes_at_scale(xf, s_x).to(codes_dtype), s_x


def codes_at_scale(x: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
    """The codes of x [..., K] at the per-token scales s_x [..., 1]: round(x / s_x) in -127..127, fp32."""
    return torch.round(x.float() / s_x.float()).clamp_(-127, 127)


def fake_quant_tokens(x: torch.Tensor) -> torch.Tensor:
    """x̂ = s_x * qx, computed in fp32, returned in x's dtype."""
    qx, s_x = quantize_tokens(x)
    return (qx.float() * s_x.float()).to(x.dtype)
