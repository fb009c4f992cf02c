"""Checks run before any long work, so a run never fails after its calibration: the device exists, the
output can be written and replaced, the disk has room for the artifact, the checkpoint has every tensor
(with the right shape) the model needs, and the calibration activations fit in memory (the GPU's too)."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from qoq.export.replace import check_replaceable
from qoq.models.config import ModelConfig
from qoq.models.loader import CheckpointError, CheckpointReader
from qoq.recipe import Recipe

BLOCK_LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight$")
ACTIVATION_COPIES = 4  # calibration inputs, float reference, quantized output, and the chunks in flight
SPACE_MARGIN = 1.02  # the estimate leaves out config, tokenizer and manifest: a little headroom


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def check_output(output: Path, overwrite: bool, model_dir: Path) -> None:
    """The output can be replaced (see `check_replaceable`) and its parent written."""
    check_replaceable(output, overwrite, protect=[model_dir])
    existing = output.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"cannot create {output}: {existing} is not a directory")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as e:
        raise PermissionError(f"cannot write the output {output}: {existing} is not writable "
                              f"({e.strerror or e})") from None


def estimate_artifact_bytes(shapes: dict[str, list[int]], recipe: Recipe, tied: bool) -> int:
    """Bytes the artifact will take: quantized linears at weight_bits / 8 bytes a weight plus their
    scales (an upper bound for every scheme), the rest fp16."""
    total = 0
    g = recipe.format.group_size
    for name, shape in shapes.items():
        numel = _numel(shape)
        if recipe.quantizes_weights and BLOCK_LINEAR.match(name) and len(shape) == 2:
            n, k = shape
            total += numel * recipe.format.weight_bits // 8 + 4 * n + (2 * numel // g if g > 0 else 0)
        else:
            total += 2 * numel
    if tied and "rotation" in recipe.passes:  # rotation unties the embeddings: lm_head is written too
        total += 2 * sum(_numel(s) for n, s in shapes.items() if n == "model.embed_tokens.weight")
    return total


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


DEVICE_FORM = re.compile(r"^(cpu|cuda)(:\d+)?$")


def check_device(device):
    """The torch.device a quantization runs on, from 'cpu', 'cuda' or 'cuda:N' (a string or a
    torch.device); a CUDA device must be visible to this process. Called before anything else is read."""
    import torch

    text = str(device)
    if not DEVICE_FORM.match(text) or text.startswith("cpu:"):
        raise ValueError(f"device '{text}' is not one of cpu, cuda, cuda:N")
    dev = torch.device(text)
    if dev.type == "cpu":
        return dev
    if torch.version.cuda is None:
        raise RuntimeError(f"device {text}: this torch build has no CUDA support (torch {torch.__version__})")
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {text}: no CUDA GPU is available to this process "
                           "(torch.cuda.is_available() is False)")
    count = torch.cuda.device_count()
    index = 0 if dev.index is None else dev.index
    if index >= count:
        raise RuntimeError(f"device {text}: only {count} CUDA device(s) are visible (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def check_device_memory(device, cfg: ModelConfig, samples: int, seq_len: int) -> None:
    """On a GPU: the calibration activations and one fp32 block (with a working copy) fit in its free
    memory."""
    if device.type != "cuda":
        return
    import torch

    block = cfg.hidden_size * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim \
        + 3 * cfg.hidden_size * cfg.intermediate_size  # parameters
    needed = ACTIVATION_COPIES * samples * seq_len * cfg.hidden_size * 4 + 2 * 4 * block
    free, _ = torch.cuda.mem_get_info(device)
    if needed > free:
        raise ValueError(
            f"quantizing on {device} needs about {_gib(needed)} of GPU memory (calibration activations "
            f"{samples} x {seq_len} x {cfg.hidden_size} and one fp32 block), but {_gib(free)} is free; lower "
            "the recipe's [calibration] samples or seq_len, or use another device")


def check_space(output: Path, needed: int) -> None:
    existing = output.parent
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < needed * SPACE_MARGIN:
        raise OSError(f"not enough disk space for {output}: the artifact needs about {_gib(needed)}, "
                      f"{_gib(free)} is free")


def check_checkpoint(reader: CheckpointReader, cfg: ModelConfig, shapes: dict[str, list[int]], model: str) -> None:
    """Every tensor the model needs is in the checkpoint, with the shape the config implies."""
    import torch

    from qoq.models.llama import CausalLM

    with torch.device("meta"):
        lm = CausalLM(cfg)
    missing, wrong = [], []
    for name, t in lm.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if name not in shapes:
            missing.append(name)
        elif list(t.shape) != shapes[name]:
            wrong.append(f"{name} has shape {shapes[name]}, the config implies {list(t.shape)}")
    if missing:
        raise CheckpointError(f"checkpoint {model} has no tensor {missing[0]} ({len(missing)} missing); "
                              "nothing was run")
    if wrong:
        raise CheckpointError(f"checkpoint {model}: {wrong[0]} ({len(wrong)} mismatched); nothing was run")


def available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(cfg: ModelConfig, samples: int, seq_len: int) -> None:
    needed = ACTIVATION_COPIES * samples * seq_len * cfg.hidden_size * 4
    available = available_memory()
    if available is not None and needed > available:
        raise ValueError(
            f"calibration needs about {_gib(needed)} for activations ({samples} samples x {seq_len} tokens x "
            f"hidden {cfg.hidden_size}, fp32), but {_gib(available)} of memory is available; lower the "
            "recipe's [calibration] samples or seq_len")


def run_all(model: str, model_dir: Path, reader: CheckpointReader, cfg: ModelConfig, recipe: Recipe,
            output: Path, overwrite: bool, device=None) -> None:
    check_output(output, overwrite, model_dir)
    shapes = reader.shapes()
    check_checkpoint(reader, cfg, shapes, model)
    check_space(output, estimate_artifact_bytes(shapes, recipe, cfg.tie_word_embeddings))
    check_memory(cfg, recipe.calibration.samples, recipe.calibration.seq_len)
    if device is not None:
        check_device_memory(device, cfg, recipe.calibration.samples, recipe.calibration.seq_len)

