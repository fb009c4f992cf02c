"""Quantizer math (docs/design.md §3): W4 weights, A8 activations, KV4, and quantized linears."""

from qoq.quant.activations import fake_quant_tokens, quantize_tokens
from qoq.quant.kv import dequantize_kv, fake_quant_kv, quantize_kv
from qoq.quant.linear import IntegerLinear, export_linear
from qoq.quant.weights import (
    QuantizedWeight,
    quantize_per_channel,
    quantize_progressive,
    quantize_weight,
)

__all__ = [
    "IntegerLinear",
    "QuantizedWeight",
    "dequantize_kv",
    "export_linear",
    "fake_quant_kv",
    "fake_quant_tokens",
    "quantize_kv",
    "quantize_per_channel",
    "quantize_progressive",
    "quantize_tokens",
    "quantize_weight",
]
