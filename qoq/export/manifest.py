"""The schema of qoq.json (a dataclass per table) and the tensor set a model config requires.

`parse_manifest` refuses, in one line naming the key, a manifest with a missing or mistyped key, a
tensor entry that is not {file, dtype, shape, sha256}, or a tensor file outside the artifact
directory (`"../x"`, `"/dev/zero"`, a link leading out). Keys beyond the schema are kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

SHA256 = re.compile(r"^[0-9a-f]{64}$")
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
QUANT_PARTS = {"per-channel": ("qweight", "s1_scales", "s1_szeros"),
               "grouped": ("qweight", "s1_scales", "s2_scales", "s2_zeros"),
               "symmetric": ("qweight", "w_scales"),  # + qweight_outliers, input_order per format (§3.7)
               "asymmetric": ("qweight", "w_scales", "w_zeros")}


class ManifestError(ValueError):
    """qoq.json does not follow the schema; the message names the file and the key."""


@dataclass(frozen=True)
class TensorEntry:
    file: str
    dtype: str
    shape: list
    sha256: str


@dataclass(frozen=True)
class RecipeRecord:
    name: str
    format: dict | None = None


@dataclass(frozen=True)
class Manifest:
    format_version: int
    producer: str
    recipe: RecipeRecord
    tensors: dict  # name -> TensorEntry


OPTIONAL_TABLES = {"passes": dict, "calibration": dict, "source": dict, "block_rel_err": list}
FORMAT_KEYS = {"weight_bits": int, "group_size": int, "act_bits": int, "kv_bits": int, "weight_scheme": str,
               "outlier_channels": int, "act_clip": (int, float), "online_hadamard": bool,
               "k_bias_outside_cache": bool}


def _typed(raw, key: str, kind, where: str, optional: bool = False):
    if key not in raw:
        if optional:
            return None
        raise ManifestError(f"{where}: missing key '{key}'")
    value = raw[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ManifestError(f"{where}: '{key}' must be {names}, got {type(value).__name__}")
    return value


def _inside(root: Path, file: str) -> bool:
    if not file or file != Path(file).name or file in (".", ".."):
        return False
    real = (root / file).resolve()
    return real.parent == root.resolve()


def _entry(name: str, raw, root: Path, where: str) -> TensorEntry:
    at = f"{where}: tensor {name}"
    if not isinstance(raw, dict):
        raise ManifestError(f"{at} must be a table")
    unknown = sorted(set(raw) - {f.name for f in fields(TensorEntry)})
    if unknown:
        raise ManifestError(f"{at}: unknown key '{unknown[0]}'")
    file, dtype = _typed(raw, "file", str, at), _typed(raw, "dtype", str, at)
    shape, digest = _typed(raw, "shape", list, at), _typed(raw, "sha256", str, at)
    if not _inside(root, file) or not file.endswith(".safetensors"):
        raise ManifestError(f"{at}: file {file!r} is not a .safetensors file inside the artifact directory")
    if dtype not in DTYPES:
        raise ManifestError(f"{at}: unknown dtype {dtype!r}")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ManifestError(f"{at}: shape {shape} is not a list of sizes")
    if not SHA256.match(digest):
        raise ManifestError(f"{at}: sha256 is not 64 hex digits")
    return TensorEntry(file, dtype, shape, digest)


def parse_manifest(raw, root: Path, where: str) -> Manifest:
    """Validate a parsed qoq.json (the format version is checked by the caller, first)."""
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: must be a JSON object")
    version = _typed(raw, "format_version", int, where)
    producer = _typed(raw, "producer", str, where)
    recipe_raw = _typed(raw, "recipe", dict, where)
    name = _typed(recipe_raw, "name", str, f"{where}: recipe")
    fmt = _typed(recipe_raw, "format", dict, f"{where}: recipe", optional=True)
    for key, value in (fmt or {}).items():
        kind = FORMAT_KEYS.get(key)
        if kind is None or not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ManifestError(f"{where}: recipe.format.{key} = {value!r} is not a known format field")
    tensors = _typed(raw, "tensors", dict, where)
    for key, kind in OPTIONAL_TABLES.items():
        _typed(raw, key, kind, where, optional=True)
    entries = {n: _entry(n, e, root, where) for n, e in tensors.items()}
    return Manifest(version, producer, RecipeRecord(name, fmt), entries)


def quant_kind(prefix: str, names) -> str:
    """Which QUANT_PARTS set the quantized linear `prefix` stores, told by its distinctive tensor."""
    for kind, part in (("asymmetric", "w_zeros"), ("symmetric", "w_scales"), ("per-channel", "s1_szeros")):
        if f"{prefix}.{part}" in names:
            return kind
    return "grouped"


def required_tensors(config: dict, names: set[str]) -> list[str]:
    """Tensor names the model config needs that `names` lacks (a linear stored as W4 needs its parts)."""
    import torch

    from qoq.models.config import ModelConfig
    from qoq.models.llama import CausalLM

    cfg = ModelConfig.from_hf(config)
    with torch.device("meta"):
        lm = CausalLM(cfg)
    missing = []
    for param in lm.state_dict():
        if param == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        prefix = param.removesuffix(".weight")
        if param.endswith(".weight") and f"{prefix}.qweight" in names:
            kind = quant_kind(prefix, names)
            missing += [f"{prefix}.{part}" for part in QUANT_PARTS[kind] if f"{prefix}.{part}" not in names]
        elif param not in names:
            missing.append(param)
    return missing
