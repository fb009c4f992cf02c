"""Eval-time quantizer overrides (`qoq eval --quantize`): run an artifact with a chosen subset of its
quantizers, so an error breakdown (bench/error_breakdown.py) can say where the loss comes from.

Three quantizers, named as the CLI takes them:
  weights      the stored W4 codes. A property of the artifact: present in a W4 artifact, absent in a W16
               one, never switched on or off here (a float twin of a recipe is a W16 recipe's artifact).
  activations  per-token symmetric INT8 inputs of the block linears (§3.3), QoQ scheme only. Off on a W4A8
               artifact: the dequantized weight ŵ = s1·W8 (group) or s1·q - szero (per channel) times the
               float input. On over a W16A16 artifact: the input fake-quantized by the same quantizer,
               then the float linear.
  kv           per-token per-head asymmetric UINT4 K (post-RoPE) and V (§3.4), on or off over any artifact.

No override (None) leaves the executor's model untouched; asking for exactly the artifact's own set
changes nothing either, so either way the numbers are the plain eval's bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qoq.quant.activations import fake_quant_tokens
from qoq.quant.kv import fake_quant_kv
from qoq.quant.linear import IntegerLinear
from qoq.recipe_schema import Format

QUANTIZERS = ("weights", "activations", "kv")


class OverrideError(ValueError):
    """A --quantize value that is malformed or asks for what the artifact cannot run."""


def parse_quantize(text: str) -> frozenset[str]:
    """'weights,activations,kv' (any subset, comma-separated) or 'none' -> the set of names."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["none"]:
        return frozenset()
    if not names:
        raise OverrideError("--quantize is empty: give a comma-separated subset of weights,activations,kv, or none")
    unknown = [n for n in names if n not in QUANTIZERS]
    if unknown:
        raise OverrideError(f"--quantize: unknown quantizer '{unknown[0]}' (known: {', '.join(QUANTIZERS)}, or none)")
    return frozenset(names)


def format_quantizers(fmt: Format) -> frozenset[str]:
    """The quantizers an artifact of this format runs by default."""
    on = {"weights": fmt.weight_bits < 16, "activations": fmt.act_bits < 16, "kv": fmt.kv_bits < 16}
    return frozenset(name for name, is_on in on.items() if is_on)


def check_quantize(fmt: Format, wanted: frozenset[str], where: str = "the artifact") -> None:
    """Refuse, in one line, a set this artifact cannot run."""
    has = format_quantizers(fmt)
    if "weights" in wanted and "weights" not in has:
        raise OverrideError(f"--quantize weights: {where} has 16-bit weights (W{fmt.weight_bits}A{fmt.act_bits}); "
                            "weight quantization is chosen at quantize time, by a W4 recipe")
    if "weights" in has and "weights" not in wanted:
        raise OverrideError(f"--quantize without weights: {where} stores W{fmt.weight_bits} weights, which cannot be "
                            "switched off; quantize the recipe's W16 twin for float weights")
    if ("activations" in wanted) != ("activations" in has) and fmt.kind not in ("w4a8", "w16a16"):
        raise OverrideError(f"--quantize {'with' if 'activations' in wanted else 'without'} activations: "
                            f"{where} is {fmt.kind.upper()} ({fmt.weight_scheme}); activations are switched "
                            "on or off for the QoQ formats W4A8 and W16A16 only")


class DequantizedLinear(nn.Module):
    """A W4A8 linear with its activations left in float: x · ŵᵀ (+ bias), ŵ the weight the integer
    arithmetic of IntegerLinear represents, exact in fp32."""

    def __init__(self, integer: IntegerLinear):
        super().__init__()
        w = integer.weight.float() * integer.s1.float()[:, None]  # [N, K]
        if integer.szero is not None:
            w = w - integer.szero.float()[:, None]
        self.register_buffer("weight", w)
        self.register_buffer("bias", None if integer.bias is None else integer.bias.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight, self.bias).to(x.dtype)


class TokenQuantInput(nn.Module):
    """A float linear whose input is fake-quantized per token to INT8 first (W16 weights, A8)."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(fake_quant_tokens(x))


def apply_quantize(lm: nn.Module, fmt: Format, wanted: frozenset[str], linear_names: tuple[str, ...]) -> None:
    """Switch the model's activation and KV quantizers to `wanted` (checked by check_quantize first)."""
    check_quantize(fmt, wanted)
    has = format_quantizers(fmt)
    acts_on, acts_had = "activations" in wanted, "activations" in has
    for block in lm.model.layers:
        if acts_on != acts_had:
            for name in linear_names:
                linear = block.get_submodule(name)
                if acts_had and not isinstance(linear, IntegerLinear):
                    raise OverrideError(f"--quantize without activations: {name} is {type(linear).__name__}, "
                                        "not the reference backend's IntegerLinear")
                block.set_submodule(name, DequantizedLinear(linear).to(linear.weight.device) if acts_had
                                    else TokenQuantInput(linear))
        if ("kv" in wanted) != ("kv" in has):
            block.self_attn.kv_quant = fake_quant_kv if "kv" in wanted else None
