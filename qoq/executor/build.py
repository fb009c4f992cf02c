"""Artifact -> CausalLM: quantized linears from the packed §4 tensors, KV4 attention, fp16 rest."""

from __future__ import annotations

from pathlib import Path

import torch

from qoq.executor.overrides import OverrideError, apply_quantize, check_quantize
from qoq.export.artifact import Artifact, ArtifactError, read_artifact
from qoq.models.config import ModelConfig
from qoq.models.llama import BLOCK_LINEARS, CausalLM
from qoq.quant.formats import linear_from_tensors, use_kv_format
from qoq.quant.hadamard import OnlineRotation
from qoq.recipe_schema import Format, format_problem
from qoq.registry import Registry

# backend name -> (artifact tensors, linear prefix, the artifact's Format) -> module computing that linear
LINEAR_BACKENDS: Registry = Registry("executor backend")
LINEAR_BACKENDS.register("reference")(linear_from_tensors)


@LINEAR_BACKENDS.register("cuda")
def _cuda_linear(tensors: dict, prefix: str, fmt: Format):
    """W4A8: the QoQ kernels; W8A8: torch._int_mm per token (SymmetricIntegerLinear on the GPU); W4A16:
    dequantized weights and an fp16 GEMM (WeightOnlyLinear). W4A4 has no GPU path (design §3.7)."""
    if fmt.kind == "w4a4":
        raise ArtifactError("W4A4 artifacts have no GPU path: Hopper has no INT4 tensor-core MMA "
                            "(docs/design.md §3.7); use --backend reference")
    if fmt.kind != "w4a8":
        return linear_from_tensors(tensors, prefix, fmt)
    from qoq.runtime_cuda.linear import CudaW4A8Linear  # needs a GPU and the JIT-built kernels

    return CudaW4A8Linear.from_tensors(tensors, prefix)


def artifact_format(art: Artifact) -> Format:
    """The artifact's Format, refused in one line if this qoq cannot run it."""
    return manifest_format(art.manifest, art.path)


def manifest_format(manifest: dict, path: str | Path) -> Format:
    """artifact_format from the manifest (qoq.json) alone."""
    try:
        fmt = Format(**manifest["recipe"].get("format", {}))
    except TypeError as e:
        raise ArtifactError(f"{path}: qoq.json recipe.format is not one this qoq knows ({e})") from None
    problem = format_problem(fmt)
    if problem:
        raise ArtifactError(f"{path}: format not supported by this qoq: {problem}")
    return fmt


def _is_quantized_part(name: str, quantized_prefixes: set[str]) -> bool:
    return name.rsplit(".", 1)[0] in quantized_prefixes


def load_artifact_model(path: str | Path, backend: str = "reference", device: str | None = None,
                        dtype: torch.dtype | None = None, quantize: frozenset[str] | None = None
                        ) -> tuple[CausalLM, Artifact]:
    """Build the model an artifact describes. Defaults: CPU fp32 for `reference`, GPU fp16 for `cuda`.
    `quantize`: the quantizers to run (overrides.py; `reference` only), None: the artifact's own."""
    make_linear = LINEAR_BACKENDS.get(backend)
    if quantize is not None and backend != "reference":
        raise OverrideError(f"--quantize runs on the reference backend only, not '{backend}'")
    device = device or ("cuda" if backend == "cuda" else "cpu")
    dtype = dtype or (torch.float16 if torch.device(device).type == "cuda" else torch.float32)
    art = read_artifact(path, complete=True)
    cfg = ModelConfig.from_hf(art.config)
    fmt = artifact_format(art)
    if quantize is not None:
        check_quantize(fmt, quantize, str(art.path))  # before any tensor is built
    with torch.device("meta"):
        lm = CausalLM(cfg)

    quantized = {n[: -len(".qweight")] for n in art.tensors if n.endswith(".qweight")}
    floats = {n: t.to(device=device, dtype=dtype) for n, t in art.tensors.items()
              if not _is_quantized_part(n, quantized)}
    lm.load_state_dict(floats, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        lm.lm_head.weight = lm.model.embed_tokens.weight
    for i, block in enumerate(lm.model.layers):
        for name in BLOCK_LINEARS:
            prefix = f"model.layers.{i}.{name}"
            if prefix in quantized:
                block.set_submodule(name, make_linear(art.tensors, prefix, fmt).to(device))
        use_kv_format(block.self_attn, fmt)
        block.mlp.down_input_transform = OnlineRotation(cfg.intermediate_size) if fmt.online_hadamard else None
    missing = [n for n, p in lm.named_parameters() if p.device.type == "meta"]
    if missing:
        raise ArtifactError(f"{art.path}: artifact lacks tensor {missing[0]} ({len(missing)} missing)")
    if quantize is not None:
        apply_quantize(lm, fmt, quantize, BLOCK_LINEARS)
    return lm.eval(), art
