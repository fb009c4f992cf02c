"""qoq.json against its schema: missing or mistyped keys are named; tensor files stay inside the
artifact directory; verifying streams checksums and never loads a tensor."""

import json
import os

import pytest
import torch

from qoq.export import artifact as artifact_mod
from qoq.export.artifact import ArtifactError, is_artifact, read_artifact, verify_artifact, write_artifact

CONFIG = {"model_type": "llama", "num_hidden_layers": 1}


@pytest.fixture
def art(tmp_path):
    tensors = {"a.weight": torch.arange(8).half(), "b.weight": torch.ones(2, 3)}
    return write_artifact(tmp_path / "art", tensors, CONFIG, {"recipe": {"name": "r"}})


def edit(art, change):
    manifest = json.loads((art / "qoq.json").read_text())
    change(manifest)
    (art / "qoq.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("change, message", [
    (lambda m: m.pop("recipe"), "missing key 'recipe'"),
    (lambda m: m.pop("producer"), "missing key 'producer'"),
    (lambda m: m["recipe"].pop("name"), "recipe: missing key 'name'"),
    (lambda m: m.update(tensors=[]), "'tensors' must be dict"),
    (lambda m: m["tensors"]["a.weight"].pop("file"), "tensor a.weight: missing key 'file'"),
    (lambda m: m["tensors"]["a.weight"].update(shape="8"), "'shape' must be list"),
    (lambda m: m["tensors"]["a.weight"].update(sha256="x"), "sha256 is not 64 hex digits"),
    (lambda m: m["tensors"]["a.weight"].update(file="../x.safetensors"), "inside the artifact directory"),
    (lambda m: m["tensors"]["a.weight"].update(file="/dev/zero"), "inside the artifact directory"),
    (lambda m: m.update(calibration="pile"), "'calibration' must be dict"),
])
def test_schema_names_the_key(art, change, message):
    edit(art, change)
    with pytest.raises(ArtifactError, match=message) as e:
        verify_artifact(art)
    assert str(art / "qoq.json") in str(e.value)


def test_a_linked_shard_leading_outside_is_refused(art, tmp_path):
    outside = tmp_path / "outside.safetensors"
    (art / "model.safetensors").rename(outside)
    os.symlink(outside, art / "model.safetensors")
    with pytest.raises(ArtifactError, match="inside the artifact directory"):
        verify_artifact(art)


def test_verify_streams_and_loads_no_tensor(art, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("a tensor was loaded")

    monkeypatch.setattr(artifact_mod, "load_file", no_load)
    manifest, config = verify_artifact(art)
    assert set(manifest["tensors"]) == {"a.weight", "b.weight"} and config == CONFIG
    shard = art / "model.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 1  # the last byte of the last tensor's data
    shard.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match="checksum mismatch for tensor"):
        verify_artifact(art)


def test_a_config_marked_artifact_without_manifest_is_refused(art, tmp_path):
    (art / "qoq.json").unlink()
    assert not is_artifact(art)  # nothing marks it any more: a plain directory
    for mark in ({"qoq_artifact": {"format_version": 1}}, {"quantization_config": {"quant_method": "qoq"}}):
        (art / "config.json").write_text(json.dumps({**CONFIG, **mark}))
        assert is_artifact(art)
        with pytest.raises(ArtifactError, match="qoq.json is missing"):
            read_artifact(art)
