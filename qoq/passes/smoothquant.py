"""SmoothQuant (Xiao et al. 2023) as a pass: migrate activation outliers into the weights before
per-token activation quantization. For each block input that can absorb a scale (q/k/v via
input_layernorm, gate/up via post_attention_layernorm, down via up_proj; input_scaling.py):
s_j = max|X_j|^α / max_readers |W_:,j|^(1-α) (normalized as smooth_down.smoothing_scales), α searched
on a grid by the calibration output MSE of the recipe's own quantized linears (weights and activations,
the runtime's arithmetic), or fixed by the recipe. o_proj is not smoothed (as in SmoothQuant).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qoq.passes.base import PASSES, BlockContext, Pass
from qoq.passes.capture import capture_inputs, input_abs_max
from qoq.passes.input_scaling import SCALABLE_INPUTS, fold_input_scales, reader_weights
from qoq.passes.smooth_down import smoothing_scales
from qoq.quant.formats import linear_from_weight, quantize_for_format


@dataclass(frozen=True)
class SmoothQuantOptions:
    alpha: float = 0.5  # used as is when search is off
    search: bool = True
    grid_step: float = 0.1  # α ∈ {0, step, ..., 1}
    max_tokens: int = 512  # calibration tokens the search scores (a seeded subsample)

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0 or not 0.0 < self.grid_step <= 1.0 or self.max_tokens <= 0:
            raise ValueError(f"smoothquant options need 0 <= alpha <= 1, 0 < grid_step <= 1, max_tokens > 0; got {self}")

    def grid(self) -> list[float]:
        return [round(i * self.grid_step, 6) for i in range(round(1 / self.grid_step) + 1)]


def smoothed_mse(x: torch.Tensor, weights: list[torch.Tensor], s: torch.Tensor, fmt) -> float:
    """Output MSE, summed over the readers, of the format's quantized linears on (x / s) with W·diag(s),
    against the float x·Wᵀ; x [M, K]."""
    xs = x / s[None, :]
    total = 0.0
    for w in weights:
        lin = linear_from_weight(quantize_for_format(w * s[None, :], fmt), None, fmt)
        total += (lin(xs) - x @ w.t()).pow(2).mean().item()
    return total


@PASSES.register("smoothquant")
class SmoothQuant(Pass):
    name = "smoothquant"
    needs_calibration = True
    exact = True
    Options = SmoothQuantOptions
    formats = ("w8a8", "w4a8", "w4a4")  # quantized activations: what smoothing is for

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        opts, fmt = self.options, ctx.recipe.format
        owners = list(SCALABLE_INPUTS)
        x_max = input_abs_max(block, ctx.inputs, ctx.position_ids, owners)  # [K] each, all tokens
        xs = capture_inputs(block, ctx.inputs, ctx.position_ids, owners, max_tokens=opts.max_tokens,
                            seed=ctx.recipe.calibration.seed + ctx.index)
        record = {}
        for owner in owners:
            weights = reader_weights(block, owner)
            w_max = torch.stack([w.abs().amax(dim=0) for w in weights]).amax(dim=0)  # [K]
            x_owner = x_max[owner]  # [K], on the block's device like w_max
            table = {a: smoothed_mse(xs[owner], weights, smoothing_scales(x_owner, w_max, a, 1 - a), fmt)
                     for a in (opts.grid() if opts.search else [opts.alpha])}
            alpha = min(table, key=table.get)  # the first of equal values
            s = smoothing_scales(x_owner, w_max, alpha, 1 - alpha)
            record[owner] = {"alpha": alpha, "searched": opts.search, "mse_after": table[alpha],
                             "mse_before": smoothed_mse(xs[owner], weights, torch.ones_like(s), fmt),
                             "scale_min": s.min().item(), "scale_max": s.max().item()}
            fold_input_scales(block, owner, s)
        return record
