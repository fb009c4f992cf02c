"""Probe: one-kernel streams of the Llama-3-8B B = 64 decode's KV4 bytes (L 512, 1536; B 256 L 512) in
bench/timing.py's graph timing, contiguous and rotating past L2: torch's copy (half the bytes read, half
written) and two torch reductions over all of them (int32 sum, fp16 amax; slow kernels, not a floor).

    PYTHONPATH=. python bench/results/probes_h200/stream_floor.py $OUT
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
from bench.timing import n_sets, time_graph

out = Path(sys.argv[1])
nbytes = 2 * 64 * 8 * 512 * (128 // 2 + 4)
rows = []
for label, total in (("b64_l512", nbytes), ("b64_l1536", 3 * nbytes), ("b256_l512", 4 * nbytes)):
    k = n_sets(total, 64)
    xs = [torch.randint(0, 100, (total // 4,), dtype=torch.int32, device="cuda") for _ in range(k)]
    outs = [torch.empty((), dtype=torch.int64, device="cuda") for _ in range(k)]
    us_sum = time_graph([lambda x=x, o=o: torch.sum(x, 0, out=o) for x, o in zip(xs, outs)])
    us_amax = time_graph([lambda x=x: x.view(torch.float16).amax() for x in xs])
    del xs
    srcs = [torch.empty(total // 2, dtype=torch.uint8, device="cuda").random_() for _ in range(k)]
    dsts = [torch.empty_like(s) for s in srcs]
    us_copy = time_graph([lambda s=s, d=d: d.copy_(s) for s, d in zip(srcs, dsts)])
    del srcs, dsts
    row = {"shape": label, "bytes": total, "sum_us": round(us_sum, 2), "amax_us": round(us_amax, 2),
           "copy_us": round(us_copy, 2)}
    for key in ("sum", "amax", "copy"):
        row[f"{key}_tbps"] = round(total / row[f"{key}_us"] / 1e6, 3)
    rows.append(row)
    print(row, flush=True)
(out / "stream_floor.json").write_text(json.dumps(rows, indent=1))
