"""`qoq eval`: load an artifact (through the executor) or a float model, then run a task on it.

Everything that can be checked cheaply is checked before the model is loaded: the backend, the
artifact's manifest, the data source and `--windows` (which needs the tokenized split only)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from qoq.progress import StepProgress


class EvalError(ValueError):
    """An evaluation that cannot run or whose result is not a number."""


def check_backend(backend: str) -> None:
    from qoq.executor import LINEAR_BACKENDS

    LINEAR_BACKENDS.get(backend)  # unknown names: KeyError listing the known ones
    if backend == "cuda" and not torch.cuda.is_available():
        raise EvalError("--backend cuda needs an NVIDIA GPU with CUDA, and torch sees none; "
                        "use --backend reference")


def load_for_eval(model: str, backend: str = "reference"):
    """(callable model, tokenizer, description) for an artifact dir or an unquantized model."""
    from qoq.export.artifact import is_artifact
    from qoq.models.loader import load_model, load_tokenizer, resolve_model

    path = Path(model)
    if is_artifact(path):  # qoq.json or a config.json marking it: must verify, never read as a plain model
        from qoq.executor import load_artifact_model

        lm, art = load_artifact_model(path, backend=backend)
        return lm, load_tokenizer(path), {"model": str(path), "artifact": True, "recipe": art.manifest["recipe"]["name"],
                                          "backend": backend, "source": art.manifest.get("source", {}).get("model")}
    lm, _ = load_model(model, dtype=torch.float32)
    return lm.eval(), load_tokenizer(resolve_model(model)), {"model": model, "artifact": False,
                                                           "recipe": None, "backend": "float32"}


def _tokenizer_dir(model: str) -> Path:
    from qoq.export.artifact import is_artifact, load_manifest
    from qoq.models.loader import resolve_model

    if is_artifact(model):
        load_manifest(model)  # schema and version, before anything else is read
        return Path(model)
    return resolve_model(model)


def evaluate_task(task: str, model: str, *, windows: int | None = None, backend: str = "reference",
                  data_dir: Path | None = None, limit: int | None = None, include_path: Path | None = None,
                  show_progress: bool = True) -> dict:
    check_backend(backend)
    if windows is not None and windows < 1:
        raise EvalError(f"--windows must be >= 1, got {windows}")
    if task == "wikitext2":
        from qoq.calibration import load_spec, source
        from qoq.eval.perplexity import TEST_SPEC, wikitext2_perplexity, wikitext2_token_ids, window_plan
        from qoq.models.loader import load_tokenizer

        source(load_spec(TEST_SPEC), data_dir)  # a missing local split fails now, naming the path
        ids = wikitext2_token_ids(load_tokenizer(_tokenizer_dir(model)), data_dir)  # sizes the bar, feeds the eval
        plan = window_plan(ids.numel(), windows=windows)  # an impossible --windows fails before loading
        lm, tokenizer, about = load_for_eval(model, backend)
        forward = _forward(lm)
        bar = StepProgress("wikitext2", plan["windows"], ("window", "ppl so far"), enabled=show_progress)
        with bar.running():
            result = wikitext2_perplexity(forward, tokenizer, data_dir=data_dir, windows=windows, ids=ids,
                                          progress=lambda i, _n, ppl: bar.row(i, ppl))
        if not math.isfinite(result["ppl"]):
            raise EvalError(f"perplexity of {model} is {result['ppl']}: the model computes non-finite "
                            "logits (a corrupt or numerically broken model)")
        return {**about, **result}

    from qoq.eval.lm_eval_adapter import run_lm_eval

    lm, tokenizer, about = load_for_eval(model, backend)
    tasks = [t.strip() for t in task.split(",") if t.strip()]
    result = run_lm_eval(_forward(lm), tokenizer, tasks, limit=limit, include_path=include_path)
    return {**about, "task": task, **result}


def _forward(lm):
    device = next(lm.parameters()).device

    def forward(ids):  # the evaluators pass CPU token ids
        return lm(ids.to(device)).float().cpu()

    return forward
