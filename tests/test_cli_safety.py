"""`qoq` under bad inputs and faults: nothing of the user's is deleted, nothing unverified is used,
every failure is one line, found before the long work, and temp dirs never outlive a stopped run."""

import json
import os
import shutil
import signal
import sys
import types

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from checkpoints import make_tiny_checkpoint
from qoq.cli import app

runner = CliRunner()
FAST = 'description = "test"\npasses = ["rtn"]\n[format]\ngroup_size = 64\n[calibration]\nsamples = 2\nseq_len = 64\n'


def qoq(*args, **kw):
    return runner.invoke(app, [str(a) for a in args], **kw)


def one_line_error(result, *needles, code=1):
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_tokenizer):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", tiny_tokenizer)


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    path = tmp_path_factory.mktemp("recipe") / "fast.toml"
    path.write_text(FAST)
    return path


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, tiny_dir, fast, shared_data):
    out = tmp_path_factory.mktemp("art") / "rtn"
    result = qoq("quantize", "--model", tiny_dir, "--recipe", fast, "--output", out, "--data-dir", shared_data)
    assert result.exit_code == 0, result.output
    return out


def quantize(model, fast, out, data, *extra):
    return qoq("quantize", "--model", model, "--recipe", fast, "--output", out, "--data-dir", data, *extra)


def no_calibration(monkeypatch):
    """Make any calibration (the start of the long work) fail the test."""
    def ran(*args, **kwargs):
        raise AssertionError("the long work started")

    monkeypatch.setattr("qoq.passes.pipeline.calibration_tokens", ran)


# 1. --overwrite replaces only an artifact or an empty directory, never the input model
def test_overwrite_keeps_user_files_and_the_input_model(tmp_path, tiny_dir, fast, shared_data, artifact):
    user = tmp_path / "user"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    one_line_error(quantize(tiny_dir, fast, user, shared_data, "--overwrite"), "not a qoq artifact")
    assert (user / "thesis.tex").read_text() == "years of work"
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    for out in (model, tmp_path):
        one_line_error(quantize(model, fast, out, shared_data, "--overwrite"), "input model")
    assert (model / "model.safetensors").is_file()
    again = shutil.copytree(artifact, tmp_path / "again")  # the README's first command, run twice
    assert quantize(tiny_dir, fast, again, shared_data, "--overwrite").exit_code == 0
    assert qoq("inspect", again).exit_code == 0


# 2. an artifact is verified or refused; non-finite perplexity is an error; JSON stays JSON
def test_artifact_without_manifest_is_refused(artifact, tmp_path, shared_data):
    art = shutil.copytree(artifact, tmp_path / "art")
    (art / "qoq.json").unlink()
    one_line_error(qoq("eval", "wikitext2", art, "--windows", 1, "--data-dir", shared_data), "qoq.json is missing")
    one_line_error(qoq("inspect", art), "qoq.json is missing")


def test_nan_perplexity_is_an_error(artifact, shared_data, monkeypatch):
    import qoq.eval.perplexity as perplexity

    monkeypatch.setattr(perplexity, "wikitext2_perplexity", lambda *a, **k: {"ppl": float("nan"), "windows": 1})
    result = qoq("eval", "wikitext2", artifact, "--windows", 1, "--data-dir", shared_data, "--json")
    one_line_error(result, "perplexity", "nan")
    assert "NaN" not in result.stdout


def test_inspect_refuses_an_artifact_missing_a_tensor_everywhere(artifact, tmp_path):
    art = shutil.copytree(artifact, tmp_path / "art")
    name = "model.layers.1.mlp.up_proj.s2_scales"
    tensors = load_file(art / "model.safetensors")
    del tensors[name]
    save_file(tensors, art / "model.safetensors", metadata={"format": "pt"})
    manifest = json.loads((art / "qoq.json").read_text())
    del manifest["tensors"][name]
    (art / "qoq.json").write_text(json.dumps(manifest))
    one_line_error(qoq("inspect", art), name, "lacks")


# 3. SIGTERM and SIGHUP clean up like SIGINT; the old artifact survives
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_signals_remove_temp_dirs_and_keep_the_old_artifact(artifact, tmp_path, tiny_dir, fast, shared_data,
                                                           monkeypatch, signum):
    import qoq.passes.pipeline as pipeline

    real = pipeline._quantize_blocks

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "_quantize_blocks", killed)
    fresh = tmp_path / "fresh"
    one_line_error(quantize(tiny_dir, fast, fresh, shared_data), "terminated", code=128 + signum)
    old = shutil.copytree(artifact, tmp_path / "old")
    one_line_error(quantize(tiny_dir, fast, old, shared_data, "--overwrite"), code=128 + signum)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
    assert qoq("inspect", old).exit_code == 0


def test_an_artifact_set_aside_by_a_killed_run_is_put_back(artifact, tmp_path, tiny_dir, fast, shared_data):
    shutil.copytree(artifact, tmp_path / ".out.old-k1ll3d")  # killed between the two renames
    result = quantize(tiny_dir, fast, tmp_path / "out", shared_data)
    assert f"note: restored {tmp_path / 'out'}" in result.stderr
    one_line_error(result, "already exists", "--overwrite")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and qoq("inspect", tmp_path / "out").exit_code == 0


