"""`qoq generate ARTIFACT --prompt TEXT`: stream a completion to the terminal (or print one JSON object)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer

QUANTIZATION_HELP = ("fp8: quantize an fp16 artifact's linears to W8A8 e4m3 at load (cuda backend; "
                     "vLLM's --quantization fp8)")


def generate(
    artifact: Path = typer.Argument(..., help="artifact directory"),
    prompt: str = typer.Option(..., help="the prompt text"),
    max_tokens: int = typer.Option(128, help="tokens to generate at most"),
    temperature: float = typer.Option(0.0, help="0: greedy"),
    top_p: float = typer.Option(1.0),
    top_k: int = typer.Option(0),
    seed: Optional[int] = typer.Option(None, help="sampling seed (same seed, same text)"),
    stop: Optional[list[str]] = typer.Option(None, help="stop string (repeatable)"),
    chat: bool = typer.Option(False, help="wrap the prompt in the tokenizer's chat template"),
    backend: str = typer.Option("reference", help="reference (CPU) or cuda"),
    kv_budget: Optional[int] = typer.Option(None, help="KV cache bytes (default: CPU 256 MiB, GPU 90% of free)"),
    quantization: Optional[str] = typer.Option(None, help=QUANTIZATION_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of streaming"),
):
    """Generate text from an artifact with the inference engine."""
    from qoq.engine import LLMEngine, SamplingParams

    t0 = time.perf_counter()
    engine = LLMEngine(artifact, backend=backend, kv_budget=kv_budget, quantization=quantization)
    loaded = time.perf_counter()
    ids = prompt_ids(engine, prompt, chat)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                            stop=list(stop or []))
    first: list[float] = []

    def on_output(out):
        if not first:
            first.append(time.perf_counter())
        if not as_json and out.text_delta:
            sys.stdout.write(out.text_delta)
            sys.stdout.flush()

    start = time.perf_counter()
    result = engine.generate([ids], params, on_output=on_output)[0]
    end = time.perf_counter()
    n = len(result.token_ids)
    timings = {"load_s": loaded - t0, "ttft_s": (first[0] if first else end) - start, "total_s": end - start,
               "decode_tok_per_s": (n - 1) / (end - first[0]) if first and n > 1 and end > first[0] else None}
    if as_json:
        print(json.dumps({"text": result.text, "prompt_token_ids": ids, "token_ids": result.token_ids,
                          "finish_reason": result.finish_reason, "timings": timings}, indent=2))
    else:
        sys.stdout.write("\n")
        print(f"[{n} tokens, {result.finish_reason}, {timings['total_s']:.2f} s]", file=sys.stderr)


def prompt_ids(engine, prompt: str, chat: bool) -> list[int]:
    if not chat:
        return engine.encode(prompt)
    tok = engine.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise ValueError(f"{engine.artifact_dir}: the tokenizer has no chat template (drop --chat)")
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
