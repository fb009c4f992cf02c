"""inspect_artifact counts formats and bytes; render_inspect prints them."""

import torch
from rich.console import Console

from qoq.export.artifact import write_artifact
from qoq.export.inspect import inspect_artifact, render_inspect
from qoq.quant.linear import export_linear
from qoq.quant.weights import quantize_weight


def build(tmp_path):
    g = torch.Generator().manual_seed(0)

    def w() -> torch.Tensor:
        return torch.randn(64, 128, generator=g)

    tensors = {"model.embed_tokens.weight": torch.randn(16, 64).half()}
    for i, up_group in enumerate([128, -1]):
        tensors |= export_linear(f"model.layers.{i}.self_attn.q_proj", quantize_weight(w(), 64))
        bias = torch.randn(64).half() if i == 0 else None
        tensors |= export_linear(f"model.layers.{i}.mlp.up_proj", quantize_weight(w(), up_group), bias)
    tensors |= {"model.norm.weight": torch.ones(64).half(), "lm_head.weight": torch.randn(16, 64).half()}
    config = {"model_type": "llama", "num_hidden_layers": 2}
    return write_artifact(tmp_path / "art", tensors, config, {"recipe": {"name": "w4a8kv4g128"}})


def test_inspect_counts_formats_and_bytes(tmp_path):
    info = inspect_artifact(build(tmp_path))
    assert info["model_type"] == "llama" and info["layers"] == 2 and info["recipe"] == "w4a8kv4g128"
    assert info["formats"] == {"fp16": 3, "w4 g128": 1, "w4 g64": 2, "w4 per-channel": 1}
    assert info["quantized_linears"] == 4
    # 4 linears of 64x128 fp16, one bias of 64, embed and lm_head 16x64, norm 64
    assert info["fp16_bytes"] == 4 * 64 * 128 * 2 + 64 * 2 + 2 * 16 * 64 * 2 + 64 * 2
    assert info["bytes_on_disk"] == (tmp_path / "art" / "model.safetensors").stat().st_size
    assert info["compression_ratio"] == info["fp16_bytes"] / info["bytes_on_disk"]
    assert 1.0 < info["compression_ratio"] < 4.0


def test_render_inspect_prints_the_summary(tmp_path):
    console = Console(record=True, width=120)
    render_inspect(inspect_artifact(build(tmp_path)), console)
    text = console.export_text()
    for needle in ("llama (2 layers)", "w4a8kv4g128", "w4 g64", "w4 per-channel", "compression"):
        assert needle in text
