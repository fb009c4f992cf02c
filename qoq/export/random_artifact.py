"""Random-weight artifacts of real model shapes, for speed benchmarks and load tests (no checkpoint,
no calibration): `write_random_artifact(out_dir, "llama-2-7b", "w4a8kv4g128", device="cuda")`.

Each block's weights are drawn on `device` (std 0.02 linears, norms near 1), quantized per linear by
`quantize_weight` (round to nearest on the recipe's grid: none of the recipe's passes run) and exported
by `export_linear`, or kept fp16 for the fp16 recipe, then streamed to the same `ArtifactWriter` the
pipeline uses one block at a time, so memory holds one block and one shard. The result is an ordinary
artifact: qoq.json with checksums and the recipe, config.json with `quantization_config`, and
embeddings, final norm and lm_head in fp16, exactly the tensors `qoq quantize` writes.

Tokenizer: by default the embedded SmolLM2 tokenizer (offline, in qoq's model cache) is copied, so text
prompts work. The model keeps its shape's real vocabulary (the embedding and lm_head sizes are part of
what a benchmark measures), so the tokenizer is copied only where it fits: every id it produces must
be a row of the embedding (len(tokenizer) <= vocab_size; ids the model emits beyond the tokenizer
detokenize to ""). `tiny` uses SmolLM2's 49152 ids; llama-3-8b (128256) takes it; llama-2-7b
(32000) does not: pass tokenizer=None and prompt with token ids.
"""

from __future__ import annotations

from pathlib import Path

import torch

from qoq.export.artifact import ArtifactWriter, artifact_config
from qoq.models.config import ModelConfig
from qoq.models.llama import BLOCK_LINEARS, BLOCK_NORMS
from qoq.quant.linear import export_linear
from qoq.quant.weights import quantize_weight

SHARD_BYTES = 2**30  # as the pipeline: one buffered shard in memory
_LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu", rms_norm_eps=1e-5,
              tie_word_embeddings=False, attention_bias=False, mlp_bias=False, torch_dtype="float16")
SHAPES = {
    "llama-2-7b": dict(_LLAMA, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                       max_position_embeddings=4096, rope_theta=10000.0, bos_token_id=1, eos_token_id=2),
    "llama-3-8b": dict(_LLAMA, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                       max_position_embeddings=8192, rope_theta=500000.0, bos_token_id=128000,
                       eos_token_id=128001),
    # head_dim 64 and K, N multiples of 128: what the CUDA kernels take; SmolLM2's vocabulary
    "tiny": dict(_LLAMA, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=49152, max_position_embeddings=2048, rope_theta=10000.0,
                 bos_token_id=1, eos_token_id=2),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json", "chat_template.jinja")


def shape_config(shape: str | dict) -> dict:
    """A named shape (SHAPES) or a HF-style config dict -> a config.json dict (checked by ModelConfig)."""
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")
        return dict(SHAPES[shape])
    cfg = dict(_LLAMA, **shape)
    ModelConfig.from_hf(cfg)
    return cfg


def _tokenizer_files(tokenizer, vocab_size: int) -> tuple[list[Path], object]:
    from transformers import AutoTokenizer

    from qoq.models.loader import resolve_model

    path = resolve_model(tokenizer)
    tok = AutoTokenizer.from_pretrained(str(path))
    if len(tok) > vocab_size:
        raise ValueError(f"tokenizer {tokenizer} has {len(tok)} ids, more than the shape's vocab_size "
                         f"{vocab_size}: its ids would index past the embedding (pass tokenizer=None)")
    return [path / n for n in TOKENIZER_FILES if (path / n).exists()], tok


def _block(cfg: dict, quantized: bool, group: int, prefix: str, randn) -> dict[str, torch.Tensor]:
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes = dict(zip(BLOCK_LINEARS, [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter)]))
    out = {f"{prefix}.{n}.weight": (1 + randn(h, std=0.1)).half() for n in BLOCK_NORMS}
    for name, (n, k) in shapes.items():
        w = randn(n, k)
        if quantized:
            out.update(export_linear(f"{prefix}.{name}", quantize_weight(w, group)))
        else:
            out[f"{prefix}.{name}.weight"] = w.half()
    return {name: t.cpu() for name, t in out.items()}


def write_random_artifact(out_dir: str | Path, shape: str | dict, recipe: str = "w4a8kv4g128",
                          device: str = "cpu", seed: int = 0, tokenizer: str | Path | None = "smollm2-135m",
                          overwrite: bool = False) -> Path:
    """Write a random-weight artifact of `shape` in `recipe`'s format (a W4 recipe or fp16) to out_dir.
    The same seed on the same device type gives the same tensors."""
    from qoq.passes.pipeline import check_compatible
    from qoq.recipe import load_recipe

    rec = load_recipe(recipe)
    cfg = shape_config(shape)
    check_compatible(ModelConfig.from_hf(cfg), rec)
    copy, tok = _tokenizer_files(tokenizer, cfg["vocab_size"]) if tokenizer is not None else ([], None)
    if tok is not None:
        cfg.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    fmt = rec.format
    cfg = artifact_config(cfg, rec)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size, std=0.02):
        return torch.randn(*size, generator=gen, device=device).mul_(std)

    h, v = cfg["hidden_size"], cfg["vocab_size"]
    name = shape if isinstance(shape, str) else "custom"
    manifest = {
        "recipe": rec.to_dict(),
        "source": {"model": f"random-{name}", "random_weights": True, "shape": name, "seed": seed,
                   "device": torch.device(device).type, "tokenizer": None if tokenizer is None else str(tokenizer),
                   "passes_run": [], "note": "random weights, round-to-nearest on the recipe's grid; no passes"},
    }
    with ArtifactWriter(out_dir, SHARD_BYTES, overwrite) as writer:
        writer.add({"model.embed_tokens.weight": randn(v, h, std=1.0).half().cpu(),
                    "model.norm.weight": (1 + randn(h, std=0.1)).half().cpu(),
                    "lm_head.weight": randn(v, h).half().cpu()})
        for i in range(cfg["num_hidden_layers"]):
            writer.add(_block(cfg, rec.quantizes_weights, fmt.group_size, f"model.layers.{i}", randn))
        return writer.finish(cfg, manifest, copy_files=copy)


def artifact_weight_bytes(path: str | Path) -> int:
    """Bytes of all tensors an artifact holds (from qoq.json; no tensor is read)."""
    from qoq.export.artifact import load_manifest

    sizes = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "uint8": 1, "int32": 4, "int16": 2}
    total = 0
    for e in load_manifest(path)["tensors"].values():
        n = 1
        for d in e["shape"]:
            n *= d
        total += n * sizes[e["dtype"]]
    return total
