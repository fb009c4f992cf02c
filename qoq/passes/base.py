"""What a pass sees: the model skeleton once, then one decoder block at a time with its calibration
inputs. Passes are instantiated once per run, so state shared across blocks (a rotation) lives on self."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from qoq.models.config import ModelConfig
from qoq.quant.asymmetric import AsymmetricWeight
from qoq.quant.symmetric import SymmetricWeight
from qoq.quant.weights import QuantizedWeight
from qoq.recipe_schema import Recipe
from qoq.registry import Registry

@dataclass
class ModelContext:
    config: ModelConfig
    recipe: Recipe
    seed: int


@dataclass
class BlockContext:
    index: int
    config: ModelConfig
    recipe: Recipe
    inputs: torch.Tensor  # [n, T, H] calibration hidden states entering this block
    position_ids: torch.Tensor  # [T]
    # per-channel clip ratios r[n] by linear name (set by a clipping pass, used by the quantizer)
    clip_ratios: dict[str, torch.Tensor] = field(default_factory=dict)
    # input channel order by shared-input owner (capture.SHARED_INPUT): set by `outlier_reorder`; the
    # quantizer groups the columns in this order and the runtime gathers x[..., order]
    input_orders: dict[str, torch.Tensor] = field(default_factory=dict)
    # filled by the quantizing pass: linear name -> integer weight (the pipeline swaps the modules)
    quantized: dict[str, QuantizedWeight | SymmetricWeight | AsymmetricWeight] = field(default_factory=dict)


@dataclass(frozen=True)
class NoOptions:
    pass


class Pass:
    """A step of a recipe. `prepare_model` runs once on the skeleton (embeddings, final norm, lm_head)
    before calibration inputs are captured; `apply` runs on each block. Both return manifest records."""

    name: str = ""
    quantizes: bool = False  # produces ctx.quantized (exactly one such pass per 4-bit recipe)
    needs_calibration: bool = False
    # exact passes keep the float function (rotation, smoothing, reorder): the block's reference output
    # is taken after them, so the reported error is the quantization error alone
    exact: bool = True
    Options: type = NoOptions  # a frozen dataclass; recipe table [pass_options.NAME] fills it
    formats: tuple[str, ...] = ()  # Format.kind values the pass works on (empty: any)

    def __init__(self, options=None):
        self.options = options if options is not None else self.Options()

    def prepare_model(self, lm: torch.nn.Module, ctx: ModelContext) -> dict:
        return {}

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        raise NotImplementedError


PASSES: Registry[type[Pass]] = Registry("pass")
