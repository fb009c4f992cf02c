"""Probe: does a one-wave decode grid lose its DRAM stream between synchronized rounds of chunk copies?

Trees (see README): scratch/A = HEAD's csrc, scratch/stag = A + decode_stagger_probe.patch, whose kernel
delays each warp's first copies by unit * QOQ_STAGGER_CYCLES SM cycles (unit by QOQ_STAGGER_MODE: 1 the
warp index 0..3, 2 warps 2 and 3, 3 the CTA index's parity, 4 the CTA index mod 4, 5 the warp index's
parity) and, with QOQ_TRACE=1, stamps %globaltimer per warp at entry, at each of its first 12 chunks
landing, after its loop and at its exit. Times in bench/timing.py's graph timing (plainly and as
programmatic dependents, three replays interleaved); traces of one call per configuration.

    PYTHONPATH=. python bench/results/probes_h200/decode_stagger_probe.py $OUT
"""
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import bench.ab_csrc_h200 as ab
from bench.timing import time_graph
from qoq.runtime_cuda import attention

out = Path(sys.argv[1])
configs = [(int(m), int(c)) for m, c in (s.split(":") for s in os.environ.get(
    "STAGGER_CONFIGS", "0:0,1:600,1:1200,1:2000,2:2000,2:4000,3:2000,3:4000,4:1000,5:2000").split(","))]
shapes = [tuple(int(x) if x.isdigit() else x for x in s.split(":")) for s in os.environ.get(
    "STAGGER_SHAPES", "llama3-8b:64:512:1:2,llama3-8b:64:1536:1:2,llama3-8b:256:512:1:3,llama2-7b:64:512:1:3").split(",")]
t0 = time.time()
mods = {name: ab.build(Path(f"scratch/{name}"), Path("build/ab"), attention) for name in ("A", "stag")}
print("built", round(time.time() - t0, 1), flush=True)


def run_config(mode, cycles, trace=0):
    os.environ["QOQ_STAGGER_MODE"], os.environ["QOQ_STAGGER_CYCLES"] = str(mode), str(cycles)
    os.environ["QOQ_TRACE"] = str(trace)


def trace_summary(raw: torch.Tensor, ctas: int, chunks: int) -> dict:
    """Per-chunk landing times (us after the grid's first entry) over the warps: percentiles."""
    t = raw.view(4096, 4, 16)[:ctas].double()
    t0 = t[:, :, 0].min()
    rel = lambda x: ((x - t0) / 1000)
    q = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], dtype=torch.float64)
    pct = lambda x: [round(v, 3) for v in torch.quantile(rel(x).flatten(), q).tolist()]
    return {"entry": pct(t[:, :, 0]), **{f"land{i}": pct(t[:, :, 1 + i]) for i in range(min(chunks, 12))},
            "loop_end": pct(t[:, :, 13]), "exit": pct(t[:, :, 14])}


rows = []
for case in shapes:
    make = ab.decode_calls(*case)
    model, batch, length, splits, stages = case
    hkv = ab.attention_bench.MODELS[model][1]
    chunks = length // (4 * 32)  # D = 128: 32-token chunks over 4 warps
    row = dict(zip(("model", "batch", "length", "splits", "stages"), case))
    names = ["A"] + [f"s{m}_{c}" for m, c in configs]
    for rep in range(3):
        for pdl in (False, True):
            order = names if rep % 2 == 0 else names[::-1]
            for name in order:
                if name == "A":
                    run_config(0, 0)
                    ab.use(attention, mods["A"])
                else:
                    m, c = map(int, name[1:].split("_"))
                    run_config(m, c)
                    ab.use(attention, mods["stag"])
                row.setdefault(f"{name}_{'dep' if pdl else 'plain'}", []).append(round(time_graph(make(pdl)), 2))
    if batch * hkv <= 4096:
        ab.use(attention, mods["stag"])
        traces = {}
        for m, c in configs:
            run_config(m, c, trace=1)
            calls = make(False)
            for call in calls[:3]:
                call()
            torch.cuda.synchronize()
            traces[f"s{m}_{c}"] = trace_summary(mods["stag"].trace(), batch * hkv, chunks)
        row["traces"] = traces
    rows.append(row)
    print(json.dumps({k: v for k, v in row.items() if k != "traces"}), flush=True)
    (out / "decode_stagger_probe.json").write_text(json.dumps(rows, indent=1))
run_config(0, 0)
