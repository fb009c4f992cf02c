"""Asymmetric UINT4 weights in groups with an fp16 scale and an integer zero (docs/design.md §3.8): the
weight-only W4A16 format of AWQ and GPTQ.

Per row and group of g input channels (one group per channel when g = -1), with the clip ratio r of
the row: vmax = max(r·max w, 0), vmin = min(r·min w, 0); scale = fp16((vmax - vmin) / 15) (0 -> 1);
zero = clamp(round(-vmin / scale), 0, 15); q = clamp(round(w / scale) + zero, 0, 15);
ŵ = (q - zero)·scale in fp32. Activations stay float.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from qoq.quant.weights import _check_matrix, _to_fp16_scale


def _group_size(k: int, group_size: int) -> int:
    if group_size == -1:
        return k
    if group_size <= 0 or k % group_size:
        raise ValueError(f"K={k} is not divisible by the group size {group_size}")
    return group_size


@dataclass
class AsymmetricWeight:
    q: torch.Tensor  # uint8 [N, K], codes 0..15
    scales: torch.Tensor  # fp16 [N, G]
    zeros: torch.Tensor  # uint8 [N, G], 0..15
    group_size: int  # -1: per channel

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def _expand(self, t: torch.Tensor) -> torch.Tensor:  # [N, G] -> [N, K]
        return t.repeat_interleave(_group_size(self.q.shape[1], self.group_size), dim=1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        w = (self.q.float() - self._expand(self.zeros.float())) * self._expand(self.scales.float())
        return w.to(dtype)

    def with_codes(self, q: torch.Tensor) -> AsymmetricWeight:
        if q.shape != self.q.shape or q.dtype != torch.uint8 or int(q.max()) > 15:
            raise ValueError(f"codes must be uint8 {tuple(self.q.shape)} in 0..15, got {q.dtype} {tuple(q.shape)}")
        return replace(self, q=q)

    def round_onto(self, w: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes of w [N, C] on the fixed scales and zeros as the columns `columns` [C]:
        (codes uint8 [N, C], dequantized fp32 [N, C]) (GPTQ's rounding)."""
        groups = columns // _group_size(self.q.shape[1], self.group_size)
        scale, zero = self.scales.float()[:, groups], self.zeros.float()[:, groups]
        q = (torch.round(w.float() / scale) + zero).clamp(0, 15)
        return q.to(torch.uint8), (q - zero) * scale


def _group_ratios(clip_ratio: torch.Tensor | None, n: int, groups: int, device) -> torch.Tensor:
    """Clip ratios [N, G]: one per row ([N], the clip pass) or per row and group ([N, G], AWQ's)."""
    if clip_ratio is None:
        return torch.ones(n, groups, device=device)
    r = clip_ratio.float().to(device)
    r = r[:, None].expand(n, groups) if r.dim() == 1 and r.shape[0] == n else r
    if r.shape != (n, groups):
        raise ValueError(f"clip_ratio has shape {tuple(clip_ratio.shape)}, expected [{n}] or [{n}, {groups}]")
    if not (torch.isfinite(r).all() and (r > 0).all()):
        raise ValueError("clip_ratio must be positive and finite")
    return r


def quantize_asymmetric(w: torch.Tensor, group_size: int, clip_ratio: torch.Tensor | None = None
                        ) -> AsymmetricWeight:
    """§3.8 of w [N, K]; clip_ratio [N] (per row) or [N, G] (per row and group) shrinks the ranges."""
    w = _check_matrix(w)
    n, k = w.shape
    g = _group_size(k, group_size)
    r = _group_ratios(clip_ratio, n, k // g, w.device)[:, :, None]  # [N, G, 1]
    wg = w.view(n, k // g, g)
    v_max = (wg.amax(dim=2, keepdim=True) * r).clamp_min(0)  # [N, G, 1]
    v_min = (wg.amin(dim=2, keepdim=True) * r).clamp_max(0)
    scales = _to_fp16_scale((v_max - v_min) / 15, "W4A16 group scale")  # [N, G, 1]
    zeros = torch.round(-v_min / scales.float()).clamp(0, 15)
    q = (torch.round(wg / scales.float()) + zeros).clamp(0, 15)
    return AsymmetricWeight(q.view(n, k).to(torch.uint8), scales[..., 0], zeros[..., 0].to(torch.uint8), group_size)
