"""Probe: decode time against KV length at one wave (Llama-3-8B shapes, B = 64: 512 CTAs), to split the time
into a per-token slope and a fixed part, plainly and as programmatic dependents; beside it torch's copy of the
same bytes (half read, half written) in the same graph timing. Trees (SWEEP_TREES, under scratch/; see
README): A (9e49ff1's csrc), kacc2 (the K scores' mma chain in two accumulators), and bounds on kacc2 with wrong
outputs by design: notab (page ids from a multiplicative hash, a permutation of the pool when batch * pages is a
power of two, so no page-table loads), nomath (each landed chunk touched, not attended), nocomb (no cross-warp
combine: one value a warp stored), bare (all three).

    PYTHONPATH=. python bench/results/probes_h200/decode_length_sweep.py $OUT
    SWEEP_TREES=kacc2,notab,nomath,nocomb,bare SWEEP_LENGTHS=128,256,512,1024 SWEEP_OUT=decode_bounds_sweep.json \
        PYTHONPATH=. python bench/results/probes_h200/decode_length_sweep.py $OUT
"""
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import bench.ab_csrc_h200 as ab
from bench.timing import n_sets, time_graph
from qoq.runtime_cuda import attention

out = Path(sys.argv[1])
trees = os.environ.get("SWEEP_TREES", "A,kacc2").split(",")
lengths = [int(x) for x in os.environ.get("SWEEP_LENGTHS", "64,128,256,384,512,768,1024,1536").split(",")]
mods = {name: ab.build(Path(f"scratch/{name}"), Path("build/ab"), attention) for name in trees}
rows = []
for length in lengths:
    kv4_bytes = 2 * 64 * 8 * length * (128 // 2 + 4)
    make = ab.decode_calls("llama3-8b", 64, length, 1, 2)
    row = {"length": length, "kv4_bytes": kv4_bytes}
    for rep in range(3):
        for name, mod in (mods.items() if rep % 2 == 0 else reversed(list(mods.items()))):
            ab.use(attention, mod)
            for pdl in (False, True):
                row.setdefault(f"{name}_{'dep' if pdl else 'plain'}_us", []).append(round(time_graph(make(pdl)), 2))
    k = n_sets(kv4_bytes, 64)
    srcs = [torch.empty(kv4_bytes // 2, dtype=torch.uint8, device="cuda").random_() for _ in range(k)]
    dsts = [torch.empty_like(s) for s in srcs]
    row["torch_copy_us"] = round(time_graph([lambda s=s, d=d: d.copy_(s) for s, d in zip(srcs, dsts)]), 2)
    del srcs, dsts
    rows.append(row)
    print(json.dumps(row), flush=True)
(out / os.environ.get("SWEEP_OUT", "decode_length_sweep.json")).write_text(json.dumps(rows, indent=1))
