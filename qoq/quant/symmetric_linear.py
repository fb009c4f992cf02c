"""SymmetricIntegerLinear: the integer arithmetic of the symmetric W4A4 / W8A8 formats (docs/design.md
§3.7) in torch, built from a SymmetricWeight (the pipeline's in-memory model) or from artifact tensors
(the executor), so both compute the same numbers; plus its artifact tensors and the fake-quant forward
it is tested against.

Per token t and output n: Y = Σ_g s_x[t,g]·s_w[n,g]·Σ_{k∈g} qx[t,k]·qw[n,k] (+ bias): exact integer
sums per group, an fp32 epilogue per group, groups added in fp32. The runtime gathers x[..., order]
first (Atom fuses this reorder into the kernel ahead). No GPU kernel exists for W4A4: Hopper has no
INT4 tensor-core MMA (its m16n8k64 s4 MMA compiles to an INT8 emulation); on a GPU this module runs each
group through torch._int_mm (INT8 tensor cores), the path W8A8 needs anyway.
"""

from __future__ import annotations

import torch
from torch import nn

from qoq.export.packing import pack_qweight, unpack_qweight
from qoq.quant.symmetric import (
    Groups,
    SymmetricWeight,
    fake_quant_token_groups,
    quantize_token_groups,
)

EXACT_FP32 = 2**24  # fp32 holds every integer up to this: partial sums below it are exact in any order
SIGNED4_OFFSET = 8  # a 4-bit signed code is stored as code + 8 in 0..15 (the packed nibble layout of §4)


class SymmetricIntegerLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, groups: Groups, act_clip: float = 1.0,
                 order: torch.Tensor | None = None, bias: torch.Tensor | None = None):
        super().__init__()
        if weight.shape[1] != groups.k or scales.shape != (weight.shape[0], groups.count):
            raise ValueError(f"weight {tuple(weight.shape)} and scales {tuple(scales.shape)} do not fit "
                             f"{groups.count} groups of K={groups.k}")
        self.groups, self.act_clip = groups, float(act_clip)
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.to(torch.int8).contiguous())  # [N, K], ordered columns
        self.register_buffer("scales", scales.half().contiguous())  # [N, G]
        self.register_buffer("order", None if order is None else order.to(torch.int64))
        self.register_buffer("bias", None if bias is None else bias.half())

    @classmethod
    def from_weight(cls, qw: SymmetricWeight, bias: torch.Tensor | None = None, act_clip: float = 1.0
                    ) -> SymmetricIntegerLinear:
        return cls(qw.q, qw.scales, qw.groups, act_clip, qw.order, bias)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str, fmt) -> SymmetricIntegerLinear:
        """From the artifact tensors of §4 (symmetric) named `{prefix}.qweight` etc.; `fmt` the artifact's
        Format (bits, group size, outlier channels, act_clip)."""

        def get(name: str) -> torch.Tensor:
            if f"{prefix}.{name}" not in tensors:
                raise KeyError(f"artifact tensor {prefix}.{name} is missing")
            return tensors[f"{prefix}.{name}"]

        packed, o = get("qweight"), fmt.outlier_channels
        n = packed.shape[0]
        if fmt.weight_bits == 4:
            normal = unpack_qweight(packed, n, 2 * packed.shape[1]).to(torch.int16) - SIGNED4_OFFSET
        else:
            normal = packed.to(torch.int16)
        parts = [normal] + ([get("qweight_outliers").to(torch.int16)] if o else [])
        weight = torch.cat(parts, dim=1)
        order = tensors.get(f"{prefix}.input_order")
        if o and order is None:
            raise KeyError(f"artifact tensor {prefix}.input_order is missing")
        groups = Groups(weight.shape[1], fmt.group_size, fmt.weight_bits, o)
        return cls(weight, get("w_scales"), groups, fmt.act_clip, order, tensors.get(f"{prefix}.bias"))

    def _group_sums(self, qx: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Exact Σ_{k in lo:hi} qx·W as fp32 [M, N] (fp64 when a group's sums could leave fp32's
        integers): int8 GEMMs on a GPU, fp32 GEMMs over chunks of exactly summable length on a CPU."""
        w = self.weight[:, lo:hi]
        m, n = qx.shape[0], w.shape[0]
        if qx.is_cuda:
            if m > 16 and (hi - lo) % 8 == 0 and n % 8 == 0:  # _int_mm's shape rules
                return torch._int_mm(qx[:, lo:hi].to(torch.int8).contiguous(), self._group_weight(lo, hi).t()).double()
            return qx[:, lo:hi].double() @ w.double().t()
        wf = self._weight_f32()[:, lo:hi]
        bound = int(qx[:, lo:hi].abs().max()) * int(w.abs().max()) if qx.numel() else 0
        step = (hi - lo) if bound == 0 else max(1, min(hi - lo, (EXACT_FP32 - 1) // bound))
        if step == hi - lo:
            return qx[:, lo:hi] @ wf.t()
        acc = torch.zeros(m, n, dtype=torch.float64)
        for k0 in range(lo, hi, step):
            k1 = min(k0 + step, hi)
            acc += (qx[:, k0:k1] @ self._weight_f32()[:, k0:k1].t()).double()
        return acc

    def _group_weight(self, lo: int, hi: int) -> torch.Tensor:
        """int8 [N, hi - lo], contiguous (its transpose is the column-major operand _int_mm takes), kept
        per group and device."""
        cache = getattr(self, "_w_groups", None)
        if cache is None or cache[0] != self.weight.device:
            cache = self._w_groups = (self.weight.device, {})
        if (lo, hi) not in cache[1]:
            cache[1][(lo, hi)] = self.weight[:, lo:hi].contiguous()
        return cache[1][(lo, hi)]

    def _weight_f32(self) -> torch.Tensor:
        if getattr(self, "_w_f32", None) is None or self._w_f32.device != self.weight.device:
            self._w_f32 = self.weight.float()
        return self._w_f32

    def _ordered(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).float()  # [M, K]
        return x2 if self.order is None else x2[:, self.order]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        qx, s_x = quantize_token_groups(self._ordered(x), self.groups, self.act_clip)  # [M, K], [M, G]
        s_w = self.scales.float()
        y = None
        for g, (lo, hi) in enumerate(self.groups.bounds):
            part = self._group_sums(qx, lo, hi).float().mul_(s_x[:, g : g + 1].float()).mul_(s_w[:, g])
            y = part if y is None else y.add_(part)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*lead, -1)

    def fake_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The same format by fake quantization: dequantized activations times the dequantized weight,
        one float GEMM (what the integer forward must match within float rounding)."""
        lead = x.shape[:-1]
        x_hat = fake_quant_token_groups(self._ordered(x), self.groups, self.act_clip)
        w_hat = self.weight.float() * self.scales.float()[:, self.groups.column_group.to(x.device)]
        y = x_hat @ w_hat.t()
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*lead, -1)


def export_symmetric(prefix: str, qw: SymmetricWeight, bias: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """SymmetricWeight -> artifact tensors: `qweight` (4-bit: code + 8 packed as §4's qweight, [N, (K-o)/2];
    8-bit: int8 codes [N, K]), `qweight_outliers` int8 [N, o], `w_scales` fp16 [N, G], `input_order`
    int32 [K] when the columns are reordered, `bias`."""
    normal = qw.q[:, : qw.q.shape[1] - qw.outliers]
    if qw.bits == 4:
        out = {f"{prefix}.qweight": pack_qweight((normal.to(torch.int16) + SIGNED4_OFFSET).to(torch.uint8))}
    else:
        out = {f"{prefix}.qweight": normal.to(torch.int8).contiguous()}
    if qw.outliers:
        out[f"{prefix}.qweight_outliers"] = qw.q[:, normal.shape[1] :].to(torch.int8).contiguous()
    out[f"{prefix}.w_scales"] = qw.scales.half().contiguous()
    if qw.order is not None:
        out[f"{prefix}.input_order"] = qw.order.to(torch.int32).contiguous()
    if bias is not None:
        out[f"{prefix}.bias"] = bias.half()
    return out
