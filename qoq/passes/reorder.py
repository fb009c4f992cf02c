"""Activation-aware channel reorder for group recipes (docs/design.md §3.6).

A weight group's 4-bit range is set by its largest column; outlier input channels of down_proj spread
over many groups coarsen all of them. Sorting down_proj's input channels by ascending calibration
max|X_j| puts the outliers together in the last groups. Permuting gate/up rows the same way permutes
X itself, so the block computes the same function (only the summation order changes).
"""

from __future__ import annotations

import hashlib

import torch

from qoq.passes.base import PASSES, BlockContext, Pass
from qoq.passes.capture import input_abs_max


def activation_order(x_max: torch.Tensor) -> torch.Tensor:
    """int64 [K]: channel indices by ascending max|X_j| (stable, so equal maxima keep their order)."""
    return torch.sort(x_max, stable=True).indices.to(torch.int64)


def permutation_sha256(perm: torch.Tensor) -> str:
    return hashlib.sha256(perm.to(torch.int64).cpu().contiguous().numpy().tobytes()).hexdigest()


def permute_ffn(mlp: torch.nn.Module, perm: torch.Tensor) -> None:
    """New channel j is old channel perm[j]: gate/up rows and down_proj columns."""
    with torch.no_grad():
        for linear in (mlp.gate_proj, mlp.up_proj):
            linear.weight.copy_(linear.weight[perm.to(linear.weight.device)])
        down = mlp.down_proj.weight
        down.copy_(down[:, perm.to(down.device)])


@PASSES.register("reorder")
class Reorder(Pass):
    name = "reorder"
    needs_calibration = True
    exact = True

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        fmt = ctx.recipe.format
        if fmt.group_size == -1:
            return {"applied": False, "skipped": "per-channel"}
        if not ctx.recipe.quantizes_weights:
            return {"applied": False, "skipped": "weights not quantized"}
        mlp = block.mlp
        if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
            raise ValueError("reorder expects bias-free gate_proj and up_proj")
        x_max = input_abs_max(block, ctx.inputs, ctx.position_ids, ["mlp.down_proj"])["mlp.down_proj"]  # [K]
        perm = activation_order(x_max.cpu())
        permute_ffn(mlp, perm)
        return {"applied": True, "group_size": fmt.group_size, "sha256": permutation_sha256(perm),
                "moved_channels": int((perm != torch.arange(len(perm))).sum())}
