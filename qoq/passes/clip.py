"""Clipping: search a clip ratio per output channel of every block linear, minimizing the calibration
output error ‖X·Wᵀ − X·Ŵ(r)ᵀ‖² of that channel. Changes no float weight; the quantizing pass (rtn,
gptq) applies the ratios from ctx.clip_ratios. Per channel (§3.2) r scales vmax/vmin; progressive
groups (§3.1) r scales the level-0 range (s1 = fp16(r·max|W|/120)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qoq.models.llama import BLOCK_LINEARS
from qoq.passes.base import PASSES, BlockContext, Pass
from qoq.passes.capture import SHARED_INPUT, OutputError, capture_linear_inputs
from qoq.quant.formats import fake_quantize_for_format
from qoq.quant.weights import fake_quantize


def search_clip_ratios(weight: torch.Tensor, group_size: int, error: OutputError, ratios: torch.Tensor,
                       quantize=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best of `ratios` (starting at 1.0; earlier ratios win ties) per output channel of weight [N, K].
    A row's quantization depends on its own ratio only, so each ratio scores all N rows at once.
    `quantize(weight, clip_ratio [N])` -> the dequantized weight (default: QoQ's of group_size).
    Returns (ratio [N], error at ratios[0] [N], error at the chosen ratio [N])."""
    n, device = weight.shape[0], weight.device
    if quantize is None:
        quantize = lambda w, r: fake_quantize(w, group_size, clip_ratio=r)

    def error_at(r: float) -> torch.Tensor:  # [N]
        return error(weight - quantize(weight, torch.full((n,), r, device=device)))

    first = ratios[0].item()
    first_err = error_at(first)
    best_ratio, best_err = torch.full((n,), first, device=device), first_err
    for r in ratios[1:].tolist():
        err = error_at(r)
        better = err < best_err
        best_ratio = torch.where(better, r, best_ratio)
        best_err = torch.where(better, err, best_err)
    return best_ratio, first_err, best_err


@dataclass(frozen=True)
class ClipOptions:
    grid: int = 20  # ratios from 1.0 down to min_ratio, evenly spaced
    min_ratio: float = 0.5
    max_tokens: int = 16384  # every token of a 32 x 512 calibration set (a seeded subsample beyond)
    fixed_ratio: float = 0.0  # > 0: this ratio for every channel, no search (Atom's weight clip 0.85)


@PASSES.register("clip")
class Clip(Pass):
    name = "clip"
    needs_calibration = True
    exact = False  # float weights are untouched, but what the quantizer does changes
    Options = ClipOptions

    def __init__(self, options=None):
        super().__init__(options)
        o = self.options
        if o.grid < 1 or not 0 < o.min_ratio <= 1 or o.max_tokens < 1 or not 0 <= o.fixed_ratio <= 1:
            raise ValueError(f"clip options need grid >= 1, 0 < min_ratio <= 1, max_tokens >= 1, "
                             f"0 <= fixed_ratio <= 1; got {o}")

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        if not ctx.recipe.quantizes_weights:
            raise ValueError(f"the clip pass needs quantized weights; '{ctx.recipe.name}' keeps 16-bit weights")
        o, fmt = self.options, ctx.recipe.format
        ratios = torch.linspace(1.0, o.min_ratio, o.grid) if o.grid > 1 else torch.ones(1)
        inputs = capture_linear_inputs(block, ctx, o.max_tokens)
        errors = {owner: OutputError(x) for owner, x in inputs.items()}
        record = {}
        for name in BLOCK_LINEARS:
            weight = block.get_submodule(name).weight.detach().float()  # [N, K]
            error, order = errors[SHARED_INPUT[name]], ctx.input_orders.get(SHARED_INPUT[name])
            quantize = lambda w, r, order=order: fake_quantize_for_format(w, fmt, r, order)
            if o.fixed_ratio > 0:  # every channel takes it; the errors still say what it did
                ratio = torch.full((weight.shape[0],), o.fixed_ratio, device=weight.device)
                err_before, err_after = error(weight - quantize(weight, None)), error(weight - quantize(weight, ratio))
            else:
                ratio, err_before, err_after = search_clip_ratios(weight, fmt.group_size, error, ratios, quantize)
            ctx.clip_ratios[name] = ratio
            signal = error(weight).sum().clamp_min(1e-30)  # ‖X·Wᵀ‖²: the errors below are relative to it
            record[name] = {
                "ratio_mean": round(ratio.mean().item(), 6), "ratio_min": round(ratio.min().item(), 6),
                "clipped_fraction": round((ratio < 1).float().mean().item(), 6),
                "rel_err_before": (err_before.sum() / signal).sqrt().item(),
                "rel_err_after": (err_after.sum() / signal).sqrt().item(),
            }
        return record
