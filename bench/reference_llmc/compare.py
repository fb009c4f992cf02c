"""qoq's baseline recipes (GPTQ / AWQ W4A16, SmoothQuant W8A8) against llm-compressor's on the same
calibration tokens and WikiText-2 windows: writes bench/results/llmcompressor_check.json (+ .md).

    QOQ_DATA_DIR=../shared/data python bench/reference_llmc/compare.py --tokens    # tokens for run.py
    bash bench/reference_llmc/setup.sh && for s in fp gptq-w4a16g64 awq-w4a16g64 smoothquant-w8a8; do
        ~/.cache/qoq/llmc-venv/bin/python bench/reference_llmc/run.py --scheme $s \\
            --calib-tokens out/reference_llmc/smollm2-135m/calib_32x512.pt; done
    QOQ_DATA_DIR=../shared/data python bench/reference_llmc/compare.py --windows 8 \\
        --notes bench/reference_llmc/notes.json

`--model qwen2.5-coder-0.5b --group 128 --windows 4` (and run.py's --model-src) for the larger model.
Our rows: `qoq quantize --recipe R` then `qoq eval wikitext2`, with each recipe's own calibration (all
three share pile-val 32 x 512 seed 42, which --tokens saves for run.py); they are cached in
out/reference_llmc/<model>/qoq_rows.jsonl. llm-compressor's rows come from rows.jsonl beside it.
`--notes` (JSON: {model: {scheme: text}}) adds the written explanation of a row's gap.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.qoq_runs import ppl_on_first_windows  # noqa: E402

SCHEMES = ("fp", "gptq-w4a16g{g}", "awq-w4a16g{g}", "smoothquant-w8a8")
GAP = 0.05  # a gap past this (either way) needs a written explanation


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def qoq(*args: str) -> dict:
    print("$ qoq", " ".join(args), file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "qoq.cli", *args, "--json"]
    return json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout)


def schemes(group: int) -> list[str]:
    return [s.format(g=group) for s in SCHEMES]


def save_tokens(model: str, group: int, path: Path) -> dict:
    """The recipes' calibration windows (one set: the three recipes must calibrate alike), for run.py."""
    import torch

    from qoq.calibration import calibration_tokens, describe, load_spec
    from qoq.models.loader import load_tokenizer, resolve_model
    from qoq.recipe import load_recipe

    cals = {s: load_recipe(s).calibration for s in schemes(group)[1:]}
    if len(set(cals.values())) != 1:
        raise ValueError(f"the recipes calibrate differently, one token file cannot stand for all: {cals}")
    c = next(iter(cals.values()))
    spec = load_spec(c.data)
    tokens = calibration_tokens(spec, load_tokenizer(resolve_model(model)), samples=c.samples,
                                seq_len=c.seq_len, seed=c.seed, sampling=c.sampling)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(tokens, path)
    return {**describe(spec, tokens, seed=c.seed), "sampling": c.sampling}


def our_rows(model: str, group: int, windows: int, workdir: Path, only: list[str] | None = None) -> list[dict]:
    """Measured now, or reused from qoq_rows.jsonl (each row keeps its commit); `only`: measure just
    these schemes (in this order). Returns every row of this window count, in the schemes' order."""
    cache = workdir / "qoq_rows.jsonl"

    def cached() -> dict:
        rows = [json.loads(line) for line in cache.read_text().splitlines()] if cache.exists() else []
        return {r["scheme"]: r for r in rows if r["windows"] == windows}

    done = cached()
    for scheme in only or schemes(group):
        if scheme in done:
            continue
        if scheme == "fp":
            quant, target = None, model
            commands = [f"qoq eval wikitext2 {model} --windows {windows} --json"]
        else:
            target = str(workdir / f"qoq-{scheme}")
            quant = qoq("quantize", "--model", model, "--recipe", scheme, "--output", target, "--overwrite")
            commands = [f"qoq quantize --model {model} --recipe {scheme} --output DIR",
                        f"qoq eval wikitext2 DIR --windows {windows} --json"]
        ev = qoq("eval", "wikitext2", target, "--windows", str(windows))
        row = {"tool": "qoq", "scheme": scheme, "ppl": ev["ppl"], "windows": ev["windows"],
               "tokens": ev["tokens"], "commands": commands,
               "quantize_seconds": quant["seconds"] if quant else None, "eval_seconds": ev["seconds"],
               "calibration": quant["calibration"] if quant else None, "commit": commit()}
        with cache.open("a") as f:
            f.write(json.dumps(row) + "\n")
    done = cached()
    return [done[s] for s in schemes(group) if s in done]


def first_windows(row: dict, windows: int) -> dict | None:
    """A row measured on at least `windows` windows, cut to its first `windows` (ppl_on_first_windows); None
    if it has fewer."""
    ppl = ppl_on_first_windows(row, windows)
    if ppl is None or row["windows"] == windows:
        return None if ppl is None else row
    return {**row, "ppl": ppl, "windows": windows, "nll_per_window": row["nll_per_window"][:windows],
            "cut_from_windows": row["windows"]}


