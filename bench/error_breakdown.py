"""Where a W4A8KV4 recipe's perplexity loss comes from: WikiText-2 perplexity of each quantizer alone and
stacked, for each recipe, next to FP16 — every row on the same windows, the integer-exact executor.

    python bench/error_breakdown.py --model smollm2-135m --windows 8 --out bench/results/error_breakdown.json
    python bench/error_breakdown.py --model qwen2.5-coder-0.5b --recipes w4a8kv4g128-rtn,w4a8kv4g128 --windows 4

For each recipe R two artifacts are quantized: R's own (what is served) and R's float twin, a W16 recipe
with R's exact passes (rotation, reorder, SmoothAttention, smoothing: the function-preserving transforms,
chosen as for R's format through [transform_format]) and none that quantize weights (rtn, gptq, clip).
Rows (docs/design.md §6, `qoq eval --quantize`):
  W4A8KV4   R's artifact as served          W4 only   R's artifact, activations and KV float
  W4A8      R's artifact, KV float          A8 only   the twin, per-token INT8 activations only
  KV4 only  the twin, UINT4 KV only         W16       the twin with no quantizer (the transforms alone)
FP16 is the `fp16` recipe's artifact, which is also the twin of a recipe without transforms (RTN) unless
that recipe keeps the k bias outside the KV4 cache. Each row records its command and the commit measured.
Writes OUT (JSON) and OUT with .md (a table).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.qoq_runs import (
    REPO,
    commit,
    qoq,
    qoq_command,
    shipped_recipe,
    write_recipe_toml,
)
from qoq.passes import PASSES
from qoq.recipe import RECIPE_DIR

# (row label, artifact: "recipe" (R's own) or "twin" (R's float twin), --quantize)
ROWS = [
    ("W4 only", "recipe", "weights"),
    ("A8 only", "twin", "activations"),
    ("KV4 only", "twin", "kv"),
    ("W4A8", "recipe", "weights,activations"),
    ("W4A8KV4", "recipe", "weights,activations,kv"),
    ("W16 (transforms only)", "twin", "none"),
]
DEFAULT_RECIPES = "w4a8kv4g64-rtn,w4a8kv4g64"


def twin_recipe(base: str) -> dict:
    """R's float twin as a recipe table: R's exact passes only (those that keep the float function; the
    quantizers and the clip search go), 16-bit weights and activations, R's KV bits and calibration, and
    R's format as [transform_format] so the transforms are chosen as R chooses them."""
    raw = shipped_recipe(base)
    passes = [p for p in raw["passes"] if PASSES.get(p).exact and not PASSES.get(p).quantizes]
    fmt = raw["format"]
    twin_format = {"weight_bits": 16, "group_size": -1, "act_bits": 16, "kv_bits": fmt.get("kv_bits", 4)}
    if fmt.get("k_bias_outside_cache"):
        twin_format["k_bias_outside_cache"] = True
    return {"description": f"{base}'s float twin: its function-preserving passes, weights and activations "
                           "16-bit (bench/error_breakdown.py)",
            "passes": passes, "format": twin_format, "transform_format": fmt, "calibration": raw["calibration"],
            "pass_options": {p: o for p, o in raw.get("pass_options", {}).items() if p in passes}}


def needs_own_twin(twin_raw: dict) -> bool:
    """A twin with passes, or one whose KV format differs from the fp16 artifact's (a k bias kept outside
    the cache), is quantized; any other twin is the fp16 artifact itself."""
    return bool(twin_raw["passes"]) or bool(twin_raw["format"].get("k_bias_outside_cache"))


