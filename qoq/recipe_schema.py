"""A recipe's data: Format, Calibration, Recipe, and the checks of one TOML table against a dataclass.

Knows nothing of the passes (qoq.recipe adds what they contribute: names, options), so that the runtime
reads an artifact's Format without importing the compiler.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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
    # what block i+1 is calibrated on: "quantized" = the outputs of the quantized blocks before it (W4A8KV4
    # errors included), "float" = the float model's activations (as deepcompressor's QoQ calibrates)
    propagate: str = "quantized"
    # "windows": random windows of the first documents joined; "documents": one window per shuffled
    # document (qoq/calibration.py)
    sampling: str = "windows"


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
    "propagate": ("quantized", "float"),
    "sampling": ("windows", "documents"),
}


def parse_section(cls, raw: dict, section: str, where: str):
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
