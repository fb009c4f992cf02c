"""qoq against the QoQ reference implementation (deepcompressor 0.1.0) on SmolLM2-135M, stage by stage:
writes bench/results/reference_dc.json (+ .md).

    QOQ_DATA_DIR=../shared/data python bench/reference_dc/compare.py --tokens    # calibration tokens for run.py
    bash bench/reference_dc/setup.sh && for s in fp rtn rotation smooth reorder qoq; do
        ~/.cache/qoq/dc-venv/bin/python bench/reference_dc/run.py --stage $s \\
            --calib-tokens out/reference_dc/qoq_calib_32x512.pt; done
    ~/.cache/qoq/dc-venv/bin/python bench/reference_dc/run.py --stage qoq          # its own sampler
    QOQ_DATA_DIR=../shared/data python bench/reference_dc/compare.py --windows 8

Our rows quantize with recipes derived from the shipped w4a8kv4g64 (a prefix of its passes, then rtn),
on the recipe's calibration tokens, which --tokens also hands to the reference (the same 32 x 512
windows); the reference's rows come from out/reference_dc/rows.jsonl (run.py). Rows already measured
(out/reference_dc/qoq_rows.jsonl, same windows and commit) are reused.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import tomllib

from qoq.recipe import RECIPE_DIR

BASE = "w4a8kv4g64"
# stage -> (base recipe, passes or None for the recipe's own); stages named as run.py's
OUR_STAGES = {
    "fp": ("fp16", None),
    "rtn": ("w4a8kv4g64-rtn", None),
    "rotation": (BASE, ["rotation", "rtn"]),
    "smooth": (BASE, ["rotation", "smooth_attention", "smooth_down", "rtn"]),
    "reorder": (BASE, ["rotation", "reorder", "smooth_attention", "smooth_down", "rtn"]),
    "clip": (BASE, ["rotation", "reorder", "smooth_attention", "smooth_down", "clip", "rtn"]),
    "qoq": (BASE, None),
}
TOKENS = Path("out/reference_dc/qoq_calib_32x512.pt")


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def write_recipe(base: str, passes: list[str] | None, path: Path) -> Path:
    if passes is None:
        return RECIPE_DIR / f"{base}.toml"
    raw = tomllib.loads((RECIPE_DIR / f"{base}.toml").read_text())
    lines = [f"description = {json.dumps(raw['description'] + ' (stage prefix)')}", f"passes = {json.dumps(passes)}"]
    for table in ("format", "calibration"):
        lines += ["", f"[{table}]"] + [f"{k} = {json.dumps(v)}" for k, v in raw[table].items()]
    for name, options in raw.get("pass_options", {}).items():
        if name in passes:
            lines += ["", f"[pass_options.{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in options.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def qoq(*args: str) -> dict:
    print("$ qoq", " ".join(args), file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "qoq.cli", *args, "--json"]
    return json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout)


def save_tokens() -> dict:
    """The shipped recipe's calibration windows, for run.py --calib-tokens."""
    import torch

    from qoq.calibration import calibration_tokens, describe, load_spec
    from qoq.models.loader import load_tokenizer, resolve_model
    from qoq.recipe import load_recipe

    c = load_recipe(BASE).calibration
    spec = load_spec(c.data)
    tokens = calibration_tokens(spec, load_tokenizer(resolve_model("smollm2-135m")), samples=c.samples,
                                seq_len=c.seq_len, seed=c.seed, sampling=c.sampling)
    TOKENS.parent.mkdir(parents=True, exist_ok=True)
    torch.save(tokens, TOKENS)
    return {**describe(spec, tokens, seed=c.seed), "sampling": c.sampling}


def our_rows(windows: int, workdir: Path, remeasure: bool) -> list[dict]:
    """Our stage rows: measured now, or reused from qoq_rows.jsonl (each row keeps the commit and
    recipe options it was measured with)."""
    cache = workdir / "qoq_rows.jsonl"
    done = {}
    if cache.exists() and not remeasure:
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            if r["windows"] == windows:
                done[r["stage"]] = r
    rows = []
    for stage, (base, passes) in OUR_STAGES.items():
        if stage in done:
            rows.append(done[stage])
            continue
        recipe = write_recipe(base, passes, workdir / f"qoq-{stage}.toml")
        art = workdir / f"qoq-{stage}"
        quant = qoq("quantize", "--model", "smollm2-135m", "--recipe", str(recipe), "--output", str(art), "--overwrite")
        ev = qoq("eval", "wikitext2", str(art), "--windows", str(windows))
        rows.append({"tool": "qoq", "stage": stage, "recipe": base, "command": (
            f"qoq quantize --model smollm2-135m --recipe {os.path.relpath(recipe)} --output DIR && "
            f"qoq eval wikitext2 DIR --windows {windows}"), "passes": passes or tomllib.loads(
            (RECIPE_DIR / f"{base}.toml").read_text())["passes"], "ppl": ev["ppl"], "windows": ev["windows"],
            "tokens": ev["tokens"], "quantize_seconds": quant["seconds"], "eval_seconds": ev["seconds"],
            "block_rel_err_mean": quant["block_rel_err_mean"], "calibration": quant["calibration"],
            "commit": commit()})
        with cache.open("a") as f:
            f.write(json.dumps(rows[-1]) + "\n")
    return rows


