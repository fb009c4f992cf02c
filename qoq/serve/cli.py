"""`qoq serve ARTIFACT_DIR`: the OpenAI-compatible server (needs the `serve` extra: FastAPI, uvicorn)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from qoq.engine.generate_cli import QUANTIZATION_HELP


def serve(
    artifact: Path = typer.Argument(..., help="artifact directory"),
    host: str = typer.Option("127.0.0.1", help="address to bind (0.0.0.0: every interface)"),
    port: int = typer.Option(8000, help="TCP port"),
    backend: str = typer.Option("auto", help="cuda, reference (CPU), or auto (cuda when a GPU is present)"),
    max_num_seqs: int = typer.Option(256, help="requests in the running batch at most"),
    max_num_batched_tokens: int = typer.Option(2048, help="tokens per engine step at most (prefill chunk)"),
    kv_budget: Optional[int] = typer.Option(None, help="KV cache bytes (default: CPU 256 MiB, GPU 90% of free)"),
    max_model_len: Optional[int] = typer.Option(None, help="context length cap (default: the model's)"),
    quantization: Optional[str] = typer.Option(None, help=QUANTIZATION_HELP),
    api_key: Optional[str] = typer.Option(None, envvar="QOQ_API_KEY",
                                          help="require 'Authorization: Bearer KEY' (all but /health)"),
    served_model_name: Optional[str] = typer.Option(None, help="the model id clients name (default: ARTIFACT)"),
    drain_timeout: float = typer.Option(30.0, help="SIGTERM: seconds to let running requests finish"),
    log_level: str = typer.Option("info", help="debug, info, warning, error"),
):
    """Serve an artifact over an OpenAI-compatible HTTP API (completions, chat, models, health, metrics)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ImportError(f"qoq serve needs FastAPI and uvicorn: pip install 'qoq[serve]' ({e})") from None
    from qoq.engine import LLMEngine
    from qoq.serve.server import run_server

    if backend == "auto":
        import torch

        backend = "cuda" if torch.cuda.is_available() else "reference"
    engine = LLMEngine(artifact, backend=backend, kv_budget=kv_budget, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                       quantization=quantization)
    run_server(engine, served_model_name or str(artifact), host, port, api_key, drain_timeout, log_level)
