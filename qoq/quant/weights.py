"""4-bit weight quantizers: progressive group (docs/design.md §3.1) and per channel (§3.2).

All math in float32, scales stored as fp16, rounding half-to-even (torch.round). W is [N, K].
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

# level-0 range: the largest P for which W8 = q*s2 - z stays inside int8 for every group and any U in
# [-P, P] (W8 in [-120, 127], q*s2 <= 240); 121 reaches W8 = 128. The QServe paper's 119 leaves one
# level unused; deepcompressor derives 120 by the same search (docs/design.md §3.1).
PROTECTIVE_RANGE = 120


@dataclass
class QuantizedWeight:
    q: torch.Tensor  # uint8 [N, K], codes 0..15
    s1: torch.Tensor  # fp16 [N]: level-0 scale (group) or the per-channel scale s
    group_size: int  # -1 = per channel
    s2: torch.Tensor | None = None  # int16 [N, K/g], level-1 integer scale
    z: torch.Tensor | None = None  # int16 [N, K/g], integer zero of §3.1 (artifact stores -z)
    szero: torch.Tensor | None = None  # fp16 [N], per-channel scaled zero z of §3.2

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def w8(self) -> torch.Tensor:
        """The integer weight seen by the INT8 MMA: q*s2 - z, int16 [N, K] (group only)."""
        if self.group_size == -1:
            raise ValueError("w8() is defined for progressive group weights, not per channel")
        n, k = self.q.shape
        qg = self.q.view(n, k // self.group_size, self.group_size).to(torch.int16)  # [N, G, g]
        return (qg * self.s2[:, :, None] - self.z[:, :, None]).view(n, k)

    def with_codes(self, q: torch.Tensor) -> "QuantizedWeight":
        """The same scales with other codes q uint8 [N, K] (e.g. GPTQ's), checked like a fresh one."""
        if q.shape != self.q.shape or q.dtype != torch.uint8 or int(q.max()) > 15:
            raise ValueError(f"codes must be uint8 {tuple(self.q.shape)} in 0..15, got {q.dtype} {tuple(q.shape)}")
        qw = replace(self, q=q)
        if qw.group_size != -1:
            _check_int8_safety(qw)
        return qw

    def round_onto(self, w: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """round_onto_grid(w, self, columns): the grid interface GPTQ rounds through."""
        return round_onto_grid(w, self, columns)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Float weight [N, K]: s1*W8 (group) or q*s - z (per channel), computed in fp32."""
        if self.group_size == -1:
            w = self.q.float() * self.s1.float()[:, None] - self.szero.float()[:, None]
        else:
            w = self.s1.float()[:, None] * self.w8().float()
        return w.to(dtype)


def _check_matrix(w: torch.Tensor) -> torch.Tensor:
    if w.dim() != 2:
        raise ValueError(f"expected a weight matrix [N, K], got shape {tuple(w.shape)}")
    w = w.float()
    if not torch.isfinite(w).all():
        raise ValueError("weight contains NaN or inf")
    return w


def _to_fp16_scale(x: torch.Tensor, what: str) -> torch.Tensor:
    """fp16(x), with 0 (also from fp16 underflow) -> 1 so nothing divides by zero."""
    x16 = x.half()
    if not torch.isfinite(x16).all():
        raise ValueError(f"{what} overflows fp16 (max {x.abs().max().item():.4g})")
    return torch.where(x16 == 0, torch.ones_like(x16), x16)


def _clip_ratios(clip_ratio: torch.Tensor | None, n: int, device) -> torch.Tensor:
    """Per output channel clip ratio r [N] fp32 (ones without clipping), checked."""
    if clip_ratio is None:
        return torch.ones(n, device=device)
    r = clip_ratio.float().reshape(-1).to(device)
    if r.shape[0] != n:
        raise ValueError(f"clip_ratio has {r.shape[0]} entries, the weight has N={n} rows")
    if not (torch.isfinite(r).all() and (r > 0).all()):
        raise ValueError("clip_ratio must be positive and finite")
    return r


def _progressive_codes(w: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """§3.1 codes of w [N, C] given s1 [N] and the per-column s2, z [N, C] (fp32). Because U is
    clamped to +-120 and s2 <= 16, W8 = q*s2 - z stays in [-120, 127] for any w, on or off the grid."""
    u = (w / s1.float()[:, None]).clamp(-PROTECTIVE_RANGE, PROTECTIVE_RANGE)
    return torch.round((u + z) / s2).clamp(0, 15)


def _per_channel_codes(w: torch.Tensor, s: torch.Tensor, szero: torch.Tensor) -> torch.Tensor:
    """§3.2 codes of w [N, C] given s, szero [N]."""
    return torch.round((w + szero.float()[:, None]) / s.float()[:, None]).clamp(0, 15)


def _progressive_grid(w: torch.Tensor, group_size: int, clip_ratio: torch.Tensor | None):
    """§3.1 on a checked fp32 w [N, K] -> s1 fp16 [N], s2 and z fp32 [N, G], codes fp32 [N, G, g]."""
    n, k = w.shape
    if group_size <= 0 or k % group_size:
        raise ValueError(f"K={k} is not divisible by the group size {group_size}")
    r = _clip_ratios(clip_ratio, n, w.device)
    s1 = _to_fp16_scale(r * w.abs().amax(dim=1) / PROTECTIVE_RANGE, "level-0 scale s1")  # [N]
    u = (w / s1.float()[:, None]).clamp_(-PROTECTIVE_RANGE, PROTECTIVE_RANGE)  # [N, K], not rounded
    ug = u.view(n, k // group_size, group_size)  # [N, G, g]
    u_max, u_min = ug.amax(dim=2), ug.amin(dim=2)  # [N, G]
    s2 = torch.round((u_max - u_min) / 15).clamp(1, 127)
    z = torch.round(-u_min).clamp(-128, 127)
    q = ug.add_(z[:, :, None]).div_(s2[:, :, None]).round_().clamp_(0, 15)  # = _progressive_codes, in place
    return s1, s2, z, q


def quantize_progressive(w: torch.Tensor, group_size: int, clip_ratio: torch.Tensor | None = None) -> QuantizedWeight:
    """§3.1: per-channel symmetric level 0 (range 120), then per-group UINT4 with integer s2, z.
    A clip ratio r [N] shrinks the level-0 range: s1 = fp16(r*max|W|/120), so |W| > r*max clamps."""
    w = _check_matrix(w)
    s1, s2, z, q = _progressive_grid(w, group_size, clip_ratio)
    qw = QuantizedWeight(q=q.view(w.shape).to(torch.uint8), s1=s1, group_size=group_size,
                         s2=s2.to(torch.int16), z=z.to(torch.int16))
    _check_int8_safety(qw)
    return qw


def fake_quantize(w: torch.Tensor, group_size: int, clip_ratio: torch.Tensor | None = None) -> torch.Tensor:
    """quantize_weight(w, ...).dequantize() [N, K] fp32 without building the codes (for searches that
    score many candidate grids); equal to it element for element."""
    if group_size == -1:
        return quantize_per_channel(w, clip_ratio).dequantize()
    w = _check_matrix(w)
    s1, s2, z, q = _progressive_grid(w, group_size, clip_ratio)
    w8 = q.mul_(s2[:, :, None]).sub_(z[:, :, None])  # [N, G, g], exact integers
    return w8.mul_(s1.float()[:, None, None]).view(w.shape)


def _check_int8_safety(qw: QuantizedWeight) -> None:
    """W8 must fit the INT8 MMA and q*s2 the byte-wise multiply (§3.1 step 3). s2 >= 1, so each
    group's extremes of q*s2 - z sit at its extreme codes: checked per group, not per element."""
    qg = qw.q.view(*qw.s2.shape, qw.group_size)  # [N, G, g]
    q_max, q_min = qg.amax(dim=2).to(torch.int16), qg.amin(dim=2).to(torch.int16)  # [N, G]
    if int(qw.s2.min()) < 1:
        raise ValueError(f"s2 = {int(qw.s2.min())} is below 1")
    w8_min, w8_max = int((q_min * qw.s2 - qw.z).min()), int((q_max * qw.s2 - qw.z).max())
    if w8_min < -128 or w8_max > 127:
        raise ValueError(f"W8 out of int8 range: [{w8_min}, {w8_max}]")
    qs2_max = int((q_max * qw.s2).max())
    if qs2_max > 255:
        raise ValueError(f"q*s2 = {qs2_max} exceeds 255")


def quantize_per_channel(w: torch.Tensor, clip_ratio: torch.Tensor | None = None) -> QuantizedWeight:
    """§3.2: asymmetric UINT4 per output channel with a scaled fp16 zero; optional clip ratio [N]."""
    w = _check_matrix(w)
    r = _clip_ratios(clip_ratio, w.shape[0], w.device)
    clipped = w * r[:, None]  # [N, K]
    v_max, v_min = clipped.amax(dim=1), clipped.amin(dim=1)  # [N]
    s = _to_fp16_scale((v_max - v_min) / 15, "per-channel scale")
    szero = (-v_min).half()
    if not torch.isfinite(szero).all():
        raise ValueError("per-channel zero overflows fp16")
    q = _per_channel_codes(w, s, szero)
    return QuantizedWeight(q=q.to(torch.uint8), s1=s, group_size=-1, szero=szero)


def quantize_weight(
    w: torch.Tensor, group_size: int, clip_ratio: torch.Tensor | None = None
) -> QuantizedWeight:
    """Dispatch on group_size: -1 = per channel (§3.2), else progressive groups (§3.1)."""
    if group_size == -1:
        return quantize_per_channel(w, clip_ratio)
    return quantize_progressive(w, group_size, clip_ratio)


def round_onto_grid(w: torch.Tensor, grid: QuantizedWeight, columns: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize w [N, C] onto the FIXED scales of `grid` (s1, s2, z or s, szero), as the columns
    `columns` [C] of the grid's [N, K] weight (all K when None). Returns codes uint8 [N, C] and the
    dequantized values fp32 [N, C]; on the grid's own weight the codes equal the grid's (GPTQ's rounding)."""
    w = w.float()
    n, k = grid.shape
    columns = torch.arange(k, device=w.device) if columns is None else columns
    if w.dim() != 2 or w.shape != (n, columns.numel()):
        raise ValueError(f"w has shape {tuple(w.shape)}, expected [{n}, {columns.numel()}] for the grid's columns")
    if grid.group_size == -1:
        q = _per_channel_codes(w, grid.s1, grid.szero)
        return q.to(torch.uint8), q * grid.s1.float()[:, None] - grid.szero.float()[:, None]
    groups = columns // grid.group_size  # [C]
    s2, z = grid.s2[:, groups].float(), grid.z[:, groups].float()  # [N, C]
    q = _progressive_codes(w, grid.s1, s2, z)
    return q.to(torch.uint8), grid.s1.float()[:, None] * (q * s2 - z)
