"""Run llm-compressor (0.14) on a model with one of qoq's baseline schemes and record its WikiText-2
perplexity on qoq's windows: one JSON line appended to --out.

    bash bench/reference_llmc/setup.sh                 # once: its own venv
    ~/.cache/qoq/llmc-venv/bin/python bench/reference_llmc/run.py --scheme gptq-w4a16g64 \\
        --calib-tokens out/reference_llmc/smollm2-135m/calib_32x512.pt --windows 8

Runs in llm-compressor's venv only (never imports qoq). The recipes, written to match qoq's recipes'
formats (recipes/<scheme>.toml) in llm-compressor's own modifiers and defaults:

    fp                   no quantization (checks this eval against `qoq eval`)
    gptq-w4a16gG         GPTQModifier: INT4 asymmetric, group G, memoryless min-max grid, actorder static
                         (llm-compressor's default), dampening 0.01, block 128
    awq-w4a16gG          AWQModifier (default mappings, duo_scaling, n_grid 20) + QuantizationModifier
                         with the same INT4 asymmetric group-G weights (round to nearest)
    smoothquant-w8a8     SmoothQuantModifier (smoothing_strength 0.8, as its W8A8 int8 example) +
                         QuantizationModifier scheme W8A8 (INT8 symmetric per-channel weights, INT8
                         symmetric per-token dynamic activations): no GPTQ, like qoq's recipe
    --variant example    (smoothquant-w8a8 only) its W8A8 int8 example exactly: GPTQModifier W8A8 after
                         the smoothing
    --variant sq0.5      (smoothquant-w8a8 only) smoothing_strength 0.5 (the modifier's default), no GPTQ

Every recipe ignores lm_head (tied to the embedding in SmolLM2; qoq keeps it float too). The model is
calibrated on exactly --calib-tokens ([samples, seq_len] token windows saved by compare.py --tokens),
unshuffled, batch 1, through --pipeline (default: llm-compressor's own); then evaluated in memory: the linears carry compressed-tensors' quantization
(status frozen), whose forward fake-quantizes the weights and, for W8A8, each token's input
activations (checked on one layer before the eval: see check_fake_quant).

The perplexity is qoq's protocol (qoq/eval/perplexity.py), copied: the raw test rows joined with
"\\n\\n", tokenized once with the tokenizer's defaults, the first --windows 2048-token windows, mean
cross-entropy per window, exp of the mean.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from importlib.metadata import version
from pathlib import Path

SCHEMES = ("fp", "gptq-w4a16g64", "gptq-w4a16g128", "awq-w4a16g64", "awq-w4a16g128", "smoothquant-w8a8")
VARIANTS = ("example", "sq0.5")


def weight_args(group: int):
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group", group_size=group)


def w4_scheme(group: int) -> dict:
    from compressed_tensors.quantization import QuantizationScheme

    return {"group_0": QuantizationScheme(targets=["Linear"], weights=weight_args(group))}


def recipe_for(scheme: str, variant: str | None) -> list:
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform import AWQModifier, SmoothQuantModifier

    if scheme == "fp":
        return []
    if variant and scheme != "smoothquant-w8a8":
        raise SystemExit(f"--variant applies to smoothquant-w8a8 only, not {scheme}")
    if scheme.startswith("gptq-w4a16g"):
        group = int(scheme.removeprefix("gptq-w4a16g"))
        return [GPTQModifier(config_groups=w4_scheme(group), ignore=["lm_head"], actorder="static",
                             dampening_frac=0.01, block_size=128)]
    if scheme.startswith("awq-w4a16g"):
        group = int(scheme.removeprefix("awq-w4a16g"))
        return [AWQModifier(duo_scaling=True, n_grid=20),
                QuantizationModifier(config_groups=w4_scheme(group), ignore=["lm_head"])]
    strength = 0.5 if variant == "sq0.5" else 0.8
    quant = (GPTQModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"]) if variant == "example"
             else QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"]))
    return [SmoothQuantModifier(smoothing_strength=strength), quant]


def cpu_patch() -> None:
    """AWQ pins its cached block inputs for faster host-to-device copies; pinning needs an
    accelerator, and on a CPU-only run there is no copy to speed up: make it a no-op there."""
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    if not torch.accelerator.is_available():
        IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None


def calibration_dataset(tokens):
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": tokens.tolist(), "attention_mask": [[1] * tokens.shape[1]] * tokens.shape[0]})


def wikitext2_ids(tokenizer, data_dir: Path):
    """qoq/eval/perplexity.py's wikitext2_token_ids over its local test split."""
    import torch

    rows = []
    with (data_dir / "wikitext-2-raw/test.jsonl").open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line)["text"])
    return torch.tensor(tokenizer("\n\n".join(rows), verbose=False)["input_ids"], dtype=torch.long)


