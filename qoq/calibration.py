"""Calibration and evaluation data: strict TOML specs, local-file or HF loading, seeded sampling.

A spec names where text comes from: a local file under the data dir (`--data-dir` or `QOQ_DATA_DIR`)
and/or an HF dataset. With a data dir set, the local file is read and its absence is an error at once
naming the path (never a silent switch to the network); the hub (`datasets`, imported only then) is
used only for a spec with `hf_dataset` and no data dir set, or a spec with no `local_file`. A spec is a name in the repo's
`calib/` dir, a path to a `.toml`, or a direct `.txt`/`.jsonl`/`.parquet` file (an ad-hoc spec).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

import torch

import qoq

SPEC_DIR = Path(qoq.__file__).resolve().parents[1] / "calib"
DATA_DIR_ENV = "QOQ_DATA_DIR"
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
# Only the first documents totalling this many characters per needed token are tokenized, so a
# large HF split (pile-val) is not tokenized whole; English text runs ~4 characters per token.
CHARS_PER_NEEDED_TOKEN = 16


@dataclass(frozen=True)
class DataSpec:
    name: str
    description: str = ""
    hf_dataset: str | None = None
    hf_config: str | None = None
    hf_split: str = "validation"
    text_field: str = "text"
    local_file: str | None = None  # relative to the data dir, or absolute (ad-hoc specs)
    samples: int = 128
    seq_len: int = 512
    seed: int = 0


SPEC_TYPES = {f.name: (int if f.type == "int" else str) for f in fields(DataSpec)}


def available_specs() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.toml"))


def load_spec(name_or_path: str | os.PathLike) -> DataSpec:
    path = Path(name_or_path)
    if path.suffix in TEXT_SUFFIXES:
        if not path.is_file():
            raise FileNotFoundError(f"calibration data file not found: {path}")
        return DataSpec(name=path.stem, description=f"local file {path}", local_file=str(path.resolve()))
    if path.suffix != ".toml":
        path = SPEC_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            known = ", ".join(available_specs()) or "none"
            raise FileNotFoundError(
                f"unknown data spec {str(name_or_path)!r}: not a file and not in {SPEC_DIR} (known: {known})"
            )
    elif not path.is_file():
        raise FileNotFoundError(f"data spec file not found: {path}")
    return _parse_spec(path)


def _parse_spec(path: Path) -> DataSpec:
    with path.open("rb") as f:
        raw = tomllib.load(f)
    for key, value in raw.items():
        if key not in SPEC_TYPES:
            raise ValueError(f"{path}: unknown key {key!r} (allowed: {', '.join(SPEC_TYPES)})")
        expected = SPEC_TYPES[key]
        # bool is an int subclass in Python; `samples = true` is still a type error
        if not isinstance(value, expected) or isinstance(value, bool):
            raise ValueError(f"{path}: key {key!r} must be {expected.__name__}, got {type(value).__name__}")
    if "name" not in raw:
        raise ValueError(f"{path}: missing required key 'name'")
    if "hf_dataset" not in raw and "local_file" not in raw:
        raise ValueError(f"{path}: needs a source: 'hf_dataset' and/or 'local_file'")
    for key in ("samples", "seq_len"):
        if key in raw and raw[key] < 1:
            raise ValueError(f"{path}: key {key!r} must be >= 1, got {raw[key]}")
    return DataSpec(**raw)


def _env_data_dir() -> Path | None:
    value = os.environ.get(DATA_DIR_ENV)
    return Path(value) if value else None


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The offline data dir: an explicit flag wins over `QOQ_DATA_DIR`; None when neither is set."""
    return Path(explicit) if explicit is not None else _env_data_dir()


