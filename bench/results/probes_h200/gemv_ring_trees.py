"""GEMV trees side by side, launched as programmatic dependents (scratch script, kept as it ran for ab_gemv_ring_stages.json)."""
import json, sys, subprocess
from pathlib import Path
import torch
sys.path.insert(0, ".")
import bench.ab_csrc_h200 as ab
import bench.gemm_h200 as gb
from bench.timing import time_graph
from qoq.runtime_cuda import gemm, quant_kernels

trees = {"old": "scratch/old_csrc", "ring4": "qoq/runtime_cuda/csrc", "ring3": "scratch/t3", "ring2": "scratch/t5"}
procs = [subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0,'.'); from pathlib import Path; import bench.ab_csrc_h200 as ab; from qoq.runtime_cuda import gemm; ab.build('{n}', Path('{t}'), Path('build/ab'), gemm)"]) for n, t in trees.items()]
for pr in procs:
    pr.wait()
mods = {n: ab.build(n, Path(t), Path("build/ab"), gemm) for n, t in trees.items()}
rows = []
cases = [(n, k, 1, g, v) for n, k in ((22016, 4096), (12288, 4096), (4096, 4096), (4096, 11008)) for g in (128, -1) for v in ("gemv", "gemv16")]
cases += [(n, k, 16, 128, "gemv16") for n, k in ((4096, 4096), (12288, 4096), (22016, 4096))]
for n, k, m, g, v in cases:
        if True:
            r = dict(n=n, k=k, m=m, group=g, variant=v)
            for rep in range(2):
                for name, mod in mods.items():
                    gemm.extension = quant_kernels.extension = (lambda mod=mod: mod)
                    r.setdefault(name, []).append(round(time_graph(gb.w4a8_calls(m, n, k, g, v, enable_pdl=True)), 2))
            print(r, flush=True)
            rows.append(r)
Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))
