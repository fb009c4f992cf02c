"""Probe: per-warp timelines of the decode kernel with fixed chunks per warp against chunks taken from a
per-CTA counter. Trees (see README): scratch/stag (HEAD + decode_stagger_probe.patch, run unstaggered) and
scratch/dyn_tr (the counter's kernel + decode_dynamic_trace.patch). Each stamps %globaltimer per warp
(lane 0) at entry, as each of its first 12 chunks lands, after its loop (the counter's build also keeps
the warp's chunk count in slot 12) and at its exit; the raw stamps of the last of three calls are saved.

    PYTHONPATH=. python bench/results/probes_h200/decode_dynamic_trace.py $OUT
"""
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import bench.ab_csrc_h200 as ab
from qoq.runtime_cuda import attention

out = Path(sys.argv[1])
mods = {name: ab.build(Path(f"scratch/{name}"), Path("build/ab"), attention) for name in ("stag", "dyn_tr")}
SHAPES = [("llama3-8b", 64, 512, 1, 2), ("llama3-8b", 64, 1536, 1, 2)]
os.environ.update(QOQ_STAGGER_MODE="0", QOQ_STAGGER_CYCLES="0", QOQ_TRACE="1")
raw, summary = {}, {}
for case in SHAPES:
    model, batch, length, _, _ = case
    ctas = batch * ab.attention_bench.MODELS[model][1]
    make = ab.decode_calls(*case)
    for name, mod in mods.items():
        ab.use(attention, mod)
        for call in make(False)[:3]:
            call()
        torch.cuda.synchronize()
        t = mod.trace().view(4096, 4, 16)[:ctas].clone()
        key = f"{model}_b{batch}_l{length}_{name}"
        raw[key] = t
        t0 = t[:, :, 0].min()
        us = lambda x, t0=t0: (x - t0).double() / 1000
        cta_exit = us(t[:, :, 14]).amax(1)
        warp_exit = us(t[:, :, 14])
        summary[key] = {
            "last_exit_us": round(float(cta_exit.max()), 3),
            "cta_exit_us_p10_p50_p90": [round(float(v), 3) for v in torch.quantile(cta_exit, torch.tensor(
                [0.1, 0.5, 0.9], dtype=torch.float64))],
            "within_cta_loop_end_spread_us_mean": round(float((us(t[:, :, 13]).amax(1) - us(t[:, :, 13]).amin(1)).mean()), 3),
            "first_land_us_p10_p50_p90": [round(float(v), 3) for v in torch.quantile(us(t[:, :, 1]).flatten(), torch.tensor(
                [0.1, 0.5, 0.9], dtype=torch.float64))],
            "loop_end_to_exit_us_mean": round(float((warp_exit - us(t[:, :, 13])).mean()), 3),
        }
        print(key, json.dumps(summary[key]), flush=True)
torch.save(raw, out / "decode_dynamic_traces.pt")
(out / "decode_dynamic_trace.json").write_text(json.dumps(summary, indent=1))