def llmc_rows(workdir: Path, windows: int, tokens: Path) -> dict:
    """llm-compressor's rows on our tokens (the last one of each scheme), by scheme, over the first `windows`
    windows (first_windows); extra variants (run.py --variant, --pipeline basic) are kept under their own
    name."""
    path = workdir / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    out = {}
    for r in filter(None, (first_windows(r, windows) for r in rows)):
        if r["scheme"] == "fp" or r["calibration"]["source"] == str(tokens):
            tags = [t for t in (r.get("variant"), r.get("pipeline") == "basic" and "basic pipeline") if t]
            out[r["scheme"] + (f" ({', '.join(tags)})" if tags else "")] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--group", type=int, default=64, help="the W4A16 recipes' group (64 or 128)")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--tokens", action="store_true", help="only write the calibration tokens for run.py")
    ap.add_argument("--schemes", nargs="+", help="measure only these of our rows (default: all four)")
    ap.add_argument("--notes", type=Path, help="JSON {model: {scheme: explanation}} for the rows' gaps")
    ap.add_argument("--workdir", type=Path, default=Path("out/reference_llmc"))
    ap.add_argument("--results", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    if args.group not in (64, 128):
        raise SystemExit(f"--group must be 64 or 128 (the shipped W4A16 recipes), got {args.group}")
    workdir = args.workdir / args.model
    tokens = workdir / "calib_32x512.pt"
    calibration = save_tokens(args.model, args.group, tokens)
    if args.tokens:
        print(json.dumps(calibration))
        return
    unknown = set(args.schemes or []) - set(schemes(args.group))
    if unknown:
        raise SystemExit(f"--schemes: unknown {sorted(unknown)} (known: {', '.join(schemes(args.group))})")
    ours = our_rows(args.model, args.group, args.windows, workdir, args.schemes)
    theirs = llmc_rows(workdir, args.windows, tokens)
    notes = json.loads(args.notes.read_text()).get(args.model, {}) if args.notes else {}
    table = []
    for r in ours:
        names = [n for n in theirs if n == r["scheme"] or n.startswith(r["scheme"] + " (")]
        for name in names:
            t = theirs[name]
            ratio = t["ppl"] / r["ppl"]
            table.append({"scheme": name, "qoq_ppl": r["ppl"], "llmcompressor_ppl": t["ppl"],
                          "ratio_llmc_over_qoq": ratio, "gap_over_5pct": abs(ratio - 1) > GAP,
                          "explanation": notes.get(name, notes.get(r["scheme"]))})
        if not names:
            table.append({"scheme": r["scheme"], "qoq_ppl": r["ppl"], "llmcompressor_ppl": None,
                          "ratio_llmc_over_qoq": None, "gap_over_5pct": None, "explanation": notes.get(r["scheme"])})
    tool = next((t["tool"] for t in theirs.values()), None)
    section = {"model": args.model, "windows": args.windows, "group": args.group, "commit": commit(),
               "tool": tool, "calibration": {**calibration, "file": str(tokens),
                                             "llmcompressor": "the same token windows (run.py --calib-tokens)"},
               "table": table, "qoq_rows": ours, "llmcompressor_rows": list(theirs.values())}
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / "llmcompressor_check.json"
    allres = json.loads(path.read_text()) if path.exists() else {}
    allres[args.model] = section
    path.write_text(json.dumps(allres, indent=2) + "\n")
    md = ["# qoq baselines vs llm-compressor (same calibration tokens, same WikiText-2 windows)", "",
          "Written by bench/reference_llmc/compare.py; explanations of the gaps in docs/performance.md.", ""]
    for m, s in allres.items():
        cut = sorted({r["cut_from_windows"] for r in s["llmcompressor_rows"] if r.get("cut_from_windows")})
        cut_note = [f"llm-compressor's rows: the first {s['windows']} windows of its runs on "
                    f"{', '.join(map(str, cut))} (their per-window NLLs).", ""] if cut else []
        md += [f"## {m}, WikiText-2 first {s['windows']} windows, {s['tool']}", "", *cut_note,
               "| scheme | qoq ppl | llm-compressor ppl | llmc / qoq | gap > 5% |", "|---|---|---|---|---|"]
        for row in s["table"]:
            theirs_ppl = "-" if row["llmcompressor_ppl"] is None else f"{row['llmcompressor_ppl']:.3f}"
            ratio = "-" if row["ratio_llmc_over_qoq"] is None else f"{row['ratio_llmc_over_qoq']:.3f}"
            gap = {True: "yes", False: "no", None: "-"}[row["gap_over_5pct"]]
            md.append(f"| {row['scheme']} | {row['qoq_ppl']:.3f} | {theirs_ppl} | {ratio} | {gap} |")
        expl = [f"- **{row['scheme']}**: {row['explanation']}" for row in s["table"] if row["explanation"]]
        md += ([""] + expl if expl else []) + [""]
    (args.results / "llmcompressor_check.md").write_text("\n".join(md))
    print(json.dumps({k: v for k, v in section.items() if k not in ("qoq_rows", "llmcompressor_rows")}, indent=2))


if __name__ == "__main__":
    main()
