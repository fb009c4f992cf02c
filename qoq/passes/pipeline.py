"""Block-by-block quantization: capture a block's calibration inputs, run the recipe's passes on it,
swap in quantized linears, measure the block's output error, propagate to the next block, export.

Peak memory is one float block plus the calibration activations (and the packed blocks so far). On a
GPU (`device`) the skeleton, each block and the calibration activations live there while the passes
run; the exported tensors come back to the CPU for the writer. Results match the CPU's within float
rounding (different kernels sum in different orders), not bit for bit.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from qoq import preflight
from qoq.calibration import calibration_tokens, describe, load_spec, source
from qoq.export.artifact import ArtifactWriter, artifact_config
from qoq.export.replace import sweep_stale
from qoq.models.config import ModelConfig
from qoq.models.loader import CheckpointReader, load_block, load_skeleton, load_tokenizer, resolve_model
from qoq.passes.base import PASSES, BlockContext, ModelContext
from qoq.passes.finalize import block_tensors, model_tensors, round_to_storage, swap_quantized
from qoq.progress import StepProgress, peak_rss_gib, rss_gib, stderr
from qoq.recipe_schema import Recipe, RecipeError

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "generation_config.json", "chat_template.jinja",
)
CHUNK = 4  # calibration samples per block forward: bounds attention's temporary memory
SHARD_BYTES = 2**30  # artifact shard size: a buffered shard and its serialized copy are in memory


@dataclass
class QuantizeResult:
    output: Path
    summary: dict
    model: torch.nn.Module | None  # the in-memory (fake-quant) model, when asked to keep it


def _smaller_group_recipe(recipe: Recipe) -> str:
    """The shipped recipe that differs from `recipe` by group 64 instead of 128, if any."""
    from qoq.recipe import recipe_names

    name = recipe.name.replace("g128", "g64")
    return name if name != recipe.name and name in recipe_names() else ""


def check_compatible(cfg: ModelConfig, recipe: Recipe) -> None:
    """Refuse, before any work, a recipe whose format the model's shapes cannot take."""
    if not recipe.quantizes_weights:
        return
    g, o = recipe.format.group_size, recipe.format.outlier_channels
    attn = cfg.num_heads * cfg.head_dim
    kv = cfg.num_kv_heads * cfg.head_dim
    shapes = {"q_proj": (attn, cfg.hidden_size), "k_proj": (kv, cfg.hidden_size),
              "o_proj": (cfg.hidden_size, attn), "gate_proj": (cfg.intermediate_size, cfg.hidden_size),
              "down_proj": (cfg.hidden_size, cfg.intermediate_size)}
    for name, (n, k) in shapes.items():
        if o >= k:
            raise RecipeError(f"recipe '{recipe.name}' keeps {o} outlier channels, but {name} has only K = {k} inputs")
        if g > 0 and (k - o) % g:
            what = f"K - {o} outlier channels = {k - o}" if o else f"K = {k}"
            smaller = _smaller_group_recipe(recipe)
            if recipe.format.weight_scheme == "qoq":
                alt = "w4a8kv4g64 or w4a8kv4 (per-channel)" if k % 64 == 0 else "w4a8kv4 (per-channel)"
            else:
                alt = smaller if smaller and (k - o) % 64 == 0 else "a per-channel recipe"
            raise RecipeError(
                f"recipe '{recipe.name}' needs input sizes divisible by group {g}, but {name} has "
                f"{what} ({k - o} % {g} = {(k - o) % g}); use {alt}")
        if n % 32 or k % 32:
            raise RecipeError(f"{name} is {n}x{k}: the packed W4 layout needs N and K multiples of 32")