def perplexity(model, ids, windows: int, seq_len: int = 2048) -> tuple[float, list[float]]:
    import torch
    import torch.nn.functional as F

    if ids.numel() // seq_len < windows:
        raise SystemExit(f"{ids.numel()} tokens hold fewer than {windows} windows of {seq_len}")
    nlls = []
    with torch.inference_mode():
        for i in range(windows):
            window = ids[i * seq_len : (i + 1) * seq_len].unsqueeze(0)  # [1, T]
            logits = model(window).logits  # [1, T, V]
            nlls.append(F.cross_entropy(logits[0, :-1].float(), window[0, 1:]).item())
    return math.exp(sum(nlls) / len(nlls)), nlls


def check_fake_quant(model, scheme: str) -> dict:
    """What the in-memory quantized model computes in one linear (layer 0 q_proj, layer 0 down_proj):
    its output against F.linear of the weights and inputs fake-quantized by hand to the scheme, and
    against the float input (did activation quantization really happen?)."""
    import torch
    import torch.nn.functional as F
    out = {}
    if scheme == "fp":
        return out
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"):
        lin = model.get_submodule(name)
        qs = lin.quantization_scheme
        w = lin.weight.detach().float()
        # the stored weight is already on the grid (GPTQ writes dequantized values; RTN leaves float)
        wq = fake_quant_weight(w, lin.weight_scale.float(), getattr(lin, "weight_zero_point", None), qs.weights)
        x = torch.randn(1, 16, lin.in_features, generator=torch.Generator().manual_seed(0)) * 3
        x[..., :4] *= 20  # a few outlier channels, so per-token int8 rounding is visible
        with torch.inference_mode():
            y = lin(x).float()
        xq = x
        if qs.input_activations is not None:
            amax = x.abs().amax(-1, keepdim=True)  # per token, symmetric, dynamic
            s = amax / 127.5  # compressed-tensors' symmetric scale: max|x| / (range / 2), then clamp
            xq = (x / s).round().clamp(-128, 127) * s
        ref = F.linear(xq, wq)
        noact = F.linear(x, wq)
        out[name] = {"status": _name(lin.quantization_status),
                     "weights": f"{qs.weights.num_bits}b {_name(qs.weights.strategy)} g{qs.weights.group_size} "
                                f"sym={qs.weights.symmetric}",
                     "input_activations": None if qs.input_activations is None else
                     f"{qs.input_activations.num_bits}b {_name(qs.input_activations.strategy)} "
                     f"dynamic={qs.input_activations.dynamic} sym={qs.input_activations.symmetric}",
                     "weight_on_grid_max_abs": (w - wq).abs().max().item(),
                     "forward_vs_hand_fake_quant_rel": ((y - ref).norm() / ref.norm()).item(),
                     "forward_vs_float_input_rel": ((y - noact).norm() / noact.norm()).item()}
    return out


def _name(x) -> str:
    """An enum's value or a plain string (compressed-tensors keeps some fields as str)."""
    return str(getattr(x, "value", x))


