"""What the engine needs to know about an artifact: its model (executor-built), KV format, tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from qoq.engine.kv_float import FloatKVCache
from qoq.recipe import Format
from qoq.runtime_cuda.kv_cache import KV4Cache, KV4Format


def artifact_format(art) -> Format:
    return Format(**art.manifest["recipe"]["format"])


def outside_k_biases(layers, fmt: Format) -> list[torch.Tensor | None]:
    """Per block, the k bias a KV4 format keeps outside the cache (design §3.4) as fp32 [Hkv, D], else None."""
    keep = fmt.kv_bits == 4 and fmt.k_bias_outside_cache
    return [a.k_proj.bias.float().view(a.num_kv_heads, a.head_dim) if keep and a.k_proj.bias is not None else None
            for a in (block.self_attn for block in layers)]


def kv_cache(config, kv4: bool, budget_bytes: int, float_dtype: torch.dtype, device):
    """The paged K/V pools of every layer: KV4 pages, or unquantized ones in `float_dtype`."""
    if kv4:
        return KV4Cache(KV4Format(config.num_layers, config.num_kv_heads, config.head_dim), budget_bytes, device)
    return FloatKVCache(config.num_layers, config.num_kv_heads, config.head_dim, budget_bytes, float_dtype, device)


def rope_tables(inv_freq: torch.Tensor, max_positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos, sin [max_positions, D/2], computed as models.rope.RotaryTable does (same values)."""
    freqs = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    return freqs.cos().to(device), freqs.sin().to(device)


def load_tokenizer_or_none(path: str | Path):
    path = Path(path)
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def eos_token_ids(path: str | Path, tokenizer, config: dict) -> set[int]:
    ids: set[int] = set()
    for source in (_json(Path(path) / "generation_config.json"), config):
        eos = source.get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}