def _run_block(block, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([block(h[i : i + CHUNK], positions) for i in range(0, len(h), CHUNK)])


# (before, after) keys passes use in their records for the error they target
ERROR_PAIRS = (("mse_before", "mse_after"), ("rel_err_before", "rel_err_after"), ("rel_err_rtn", "rel_err"))


def error_change(record: dict) -> str:
    """'before→after' of the error a pass targets (mean over its linears), or '' when it records none."""
    records = [record] + [v for v in record.values() if isinstance(v, dict)]
    for before, after in ERROR_PAIRS:
        pairs = [(r[before], r[after]) for r in records if before in r and after in r]
        if pairs:
            b, a = (sum(x) / len(pairs) for x in zip(*pairs))
            return f"{b:.2e}→{a:.2e}"
    return ""


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _files_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")) + [path / "config.json"]:
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


BLOCK_ERROR_WARNING = 0.25  # a block whose quantized output is this far (relative) from its float output


def block_error_warnings(errors: list[float], k_bias_in_kv4: bool = False) -> list[str]:
    """One warning when any block's relative output error passes BLOCK_ERROR_WARNING: such a model
    usually loses far more accuracy than the recipe promises (a Qwen2 k bias under KV4, say);
    k_bias_in_kv4: the model has k_proj biases and the recipe caches them in KV4 (a second line says
    what to change)."""
    bad = [(e, i) for i, e in enumerate(errors) if e > BLOCK_ERROR_WARNING]
    if not bad:
        return []
    worst, block = max(bad)
    warnings = [f"{len(bad)} of {len(errors)} blocks have an output error above {BLOCK_ERROR_WARNING:.0%} of "
                f"their float output (block {block}: {worst:.0%}); expect a large accuracy loss. `qoq eval "
                "--quantize` separates the weight, activation and KV quantizers (docs/design.md §6)"]
    if k_bias_in_kv4:
        warnings.append("this model's k_proj biases go into the KV4 cache, where large ones (Qwen2) leave the "
                        "keys no resolution: `k_bias_outside_cache = true` in the recipe's [format] keeps them "
                        "out (docs/design.md §3.4; the CUDA runner does not serve that yet)")
    return warnings


def _on_cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.cpu() for name, t in tensors.items()}


def _quantize_blocks(reader: CheckpointReader, cfg: ModelConfig, recipe: Recipe, passes: list, h: torch.Tensor,
                     writer: ArtifactWriter, lm, show_progress: bool, block_done=None
                     ) -> tuple[list[dict], list[float]]:
    """Load, transform, quantize and export each block in turn (its tensors go to writer), feeding the
    next block what the quantized one computes from h [n, T, H]. Each block runs on h's device; blocks
    are kept in lm (on the CPU) unless it is None.
    Returns the passes' records per block and each block's output relative error."""
    device = h.device
    positions = torch.arange(h.shape[1], device=device)
    records, errors = [], []
    bar = StepProgress(f"quantize {recipe.name}", cfg.num_layers * (len(passes) + 1),
                       ("layer", "step", "error", "seconds", "RSS GiB"), show_progress)
    with bar.running():
        for i in range(cfg.num_layers):
            t_block = time.perf_counter()
            block = load_block(reader, cfg, i, dtype=torch.float32, device=device)
            ctx = BlockContext(i, cfg, recipe.for_passes(), h, positions)
            record, reference = {}, None
            for p in passes:
                if not p.exact and reference is None:
                    reference = _run_block(block, h, positions)  # [n, T, H] float output, after exact passes
                t_pass = time.perf_counter()
                record[p.name] = p.apply(block, ctx)
                bar.row(i, p.name, error_change(record[p.name]), time.perf_counter() - t_pass, rss_gib())
            if reference is None:
                reference = _run_block(block, h, positions)
            records.append(record)
            writer.add(_on_cpu(block_tensors(block, ctx.quantized, f"model.layers.{i}")))
            swap_quantized(block, ctx.quantized, recipe.format)
            round_to_storage(block)
            quantized = _run_block(block, h, positions)  # what the quantized model computes
            errors.append(_relative_error(quantized, reference))
            h = reference if recipe.calibration.propagate == "float" else quantized
            if lm is not None:
                lm.model.layers[i] = block.to("cpu")
            bar.row(i, "block out", f"{errors[-1]:.2e}", time.perf_counter() - t_block, rss_gib())
            del block, reference
            if block_done is not None:
                block_done(i, time.perf_counter() - t_block)
    return records, errors


