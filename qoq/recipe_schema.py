"""A recipe's data: Format, Calibration, Recipe, and the checks of one TOML table against a dataclass.

Knows nothing of the passes (qoq.recipe adds what they contribute: names, options), so that the runtime
reads an artifact's Format without importing the compiler.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


class RecipeError(ValueError):
    """A recipe file that is missing, malformed or outside the schema."""


@dataclass(frozen=True)
class Format:
    weight_bits: int = 4  # 4, 8, or 16 (no weight quantization)
    group_size: int = 128  # 128 or 64 (groups of input channels), -1 (per channel)
    act_bits: int = 8  # 4 or 8 (per-token symmetric integers) or 16
    kv_bits: int = 4  # 4 (per-token per-head UINT4) or 16
    # "qoq": progressive groups / per-channel with a scaled zero (§3.1, §3.2; W4A8 only);
    # "symmetric": signed codes, an fp16 scale per group (W4A4, W8A8; §3.7);
    # "asymmetric": UINT4 codes, an fp16 scale and an integer zero per group (W4A16; §3.8)
    weight_scheme: str = "qoq"
    # symmetric W4A4 only: this many input channels (the largest in calibration, moved to the end by
    # the `outlier_reorder` pass) stay INT8 in weights and activations (Atom's outliers)
    outlier_channels: int = 0
    act_clip: float = 1.0  # symmetric schemes: the activation scale covers act_clip·max|x| (clipped)
    # symmetric schemes: down_proj's input rotated at run time by a Hadamard of the intermediate size,
    # W_down ← W_down·R folded by the `rotation` pass (QuaRot's online Hadamard)
    online_hadamard: bool = False
    # KV4 only: keys are cached without the k_proj bias b, and attention adds R(p)·b back (b rotated to
    # the key's position p), so each key's UINT4 range covers x·W_kᵀ alone. Qwen2's k biases reach ±150
    # in a few channels, where a cached b leaves the rest of the key no resolution (docs/design.md §3.4)
    k_bias_outside_cache: bool = False

    @property
    def kind(self) -> str:
        """'w4a8' (QoQ), 'w4a4', 'w8a8', 'w4a16' or 'w16a16': what a runtime must implement."""
        return f"w{self.weight_bits}a{self.act_bits}"


# (weight_bits, act_bits) -> the weight scheme that format uses (every other pairing is refused)
FORMAT_SCHEMES = {(4, 8): "qoq", (16, 16): "qoq", (4, 4): "symmetric", (8, 8): "symmetric",
                  (4, 16): "asymmetric"}


def format_problem(fmt: Format) -> str | None:
    """Why a Format is not one the executor runs (one clause), or None when it is."""
    pair = (fmt.weight_bits, fmt.act_bits)
    scheme = FORMAT_SCHEMES.get(pair)
    if scheme is None:
        known = ", ".join(f"W{w}A{a}" for w, a in FORMAT_SCHEMES)
        return f"'format.act_bits' = {fmt.act_bits} with 'format.weight_bits' = {fmt.weight_bits}: " \
               f"the executor runs {known}"
    if fmt.weight_scheme != scheme:
        return f"W{pair[0]}A{pair[1]} takes 'format.weight_scheme' = \"{scheme}\", not \"{fmt.weight_scheme}\""
    if fmt.outlier_channels and (pair != (4, 4) or fmt.group_size == -1):
        return "'format.outlier_channels' needs the grouped symmetric W4A4 format (Atom): group_size 128 or 64"
    if fmt.outlier_channels % 32:
        return f"'format.outlier_channels' = {fmt.outlier_channels} is not a multiple of 32 (the packed layout)"
    if pair == (8, 8) and fmt.group_size != -1:
        return "W8A8 is per channel: 'format.group_size' must be -1"
    if fmt.online_hadamard and scheme != "symmetric":
        return "'format.online_hadamard' applies to the symmetric W4A4 / W8A8 formats only"
    if fmt.k_bias_outside_cache and fmt.kv_bits != 4:
        return "'format.k_bias_outside_cache' applies to the KV4 cache only ('format.kv_bits' = 4)"
    if fmt.act_clip != 1.0 and scheme != "symmetric":
        return "'format.act_clip' applies to the symmetric W4A4 / W8A8 activations only"
    return None


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
    # W16 recipes only: the format the (exact) passes choose their transforms for, while the weights stay
    # float: the float twin of a W4 recipe (bench/error_breakdown.py's "A8 only" and "KV4 only" rows)
    transform_format: Format | None = None

    @property
    def quantizes_weights(self) -> bool:
        return self.format.weight_bits in (4, 8)

    def for_passes(self) -> Recipe:
        """The recipe as the passes see it: its transform_format as the format, when it has one."""
        if self.transform_format is None:
            return self
        return replace(self, format=self.transform_format, transform_format=None)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passes"] = list(self.passes)
        if self.transform_format is None:  # recipes without one keep the manifest they always had
            del d["transform_format"]
        return d


_POSITIVE = {"samples", "seq_len"}
_ALLOWED = {  # key -> the values it may take
    "weight_bits": (4, 8, 16),
    "group_size": (128, 64, -1),
    "act_bits": (4, 8, 16),
    "kv_bits": (4, 16),
    "weight_scheme": ("qoq", "symmetric", "asymmetric"),
    "propagate": ("quantized", "float"),
    "sampling": ("windows", "documents"),
}
_BOUNDS = {"outlier_channels": (0, None), "act_clip": (1e-3, 1.0)}  # key -> (min, max) inclusive


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
        lo, hi = _BOUNDS.get(key, (None, None))
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise RecipeError(f"{where}: '{section}.{key}' = {value!r} is outside [{lo}, {hi if hi is not None else '∞'}]")
        if key in _POSITIVE and value <= 0:
            raise RecipeError(f"{where}: '{section}.{key}' must be positive, got {value}")
        values[key] = value
    return cls(**values)