# 4. no tracebacks: every error through the one-line wrapper; --debug shows the stack
def test_full_disk_while_writing_is_one_line(tmp_path, tiny_dir, fast, shared_data, monkeypatch):
    from safetensors import SafetensorError

    import qoq.export.artifact as artifact_mod

    def full(*args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, message: "No space left on device" })')

    monkeypatch.setattr(artifact_mod, "save_file", full)
    result = quantize(tiny_dir, fast, tmp_path / "out", shared_data)
    last = result.stderr.strip().splitlines()[-1]  # after the progress rows
    assert result.exit_code == 1 and last.startswith(f"error: cannot write {tmp_path / 'out'}: "), result.stderr
    assert "No space left on device" in last
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_backend_without_cuda(artifact, shared_data):
    one_line_error(qoq("eval", "wikitext2", artifact, "--backend", "cuda", "--data-dir", shared_data), "--backend cuda")


def test_huge_calibration_is_refused_before_it_runs_out_of_memory(tmp_path, tiny_dir, shared_data, monkeypatch):
    recipe = tmp_path / "huge.toml"
    recipe.write_text(FAST.replace("samples = 2", "samples = 100000000"))
    no_calibration(monkeypatch)
    one_line_error(quantize(tiny_dir, recipe, tmp_path / "out", shared_data), "calibration needs about", "samples")


def test_hub_failure_is_one_line(tiny_dir, monkeypatch):
    monkeypatch.delenv("QOQ_DATA_DIR", raising=False)
    fake = types.ModuleType("datasets")

    def load_dataset(*args, **kwargs):
        raise RuntimeError("Couldn't reach the hub\nsecond line")

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    one_line_error(qoq("eval", "wikitext2", tiny_dir, "--windows", 1), "Couldn't reach the hub")


def test_unexpected_errors_are_one_line_unless_debug(tiny_dir, monkeypatch):
    import qoq.eval.runner as runner_mod

    def broken(*args, **kwargs):
        raise AssertionError("a bug")

    monkeypatch.setattr(runner_mod, "check_backend", broken)
    one_line_error(qoq("eval", "wikitext2", tiny_dir), "internal error", "--debug")
    assert isinstance(qoq("--debug", "eval", "wikitext2", tiny_dir).exception, AssertionError)
    monkeypatch.setenv("QOQ_DEBUG", "1")
    assert isinstance(qoq("eval", "wikitext2", tiny_dir).exception, AssertionError)


# 5. a data dir that lacks the data fails at once, naming the path; never the hub
def test_wrong_data_dir_fails_at_once(tmp_path, tiny_dir, fast, artifact, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    no_calibration(monkeypatch)
    one_line_error(quantize(tiny_dir, fast, tmp_path / "out", tmp_path), str(tmp_path / "calib" / "groups_merged.txt"))
    monkeypatch.setenv("QOQ_DATA_DIR", str(tmp_path / "typo"))
    one_line_error(qoq("eval", "wikitext2", artifact, "--windows", 1), "typo", "not a directory")


# 6. pre-flight: output writable, disk space, every tensor present, --windows valid
def test_preflight_before_any_work(tmp_path, tiny_dir, fast, shared_data, monkeypatch):
    import qoq.preflight as preflight

    no_calibration(monkeypatch)
    (tmp_path / "file").write_text("x")
    one_line_error(quantize(tiny_dir, fast, tmp_path / "file" / "out", shared_data), "not a directory")
    real = preflight.tempfile.TemporaryFile
    monkeypatch.setattr(preflight.tempfile, "TemporaryFile", lambda **k: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")))
    one_line_error(quantize(tiny_dir, fast, tmp_path / "out", shared_data), "not writable")
    monkeypatch.setattr(preflight.tempfile, "TemporaryFile", real)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=1000))
    one_line_error(quantize(tiny_dir, fast, tmp_path / "out", shared_data), "not enough disk space", "MiB")
    assert not (tmp_path / "out").exists()


def test_missing_tensor_is_found_before_block_zero(tmp_path, tiny_dir, fast, shared_data, monkeypatch):
    model = shutil.copytree(tiny_dir, tmp_path / "model")
    name = "model.layers.1.mlp.up_proj.weight"
    tensors = load_file(model / "model.safetensors")
    del tensors[name]
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    no_calibration(monkeypatch)
    one_line_error(quantize(model, fast, tmp_path / "out", shared_data), name, "nothing was run")


def test_windows_checked_before_loading(artifact, shared_data, monkeypatch):
    import qoq.eval.runner as runner_mod

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(runner_mod, "load_for_eval", load)
    one_line_error(qoq("eval", "wikitext2", artifact, "--windows", 0, "--data-dir", shared_data), "--windows")
    one_line_error(qoq("eval", "wikitext2", artifact, "--windows", 10**6, "--data-dir", shared_data), "windows must be")
