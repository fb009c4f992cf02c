"""Run the QoQ reference implementation (deepcompressor-toolkit 0.1.0) on SmolLM2-135M and record its
WikiText-2 perplexity: one stage variant per call, one JSON line appended to --out.

    bash bench/reference_dc/setup.sh                   # once: its own venv, patched (patch.py)
    ~/.cache/qoq/dc-venv/bin/python bench/reference_dc/run.py --stage qoq --out out/reference_dc/rows.jsonl

Runs in the reference venv only (never imports qoq). The config is upstream examples/llm/configs
`qoq-g128.yaml` (dumped below, with the defaults it relies on written out) with weight and KV groups set
to --group; --stage switches deepcompressor's own stage flags:

    fp        no quantization (the float model through the same eval)
    rtn       W4A8KV4 round-to-nearest, no rotation / smoothing / reorder / GPTQ
    rotation  + rotation (residual Hadamard, per-head Hadamard on v/o)
    smooth    + SmoothAttention (alpha 0.5) and down_proj smoothing (alpha 0.3, beta 0.7)
    reorder   + down_proj input channel reorder (= QoQ without GPTQ)
    qoq       + GPTQ (damp 0.01, block 128, act-order): the reference QoQ

The reference has no weight clipping in this config (calib_range disabled), so there is no clip stage.
The model is an untied fp32 copy of SmolLM2 (its rotation treats embedding and lm_head separately and
fuses the final norm into lm_head), with the config keys transformers 4.49 reads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

STAGES = ("fp", "rtn", "rotation", "smooth", "reorder", "qoq")

CONFIG = """\
seed: 12345
quant:
  develop_dtype: torch.float32
  calib:
    data: pileval
    path: {calib_path}
    num_samples: {samples}
    seq_length: {seq_len}
    min_seq_length: 0
    max_seq_length: 0
  wgts:
    dtype: {wdtype}
    zero_point: PostScale
    group_shapes:
    - - 1
      - -1
    - - 1
      - {group}
    scale_dtypes:
    - torch.float16
    - sint8
    intermediate_dtypes:
    - sint8
    intermediate_levels:
    - 0
    needs_dequant_saturation: false
    enable_kernel_gptq: {gptq}
    kernel_gptq:
      damp_percentage: 0.01
      block_size: 128
      num_inv_tries: 250
      hessian_block_size: 512
  ipts:
    static: false
    dtype: {adtype}
    group_shapes:
    - - 1
      - -1
    scale_dtypes:
    - torch.float16
  opts:
    static: false
    dtype: {kvdtype}
    zero_point: PostScale
    group_shapes:
    - - 1
      - {group}
    scale_dtypes:
    - torch.float16
    skips:
    - attn_q
  enable_rotation: {rotation}
  rotation:
    random: false
    transforms:
    - out_proj
  enable_reorder: {reorder}
  reorder:
    strategy: Manual
    channel_metric: InputsAbsMax
    channel_index: Sequential
    skips:
    - residual
  enable_smooth: {smooth}
  smooth:
    enable_proj: true
    proj:
      objective: OutputsError
      strategy: Manual
      granularity: Layer
      degree: 2
      spans:
      - - AbsMax
        - AbsMax
      alpha: 0.3
      beta: 0.7
      num_grids: 20
      skips:
      - qkv_proj
      - up_proj
      - out_proj
    enable_attn: true
    attn:
      strategy: Manual
      degree: 2
      spans:
      - - AbsMax
        - AbsMax
      alpha: 0.5
      beta: 0
      num_grids: 20
