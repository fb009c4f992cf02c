"""WikiText-2 perplexity, the GPTQ convention (docs/design.md §6; ../shared/data/README.md).

text = "\\n\\n".join(rows of the raw test split), tokenized once with the tokenizer's defaults, cut into
non-overlapping seq_len windows (tail dropped); each window's loss is the mean cross-entropy over its
seq_len - 1 shifted targets; ppl = exp(mean of window losses).
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch
import torch.nn.functional as F

from qoq.calibration import load_spec, load_texts
from qoq.eval import model_device

PROTOCOL = (
    "GPTQ-style: non-overlapping 2048-token windows of the raw test split joined with \\n\\n, tail dropped"
)
TEST_SPEC = "wikitext2-test"


def wikitext2_text(data_dir=None) -> str:
    """The raw test split's rows joined with "\\n\\n" (local test.jsonl under the data dir, else HF)."""
    return "\n\n".join(load_texts(load_spec(TEST_SPEC), data_dir))


def wikitext2_token_ids(tokenizer, data_dir=None) -> torch.Tensor:
    """Long[N]: the joined text tokenized once with the tokenizer's defaults (BOS if it adds one)."""
    return torch.tensor(tokenizer(wikitext2_text(data_dir), verbose=False)["input_ids"], dtype=torch.long)


def window_plan(total_tokens: int, seq_len: int = 2048, windows: int | None = None) -> dict:
    """How many windows and tokens are evaluated; `windows` takes a prefix of the full-window count."""
    total_windows = total_tokens // seq_len  # the tail (< seq_len tokens) is dropped
    if total_windows == 0:
        raise ValueError(f"{total_tokens} tokens are fewer than one window of seq_len={seq_len}")
    if windows is None:
        windows = total_windows
    if not 1 <= windows <= total_windows:
        raise ValueError(f"windows must be in [1, {total_windows}] for {total_tokens} tokens, got {windows}")
    return {
        "windows": windows,
        "total_windows": total_windows,
        "tokens": windows * seq_len,
        "total_tokens": total_tokens,
        "seq_len": seq_len,
    }


def window_nll(model: Callable, window: torch.Tensor) -> float:
    """Mean cross-entropy (fp32) of one [1, T] window over its T - 1 shifted targets."""
    logits = model(window)  # [1, T, V]
    return F.cross_entropy(logits[0, :-1].float(), window[0, 1:]).item()


def wikitext2_perplexity(
    model: Callable,
    tokenizer,
    data_dir=None,
    windows: int | None = None,
    seq_len: int = 2048,
    progress: Callable[[int, int, float], None] | None = None,
    ids: torch.Tensor | None = None,
) -> dict:
    """Perplexity of `model` (input_ids [1, T] -> logits [1, T, V]); `progress(i, n, running_ppl)`.
    `ids`: the `wikitext2_token_ids` of this tokenizer when the caller already has them."""
    start = time.perf_counter()
    ids = wikitext2_token_ids(tokenizer, data_dir) if ids is None else ids  # [N]
    plan = window_plan(ids.numel(), seq_len, windows)
    device = model_device(model)
    nlls = []
    with torch.inference_mode():
        for i in range(plan["windows"]):
            window = ids[i * seq_len : (i + 1) * seq_len].unsqueeze(0).to(device)  # [1, T]
            nlls.append(window_nll(model, window))
            if progress is not None:
                progress(i + 1, plan["windows"], math.exp(sum(nlls) / len(nlls)))
    return {
        "task": "wikitext2",
        "protocol": PROTOCOL if seq_len == 2048 else PROTOCOL.replace("2048", str(seq_len)),
        "ppl": math.exp(sum(nlls) / len(nlls)),
        **plan,
        "nll_per_window": nlls,
        "seconds": time.perf_counter() - start,
    }
