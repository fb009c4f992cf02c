"""Same-call A/B of two trees of qoq/runtime_cuda/csrc (the GEMM or the attention extension) on one GPU.

Each tree is built as its own extension; every case is then timed with bench/timing.py's CUDA-graph
timing for both trees, four replays interleaved (order flipped every other replay), so that machine
drift falls on both sides; each row's max_rel_diff compares the two trees' outputs on one input set.
The A/Bs docs/performance.md cites are in bench/results/ab_h200/.

    git archive HEAD qoq/runtime_cuda/csrc | tar -x -C old_csrc --strip-components=3
    python bench/ab_csrc_h200.py --old old_csrc --new qoq/runtime_cuda/csrc --cases gemv --out $OUT

`--cases decode` (or `decode_units`) times the decode attention kernel (pinned splits and ring stages) instead. `--pdl`
times one tree's GEMMs launched plainly (column "off") and as programmatic dependents ("on";
w4a8_gemm's enable_pdl) instead of two trees; `--dependent` launches both trees' calls as programmatic
dependents (as CudaW4A8Linear and the decode loop launch them). Both trees are driven by this checkout's
wrappers, so both must take its extension's arguments: GEMM trees from 411ad7f on (the tiled activations
that bench/gemm_h200.py's w4a8_calls hands the 16-warp GEMVs at M <= 16).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench.attention_h200 as attention_bench  # noqa: E402
import bench.gemm_h200 as gemm_bench  # noqa: E402
from bench.timing import time_graph  # noqa: E402
from qoq.runtime_cuda import attention, gemm, quant_kernels  # noqa: E402
from qoq.runtime_cuda.build import build_tree  # noqa: E402

LLAMA2 = ((4096, 4096), (12288, 4096), (22016, 4096), (4096, 11008))  # o, qkv, gate_up, down (N, K)
CASES = {  # (N, K, M, group, variant)
    # the wgmma tiles auto_variant picks at M = 256 and 2048 (H200: 132 SMs), per group and per channel
    "wgmma": [(n, k, m, g, gemm.auto_variant(m, n, k, g, 132, True))
              for n, k in LLAMA2 for m in (256, 2048) for g in (128, -1)],
    # the same at group 64 (two s2 / -z rows a k-step)
    "wgmma_g64": [(n, k, m, 64, gemm.auto_variant(m, n, k, 64, 132, True)) for n, k in LLAMA2 for m in (256, 2048)],
    # the wgmma tiles auto_variant picks at M = 32, 64, 128 (H200), where K splits decide much of the time
    "wgmma_mid": [(n, k, m, g, gemm.auto_variant(m, n, k, g, 132, True))
                  for n, k in LLAMA2 for m in (32, 64, 128) for g in (128, -1)],
    # the two-warpgroup tiles where auto_variant picks them
    "k2": [(4096, 4096, 256, 128, "wg64x64k2"), (4096, 4096, 256, -1, "wg64x64k2"),
           (4096, 11008, 256, 128, "wg64x64k2"), (4096, 11008, 256, -1, "wg64x64k2"),
           (12288, 4096, 64, 128, "wg64x64k2"), (12288, 4096, 64, -1, "wg64x64k2")],
    # the GEMV auto_variant picks at M <= 32 (H200: 132 SMs) for the run's launches (plain, or programmatic
    # dependents with --dependent); a function of that choice
    "gemv": lambda pdl: [(n, k, m, g, gemm.auto_variant(m, n, k, g, 132, True, pdl))
                         for n, k in LLAMA2 for m in (1, 4, 16, 32) for g in (128, -1)],
    # every GEMV kernel at one token and at 16
    "gemv_all": [(n, k, m, g, v) for n, k in LLAMA2 for m in (1, 16) for g in (128, -1)
                 for v in ("gemv", "gemv16", "gemv16p")],
    # gate_up_proj's 688 column blocks (5.2 per SM) in both GEMVs auto_variant chooses between at M >= 4
    "gemv_gate_up": [(22016, 4096, m, g, v) for m in (4, 8, 16) for g in (128, -1) for v in ("gemv", "gemv16p")],
    # the 16-warp staged GEMV alone, at the M where it shares rows or splits K over a cluster and below
    "gemv16": [(n, k, m, g, "gemv16") for n, k in LLAMA2 for m in (1, 4, 8, 16) for g in (128, -1)],
    # the one-wave 16-warp GEMVs (o_proj, down_proj) at one token and at 16
    "gemv16_one_wave": [(n, k, m, g, "gemv16") for n, k in ((4096, 4096), (4096, 11008)) for m in (1, 16)
                        for g in (128, -1)],
    # the persistent GEMV alone
    "gemv16p": [(n, k, m, g, "gemv16p") for n, k in LLAMA2 for m in (1, 4, 16) for g in (128, -1)],
    # a linear's two kernels (quant_tokens, then the GEMM auto_variant picks) at decode and prefill sizes
    "linear": [(n, k, m, g, "auto") for n, k in LLAMA2 for m in (1, 16, 256) for g in (128, -1)],
    # decode attention (model, batch, length, splits, stages): the plan's launch at the B >= 64 rows of
    # the summary, one-wave and multi-wave (the one-wave row also at the other ring depth), and split
    # launches (the cross-split merge)
    "decode": [("llama3-8b", 64, 512, 1, 2), ("llama3-8b", 64, 512, 1, 3), ("llama3-8b", 64, 1536, 1, 2), ("llama3-8b", 256, 512, 1, 3),
               ("llama3-8b", 256, 4096, 1, 3), ("llama2-7b", 64, 512, 1, 3), ("llama2-7b", 64, 1536, 1, 3),
               ("llama2-7b", 256, 1536, 1, 3), ("llama2-7b", 1, 4096, 5, 2), ("llama3-8b", 16, 1536, 2, 2),
               ("llama3-8b", 1, 4096, 16, 2)],
    # unsplit decode where batch x KV heads is 2..4 units an SM (H200), and two controls
    "decode_units": [("llama3-8b", 64, 512, 1, 2), ("llama3-8b", 64, 1536, 1, 2), ("llama3-8b", 64, 4096, 1, 2),
                     ("llama2-7b", 16, 512, 1, 2), ("llama2-7b", 16, 1536, 1, 2), ("llama2-7b", 16, 4096, 1, 2),
                     ("llama3-8b", 256, 512, 1, 3), ("llama2-7b", 64, 512, 1, 3)],
}


def build(csrc: Path, build_root: Path, family):
    """The extension of `family` (the gemm or attention module) built from the tree `csrc`, named after
    the tree's path, so that later calls (another A/B in the same device call) reuse the build."""
    slug = re.sub(r"\W+", "_", csrc.name) + "_" + hashlib.sha1(csrc.resolve().as_posix().encode()).hexdigest()[:8]
    ext = f"ab_{family.__name__.rsplit('.', 1)[-1]}_{slug}"
    return build_tree(f"qoq_{ext}", csrc, family.SOURCES, build_root / ext)


