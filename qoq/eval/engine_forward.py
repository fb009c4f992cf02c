"""`qoq eval --backend cuda` on an artifact: the logits come from the serving engine's CUDA runner, so
what is evaluated is what is served.

Each window ([1, T] token ids) is prefilled through `LLMEngine.prompt_logits` in chunks of the engine's
prefill size (max_num_batched_tokens): the fused W4A8 layers write K/V to real KV4 pages with
`rope_kv4_write`, later chunks attend over those pages read back, and the logits at every position come
back ([1, T, V] fp32, on the runner's device); then the window's pages are freed. The perplexity and
lm-eval arithmetic stay in `perplexity.py` / `lm_eval_adapter.py`, which take any such callable.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from qoq.engine.block_manager import pages_for
from qoq.runtime_cuda.attention_reference import PAGE_TOKENS

DEFAULT_PREFILL_CHUNK = 2048  # LLMEngine's default max_num_batched_tokens


class EngineForward:
    """input_ids [1, T] -> logits fp32 [1, T, V] through an engine's runner (`prompt_logits`)."""

    def __init__(self, engine, chunk_tokens: int | None = None):
        self.engine, self.chunk_tokens = engine, chunk_tokens

    @property
    def device(self) -> torch.device:  # qoq.eval.model_device puts the token ids here
        return self.engine.runner.device

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dim() != 2 or ids.shape[0] != 1:
            raise ValueError(f"the engine scores one sequence at a time: ids [1, T], got {list(ids.shape)}")
        return self.engine.prompt_logits(ids[0].tolist(), self.chunk_tokens)[None]


def _config(artifact_dir):
    from qoq.models.config import ModelConfig

    return ModelConfig.from_hf(json.loads((Path(artifact_dir) / "config.json").read_text()))


def model_positions(artifact_dir: str | Path) -> int:
    """The artifact's max_position_embeddings: the longest sequence the runner's RoPE tables hold."""
    return _config(artifact_dir).max_position_embeddings


def kv_budget_for(artifact_dir: str | Path, max_tokens: int) -> int:
    """Bytes of KV pages for one sequence of max_tokens tokens plus the runner's scratch page (fp16
    pages for an artifact without KV4, as the CUDA runner keeps them)."""
    from qoq.export.artifact import load_manifest
    from qoq.recipe import Format
    from qoq.runtime_cuda.kv_cache import KV4Format

    cfg = _config(artifact_dir)
    fmt = Format(**load_manifest(artifact_dir)["recipe"].get("format", {}))
    if fmt.kv_bits == 4:
        per_token = KV4Format(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim).bytes_per_token
    else:
        per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    return (pages_for(max_tokens) + 1) * PAGE_TOKENS * per_token


def load_engine_for_eval(artifact_dir: str | Path, max_tokens: int, prefill_chunk: int | None = None,
                         tokenizer=None, **runner_options):
    """(EngineForward, LLMEngine) for scoring sequences of up to max_tokens tokens on the CUDA runner.
    `runner_options` reach CudaRunner (device="cpu", ops="reference" on the CPU tests); the KV budget
    defaults to one sequence's pages (no graphs: eval only prefills)."""
    from qoq.engine import LLMEngine

    runner_options.setdefault("cuda_graphs", False)
    kv_budget = runner_options.pop("kv_budget", None) or kv_budget_for(artifact_dir, max_tokens)
    engine = LLMEngine(artifact_dir, backend="cuda", kv_budget=kv_budget,
                       max_num_batched_tokens=prefill_chunk or DEFAULT_PREFILL_CHUNK, tokenizer=tokenizer,
                       **runner_options)
    if max_tokens > engine.max_model_len:
        raise ValueError(f"windows of {max_tokens} tokens exceed the model's {engine.max_model_len} positions")
    return EngineForward(engine), engine
