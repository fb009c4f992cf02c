"""Round-to-nearest: quantize every block linear by the recipe's format (and the channel order a
reorder pass chose), no calibration."""

from __future__ import annotations

import torch

from qoq.models.llama import BLOCK_LINEARS
from qoq.passes.base import PASSES, BlockContext, Pass
from qoq.passes.capture import SHARED_INPUT
from qoq.quant.formats import quantize_for_format


@PASSES.register("rtn")
class RoundToNearest(Pass):
    name = "rtn"
    quantizes = True

    exact = False

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        fmt = ctx.recipe.format
        for name in BLOCK_LINEARS:
            weight = block.get_submodule(name).weight.detach().float()  # [N, K]
            ctx.quantized[name] = quantize_for_format(weight, fmt, ctx.clip_ratios.get(name),
                                                      ctx.input_orders.get(SHARED_INPUT[name]))
        return {"group_size": fmt.group_size}
