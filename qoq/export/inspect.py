"""Summary of an artifact: model, layers, tensor formats, bytes on disk vs fp16 (`qoq inspect`).

Reads only qoq.json, config.json and file sizes (no tensor data), so it is instant on big models;
`verify_artifact` is the one that verifies checksums (streamed: it loads no tensor either).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from qoq.export.artifact import load_manifest, read_json

QUANT_SUFFIXES = (".qweight", ".s1_scales", ".s1_szeros", ".s2_scales", ".s2_zeros", ".bias", ".w_scales",
                  ".w_zeros", ".qweight_outliers", ".input_order")
DTYPE_NAMES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _linear_format(prefix: str, entries: dict[str, dict], fmt: dict) -> str:
    bits = fmt.get("weight_bits", 4)
    if f"{prefix}.s1_szeros" in entries:
        return "w4 per-channel"
    if f"{prefix}.s2_scales" in entries:
        half_k = entries[f"{prefix}.qweight"]["shape"][1]
        return f"w4 g{2 * half_k // entries[f'{prefix}.s2_scales']['shape'][0]}"
    kind = "asymmetric" if f"{prefix}.w_zeros" in entries else "symmetric"
    group = fmt.get("group_size", -1)
    outliers = f" + {fmt.get('outlier_channels')} int8 outliers" if f"{prefix}.qweight_outliers" in entries else ""
    return f"w{bits} {kind} {'per-channel' if group == -1 else f'g{group}'}{outliers}"


def inspect_artifact(path: str | Path) -> dict:
    path = Path(path)
    manifest = load_manifest(path)
    config = read_json(path / "config.json")
    entries: dict[str, dict] = manifest["tensors"]
    linears = [name.removesuffix(".qweight") for name in entries if name.endswith(".qweight")]
    owned = {f"{p}{s}" for p in linears for s in QUANT_SUFFIXES}
    recipe_format = (manifest.get("recipe") or {}).get("format") or {}
    formats = Counter(_linear_format(p, entries, recipe_format) for p in linears)
    fp16_bytes = 0
    for prefix in linears:
        n = entries[f"{prefix}.qweight"]["shape"][0]
        k = entries[f"{prefix}.input_order"]["shape"][0] if f"{prefix}.input_order" in entries else (
            entries[f"{prefix}.qweight"]["shape"][1] * (1 if recipe_format.get("weight_bits") == 8 else 2))
        fp16_bytes += 2 * n * k + (2 * n if f"{prefix}.bias" in entries else 0)
    for name, e in entries.items():
        if name not in owned:
            formats[DTYPE_NAMES.get(e["dtype"], e["dtype"])] += 1
            fp16_bytes += 2 * _numel(e["shape"])
    disk = sum((path / f).stat().st_size for f in {e["file"] for e in entries.values()})
    recipe = manifest.get("recipe")
    return {
        "path": str(path),
        "model_type": config.get("model_type"),
        "layers": config.get("num_hidden_layers"),
        "recipe": recipe.get("name") if isinstance(recipe, dict) else recipe,
        "format_version": manifest["format_version"],
        "producer": manifest.get("producer"),
        "quantized_linears": len(linears),
        "formats": dict(sorted(formats.items())),
        "bytes_on_disk": disk,
        "fp16_bytes": fp16_bytes,
        "compression_ratio": fp16_bytes / disk if disk else float("nan"),
    }


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**28 else f"{n / 2**20:.2f} MiB"


def render_inspect(info: dict, console: Console) -> None:
    summary = Table(title=f"qoq artifact {info['path']}", show_header=False)
    summary.add_column("field", style="bold")
    summary.add_column("value")
    for label, value in (
        ("model", f"{info['model_type']} ({info['layers']} layers)"),
        ("recipe", str(info["recipe"])),
        ("producer", f"{info['producer']} (format {info['format_version']})"),
        ("weights on disk", _gib(info["bytes_on_disk"])),
        ("fp16 equivalent", _gib(info["fp16_bytes"])),
        ("compression", f"{info['compression_ratio']:.2f}x"),
    ):
        summary.add_row(label, value)
    console.print(summary)
    formats = Table(title="tensor formats")
    formats.add_column("format")
    formats.add_column("tensors", justify="right")
    for name, count in info["formats"].items():
        formats.add_row(name, str(count))
    console.print(formats)
