"""Passes: one file each, registered by name in PASSES; importing this package registers them all."""

from qoq.passes import (  # noqa: F401
    awq,
    clip,
    gptq,
    outlier_reorder,
    reorder,
    rotation,
    rtn,
    smooth_attention,
    smooth_down,
    smoothquant,
)
from qoq.passes.base import PASSES, BlockContext, ModelContext, Pass

__all__ = ["PASSES", "BlockContext", "ModelContext", "Pass"]
