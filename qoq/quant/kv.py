"""Dynamic per-token, per-head asymmetric UINT4 KV cache quantization (docs/design.md §3.4).

Applied over the last axis (head_dim) of K after RoPE and of V; math in fp32, scale and zero fp16.
"""

from __future__ import annotations

import torch


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., D] -> (q uint8 [..., D] in 0..15, scale fp16 [..., 1], zero fp16 [..., 1])."""
    xf = x.float()
    x_max = xf.amax(dim=-1, keepdim=True)  # [..., 1]
    x_min = xf.amin(dim=-1, keepdim=True)
    scale = ((x_max - x_min) / 15).half()
    zero = (-x_min / scale.float()).half()
    # max == min gives scale 0; a range below fp16 resolution can give scale 0 or a zero that
    # overflows fp16. Those heads store scale 1, zero -min, so x̂ = min exactly.
    flat = (scale == 0) | ~torch.isfinite(zero)
    scale = torch.where(flat, torch.ones_like(scale), scale)
    zero = torch.where(flat, (-x_min).half(), zero)
    q = torch.round(xf / scale.float() + zero.float()).clamp(0, 15)
    return q.to(torch.uint8), scale, zero


def dequantize_kv(
    q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype = torch.float16
) -> torch.Tensor:
    """x̂ = (q - zero) * scale in fp32, cast to dtype."""
    return ((q.float() - zero.float()) * scale.float()).to(dtype)


def fake_quant_kv(x: torch.Tensor) -> torch.Tensor:
    """Quantize then dequantize, in x's dtype: usable as Attention.kv_quant."""
    return dequantize_kv(*quantize_kv(x), dtype=x.dtype)
