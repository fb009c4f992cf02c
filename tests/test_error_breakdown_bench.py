"""bench/error_breakdown.py's float twin of a recipe (its exact passes, 16-bit weights, transforms chosen
for the recipe's format through [transform_format]) and the recipe schema's checks of that table."""

import json

import pytest
import torch
from checkpoints import make_tiny_checkpoint

from bench.error_breakdown import needs_own_twin, twin_recipe
from bench.qoq_runs import shipped_recipe, write_recipe_toml
from qoq.recipe import RecipeError, load_recipe
from qoq.recipe_schema import Format

TRANSFORMS = ["rotation", "reorder", "smooth_attention", "smooth_down"]


@pytest.mark.parametrize("base, kept", [("w4a8kv4g64", TRANSFORMS), ("w4a8kv4g128", TRANSFORMS),
                                        ("w4a8kv4g64-rtn", []), ("w4a8kv4g128-rtn", [])])
def test_twin_keeps_the_exact_passes(base, kept, tmp_path):
    twin = twin_recipe(base)
    assert twin["passes"] == kept  # rtn, gptq and clip dropped, the order kept
    recipe = load_recipe(str(write_recipe_toml(twin, tmp_path / f"{base}-twin.toml")))
    shipped = load_recipe(base)
    assert recipe.format == Format(weight_bits=16, group_size=-1, act_bits=16, kv_bits=4, k_bias_outside_cache=True)
    # even RTN's twin (no passes) is its own artifact: the fp16 one caches K with its bias
    assert needs_own_twin(twin) and not needs_own_twin({**twin, "passes": [], "format": {"kv_bits": 4}})
    assert not recipe.quantizes_weights
    assert recipe.transform_format == shipped.format and recipe.for_passes().format == shipped.format
    assert recipe.calibration == shipped.calibration
    assert recipe.to_dict()["transform_format"]["group_size"] == shipped.format.group_size
    assert "transform_format" not in shipped.to_dict()  # other recipes' manifests are unchanged


def test_twin_runs_the_transforms_as_the_recipe_does(tmp_path, tiny_tokenizer, shared_data):
    """The twin of QoQ g64 reorders and searches its smoothing (as W4A8 g64 would), keeps the float
    function (its logits are the FP16 artifact's up to fp16 storage) and stores no quantized weight."""
    from qoq.executor import load_artifact_model
    from qoq.passes.pipeline import quantize_model

    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", tiny_tokenizer)
    raw = twin_recipe("w4a8kv4g64")
    raw["calibration"] = {**raw["calibration"], "samples": 4, "seq_len": 128}
    twin = quantize_model(str(ckpt), load_recipe(str(write_recipe_toml(raw, tmp_path / "twin.toml"))),
                          tmp_path / "twin", data_dir=shared_data, show_progress=False).output
    fp16 = quantize_model(str(ckpt), load_recipe("fp16"), tmp_path / "fp16", data_dir=shared_data,
                          show_progress=False).output
    manifest = json.loads((twin / "qoq.json").read_text())
    for block in manifest["passes"]["blocks"]:
        assert block["reorder"]["applied"] and block["reorder"]["moved_channels"] > 0
        assert block["smooth_down"]["searched"] and "mse_after" in block["smooth_down"]
    assert not [n for n in manifest["tensors"] if n.endswith(".qweight")]

    ids = torch.tensor(tiny_tokenizer("The tower is 324 metres tall, about the same height as")["input_ids"])[None]
    models = {name: load_artifact_model(art, quantize=frozenset())[0] for name, art in (("twin", twin), ("fp16", fp16))}
    with torch.inference_mode():
        logits = {name: m(ids) for name, m in models.items()}
    rel = ((logits["twin"] - logits["fp16"]).norm() / logits["fp16"].norm()).item()
    assert rel < 1e-2, rel


@pytest.mark.parametrize("change, message", [
    ({"format": {"weight_bits": 4, "group_size": 64, "act_bits": 8, "kv_bits": 4}, "passes": ["rtn"]},
     "is for W16 recipes"),
    ({"passes": ["rotation", "clip"]}, "passes ['clip'] change what a weight quantizer does"),
    ({"transform_format": {"weight_bits": 4, "group_size": 64, "act_bits": 16, "kv_bits": 16,
                           "weight_scheme": "asymmetric"}}, "must be a QoQ W4A8 format"),
    ({"transform_format": {"group_size": 96}}, "'transform_format.group_size' = 96"),
])
def test_transform_format_refusals(change, message, tmp_path):
    raw = {**twin_recipe("w4a8kv4g64"), **change}
    raw["pass_options"] = {}
    with pytest.raises(RecipeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_recipe(str(write_recipe_toml(raw, tmp_path / "bad.toml")))


def test_shipped_recipe_round_trips(tmp_path):
    """write_recipe_toml writes what tomllib read (accuracy.py's prefix recipes go through it too)."""
    raw = shipped_recipe("w4a8kv4g64")
    again = load_recipe(str(write_recipe_toml(raw, tmp_path / "w4a8kv4g64.toml")))
    assert again.to_dict() | {"name": "", "source": ""} == load_recipe("w4a8kv4g64").to_dict() | {"name": "", "source": ""}


def test_a_resumed_run_quantizes_only_what_a_missing_row_needs(tmp_path, monkeypatch):
    """Rows already in runs.jsonl are not measured again, and an artifact whose rows are all there is not
    quantized again (its files gone, as on a fresh machine): only RTN's twin, for its missing KV4 row."""
    import sys

    import bench.error_breakdown as eb

    recipe, windows = "w4a8kv4g128-rtn", 4
    labels = [label for label, which, q in eb.ROWS if not (which == "twin" and q == "none")]
    done = [{"key": "eval None FP16", "row": "FP16", "recipe": None, "ppl": 10.0, "command": "qoq eval", "commit": "a"}]
    done += [{"key": f"eval {recipe} {label}", "row": label, "recipe": recipe, "ppl": 11.0, "command": "qoq eval", "commit": "a"}
             for label in labels if label != "KV4 only"]
    work = tmp_path / "work"
    work.mkdir()
    (work / "runs.jsonl").write_text("".join(json.dumps({**r, "model": "m", "windows": windows}) + "\n" for r in done))
    calls = []

    def fake_qoq(*args):
        calls.append(args[0])
        if args[0] == "quantize":
            return {"seconds": 1.0, "block_rel_err_mean": 0.0, "calibration": {}}
        return {"recipe": recipe, "ppl": 12.0, "tokens": 8, "seconds": 1.0}

    monkeypatch.setattr(eb, "qoq", fake_qoq)
    monkeypatch.setattr(eb, "commit", lambda: "abc")
    out = tmp_path / "eb.json"
    monkeypatch.setattr(sys, "argv", ["error_breakdown.py", "--model", "m", "--recipes", recipe, "--windows",
                                      str(windows), "--workdir", str(work), "--out", str(out)])
    eb.main()
    assert calls == ["quantize", "eval"]  # RTN's own twin (KV4 with the k bias outside), then its KV4-only row
    result = json.loads(out.read_text())
    assert list(result["quantize_runs"]) == [f"{recipe}-twin"]
    assert {r["row"]: r["ppl"] for r in result["rows"] if r["recipe"] == recipe}["KV4 only"] == 12.0
