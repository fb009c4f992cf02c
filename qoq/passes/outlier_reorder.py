"""Atom's reorder and outlier channels (docs/design.md §3.7): for every distinct linear input of a block,
order its channels by ascending calibration max|X_j| (stable). The quantizers then group the columns in
this order (so a group holds channels of like magnitude) and keep the last `format.outlier_channels`
ordered channels, the largest, in INT8; the runtime gathers x[..., order] before quantizing (Atom fuses
that gather into the kernel ahead). Changes no float weight: the block computes the same function.
"""

from __future__ import annotations

import torch

from qoq.passes.base import PASSES, BlockContext, Pass
from qoq.passes.capture import SHARED_INPUT, input_abs_max
from qoq.passes.reorder import activation_order, permutation_sha256


def outlier_channels(x_max: torch.Tensor, count: int) -> torch.Tensor:
    """int64 [count]: the channels activation_order puts last, i.e. the `count` largest max|X_j|."""
    return activation_order(x_max)[x_max.numel() - count :]


@PASSES.register("outlier_reorder")
class OutlierReorder(Pass):
    name = "outlier_reorder"
    needs_calibration = True
    exact = True
    formats = ("w4a4",)

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        count = ctx.recipe.format.outlier_channels
        owners = sorted(set(SHARED_INPUT.values()))
        x_max = input_abs_max(block, ctx.inputs, ctx.position_ids, owners)  # {owner: [K]}, all tokens
        record = {"outlier_channels": count}
        for owner in owners:
            m = x_max[owner].cpu()
            if count >= m.numel():
                raise ValueError(f"{count} outlier channels leave none of {owner}'s {m.numel()} inputs at 4 bits")
            order = activation_order(m)
            ctx.input_orders[owner] = order
            ordered = m[order]
            record[owner] = {"sha256": permutation_sha256(order),
                             "largest_normal_abs_max": ordered[m.numel() - count - 1].item(),
                             "smallest_outlier_abs_max": ordered[m.numel() - count].item() if count else None,
                             "abs_max": ordered[-1].item()}
        return record
