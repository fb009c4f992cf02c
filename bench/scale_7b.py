"""Peak memory and time of `qoq quantize` on a Llama-2-7B-shaped checkpoint of random weights.

    python bench/scale_7b.py --layers 32 --output bench/results/scale_7b.json

Writes the checkpoint as fp16 safetensors shards (one block per shard, written one tensor group at a
time, so the writer itself stays small), with SmolLM2's tokenizer (vocab 49152 instead of Llama-2's 32000:
the calibration tokens must fit the embedding), then quantizes it in a child process with the flagship
recipe on a reduced calibration set (8 x 256 tokens) and coarser searches (SEARCH_OPTIONS) and reports the child's wall time and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from qoq.models.loader import resolve_model
from qoq.passes.pipeline import TOKENIZER_FILES

HIDDEN, INTER, HEADS, VOCAB = 4096, 11008, 32, 49152
# the searches at a 2-core CPU's pace (full grids: ~235 s per 7B block; these: ~165 s). The clip search
# scores T·N·K per ratio (AWQ also clips on 512 tokens); neither grid changes the peak memory.
SEARCH_OPTIONS = {"clip": {"max_tokens": 512, "grid": 10}, "smooth_down": {"grid_step": 0.25}}


def write_checkpoint(path: Path, layers: int, *, hidden: int = HIDDEN, inter: int = INTER, heads: int = HEADS,
                     vocab: int = VOCAB, tokenizer_dir: Path | None = None, device: str = "cpu") -> None:
    """A Llama checkpoint of random weights (Llama-2-7B's shape by default) with the tokenizer files of
    tokenizer_dir (default SmolLM2's). `device` draws the numbers there (a GPU draws 7B of them in
    seconds; other numbers than the CPU's, the same distribution)."""
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):  # fp16 [*shape], std 0.02 like an initialized LLM
        return (torch.randn(*shape, generator=g, device=device) * 0.02).half().cpu()

    weight_map, shards = {}, []
    def save(name: str, tensors: dict) -> None:  # noqa: E306
        save_file(tensors, str(path / name))
        weight_map.update({k: name for k in tensors})
        shards.append(name)

    save("model-embed.safetensors", {"model.embed_tokens.weight": randn(vocab, hidden),
                                     "model.norm.weight": torch.ones(hidden).half(),
                                     "lm_head.weight": randn(vocab, hidden)})
    for i in range(layers):
        p = f"model.layers.{i}."
        save(f"model-layer{i:03d}.safetensors", {
            p + "input_layernorm.weight": torch.ones(hidden).half(),
            p + "post_attention_layernorm.weight": torch.ones(hidden).half(),
            **{p + f"self_attn.{n}.weight": randn(hidden, hidden) for n in ("q_proj", "k_proj", "v_proj", "o_proj")},
            p + "mlp.gate_proj.weight": randn(inter, hidden), p + "mlp.up_proj.weight": randn(inter, hidden),
            p + "mlp.down_proj.weight": randn(hidden, inter)})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": heads, "vocab_size": vocab, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else resolve_model("smollm2-135m")
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists() and name != "generation_config.json":
            shutil.copy(tokenizer_dir / name, path / name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--recipe", default="w4a8kv4g128")
    ap.add_argument("--workdir", type=Path, default=Path("out/scale-7b"))
    ap.add_argument("--output", type=Path, default=Path("bench/results/scale_7b.json"))
    args = ap.parse_args()
    ckpt, recipe = args.workdir / "checkpoint", args.workdir / "recipe.toml"
    t0 = time.perf_counter()
    write_checkpoint(ckpt, args.layers)
    write_seconds = time.perf_counter() - t0
    base = (Path(__file__).resolve().parents[1] / "recipes" / f"{args.recipe}.toml").read_text()
    recipe.write_text(base.replace("samples = 32", "samples = 8").replace("seq_len = 512", "seq_len = 256")
                      + "".join(f"\n[pass_options.{name}]\n" + "".join(f"{k} = {v}\n" for k, v in opts.items())
                                for name, opts in SEARCH_OPTIONS.items()))
    cmd = [sys.executable, "-m", "qoq.cli", "quantize", "--model", str(ckpt), "--recipe", str(recipe),
           "--output", str(args.workdir / "artifact"), "--overwrite", "--json"]
    t0 = time.perf_counter()
    summary = json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout)
    result = {"summary": {"layers": args.layers, "of_layers": 32, "recipe": args.recipe, "calibration": "8 x 256",
                          "search_options": SEARCH_OPTIONS,
                          "quantize_seconds": time.perf_counter() - t0, "write_checkpoint_seconds": write_seconds,
                          "peak_rss_gib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
                          "block_rel_err_mean": summary["block_rel_err_mean"]},
              "command": f"python bench/scale_7b.py --layers {args.layers}"}
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
