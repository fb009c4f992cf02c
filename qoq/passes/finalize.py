"""Turn a processed block into what the artifact holds: modules that compute exactly what the
runtime will (quantized linears, KV4, fp16-rounded float tensors) and the §4 tensors themselves."""

from __future__ import annotations

import torch

from qoq.models.config import ModelConfig
from qoq.models.llama import BLOCK_LINEARS, BLOCK_NORMS
from qoq.quant.formats import AnyWeight, export_weight, linear_from_weight, use_kv_format
from qoq.recipe_schema import Format


def round_to_storage(module: torch.nn.Module) -> None:
    """Round float parameters through fp16, the dtype the artifact stores them in."""
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point() and p.device.type != "meta":
                p.copy_(p.to(torch.float16))


def _fp16(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float16).contiguous()


def block_tensors(block: torch.nn.Module, quantized: dict[str, AnyWeight], prefix: str) -> dict:
    """Artifact tensors of one block (call before `swap_quantized`: biases come from the float linears)."""
    out = {f"{prefix}.{n}.weight": _fp16(block.get_submodule(n).weight) for n in BLOCK_NORMS}
    for name in BLOCK_LINEARS:
        linear = block.get_submodule(name)
        bias = None if linear.bias is None else _fp16(linear.bias)
        if name in quantized:
            out.update(export_weight(f"{prefix}.{name}", quantized[name], bias))
        else:
            out[f"{prefix}.{name}.weight"] = _fp16(linear.weight)
            if bias is not None:
                out[f"{prefix}.{name}.bias"] = bias
    return out


def model_tensors(lm: torch.nn.Module, cfg: ModelConfig) -> dict:
    """Embeddings, final norm and (when untied) lm_head, in fp16."""
    out = {"model.embed_tokens.weight": _fp16(lm.model.embed_tokens.weight),
           "model.norm.weight": _fp16(lm.model.norm.weight)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = _fp16(lm.lm_head.weight)
    return out


def swap_quantized(block: torch.nn.Module, quantized: dict[str, AnyWeight], fmt: Format) -> None:
    """Replace quantized linears by modules computing the runtime's integer arithmetic; enable KV4."""
    for name in quantized:
        linear = block.get_submodule(name)
        bias = None if linear.bias is None else linear.bias.detach().to(torch.float16).float()
        block.set_submodule(name, linear_from_weight(quantized[name], bias, fmt))
    use_kv_format(block.self_attn, fmt)
