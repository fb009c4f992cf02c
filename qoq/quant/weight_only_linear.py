"""WeightOnlyLinear: the W4A16 format (docs/design.md §3.8) at run time: the UINT4 codes dequantized
once, ŵ = (q - zero)·scale, and a float GEMM in the activations' dtype (fp32 on the CPU reference,
fp16 on a GPU: the dequantize + fp16 GEMM path). Built from an AsymmetricWeight or from artifact
tensors; plus its artifact tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qoq.export.packing import pack_qweight, unpack_qweight
from qoq.quant.asymmetric import AsymmetricWeight


class WeightOnlyLinear(nn.Module):
    def __init__(self, qw: AsymmetricWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.group_size = qw.group_size
        self.out_features, self.in_features = qw.shape
        self.register_buffer("weight", qw.dequantize())  # [N, K] fp32, exact (q - z)·s
        self.register_buffer("bias", None if bias is None else bias.half().float())

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str, fmt) -> WeightOnlyLinear:
        def get(name: str) -> torch.Tensor:
            if f"{prefix}.{name}" not in tensors:
                raise KeyError(f"artifact tensor {prefix}.{name} is missing")
            return tensors[f"{prefix}.{name}"]

        packed, scales, zeros = get("qweight"), get("w_scales"), get("w_zeros")
        n, k = packed.shape[0], 2 * packed.shape[1]
        qw = AsymmetricWeight(unpack_qweight(packed, n, k), scales, zeros.to(torch.uint8), fmt.group_size)
        if scales.shape != zeros.shape or scales.shape[0] != n or k % scales.shape[1]:
            raise ValueError(f"{prefix}: w_scales {tuple(scales.shape)} / w_zeros {tuple(zeros.shape)} do not fit "
                             f"a [{n}, {k}] weight")
        return cls(qw, tensors.get(f"{prefix}.bias"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


def export_asymmetric(prefix: str, qw: AsymmetricWeight, bias: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """AsymmetricWeight -> artifact tensors: `qweight` (codes packed as §4's qweight, [N, K/2]),
    `w_scales` fp16 [N, G], `w_zeros` uint8 [N, G], `bias`."""
    out = {f"{prefix}.qweight": pack_qweight(qw.q), f"{prefix}.w_scales": qw.scales.half().contiguous(),
           f"{prefix}.w_zeros": qw.zeros.to(torch.uint8).contiguous()}
    if bias is not None:
        out[f"{prefix}.bias"] = bias.half()
    return out
