"""Artifact directory writer and reader (docs/design.md §4).

The writer builds everything in a temp dir beside the target and swaps it into place
(`qoq.export.replace`), so a failure never leaves a half-written artifact or loses the old one.
The reader validates qoq.json against its schema (`qoq.export.manifest`) and refuses unknown format
versions, unreadable shards, checksum mismatches and missing or extra tensors, naming the file and
tensor. Checksums are streamed from the files: verifying never holds a tensor in memory.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch
from safetensors.torch import load_file, save_file

import qoq
from qoq.export.manifest import ManifestError, parse_manifest, required_tensors
from qoq.export.replace import check_replaceable, make_temp_dir, replace_dir, user_modes

MANIFEST = "qoq.json"
RESERVED_KEYS = ("format_version", "producer", "tensors")
CONFIG_MARK = "qoq_artifact"  # config.json key naming an artifact even when qoq.json is gone
# safetensors header dtype -> torch dtype name (as qoq.json spells it)
HEADER_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64", "I8": "int8",
                 "U8": "uint8", "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool"}
CHUNK = 1 << 24


class ArtifactError(ValueError):
    """A bad or unreadable artifact; the message is one line naming the file (and tensor)."""


def is_artifact(path: str | Path) -> bool:
    """A directory with qoq.json, or whose config.json marks it as a qoq artifact (quant_method "qoq"
    or the qoq_artifact key): such a directory must verify as an artifact or be refused."""
    path = Path(path)
    if (path / MANIFEST).exists():
        return True
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return CONFIG_MARK in config or (isinstance(method, str) and (method == "qoq" or method.startswith("qoq-")))


def artifact_config(hf_config: dict, recipe) -> dict:
    """config.json of an artifact of `recipe` (a qoq.recipe_schema.Recipe): the model's HF config with
    `quantization_config` (W4 recipes; the keys SGLang's `qoq` method reads are wbits and group_size), the
    qoq mark, and fp16 as the model dtype under both names transformers reads: "dtype" (which wins since
    transformers 4.56, and which a source config may carry as bfloat16) and "torch_dtype"."""
    out = dict(hf_config)
    if recipe.quantizes_weights:
        f = recipe.format
        # only the QoQ W4A8 tensors are what SGLang's "qoq" method loads; any other format gets a method name
        # no server knows, so a server refuses it instead of misreading its tensors
        method = "qoq" if f.kind == "w4a8" else f"qoq-{f.kind}-{f.weight_scheme}"
        out["quantization_config"] = {
            "quant_method": method, "wbits": f.weight_bits, "group_size": f.group_size, "abits": f.act_bits,
            "kv_bits": f.kv_bits, "recipe": recipe.name, "producer": f"qoq {qoq.__version__}"}
    out["dtype"] = out["torch_dtype"] = "float16"
    out[CONFIG_MARK] = {"format_version": qoq.FORMAT_VERSION, "recipe": recipe.name}
    return out


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

    def __init__(self, out_dir: str | Path, shard_bytes: int = 2**31, overwrite: bool = False,
                 protect: Iterable[Path] = ()):
        """overwrite: replace an existing artifact or empty dir; never anything in `protect` (the input)."""
        self.out_dir, self.shard_bytes = Path(out_dir), shard_bytes
        try:
            check_replaceable(self.out_dir, overwrite, protect)
        except FileExistsError:
            raise ArtifactError(f"{self.out_dir} already exists (pass overwrite=True to replace it)") from None
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = make_temp_dir(self.out_dir)
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
        file = self.tmp / f"shard-{len(self._shards):05d}.partial"
        try:
            save_file(tensors, str(file), metadata={"format": "pt"})
        except OSError:
            raise
        except Exception as e:  # safetensors raises its own error type, e.g. on a full disk
            raise OSError(f"cannot write {self.out_dir}: {' '.join(str(e).split())}") from e
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
        user_modes(self.tmp)
        replace_dir(self.tmp, self.out_dir)
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


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise ArtifactError(f"{path} not found")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path} is not valid JSON: {e}") from None


def load_manifest(path: str | Path) -> dict:
    """Parse, version-check and schema-check DIR/qoq.json without reading any tensor."""
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"artifact directory {path} not found")
    if not (path / MANIFEST).is_file() and is_artifact(path):
        raise ArtifactError(f"{path} is a qoq artifact (config.json says so) but its {MANIFEST} is missing: "
                            "it cannot be verified; quantize it again")
    manifest = read_json(path / MANIFEST)
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != qoq.FORMAT_VERSION:
        raise ArtifactError(
            f"unknown artifact format version {version} in {path / MANIFEST}; "
            f"this qoq reads version {qoq.FORMAT_VERSION}"
        )
    try:
        parse_manifest(manifest, path, str(path / MANIFEST))
    except ManifestError as e:
        raise ArtifactError(str(e)) from None
    return manifest


def _shard_header(file: Path) -> tuple[dict, int, int]:
    """(header, offset of the data, file size) of a safetensors file, read without its data."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError(f"header of {n} bytes in a {size}-byte file")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (OSError, ValueError, struct.error) as e:
        raise ArtifactError(f"cannot read shard {file}: truncated or corrupt ({e})") from None
    return header, 8 + n, size


def _verify_shard(file: Path, expected: dict[str, dict]) -> None:
    """Names, dtypes, shapes and streamed SHA-256 of every tensor of one shard against qoq.json."""
    header, start, size = _shard_header(file)
    header.pop("__metadata__", None)
    missing, extra = sorted(expected.keys() - header.keys()), sorted(header.keys() - expected.keys())
    if missing or extra:
        raise ArtifactError(f"{file}: missing tensors {missing[:3]}, unlisted tensors {extra[:3]}")
    with open(file, "rb") as f:
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            entry = expected[name]
            dtype = HEADER_DTYPES.get(info.get("dtype"), info.get("dtype"))
            if dtype != entry["dtype"] or list(info.get("shape", ())) != entry["shape"]:
                raise ArtifactError(f"tensor {name} in {file} is {dtype} {info.get('shape')}, "
                                    f"qoq.json says {entry['dtype']} {entry['shape']}")
            begin, end = info["data_offsets"]
            if start + end > size:
                raise ArtifactError(f"cannot read shard {file}: truncated (tensor {name} ends past the file)")
            f.seek(start + begin)
            digest, left = hashlib.sha256(), end - begin
            while left > 0:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    break
                digest.update(chunk)
                left -= len(chunk)
            if digest.hexdigest() != entry["sha256"]:
                raise ArtifactError(f"checksum mismatch for tensor {name} in {file}")


def verify_artifact(path: str | Path, complete: bool = False) -> tuple[dict, dict]:
    """(manifest, config) of a verified artifact: schema, version, shards, every tensor's streamed
    checksum, the exact tensor set; `complete`: also every tensor config.json's model needs."""
    path = Path(path)
    manifest = load_manifest(path)
    config = read_json(path / "config.json")
    entries: dict[str, dict] = manifest["tensors"]
    if complete:
        missing = required_tensors(config, set(entries))
        if missing:
            raise ArtifactError(f"{path}: the model needs tensor {missing[0]}, which the artifact lacks "
                                f"({len(missing)} missing)")
    files = sorted({e["file"] for e in entries.values()})
    unlisted = sorted({f.name for f in path.glob("*.safetensors")} - set(files))
    if unlisted:
        raise ArtifactError(f"{path} holds shard(s) {unlisted} that {MANIFEST} does not list")
    for file in files:
        _verify_shard(path / file, {n: e for n, e in entries.items() if e["file"] == file})
    return manifest, config


def _load_shard(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except Exception as e:  # safetensors raises its own error types for corrupt headers/data
        reason = " ".join(str(e).split())
        raise ArtifactError(f"cannot read shard {file}: {reason}") from None


def read_artifact(path: str | Path, complete: bool = False) -> Artifact:
    """Verify an artifact (`verify_artifact`), then load its tensors."""
    path = Path(path)
    manifest, config = verify_artifact(path, complete)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted({e["file"] for e in manifest["tensors"].values()}):
        tensors.update(_load_shard(path / file))
    return Artifact(path=path, config=config, manifest=manifest, tensors=tensors)
