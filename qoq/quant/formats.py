"""One place that maps a recipe Format to its weight quantizer, its runtime linear and its artifact
tensors: QoQ W4A8 (§3.1/§3.2: weights.py, linear.py), symmetric W4A4 / W8A8 (§3.7: symmetric.py,
symmetric_linear.py) and W4A16 (§3.8: asymmetric.py, weight_only_linear.py); and its KV cache quantization
(§3.4: kv.py) on an attention module."""

from __future__ import annotations

import torch

from qoq.quant.asymmetric import AsymmetricWeight, quantize_asymmetric
from qoq.quant.kv import fake_quant_kv
from qoq.quant.linear import IntegerLinear, export_linear
from qoq.quant.symmetric import SymmetricWeight, quantize_symmetric
from qoq.quant.symmetric_linear import SymmetricIntegerLinear, export_symmetric
from qoq.quant.weight_only_linear import WeightOnlyLinear, export_asymmetric
from qoq.quant.weights import QuantizedWeight, fake_quantize, quantize_weight

AnyWeight = QuantizedWeight | SymmetricWeight | AsymmetricWeight


def quantize_for_format(w: torch.Tensor, fmt, clip_ratio: torch.Tensor | None = None,
                        order: torch.Tensor | None = None) -> AnyWeight:
    """Round-to-nearest of w [N, K] in the format's weight scheme; `order` (symmetric only) the input
    channel order its groups follow (Atom's outliers last)."""
    if fmt.weight_scheme == "symmetric":
        if fmt.outlier_channels and order is None:
            raise ValueError(f"{fmt.outlier_channels} outlier channels need an input order: run the "
                             "'outlier_reorder' pass before the quantizer")
        return quantize_symmetric(w, fmt.group_size, fmt.weight_bits, fmt.outlier_channels, clip_ratio, order)
    if order is not None:
        raise ValueError(f"weight scheme '{fmt.weight_scheme}' takes no input order")
    if fmt.weight_scheme == "asymmetric":
        return quantize_asymmetric(w, fmt.group_size, clip_ratio)
    return quantize_weight(w, fmt.group_size, clip_ratio)


def fake_quantize_for_format(w: torch.Tensor, fmt, clip_ratio: torch.Tensor | None = None,
                             order: torch.Tensor | None = None) -> torch.Tensor:
    """quantize_for_format(...).dequantize(): fp32 [N, K] in the input channels' own order."""
    if fmt.weight_scheme == "qoq":
        return fake_quantize(w, fmt.group_size, clip_ratio)  # the fast path of the clip searches
    return quantize_for_format(w, fmt, clip_ratio, order).dequantize()


def linear_from_weight(qw: AnyWeight, bias: torch.Tensor | None, fmt) -> torch.nn.Module:
    """The module computing the runtime's arithmetic of a quantized linear (bias fp16-rounded)."""
    if isinstance(qw, SymmetricWeight):
        return SymmetricIntegerLinear.from_weight(qw, bias, fmt.act_clip)
    if isinstance(qw, AsymmetricWeight):
        return WeightOnlyLinear(qw, bias)
    return IntegerLinear.from_quantized(qw, bias)


def export_weight(prefix: str, qw: AnyWeight, bias: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    if isinstance(qw, SymmetricWeight):
        return export_symmetric(prefix, qw, bias)
    if isinstance(qw, AsymmetricWeight):
        return export_asymmetric(prefix, qw, bias)
    return export_linear(prefix, qw, bias)


def linear_from_tensors(tensors: dict[str, torch.Tensor], prefix: str, fmt) -> torch.nn.Module:
    """The reference executor's module for the artifact tensors of linear `prefix`."""
    if fmt.weight_scheme == "symmetric":
        return SymmetricIntegerLinear.from_tensors(tensors, prefix, fmt)
    if fmt.weight_scheme == "asymmetric":
        return WeightOnlyLinear.from_tensors(tensors, prefix, fmt)
    return IntegerLinear.from_tensors(tensors, prefix)


def use_kv_format(attention, fmt) -> None:
    """An Attention's KV cache as the format stores it: UINT4 post-RoPE K and V for kv_bits 4 (float
    otherwise), K without its k bias when fmt.k_bias_outside_cache."""
    attention.kv_quant = fake_quant_kv if fmt.kv_bits == 4 else None
    attention.k_bias_outside_cache = fmt.k_bias_outside_cache
