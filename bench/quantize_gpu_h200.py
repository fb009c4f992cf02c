"""`qoq quantize --device cuda` on a Llama-2-7B-shaped checkpoint of random weights: wall time, peak GPU
memory, peak RSS.

    PYTHONPATH=. python bench/quantize_gpu_h200.py --out $OUT --data-dir $PWD/.probe/data \\
        [--tokenizer DIR] [--layers 32] [--max-seconds 540]
    python bench/quantize_gpu_h200.py --tiny --out DIR --tokenizer DIR --data-dir DIR   # CPU smoke run

Writes the checkpoint with bench/scale_7b.py's generator (fp16 shards, one block each; the random numbers
drawn on the device, SmolLM2's tokenizer or --tokenizer's files) into --workdir (default a temporary
directory, removed at the end: only the JSON goes to --out), then runs the quantize pipeline in this
process with the flagship recipe w4a8kv4g128 at its normal settings (32 x 512 calibration tokens, every
search at its recipe grid), the passes on --device. Records the checkpoint write and the quantization
(tokenization, passes, artifact write, everything `qoq quantize` does) separately, the median block,
peak GPU memory (torch.cuda.max_memory_allocated) and peak RSS, to DIR/quantize_gpu_h200.json.

--max-seconds bounds the whole script: after each block, if the next block (at the longest block so
far) would end past the bound, the run stops there; quantize_seconds is then extrapolated as the
time measured so far plus the median block for every block not run, `extrapolated: true` and
`blocks_done` say so (the artifact's final write is not run and not counted).
--tiny: a 2-block, hidden-128 model on the CPU with 4 x 64 calibration tokens: the same code in seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scale_7b import HEADS, HIDDEN, INTER, VOCAB, write_checkpoint
from qoq.progress import peak_rss_gib

RECIPE = "w4a8kv4g128"
TARGET_SECONDS = 600
FULL = {"hidden": HIDDEN, "intermediate": INTER, "heads": HEADS, "kv_heads": HEADS, "layers": 32, "vocab": VOCAB}
TINY = {"hidden": 128, "intermediate": 256, "heads": 2, "kv_heads": 2, "layers": 2}
TINY_CALIBRATION = {"samples": 4, "seq_len": 64}


class OutOfTime(Exception):
    """Raised after a block when the next one would end past --max-seconds."""


def tokenizer_dir(name: str | None) -> Path:
    from qoq.models.loader import resolve_model

    if name is not None and Path(name).is_dir():
        return Path(name)
    try:
        return resolve_model(name or "smollm2-135m")
    except Exception as e:  # noqa: BLE001  one line naming what to do
        raise SystemExit(f"error: no tokenizer: {e}; pass --tokenizer DIR (a folder with tokenizer.json)") from None


def tokenizer_size(path: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(path))


def recipe_for(tiny: bool):
    from qoq.recipe import load_recipe

    recipe = load_recipe(RECIPE)
    if tiny:
        recipe = replace(recipe, calibration=replace(recipe.calibration, **TINY_CALIBRATION))
    return recipe


def gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "none (CPU run)"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for quantize_gpu_h200.json")
    ap.add_argument("--layers", type=int, default=None, help="blocks of the checkpoint (default 32; --tiny 2)")
    ap.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default cuda; --tiny: cpu)")
    ap.add_argument("--data-dir", type=Path, default=None, help="local datasets (default $QOQ_DATA_DIR)")
    ap.add_argument("--tokenizer", default=None, help="a folder with tokenizer files (default SmolLM2's)")
    ap.add_argument("--workdir", type=Path, default=None, help="checkpoint and artifact (default a temp dir, removed)")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop after the block that would overrun")
    ap.add_argument("--tiny", action="store_true", help="tiny model on the CPU: a smoke run of the same code")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    from qoq import preflight
    from qoq.calibration import data_dir as resolve_data_dir
    from qoq.passes.pipeline import quantize_model

    try:
        device = preflight.check_device(args.device or ("cpu" if args.tiny else "cuda"))
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"error: {e}") from None
    shape = dict(TINY if args.tiny else FULL)
    if args.layers is not None:
        shape["layers"] = args.layers
    tok = tokenizer_dir(args.tokenizer)
    n_tok = tokenizer_size(tok)
    if args.tiny:
        shape["vocab"] = -(-n_tok // 64) * 64
    elif n_tok > shape["vocab"]:
        raise SystemExit(f"error: tokenizer {tok} has {n_tok} ids, more than the vocab {shape['vocab']}")
    recipe = recipe_for(args.tiny)
    data_dir = resolve_data_dir(args.data_dir)

    work = args.workdir or Path(tempfile.mkdtemp(prefix="qoq-quantize-gpu-"))
    ckpt, artifact = work / "checkpoint", work / "artifact"
    block_seconds: list[float] = []

    def block_done(index: int, seconds: float) -> None:
        block_seconds.append(seconds)
        last = index + 1 == shape["layers"]
        if not last and args.max_seconds is not None \
                and time.perf_counter() - t_start + max(block_seconds) > args.max_seconds:
            raise OutOfTime

    try:
        t0 = time.perf_counter()
        write_checkpoint(ckpt, shape["layers"], hidden=shape["hidden"], inter=shape["intermediate"],
                         heads=shape["heads"], vocab=shape["vocab"], tokenizer_dir=tok, device=str(device))
        write_seconds = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
        t0 = time.perf_counter()
        stopped, summary = False, {}
        try:
            summary = quantize_model(str(ckpt), recipe, artifact, data_dir=data_dir, overwrite=True,
                                     show_progress=False, device=device, block_done=block_done).summary
        except OutOfTime:
            stopped = True
        measured = time.perf_counter() - t0
        peak_gpu = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    median = statistics.median(block_seconds) if block_seconds else None
    missing = shape["layers"] - len(block_seconds)
    quantize_seconds = measured + (missing * median if stopped else 0.0)
    given = sys.argv[1:] if argv is None else argv
    command = "PYTHONPATH=. python bench/quantize_gpu_h200.py " + " ".join(
        "$OUT" if a == str(args.out) else a for a in given)
    result = {
        "summary": {
            "gpu": gpu_name(device), "device": str(device), "model_shape": shape, "recipe": RECIPE,
            "calibration": f"{recipe.calibration.samples} x {recipe.calibration.seq_len}",
            "quantize_seconds": quantize_seconds, "write_seconds": write_seconds,
            "peak_gpu_mem_gib": peak_gpu, "peak_rss_gib": peak_rss_gib(),
            "block_seconds_median": median, "blocks_done": len(block_seconds), "extrapolated": stopped,
            "target_seconds": TARGET_SECONDS, "target_met": quantize_seconds < TARGET_SECONDS,
            "block_rel_err_mean": summary.get("block_rel_err_mean"), "command": command,
        },
        "block_seconds": block_seconds,
        "measured_quantize_seconds": measured,
        "extrapolation": ("measured seconds + median block x blocks not run; the artifact's final write "
                          "(manifest, checksums) is not counted") if stopped else None,
        "total_seconds": time.perf_counter() - t_start,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quantize_gpu_h200.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return result


if __name__ == "__main__":
    main()
