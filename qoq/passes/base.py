"""What a pass sees: one decoder block, its calibration inputs, and the recipe."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from qoq.models.config import ModelConfig
from qoq.quant.weights import QuantizedWeight
from qoq.recipe import Recipe
from qoq.registry import Registry

# the quantized linears of a decoder block, by name relative to the block
BLOCK_LINEARS = (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
)


@dataclass
class BlockContext:
    index: int
    config: ModelConfig
    recipe: Recipe
    inputs: torch.Tensor  # [n, T, H] calibration hidden states entering this block
    # filled by the quantizing pass: linear name -> integer weight (the pipeline swaps the modules)
    quantized: dict[str, QuantizedWeight] = field(default_factory=dict)


class Pass:
    """A step of the recipe applied to one block. `apply` returns what the manifest records."""

    name: str = ""
    quantizes: bool = False  # produces ctx.quantized (exactly one such pass per 4-bit recipe)
    needs_calibration: bool = False

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        raise NotImplementedError


PASSES: Registry[type[Pass]] = Registry("pass")
