"""The persistent GEMV at M = 16 over fewer SMs and in larger clusters (a probe of 9cee3e8's kernel).

Every SM a GEMV runs on stages all M activation rows (64 KB at K = 4096, M = 16), read once per cluster
pair from L2; `ab_gemv_cluster4_nocluster.json` and `gemv_hot_rows.json` put the M = 16 cost in those
bytes. This times gemv16p with its grid capped at ceil(column blocks / COLS) blocks (each block walks
COLS or more 32-column blocks) and with CLUSTER blocks sharing the rows, read from the environment by
`gemvp_grid_probe.patch` (QOQ_PROBE_GEMVP_COLS, QOQ_PROBE_GEMVP_CLUSTER), next to the picks the benchmark
makes. Outputs are compared with the default launch's (integer sums: exact in any order).

    git archive 9cee3e8 qoq/runtime_cuda/csrc | tar -x -C scratch/G --strip-components=3
    patch -p1 -d scratch/G < bench/results/probes_h200/gemvp_grid_probe.patch
    QOQ_CUDA_BUILD_DIR=$PWD/build/cuda PYTHONPATH=. python bench/results/probes_h200/gemvp_grid_probe.py $OUT
"""

import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import bench.ab_csrc_h200 as ab
import bench.gemm_h200 as gb
from bench.timing import time_graph
from qoq.runtime_cuda import gemm

SHAPES = {  # name: (N, K, [(COLS, CLUSTER), ...]); (1, 2) is the kernel's own launch
    "o_proj": (4096, 4096, [(1, 2), (2, 2), (2, 4), (4, 4)]),
    "down_proj": (4096, 11008, [(1, 2), (2, 2), (2, 4), (4, 4)]),
    "qkv_proj": (12288, 4096, [(1, 2), (1, 4), (4, 2), (4, 4), (6, 2), (6, 4)]),
    "gate_up_proj": (22016, 4096, [(1, 2), (1, 4), (6, 4), (8, 4), (11, 4)]),
}


def configure(cols, cluster):
    os.environ["QOQ_PROBE_GEMVP_COLS"], os.environ["QOQ_PROBE_GEMVP_CLUSTER"] = str(cols), str(cluster)


def main(out: Path):
    ab.use(gemm, ab.build(Path("scratch/G"), Path("build/ab"), gemm))
    rows = []
    for name, (n, k, configs) in SHAPES.items():
        for group in (128, -1):
            pick = gemm.auto_variant(16, n, k, group, 132, True, True)
            sides = {f"pick_{pick}": gb.w4a8_calls(16, n, k, group, pick)}
            calls = gb.w4a8_calls(16, n, k, group, "gemv16p")
            for cols, cluster in configs:
                sides[f"gemv16p_cols{cols}_cluster{cluster}"] = (calls, cols, cluster)
            configure(1, 2)
            ref = calls[0]().float()
            diffs = {}
            for key, side in sides.items():
                if isinstance(side, tuple):
                    configure(*side[1:])
                    diffs[key] = float((side[0][0]().float() - ref).abs().max())
            times = {key: [] for key in sides}
            for rnd in range(3):
                for key in (list(sides) if rnd % 2 == 0 else list(reversed(sides))):
                    side = sides[key]
                    if isinstance(side, tuple):
                        configure(*side[1:])
                        side = side[0]
                    times[key].append(round(time_graph(side), 2))
            row = dict(shape=name, n=n, k=k, m=16, group=group, us=times,
                       median_us={key: statistics.median(v) for key, v in times.items()}, max_abs_diff=diffs)
            rows.append(row)
            print(json.dumps(row["median_us"]), name, group, diffs, flush=True)
            del sides, calls
            torch.cuda.empty_cache()
    out.mkdir(parents=True, exist_ok=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": "QOQ_CUDA_BUILD_DIR=$PWD/build/cuda PYTHONPATH=. python "
                         "bench/results/probes_h200/gemvp_grid_probe.py $OUT (tree scratch/G: 9cee3e8 + gemvp_grid_probe.patch)",
              "rows": rows}
    (out / "gemvp_grid_probe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