def reference_rows(workdir: Path, windows: int) -> tuple[list[dict], dict | None, dict | None]:
    """(rows on qoq's calibration tokens, the qoq and fp rows on the reference's own sampler)."""
    path = workdir / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    rows = [{k: v for k, v in r.items() if k != "config"} for r in rows if r["windows"] == windows]
    same = {r["stage"]: r for r in rows if str(TOKENS) in r["calibration"]["source"]}
    own = {r["stage"]: r for r in rows if "sampler" in r["calibration"]["source"]}
    return [same[s] for s in OUR_STAGES if s in same], own.get("qoq"), own.get("fp")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--tokens", action="store_true", help="only write the calibration tokens for run.py")
    ap.add_argument("--remeasure", action="store_true", help="measure our stages again, ignoring qoq_rows.jsonl")
    ap.add_argument("--variants", type=Path, help="JSON lines of further measured variants (name, ppl, ...) "
                    "to record beside the stage rows")
    ap.add_argument("--workdir", type=Path, default=Path("out/reference_dc"))
    ap.add_argument("--results", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    calibration = save_tokens()
    if args.tokens:
        print(json.dumps(calibration))
        return
    ours = our_rows(args.windows, args.workdir, args.remeasure)
    variants = [json.loads(line) for line in args.variants.read_text().splitlines()] if args.variants else []
    ref, ref_own, ref_fp = reference_rows(args.workdir, args.windows)
    ours_by, ref_by = {r["stage"]: r["ppl"] for r in ours}, {r["stage"]: r["ppl"] for r in ref}
    summary = {
        "model": "smollm2-135m", "windows": args.windows, "commit": commit(),
        "calibration": {"qoq": calibration, "reference": "the same token windows (run.py --calib-tokens)",
                        "reference_own_sampler": ref_own["calibration"] if ref_own else None},
        "qoq_g64_ppl": ours_by["qoq"], "fp16_ppl": ours_by["fp"],
        # the headline: the reference as its users run it (its own sampler, issue 40's figure) when
        # recorded, else on our tokens; the same-token figure has its own key
        "dc_qoq_g64_ppl": ref_own["ppl"] if ref_own else ref_by.get("qoq"),
        "dc_qoq_g64_calibration": "deepcompressor's own sampler" if ref_own else "qoq's tokens",
        "dc_qoq_g64_same_calib_ppl": ref_by.get("qoq"),
        "dc_fp_ppl": ref_by.get("fp", ref_fp["ppl"] if ref_fp else None),
        "dc_qoq_g64_own_sampler_ppl": ref_own["ppl"] if ref_own else None,
        # who measured the own-sampler row (issue 40's figure unless run.py re-ran it here)
        "dc_qoq_g64_own_sampler_measured_by": (ref_own or {}).get("measured_by", "run.py here"),
        "dc_calibration_by_stage": {r["stage"]: r["calibration"]["source"] for r in ref},
        "stages": {s: {"qoq": ours_by.get(s), "deepcompressor": ref_by.get(s)} for s in OUR_STAGES},
    }
    command = "bench/reference_dc/compare.py (commands in its docstring)"
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "reference_dc.json").write_text(json.dumps(
        {"summary": summary, "command": command, "qoq_rows": ours, "deepcompressor_rows": ref,
         "deepcompressor_own_sampler": [r for r in (ref_own, ref_fp) if r], "variants": variants}, indent=2) + "\n")
    md = [f"# qoq vs deepcompressor 0.1.0 (QoQ reference), SmolLM2-135M g64, WikiText-2 first {args.windows} windows",
          "", "| stage | qoq passes | qoq ppl | deepcompressor ppl |", "|---|---|---|---|"]
    for r in ours:
        ref_ppl = ref_by.get(r["stage"])
        md.append(f"| {r['stage']} | {', '.join(r['passes']) or '-'} | {r['ppl']:.3f} | "
                  f"{'-' if ref_ppl is None else f'{ref_ppl:.3f}'} |")
    if ref_own:
        md += ["", (f"deepcompressor QoQ on its own calibration sampler (groups_merged.txt, 32 x 512): "
               f"{ref_own['ppl']:.3f}; the table's deepcompressor rows calibrate on qoq's token windows.")]
    if variants:
        md += ["", "| variant | ppl | what |", "|---|---|---|"]
        md += [f"| {v['name']} | {v['ppl']:.3f} | {v['description']} |" for v in variants]
    (args.results / "reference_dc.md").write_text("\n".join(md) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
