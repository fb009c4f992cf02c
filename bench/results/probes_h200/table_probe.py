"""Probe: decode attention timed with a page table per input set (as bench/attention_h200.py) or one table
shared by every set (the layers of one decode step share their sequences' page table: kv_cache.py)."""
import json, sys, time
from pathlib import Path
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import bench.attention_h200 as ab  # noqa
from bench.timing import time_graph  # noqa
from qoq.runtime_cuda import attention  # noqa

out = Path(sys.argv[1])
t0 = time.time()
attention.extension()
print("built", round(time.time() - t0, 1), flush=True)
SHAPES = [("llama3-8b", 64, 512), ("llama3-8b", 256, 512), ("llama2-7b", 64, 512), ("llama3-8b", 64, 1536),
          ("llama2-7b", 64, 1536), ("llama3-8b", 16, 1536), ("llama3-8b", 1, 4096)]
rows = []
for model, batch, length in SHAPES:
    hq, hkv, dim = ab.MODELS[model]
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    sets = ab.decode_sets(hq, hkv, dim, batch, length)
    shared = sets[0][3]


    row = {"model": model, "batch": batch, "length": length, "sets": len(sets), "us": {}}
    for rep in range(3):
        for table in ("own", "shared"):
            for pdl in (False, True):
                calls = [lambda s=s: attention.decode_attention(s[0], s[1], s[2], s[3] if table == "own" else shared,
                                                                lens, length, enable_pdl=pdl) for s in sets]
                key = f"{table}_{'pdl' if pdl else 'plain'}"
                row["us"].setdefault(key, []).append(round(time_graph(calls, 40), 3))
    print(model, batch, length, {k: v for k, v in row["us"].items()}, flush=True)
    rows.append(row)
    del sets
(out / "table_probe.json").write_text(json.dumps(rows, indent=1))
