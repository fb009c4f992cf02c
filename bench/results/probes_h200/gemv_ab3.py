"""3-way same-call A/B of GEMV variants (base, V1 L2 prefetch of activations, V2 + pong before the wait)."""
import json, sys, time
from pathlib import Path
import torch
from torch.utils.cpp_extension import load

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import bench.gemm_h200 as gb  # noqa
from bench.timing import time_graph  # noqa
from qoq.runtime_cuda import gemm  # noqa

TREES = {"base": ("scratch/old_csrc", []), "v1": ("scratch/gemv_v_csrc", ["-DQOQ_GEMV_V=1"]),
         "v2": ("scratch/gemv_v_csrc", ["-DQOQ_GEMV_V=2"])}


def build(name):
    csrc, flags = TREES[name]
    d = Path(f"build/cuda/ab3_{name}"); d.mkdir(parents=True, exist_ok=True)
    return load(name=f"qoq_ab3_{name}", sources=[str(Path(csrc) / s) for s in gemm.SOURCES], extra_include_paths=[csrc],
                extra_cflags=["-O3", "-std=c++17"], extra_cuda_cflags=["-O3", "-std=c++17", "--use_fast_math", "-lineinfo",
                *flags, "-gencode=arch=compute_90a,code=sm_90a"], build_directory=str(d))


if sys.argv[1] == "--build":
    build(sys.argv[2]); sys.exit(0)
out = Path(sys.argv[1])
mods = {n: build(n) for n in TREES}
rows = []
for n, k in [(4096, 4096), (12288, 4096), (22016, 4096), (4096, 11008)]:
    for m in (1, 4, 16):
        for group in (128, -1):
            variant = gemm.auto_variant(m, n, k, group, 132, True)
            times = {name: [] for name in mods}
            for rep in range(4):
                for name in (list(mods) if rep % 2 == 0 else list(mods)[::-1]):
                    gemm.extension = lambda mod=mods[name]: mod
                    times[name].append(round(time_graph(gb.w4a8_calls(m, n, k, group, variant)), 2))
            calls = gb.w4a8_calls(m, n, k, group, variant)[:1]
            outs = {}
            for name in mods:
                gemm.extension = lambda mod=mods[name]: mod
                outs[name] = calls[0]()
            same = all(torch.equal(outs["base"], o) for o in outs.values())
            rows.append(dict(n=n, k=k, m=m, group=group, variant=variant, same_output=same, **times))
            print(rows[-1], flush=True)
(out / "gemv_ab3.json").write_text(json.dumps(rows, indent=1))
