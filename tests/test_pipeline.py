"""The pipeline end to end on tiny random models: artifact written, executor == fake-quant model."""

import dataclasses
import json

import pytest
import torch

from checkpoints import make_tiny_checkpoint
from qoq.executor import load_artifact_model
from qoq.passes import PASSES
from qoq.passes.pipeline import quantize_model
from qoq.recipe import Calibration, load_recipe


def small(name: str):
    """A shipped recipe with a calibration set small enough for a unit test."""
    return dataclasses.replace(load_recipe(name), calibration=Calibration(samples=4, seq_len=128, seed=42))


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_tokenizer):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), tiny_tokenizer)


@pytest.mark.parametrize("recipe", ["fp16", "w4a8kv4g128-rtn", "w4a8kv4g64-rtn", "w4a8kv4-rtn",
                                    "w4a8kv4g128", "w4a8kv4g64", "w4a8kv4"])
def test_executor_equals_in_memory_model(tmp_path, tiny_dir, shared_data, recipe):
    result = quantize_model(str(tiny_dir), small(recipe), tmp_path / "art", data_dir=shared_data,
                            keep_model=True, show_progress=False)
    executed, art = load_artifact_model(tmp_path / "art")
    ids = torch.randint(0, 300, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        fake, real = result.model(ids), executed(ids)
    assert _rel(real, fake) < 1e-4
    names = set(art.tensors)
    if recipe == "fp16":
        assert "model.layers.0.mlp.down_proj.weight" in names and not any(n.endswith(".qweight") for n in names)
        assert result.summary["block_rel_err_max"] < 1e-2  # only fp16 rounding of the weights
    else:
        q = "model.layers.1.self_attn.q_proj"
        assert art.tensors[f"{q}.qweight"].shape == (128, 64) and art.tensors[f"{q}.qweight"].dtype == torch.int8
        per_group = not recipe.startswith("w4a8kv4-") and recipe != "w4a8kv4"
        assert (f"{q}.s2_scales" in names) == per_group and (f"{q}.s1_szeros" in names) != per_group
        assert art.config["quantization_config"]["group_size"] == load_recipe(recipe).format.group_size
        assert 1e-3 < result.summary["block_rel_err_max"] < 0.5  # quantization error: present, bounded


def test_quantized_model_is_close_to_float_on_real_text(tmp_path, tiny_dir, shared_data):
    """A random tiny model's logits move, but not far, under W4A8KV4 g64."""
    from qoq.models.loader import load_model

    float_lm, _ = load_model(tiny_dir)
    quantize_model(str(tiny_dir), small("w4a8kv4g64-rtn"), tmp_path / "a", data_dir=shared_data,
                   show_progress=False)
    lm, _ = load_artifact_model(tmp_path / "a")
    ids = torch.randint(0, 300, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        err = _rel(lm(ids), float_lm(ids))
    assert 1e-3 < err < 0.3


def test_same_seed_gives_byte_identical_artifacts(tmp_path, tiny_dir, shared_data):
    for run in ("a", "b"):
        quantize_model(str(tiny_dir), small("w4a8kv4g64"), tmp_path / run, data_dir=shared_data,
                       show_progress=False)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir()) and "qoq.json" in files
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_float_propagation_calibrates_every_block_on_float_activations(tmp_path, tiny_dir, shared_data):
    """With propagate = "float" block 1's statistics do not depend on how block 0 was quantized (RTN or
    GPTQ); with the default ("quantized") they do."""
    def key_max_of_block_1(quantizer: str, propagate: str) -> float:
        base = small("w4a8kv4g64")
        passes = ("rotation", "smooth_attention", quantizer)
        recipe = dataclasses.replace(base, passes=passes, pass_options={p: PASSES.get(p).Options() for p in passes},
                                     calibration=dataclasses.replace(base.calibration, propagate=propagate))
        out = tmp_path / f"{quantizer}-{propagate}"
        quantize_model(str(tiny_dir), recipe, out, data_dir=shared_data, show_progress=False)
        manifest = json.loads((out / "qoq.json").read_text())
        assert manifest["recipe"]["calibration"]["propagate"] == propagate
        return manifest["passes"]["blocks"][1]["smooth_attention"]["key_abs_max"]

    assert key_max_of_block_1("rtn", "float") == key_max_of_block_1("gptq", "float")
    assert key_max_of_block_1("rtn", "quantized") != key_max_of_block_1("gptq", "quantized")


def test_a_block_the_recipe_breaks_is_reported(tmp_path, tiny_tokenizer, shared_data):
    """Qwen2.5's failure mode under KV4, in small: a k_proj bias of ±150 in a few channels of block 0 leaves
    per-token UINT4 keys no resolution for the rest; the summary warns and names the block."""
    from checkpoints import set_qwen_like_k_bias

    outside = small("w4a8kv4g64-rtn")  # the shipped KV4 recipes keep k biases outside the cache
    assert outside.format.k_bias_outside_cache
    inside = dataclasses.replace(outside, format=dataclasses.replace(outside.format, k_bias_outside_cache=False))
    summaries = {}
    for name, big_bias, recipe in (("plain", False, inside), ("big", True, inside), ("big-outside", True, outside)):
        path = make_tiny_checkpoint(tmp_path / name, tiny_tokenizer, arch="qwen2", perturb=True)
        if big_bias:
            set_qwen_like_k_bias(path)
        summaries[name] = quantize_model(str(path), recipe, tmp_path / f"{name}-art", data_dir=shared_data,
                                         show_progress=False).summary
    assert summaries["plain"]["warnings"] == [] and summaries["plain"]["block_rel_err_max"] < 0.2
    warning, hint = summaries["big"]["warnings"]
    assert "1 of 2 blocks" in warning and "(block 0: " in warning and "qoq eval --quantize" in warning
    assert "k_bias_outside_cache = true" in hint
    # the k bias kept out of the cache: block 0 is as good as without the large bias
    assert summaries["big-outside"]["warnings"] == [] and summaries["big-outside"]["block_rel_err_max"] < 0.2
