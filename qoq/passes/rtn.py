"""Round-to-nearest: quantize every block linear by the recipe's format, no calibration."""

from __future__ import annotations

import torch

from qoq.models.llama import BLOCK_LINEARS
from qoq.passes.base import PASSES, BlockContext, Pass
from qoq.quant.weights import quantize_weight


@PASSES.register("rtn")
class RoundToNearest(Pass):
    name = "rtn"
    quantizes = True

    exact = False

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        group = ctx.recipe.format.group_size
        for name in BLOCK_LINEARS:
            weight = block.get_submodule(name).weight.detach().float()  # [N, K]
            ctx.quantized[name] = quantize_weight(weight, group, clip_ratio=ctx.clip_ratios.get(name))
        return {"group_size": group}
