"""The accuracy table: WikiText-2 perplexity of every recipe on every model, ours beside llm-compressor's,
with the error breakdowns — bench/results/accuracy_table.{json,md,png}.

    QOQ_DATA_DIR=../shared/data python bench/accuracy_table.py run --model smollm2-135m \\
        --recipes fp16,w4a8kv4g64-rtn,w4a8kv4g64,atom-w4a4kv4g64,quarot-w4a4kv4 --windows 8
    python bench/accuracy_table.py table
    python bench/accuracy_table.py merge OTHER/accuracy_table.json
    python bench/accuracy_table.py supersede --model M --recipes R,... --before COMMIT --reason "..."

`--device cuda` quantizes on a GPU and evaluates with the reference executor there (the same fp32
arithmetic); a run on another machine writes its own table (--results DIR) and `merge` adds its rows here.

`run` quantizes each shipped recipe on the model and evaluates the artifact with the integer-exact
executor (`qoq quantize`, then `qoq eval wikitext2 --windows N`, each in its own process); each row, with
its commit, commands, quantize and eval seconds and per-window NLLs, is added to the table's `rows` as it
finishes (a row already there for the same model, recipe and windows is not run again; --rerun replaces it).
Artifacts go to --workdir (default out/accuracy_table/MODEL).

`table` (and every `run`) rebuilds `summary` and the .md/.png from `rows` plus the rows other benchmarks
measured (`other_rows`): both tools' rows of bench/results/llmcompressor_check.json (theirs marked
`llmcompressor`), the full-recipe rows of bench/results/reference_dc.json (ours, and deepcompressor's
marked `deepcompressor`), and the error breakdowns (bench/results/error_breakdown*.json; their FP16 and
W4A8KV4 rows are also whole-recipe rows). Perplexities of different window counts are never
compared: each summary figure uses the most windows its model's rows share.

`supersede` moves rows measured with an earlier definition of a recipe (a format change, say) out of
`rows` into `superseded_rows`, each with the reason: kept as a record, never in the summary. An error
breakdown file with a top-level `superseded` reason gives no whole-recipe rows either (its FP16 row still
counts: the fp16 recipe is not what changed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.qoq_runs import REPO, commit, ppl_on_first_windows, qoq, qoq_command
from qoq.recipe import RECIPE_DIR

RESULTS = REPO / "bench" / "results"
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
# the flagship group size per model: SmolLM2's hidden size (576) takes groups of 64, not 128
FLAGSHIP = {"smollm2-135m": "w4a8kv4g64", "qwen2.5-coder-0.5b": "w4a8kv4g128", "qwen2.5-coder-1.5b": "w4a8kv4g128"}
W4A4 = {"smollm2-135m": ("atom-w4a4kv4g64", "quarot-w4a4kv4"),
        "qwen2.5-coder-0.5b": ("atom-w4a4kv4g128", "quarot-w4a4kv4"),
        "qwen2.5-coder-1.5b": ("atom-w4a4kv4g128", "quarot-w4a4kv4")}
GGUF_NOTE = ("GGUF-quantized release: its float weights are dequantized k-quant values, not the original bf16 "
             "checkpoint")
TARGETS = {"qoq_g128_1p5b_within_fp16": "<= 1.10 x fp16_1p5b_ppl", "gap_closed_g128_1p5b": ">= 0.70",
           "qoq_beats_w4a4": "QoQ W4A8KV4 below Atom and QuaRot W4A4KV4 on every model"}


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"rows": []}


def run(args) -> None:
    out = args.results / "accuracy_table.json"
    table = load(out)
    work = args.workdir or REPO / "out" / "accuracy_table" / args.model
    work.mkdir(parents=True, exist_ok=True)
    for recipe in args.recipes:
        key = (args.model, recipe, args.windows)
        old = [r for r in table["rows"] if (r["model"], r["recipe"], r["windows"]) == key]
        if old and not args.rerun:
            print(f"{args.model} {recipe} @ {args.windows} windows: have {old[0]['ppl']:.3f}", flush=True)
            continue
        art = work / recipe
        quantize = ("quantize", "--model", args.model, "--recipe", recipe, "--output", str(art), "--overwrite",
                    "--device", args.device)
        q = qoq(*quantize)
        evaluate = ("eval", "wikitext2", str(art), "--windows", str(args.windows), "--device", args.device)
        ev = qoq(*evaluate)
        row = {"model": args.model, "recipe": recipe, "tool": "qoq", "windows": args.windows, "ppl": ev["ppl"],
               "tokens": ev["tokens"], "nll_per_window": ev.get("nll_per_window"),
               "quantize_seconds": q["seconds"], "eval_seconds": ev["seconds"], "device": args.device,
               "calibration": q.get("calibration"), "commit": commit(),
               "commands": [qoq_command(*quantize).replace(str(art), "DIR"),
                            qoq_command(*evaluate).replace(str(art), "DIR")]}
        table["rows"] = [r for r in table["rows"] if (r["model"], r["recipe"], r["windows"]) != key] + [row]
        print(f"{args.model} {recipe} @ {args.windows} windows: {row['ppl']:.3f}", flush=True)
        write(table, args.results)  # after every row: a stopped run keeps what it measured


def merge(args) -> None:
    """Add the rows of other accuracy_table.json files (a run on another machine, with --results there);
    a row there replaces ours of the same model, recipe and windows."""
    table = load(args.results / "accuracy_table.json")
    for path in args.files:
        new = load(path)["rows"]
        keys = {(r["model"], r["recipe"], r["windows"]) for r in new}
        table["rows"] = [r for r in table["rows"] if (r["model"], r["recipe"], r["windows"]) not in keys] + new
        print(f"{path}: {len(new)} rows", flush=True)
    write(table, args.results)


def supersede(args) -> None:
    """Move the rows of --model and --recipes whose commit is neither --before nor a --keep one (rows
    measured before a recipe change) to `superseded_rows` with --reason."""
    table = load(args.results / "accuracy_table.json")
    stale = [r for r in table["rows"] if r["model"] == args.model and r["recipe"] in args.recipes
             and not str(r.get("commit", "")).startswith(tuple(args.keep))]
    table["rows"] = [r for r in table["rows"] if r not in stale]
    table["superseded_rows"] = table.get("superseded_rows", []) + [
        {**r, "superseded": args.reason, "recipe_changed_at": args.before} for r in stale]
    print(f"superseded {len(stale)} rows", flush=True)
    write(table, args.results)


def llmcompressor_check_rows(results: Path) -> list[dict]:
    """Both tools' rows of bench/reference_llmc's cross-check (its `qoq` rows are ours, on the same
    calibration tokens), with the check's commit; `fp` there is the float model, `fp16` here."""
    path = results / "llmcompressor_check.json"
    rows = []
    for model, check in (load(path).items() if path.exists() else []):
        for r in check.get("qoq_rows", []) + check.get("llmcompressor_rows", []):
            if r.get("ppl") is None:
                continue
            ours = r["tool"] == "qoq"
            rows.append({"model": model, "recipe": "fp16" if r["scheme"] == "fp" else r["scheme"],
                         "tool": "qoq" if ours else "llmcompressor", "windows": r["windows"], "ppl": r["ppl"],
                         "quantize_seconds": r.get("quantize_seconds"), "version": r["tool"],
                         "commit": r.get("commit") or check.get("commit"), "commands": r.get("commands"),
                         "source": "llmcompressor_check.json"})
    return rows


