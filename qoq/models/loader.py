"""Resolve a model name to a directory, read its safetensors lazily, and build CausalLM block by block.

Only the tensors of what is being built are read, so a 70B checkpoint never has to fit in RAM: build the
skeleton (`load_skeleton`), then fill `model.layers[i] = load_block(reader, config, i, ...)` one at a time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from qoq.models.packaged import PACKAGED
from qoq.models.config import ModelConfig
from qoq.models.errors import CheckpointError, ModelNotFoundError
from qoq.models.llama import Block, CausalLM

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # "org/name" or a legacy "name"
HUB_FILES = [
    "config.json", "generation_config.json", "model*.safetensors", "model.safetensors.index.json",
    "tokenizer*", "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template*",
]  # fmt: skip
SINGLE_FILE, SHARD_INDEX = "model.safetensors", "model.safetensors.index.json"
__all__ = ["CheckpointError", "CheckpointReader", "ModelNotFoundError", "load_block", "load_model", "load_skeleton",
           "load_tokenizer", "resolve_model"]  # fmt: skip


def resolve_model(name_or_path: str | Path) -> Path:
    """Local dir with config.json, a packaged model's alias (`smollm2-135m`, `qwen2.5-coder-0.5b`, ...; see
    qoq.models.packaged), or a Hugging Face hub id -> local dir."""
    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model directory {path} has no config.json")
        return path
    if name in PACKAGED:
        return PACKAGED[name].ensure_converted()
    if path.exists() or not HUB_ID.match(name):
        raise ModelNotFoundError(f"model not found: {name} is not a directory with a config.json")
    return _download(name)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as e:  # offline, gated, unknown repo: one line that names the model
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelNotFoundError(
            f"model not found: {repo_id} is neither a local directory nor fetchable from the hub ({reason})"
        ) from e


class CheckpointReader:
    """Lazy access to the tensors of `model.safetensors` or a sharded `model.safetensors.index.json`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if (self.path / SINGLE_FILE).is_file():
            self._file_of = {name: SINGLE_FILE for name in self._open(SINGLE_FILE).keys()}
        elif (self.path / SHARD_INDEX).is_file():
            index = self._json(SHARD_INDEX)
            self._file_of = dict(index["weight_map"])
        else:
            raise CheckpointError(
                f"{self.path} has neither {SINGLE_FILE} nor {SHARD_INDEX} (qoq reads safetensors only)"
            )

    def _json(self, file: str) -> dict:
        try:
            return json.loads((self.path / file).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"cannot read {self.path / file}: {e}") from e

    def _open(self, file: str):
        try:
            return safe_open(str(self.path / file), framework="pt", device="cpu")
        except Exception as e:  # safetensors raises its own error type for truncated/corrupt headers
            raise CheckpointError(f"cannot read {self.path / file}: truncated or corrupt safetensors ({e})") from e

    def config(self) -> dict:
        return self._json("config.json")

    def names(self) -> list[str]:
        return sorted(self._file_of)

    def shapes(self) -> dict[str, list[int]]:
        """Every tensor's shape, read from the safetensors headers (no tensor data)."""
        out = {}
        for file in sorted(set(self._file_of.values())):
            handle = self._open(file)
            out.update({name: list(handle.get_slice(name).get_shape()) for name in handle.keys()})
        return out

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self._file_of:
            raise CheckpointError(f"checkpoint {self.path} has no tensor {name}")
        file = self._file_of[name]
        # A fresh handle per read, and a copy out of it: safetensors maps the whole file and returns
        # views of the mapping, whose touched pages count in RSS for as long as a handle or view
        # lives (+400 MB per 7B block read). Dropping both unmaps them.
        handle = self._open(file)
        try:
            return handle.get_tensor(name).clone()
        except Exception as e:
            raise CheckpointError(f"cannot read tensor {name} from {self.path / file}: {e}") from e


def _fill(module: nn.Module, reader: CheckpointReader, prefix: str, dtype: torch.dtype, device) -> None:
    """Assign every parameter of `module` from the checkpoint tensors named `prefix + key`."""
    tensors = {}
    for key, expected in module.state_dict().items():
        t = reader.tensor(prefix + key)
        if t.shape != expected.shape:
            raise CheckpointError(
                f"{prefix + key} in {reader.path} has shape {tuple(t.shape)}, expected {tuple(expected.shape)}"
            )
        tensors[key] = t.to(device=device, dtype=dtype)
    module.load_state_dict(tensors, strict=True, assign=True)
    module.requires_grad_(False)  # inference and calibration only: no autograd graphs to hold


def load_block(
    reader: CheckpointReader, config: ModelConfig, i: int, dtype=torch.float32, device="cpu"
) -> Block:
    """Block i with its weights; reads only `model.layers.{i}.*`."""
    with torch.device("meta"):
        block = Block(config)
    _fill(block, reader, f"model.layers.{i}.", dtype, device)
    return block


def load_skeleton(
    reader: CheckpointReader, config: ModelConfig, dtype=torch.float32, device="cpu"
) -> CausalLM:
    """CausalLM with embeddings, final norm and lm_head loaded; its blocks stay on the meta device."""
    with torch.device("meta"):
        model = CausalLM(config)
    _fill(model.model.embed_tokens, reader, "model.embed_tokens.", dtype, device)
    _fill(model.model.norm, reader, "model.norm.", dtype, device)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight  # HF omits lm_head.weight when tied
    else:
        _fill(model.lm_head, reader, "lm_head.", dtype, device)
    return model


def load_model(
    name_or_path: str | Path, dtype=torch.float32, device="cpu"
) -> tuple[CausalLM, ModelConfig]:
    reader = CheckpointReader(resolve_model(name_or_path))
    config = ModelConfig.from_hf(reader.config())
    model = load_skeleton(reader, config, dtype, device)
    for i in range(config.num_layers):
        model.model.layers[i] = load_block(reader, config, i, dtype, device)
    return model.eval(), config


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resolve_model(path)))
