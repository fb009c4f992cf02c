"""Replacing an artifact: at every step of a failed swap the path holds the old or the new artifact;
what --overwrite may replace; temp dirs of killed runs are swept; user file modes."""

import os
import stat

import pytest
import torch

from qoq.export import replace as replace_mod
from qoq.export.artifact import ArtifactError, read_artifact, write_artifact
from qoq.export.replace import MARKER, ReplaceError, check_replaceable, sweep_stale

CONFIG = {"model_type": "llama", "num_hidden_layers": 1}


def write(path, value: float, **kw):
    return write_artifact(path, {"x.weight": torch.full((4,), value).half()}, CONFIG, {"recipe": {"name": "r"}}, **kw)


def value_at(path) -> float:
    return read_artifact(path).tensors["x.weight"][0].item()


def failing_rename(fail_at: int):
    calls = []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == fail_at:
            raise OSError("injected failure")
        os.rename(src, dst)

    return rename


@pytest.mark.parametrize("exchange", [True, False])
def test_replace_succeeds(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(replace_mod, "_exchange", lambda a, b: False)
    out = write(tmp_path / "art", 1.0)
    write(out, 2.0, overwrite=True)
    assert value_at(out) == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


@pytest.mark.parametrize("fail_at", [1, 2])
def test_failure_at_each_rename_keeps_an_artifact_at_the_path(tmp_path, monkeypatch, fail_at):
    """Without an atomic exchange: (1) setting the old one aside fails, (2) moving the new one in fails."""
    monkeypatch.setattr(replace_mod, "_exchange", lambda a, b: False)
    out = write(tmp_path / "art", 1.0)
    monkeypatch.setattr(replace_mod, "_rename", failing_rename(fail_at))
    with pytest.raises(OSError, match="injected failure"):
        write(out, 2.0, overwrite=True)
    assert value_at(out) == 1.0  # the old artifact, back at its path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]  # no temp or aside dir left


def test_failure_removing_the_old_one_keeps_the_new(tmp_path, monkeypatch):
    monkeypatch.setattr(replace_mod, "_exchange", lambda a, b: False)
    out = write(tmp_path / "art", 1.0)

    def broken_rmtree(*args, **kwargs):
        raise OSError("boom")

    monkeypatch.setattr(replace_mod.shutil, "rmtree", broken_rmtree)
    write(out, 2.0, overwrite=True)  # the old one stays aside for a later sweep; no error
    monkeypatch.undo()
    assert value_at(out) == 2.0
    assert [p.name.startswith(".art.old-") for p in tmp_path.iterdir() if p.name != "art"] == [True]


def test_exchange_failure_leaves_the_old_artifact(tmp_path, monkeypatch):
    out = write(tmp_path / "art", 1.0)

    def broken(a, b):
        raise OSError("injected exchange failure")

    monkeypatch.setattr(replace_mod, "_exchange", broken)
    with pytest.raises(OSError, match="injected"):
        write(out, 2.0, overwrite=True)
    assert value_at(out) == 1.0 and sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_overwrite_refuses_what_is_not_an_artifact(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(ReplaceError, match="not a qoq artifact"):
        write(user, 1.0, overwrite=True)
    assert (user / "notes.txt").read_text() == "mine"
    model = tmp_path / "model"
    model.mkdir()
    (model / "qoq.json").write_text("{}")
    for target in (model, tmp_path):  # the input itself, and a directory containing it
        with pytest.raises(ReplaceError, match="input model"):
            check_replaceable(target, True, protect=[model])
    (tmp_path / "file").write_text("x")
    with pytest.raises(ReplaceError, match="not a directory"):
        write(tmp_path / "file", 1.0, overwrite=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert value_at(write(empty, 3.0, overwrite=True)) == 3.0
    with pytest.raises(ArtifactError, match="already exists"):
        write(empty, 4.0)


def test_sweep_removes_stale_temp_dirs_and_restores_an_aside_artifact(tmp_path):
    stale = tmp_path / ".art.tmp-abc"
    stale.mkdir()
    (stale / MARKER).write_text("pid 1")
    foreign = tmp_path / ".mine.tmp-keep"  # matches the pattern but is not ours: left alone
    foreign.mkdir()
    aside = write(tmp_path / "x", 5.0).rename(tmp_path / ".gone.old-xyz")
    assert sweep_stale(tmp_path) == [f"restored {tmp_path / 'gone'} from .gone.old-xyz "
                                     "(left by a run killed mid-replace)"]
    assert stale.exists()  # younger than a day
    notes = sweep_stale(tmp_path, max_age=0)
    assert notes == [f"removed stale temp dir {stale} (left by an interrupted run)"]
    assert not stale.exists() and foreign.exists() and value_at(tmp_path / "gone") == 5.0
    assert not aside.exists()


def test_artifacts_get_normal_file_modes(tmp_path):
    old = os.umask(0o022)
    try:
        out = write(tmp_path / "art", 1.0)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    for f in out.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