def reference_dc_rows(results: Path) -> list[dict]:
    """The full-recipe rows of the deepcompressor comparison (bench/reference_dc): ours (RTN and QoQ g64, with
    their commit and command) and deepcompressor's QoQ g64 on the same calibration tokens."""
    path = results / "reference_dc.json"
    if not path.exists():
        return []
    d = load(path)
    model = d["summary"]["model"]
    rows = []
    for r in d.get("qoq_rows", []) + d.get("deepcompressor_rows", []):
        ours = r["tool"] == "qoq"
        recipe = {"rtn": "w4a8kv4g64-rtn", "qoq": "w4a8kv4g64"}.get(r["stage"])
        if recipe is None or r.get("ppl") is None or (ours and not r.get("command")):
            continue
        rows.append({"model": model, "recipe": recipe, "tool": "qoq" if ours else "deepcompressor",
                     "windows": r["windows"], "ppl": r["ppl"], "quantize_seconds": r.get("quantize_seconds"),
                     "version": r["tool"], "commit": r.get("commit") or d["summary"].get("commit"),
                     "commands": [r["command"]] if r.get("command") else None, "source": "reference_dc.json"})
    return rows


def breakdown_recipe_rows(breakdown: list[dict]) -> list[dict]:
    """The error breakdowns' whole-recipe rows (FP16, and each recipe's W4A8KV4 row: its artifact as
    served), as table rows of tool qoq."""
    rows = []
    for r in breakdown:
        if r.get("superseded") and r["row"] != "FP16":  # a superseded file's recipes changed; fp16 did not
            continue
        recipe = "fp16" if r["row"] == "FP16" else r["recipe"] if r["row"] == "W4A8KV4" else None
        if recipe is not None:
            rows.append({"model": r["model"], "recipe": recipe, "tool": "qoq", "windows": r["windows"], "ppl": r["ppl"],
                         "quantize_seconds": r.get("quantize_seconds"), "commit": r.get("commit"),
                         "commands": [r["command"]] if r.get("command") else None, "source": r["source"]})
    return rows


