"""Output smoothing of the FFN (QServe's SmoothLinear on down_proj, docs/design.md §3.6).

down_proj's input X = SiLU(gate)·up has outlier channels that ruin per-token INT8. Dividing up_proj's
row j by λ_j divides X_j by λ_j (the product is linear in up's output), and multiplying W_down[:, j] by
λ_j restores the output: exact in float. λ_j = max|X_j|^α / max|W_down[:, j]|^β, with (α, β) from the
recipe or searched on the calibration output MSE of the W4A8 down_proj.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qoq.passes.base import PASSES, BlockContext, Pass
from qoq.passes.capture import capture_inputs, input_abs_max
from qoq.quant.linear import IntegerLinear
from qoq.quant.weights import quantize_weight

FLOOR = 1e-5  # channels that never fire (or all-zero weight columns) keep a finite λ


@dataclass(frozen=True)
class SmoothDownOptions:
    alpha: float = 0.5
    beta: float = 0.5
    search: bool = True  # grid-search (α, β) instead of using the values above
    grid_step: float = 0.2  # α, β ∈ {0, step, 2·step, ... < 1}: 25 points at 0.2
    max_tokens: int = 512  # calibration tokens the search evaluates (a seeded subsample)

    def __post_init__(self):
        for key in ("alpha", "beta"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"smooth_down {key} must lie in [0, 1], got {getattr(self, key)}")
        if not 0.0 < self.grid_step <= 1.0:
            raise ValueError(f"smooth_down grid_step must lie in (0, 1], got {self.grid_step}")
        if self.max_tokens <= 0:
            raise ValueError(f"smooth_down max_tokens must be positive, got {self.max_tokens}")

    def grid(self) -> list[tuple[float, float]]:
        values = [round(i * self.grid_step, 6) for i in range(round(1 / self.grid_step))]
        return [(a, b) for a in values for b in values]


def smoothing_scales(x_max: torch.Tensor, w_max: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """λ [K] = x_max^α / w_max^β, divided by sqrt(max λ · min λ): a global factor changes neither the
    float function nor the per-token / per-row quantizers, and centring λ keeps both weights in fp16 range."""
    lam = x_max.clamp_min(FLOOR).pow(alpha) / w_max.clamp_min(FLOOR).pow(beta)
    return lam / (lam.max() * lam.min()).sqrt()


def quantized_mse(x: torch.Tensor, weight: torch.Tensor, lam: torch.Tensor, group_size: int) -> float:
    """MSE of the W4A8 linear (x / λ) · (W·diag λ)ᵀ against the float x·Wᵀ; x [M, K], W [N, K]."""
    reference = x @ weight.t()  # [M, N]
    qw = quantize_weight(weight * lam[None, :], group_size)
    out = IntegerLinear.from_quantized(qw)(x / lam[None, :])  # §3.1 / §3.2 integer arithmetic
    return (out - reference).pow(2).mean().item()


def search_scales(x: torch.Tensor, x_max: torch.Tensor, weight: torch.Tensor, grid, group_size: int
                  ) -> tuple[float, float, dict]:
    """The (α, β) of `grid` with the least quantized MSE on the tokens x [M, K] (first one on ties), and
    every point's MSE; x_max [K] is the calibration max|X_j| that λ is built from."""
    w_max = weight.abs().amax(dim=0)  # [K]
    table = {(a, b): quantized_mse(x, weight, smoothing_scales(x_max, w_max, a, b), group_size) for a, b in grid}
    alpha, beta = min(table, key=table.get)  # min keeps the first of equal values: grid order decides ties
    return alpha, beta, table


def fold_scales(mlp: torch.nn.Module, lam: torch.Tensor) -> None:
    """W_down[:, j] × λ_j, W_up[j, :] ÷ λ_j."""
    with torch.no_grad():
        down, up = mlp.down_proj.weight, mlp.up_proj.weight
        down.mul_(lam.to(down)[None, :])
        up.div_(lam.to(up)[:, None])


@PASSES.register("smooth_down")
class SmoothDown(Pass):
    name = "smooth_down"
    needs_calibration = True
    exact = True
    Options = SmoothDownOptions
    formats = ("w4a8", "w16a16")  # its search scores QoQ's W4A8 linear; smoothquant covers the others

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        opts, fmt = self.options, ctx.recipe.format
        mlp = block.mlp
        if mlp.up_proj.bias is not None or mlp.down_proj.bias is not None:
            raise ValueError("smooth_down expects bias-free up_proj and down_proj")
        names = ["mlp.down_proj"]
        # on the block's device: the search's 25 W4A8 linears are its cost
        x_max = input_abs_max(block, ctx.inputs, ctx.position_ids, names)["mlp.down_proj"]  # [K], all tokens
        x = capture_inputs(block, ctx.inputs, ctx.position_ids, names, max_tokens=opts.max_tokens,
                           seed=ctx.recipe.calibration.seed)["mlp.down_proj"]  # [M, K] subsample
        weight = mlp.down_proj.weight.detach().float()  # [N, K]
        quantizes = ctx.recipe.quantizes_weights  # W4A8; W16A16 has no error to search on
        alpha, beta = opts.alpha, opts.beta
        if opts.search and quantizes:
            alpha, beta, _ = search_scales(x, x_max, weight, opts.grid(), fmt.group_size)
        lam = smoothing_scales(x_max, weight.abs().amax(dim=0), alpha, beta)  # [K]
        record = {"alpha": alpha, "beta": beta, "searched": opts.search and quantizes,
                  "lambda_min": lam.min().item(), "lambda_median": lam.median().item(), "lambda_max": lam.max().item()}
        if quantizes:
            record["mse_before"] = quantized_mse(x, weight, torch.ones_like(lam), fmt.group_size)
            record["mse_after"] = quantized_mse(x, weight, lam, fmt.group_size)
        fold_scales(mlp, lam)
        return record
