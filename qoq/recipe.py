"""Recipes: TOML data choosing the passes and the numeric format, validated by a strict schema."""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes"


class RecipeError(ValueError):
    """A recipe file that is missing, malformed or outside the schema."""


@dataclass(frozen=True)
class Format:
    weight_bits: int = 4  # 4, or 16 (no weight quantization)
    group_size: int = 128  # 128 or 64 (progressive), -1 (per channel)
    act_bits: int = 8  # 8 (per-token INT8) or 16
    kv_bits: int = 4  # 4 (per-token per-head UINT4) or 16


@dataclass(frozen=True)
class Calibration:
    data: str = "pile-val"  # a spec in calib/, a spec .toml, or a local text file
    samples: int = 128
    seq_len: int = 512
    seed: int = 42


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    passes: tuple[str, ...]
    format: Format = field(default_factory=Format)
    calibration: Calibration = field(default_factory=Calibration)
    pass_options: dict = field(default_factory=dict)  # pass name -> its Options dataclass
    source: str = ""

    @property
    def quantizes_weights(self) -> bool:
        return self.format.weight_bits == 4

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passes"] = list(self.passes)
        return d


_POSITIVE = {"samples", "seq_len"}
_ALLOWED = {  # key -> the values it may take
    "weight_bits": (4, 16),
    "group_size": (128, 64, -1),
    "act_bits": (8, 16),
    "kv_bits": (4, 16),
}


def _section(cls, raw: dict, section: str, where: str):
    if not isinstance(raw, dict):
        raise RecipeError(f"{where}: [{section}] must be a table")
    defaults = cls()
    values = {}
    for key, value in raw.items():
        if not hasattr(defaults, key):
            known = ", ".join(defaults.__dataclass_fields__) or "none: it takes no options"
            raise RecipeError(f"{where}: unknown key '{section}.{key}' (known: {known})")
        expected = type(getattr(defaults, key))
        if expected is float and type(value) is int:
            value = float(value)
        if type(value) is not expected:
            raise RecipeError(f"{where}: '{section}.{key}' must be {expected.__name__}, got {value!r}")
        if key in _ALLOWED and value not in _ALLOWED[key]:
            raise RecipeError(f"{where}: '{section}.{key}' = {value!r} is not one of {_ALLOWED[key]}")
        if key in _POSITIVE and value <= 0:
            raise RecipeError(f"{where}: '{section}.{key}' must be positive, got {value}")
        values[key] = value
    return cls(**values)


def parse_recipe(raw: dict, name: str, where: str) -> Recipe:
    from qoq.passes import PASSES  # importing registers every pass

    known = {"description", "passes", "format", "calibration", "pass_options"}
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
    options = {p: _section(PASSES.get(p).Options, options_raw.get(p, {}), f"pass_options.{p}", where)
               for p in passes}
    fmt = _section(Format, raw.get("format", {}), "format", where)
    calib = _section(Calibration, raw.get("calibration", {}), "calibration", where)
    quantizers = [p for p in passes if PASSES.get(p).quantizes]
    if fmt.weight_bits == 4 and len(quantizers) != 1:
        raise RecipeError(f"{where}: a 4-bit recipe needs exactly one quantizing pass, got {quantizers}")
    if (fmt.weight_bits, fmt.act_bits) not in ((4, 8), (16, 16)):
        raise RecipeError(f"{where}: 'format.act_bits' = {fmt.act_bits} with 'format.weight_bits' = "
                          f"{fmt.weight_bits}: the runtime runs W4A8 or W16A16 linears")
    if fmt.weight_bits == 16 and quantizers:
        raise RecipeError(f"{where}: 'format.weight_bits' = 16 but passes {quantizers} quantize weights")
    return Recipe(name, str(raw.get("description", "")), tuple(passes), fmt, calib, options, where)


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