def fake_quant_weight(w, scale, zero, args):
    """Dequantized w on the scheme's grid with the module's own scale / zero point (per channel or group)."""
    import torch

    if _name(args.strategy) == "group":
        g = args.group_size
        scale = scale.repeat_interleave(g, dim=1)
        zero = None if zero is None else zero.float().repeat_interleave(g, dim=1)
    qmax = 2 ** (args.num_bits - 1) - 1
    qmin = -(2 ** (args.num_bits - 1))
    z = torch.zeros_like(scale) if zero is None or args.symmetric else zero.float()
    q = (w / scale).round().add(z).clamp(qmin, qmax)
    return (q - z) * scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", choices=SCHEMES, required=True)
    ap.add_argument("--variant", choices=VARIANTS, help="smoothquant-w8a8 variants (see the docstring)")
    ap.add_argument("--model-src", type=Path, default=Path.home() / ".cache/qoq/models/smollm2-135m",
                    help="an HF-format dir (qoq's resolved model dir)")
    ap.add_argument("--calib-tokens", type=Path, help="[samples, seq_len] token windows (.pt); needed "
                    "by every scheme but fp")
    ap.add_argument("--data-dir", type=Path, default=Path(os.environ.get("QOQ_DATA_DIR", "../shared/data")))
    ap.add_argument("--pipeline", default="independent", help="oneshot's calibration pipeline (its default "
                    "'independent' infers 'sequential' for these modifiers: layer by layer, quantized outputs "
                    "propagated; 'basic': one float forward of the calibration set)")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("out/reference_llmc/smollm2-135m/rows.jsonl"))
    args = ap.parse_args()
    if args.scheme != "fp" and args.calib_tokens is None:
        raise SystemExit(f"--scheme {args.scheme} needs --calib-tokens (compare.py --tokens writes them)")
    if args.calib_tokens is not None and not args.calib_tokens.is_file():
        raise SystemExit(f"calibration tokens not found: {args.calib_tokens}")
    if not (args.model_src / "config.json").is_file():
        raise SystemExit(f"--model-src {args.model_src} is not an HF model dir (no config.json)")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model_src)
    model = AutoModelForCausalLM.from_pretrained(args.model_src, dtype=torch.float32)
    model.eval()
    recipe = recipe_for(args.scheme, args.variant)
    calibration = None
    if recipe:
        from llmcompressor import oneshot

        cpu_patch()

        tokens = torch.load(args.calib_tokens)
        samples, seq_len = tokens.shape
        model = oneshot(model=model, tokenizer=tokenizer, dataset=calibration_dataset(tokens), recipe=recipe,
                        num_calibration_samples=samples, max_seq_length=seq_len,
                        shuffle_calibration_samples=False, batch_size=1, pipeline=args.pipeline)
        calibration = {"source": str(args.calib_tokens), "samples": samples, "seq_len": seq_len}
    t1 = time.perf_counter()
    checks = check_fake_quant(model, args.scheme)
    ids = wikitext2_ids(tokenizer, args.data_dir)
    ppl, nlls = perplexity(model, ids, args.windows)
    row = {"tool": f"llmcompressor {version('llmcompressor')}", "compressed_tensors": version("compressed-tensors"),
           "transformers": version("transformers"), "torch": version("torch"), "model": str(args.model_src),
           "scheme": args.scheme, "variant": args.variant, "pipeline": args.pipeline if recipe else None, "ppl": ppl, "windows": args.windows,
           "nll_per_window": nlls, "calibration": calibration or {"source": None},
           "quantize_seconds": t1 - t0, "eval_seconds": time.perf_counter() - t1,
           "fake_quant_check": checks, "recipe": [repr(m) for m in recipe]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k not in ("recipe", "nll_per_window")}, indent=2))


if __name__ == "__main__":
    main()