def quantize_model(model: str, recipe: Recipe, output: Path, *, data_dir: Path | None = None,
                   overwrite: bool = False, keep_model: bool = False, show_progress: bool = True,
                   device: str | torch.device = "cpu", block_done=None) -> QuantizeResult:
    """Quantize `model` with `recipe` into the artifact `output`, the passes running on `device` ('cpu',
    'cuda', 'cuda:N'). keep_model: also return the in-memory fake-quant model (on the CPU).
    block_done(index, seconds), if given, is called after each block; an exception it raises stops the
    run like any other (nothing is written)."""
    t0 = time.perf_counter()
    device = preflight.check_device(device)  # first: a missing GPU fails before anything is read
    if device.type == "cuda":
        torch.cuda.init()  # the allocator's statistics exist only once CUDA is initialized
        torch.cuda.reset_peak_memory_stats(device)
    output = Path(output)
    for note in sweep_stale(output.parent):  # first: it may put back an artifact a killed run set aside
        stderr.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    if output.exists() and not overwrite:
        raise FileExistsError(f"output {output} already exists (pass --overwrite to replace an existing artifact)")
    path = resolve_model(model)
    reader = CheckpointReader(path)
    cfg = ModelConfig.from_hf(reader.config())
    check_compatible(cfg, recipe.for_passes())  # a transform_format's groups must fit the shapes too
    spec = load_spec(recipe.calibration.data)
    source(spec, data_dir)  # a named local source that is missing fails now, naming the path
    preflight.run_all(model, path, reader, cfg, recipe, output, overwrite, device)
    c = recipe.calibration
    tokens = calibration_tokens(spec, load_tokenizer(path), data_dir=data_dir, samples=c.samples,
                                seq_len=c.seq_len, seed=c.seed, sampling=c.sampling)  # [n, T]

    passes = [PASSES.get(name)(recipe.pass_options[name]) for name in recipe.passes]
    lm = load_skeleton(reader, cfg, dtype=torch.float32, device=device)  # blocks still on the meta device
    model_ctx = ModelContext(cfg, recipe.for_passes(), recipe.calibration.seed)
    model_records = {p.name: p.prepare_model(lm, model_ctx) for p in passes}
    round_to_storage(lm)
    with torch.inference_mode():
        tokens_on = tokens.to(device)
        h = torch.cat([lm.embed(tokens_on[i : i + CHUNK]) for i in range(0, len(tokens), CHUNK)])

    # shards stream to a temp dir beside the output as blocks finish (memory holds one shard);
    # it is renamed into place by finish() and removed if anything fails before
    with ArtifactWriter(output, SHARD_BYTES, overwrite, protect=[path]) as writer:
        writer.add(_on_cpu(model_tensors(lm, cfg)))
        if keep_model:  # the skeleton waits on the CPU (its blocks are still meta) for the finished blocks
            for part in (lm.model.embed_tokens, lm.model.norm, lm.lm_head):
                part.to("cpu")
        else:
            lm = None  # embeddings and lm_head are exported: free their float copies before the blocks
        records, errors = _quantize_blocks(reader, cfg, recipe, passes, h, writer, lm, show_progress, block_done)

        summary = {
            "model": model, "recipe": recipe.name, "layers": cfg.num_layers,
            "block_rel_err_mean": sum(errors) / len(errors), "block_rel_err_max": max(errors),
            "calibration": describe(spec, tokens, data_dir, seed=c.seed),
            "warnings": block_error_warnings(errors, k_bias_in_kv4=cfg.attention_bias and recipe.format.kv_bits == 4
                                             and not recipe.format.k_bias_outside_cache),
        }
        manifest = {
            "recipe": recipe.to_dict(),
            "passes": {"declared": {p.name: {"needs_calibration": p.needs_calibration, "exact": p.exact,
                                             "quantizes": p.quantizes} for p in passes},
                       "model": model_records, "blocks": records},
            "calibration": summary["calibration"],
            "source": {"model": model, "path": str(path), "sha256": _files_sha256(path)},
            "block_rel_err": errors,
        }
        hf_config = artifact_config(cfg.hf, recipe)  # passes may have changed cfg.hf (rotation unties)
        copy = [path / n for n in TOKENIZER_FILES if (path / n).exists()]
        writer.finish(hf_config, manifest, copy_files=copy)
    summary.update(output=str(output), device=str(device), seconds=time.perf_counter() - t0,
                   peak_rss_gib=peak_rss_gib())
    if device.type == "cuda":
        summary["peak_gpu_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return QuantizeResult(output, summary, lm if keep_model else None)
