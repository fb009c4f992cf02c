"""Probe: how long a decode warp's last chunk takes to compute, by phase. Tree (see README): scratch/tr2 =
HEAD + decode_phase_trace.patch, which stamps per warp (lane 0) %globaltimer at entry, as its chunks 0, 1, 2
and its last land, after its loop and at its exit, and clock64 as its last chunk lands, once its scores are
computed (K part), once its p are (softmax), after its loop (V part) and at its exit (combine).

    PYTHONPATH=. python bench/results/probes_h200/decode_phase_trace.py $OUT
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
mod = ab.build(Path("scratch/tr2"), Path("build/ab"), attention)
ab.use(attention, mod)
os.environ.update(QOQ_STAGGER_MODE="0", QOQ_STAGGER_CYCLES="0", QOQ_TRACE="1")
q = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
pct = lambda x: [round(float(v), 3) for v in torch.quantile(x.double().flatten(), q)]
raw, summary = {}, {}
for case in [("llama3-8b", 64, 512, 1, 2), ("llama3-8b", 64, 1536, 1, 2), ("llama3-8b", 256, 512, 1, 3)]:
    model, batch, length, _, _ = case
    ctas = min(4096, batch * ab.attention_bench.MODELS[model][1])
    for call in ab.decode_calls(*case)(False)[:3]:
        call()
    torch.cuda.synchronize()
    t = mod.trace().view(4096, 4, 16)[:ctas].clone()
    key = f"{model}_b{batch}_l{length}"
    raw[key] = t
    g0 = t[:, :, 0].min()
    us = lambda x, g0=g0: (x - g0).double() / 1000
    cta_exit = us(t[:, :, 14]).amax(1)
    late = cta_exit >= torch.quantile(cta_exit, 0.9)  # the CTAs that end the grid
    row = {}
    for name, sel in (("all", slice(None)), ("late_ctas", late)):
        w = t[sel]
        row[name] = {
            "cycles_k_part": pct(w[:, :, 6] - w[:, :, 5]), "cycles_softmax": pct(w[:, :, 7] - w[:, :, 6]),
            "cycles_v_part": pct(w[:, :, 8] - w[:, :, 7]), "cycles_combine_and_wait": pct(w[:, :, 9] - w[:, :, 8]),
            "us_last_land_to_loop_end": pct(us(w[:, :, 13]) - us(w[:, :, 4])),
            "us_last_land": pct(us(w[:, :, 4])), "us_exit": pct(us(w[:, :, 14])), "us_first_land": pct(us(w[:, :, 1])),
            "chunks_per_warp": pct(w[:, :, 12]),
        }
    summary[key] = row
    print(key, json.dumps(row), flush=True)
torch.save(raw, out / "decode_phase_traces.pt")
(out / "decode_phase_trace.json").write_text(json.dumps(summary, indent=1))
