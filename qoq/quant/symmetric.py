"""Symmetric integer weights and activations (docs/design.md §3.7): W4A4 (Atom, QuaRot) and W8A8
(SmoothQuant), on the same grouping for weights and activations.

Input channels are taken in an optional order (Atom's reorder). The first K - o ordered channels form
groups of g at `bits` (one group of all of them per channel); the last o (Atom's outliers) form one group
at 8 bits. Per group: scale = fp16(r·max|v| / qmax) with qmax = 2^(bits-1) - 1, codes =
clamp(round(v / scale), -qmax - 1, qmax). Weights: r = the clip ratio of the row (low-bit groups only),
a zero scale is stored as 1. Activations, per token: r = the format's act_clip (low-bit groups only),
max|x| floored at 1e-6 and the scale at 2^-24 as in §3.3. Math in fp32, rounding half to even.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import torch

from qoq.quant.activations import ABS_MAX_FLOOR, SMALLEST_FP16_SCALE
from qoq.quant.weights import _check_matrix, _clip_ratios, _to_fp16_scale

OUTLIER_BITS = 8


@dataclass(frozen=True)
class Groups:
    """The grouping of K input channels (in their order): normal groups, then the outlier group."""

    k: int
    group_size: int  # -1: one group of all K - outliers channels
    bits: int  # 4 or 8, of the normal groups
    outliers: int = 0  # trailing channels in one INT8 group

    def __post_init__(self):
        normal = self.k - self.outliers
        if self.bits not in (4, 8):
            raise ValueError(f"symmetric codes are 4 or 8 bits, got {self.bits}")
        if self.outliers < 0 or normal <= 0:
            raise ValueError(f"{self.outliers} outlier channels leave no normal channel of K={self.k}")
        if self.group_size != -1 and (self.group_size <= 0 or normal % self.group_size):
            raise ValueError(f"K - outliers = {normal} is not divisible by the group size {self.group_size}")

    @cached_property
    def segments(self) -> tuple[tuple[int, int, int, int], ...]:
        """(first channel, end, group size, bits) of the normal run and, if any, the outlier run."""
        normal = self.k - self.outliers
        size = normal if self.group_size == -1 else self.group_size
        runs = [(0, normal, size, self.bits)]
        if self.outliers:
            runs.append((normal, self.k, self.outliers, OUTLIER_BITS))
        return tuple(runs)

    @cached_property
    def count(self) -> int:
        return sum((hi - lo) // size for lo, hi, size, _ in self.segments)

    @cached_property
    def bounds(self) -> tuple[tuple[int, int], ...]:
        """(first channel, end) of every group, in order."""
        return tuple((c, c + size) for lo, hi, size, _ in self.segments for c in range(lo, hi, size))

    @cached_property
    def qmax(self) -> torch.Tensor:
        """fp32 [G]: 2^(bits-1) - 1 of each group."""
        return torch.tensor([2.0 ** (b - 1) - 1 for lo, hi, size, b in self.segments for _ in range(lo, hi, size)])

    @cached_property
    def normal(self) -> torch.Tensor:
        """bool [G]: the normal groups, which clip ratios apply to (not the INT8 outlier group)."""
        return torch.tensor([lo < self.k - self.outliers for lo, _ in self.bounds])

    @cached_property
    def column_group(self) -> torch.Tensor:
        """int64 [K]: the group of each (ordered) channel."""
        return torch.repeat_interleave(torch.arange(self.count), torch.tensor([hi - lo for lo, hi in self.bounds]))

    def abs_max(self, t: torch.Tensor) -> torch.Tensor:
        """[..., K] -> [..., G]: max |t| over each group."""
        parts = [t[..., lo:hi].unflatten(-1, (-1, size)).abs().amax(dim=-1) for lo, hi, size, _ in self.segments]
        return torch.cat(parts, dim=-1)

    def codes(self, t: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """round(t / scale) clamped to each group's range: t [..., K] fp32, scales [..., G] -> fp32 [..., K]."""
        cols = self.column_group.to(t.device)
        qmax = self.qmax.to(t.device)[cols]
        q = torch.round(t / scales.float()[..., cols])
        return torch.maximum(torch.minimum(q, qmax), -qmax - 1)


def _order(order: torch.Tensor | None, k: int) -> torch.Tensor | None:
    if order is None:
        return None
    order = order.to(torch.int64).reshape(-1)
    if order.numel() != k or not torch.equal(torch.sort(order).values, torch.arange(k, device=order.device)):
        raise ValueError(f"input order must be a permutation of the {k} input channels")
    return order