def use(family, mod) -> None:
    """Route the wrappers of `family` (which call <family>.extension()) to the built module `mod`."""
    family.extension = lambda: mod
    if family is gemm:
        quant_kernels.extension = family.extension


def decode_calls(model: str, batch: int, length: int, splits: int, stages: int):
    """-> a function of enable_pdl giving one decode call per input set (bench/attention_h200.py's sets,
    made once)."""
    hq, hkv, dim = attention_bench.MODELS[model]
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    sets = attention_bench.decode_sets(hq, hkv, dim, batch, length)
    return lambda pdl: [lambda s=s: attention.decode_attention(s[0], s[1], s[2], s[3], lens, length, num_splits=splits,
                                                               num_stages=stages, enable_pdl=pdl) for s in sets]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=Path)
    ap.add_argument("--pdl", action="store_true", help="--new alone, without and with enable_pdl")
    ap.add_argument("--dependent", action="store_true", help="both trees with enable_pdl")
    ap.add_argument("--new", type=Path, required=True)
    ap.add_argument("--cases", choices=sorted(CASES), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--build-root", type=Path, default=Path("build/cuda"))
    args = ap.parse_args()
    if not args.pdl and args.old is None:
        ap.error("--old is required (or --pdl, which times --new alone)")
    family = attention if args.cases.startswith("decode") else gemm
    if args.pdl:  # side -> (module, enable_pdl)
        new = build(args.new, args.build_root, family)
        sides = {"off": (new, False), "on": (new, True)}
    else:
        sides = {name: (build(tree, args.build_root, family), args.dependent)
                 for name, tree in (("old", args.old), ("new", args.new))}
    rows = []
    cases = CASES[args.cases](args.dependent) if callable(CASES[args.cases]) else CASES[args.cases]
    for case in cases:
        if family is attention:
            row, make_calls = dict(zip(("model", "batch", "length", "splits", "stages"), case)), decode_calls(*case)
        else:
            row = dict(zip(("n", "k", "m", "group", "variant"), case))
            make_calls = lambda pdl, n=case[0], k=case[1], m=case[2], g=case[3], v=case[4]: gemm_bench.w4a8_calls(  # noqa: E731
                m, n, k, g, v, enable_pdl=pdl, quantize=args.cases == "linear")
        times: dict[str, list[float]] = {name: [] for name in sides}
        first, second = sides
        if not args.pdl:  # both trees on one input set (make_calls draws new inputs): they must agree
            call, outputs = make_calls(args.dependent)[0], []
            for name in (first, second):
                use(family, sides[name][0])
                outputs.append(call().float())
            row["max_rel_diff"] = float((outputs[0] - outputs[1]).abs().max() / outputs[0].abs().max().clamp_min(1e-30))
        for rep in range(4):
            for name in (first, second) if rep % 2 == 0 else (second, first):
                mod, pdl = sides[name]
                use(family, mod)
                times[name].append(round(time_graph(make_calls(pdl)), 2))
        rows.append(dict(row, **times))
        print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"ab_{args.cases}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
