"""Small-M GEMM timings with the activation rows hot in L2 next to the benchmark's protocol.

bench/gemm_h200.py gives every input set its own activations as well as its own weights (DESIGN §6: fresh
inputs), so a GEMV's 16 activation rows come from HBM, on its critical path. In serving they were just
written by the quantization kernel ahead and sit in L2. Here each case is timed both ways, for the W4A8
GEMM (auto_variant's pick, launched as CudaW4A8Linear launches it) and for FP16 F.linear: "cold", each set
its own rows (the benchmark's protocol); "hot", one set of rows shared by every set (weights still rotate).
Three interleaved rounds, CUDA-graph timing (bench/timing.py); medians in the JSON.

    PYTHONPATH=. python bench/results/probes_h200/gemv_hot_rows.py $OUT
"""

import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.timing import n_sets, time_graph
from qoq.runtime_cuda.gemm import w4a8_gemm

SHAPES = {"qkv_proj": (12288, 4096), "o_proj": (4096, 4096), "gate_up_proj": (22016, 4096), "down_proj": (4096, 11008)}
MAX_SETS = 64


def w4a8_calls(m, n, k, group, hot):
    """bench/gemm_h200.py's w4a8_calls (variant "auto", enable_pdl), with one activation set if hot."""
    rows = None
    calls = []
    for _ in range(n_sets(n * k // 2 + m * k, MAX_SETS)):
        if rows is None or not hot:
            qx = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
            rows = (qx, torch.rand(m, 1, device="cuda").half(), qx.sum(dim=1, dtype=torch.int32),
                    torch.randn(m, device="cuda"))
        qx, s_x, qsum, xsum = rows
        qw = torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, device="cuda")
        s1 = torch.rand(n, device="cuda").half() / 64
        if group == -1:
            extra = dict(s1_szeros=torch.rand(n, device="cuda").half(), xsum=xsum)
        else:
            extra = dict(s2_scales=torch.randint(1, 17, (k // group, n), dtype=torch.int8, device="cuda"),
                         s2_zeros=-torch.randint(0, 100, (k // group, n), dtype=torch.int8, device="cuda"), qsum=qsum)
        calls.append(lambda qx=qx, s_x=s_x, qw=qw, s1=s1, e=extra: w4a8_gemm(qx, s_x, qw, s1, variant="auto",
                                                                          enable_pdl=True, **e))
    return calls


def fp16_calls(m, n, k, hot):
    x = None
    calls = []
    for _ in range(n_sets(2 * n * k + 2 * m * k, MAX_SETS)):
        if x is None or not hot:
            x = torch.randn(m, k, device="cuda").half()
        w = torch.randn(n, k, device="cuda").half()
        calls.append(lambda x=x, w=w: F.linear(x, w))
    return calls


def main(out: Path):
    rows = []
    for name, (n, k) in SHAPES.items():
        for m in (1, 16):
            for group in (128, -1):
                kinds = {f"{side}_{temp}": (w4a8_calls(m, n, k, group, temp == "hot") if side == "w4a8"
                                            else fp16_calls(m, n, k, temp == "hot"))
                         for side in ("w4a8", "fp16") for temp in ("cold", "hot")}
                times = {key: [] for key in kinds}
                for rnd in range(3):
                    for key in (list(kinds) if rnd % 2 == 0 else list(reversed(kinds))):
                        times[key].append(round(time_graph(kinds[key]), 2))
                med = {key: statistics.median(v) for key, v in times.items()}
                row = dict(shape=name, n=n, k=k, m=m, group=group, us=times,
                           speedup_cold=round(med["fp16_cold"] / med["w4a8_cold"], 3),
                           speedup_hot=round(med["fp16_hot"] / med["w4a8_hot"], 3))
                rows.append(row)
                print(row, flush=True)
                del kinds
                torch.cuda.empty_cache()
    out.mkdir(parents=True, exist_ok=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": "PYTHONPATH=. python bench/results/probes_h200/gemv_hot_rows.py $OUT", "rows": rows}
    (out / "gemv_hot_rows.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
