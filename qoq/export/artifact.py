"""Artifact directory writer and reader (docs/design.md §4).

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


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, cloning any that share storage (safetensors refuses shared memory)."""
    out, seen = {}, set()
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


class ArtifactWriter:
    """Streams tensors into an artifact built in a temp dir beside out_dir: `add` buffers tensors and
    writes a safetensors shard whenever the next tensor would push the buffer past shard_bytes (a
    tensor larger than that gets its own shard), so memory holds at most one shard; `finish` names
    the shards, writes the index, config.json, copied files and qoq.json (per-tensor SHA-256) and
    renames the dir into place. Leaving the `with` block without `finish` removes the temp dir."""

    def __init__(self, out_dir: str | Path, shard_bytes: int = 2**31, overwrite: bool = False):
        self.out_dir, self.shard_bytes = Path(out_dir), shard_bytes
        if self.out_dir.exists() and not overwrite:
            raise ArtifactError(f"{self.out_dir} already exists (pass overwrite=True to replace it)")
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.tmp-", dir=self.out_dir.parent))
        self._buffer: dict[str, torch.Tensor] = {}
        self._buffered = 0
        self._shards: list[list[str]] = []  # tensor names of each written shard
        self._entries: dict[str, dict] = {}
        self._total = 0

    def __enter__(self) -> "ArtifactWriter":
        return self

    def __exit__(self, *exc) -> None:
        if self.tmp.exists():  # finish() did not run (or failed): nothing half-written stays
            shutil.rmtree(self.tmp, ignore_errors=True)

    def add(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, t in tensors.items():
            if name in self._entries or name in self._buffer:
                raise ArtifactError(f"tensor {name} is added twice")
            nbytes = t.numel() * t.element_size()
            if self._buffer and self._buffered + nbytes > self.shard_bytes:
                self._flush()
            self._buffer[name] = t
            self._buffered += nbytes

    def _flush(self) -> None:
        tensors = _unshared(self._buffer)
        save_file(tensors, str(self.tmp / f"shard-{len(self._shards):05d}.partial"), metadata={"format": "pt"})
        for name, t in tensors.items():
            self._entries[name] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                                   "sha256": tensor_sha256(t)}
            self._total += t.numel() * t.element_size()
        self._shards.append(list(tensors))
        self._buffer, self._buffered = {}, 0

    def finish(self, config: dict, manifest: dict, copy_files: list[Path] | tuple = ()) -> Path:
        clash = [k for k in RESERVED_KEYS if k in manifest]
        if clash:
            raise ArtifactError(f"manifest may not set the reserved key(s) {', '.join(clash)}")
        if self._buffer or not self._shards:
            self._flush()
        n = len(self._shards)
        files = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        weight_map = {}
        for i, (file, names) in enumerate(zip(files, self._shards)):
            (self.tmp / f"shard-{i:05d}.partial").rename(self.tmp / file)
            weight_map.update({name: file for name in names})
        if n > 1:
            index = {"metadata": {"total_size": self._total}, "weight_map": weight_map}
            (self.tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        (self.tmp / "config.json").write_text(json.dumps(config, indent=2))
        for src in map(Path, copy_files):
            shutil.copy2(src, self.tmp / src.name)
        entries = {name: {"file": weight_map[name], **entry} for name, entry in self._entries.items()}
        head = {"format_version": qoq.FORMAT_VERSION, "producer": f"qoq {qoq.__version__}"}
        (self.tmp / MANIFEST).write_text(json.dumps({**head, **manifest, "tensors": entries}, indent=2))
        _replace_dir(self.tmp, self.out_dir)
        return self.out_dir


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
    with ArtifactWriter(out_dir, shard_bytes, overwrite) as writer:
        writer.add(tensors)
        return writer.finish(config, manifest, copy_files)


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