def breakdown_rows(results: Path) -> list[dict]:
    rows = []
    for path in sorted(results.glob("error_breakdown*.json")):
        d = load(path)
        seconds = {k: q.get("seconds") for k, q in d.get("quantize_runs", {}).items()}
        rows += [{"model": d["model"], "recipe": r["recipe"], "row": r["row"], "windows": d["windows"], "ppl": r["ppl"],
                  "delta_vs_fp16": r.get("delta_vs_fp16"), "quantize_seconds": seconds.get(r["recipe"] or "fp16"),
                  "commit": r.get("commit"), "command": r.get("command"), "source": path.name,
                  **({"superseded": d["superseded"]} if d.get("superseded") else {})}
                 for r in d.get("rows", [])]
    return rows


def ppl_at_windows(rows: list[dict], model: str, recipe: str, windows: int) -> float | None:
    """qoq's perplexity of (model, recipe) on the first `windows` windows, from the fewest-window row that has
    it (ppl_on_first_windows); None if none does."""
    mine = sorted((r for r in rows if (r["model"], r["recipe"], r["tool"]) == (model, recipe, "qoq")),
                  key=lambda r: r["windows"])
    return next((p for p in (ppl_on_first_windows(r, windows) for r in mine) if p is not None), None)


def summarize(rows: list[dict]) -> dict:
    """Per model, per recipe: the row with the most windows; the flagship figures on the 1.5B; the W4A4
    comparison on every model that has all three rows at one window count."""
    models, reasons = {}, {}
    for model in MODELS:
        mine = [r for r in rows if r["model"] == model]
        if not mine:
            continue
        best = {}
        for r in mine:
            k = f"{r['recipe']} ({r['tool']})" if r["tool"] != "qoq" else r["recipe"]
            if k not in best or r["windows"] > best[k]["windows"]:
                best[k] = r
        models[model] = {k: {"ppl": r["ppl"], "windows": r["windows"], "quantize_seconds": r.get("quantize_seconds"),
                             "tool": r["tool"]} for k, r in sorted(best.items())}

    s = {"models": models}
    big = "qwen2.5-coder-1.5b"
    fp, q, rtn = (models.get(big, {}).get(k) for k in ("fp16", "w4a8kv4g128", "w4a8kv4g128-rtn"))
    same = fp and q and rtn and fp["windows"] == q["windows"] == rtn["windows"]
    s["fp16_1p5b_ppl"] = fp["ppl"] if fp else None
    s["qoq_g128_1p5b_ppl"] = q["ppl"] if q else None
    s["rtn_g128_1p5b_ppl"] = rtn["ppl"] if rtn else None
    pair = fp and q and fp["windows"] == q["windows"]
    s["windows_1p5b"] = fp["windows"] if pair else None
    s["qoq_g128_1p5b_over_fp16"] = q["ppl"] / fp["ppl"] if pair else None
    s["gap_closed_g128_1p5b"] = (rtn["ppl"] - q["ppl"]) / (rtn["ppl"] - fp["ppl"]) if same else None
    if not same:
        reasons["gap_closed_g128_1p5b"] = "the 1.5B's fp16, RTN g128 and QoQ g128 rows are not all measured " \
                                          "on the same windows"
    beats, beats_windows = {}, {}
    for model in models:
        names = (FLAGSHIP[model], *W4A4[model])
        best = [models[model].get(x) for x in names]
        windows = min(b["windows"] for b in best) if all(best) else None
        ppls = [ppl_at_windows(rows, model, x, windows) for x in names] if windows else [None]
        if all(p is not None for p in ppls):
            beats[model] = all(ppls[0] < p for p in ppls[1:])
            beats_windows[model] = windows
        else:
            reasons[f"qoq_beats_w4a4.{model}"] = f"{', '.join(names)} not all measured on the same windows (or " \
                                                 "on more, with their per-window NLLs)"
    s["qoq_beats_w4a4"] = beats
    s["qoq_beats_w4a4_windows"] = beats_windows
    s["targets"] = TARGETS
    s["null_reasons"] = reasons
    return s


