"""Forced split counts at M = 256 / 512 (wave quantization; H200, 2026-11-30, fifth session).

A copy of 29f9c05's qoq/runtime_cuda/csrc in scratch/split2_csrc with wgmma_splits_override.patch applied
(wgmma_splits takes the split count from QOQ_SPLITS) is built as its own extension. Output:
../ab_h200/wgmma_split_wave_sweep.json.

    python scratch/split2_sweep.py $OUT
"""
import json, os, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench.gemm_h200 as gemm_bench
from bench.timing import time_graph
from qoq.runtime_cuda import gemm
from qoq.runtime_cuda.build import build_tree

mod = build_tree("qoq_split2_sweep", Path("scratch/split2_csrc"), gemm.SOURCES, Path("build/cuda/split2_sweep"))
gemm.extension = lambda: mod
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
cases = [((22016, 4096), 256, "wg128x128", (1, 2, 3)), ((22016, 4096), 256, "wg128x64", (1, 2)),
         ((12288, 4096), 256, "wg128x128", (1, 2)), ((12288, 4096), 256, "wg128x64", (1, 2)),
         ((4096, 11008), 256, "wg128x64", (2, 3, 4)), ((4096, 4096), 256, "wg64x64k2", (1, 2)),
         ((4096, 4096), 256, "wg128x64", (2, 3)), ((22016, 4096), 512, "wg128x128", (1, 2))]
rows = []
for (n, k), m, v, splits in cases:
    for g in (128, -1):
        for s in splits:
            os.environ["QOQ_SPLITS"] = str(s)
            rows.append(dict(n=n, k=k, m=m, group=g, variant=v, splits=s,
                             us=round(time_graph(gemm_bench.w4a8_calls(m, n, k, g, v)), 2)))
            print(rows[-1], flush=True)
        (out / "split2_sweep.json").write_text(json.dumps(rows, indent=1))
