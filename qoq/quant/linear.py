"""IntegerLinear: the runtime's W4A8 arithmetic in torch (per-token INT8 activations times integer
weights, exact integer accumulation, fp32 epilogue of docs/design.md §3.1 / §3.2), built either from a
QuantizedWeight (the pipeline's in-memory model) or from artifact tensors (the executor), so both compute
the same numbers; plus export_linear (QuantizedWeight -> artifact tensors). forward(x [..., K]) returns
[..., N] in x's dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from qoq.export.packing import deinterleave_s2, interleave_s2, pack_qweight, unpack_qweight
from qoq.quant.activations import quantize_tokens
from qoq.quant.weights import QuantizedWeight

EXACT_FP32_CHUNK = 1024  # 1024 * 127 * 128 < 2^24: fp32 partial sums of this many products are exact


class IntegerLinear(nn.Module):
    """Per-token INT8 activations times integer weights, accumulated exactly, fp32 epilogue."""

    def __init__(
        self,
        weight: torch.Tensor,  # int8 [N, K]: W8 (group) or codes q (per channel)
        s1: torch.Tensor,  # fp16 [N]
        szero: torch.Tensor | None = None,  # fp16 [N], per channel only
        bias: torch.Tensor | None = None,  # fp16 [N]
    ):
        super().__init__()
        self.register_buffer("weight", weight.to(torch.int8).contiguous())
        self.register_buffer("s1", s1.half())
        self.register_buffer("szero", None if szero is None else szero.half())
        self.register_buffer("bias", None if bias is None else bias.half())

    @classmethod
    def from_quantized(cls, qw: QuantizedWeight, bias: torch.Tensor | None = None) -> "IntegerLinear":
        if qw.group_size == -1:
            return cls(qw.q.to(torch.int8), qw.s1, qw.szero, bias)
        return cls(qw.w8().to(torch.int8), qw.s1, None, bias)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str) -> "IntegerLinear":
        """Build from the artifact tensors of docs/design.md §4 named `{prefix}.qweight` etc."""

        def get(name: str) -> torch.Tensor:
            if f"{prefix}.{name}" not in tensors:
                raise KeyError(f"artifact tensor {prefix}.{name} is missing")
            return tensors[f"{prefix}.{name}"]

        packed = get("qweight")
        n, k = packed.shape[0], packed.shape[1] * 2
        q = unpack_qweight(packed, n, k)  # uint8 [N, K]
        bias = tensors.get(f"{prefix}.bias")
        if f"{prefix}.s1_szeros" in tensors:
            return cls(q.to(torch.int8), get("s1_scales"), get("s1_szeros"), bias)
        s2 = deinterleave_s2(get("s2_scales")).to(torch.int16)  # [N, K/g]
        neg_z = deinterleave_s2(get("s2_zeros")).to(torch.int16)
        if k % s2.shape[1]:
            raise ValueError(f"{prefix}: K={k} is not a multiple of the {s2.shape[1]} s2 groups")
        group = k // s2.shape[1]
        w8 = q.to(torch.int16) * s2.repeat_interleave(group, 1) + neg_z.repeat_interleave(group, 1)
        if int(w8.min()) < -128 or int(w8.max()) > 127:
            raise ValueError(f"{prefix}: W8 = q*s2 - z leaves int8 range [{int(w8.min())}, {int(w8.max())}]")
        return cls(w8, get("s1_scales"), None, bias)

    def _weight_f32(self) -> torch.Tensor:
        """The integer weight as exact fp32 values, converted once per device (CPU path)."""
        if getattr(self, "_w_f32", None) is None or self._w_f32.device != self.weight.device:
            self._w_f32 = self.weight.float()  # [N, K]
        return self._w_f32

    def _accumulate_cpu(self, qx: torch.Tensor) -> torch.Tensor:
        """Exact Σ qx·W from fp32 codes [M, K]: fp32 GEMMs over K-chunks whose partial sums stay below
        2^24 (|qx·w| <= 127*128) are exact in any summation order; more chunks add up in float64."""
        w = self._weight_f32()
        k = qx.shape[1]
        if k <= EXACT_FP32_CHUNK:
            return qx @ w.t()  # [M, N], exact integers in fp32
        acc = None
        for k0 in range(0, k, EXACT_FP32_CHUNK):
            part = (qx[:, k0 : k0 + EXACT_FP32_CHUNK] @ w[:, k0 : k0 + EXACT_FP32_CHUNK].t()).double()
            acc = part if acc is None else acc.add_(part)
        return acc

    def accumulate(self, qx: torch.Tensor) -> torch.Tensor:
        """Exact Σ_k qx[t,k]·W[n,k]: int8 [M, K] -> int32 [M, N] (int64 on the float paths)."""
        m, k = qx.shape
        n = self.weight.shape[0]
        if qx.is_cuda and m > 16 and k % 8 == 0 and n % 8 == 0:
            return torch._int_mm(qx, self.weight.t())
        if qx.is_cuda:  # float64 sums of integers are exact while |acc| < 2^53
            return (qx.double() @ self.weight.double().t()).to(torch.int64)
        return self._accumulate_cpu(qx.float()).to(torch.int64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])  # [M, K]
        if x2.is_cuda:
            qx, s_x = quantize_tokens(x2)
            acc = self.accumulate(qx).float()  # [M, N]; int32 -> fp32 as the epilogue sees it
        else:
            qx, s_x = quantize_tokens(x2, codes_dtype=torch.float32)
            acc = self._accumulate_cpu(qx).float()  # same values, no int round trips
        y = acc.mul_(s_x.float()).mul_(self.s1.float())
        if self.szero is not None:
            y = y - x2.float().sum(dim=-1, keepdim=True) * self.szero.float()
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*lead, -1)


def export_linear(prefix: str, qw: QuantizedWeight, bias: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """QuantizedWeight -> the artifact tensors of docs/design.md §4 for the linear `prefix`."""
    out = {f"{prefix}.qweight": pack_qweight(qw.q), f"{prefix}.s1_scales": qw.s1.half()}
    if qw.group_size == -1:
        out[f"{prefix}.s1_szeros"] = qw.szero.half()
    else:
        neg_z = -qw.z.to(torch.int16)
        if int(neg_z.min()) < -128 or int(neg_z.max()) > 127 or int(qw.s2.max()) > 127:
            raise ValueError(f"{prefix}: s2 or -z does not fit int8 storage")
        out[f"{prefix}.s2_scales"] = interleave_s2(qw.s2.to(torch.int8))
        out[f"{prefix}.s2_zeros"] = interleave_s2(neg_z.to(torch.int8))
    if bias is not None:
        out[f"{prefix}.bias"] = bias.half()
    return out
