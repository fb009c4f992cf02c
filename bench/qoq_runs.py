"""What the accuracy benches (accuracy.py, error_breakdown.py) share: recipe files derived from shipped
ones, the `qoq` command run in a child process (one model load per process, its JSON back), the
commit a number was measured at, and a perplexity row's figure on fewer windows than it was run on."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import tomllib

from qoq.recipe import RECIPE_DIR

REPO = Path(__file__).resolve().parents[1]


def shipped_recipe(name: str) -> dict:
    """The raw TOML table of recipes/NAME.toml."""
    return tomllib.loads((RECIPE_DIR / f"{name}.toml").read_text())


def _value(v) -> str:
    return json.dumps(v)  # TOML's strings, lists, numbers and booleans are JSON's spellings


def write_recipe_toml(raw: dict, path: Path) -> Path:
    """A recipe table (description, passes, [format], [calibration], optional [transform_format] and
    [pass_options.NAME]) written as a .toml file `qoq quantize --recipe` takes."""
    lines = [f"description = {_value(raw['description'])}", f"passes = {_value(list(raw['passes']))}"]
    for table in ("format", "transform_format", "calibration"):
        if table in raw:
            lines += ["", f"[{table}]"] + [f"{k} = {_value(v)}" for k, v in raw[table].items()]
    for name, options in raw.get("pass_options", {}).items():
        lines += ["", f"[pass_options.{name}]"] + [f"{k} = {_value(v)}" for k, v in options.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_recipe(base: str, passes: list[str] | None, path: Path) -> Path:
    """The shipped recipe `base` (passes None), or its copy with only `passes` (same format and
    calibration) written to `path`."""
    if passes is None:
        return RECIPE_DIR / f"{base}.toml"
    raw = shipped_recipe(base)
    return write_recipe_toml({"description": raw["description"] + " (ablation prefix)", "passes": passes,
                              "format": raw["format"], "calibration": raw["calibration"]}, path)


def qoq_command(*args: str) -> str:
    return "qoq " + " ".join(str(a) for a in args)


def qoq(*args: str) -> dict:
    """Run `qoq ARGS --json` in a child process; its JSON result."""
    cmd = [sys.executable, "-m", "qoq.cli", *map(str, args), "--json"]
    print("$", qoq_command(*args), file=sys.stderr, flush=True)
    return json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout)


def commit() -> str:
    """HEAD's hash, '+dirty' when tracked files differ from it (the measured code is then not HEAD's); in a
    copy of the tree (the GPU machine's, whose git metadata need not be the copied tree's), $QOQ_COMMIT as
    the caller gives it, which wins whenever it is set."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, check=True, stdout=subprocess.PIPE, text=True).stdout

    if os.environ.get("QOQ_COMMIT"):
        return os.environ["QOQ_COMMIT"] + " (copy)"
    head = git("rev-parse", "HEAD").strip()
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no").strip() else "")


def ppl_on_first_windows(row: dict, windows: int) -> float | None:
    """A perplexity row's figure on its first `windows` WikiText-2 windows: its own when measured on exactly
    those, else exp(mean NLL) of the first `windows` of a longer run's `nll_per_window` (the GPTQ protocol's
    windows are consecutive, so they are the shorter run's); None when it has fewer."""
    if row["windows"] == windows:
        return row["ppl"]
    nll = row.get("nll_per_window") or []
    if row["windows"] < windows or len(nll) < windows:
        return None
    return math.exp(sum(nll[:windows]) / windows)
