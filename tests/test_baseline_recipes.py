"""The baseline recipes (Atom, QuaRot, SmoothQuant, AWQ, GPTQ) end to end on a tiny random model: the
artifact's executor computes what the pipeline's in-memory model does, the artifact carries the format's
tensors and a server-safe quant_method, and impossible combinations are refused in one line."""

import dataclasses

import pytest
import torch
from checkpoints import make_tiny_checkpoint

from qoq.executor import load_artifact_model
from qoq.models.config import ModelConfig
from qoq.passes.awq import AWQOptions
from qoq.passes.clip import ClipOptions
from qoq.passes.pipeline import check_compatible, quantize_model
from qoq.recipe import Calibration, RecipeError, load_recipe

# recipe -> (the format's kind, tensors of a quantized linear beyond qweight)
BASELINES = {
    "atom-w4a4kv4g64": ("w4a4", {"w_scales", "qweight_outliers", "input_order"}),
    "quarot-w4a4kv4": ("w4a4", {"w_scales"}),
    "smoothquant-w8a8": ("w8a8", {"w_scales"}),
    "gptq-w4a16g128": ("w4a16", {"w_scales", "w_zeros"}),
    "awq-w4a16g64": ("w4a16", {"w_scales", "w_zeros"}),
}


def small(name: str):
    recipe = load_recipe(name)
    options = dict(recipe.pass_options)
    if "clip" in options and not options["clip"].fixed_ratio:
        options["clip"] = ClipOptions(grid=4)  # coarse searches keep the test fast
    if "awq" in options:
        options["awq"] = AWQOptions(grid=5, clip_grid=4)
    return dataclasses.replace(recipe, calibration=Calibration(samples=4, seq_len=128, seed=42),
                               pass_options=options)


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def tiny256(tmp_path_factory, tiny_tokenizer):
    """hidden 256: Atom's 128 outlier channels leave two groups of 64 at INT4."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny256"), tiny_tokenizer, hidden=256, intermediate=512)


@pytest.mark.parametrize("recipe", list(BASELINES))
def test_baseline_quantizes_and_executes(tmp_path, tiny256, shared_data, recipe):
    from qoq.models.loader import load_model

    kind, parts = BASELINES[recipe]
    result = quantize_model(str(tiny256), small(recipe), tmp_path / "art", data_dir=shared_data,
                            keep_model=True, show_progress=False)
    executed, art = load_artifact_model(tmp_path / "art")
    ids = torch.randint(0, 300, (2, 48), generator=torch.Generator().manual_seed(1))
    float_lm, _ = load_model(tiny256)
    with torch.inference_mode():
        fake, real, ref = result.model(ids), executed(ids), float_lm(ids)
    assert _rel(real, fake) < 1e-5
    assert (1e-4 if kind == "w8a8" else 1e-3) < _rel(real, ref) < 0.5  # quantized: moved, but not far
    rotated = executed.model.layers[1].mlp.down_input_transform is not None
    assert rotated == load_recipe(recipe).format.online_hadamard  # QuaRot's online Hadamard, applied by the executor
    q = "model.layers.1.mlp.down_proj"
    assert {n.removeprefix(q + ".") for n in art.tensors if n.startswith(q + ".")} == {"qweight"} | parts
    from qoq.eval.runner import evaluate_task

    ppl = evaluate_task("wikitext2", str(tmp_path / "art"), windows=1, seq_len=128, data_dir=shared_data,
                        show_progress=False)  # `qoq eval` on the artifact: a finite perplexity
    assert ppl["artifact"] and ppl["recipe"] == recipe and 1 < ppl["ppl"] < 1e6
    method = art.config["quantization_config"]["quant_method"]
    assert method.startswith(f"qoq-{kind}-") and load_recipe(recipe).format.kind == kind


def test_atom_keeps_the_largest_calibration_channels_int8(tmp_path, tiny256, shared_data):
    """The outlier group of every linear is the 128 input channels with the largest calibration max|x|
    (the pass's record says so; the executor gathers exactly those channels into its INT8 group)."""
    result = quantize_model(str(tiny256), small("atom-w4a4kv4g64"), tmp_path / "a", data_dir=shared_data,
                            keep_model=True, show_progress=False)
    executed, art = load_artifact_model(tmp_path / "a")
    record = art.manifest["passes"]["blocks"][0]["outlier_reorder"]
    for owner in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"):
        r = record[owner]
        assert r["smallest_outlier_abs_max"] >= r["largest_normal_abs_max"]
    down = executed.model.layers[0].mlp.down_proj
    assert down.groups.outliers == 128 and down.groups.bounds[-1] == (384, 512)
    # the same order in the in-memory model and the artifact
    assert torch.equal(result.model.model.layers[0].mlp.down_proj.order, down.order)


def test_w4a4_has_no_gpu_path(tmp_path, tiny256, shared_data):
    from qoq.executor.build import _cuda_linear
    from qoq.export.artifact import ArtifactError

    fmt = load_recipe("quarot-w4a4kv4").format
    with pytest.raises(ArtifactError, match="W4A4 artifacts have no GPU path: Hopper has no INT4 tensor-core"):
        _cuda_linear({}, "x", fmt)


SMOLLM2 = ModelConfig.from_hf({
    "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192, "tie_word_embeddings": True})


def test_atom_g128_refuses_smollm2_and_points_to_g64():
    with pytest.raises(RecipeError, match=r"K - 128 outlier channels = 448 \(448 % 128 = 64\); use atom-w4a4kv4g64"):
        check_compatible(SMOLLM2, load_recipe("atom-w4a4kv4g128"))
    check_compatible(SMOLLM2, load_recipe("atom-w4a4kv4g64"))
    check_compatible(SMOLLM2, load_recipe("quarot-w4a4kv4"))


@pytest.mark.parametrize("recipe", ["atom-w4a4kv4g64", "awq-w4a16g64"])
def test_quantizing_twice_gives_identical_bytes(tmp_path, tiny256, shared_data, recipe):
    for run in ("a", "b"):
        quantize_model(str(tiny256), small(recipe), tmp_path / run, data_dir=shared_data, show_progress=False)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir()) and "model.safetensors" in files
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.parametrize("recipe", ["quarot-w4a4kv4", "smoothquant-w8a8"])
def test_qwen2_biases_survive_rotation_and_smoothing(tmp_path, tiny_tokenizer, shared_data, recipe):
    """q/k/v biases, perturbed norms, GQA and an untied head through QuaRot's rotation and SmoothQuant's
    scaling: the quantized model stays near the float one and the executor matches the pipeline."""
    from qoq.models.loader import load_model

    src = make_tiny_checkpoint(tmp_path / "qwen", tiny_tokenizer, arch="qwen2", hidden=128, intermediate=256,
                               heads=4, kv_heads=2, perturb=True)
    result = quantize_model(str(src), small(recipe), tmp_path / "art", data_dir=shared_data, keep_model=True,
                            show_progress=False)
    executed, _ = load_artifact_model(tmp_path / "art")
    float_lm, _ = load_model(src)
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        fake, real, ref = result.model(ids), executed(ids), float_lm(ids)
    assert _rel(real, fake) < 1e-5
    assert _rel(real, ref) < (0.05 if recipe == "smoothquant-w8a8" else 0.5)
