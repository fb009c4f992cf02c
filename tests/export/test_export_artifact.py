"""Artifact writer/reader: round trip, sharding, and every refusal the reader promises."""

import json
import struct

import pytest
import torch

import qoq
from qoq.export import artifact as artifact_mod
from qoq.export.artifact import ArtifactError, ArtifactWriter, read_artifact, write_artifact

CONFIG = {"model_type": "llama", "num_hidden_layers": 1}


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(16, 32, generator=g).half(),
        "model.layers.0.mlp.up_proj.qweight": torch.randint(-128, 128, (64, 16), dtype=torch.int8, generator=g),
        "model.layers.0.mlp.up_proj.s1_scales": torch.rand(64, generator=g).half(),
        "model.norm.weight": torch.ones(32, dtype=torch.bfloat16),
        "lm_head.weight": torch.randn(16, 32, generator=g).half(),
    }


def write(path, tensors=None, **kw):
    return write_artifact(path, sample_tensors() if tensors is None else tensors, CONFIG,
                          {"recipe": {"name": "w4a8kv4g128"}}, **kw)


def tensor_data_offset(shard, name: str) -> int:
    """Absolute byte offset of a tensor's data inside a safetensors file."""
    raw = shard.read_bytes()
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + header_len])
    return 8 + header_len + header[name]["data_offsets"][0]


def test_round_trip_single_file(tmp_path):
    tok = tmp_path / "tokenizer.json"
    tok.write_text('{"model": {}}')
    out = write(tmp_path / "art", copy_files=[tok])
    files = sorted(p.name for p in out.iterdir())
    assert files == ["config.json", "model.safetensors", "qoq.json", "tokenizer.json"]
    art = read_artifact(out)
    for name, t in sample_tensors().items():
        assert torch.equal(art.tensors[name], t) and art.tensors[name].dtype == t.dtype
    assert art.config == CONFIG
    assert art.manifest["format_version"] == qoq.FORMAT_VERSION
    assert art.manifest["producer"] == f"qoq {qoq.__version__}"
    assert art.manifest["recipe"] == {"name": "w4a8kv4g128"}
    entry = art.manifest["tensors"]["model.layers.0.mlp.up_proj.qweight"]
    assert entry["dtype"] == "int8" and entry["shape"] == [64, 16] and len(entry["sha256"]) == 64
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_sharded_write(tmp_path):
    out = write(tmp_path / "art", shard_bytes=1100)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert shards == [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(sample_tensors())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in sample_tensors().values())
    assert set(read_artifact(out).tensors) == set(sample_tensors())


def test_shared_storage_tensors_are_written(tmp_path):
    embed = torch.randn(16, 32).half()
    art = read_artifact(write(tmp_path / "art", {"a.weight": embed, "b.weight": embed}))
    assert torch.equal(art.tensors["a.weight"], art.tensors["b.weight"])


def test_truncated_shard_is_refused(tmp_path):
    out = write(tmp_path / "art")
    shard = out / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ArtifactError, match=r"cannot read shard .*model\.safetensors") as e:
        read_artifact(out)
    assert "\n" not in str(e.value)


def test_flipped_byte_names_the_tensor(tmp_path):
    out = write(tmp_path / "art")
    shard = out / "model.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[tensor_data_offset(shard, "model.layers.0.mlp.up_proj.s1_scales") + 5] ^= 0x01
    shard.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match=r"tensor model\.layers\.0\.mlp\.up_proj\.s1_scales in .*model\.safetensors"):
        read_artifact(out)


def test_unknown_format_version(tmp_path):
    out = write(tmp_path / "art")
    manifest = json.loads((out / "qoq.json").read_text())
    manifest["format_version"] = 7
    (out / "qoq.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError) as e:
        read_artifact(out)
    assert str(e.value) == f"unknown artifact format version 7 in {out}/qoq.json; this qoq reads version 1"


def test_missing_manifest_and_unlisted_tensors(tmp_path):
    out = write(tmp_path / "art")
    manifest = json.loads((out / "qoq.json").read_text())
    del manifest["tensors"]["lm_head.weight"]
    (out / "qoq.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"unlisted tensors \['lm_head.weight'\]"):
        read_artifact(out)
    (out / "qoq.json").unlink()
    with pytest.raises(ArtifactError, match=r"qoq\.json not found"):
        read_artifact(out)


def test_existing_out_dir_needs_overwrite(tmp_path):
    out = write(tmp_path / "art")
    (out / "stale.txt").write_text("old")
    with pytest.raises(ArtifactError, match="already exists"):
        write(out)
    write(out, {"x.weight": torch.ones(4).half()}, overwrite=True)
    assert not (out / "stale.txt").exists()
    assert set(read_artifact(out).tensors) == {"x.weight"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_failure_mid_write_leaves_nothing(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError):
        write(tmp_path / "art", copy_files=[tmp_path / "no-such-tokenizer.json"])
    assert list(tmp_path.iterdir()) == []

    calls = []

    def failing_save(tensors, path, metadata=None):  # second shard write fails
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_save(tensors, path, metadata=metadata)

    real_save = artifact_mod.save_file
    monkeypatch.setattr(artifact_mod, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        write(tmp_path / "art", shard_bytes=1100)
    assert list(tmp_path.iterdir()) == []
    old = write(tmp_path / "kept", {"x.weight": torch.ones(4).half()})  # one shard: succeeds
    calls.clear()
    with pytest.raises(OSError, match="disk full"):
        write(old, shard_bytes=1100, overwrite=True)
    assert set(read_artifact(old).tensors) == {"x.weight"}  # the old artifact is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_writer_streams_shards_and_equals_write_artifact(tmp_path):
    """Tensors added in pieces are on disk once a shard fills (the buffer holds one shard at most),
    and the finished artifact is file-for-file the one write_artifact makes from the whole dict."""
    tensors = sample_tensors()
    names = list(tensors)
    with ArtifactWriter(tmp_path / "streamed", shard_bytes=1100) as writer:
        writer.add({n: tensors[n] for n in names[:2]})  # 1024 + 2048 bytes: the first shard is written
        assert len(list(writer.tmp.glob("*.partial"))) == 1 and writer._buffered <= 1100
        writer.add({n: tensors[n] for n in names[2:]})
        with pytest.raises(ArtifactError, match="lm_head.weight is added twice"):
            writer.add({"lm_head.weight": tensors["lm_head.weight"]})
        streamed = writer.finish(CONFIG, {"recipe": {"name": "w4a8kv4g128"}})
    whole = write(tmp_path / "whole", shard_bytes=1100)
    files = sorted(p.name for p in whole.iterdir())
    assert files == sorted(p.name for p in streamed.iterdir()) and "model.safetensors.index.json" in files
    for name in files:
        assert (whole / name).read_bytes() == (streamed / name).read_bytes(), name
    with ArtifactWriter(tmp_path / "abandoned") as writer:  # no finish(): nothing stays behind
        writer.add(tensors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["streamed", "whole"]


def test_manifest_may_not_override_reserved_keys(tmp_path):
    with pytest.raises(ArtifactError, match="reserved key"):
        write_artifact(tmp_path / "art", sample_tensors(), CONFIG, {"format_version": 9})
