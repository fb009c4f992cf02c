"""Probe: per-warp timeline of the GEMV kernel (trace build) at M = 1 and 16."""
import json, sys, time
from pathlib import Path
import torch
from torch.utils.cpp_extension import load

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import bench.gemm_h200 as gb  # noqa
from bench.timing import time_graph  # noqa
from qoq.runtime_cuda import gemm  # noqa

out = Path(sys.argv[1])
d = Path("build/cuda/probe_gemv_trace"); d.mkdir(parents=True, exist_ok=True)
t0 = time.time()
csrc = Path("scratch/gemv_trace_csrc")
ext = load(name="qoq_gemv_trace", sources=[str(csrc / s) for s in gemm.SOURCES], extra_include_paths=[str(csrc)],
           extra_cflags=["-O3", "-std=c++17"], extra_cuda_cflags=["-O3", "-std=c++17", "--use_fast_math", "-lineinfo",
           "-gencode=arch=compute_90a,code=sm_90a"], build_directory=str(d))
print("built", time.time() - t0, flush=True)
gemm.extension = lambda: ext
Q = torch.tensor([0.1, 0.5, 0.9, 1.0], dtype=torch.float64)


def summarize(tr, warps):
    tr = tr[:, :warps].double()
    ghz = ((tr[:, :, 13] - tr[:, :, 1]) / (tr[:, :, 14] - tr[:, :, 0])).median().item()
    sm = tr[:, 0, 15].long()
    start = torch.full((int(sm.max()) + 1,), float("inf"), dtype=torch.float64)
    start.scatter_reduce_(0, sm, tr[:, :, 1].min(1).values, reduce="amin")
    rel = (tr[:, :, 1:14] - start[sm][:, None, None]) / ghz / 1000
    names = ["entry", "act"] + [f"run{k}" for k in range(8)] + ["loop", "sync", "end"]
    s = {"ghz": ghz, "span_us": (tr[:, :, 14].max() - tr[:, :, 0].min()).item() / 1000,
         "entry_spread_us": (tr[:, :, 0].max() - tr[:, :, 0].min()).item() / 1000}
    for i, nme in enumerate(names):
        v = rel[:, :, i].flatten()
        v = v[(v > -1) & (v < 1e3)]
        if v.numel():
            s[nme] = [round(x, 3) for x in torch.quantile(v, Q).tolist()]
    life = (tr[:, :, 13].max(1).values - tr[:, :, 1].min(1).values) / ghz / 1000
    s["block_life"] = [round(x, 3) for x in torch.quantile(life, Q).tolist()]
    return s


res = []
for n, k in [(4096, 4096), (12288, 4096), (22016, 4096), (4096, 11008)]:
    for m in (1, 16):
        for group in (128,):
            variant = gemm.auto_variant(m, n, k, group, 132, True)
            calls = gb.w4a8_calls(m, n, k, group, variant)
            us = time_graph(calls, 10)
            warps = 16 if variant == "gemv16" else 8
            tr = ext.trace().view(1024, 16, 16)[: min(1024, n // 32)].clone()
            row = dict(n=n, k=k, m=m, group=group, variant=variant, us=us, summary=summarize(tr, warps))
            torch.save(tr, out / f"gemv_trace_{n}_{k}_{m}.pt")
            res.append(row)
            print(json.dumps(row), flush=True)
            del calls
(out / "gemv_probe.json").write_text(json.dumps(res, indent=1))
