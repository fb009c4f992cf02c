"""Issue 4: the `cuda` executor backend's prefill logits equal the torch reference backend's on the GPU.

    python bench/executor_cuda_check.py --out $OUT [--layers 4]

Builds, on the device, a random-weight W4A8 (g128) artifact of Llama-2-7B's shape (hidden 4096,
intermediate 11008, 32 heads, vocab 32000; `--layers` of the 32 blocks), loads it with
backend="cuda" (CudaW4A8Linear on the W4A8 kernels) and backend="reference" (IntegerLinear, fp16 on
the GPU), runs one prefill of random tokens and compares the logits. Writes executor_check.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qoq.executor import load_artifact_model  # noqa: E402
from qoq.export.artifact import write_artifact  # noqa: E402
from qoq.models.llama import BLOCK_LINEARS  # noqa: E402
from qoq.quant.linear import export_linear  # noqa: E402
from qoq.quant.weights import quantize_weight  # noqa: E402

LLAMA2_7B = dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
                 rope_theta=10000.0, tie_word_embeddings=False)
RECIPE = {"name": "w4a8kv4g128", "format": {"weight_bits": 4, "group_size": 128, "act_bits": 8, "kv_bits": 4}}
MAX_REL_ERR = 1e-2


def linear_shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    """(N, K) of each block linear."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    return {"self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, h), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}


def random_tensors(cfg: dict, group_size: int, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Artifact tensors: quantized block linears (std 0.02 weights), fp16 embeddings, norms and head."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, v = cfg["hidden_size"], cfg["vocab_size"]

    def randn(*shape, std=0.02):
        return torch.randn(*shape, generator=g, device=device) * std

    tensors = {"model.embed_tokens.weight": randn(v, h, std=1.0).half(), "lm_head.weight": randn(v, h).half(),
               "model.norm.weight": (1 + randn(h, std=0.1)).half()}
    shapes = linear_shapes(cfg)
    assert tuple(shapes) == BLOCK_LINEARS
    for layer in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"{prefix}.{norm}.weight"] = (1 + randn(h, std=0.1)).half()
        for name, (n, k) in shapes.items():
            tensors.update(export_linear(f"{prefix}.{name}", quantize_weight(randn(n, k), group_size)))
    return {name: t.cpu() for name, t in tensors.items()}


def prefill(lm, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Logits [B, T, V] and the time of one prefill (after a warm-up run)."""
    with torch.inference_mode():
        lm(ids)
        torch.cuda.synchronize()
        start = time.perf_counter()
        logits = lm(ids)
        torch.cuda.synchronize()
    return logits, (time.perf_counter() - start) * 1000


def run_check(layers: int, batch: int, tokens: int) -> dict:
    cfg = dict(LLAMA2_7B, num_hidden_layers=layers)
    manifest = {"recipe": RECIPE, "source": {"model": "random-llama2-7b-shaped"}}
    with tempfile.TemporaryDirectory() as tmp:
        art_dir = write_artifact(Path(tmp) / "artifact", random_tensors(cfg, 128, "cuda"), cfg, manifest)
        ids = torch.randint(0, cfg["vocab_size"], (batch, tokens), device="cuda")
        cuda_lm, _ = load_artifact_model(art_dir, backend="cuda")
        logits, cuda_ms = prefill(cuda_lm, ids)
        del cuda_lm
        ref_lm, _ = load_artifact_model(art_dir, backend="reference", device="cuda", dtype=torch.float16)
        ref_logits, ref_ms = prefill(ref_lm, ids)
    diff = logits.double() - ref_logits.double()
    rel = (diff.norm() / ref_logits.double().norm()).item()
    top1 = (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
    return dict(model="random-llama2-7b-shaped", layers=layers, of_layers=32, group_size=128, batch=batch,
                tokens=tokens, logits_rel_err=rel, max_abs_diff=diff.abs().max().item(),
                bitwise_equal_fraction=(logits == ref_logits).float().mean().item(), top1_agreement=top1, finite=bool(torch.isfinite(logits).all()), cuda_prefill_ms=round(cuda_ms, 2),
                reference_prefill_ms=round(ref_ms, 2), ok=bool(torch.isfinite(logits).all()) and rel < MAX_REL_ERR)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("executor_cuda_check needs a CUDA GPU")
    result = run_check(args.layers, args.batch, args.tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "executor_check.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    if not result["ok"]:
        sys.exit(f"cuda backend logits differ from the reference: rel. error {result['logits_rel_err']:.3g}")


if __name__ == "__main__":
    main()
