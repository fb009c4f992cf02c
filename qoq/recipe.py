"""Recipes: TOML data choosing the passes and the numeric format, validated by a strict schema.

The data classes live in qoq.recipe_schema (which the passes and the runtime import); this module adds
what needs the passes: their names and options.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from qoq.passes import PASSES  # importing registers every pass
from qoq.recipe_schema import Calibration, Format, Recipe, RecipeError, format_problem, parse_section

__all__ = ["RECIPE_DIR", "Calibration", "Format", "Recipe", "RecipeError", "load_recipe", "parse_recipe",
           "recipe_names"]

RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes"


def parse_recipe(raw: dict, name: str, where: str) -> Recipe:
    known = {"description", "passes", "format", "calibration", "pass_options", "transform_format"}
    for key in raw:
        if key not in known:
            raise RecipeError(f"{where}: unknown key '{key}' (known: {', '.join(sorted(known))})")
    passes = raw.get("passes", [])
    if not isinstance(passes, list) or not all(isinstance(p, str) for p in passes):
        raise RecipeError(f"{where}: 'passes' must be a list of pass names")
    for p in passes:
        if p not in PASSES:
            raise RecipeError(f"{where}: unknown pass '{p}' in 'passes' (known: {', '.join(PASSES.names())})")
    options_raw = raw.get("pass_options", {})
    if not isinstance(options_raw, dict):
        raise RecipeError(f"{where}: [pass_options] must be a table of tables")
    for p in options_raw:
        if p not in passes:
            raise RecipeError(f"{where}: 'pass_options.{p}' names a pass that is not in 'passes'")
    options = {p: parse_section(PASSES.get(p).Options, options_raw.get(p, {}), f"pass_options.{p}", where)
               for p in passes}
    fmt = parse_section(Format, raw.get("format", {}), "format", where)
    calib = parse_section(Calibration, raw.get("calibration", {}), "calibration", where)
    quantizers = [p for p in passes if PASSES.get(p).quantizes]
    problem = format_problem(fmt)
    if problem:
        raise RecipeError(f"{where}: {problem}")
    transform_fmt = None
    if "transform_format" in raw:
        transform_fmt = parse_section(Format, raw["transform_format"], "transform_format", where)
        problem = format_problem(transform_fmt)
        if problem:
            raise RecipeError(f"{where}: [transform_format]: {problem}")
        if transform_fmt.kind != "w4a8":  # the others' transforms need run-time parts (input orders, online
            # rotations) a W16 artifact does not carry
            raise RecipeError(f"{where}: [transform_format] must be a QoQ W4A8 format, got "
                              f"{transform_fmt.kind.upper()}")
        if fmt.weight_bits != 16:
            raise RecipeError(f"{where}: [transform_format] is for W16 recipes (float weights after another "
                              f"format's transforms); this one has 'format.weight_bits' = {fmt.weight_bits}")
        inexact = [p for p in passes if not PASSES.get(p).exact]
        if inexact:
            raise RecipeError(f"{where}: [transform_format] keeps weights float: passes {inexact} change "
                              "what a weight quantizer does, and there is none")
    if fmt.weight_bits != 16 and len(quantizers) != 1:
        raise RecipeError(f"{where}: a {fmt.weight_bits}-bit recipe needs exactly one quantizing pass, got {quantizers}")
    pass_fmt = transform_fmt or fmt  # the format the passes see
    for p in passes:
        needs = PASSES.get(p).formats
        if needs and pass_fmt.kind not in needs:
            raise RecipeError(f"{where}: pass '{p}' works on {'/'.join(f.upper() for f in needs)} formats, "
                              f"not {pass_fmt.kind.upper()}")
    if fmt.outlier_channels and "outlier_reorder" not in passes:
        raise RecipeError(f"{where}: 'format.outlier_channels' = {fmt.outlier_channels} needs the "
                          "'outlier_reorder' pass (it picks the outlier channels)")
    if fmt.online_hadamard and "rotation" not in passes:
        raise RecipeError(f"{where}: 'format.online_hadamard' needs the 'rotation' pass (it folds the "
                          "rotation into down_proj)")
    if fmt.weight_bits == 16 and quantizers:
        raise RecipeError(f"{where}: 'format.weight_bits' = 16 but passes {quantizers} quantize weights")
    return Recipe(name, str(raw.get("description", "")), tuple(passes), fmt, calib, options, where, transform_fmt)


def load_recipe(name_or_path: str) -> Recipe:
    """A recipe by name (recipes/NAME.toml) or by path to a .toml file."""
    path = where = Path(name_or_path)
    if path.suffix != ".toml":
        path = RECIPE_DIR / f"{name_or_path}.toml"
        where = Path("recipes") / path.name  # built-ins are named without this machine's path
        if "/" in str(name_or_path) or not path.is_file():
            raise RecipeError(f"unknown recipe '{name_or_path}' (known: {', '.join(recipe_names())})")
    elif not path.is_file():
        raise RecipeError(f"recipe file not found: {path}" if not path.exists() else f"{path}: not a file")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise RecipeError(f"{where}: not a text file (a recipe is UTF-8 TOML)") from None
    except tomllib.TOMLDecodeError as e:
        raise RecipeError(f"{where}: not valid TOML ({e})") from None
    return parse_recipe(raw, path.stem, str(where))


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.toml"))
