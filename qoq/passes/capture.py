"""Calibration statistics of one block: what its linears see, gathered with forward hooks."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from qoq.passes.base import BlockContext

CHUNK = 4  # calibration samples per forward


@contextmanager
def _hooks(block: torch.nn.Module, names, fn):
    handles = [block.get_submodule(n).register_forward_hook(lambda m, args, out, n=n: fn(n, args[0]))
               for n in names]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _run(block, inputs: torch.Tensor, position_ids: torch.Tensor) -> None:
    with torch.inference_mode():
        for i in range(0, len(inputs), CHUNK):
            block(inputs[i : i + CHUNK], position_ids)


def input_abs_max(block, inputs: torch.Tensor, position_ids: torch.Tensor, names) -> dict[str, torch.Tensor]:
    """Per input channel max|x| of each named linear: {name: [K]} (streamed, no activations kept)."""
    stats: dict[str, torch.Tensor] = {}

    def record(name, x):  # x [B, T, K]
        m = x.detach().abs().float().amax(dim=(0, 1))
        stats[name] = m if name not in stats else torch.maximum(stats[name], m)

    with _hooks(block, names, record):
        _run(block, inputs, position_ids)
    return stats


def capture_inputs(block, inputs: torch.Tensor, position_ids: torch.Tensor, names,
                   max_tokens: int | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """The inputs each named linear sees: {name: [tokens, K]} fp32, at most `max_tokens` rows (a seeded
    uniform subsample, the same rows for every linear). Only the samples holding kept rows are run."""
    n, t = inputs.shape[:2]
    keep = torch.arange(n * t)  # CPU indices, whatever the inputs' device: the same rows on every device
    if max_tokens is not None and n * t > max_tokens:
        keep = torch.randperm(n * t, generator=torch.Generator().manual_seed(seed))[:max_tokens].sort().values
    samples = torch.unique(keep // t)  # [S] samples that hold kept rows
    rows = [keep[keep // t == s] % t for s in samples]  # kept positions inside each sample
    seen: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    calls = {name: 0 for name in names}

    def record(name, x):  # x [B, T, K]: one chunk of the selected samples; keep only the kept rows
        first = calls[name]
        calls[name] += x.shape[0]
        for b in range(x.shape[0]):
            seen[name].append(x[b, rows[first + b]].detach().float())

    with _hooks(block, names, record):
        _run(block, inputs[samples], position_ids)
    return {name: torch.cat(xs) for name, xs in seen.items()}


# linears that read the same tensor (one quantized input in the runtime) -> the one whose input is captured
SHARED_INPUT = {
    "self_attn.q_proj": "self_attn.q_proj", "self_attn.k_proj": "self_attn.q_proj",
    "self_attn.v_proj": "self_attn.q_proj", "self_attn.o_proj": "self_attn.o_proj",
    "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.gate_proj", "mlp.down_proj": "mlp.down_proj",
}


def capture_linear_inputs(block: torch.nn.Module, ctx: BlockContext, max_tokens: int) -> dict[str, torch.Tensor]:
    """Calibration inputs [tokens, K] of each distinct linear input, keyed by SHARED_INPUT's names
    (a seeded subsample of at most max_tokens rows, different per block)."""
    owners = sorted(set(SHARED_INPUT.values()))
    return capture_inputs(block, ctx.inputs, ctx.position_ids, owners, max_tokens,
                          seed=ctx.recipe.calibration.seed + ctx.index)


class OutputError:
    """Per output channel squared output error ‖X·ΔWᵀ‖² [N], through the Gram matrix XᵀX when that is
    cheaper (fewer input channels than tokens)."""

    def __init__(self, x: torch.Tensor):  # [T, K]
        self.gram = x.T @ x if x.shape[1] < x.shape[0] else None  # [K, K]
        self.x = None if self.gram is not None else x

    def __call__(self, delta: torch.Tensor) -> torch.Tensor:  # [N, K] -> [N]
        if self.gram is not None:
            return ((delta @ self.gram) * delta).sum(dim=1).clamp_min(0)  # fp32 rounding can dip below 0
        return (self.x @ delta.T).pow(2).sum(dim=0)
