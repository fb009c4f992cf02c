"""One W4A8 GEMM case, three calls (the third profiled by ncu --launch-skip 2 --launch-count 1).
    python bench/results/probes_h200/gemv_ncu_case.py N K M GROUP VARIANT"""
import sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import bench.gemm_h200 as gb  # noqa: E402
n, k, m, g = map(int, sys.argv[1:5])
variant = sys.argv[5]
calls = gb.w4a8_calls(m, n, k, g, variant, enable_pdl=False)
for _ in range(3):
    calls[0]()
torch.cuda.synchronize()