def local_path(spec: DataSpec, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local file the spec reads, or None when it is to be read from the hub (see the module
    docstring). A named local source that cannot be found raises FileNotFoundError naming the path."""
    if spec.local_file is None:
        return None
    path = Path(spec.local_file)
    root = Path(data_dir) if data_dir is not None else _env_data_dir()
    if not path.is_absolute():
        if root is None:
            if spec.hf_dataset is not None:
                return None
            raise FileNotFoundError(f"data spec {spec.name!r}: local file {spec.local_file!r} needs a data dir "
                                    f"(set --data-dir or {DATA_DIR_ENV}), and it has no hf_dataset")
        if not root.is_dir():
            raise FileNotFoundError(f"data dir {root} (from --data-dir or {DATA_DIR_ENV}) is not a directory")
        path = root / path
    if not path.is_file():
        hub = f"; unset the data dir to read {spec.hf_dataset!r} from the hub" if spec.hf_dataset else ""
        raise FileNotFoundError(f"data spec {spec.name!r}: local file {path} not found{hub}")
    return path


def source(spec: DataSpec, data_dir: str | os.PathLike | None = None) -> str:
    """Where `load_texts` reads from: a local path, or `hf:dataset[/config]:split`. Checking it is the
    pre-flight for data: a missing local source fails here, before any long work."""
    path = local_path(spec, data_dir)
    if path is not None:
        return str(path)
    config = f"/{spec.hf_config}" if spec.hf_config else ""
    return f"hf:{spec.hf_dataset}{config}:{spec.hf_split}"


def load_texts(spec: DataSpec, data_dir: str | os.PathLike | None = None) -> list[str]:
    """Documents in file order: a .txt splits at blank lines; .jsonl/.parquet/HF rows are kept as-is
    (empty rows included: the perplexity protocol joins them)."""
    path = local_path(spec, data_dir)
    if path is not None:
        return _read_local(path, spec.text_field)
    return _read_hf(spec)


def _read_local(path: Path, field: str) -> list[str]:
    if path.suffix == ".txt":
        text = path.read_text(encoding="utf-8")
        return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    if path.suffix == ".jsonl":
        texts = []
        with path.open(encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_no}: not a JSON row ({e})") from e
                if field not in row:
                    raise ValueError(f"{path}:{line_no}: row has no text field {field!r}")
                texts.append(row[field])
        return texts
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from e
        table = pq.read_table(path)
        if field not in table.column_names:
            raise ValueError(f"{path}: no column {field!r} (columns: {', '.join(table.column_names)})")
        return table.column(field).to_pylist()
    raise ValueError(f"{path}: unsupported data file type {path.suffix!r} (use {', '.join(TEXT_SUFFIXES)})")


def _read_hf(spec: DataSpec) -> list[str]:
    offline_hint = f"no data dir is set (--data-dir or {DATA_DIR_ENV}) for its local copy {spec.local_file!r}" \
        if spec.local_file else "it names no local file"
    try:
        import datasets
    except ImportError as e:
        raise ImportError(
            f"data spec {spec.name!r}: {offline_hint}, and reading HF dataset {spec.hf_dataset!r} needs "
            "`datasets` (pip install 'qoq[data]')"
        ) from e
    try:
        rows = datasets.load_dataset(spec.hf_dataset, spec.hf_config, split=spec.hf_split)
    except Exception as e:  # offline hubs raise many kinds of errors: one line naming both sources
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise OSError(f"data spec {spec.name!r}: {offline_hint}; loading HF dataset {spec.hf_dataset!r} "
                      f"failed: {reason}") from e
    if spec.text_field not in rows.column_names:
        raise ValueError(f"HF dataset {spec.hf_dataset!r} has no text field {spec.text_field!r}")
    return list(rows[spec.text_field])


def document_tokens(spec, tokenizer, data_dir, samples: int, seq_len: int, seed: int) -> torch.Tensor:
    """Long[samples, seq_len] from shuffled documents (the sampler of deepcompressor's QoQ): documents in
    a `torch.randperm` order, each tokenized without special tokens and cut to one random window of
    seq_len tokens when longer, concatenated until samples·seq_len tokens, cut into rows. Every row
    comes from other documents than the windows rule's first ~4·samples·seq_len characters."""
    docs = [t for t in load_texts(spec, data_dir) if t.strip()]
    generator = torch.Generator().manual_seed(seed)
    need, pieces, total = samples * seq_len, [], 0
    for i in torch.randperm(len(docs), generator=generator).tolist():
        ids = tokenizer(docs[i], add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) > seq_len:
            start = int(torch.randint(0, len(ids) - seq_len + 1, (1,), generator=generator))
            ids = ids[start : start + seq_len]
        pieces.append(torch.tensor(ids, dtype=torch.long))
        total += len(ids)
        if total >= need:
            return torch.cat(pieces)[:need].view(samples, seq_len)
    raise ValueError(f"data spec {spec.name!r} has {total} tokens, fewer than {samples} x {seq_len}")


def calibration_tokens(spec, tokenizer, data_dir=None, samples=None, seq_len=None, seed=None,
                       sampling: str = "windows") -> torch.Tensor:
    """Long[samples, seq_len] windows of the data, deterministic for a given seed.

    Rule: non-empty documents in file order are joined with "\\n\\n" (only the first ones totalling
    CHARS_PER_NEEDED_TOKEN characters per needed token), tokenized once without special tokens; each
    window starts at an offset drawn uniformly from [0, n_tokens - seq_len] by
    `torch.randint(generator=torch.Generator().manual_seed(seed))`. Windows may overlap.
    """
    samples = spec.samples if samples is None else samples
    seq_len = spec.seq_len if seq_len is None else seq_len
    seed = spec.seed if seed is None else seed
    if samples < 1 or seq_len < 1:
        raise ValueError(f"samples and seq_len must be >= 1, got samples={samples}, seq_len={seq_len}")
    if sampling == "documents":
        return document_tokens(spec, tokenizer, data_dir, samples, seq_len, seed)
    if sampling != "windows":
        raise ValueError(f"calibration sampling must be 'windows' or 'documents', got {sampling!r}")
    budget, taken, total = CHARS_PER_NEEDED_TOKEN * samples * seq_len, [], 0
    for text in load_texts(spec, data_dir):
        if text.strip():
            taken.append(text)
            total += len(text)
            if total >= budget:
                break
    ids = torch.tensor(tokenizer("\n\n".join(taken), add_special_tokens=False, verbose=False)["input_ids"])
    if ids.numel() < seq_len:
        raise ValueError(f"data spec {spec.name!r} has {ids.numel()} tokens, fewer than seq_len={seq_len}")
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - seq_len + 1, (samples,), generator=generator)  # [S]
    return ids[starts[:, None] + torch.arange(seq_len)]  # [S, T]


def describe(spec: DataSpec, tokens: torch.Tensor, data_dir=None, seed=None) -> dict:
    """The artifact manifest's record of the calibration data (pass the seed if it was overridden)."""
    digest = hashlib.sha256(tokens.cpu().to(torch.int64).contiguous().numpy().tobytes()).hexdigest()
    return {
        "name": spec.name,
        "source": source(spec, data_dir),
        "samples": tokens.shape[0],
        "seq_len": tokens.shape[1],
        "seed": spec.seed if seed is None else seed,
        "sha256": digest,
    }
