"""`qoq eval`: load an artifact or a float model, then run a task on it.

An artifact runs on the executor (`--backend reference`: the integer-exact CPU reference) or, with
`--backend cuda`, on the serving engine's CUDA runner (`engine_forward.py`: KV4 pages, chunked prefill),
so what is evaluated is what is served.

Everything that can be checked cheaply is checked before the model is loaded: the backend, the
artifact's manifest, the data source and `--windows` (which needs the tokenized split only)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from qoq.progress import StepProgress


class EvalError(ValueError):
    """An evaluation that cannot run or whose result is not a number."""


def check_backend(backend: str, on_gpu: bool = True) -> None:
    from qoq.executor import LINEAR_BACKENDS

    LINEAR_BACKENDS.get(backend)  # unknown names: KeyError listing the known ones
    if backend == "cuda" and on_gpu and not torch.cuda.is_available():
        raise EvalError("--backend cuda needs an NVIDIA GPU with CUDA, and torch sees none; "
                        "use --backend reference")


def check_eval_device(device: str | None, backend: str, model: str) -> str:
    """The device the reference backend or an unquantized model runs on (default cpu), checked before
    anything is read; the cuda backend runs the engine on the current GPU and takes none."""
    from qoq.export.artifact import is_artifact
    from qoq.preflight import check_device

    if device is None:
        return "cpu"
    if backend == "cuda" and is_artifact(Path(model)):
        raise EvalError("--device applies to --backend reference and unquantized models; --backend cuda runs "
                        "the engine on the current GPU (choose it with CUDA_VISIBLE_DEVICES)")
    try:
        return str(check_device(device))
    except (ValueError, RuntimeError) as e:
        raise EvalError(str(e)) from e


def load_for_eval(model: str, backend: str = "reference", quantize: frozenset[str] | None = None,
                  device: str = "cpu"):
    """(callable model, tokenizer, description) for an artifact dir or an unquantized model; `quantize`:
    the artifact's quantizers to run (qoq/executor/overrides.py), None: its own; `device`: where the
    fp32 model runs (the reference backend's arithmetic is the same torch ops on a GPU)."""
    from qoq.export.artifact import is_artifact
    from qoq.models.loader import load_model, load_tokenizer, resolve_model

    path = Path(model)
    if is_artifact(path):  # qoq.json or a config.json marking it: must verify, never read as a plain model
        from qoq.executor import load_artifact_model

        lm, art = load_artifact_model(path, backend=backend, quantize=quantize, device=device, dtype=torch.float32)
        about = {"model": str(path), "artifact": True, "recipe": art.manifest["recipe"]["name"],
                 "backend": backend, "device": device, "source": art.manifest.get("source", {}).get("model")}
        if quantize is not None:  # only then: the plain eval's JSON keeps its keys
            about["quantize"] = sorted(quantize)
        return lm, load_tokenizer(path), about
    lm, _ = load_model(model, dtype=torch.float32)
    return lm.to(device).eval(), load_tokenizer(resolve_model(model)), {
        "model": model, "artifact": False, "recipe": None, "backend": "float32", "device": device}


def _tokenizer_dir(model: str) -> Path:
    from qoq.export.artifact import is_artifact, load_manifest
    from qoq.models.loader import resolve_model

    if is_artifact(model):
        load_manifest(model)  # schema and version, before anything else is read
        return Path(model)
    return resolve_model(model)


def load_engine_for_eval(model: str, max_tokens: int, prefill_chunk: int | None = None, **runner_options):
    """(callable model, tokenizer, description): an artifact on the engine's CUDA runner."""
    from qoq.eval.engine_forward import load_engine_for_eval as load
    from qoq.export.artifact import load_manifest
    from qoq.models.loader import load_tokenizer

    manifest = load_manifest(model)
    tokenizer = load_tokenizer(Path(model))
    try:
        forward, engine = load(model, max_tokens, prefill_chunk, tokenizer=tokenizer, **runner_options)
    except ValueError as e:
        raise EvalError(str(e)) from e
    return forward, tokenizer, {"model": str(model), "artifact": True, "recipe": manifest["recipe"]["name"],
                                "backend": "cuda", "source": manifest.get("source", {}).get("model"),
                                "engine": {"prefill_chunk": engine.scheduler.max_num_batched_tokens,
                                           "kv_pages": engine.blocks.num_pages}}


def check_quantize_override(model: str, backend: str, quantize: str | None) -> frozenset[str] | None:
    """The parsed --quantize set, refused in one line (before anything heavy is read) when the backend,
    the model or the artifact's format cannot run it."""
    if quantize is None:
        return None
    from qoq.executor.build import manifest_format
    from qoq.executor.overrides import check_quantize, parse_quantize
    from qoq.export.artifact import is_artifact, load_manifest

    wanted = parse_quantize(quantize)
    if backend != "reference":
        raise EvalError(f"--quantize runs on --backend reference only (the {backend} backend serves the "
                        "artifact's own quantizers)")
    if not is_artifact(Path(model)):
        raise EvalError(f"--quantize needs a qoq artifact; {model} is an unquantized model (quantize it with "
                        "a recipe first)")
    fmt = manifest_format(load_manifest(model), model)
    check_quantize(fmt, wanted, str(model))
    return wanted


def _load(model: str, backend: str, max_tokens: int, prefill_chunk: int | None, engine_options: dict,
          quantize: frozenset[str] | None = None, device: str = "cpu"):
    """(callable ids [1, T] -> logits [1, T, V], tokenizer, description)."""
    from qoq.export.artifact import is_artifact

    if backend == "cuda" and is_artifact(Path(model)):
        return load_engine_for_eval(model, max_tokens, prefill_chunk, **engine_options)
    lm, tokenizer, about = load_for_eval(model, backend, quantize, device)
    return _forward(lm), tokenizer, about


def evaluate_task(task: str, model: str, *, windows: int | None = None, backend: str = "reference",
                  data_dir: Path | None = None, limit: int | None = None, include_path: Path | None = None,
                  show_progress: bool = True, seq_len: int = 2048, prefill_chunk: int | None = None,
                  engine_options: dict | None = None, quantize: str | None = None, device: str | None = None
                  ) -> dict:
    """`seq_len`: wikitext2's window length (the protocol's 2048 by default); `prefill_chunk`: the
    engine's prefill chunk with `backend="cuda"` (default 2048: one chunk per protocol window);
    `engine_options`: CudaRunner options (the CPU tests: device="cpu", ops="reference"); `quantize`:
    'weights,activations,kv' or a subset, or 'none' (an artifact on the reference backend; default: the
    artifact's own quantizers); `device`: where the reference backend or an unquantized model runs
    (cpu, cuda, cuda:N; default cpu)."""
    engine_options = dict(engine_options or {})
    device = check_eval_device(device, backend, model)
    check_backend(backend, on_gpu=engine_options.get("device", "cuda") != "cpu")
    wanted = check_quantize_override(model, backend, quantize)
    if windows is not None and windows < 1:
        raise EvalError(f"--windows must be >= 1, got {windows}")
    if seq_len < 2:
        raise EvalError(f"--seq-len must be >= 2, got {seq_len}")
    if task == "wikitext2":
        from qoq.calibration import load_spec, source
        from qoq.eval.perplexity import TEST_SPEC, wikitext2_perplexity, wikitext2_token_ids, window_plan
        from qoq.models.loader import load_tokenizer

        source(load_spec(TEST_SPEC), data_dir)  # a missing local split fails now, naming the path
        ids = wikitext2_token_ids(load_tokenizer(_tokenizer_dir(model)), data_dir)  # sizes the bar, feeds the eval
        plan = window_plan(ids.numel(), seq_len, windows)  # an impossible --windows fails before loading
        forward, tokenizer, about = _load(model, backend, seq_len, prefill_chunk, engine_options, wanted, device)
        bar = StepProgress("wikitext2", plan["windows"], ("window", "ppl so far"), enabled=show_progress)
        with bar.running():
            result = wikitext2_perplexity(forward, tokenizer, data_dir=data_dir, windows=windows, ids=ids,
                                          seq_len=seq_len, progress=lambda i, _n, ppl: bar.row(i, ppl))
        if not math.isfinite(result["ppl"]):
            raise EvalError(f"perplexity of {model} is {result['ppl']}: the model computes non-finite "
                            "logits (a corrupt or numerically broken model)")
        return {**about, **result}

    from qoq.eval.lm_eval_adapter import run_lm_eval
    from qoq.export.artifact import is_artifact

    max_length = 2048  # run_lm_eval's default; the engine's positions bound it
    if backend == "cuda" and is_artifact(Path(model)):
        from qoq.eval.engine_forward import model_positions

        max_length = min(max_length, model_positions(model))
    forward, tokenizer, about = _load(model, backend, max_length, prefill_chunk, engine_options, wanted, device)
    tasks = [t.strip() for t in task.split(",") if t.strip()]
    result = run_lm_eval(forward, tokenizer, tasks, limit=limit, include_path=include_path, max_length=max_length)
    return {**about, "task": task, **result}


def _forward(lm):
    device = next(lm.parameters()).device

    def forward(ids):  # the evaluators pass CPU token ids
        return lm(ids.to(device)).float().cpu()

    return forward