@dataclass
class SymmetricWeight:
    q: torch.Tensor  # int8 [N, K]: signed codes, columns in `order`
    scales: torch.Tensor  # fp16 [N, G]
    group_size: int  # -1: per channel
    bits: int  # of the normal groups
    outliers: int = 0  # the last ordered columns, one INT8 group
    order: torch.Tensor | None = None  # int64 [K]: ordered column j is input channel order[j]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @cached_property
    def groups(self) -> Groups:
        return Groups(self.q.shape[1], self.group_size, self.bits, self.outliers)

    @cached_property
    def _columns(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per (ordered) column: its group [K], its qmax [K] fp32, and the scales fp32 [N, G] (GPTQ rounds
        one column at a time: these are built once per grid, not per column)."""
        g, dev = self.groups, self.q.device
        cols = g.column_group.to(dev)
        return cols, g.qmax.to(dev)[cols], self.scales.float()

    def dequantize_ordered(self) -> torch.Tensor:
        """fp32 [N, K] in the stored (ordered) column order: q·scale."""
        return self.q.float() * self.scales.float()[:, self.groups.column_group.to(self.q.device)]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Float weight [N, K] in the input channels' own order."""
        w = self.dequantize_ordered()
        if self.order is not None:
            out = torch.empty_like(w)
            out[:, self.order.to(w.device)] = w
            w = out
        return w.to(dtype)

    def with_order(self, order: torch.Tensor | None) -> SymmetricWeight:
        return replace(self, order=_order(order, self.q.shape[1]))

    def with_codes(self, q: torch.Tensor) -> SymmetricWeight:
        if q.shape != self.q.shape:
            raise ValueError(f"codes must be [{', '.join(map(str, self.q.shape))}], got {tuple(q.shape)}")
        qmax = self.groups.qmax.to(q.device)[self.groups.column_group.to(q.device)]
        if bool((q.float() > qmax).any() or (q.float() < -qmax - 1).any()):
            raise ValueError("codes outside their groups' signed range")
        return replace(self, q=q.to(torch.int8))

    def round_onto(self, w: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes of w [N, C] on this grid's fixed scales as its (ordered) columns `columns` [C]:
        (codes int8 [N, C], dequantized fp32 [N, C]) (GPTQ's rounding)."""
        column_group, column_qmax, scales = self._columns
        scale = scales[:, column_group[columns]]  # [N, C]
        qmax = column_qmax[columns]
        q = torch.maximum(torch.minimum(torch.round(w.float() / scale), qmax), -qmax - 1)
        return q.to(torch.int8), q * scale


def quantize_symmetric(w: torch.Tensor, group_size: int, bits: int, outliers: int = 0,
                       clip_ratio: torch.Tensor | None = None, order: torch.Tensor | None = None
                       ) -> SymmetricWeight:
    """§3.7 weights: w [N, K] (input channels in their own order) -> SymmetricWeight with columns
    in `order`; clip_ratio [N] shrinks the low-bit groups' ranges."""
    w = _check_matrix(w)
    n, k = w.shape
    order = _order(order, k)
    wo = w if order is None else w[:, order.to(w.device)]
    g = Groups(k, group_size, bits, outliers)
    r = _clip_ratios(clip_ratio, n, w.device)[:, None]  # [N, 1]
    ratio = torch.where(g.normal.to(w.device)[None, :], r, torch.ones_like(r))  # [N, G]
    scales = _to_fp16_scale(ratio * g.abs_max(wo) / g.qmax.to(w.device), "symmetric weight scale")
    q = g.codes(wo, scales)
    return SymmetricWeight(q.to(torch.int8), scales, group_size, bits, outliers, order)


def quantize_token_groups(x: torch.Tensor, groups: Groups, act_clip: float = 1.0
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """§3.7 activations: x [M, K] (ordered channels) -> (codes fp32 [M, K], scales fp16 [M, G])."""
    xf = x.float()
    abs_max = groups.abs_max(xf).clamp_min(ABS_MAX_FLOOR)  # [M, G]
    clip = torch.where(groups.normal, torch.tensor(act_clip), torch.tensor(1.0)).to(x.device)
    scales = (clip * abs_max / groups.qmax.to(x.device)).half().clamp_min(SMALLEST_FP16_SCALE)
    return groups.codes(xf, scales), scales


def fake_quant_token_groups(x: torch.Tensor, groups: Groups, act_clip: float = 1.0) -> torch.Tensor:
    """x̂ = codes·scale per group, fp32 [M, K] (ordered channels)."""
    q, s = quantize_token_groups(x, groups, act_clip)
    return q * s.float()[..., groups.column_group.to(x.device)]
