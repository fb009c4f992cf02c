"""`qoq eval`: load an artifact (through the executor) or a float model, then run a task on it."""

from __future__ import annotations

from pathlib import Path

import torch

from qoq.progress import StepProgress


def load_for_eval(model: str, backend: str = "reference"):
    """(callable model, tokenizer, description) for an artifact dir or an unquantized model."""
    from qoq.models.loader import load_model, load_tokenizer, resolve_model

    path = Path(model)
    if (path / "qoq.json").exists():
        from qoq.executor import load_artifact_model

        lm, art = load_artifact_model(path, backend=backend)
        recipe = art.manifest["recipe"]["name"]
        return lm, load_tokenizer(path), {"model": str(path), "artifact": True, "recipe": recipe,
                                          "backend": backend, "source": art.manifest["source"]["model"]}
    lm, _ = load_model(model, dtype=torch.float32)
    return lm.eval(), load_tokenizer(resolve_model(model)), {"model": model, "artifact": False,
                                                           "recipe": None, "backend": "float32"}


def evaluate_task(task: str, model: str, *, windows: int | None = None, backend: str = "reference",
                  data_dir: Path | None = None, limit: int | None = None, include_path: Path | None = None,
                  show_progress: bool = True) -> dict:
    lm, tokenizer, about = load_for_eval(model, backend)
    device = next(lm.parameters()).device
    def forward(ids):  # noqa: E306  the evaluators pass CPU token ids
        return lm(ids.to(device)).float().cpu()

    if task == "wikitext2":
        from qoq.eval.perplexity import wikitext2_perplexity, wikitext2_token_ids, window_plan

        ids = wikitext2_token_ids(tokenizer, data_dir)  # tokenized once: sizes the bar, feeds the eval
        plan = window_plan(ids.numel(), windows=windows)  # a clear error for an impossible --windows
        bar = StepProgress("wikitext2", plan["windows"], ("window", "ppl so far"), enabled=show_progress)
        with bar.running():
            result = wikitext2_perplexity(forward, tokenizer, data_dir=data_dir, windows=windows, ids=ids,
                                          progress=lambda i, _n, ppl: bar.row(i, ppl))
        return {**about, **result}

    from qoq.eval.lm_eval_adapter import run_lm_eval

    tasks = [t.strip() for t in task.split(",") if t.strip()]
    result = run_lm_eval(forward, tokenizer, tasks, limit=limit, include_path=include_path)
    return {**about, "task": task, **result}
