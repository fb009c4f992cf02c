"""Split-count sweep of the cluster split-K wgmma grids (H200, 2026-11-30, fifth session).

A copy of qoq/runtime_cuda/csrc in scratch/split_csrc with wgmma_split_override.patch applied (k_splits
takes the split count from QOQ_SPLITS) is built as its own extension; each (shape, M, group, variant,
splits) is timed with bench/timing.py. Output: ../ab_h200/wgmma_split_sweep.json.

    python scratch/split_sweep.py $OUT
"""
import json, os, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench.gemm_h200 as gemm_bench
from bench.timing import time_graph
from qoq.runtime_cuda import gemm
from qoq.runtime_cuda.build import build_tree

mod = build_tree("qoq_split_sweep", Path("scratch/split_csrc"), gemm.SOURCES, Path("build/cuda/split_sweep"))
gemm.extension = lambda: mod
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
rows = []
for n, k in ((4096, 4096), (4096, 11008), (12288, 4096)):
    for m in (32, 64, 128):
        for g in (128, -1):
            os.environ.pop("QOQ_SPLITS", None)
            if m <= 64:
                rows.append(dict(n=n, k=k, m=m, group=g, variant="gemv", splits=None,
                                 us=round(time_graph(gemm_bench.w4a8_calls(m, n, k, g, "gemv")), 2)))
                print(rows[-1], flush=True)
            for v in ("wg64x64", "wg128x64", "wg64x64k2"):
                for s in ((1, 2, 3, 4, 6, 8) if n == 4096 else (1, 2, 3)):
                    os.environ["QOQ_SPLITS"] = str(s)
                    rows.append(dict(n=n, k=k, m=m, group=g, variant=v, splits=s,
                                     us=round(time_graph(gemm_bench.w4a8_calls(m, n, k, g, v)), 2)))
                    print(rows[-1], flush=True)
            (out / "split_sweep.json").write_text(json.dumps(rows, indent=1))
