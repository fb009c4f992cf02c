"""Artifact directory writer and reader (DESIGN §4).

The writer builds everything in a temp dir beside the target and renames it into place, so a
failure never leaves a half-written artifact. The reader refuses unknown format versions,
unreadable shards, checksum mismatches and missing or extra tensors, naming the file and tensor.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import qoq

MANIFEST = "qoq.json"
RESERVED_KEYS = ("format_version", "producer", "tensors")


class ArtifactError(ValueError):
    """A bad or unreadable artifact; the message is one line naming the file (and tensor)."""


@dataclass
class Artifact:
    path: Path
    config: dict
    manifest: dict  # the whole qoq.json
    tensors: dict[str, torch.Tensor]


def tensor_sha256(t: torch.Tensor) -> str:
    """SHA-256 of the tensor's raw bytes (row-major, native little-endian)."""
    raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(raw.numpy()).hexdigest()


def _shard_plan(tensors: dict[str, torch.Tensor], shard_bytes: int) -> list[list[str]]:
    """Greedy split in insertion order; a tensor larger than shard_bytes gets its own shard."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, cloning any that share storage (safetensors refuses shared memory)."""
    out, seen = {}, set()
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


def _write_shards(tmp: Path, tensors: dict[str, torch.Tensor], shard_bytes: int) -> dict[str, str]:
    """Write safetensors shard(s) (+ index when sharded); returns tensor name -> file name."""
    plan = _shard_plan(tensors, shard_bytes)
    n = len(plan)
    files = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    weight_map = {}
    for file, names in zip(files, plan):
        save_file({name: tensors[name] for name in names}, str(tmp / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in names})
    if n > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return weight_map


def write_artifact(
    out_dir: str | Path,
    tensors: dict[str, torch.Tensor],
    config: dict,
    manifest: dict,
    copy_files: list[Path] | tuple = (),
    shard_bytes: int = 2**31,
    overwrite: bool = False,
) -> Path:
    """Write tensors, config.json, copied files and qoq.json (with per-tensor SHA-256) to out_dir."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise ArtifactError(f"{out_dir} already exists (pass overwrite=True to replace it)")
    clash = [k for k in RESERVED_KEYS if k in manifest]
    if clash:
        raise ArtifactError(f"manifest may not set the reserved key(s) {', '.join(clash)}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tensors = _unshared(tensors)
        files = _write_shards(tmp, tensors, shard_bytes)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for src in map(Path, copy_files):
            shutil.copy2(src, tmp / src.name)
        entries = {
            name: {"file": files[name], "dtype": str(t.dtype).removeprefix("torch."),
                   "shape": list(t.shape), "sha256": tensor_sha256(t)}
            for name, t in tensors.items()
        }
        head = {"format_version": qoq.FORMAT_VERSION, "producer": f"qoq {qoq.__version__}"}
        (tmp / MANIFEST).write_text(json.dumps({**head, **manifest, "tensors": entries}, indent=2))
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    if not out_dir.exists():
        tmp.rename(out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    out_dir.rename(old / "artifact")  # keep the old one until the new one is in place
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise ArtifactError(f"{path} not found")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path} is not valid JSON: {e}") from None


def load_manifest(path: str | Path) -> dict:
    """Parse and version-check DIR/qoq.json without loading any tensor."""
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"artifact directory {path} not found")
    manifest = read_json(path / MANIFEST)
    version = manifest.get("format_version")
    if version != qoq.FORMAT_VERSION:
        raise ArtifactError(
            f"unknown artifact format version {version} in {path / MANIFEST}; "
            f"this qoq reads version {qoq.FORMAT_VERSION}"
        )
    if not isinstance(manifest.get("tensors"), dict):
        raise ArtifactError(f"{path / MANIFEST} has no 'tensors' table")
    return manifest


def _load_shard(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except Exception as e:  # safetensors raises its own error types for corrupt headers/data
        reason = " ".join(str(e).split())
        raise ArtifactError(f"cannot read shard {file}: {reason}") from None


def _check_tensor(name: str, t: torch.Tensor, entry: dict, file: Path) -> None:
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype != entry["dtype"] or list(t.shape) != entry["shape"]:
        raise ArtifactError(
            f"tensor {name} in {file} is {dtype} {list(t.shape)}, qoq.json says {entry['dtype']} {entry['shape']}"
        )
    if tensor_sha256(t) != entry["sha256"]:
        raise ArtifactError(f"checksum mismatch for tensor {name} in {file}")


def read_artifact(path: str | Path) -> Artifact:
    """Load and verify an artifact: version, shards, per-tensor SHA-256, exact tensor set."""
    path = Path(path)
    manifest = load_manifest(path)
    config = read_json(path / "config.json")
    entries: dict[str, dict] = manifest["tensors"]
    files = sorted({e["file"] for e in entries.values()})
    unlisted = sorted({f.name for f in path.glob("*.safetensors")} - set(files))
    if unlisted:
        raise ArtifactError(f"{path} holds shard(s) {unlisted} that {MANIFEST} does not list")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        shard = _load_shard(path / file)
        expected = {name for name, e in entries.items() if e["file"] == file}
        missing, extra = sorted(expected - shard.keys()), sorted(shard.keys() - expected)
        if missing or extra:
            raise ArtifactError(f"{path / file}: missing tensors {missing[:3]}, unlisted tensors {extra[:3]}")
        for name, t in shard.items():
            _check_tensor(name, t, entries[name], path / file)
        tensors.update(shard)
    return Artifact(path=path, config=config, manifest=manifest, tensors=tensors)