def markdown(result: dict) -> str:
    lines = ["# Accuracy table — WikiText-2 perplexity (GPTQ protocol, windows of 2048 tokens)", "",
             "`python bench/accuracy_table.py run --model M --recipes ... --windows N`; every row's commit and "
             "commands are in accuracy_table.json. The Qwen2.5-Coder models are GGUF-quantized releases: their "
             "float weights are dequantized k-quant values, not the original bf16 checkpoints.", ""]
    for model, recipes in result["summary"]["models"].items():
        lines += [f"## {model}", "", "| recipe | tool | windows | ppl | quantize s |", "|---|---|---|---|---|"]
        for name, r in recipes.items():
            qs = f"{r['quantize_seconds']:.0f}" if r.get("quantize_seconds") else ""
            lines.append(f"| {name.split(' (')[0]} | {r['tool']} | {r['windows']} | {r['ppl']:.3f} | {qs} |")
        eb = [r for r in result["error_breakdown"] if r["model"] == model and not r.get("superseded")]
        if eb:
            lines += ["", "Error breakdown (bench/error_breakdown.py):", "", "| recipe | row | windows | ppl |",
                      "|---|---|---|---|"]
            lines += [f"| {r['recipe'] or 'fp16'} | {r['row']} | {r['windows']} | {r['ppl']:.3f} |" for r in eb]
        lines.append("")
    old = result.get("superseded_rows", []) + [r for r in result["error_breakdown"]
                                               if r.get("superseded") and r["row"] != "FP16"]
    if old:
        lines += ["## Superseded rows (kept in the JSON, not in the summary)", ""]
        lines += sorted({f"- {r['model']} {r['recipe'] or 'fp16'}: {r['superseded']}" for r in old}) + [""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = result["summary"]["models"]
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, (model, recipes) in zip(axes[0], models.items()):
        names = list(recipes)
        vals = [recipes[n]["ppl"] for n in names]
        ax.barh(range(len(names)), vals, color=["#888" if "llmcompressor" in n else "#2a6" for n in names])
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_xscale("log")
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("WikiText-2 perplexity (log)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(table: dict, results: Path) -> None:
    own = {(r["model"], r["recipe"], r["windows"]) for r in table["rows"]}
    breakdown = breakdown_rows(results)
    check = [r for r in llmcompressor_check_rows(results) + reference_dc_rows(results) + breakdown_recipe_rows(breakdown)
             if r["tool"] != "qoq" or (r["model"], r["recipe"], r["windows"]) not in own]
    result = {"summary": summarize(table["rows"] + check), "rows": table["rows"], "other_rows": check,
              "superseded_rows": table.get("superseded_rows", []), "error_breakdown": breakdown,
              "notes": {m: GGUF_NOTE for m in MODELS if m.startswith("qwen")}}
    results.mkdir(parents=True, exist_ok=True)
    (results / "accuracy_table.json").write_text(json.dumps(result, indent=1) + "\n")
    (results / "accuracy_table.md").write_text(markdown(result))
    try:
        plot(result, results / "accuracy_table.png")
    except ImportError:
        print("note: matplotlib is not installed, so no accuracy_table.png", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("run", help="quantize and evaluate recipes on a model; add the rows")
    r.add_argument("--model", required=True)
    r.add_argument("--recipes", required=True, help="comma-separated shipped recipe names")
    r.add_argument("--windows", type=int, required=True)
    r.add_argument("--workdir", type=Path, default=None)
    r.add_argument("--rerun", action="store_true", help="measure rows already in the table again")
    r.add_argument("--device", default="cpu", help="where quantization and the reference executor run (cpu, cuda)")
    m = sub.add_parser("merge", help="add the rows of accuracy_table.json files written elsewhere")
    m.add_argument("files", type=Path, nargs="+")
    sp = sub.add_parser("supersede", help="move rows a recipe change made stale to superseded_rows")
    sp.add_argument("--model", required=True)
    sp.add_argument("--recipes", required=True, help="comma-separated recipe names")
    sp.add_argument("--before", required=True, help="the commit that changed the recipes")
    sp.add_argument("--keep", default="", help="comma-separated commit prefixes measured at or after --before")
    sp.add_argument("--reason", required=True)
    for p in (r, m, sp, sub.add_parser("table", help="rebuild summary, .md and .png from the rows")):
        p.add_argument("--results", type=Path, default=RESULTS, help="folder of accuracy_table.json")
    args = ap.parse_args(argv)
    if args.verb == "run":
        args.recipes = [x.strip() for x in args.recipes.split(",") if x.strip()]
        for name in args.recipes:
            if not (RECIPE_DIR / f"{name}.toml").is_file():
                ap.error(f"unknown recipe '{name}' (a shipped recipe name)")
        if args.windows < 1:
            ap.error("--windows must be >= 1")
        run(args)
    elif args.verb == "merge":
        merge(args)
    elif args.verb == "supersede":
        args.recipes = [x.strip() for x in args.recipes.split(",") if x.strip()]
        args.keep = [args.before] + [x.strip() for x in args.keep.split(",") if x.strip()]
        supersede(args)
    else:
        write(load(args.results / "accuracy_table.json"), args.results)
    print(json.dumps(load(args.results / "accuracy_table.json")["summary"], indent=1))


if __name__ == "__main__":
    main()
