"""Bad input through the `qoq` command: exit 1, one line naming the problem, nothing half written."""

import json

import pytest
import torch
from typer.testing import CliRunner

from checkpoints import make_tiny_checkpoint
from qoq.cli import app

runner = CliRunner()


def qoq(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, *needles):
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_tokenizer):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), tiny_tokenizer)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, tiny_dir, shared_data):
    out = tmp_path_factory.mktemp("art") / "g64"
    result = qoq("quantize", "--model", tiny_dir, "--recipe", "w4a8kv4g64", "--output", out,
                 "--data-dir", shared_data, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["layers"] == 2
    return out


def test_unknown_recipe_key(tmp_path, tiny_dir):
    bad = tmp_path / "bad.toml"
    bad.write_text('passes = ["rtn"]\n[format]\nwbits = 4\n')
    out = tmp_path / "out"
    assert_one_line_error(qoq("quantize", "--model", tiny_dir, "--recipe", bad, "--output", out),
                          "unknown key 'format.wbits'", str(bad))
    assert not out.exists()


def test_missing_model_path(tmp_path):
    out = tmp_path / "out"
    assert_one_line_error(qoq("quantize", "--model", tmp_path / "nope", "--output", out), "nope")
    assert not out.exists()


def test_group_not_dividing_k(tmp_path, tiny_tokenizer):
    model = make_tiny_checkpoint(tmp_path / "m", tiny_tokenizer, hidden=192, heads=6, kv_heads=2, intermediate=384)
    out = tmp_path / "out"
    assert_one_line_error(qoq("quantize", "--model", model, "--recipe", "w4a8kv4g128", "--output", out),
                          "K = 192", "w4a8kv4g64")
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_inspect_reports_formats(artifact):
    result = qoq("inspect", artifact, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["compression_ratio"] > 1.5


def _copy(artifact, tmp_path):
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(artifact, dst)
    return dst


def test_truncated_safetensors(artifact, tmp_path):
    art = _copy(artifact, tmp_path)
    shard = art / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    assert_one_line_error(qoq("inspect", art), "model.safetensors")


def test_flipped_byte_names_the_tensor(artifact, tmp_path):
    art = _copy(artifact, tmp_path)
    manifest = json.loads((art / "qoq.json").read_text())
    shard = art / "model.safetensors"
    data = bytearray(shard.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    name = "model.layers.1.mlp.down_proj.qweight"
    start, _ = json.loads(data[8:header])[name]["data_offsets"]
    data[header + start + 5] ^= 0x10
    shard.write_bytes(bytes(data))
    assert manifest["tensors"][name]["sha256"]
    assert_one_line_error(qoq("eval", "wikitext2", art, "--windows", "1"), name, "checksum")


def test_unknown_format_version(artifact, tmp_path):
    art = _copy(artifact, tmp_path)
    manifest = json.loads((art / "qoq.json").read_text())
    manifest["format_version"] = 99
    (art / "qoq.json").write_text(json.dumps(manifest))
    assert_one_line_error(qoq("inspect", art), "format version 99")


def test_recipes_list_and_show():
    listed = qoq("recipes", "--json")
    assert listed.exit_code == 0 and "w4a8kv4g128" in json.loads(listed.stdout)
    shown = qoq("recipes", "show", "w4a8kv4g64", "--json")
    assert json.loads(shown.stdout)["format"]["group_size"] == 64
    assert_one_line_error(qoq("recipes", "show", "nope"), "unknown recipe 'nope'")


def test_eval_wikitext2_on_artifact_and_on_float_model(artifact, tiny_dir, shared_data):
    results = {}
    for target in (artifact, tiny_dir):
        result = qoq("eval", "wikitext2", target, "--windows", "1", "--data-dir", shared_data, "--json")
        assert result.exit_code == 0, result.output
        results[target] = json.loads(result.stdout)
    quantized, float_model = results[artifact], results[tiny_dir]
    assert quantized["artifact"] and quantized["recipe"] == "w4a8kv4g64"
    assert not float_model["artifact"] and float_model["backend"] == "float32"
    for r in (quantized, float_model):
        assert r["windows"] == 1 and r["tokens"] == 2048 and r["total_windows"] > 100
    # a random tiny model is near-uniform over its ~400-token vocabulary; W4A8KV4 moves it a little
    assert 100 < float_model["ppl"] < 1000 and abs(quantized["ppl"] / float_model["ppl"] - 1) < 0.2


def test_eval_refuses_more_windows_than_the_split_has(artifact, shared_data):
    result = qoq("eval", "wikitext2", artifact, "--windows", 10**6, "--data-dir", shared_data)
    assert_one_line_error(result, "windows must be in [1, ", "got 1000000")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_device_cuda_without_gpu(tmp_path, tiny_dir):
    out = tmp_path / "out"
    assert_one_line_error(qoq("quantize", "--model", tiny_dir, "--output", out, "--device", "cuda"),
                          "device cuda", "CUDA")
    assert not out.exists()


def test_device_not_a_device(tmp_path, tiny_dir):
    out = tmp_path / "out"
    assert_one_line_error(qoq("quantize", "--model", tiny_dir, "--output", out, "--device", "gpu0"),
                          "device 'gpu0'", "cpu, cuda, cuda:N")
    assert not out.exists()


def test_eval_device_cpu_is_the_default_and_bad_devices_fail_first(artifact, shared_data):
    common = ("eval", "wikitext2", artifact, "--windows", "1", "--seq-len", "128", "--data-dir", shared_data,
              "--json")
    default, on_cpu = (json.loads(qoq(*common, *extra).stdout) for extra in ((), ("--device", "cpu")))
    assert on_cpu["device"] == default["device"] == "cpu" and on_cpu["ppl"] == default["ppl"]
    assert_one_line_error(qoq(*common, "--device", "gpu0"), "device 'gpu0'", "cpu, cuda, cuda:N")
    assert_one_line_error(qoq(*common, "--backend", "cuda", "--device", "cpu"),
                          "--device applies to --backend reference")


@pytest.mark.cuda
def test_eval_reference_backend_on_a_gpu_matches_the_cpu(artifact, tiny_dir, shared_data):
    """The reference backend's integer-exact linears and the float model on a GPU: the CPU's perplexity up
    to fp32 rounding of the float parts."""
    for target in (artifact, tiny_dir):
        common = ("eval", "wikitext2", target, "--windows", "1", "--seq-len", "256", "--data-dir", shared_data,
                  "--json")
        cpu, gpu = (json.loads(qoq(*common, "--device", d).stdout) for d in ("cpu", "cuda"))
        assert gpu["device"] == "cuda:0" and abs(gpu["ppl"] / cpu["ppl"] - 1) < 2e-3, (cpu["ppl"], gpu["ppl"])
