"""Probe: per-warp cycle breakdown of the wgmma kernels (trace build) at M = 256..1024."""
import json, sys, time
from pathlib import Path
import torch
from torch.utils.cpp_extension import load

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import bench.gemm_h200 as gb  # noqa
from bench.timing import time_graph  # noqa
from qoq.runtime_cuda import gemm  # noqa

out = Path(sys.argv[1])
d = Path("build/cuda/probe_wgmma_trace"); d.mkdir(parents=True, exist_ok=True)
t0 = time.time()
csrc = Path("scratch/wgmma_trace_csrc")  # 7a9d757 csrc + wgmma_trace.patch
ext = load(name="qoq_wgmma_trace", sources=[str(csrc / s) for s in gemm.SOURCES], extra_include_paths=[str(csrc)],
           extra_cflags=["-O3", "-std=c++17"], extra_cuda_cflags=["-O3", "-std=c++17", "--use_fast_math", "-lineinfo",
           "-gencode=arch=compute_90a,code=sm_90a"], build_directory=str(d))
print("built", time.time() - t0, flush=True)
gemm.extension = lambda: ext
Q = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
NAMES = ["wait_data", "barrier", "load_issue", "dequant", "wgmma"]


def summarize(tr, blocks, warps):
    tr = tr[:blocks, :warps].double()
    live = tr[:, :, 7] > 0
    ghz = ((tr[:, :, 9] - tr[:, :, 1]) / (tr[:, :, 10] - tr[:, :, 0]))[live].median().item()
    t0 = tr[:, :, 0][live].min()
    s = {"ghz": ghz, "span_us": (tr[:, :, 10][live].max() - t0).item() / 1000}
    ent = (tr[:, :, 0][live] - t0) / 1000
    ex = (tr[:, :, 10][live] - t0) / 1000
    s["entry_us"] = [round(x, 3) for x in torch.quantile(ent, Q).tolist()]
    s["exit_us"] = [round(x, 3) for x in torch.quantile(ex, Q).tolist()]
    steps = tr[:, :, 7][live]
    s["steps"] = steps.median().item()
    life = (tr[:, :, 9] - tr[:, :, 1])[live]
    s["life_cycles"] = [round(x) for x in torch.quantile(life, Q).tolist()]
    for i, nme in enumerate(NAMES):
        v = (tr[:, :, 2 + i][live] / steps)
        s[nme + "_per_step"] = [round(x, 1) for x in torch.quantile(v, Q).tolist()]
    s["epilogue_cycles"] = [round(x) for x in torch.quantile(tr[:, :, 8][live], Q).tolist()]
    # cycles from entry to the loop: life - loop - epilogue
    loop = tr[:, :, 2:7][live].sum(1)
    s["prologue_cycles"] = [round(x) for x in torch.quantile(life - loop - tr[:, :, 8][live], Q).tolist()]
    return s


res = []
for n, k, m, variant in [(4096, 4096, 256, "wg64x64k2"), (4096, 4096, 256, "wg64x64"), (4096, 4096, 256, "wg128x64"),
                         (4096, 11008, 256, "wg64x64k2"), (12288, 4096, 256, "wg128x64"), (4096, 4096, 1024, "wg128x128"),
                         (12288, 4096, 2048, "wg128x128")]:
    for group in (128, -1):
        calls = gb.w4a8_calls(m, n, k, group, variant)
        us = time_graph(calls, 10)
        rows_, bt = {"wg64x64k2": (64, 64), "wg64x64": (64, 64), "wg128x64": (128, 64), "wg128x128": (128, 128)}[variant]
        blocks = min(4096, (m // bt) * (n // rows_))
        warps = 8 if variant.endswith("k2") else 4
        tr = ext.trace().view(4096, 8, 12).clone()
        row = dict(n=n, k=k, m=m, group=group, variant=variant, us=us, summary=summarize(tr, blocks, warps))
        res.append(row)
        print(json.dumps(row), flush=True)
        del calls
(out / "wgmma_probe.json").write_text(json.dumps(res, indent=1))