"""


def stage_flags(stage: str) -> dict:
    order = STAGES.index(stage)
    quant = stage != "fp"
    return {"wdtype": "uint4" if quant else "null", "adtype": "sint8" if quant else "null",
            "kvdtype": "uint4" if quant else "null", "rotation": str(order >= 2).lower(),
            "smooth": str(order >= 3).lower(), "reorder": str(order >= 4).lower(), "gptq": str(order >= 5).lower()}


def untied_copy(src: Path, dst: Path) -> Path:
    """SmolLM2 with lm_head = a copy of the embedding, tie_word_embeddings false, fp32, rope_theta."""
    if (dst / "model.safetensors").exists():
        return dst
    import torch
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    tensors = load_file(src / "model.safetensors")
    tensors = {k: v.float().contiguous() for k, v in tensors.items()}
    tensors.setdefault("lm_head.weight", tensors["model.embed_tokens.weight"].clone())
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    rope = cfg.pop("rope_parameters", None) or {}
    cfg.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    cfg.update(tie_word_embeddings=False, torch_dtype="float32")
    cfg.pop("dtype", None)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    for name in ("tokenizer.json", "special_tokens_map.json", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    tok = json.loads((src / "tokenizer_config.json").read_text())
    tok["tokenizer_class"] = "PreTrainedTokenizerFast"  # transformers 5 writes TokenizersBackend
    (dst / "tokenizer_config.json").write_text(json.dumps(tok, indent=2))
    del torch
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", choices=STAGES, required=True)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--model-src", type=Path, default=Path.home() / ".cache/qoq/models/smollm2-135m")
    ap.add_argument("--data-dir", type=Path, default=Path(os.environ.get("QOQ_DATA_DIR", "../shared/data")))
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--calib-tokens", type=Path, help="token windows [samples, seq_len] (.pt) to calibrate on "
                    "instead of the reference's own sampler over groups_merged.txt")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=Path("out/reference_dc"))
    ap.add_argument("--out", type=Path, default=Path("out/reference_dc/rows.jsonl"))
    args = ap.parse_args()

    args.workdir.mkdir(parents=True, exist_ok=True)
    model_dir = untied_copy(args.model_src, args.workdir / "smollm2-135m-untied")
    os.environ["DC_WIKITEXT_TEST"] = str(args.data_dir / "wikitext-2-raw/test.jsonl")
    os.environ["DC_EVAL_WINDOWS"] = str(args.windows)
    if args.calib_tokens:
        os.environ["DC_CALIB_TOKENS"] = str(args.calib_tokens)

    import torch
    from deepcompressor.app.llm.config import LlmPtqRunConfig
    from deepcompressor.app.llm.eval.custom import _eval_ppl_with_gptq_evaluator
    from deepcompressor.app.llm.nn.patch import patch_attention, patch_gemma_rms_norm
    from deepcompressor.app.llm.ptq import ptq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg_path = args.workdir / f"config-{args.stage}-g{args.group}.yaml"
    calib_path = args.data_dir / "calib/groups_merged.txt"
    cfg_path.write_text(CONFIG.format(calib_path=calib_path, samples=args.samples, seq_len=args.seq_len,
                                      group=args.group, **stage_flags(args.stage)))
    config, *_ = LlmPtqRunConfig.get_parser().parse_known_args(
        [str(cfg_path), "--model-name", "smollm2-135m", "--model-path", str(model_dir),
         "--output-root", str(args.workdir / "runs")])

    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    # as its own model builder does: route RoPE through q/k_rotary_emb modules, so SmoothAttention and
    # the KV quantizer see post-RoPE keys (without it they hook k_proj: pre-RoPE K)
    patch_attention(model)
    patch_gemma_rms_norm(model)
    model.eval()
    if args.stage != "fp":
        model = ptq(model, tokenizer=tokenizer, config=config.quant)
    t1 = time.perf_counter()
    ppl = _eval_ppl_with_gptq_evaluator(model, tokenizer, task="wikitext", seq_length=2048)
    row = {"tool": "deepcompressor 0.1.0", "stage": args.stage, "group": args.group, "ppl": ppl,
           "windows": args.windows, "calibration": {
               "source": str(args.calib_tokens) if args.calib_tokens else f"{calib_path} (deepcompressor sampler)",
               "samples": args.samples, "seq_len": args.seq_len},
           "quantize_seconds": t1 - t0, "eval_seconds": time.perf_counter() - t1, "config": cfg_path.read_text()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k != "config"}))


if __name__ == "__main__":
    main()
