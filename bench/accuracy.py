"""QoQ ablation on SmolLM2-135M: WikiText-2 perplexity as passes are added one at a time (group 64),
next to FP16, RTN (g64 and per-channel) and full QoQ per-channel — every row on the same windows.

    python bench/accuracy.py --windows 20

Writes bench/results/ablation.{json,md,png}. Each row quantizes with a recipe derived from the shipped
one (same format and calibration, a prefix of its passes) and evaluates the artifact with the
integer-exact executor, each in its own process.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.qoq_runs import qoq, write_recipe
from qoq.recipe import RECIPE_DIR

# (row label, base recipe, passes or None for the recipe's own)
ROWS = [
    ("FP16", "fp16", None),
    ("RTN g64", "w4a8kv4g64-rtn", None),
    ("RTN per-channel", "w4a8kv4-rtn", None),
    ("+ rotation", "w4a8kv4g64", ["rotation", "rtn"]),
    ("+ SmoothAttention", "w4a8kv4g64", ["rotation", "smooth_attention", "rtn"]),
    ("+ smoothing", "w4a8kv4g64", ["rotation", "smooth_attention", "smooth_down", "rtn"]),
    ("+ reorder", "w4a8kv4g64", ["rotation", "reorder", "smooth_attention", "smooth_down", "rtn"]),
    ("+ clipping", "w4a8kv4g64", ["rotation", "reorder", "smooth_attention", "smooth_down", "clip", "rtn"]),
    ("+ GPTQ = QoQ g64", "w4a8kv4g64", None),
    ("QoQ per-channel", "w4a8kv4", None),
]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels, ppl = [r["row"] for r in rows], [r["ppl"] for r in rows]
    colors = ["#888"] + ["#c44"] * 2 + ["#48c"] * (len(rows) - 3)  # FP16, RTN baselines, QoQ rows
    ax.barh(labels[::-1], ppl[::-1], color=colors[::-1])
    ax.set_xscale("log")
    for y, v in enumerate(ppl[::-1]):
        ax.text(v, y, f" {v:.2f}", va="center")
    ax.set_xlabel(f"WikiText-2 perplexity ({rows[0]['windows']} windows of 2048 tokens), lower is better")
    ax.set_title("SmolLM2-135M, W4A8KV4: QoQ passes added one at a time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--windows", type=int, required=True)
    ap.add_argument("--workdir", type=Path, default=Path("out/ablation"))
    ap.add_argument("--results", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)

    done_file = args.workdir / "rows.jsonl"
    done = [json.loads(line) for line in done_file.read_text().splitlines()] if done_file.exists() else []
    done = {r["row"]: r for r in done if r["windows"] == args.windows}
    rows = []
    for i, (label, base, passes) in enumerate(ROWS):
        if label in done:
            rows.append(done[label])
            continue
        recipe = write_recipe(base, passes, args.workdir / f"row{i}.toml")
        art = args.workdir / f"row{i}"
        quant = qoq("quantize", "--model", args.model, "--recipe", str(recipe), "--output", str(art), "--overwrite")
        ev = qoq("eval", "wikitext2", str(art), "--windows", str(args.windows))
        rows.append({"row": label, "recipe": base, "passes": passes or tomllib.loads(
            (RECIPE_DIR / f"{base}.toml").read_text())["passes"], "ppl": ev["ppl"], "windows": ev["windows"],
            "tokens": ev["tokens"], "eval_seconds": ev["seconds"], "quantize_seconds": quant["seconds"],
            "peak_rss_gib": quant["peak_rss_gib"], "block_rel_err_mean": quant["block_rel_err_mean"],
            "calibration": quant["calibration"]})
        with done_file.open("a") as f:
            f.write(json.dumps(rows[-1]) + "\n")
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

    ppl = {r["row"]: r["ppl"] for r in rows}
    fp16, rtn64, qoq64 = ppl["FP16"], ppl["RTN g64"], ppl["+ GPTQ = QoQ g64"]
    summary = {"model": args.model, "windows": args.windows, "fp16_ppl": fp16, "rtn_g64_ppl": rtn64,
               "qoq_g64_ppl": qoq64, "rtn_pc_ppl": ppl["RTN per-channel"], "qoq_pc_ppl": ppl["QoQ per-channel"],
               "gap_closed_g64": (rtn64 - qoq64) / (rtn64 - fp16),
               "gap_closed_pc": (ppl["RTN per-channel"] - ppl["QoQ per-channel"]) / (ppl["RTN per-channel"] - fp16)}
    command = f"QOQ_DATA_DIR=../shared/data python bench/accuracy.py --windows {args.windows}"
    args.results.mkdir(parents=True, exist_ok=True)
    accuracy = {"model": args.model, "windows": args.windows, "fp16_ppl": fp16, "rtn_w4a8kv4g64_ppl": rtn64,
                "rtn_w4a8kv4_ppl": ppl["RTN per-channel"]}
    (args.results / "accuracy.json").write_text(json.dumps(
        {"summary": accuracy, "command": command, "rows": rows[:3]}, indent=2) + "\n")
    (args.results / "ablation.json").write_text(json.dumps({"summary": summary, "command": command, "rows": rows},
                                                           indent=2) + "\n")
    md = [f"# QoQ ablation — SmolLM2-135M, WikiText-2, first {args.windows} windows", "", f"`{command}`", "",
          "| row | passes | ppl | block rel err | quantize s |", "|---|---|---|---|---|"]
    md += [f"| {r['row']} | {', '.join(r['passes']) or '-'} | {r['ppl']:.3f} | {r['block_rel_err_mean']:.4f} | "
           f"{r['quantize_seconds']:.0f} |" for r in rows]
    md += ["", f"Gap closed (g64): {summary['gap_closed_g64']:.1%}; per-channel: {summary['gap_closed_pc']:.1%}.",
           "", f"Calibration of the QoQ rows: {rows[-1]['calibration']}."]
    (args.results / "ablation.md").write_text("\n".join(md) + "\n")
    plot(rows, args.results / "ablation.png")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
