"""Passes: one file each, registered by name in PASSES; importing this package registers them all."""

from qoq.passes import clip, gptq, rotation, rtn  # noqa: F401  (registers)
from qoq.passes.base import BLOCK_LINEARS, PASSES, BlockContext, ModelContext, Pass

__all__ = ["BLOCK_LINEARS", "PASSES", "BlockContext", "ModelContext", "Pass"]