def _resume(path: Path, model: str, windows: int) -> dict:
    if not path.exists():
        return {}
    done = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["key"]: r for r in done if r["model"] == model and r["windows"] == windows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--recipes", default=DEFAULT_RECIPES, help="comma-separated shipped recipe names")
    ap.add_argument("--windows", type=int, required=True)
    ap.add_argument("--out", type=Path, default=Path("bench/results/error_breakdown.json"))
    ap.add_argument("--workdir", type=Path, default=None, help="artifacts and progress (default out/error_breakdown/MODEL)")
    ap.add_argument("--device", default="cpu", help="where quantization and the reference executor run (cpu, cuda)")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: write OUT from the workdir's runs.jsonl (a run stopped on another machine), "
                         "the rows not measured listed under `missing`")
    args = ap.parse_args()
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    for r in recipes:
        if not (RECIPE_DIR / f"{r}.toml").is_file():
            ap.error(f"unknown recipe '{r}' (a shipped recipe name)")
    work = args.workdir or Path("out/error_breakdown") / args.model
    work.mkdir(parents=True, exist_ok=True)
    progress = work / "runs.jsonl"
    done = _resume(progress, args.model, args.windows)

    def record(key: str, entry: dict) -> dict:
        entry = {"key": key, "model": args.model, "windows": args.windows, **entry}
        with progress.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        done[key] = entry
        return entry

    def quantized(name: str, recipe_path: Path):
        """-> a callable giving the artifact, quantized when a row first needs it: a resumed run whose rows
        of an artifact are all measured does not quantize it again."""
        def artifact() -> Path:
            art = work / name
            key = f"quantize {name}"
            if key not in done or not (art / "qoq.json").exists():
                cmd = ("quantize", "--model", args.model, "--recipe", str(recipe_path), "--output", str(art),
                       "--overwrite", "--device", args.device)
                q = qoq(*cmd)
                record(key, {"command": qoq_command(*cmd), "commit": commit(), "seconds": q["seconds"],
                             "block_rel_err_mean": q["block_rel_err_mean"], "calibration": q["calibration"]})
            return art
        return artifact

    def evaluated(label: str, recipe: str | None, artifact, quantize: str | None) -> dict:
        key = f"eval {recipe} {label}"
        if key not in done and args.report_only:
            raise SystemExit(f"--report-only: {progress} has no '{key}' row")
        if key not in done:
            cmd = ("eval", "wikitext2", str(artifact()), "--windows", str(args.windows), "--device", args.device)
            cmd += ("--quantize", quantize) if quantize else ()
            ev = qoq(*cmd)
            record(key, {"row": label, "recipe": recipe, "artifact_recipe": ev["recipe"], "quantize": quantize,
                         "ppl": ev["ppl"], "tokens": ev["tokens"], "eval_seconds": ev["seconds"],
                         "command": qoq_command(*cmd), "commit": commit()})
        return done[key]

    missing: list[str] = []
    fp16_art = quantized("fp16", RECIPE_DIR / "fp16.toml")
    fp16 = evaluated("FP16", None, fp16_art, None)
    rows = [fp16]
    for recipe in recipes:
        own = quantized(recipe, RECIPE_DIR / f"{recipe}.toml")
        twin_raw = twin_recipe(recipe)
        # a twin without passes (RTN's) holds the fp16 artifact's weights: that artifact serves (unless the
        # twin's KV4 keeps the k bias outside the cache, which the fp16 format cannot say), and its
        # "W16" row would be the FP16 row again
        twin = (quantized(f"{recipe}-twin", write_recipe_toml(twin_raw, work / f"{recipe}-twin.toml"))
                if needs_own_twin(twin_raw) else fp16_art)
        for label, which, quantize in ROWS:
            if which == "twin" and quantize == "none" and not twin_raw["passes"]:
                continue
            if args.report_only and f"eval {recipe} {label}" not in done:
                missing.append(f"{recipe} {label}")
                continue
            rows.append(evaluated(label, recipe, own if which == "recipe" else twin, quantize))

    for r in rows:
        r["delta_vs_fp16"] = r["ppl"] - fp16["ppl"]
        r["command"] = r["command"].replace(f"{REPO}/", "")
    command = (f"QOQ_DATA_DIR=../shared/data python bench/error_breakdown.py --model {args.model} "
               f"--recipes {','.join(recipes)} --windows {args.windows} --device {args.device} --out {args.out}")
    quantize_runs = {k.removeprefix("quantize "): v for k, v in done.items() if k.startswith("quantize ")}
    strip = ("key", "model", "windows")
    result = {"model": args.model, "windows": args.windows, "recipes": recipes, "command": command,
              "fp16_ppl": fp16["ppl"], "twins": {r: twin_recipe(r) for r in recipes},
              "quantize_runs": {k: {f: v.replace(f"{REPO}/", "") if f == "command" else v for f, v in q.items()
                                    if f not in strip} for k, q in quantize_runs.items()},
              "rows": [{f: v for f, v in r.items() if f not in strip} for r in rows]}
    if missing:
        result["missing"] = missing
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result) + "\n")
    print(markdown(result))


def markdown(result: dict) -> str:
    by = {(r["recipe"], r["row"]): r for r in result["rows"]}
    fp16 = result["fp16_ppl"]
    head = "| row | what runs | " + " | ".join(f"{r} ppl (Δ vs FP16)" for r in result["recipes"]) + " |"
    md = [f"# Error breakdown — {result['model']}, WikiText-2, first {result['windows']} windows", "",
          f"`{result['command']}`", "", head, "|---|---|" + "---|" * len(result["recipes"]),
          "| FP16 | `fp16` recipe | " + " | ".join(f"{fp16:.3f}" for _ in result["recipes"]) + " |"]
    for label, which, quantize in ROWS:
        cells = [(by.get((r, label)), f"{r} {label}" in result.get("missing", [])) for r in result["recipes"]]
        what = f"{'R' if which == 'recipe' else 'R float twin'}, --quantize {quantize}"
        md.append(f"| {label} | {what} | " + " | ".join(
            f"{c['ppl']:.3f} ({c['delta_vs_fp16']:+.3f})" if c else "not measured" if gone else "= FP16 (no transforms)"
            for c, gone in cells) + " |")
    def passes(t: dict) -> str:
        own = "its own artifact (KV4 with the k bias outside the cache)"
        return ", ".join(t["passes"]) or (f"no passes, {own}" if needs_own_twin(t) else "no passes, the fp16 artifact")

    twins = "; ".join(f"{r}: {passes(t)}" for r, t in result["twins"].items())
    commits = sorted({r["commit"] for r in result["rows"]})
    md += ["", f"Float twins' passes ({twins}). Commit(s): {', '.join(commits)}."]
    return "\n".join(md)


if __name__ == "__main__":
    main()
