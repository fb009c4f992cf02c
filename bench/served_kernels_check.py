"""An artifact served on the CUDA kernels against the same runner on its torch reference ops, on one GPU: greedy
continuations (decode attention, CUDA graphs) and their logits.

    PYTHONPATH=. python bench/served_kernels_check.py ARTIFACT --out $OUT [--max-tokens 48]

Both engines get the same prompts (code and prose, batched together) and greedy sampling; the kernels run as
served (CUDA graphs on), the reference ops eagerly. Per prompt: the tokens equal up to the first position where
the logits moved enough to swap the reference's top two (a flip the arithmetic allows), the largest relative
logit difference up to there, and the continuations' text. Writes served_kernels_check.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qoq.engine import LLMEngine, SamplingParams  # noqa: E402

PROMPTS = [
    "def quicksort(xs):\n",
    "The capital of France is",
    "# Read a CSV file with pandas and print the mean of each column\nimport pandas as pd\n",
    "Once upon a time, in a small village by the sea,",
    "class LinkedList:\n    def __init__(self):\n",
    "SELECT name, COUNT(*) FROM orders",
]


def agree_until(ref, got) -> int:
    """Tokens equal up to the first position where the logits' difference could swap the reference's top two."""
    for i, (x, y, la, lb) in enumerate(zip(ref.token_ids, got.token_ids, ref.logits, got.logits)):
        top2 = la.topk(2).values
        if (top2[0] - top2[1]).item() <= 2 * (la - lb).abs().max().item():
            return i
        if x != y:
            return -1 - i  # a swap the logits did not allow: the kernels disagree
    return len(ref.token_ids)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--kv-budget-mib", type=int, default=2048)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    kw = dict(backend="cuda", kv_budget=args.kv_budget_mib << 20, record_logits=True)
    start = time.time()
    want = LLMEngine(args.artifact, ops="reference", cuda_graphs=False, **kw).generate(PROMPTS, params)
    torch.cuda.empty_cache()
    engine = LLMEngine(args.artifact, **kw)
    got = engine.generate(PROMPTS, params)
    rows = []
    for prompt, w, g in zip(PROMPTS, want, got):
        n = agree_until(w, g)
        upto = abs(n + 1) if n < 0 else n + 1
        diffs = [((a - b).norm() / b.norm()).item() for a, b in list(zip(g.logits, w.logits))[:upto]]
        rows.append({"prompt": prompt, "agree_until": n, "tokens": len(w.token_ids),
                     "max_rel_logit_diff": max(diffs), "first_rel_logit_diff": diffs[0],
                     "reference_text": engine.tokenizer.decode(w.token_ids),
                     "kernels_text": engine.tokenizer.decode(g.token_ids)})
        print(json.dumps({k: rows[-1][k] for k in ("agree_until", "tokens", "max_rel_logit_diff")}), flush=True)
    summary = {
        "artifact": str(args.artifact), "gpu": torch.cuda.get_device_name(),
        "k_bias_outside_cache": any(b is not None for b in engine.runner.k_bias),
        "cuda_graphs": engine.runner.graphs is not None,
        "disagreements": sum(r["agree_until"] < 0 for r in rows),
        "min_agree_until": min(r["agree_until"] for r in rows),
        "max_rel_logit_diff": max(r["max_rel_logit_diff"] for r in rows),
        "seconds": round(time.time() - start, 1),
    }
    result = {"summary": summary, "command": " ".join(sys.argv), "rows": rows}
    (args.out / "served_kernels_check.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
